"""A program that never imports torch: under the hooks it must not get torch (or our modules) either."""

import json
import os
import sys

loaded = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "agent", "pydantic", "httpx"})
print(json.dumps({"loaded": loaded, "chained": os.environ.get("CHAINED_SITECUSTOMIZE_RAN")}))

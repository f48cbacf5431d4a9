"""Real allocation traces, parsed once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.analysis.traces.alloc_trace import AllocationTrace, from_kineto

REAL_TRACES = {
    "v100_ddp": "kineto/hta/df_index_resolver/df_index_resolver.json.gz",
    "h100_qwen": "kineto/tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "h100_timesformer": "kineto/tracelens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz",
    "h100_bert": "kineto/tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",
}


@pytest.fixture(scope="session")
def real_traces(real_data: Path) -> dict[str, AllocationTrace]:
    return {name: from_kineto(real_data / rel) for name, rel in REAL_TRACES.items()}

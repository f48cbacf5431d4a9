"""The job page's "On other GPU types" card, built from the real API's right-sizing answer: each other catalogue
type with its ratios and what set them (this model's runs on both types, or the datasheets)."""

from __future__ import annotations

import time
from typing import Any

from dashboard import data
from dashboard.pages.job import RATIOS_FROM, other_gpus_section
from tests.dashboard.test_gpm_pages import _text
from tests.server.helpers import auth
from tests.server.test_projection_api import _fingerprinted_run


def _rows(section: Any) -> list[list[str]]:
    table = next(c for c in section.children if getattr(c, "id", None) == "job-other-gpus-table")
    body = table.children[1]
    return [[_text(cell) for cell in row.children] for row in body.children]


def test_card_names_each_type_and_what_set_its_ratios(api, make_token) -> None:  # type: ignore[no-untyped-def]
    op, agent, team = make_token("operator"), make_token("agent", node="node-a"), make_token("team", team="nlp")
    t0 = time.time() - 86400
    for k, (job_id, gpu, step_s) in enumerate((("card-h100-b32", "h100", 0.1), ("card-a100-b32", "a100", 0.25),
                                               ("card-h100-b64", "h100", 0.18))):
        _fingerprinted_run(api, op, agent, job_id=job_id, team="nlp", gpu=gpu, batch=32 if "b32" in job_id else 64,
                           step_s=step_s, power_w=500.0, seq=k, t0=t0 + 600 * k)
    candidates, unavailable = data.other_gpu_types(
        api.get("/api/v1/jobs/card-h100-b64/rightsizing", headers=auth(team)).json())
    assert unavailable is None and candidates
    rows = {r[0]: r for r in _rows(other_gpus_section(candidates, unavailable))}
    assert "H100-80GB" not in rows  # the job's own type
    a100 = rows["A100-80GB"]
    assert a100[-1] == RATIOS_FROM["fingerprint_runs"] and a100[1].startswith("x2.50 [")  # 0.25 s / 0.10 s
    assert all(r[-1] == RATIOS_FROM[None] for gpu, r in rows.items() if gpu != "A100-80GB")
    assert all(r[4] in ("yes", "no", "unknown") for r in rows.values())


def test_card_says_why_there_is_no_projection() -> None:
    card = other_gpus_section([], "the run has no step time")
    assert "no projection: the run has no step time" in _text(card)

"""The one job-id grammar (fleetprof/jobid.py): every id the product makes satisfies it, the wire protocol applies
the same rule, and what it refuses it says why."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from agent.podresources import PodRef
from agent.run import generate_job_id
from fleetprof.jobid import MAX_LENGTH, is_job_id, job_id_problem, job_path, k8s_job_id, path_segment
from fleetprof.protocol import JobId

MADE = [
    "slurm:123", "slurm:123_4", "slurm:123+0",  # Slurm: a job, an array task, a heterogeneous component
    "k8s:ml/trainer-0", "k8s:kube-system/nvidia-dcgm.exporter-7f9c", "k8s:pod-0f3e6a2c-1b4d-4e8f-9a7b-5c6d7e8f9a0b",
    "alice.b@c:run=1", "run-1", "..hidden", "x/.y",
]
# `fleetprof run`'s default ids, for these users: the time and a random suffix make each one new, so the test ids
# name the user (pytest-xdist's workers must collect the same test ids)
GENERATED_FOR = ["alice", "j.doe@corp", "..", "名前"]
REFUSED = {
    "": "empty", "a b": "' '", "tab\there": "'\\t'", "nl\n": "'\\n'", "a,b": "','", "50%": "'%'", "a?b": "'?'",
    "é": "'é'", "x" * (MAX_LENGTH + 1): "at most 200", ".": "dots only", "..": "dots only", "k8s:ns/..": "dots only",
    "a/./b": "dots only", "/a": "leading", "a/": "trailing", "a//b": "double",
}


@pytest.mark.parametrize("job_id", [*MADE, *map(generate_job_id, GENERATED_FOR)],
                         ids=[*MADE, *(f"generated-for-{user}" for user in GENERATED_FOR)])
def test_every_id_the_product_makes_is_valid_on_the_wire(job_id: str) -> None:
    assert job_id_problem(job_id) is None and is_job_id(job_id)
    assert TypeAdapter(JobId).validate_python(job_id) == job_id


@pytest.mark.parametrize("job_id", list(REFUSED))
def test_what_is_refused_says_why_on_both_ends(job_id: str) -> None:
    problem = job_id_problem(job_id)
    assert problem is not None and REFUSED[job_id] in problem and not is_job_id(job_id)
    with pytest.raises(ValidationError):
        TypeAdapter(JobId).validate_python(job_id)


def test_kubernetes_ids_of_the_longest_names_fit_and_stay_distinct() -> None:
    ns, pod = "n" * 63, "p" * 253  # DNS-1123: a 63-character label, a 253-character subdomain
    long_id = PodRef(ns, pod, "c").job_id
    assert len(long_id) == MAX_LENGTH and is_job_id(long_id) and long_id.startswith(f"k8s:{ns}/ppp")
    assert "_" in long_id  # no Kubernetes name holds '_': a shortened id equals no real pod's id
    assert k8s_job_id(ns, pod[:-1] + "q") != long_id
    assert k8s_job_id(ns, pod) == long_id  # the same pod, the same id, on every node and every agent start
    assert PodRef("ml", "trainer-0", "c").job_id == "k8s:ml/trainer-0"


def test_paths_carry_a_slash_as_2f_and_the_rest_readable() -> None:
    assert path_segment("k8s:ml/trainer-0") == "k8s:ml%2Ftrainer-0"
    assert path_segment("slurm:123+0") == "slurm:123+0" and path_segment("a@b=c") == "a@b=c"
    assert job_path("k8s:ml/trainer-0", "timeseries", "batch") == "/api/v1/jobs/k8s:ml%2Ftrainer-0/timeseries/batch"

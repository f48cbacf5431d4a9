"""GPU -> pod through the kubelet pod-resources API: a real gRPC server on a unix socket, answering List as the
kubelet does (the messages encoded here by hand from the v1 api.proto field numbers, independently of the
reader under test)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from agent.attribution import ENV_JOB, K8S_POD, K8S_POD_RESOURCES, UNATTRIBUTED, Attribution, Attributor
from agent.podresources import LIST_METHOD, PodRef, PodResources, WireFormatError, parse_list_response
from tests.agent.test_attribution import POD_UID, make_proc

GPU_A, GPU_B, GPU_C = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbb", "GPU-cccc"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _pod(name: str, namespace: str, containers: list[tuple[str, list[str]]]) -> bytes:
    body = _field(1, name) + _field(2, namespace)
    for cname, device_ids in containers:
        devices = _field(1, "nvidia.com/gpu") + b"".join(_field(2, d) for d in device_ids)
        devices += _field(3, _field(1, _varint(0 << 3 | 0) + _varint(1)))  # topology {nodes {ID: 1}}: skipped
        body += _field(3, _field(1, cname) + _field(2, devices) + _varint(3 << 3 | 0) + _varint(7))  # cpu_ids
    return _field(1, body)


LIST_ANSWER = (_pod("trainer-0", "ml", [("main", [GPU_A])])
               + _pod("notebook", "research", [("jupyter", [])])  # a pod without GPUs
               + _pod("shared-1", "ml", [("w", [f"{GPU_B}::1"])])  # time-sliced: two pods on GPU_B
               + _pod("shared-2", "ml", [("w", [f"{GPU_B}::2"])]))


class Kubelet:
    """A gRPC server on a unix socket serving v1.PodResourcesLister/List with `answer`."""

    def __init__(self, socket_path: Path, answer: bytes):
        self.answer, self.calls, self.failing = answer, 0, False

        def list_pods(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.calls += 1
            if self.failing:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limited")
            return self.answer

        service, method = LIST_METHOD.strip("/").split("/")
        handler = grpc.method_handlers_generic_handler(service, {method: grpc.unary_unary_rpc_method_handler(
            list_pods, request_deserializer=lambda b: b, response_serializer=lambda b: b)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
        self.server.add_insecure_port(f"unix://{socket_path}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[Kubelet, Path]]:
    sock = tmp_path / "kubelet.sock"
    k = Kubelet(sock, LIST_ANSWER)
    yield k, sock
    k.stop()


def test_the_list_answer_maps_gpus_to_pods() -> None:
    pods = parse_list_response(LIST_ANSWER)
    assert pods[GPU_A] == {PodRef("ml", "trainer-0", "main")}
    assert pods[GPU_B] == {PodRef("ml", "shared-1", "w"), PodRef("ml", "shared-2", "w")}
    assert GPU_C not in pods and len(pods) == 2
    with pytest.raises(WireFormatError):
        parse_list_response(_field(1, _field(1, "x"))[:-1])  # truncated


def test_pods_of_a_gpu_over_grpc_listed_at_most_every_refresh(kubelet) -> None:  # type: ignore[no-untyped-def]
    k, sock = kubelet
    now = [0.0]
    pr = PodResources(sock, refresh_s=30, clock=lambda: now[0])
    assert pr.pods_of_gpu(GPU_A) == {PodRef("ml", "trainer-0", "main")}
    assert pr.pods_of_gpu(GPU_C) == set() and k.calls == 1  # one List for both questions
    k.answer = _pod("trainer-1", "ml", [("main", [GPU_A])])
    now[0] = 31.0
    assert pr.pods_of_gpu(GPU_A) == {PodRef("ml", "trainer-1", "main")} and k.calls == 2


def test_a_kubelet_that_fails_is_forgotten_and_logged_once(kubelet, caplog) -> None:  # type: ignore[no-untyped-def]
    k, sock = kubelet
    now = [0.0]
    pr = PodResources(sock, refresh_s=30, timeout_s=0.5, clock=lambda: now[0])
    assert pr.pods_of_gpu(GPU_A)
    k.failing = True
    with caplog.at_level(logging.WARNING, logger="agent.podresources"):
        for t in (31.0, 62.0):
            now[0] = t
            assert pr.pods_of_gpu(GPU_A) == set()  # a stale map would name a pod that may be gone
    assert sum("List failed" in r.message for r in caplog.records) == 1 and k.calls == 3
    k.stop()  # the socket goes with the server: no socket, no List
    now[0] = 93.0
    assert pr.pods_of_gpu(GPU_A) == set() and k.calls == 3


def test_attribution_names_the_pod_when_one_pod_holds_the_gpu(kubelet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, sock = kubelet
    in_pod = f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-1.scope\n"
    make_proc(tmp_path, 40, cgroup=in_pod)
    make_proc(tmp_path, 41, cgroup=in_pod)
    make_proc(tmp_path, 42, cgroup=in_pod, env={"FLEETPROF_JOB_ID": "explicit-1"})
    make_proc(tmp_path, 43)  # a host process (no pod in its cgroup) on the pod's GPU
    a = Attributor(tmp_path, pod_resources_socket=sock)
    assert a.attribute(40, GPU_A) == Attribution("k8s:ml/trainer-0", K8S_POD_RESOURCES)
    assert a.attribute(41, GPU_B) == Attribution(f"k8s:pod-{POD_UID}", K8S_POD)  # two pods share GPU_B
    assert a.attribute(42, GPU_A) == Attribution("explicit-1", ENV_JOB)  # the environment comes first
    assert a.attribute(43, GPU_A) == UNATTRIBUTED


def test_without_a_socket_pods_are_named_by_cgroup_uid(tmp_path: Path) -> None:
    make_proc(tmp_path, 50, cgroup=f"0::/kubepods/besteffort/pod{POD_UID}/c1\n")
    a = Attributor(tmp_path, pod_resources_socket=tmp_path / "absent.sock")
    assert a.attribute(50, GPU_A) == Attribution(f"k8s:pod-{POD_UID}", K8S_POD)

"""Which Kubernetes pod holds a GPU, from the kubelet pod-resources API (as Datadog's NVML check maps GPUs to pods).

The kubelet serves `v1.PodResourcesLister/List` over gRPC on a unix socket
(`/var/lib/kubelet/pod-resources/kubelet.sock`, mounted into the agent's DaemonSet). The answer lists, per pod and
container, the device IDs the device plugin allocated: for NVIDIA's plugin the GPU UUID (`GPU-…`), a MIG device
(`MIG-…`) or, with time-slicing, `GPU-…::N` for the N-th share of one GPU.

grpcio is imported only when the socket exists; the protobuf messages are read with the small wire-format reader
below instead of generated code (four messages, three field kinds), so the agent carries no protobuf toolchain.
Field numbers, from k8s.io/kubelet/pkg/apis/podresources/v1/api.proto:
  ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
  PodResources             { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
  ContainerResources       { string name = 1; repeated ContainerDevices devices = 2; }
  ContainerDevices         { string resource_name = 1; repeated string device_ids = 2; }
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fleetprof.jobid import k8s_job_id

log = logging.getLogger(__name__)

LIST_METHOD = "/v1.PodResourcesLister/List"
REFRESH_S = 30.0  # pods come and go; one List per 30 s is what the kubelet's rate limit expects of a monitor


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    container: str

    @property
    def job_id(self) -> str:
        return k8s_job_id(self.namespace, self.name)


class WireFormatError(ValueError):
    """Bytes that are not a protobuf message of the expected shape."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise WireFormatError("truncated or overlong varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field of one message: varints as int, length-delimited as bytes; fixed
    32/64-bit fields are skipped (none of the fields read here has them)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield number, value
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise WireFormatError("length-delimited field runs past the message")
            yield number, buf[i:i + n]
            i += n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise WireFormatError(f"unsupported wire type {wire}")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise WireFormatError("expected a string field")
    return value.decode("utf-8", errors="replace")


def parse_list_response(buf: bytes) -> dict[str, set[PodRef]]:
    """GPU or MIG UUID -> the pods' containers it is allocated to (several with time-slicing)."""
    out: dict[str, set[PodRef]] = {}
    for number, pod in fields(buf):
        if number != 1 or not isinstance(pod, bytes):
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for f, v in fields(pod):
            if f == 1:
                name = _text(v)
            elif f == 2:
                namespace = _text(v)
            elif f == 3 and isinstance(v, bytes):
                containers.append(v)
        for container in containers:
            cname, devices = "", []
            for f, v in fields(container):
                if f == 1:
                    cname = _text(v)
                elif f == 2 and isinstance(v, bytes):
                    devices.append(v)
            for device in devices:
                for f, v in fields(device):
                    if f == 2:
                        uuid = _text(v).split("::", 1)[0]  # time-slicing: GPU-…::N is a share of GPU-…
                        out.setdefault(uuid, set()).add(PodRef(namespace, name, cname))
    return out


class PodResources:
    """The kubelet's GPU -> pod map, listed at most every `refresh_s` (a failed List is retried no sooner)."""

    def __init__(self, socket_path: str | Path, *, timeout_s: float = 2.0, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic):
        self.socket_path = Path(socket_path)
        self.timeout_s = timeout_s
        self.refresh_s = refresh_s
        self.clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, set[PodRef]] = {}
        self._listed_at: float | None = None
        self._warned: set[str] = set()

    def _warn_once(self, what: str, message: str, *args: object) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message, *args)

    def _list(self) -> dict[str, set[PodRef]] | None:
        if not self.socket_path.exists():
            return None
        try:
            import grpc
        except ImportError:
            self._warn_once("grpc", "kubelet pod-resources socket %s is mounted but grpcio is not installed "
                            "(pip install 'fleetprof[agent]'): pods are identified by cgroup UID only",
                            self.socket_path)
            return None
        try:
            with grpc.insecure_channel(f"unix://{self.socket_path}") as channel:
                call: grpc.UnaryUnaryMultiCallable[None, dict[str, set[PodRef]]] = channel.unary_unary(
                    LIST_METHOD, request_serializer=lambda _: b"", response_deserializer=parse_list_response)
                return call(None, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            self._warn_once("rpc", "kubelet pod-resources List failed (%s): pods by cgroup UID until it answers",
                            exc.code() if hasattr(exc, "code") else exc)
        except WireFormatError as exc:
            self._warn_once("wire", "kubelet pod-resources answer not understood (%s)", exc)
        return None

    def pods_of_gpu(self, uuid: str) -> set[PodRef]:
        """The pods holding GPU `uuid` (empty when unknown: no socket, no answer, or not allocated)."""
        with self._lock:
            now = self.clock()
            if self._listed_at is None or now - self._listed_at >= self.refresh_s:
                self._listed_at = now
                # A failed List forgets the last map: a stale one could give a process to a pod long gone.
                self._pods = self._list() or {}
            return set(self._pods.get(uuid, ()))

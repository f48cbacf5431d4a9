"""A simulation of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, native backend).

What it reproduces, with the constants of that file:
- request sizes rounded up to 512 bytes (`round_size`, kMinBlockSize);
- two pools: small (<= 1 MiB, kSmallSize) carved from 2 MiB segments (kSmallBuffer); large, with
  20 MiB segments (kLargeBuffer) for requests under 10 MiB (kMinLargeAlloc) and otherwise the request
  rounded up to 2 MiB (kRoundLarge) (`get_allocation_size`);
- best fit: the smallest free block of the pool that is large enough, lowest address on ties
  (`get_free_block`, a set ordered by stream, size, address), with the `max_split_size` rules
  (no oversize block for a small request; an oversize request takes a block at most kLargeBuffer larger);
- splitting (`should_split`): small-pool remainders >= 512 B, large-pool remainders > 1 MiB (and only for
  requests below max_split_size); freed blocks merge with free neighbours of the same segment;
- segments are never returned to the driver until an allocation would exceed the device: then every fully
  free segment is released and the allocation retried (`release_cached_blocks`); if it still does not fit,
  the job would see "CUDA out of memory".
Streams: a training step on the default stream allocates and frees on one stream, so the per-stream pools
collapse to one; cross-stream uses (record_stream, NCCL) are outside this model. `expandable_segments` and
`roundup_power2_divisions` are off, as by default.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20
NO_LIMIT = 1 << 62


class SimulatedOutOfMemory(Exception):
    def __init__(self, requested_bytes: int, reserved_bytes: int, capacity_bytes: int) -> None:
        super().__init__(
            f"allocating {requested_bytes} B with {reserved_bytes} B reserved exceeds {capacity_bytes} B"
        )
        self.requested_bytes = requested_bytes


def round_size(nbytes: int) -> int:
    if nbytes < K_MIN_BLOCK:
        return K_MIN_BLOCK
    return K_MIN_BLOCK * ((nbytes + K_MIN_BLOCK - 1) // K_MIN_BLOCK)


def allocation_size(size: int) -> int:
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class _Block:
    __slots__ = ("size", "addr", "small", "allocated", "prev", "next")

    def __init__(self, size: int, addr: int, small: bool) -> None:
        self.size = size
        self.addr = addr
        self.small = small
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _Pool:
    """Free blocks ordered by (size, address), the order of the allocator's BlockPool set."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], _Block] = {}

    def insert(self, block: _Block) -> None:
        key = (block.size, block.addr)
        bisect.insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = (block.size, block.addr)
        del self.keys[bisect.bisect_left(self.keys, key)]
        del self.blocks[key]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.keys, (size, -1))
        return self.blocks[self.keys[i]] if i < len(self.keys) else None


@dataclass
class AllocatorStats:
    peak_requested_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    segments: int = 0
    peak_segments: int = 0
    cache_flushes: int = 0  # times the simulated allocator released cached segments to avoid an OOM


class CachingAllocatorSim:
    def __init__(self, capacity_bytes: int | None = None, max_split_size: int | None = None) -> None:
        self.capacity = capacity_bytes if capacity_bytes is not None else NO_LIMIT
        self.max_split = max_split_size if max_split_size is not None else NO_LIMIT
        self._pools = {True: _Pool(), False: _Pool()}
        self._live: dict[int, tuple[_Block, int]] = {}  # storage id -> (block, requested bytes)
        self._next_addr = 0
        self.requested = self.allocated = self.reserved = 0
        self.stats = AllocatorStats()

    # -- public API ------------------------------------------------------------------------------------
    def malloc(self, key: int, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        pool = self._pools[small]
        block = self._free_block(pool, size)
        if block is None:
            block = self._new_segment(size, small)
        else:
            pool.remove(block)
        remaining = block.size - size
        if (remaining >= K_MIN_BLOCK) if small else (size < self.max_split and remaining > K_SMALL_SIZE):
            rest = _Block(remaining, block.addr + size, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.insert(rest)
        block.allocated = True
        self._live[key] = (block, nbytes)
        self.requested += nbytes
        self.allocated += block.size
        st = self.stats
        st.peak_requested_bytes = max(st.peak_requested_bytes, self.requested)
        st.peak_allocated_bytes = max(st.peak_allocated_bytes, self.allocated)

    def free(self, key: int) -> None:
        block, nbytes = self._live.pop(key)
        self.requested -= nbytes
        self.allocated -= block.size
        block.allocated = False
        pool = self._pools[block.small]
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                pool.remove(neighbour)
                if neighbour is block.prev:
                    block.addr = neighbour.addr
                    block.prev = neighbour.prev
                    if neighbour.prev is not None:
                        neighbour.prev.next = block
                else:
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
                block.size += neighbour.size
        pool.insert(block)

    def seed_segment(self, size: int, small: bool) -> None:
        """A cached, free segment of `size` bytes that exists before the replay (a warm cache)."""
        self._pools[small].insert(self._add_segment(size, small))

    def replay(self, events: Iterable[tuple[int, int]]) -> AllocatorStats:
        for key, nbytes in events:
            if nbytes > 0:
                self.malloc(key, nbytes)
            else:
                self.free(key)
        return self.stats

    # -- internals -------------------------------------------------------------------------------------
    def _free_block(self, pool: _Pool, size: int) -> _Block | None:
        block = pool.best_fit(size)
        if block is None:
            return None
        if size < self.max_split and block.size >= self.max_split:
            return None
        if size >= self.max_split and block.size >= size + K_LARGE_BUFFER:
            return None
        return block

    def _new_segment(self, size: int, small: bool) -> _Block:
        seg_size = allocation_size(size)
        if self.reserved + seg_size > self.capacity:
            self._release_cached_segments()
            self.stats.cache_flushes += 1
            if self.reserved + seg_size > self.capacity:
                raise SimulatedOutOfMemory(size, self.reserved, self.capacity)
        return self._add_segment(seg_size, small)

    def _add_segment(self, seg_size: int, small: bool) -> _Block:
        block = _Block(seg_size, self._next_addr, small)
        self._next_addr += seg_size
        self.reserved += seg_size
        st = self.stats
        st.segments += 1
        st.peak_segments = max(st.peak_segments, st.segments)
        st.peak_reserved_bytes = max(st.peak_reserved_bytes, self.reserved)
        return block

    def _release_cached_segments(self) -> None:
        for pool in self._pools.values():
            for block in [b for b in pool.blocks.values() if b.prev is None and b.next is None]:
                pool.remove(block)
                self.reserved -= block.size
                self.stats.segments -= 1

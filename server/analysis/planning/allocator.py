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
collapse to one; cross-stream uses (record_stream, NCCL) are outside this model.

`PYTORCH_CUDA_ALLOC_CONF` settings (`AllocConf`; all off by default, as in PyTorch), each as that file has it:
- `roundup_power2_divisions:N` (`round_size`, `roundup_power2_next_division`): a request above 512 * N bytes that
  is not a power of two is rounded up to the next of N equal steps between its power-of-two floor and ceiling;
- `max_split_size_mb:M` (`get_free_block`, `should_split`, `release_available_cached_blocks`): blocks of M MiB
  or more are not split for smaller requests, an oversize request takes a block at most 20 MiB larger, and
  before flushing the whole cache at capacity the allocator frees the oversize cached blocks it needs (here
  whole cached segments only: the smallest one large enough, else the largest ones until they add up);
- `expandable_segments:True` (`try_allocate_expandable_block`, `map_block`, `should_split`): one segment per pool
  that grows at its end by mapping pages (kSmallBuffer = 2 MiB for the small pool, kLargeBuffer = 20 MiB for the
  large one); a request no free block fits extends the free block at the end (if any) by whole pages; every
  remainder of 512 B or more is split off; past capacity the request fails (the real allocator first unmaps the
  whole free pages inside the segment and retries; not modelled, so this can report an OOM it would avoid);
- `garbage_collection_threshold:T` (`garbage_collect_cached_blocks`): only when the allowed memory is capped
  (`torch.cuda.set_per_process_memory_fraction`, here `capacity_bytes`): before a new segment, if reserved
  exceeds T x capacity, free unsplit cached large-pool segments whose age (get_free_block calls on the pool
  since the block was freed) is at least the mean age, repeatedly, until reserved - T x capacity is reclaimed.
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
MiB = 1 << 20


@dataclass(frozen=True)
class AllocConf:
    """The `PYTORCH_CUDA_ALLOC_CONF` settings the simulation models; None/False: PyTorch's default."""

    expandable_segments: bool = False
    max_split_size_mb: int | None = None  # PyTorch requires > 20 (kLargeBuffer)
    garbage_collection_threshold: float | None = None  # in (0, 1); acts only with a memory-fraction cap
    roundup_power2_divisions: int | None = None  # a power of two

    def env_value(self) -> str:
        """The value of `PYTORCH_CUDA_ALLOC_CONF` that selects these settings ("" for the defaults)."""
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size_mb is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size_mb}")
        if self.garbage_collection_threshold is not None:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        if self.roundup_power2_divisions is not None:
            parts.append(f"roundup_power2_divisions:{self.roundup_power2_divisions}")
        return ",".join(parts)


DEFAULT_ALLOC_CONF = AllocConf()


class SimulatedOutOfMemory(Exception):
    def __init__(self, requested_bytes: int, reserved_bytes: int, capacity_bytes: int) -> None:
        super().__init__(
            f"allocating {requested_bytes} B with {reserved_bytes} B reserved exceeds {capacity_bytes} B"
        )
        self.requested_bytes = requested_bytes


def round_size(nbytes: int, divisions: int | None = None) -> int:
    if nbytes < K_MIN_BLOCK:
        return K_MIN_BLOCK
    if divisions is not None and divisions > 1 and nbytes > K_MIN_BLOCK * divisions:
        return roundup_power2_next_division(nbytes, divisions)
    return K_MIN_BLOCK * ((nbytes + K_MIN_BLOCK - 1) // K_MIN_BLOCK)


def roundup_power2_next_division(nbytes: int, divisions: int) -> int:
    """`roundup_power2_next_division`: up to the next of `divisions` steps between the powers of two around it."""
    if nbytes & (nbytes - 1) == 0:
        return nbytes
    floor = 1 << (nbytes.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)  # divisions is a power of two
    if step == 0:
        return floor << 1
    below = nbytes & ~(step - 1)
    return below if below == nbytes else below + step


def allocation_size(size: int) -> int:
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class _Block:
    __slots__ = ("size", "addr", "small", "allocated", "prev", "next", "gc_base")

    def __init__(self, size: int, addr: int, small: bool) -> None:
        self.size = size
        self.addr = addr
        self.small = small
        self.allocated = False
        self.gc_base = 0  # the pool's get_free_block count when the block became free (its gc age is the rest)
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
    def __init__(self, capacity_bytes: int | None = None, max_split_size: int | None = None,
                 conf: AllocConf = DEFAULT_ALLOC_CONF) -> None:
        self.capacity = capacity_bytes if capacity_bytes is not None else NO_LIMIT
        if max_split_size is None and conf.max_split_size_mb is not None:
            max_split_size = conf.max_split_size_mb * MiB
        self.max_split = max_split_size if max_split_size is not None else NO_LIMIT
        self.conf = conf
        # garbage collection acts only where the allowed memory is capped (`set_fraction` in the allocator)
        self._gc_threshold = (conf.garbage_collection_threshold
                              if conf.garbage_collection_threshold and capacity_bytes is not None else None)
        self._gc_calls = 0  # get_free_block calls on the large pool
        self._tail: dict[bool, _Block | None] = {True: None, False: None}  # expandable: block at the mapped end
        self._pools = {True: _Pool(), False: _Pool()}
        self._live: dict[int, tuple[_Block, int]] = {}  # storage id -> (block, requested bytes)
        self._next_addr = 0
        self.requested = self.allocated = self.reserved = 0
        self.stats = AllocatorStats()

    # -- public API ------------------------------------------------------------------------------------
    def malloc(self, key: int, nbytes: int) -> None:
        size = round_size(nbytes, self.conf.roundup_power2_divisions)
        small = size <= K_SMALL_SIZE
        pool = self._pools[small]
        if not small and self._gc_threshold is not None:
            self._gc_calls += 1
        block = self._free_block(pool, size)
        if block is None:
            block = self._new_segment(size, small)
        else:
            pool.remove(block)
        remaining = block.size - size
        if (remaining >= K_MIN_BLOCK) if small or self.conf.expandable_segments else (
                size < self.max_split and remaining > K_SMALL_SIZE):
            rest = _Block(remaining, block.addr + size, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            if self._tail[small] is block:
                self._tail[small] = rest
            rest.gc_base = self._gc_calls
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
                    if self._tail[block.small] is neighbour:
                        self._tail[block.small] = block
                block.size += neighbour.size
        block.gc_base = self._gc_calls
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
        if self._gc_threshold is not None and not self.conf.expandable_segments:  # gc skips expandable blocks
            self._garbage_collect()
        if self.conf.expandable_segments:
            return self._expand(size, small)
        seg_size = allocation_size(size)
        if self.reserved + seg_size > self.capacity and self.max_split < NO_LIMIT:
            self._release_oversize_blocks(size)
        if self.reserved + seg_size > self.capacity:
            self._release_cached_segments()
            self.stats.cache_flushes += 1
            if self.reserved + seg_size > self.capacity:
                raise SimulatedOutOfMemory(size, self.reserved, self.capacity)
        return self._add_segment(seg_size, small)

    def _expand(self, size: int, small: bool) -> _Block:
        """`try_allocate_expandable_block`: grow the pool's segment at its end by whole pages."""
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        tail = self._tail[small]
        free_tail = tail if tail is not None and not tail.allocated else None
        have = free_tail.size if free_tail is not None else 0
        grow = -(-(size - have) // page) * page
        if self.reserved + grow > self.capacity:
            self.stats.cache_flushes += 1
            raise SimulatedOutOfMemory(size, self.reserved, self.capacity)
        self.reserved += grow
        st = self.stats
        st.peak_reserved_bytes = max(st.peak_reserved_bytes, self.reserved)
        if free_tail is not None:
            self._pools[small].remove(free_tail)
            free_tail.size += grow
            return free_tail
        block = _Block(grow, self._next_addr if tail is None else tail.addr + tail.size, small)
        if tail is None:
            self._next_addr += 1 << 50  # its own address range, as each expandable segment reserves one
            st.segments += 1
            st.peak_segments = max(st.peak_segments, st.segments)
        else:
            block.prev, tail.next = tail, block
        self._tail[small] = block
        return block

    def _garbage_collect(self) -> None:
        """`garbage_collect_cached_blocks`: free old unsplit large-pool segments above the threshold."""
        assert self._gc_threshold is not None
        threshold = int(self._gc_threshold * self.capacity)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        pool = self._pools[False]
        freeable = [b for b in pool.blocks.values() if b.prev is None and b.next is None]
        reclaimed = 0
        while freeable and reclaimed < target:
            ages = {id(b): self._gc_calls - b.gc_base for b in freeable}
            mean_age = sum(ages.values()) / len(freeable)
            old = [b for b in freeable if ages[id(b)] >= mean_age]
            for block in old:  # all of them: the allocator does not stop at the target
                self._release(pool, block)
                reclaimed += block.size
            freeable = [b for b in freeable if ages[id(b)] < mean_age]

    def _release_oversize_blocks(self, size: int) -> None:
        """`release_available_cached_blocks`: the smallest cached oversize segment at least the request, or else
        the largest ones until they add up to it."""
        pool = self._pools[False]
        need = max(size, self.max_split)
        oversize = sorted((b for b in pool.blocks.values()
                           if b.size >= self.max_split and b.prev is None and b.next is None),
                          key=lambda b: (b.size, b.addr))
        fits = [b for b in oversize if b.size >= need]
        if fits:
            self._release(pool, fits[0])
            return
        if sum(b.size for b in oversize) < need:
            return
        released = 0
        for block in reversed(oversize):
            if released >= need:
                break
            self._release(pool, block)
            released += block.size

    def _release(self, pool: _Pool, block: _Block) -> None:
        pool.remove(block)
        self.reserved -= block.size
        self.stats.segments -= 1

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
                self._release(pool, block)

"""The caching allocator: alignment, size classes, splitting, merging, reuse,
empty_cache, threads, fault injection and randomised properties.

Every test gets a device from the ``dev`` fixture, which leaves the allocator
of that device (and of the CPU) without a limit, without an injected fault and
with an empty cache, before and after, and fails a test that leaves live
blocks behind.
"""
from __future__ import annotations

import itertools
import random
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import pyxtts
import pyxtts.testing
from conftest import reset
from helpers import SEED

KiB = 1 << 10
MiB = 1 << 20
ALIGN = 256
SMALL_MAX = 1 * MiB  # <= this: small pool, 2 MiB segments
SMALL_SEGMENT = 2 * MiB
MID_MAX = 10 * MiB  # large pool, below this: 20 MiB segments
MID_SEGMENT = 20 * MiB
LARGE_ROUND = 2 * MiB  # larger requests: their size rounded to 2 MiB


def stats(device: str) -> dict:
    return pyxtts.memory_stats(device)


def alloc(nbytes: int, device: str):
    return pyxtts.empty(nbytes, dtype=pyxtts.uint8, device=device)


def r256(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def min_segment(nbytes: int) -> int:
    """The smallest segment the allocator can take for a request: exactly the
    block in the small pool (its last resort near a limit), the block rounded
    to 2 MiB in the large pool."""
    size = r256(nbytes)
    return size if size <= SMALL_MAX else -(-size // LARGE_ROUND) * LARGE_ROUND


def require_idle(device: str) -> dict:
    """Exact-layout tests need an allocator with no live block (and, after the
    fixture, no cached segment)."""
    s = stats(device)
    assert s["allocated_bytes"] == 0 and s["reserved_bytes"] == 0, (
        f"allocator of {device} not idle at test start (another test leaked tensors): {s}")
    return s


def delta(after: dict, before: dict, key: str) -> int:
    return after[key] - before[key]


# ---- alignment, size classes, splitting --------------------------------------

ODD_SIZES = [1, 255, 256, 257, 1000, 4097, 65539, MiB - 1, MiB, MiB + 1, 3 * MiB + 7,
             9 * MiB, 12 * MiB + 1, 25 * MiB]


def test_every_block_is_aligned_and_blocks_do_not_overlap(dev):
    live = [alloc(n, dev) for n in ODD_SIZES * 3]
    spans = sorted((t.data_ptr(), t.data_ptr() + r256(t.nbytes)) for t in live)
    for lo, _ in spans:
        assert lo % ALIGN == 0
    for (_, end), (nxt, _) in zip(spans, spans[1:]):
        assert end <= nxt, "two live blocks overlap"


# (request, segment taken, block size, inactive split bytes), from an idle allocator
SIZE_CLASSES = [
    (1, SMALL_SEGMENT, 256, SMALL_SEGMENT - 256),
    (1000, SMALL_SEGMENT, 1024, SMALL_SEGMENT - 1024),
    (MiB, SMALL_SEGMENT, MiB, MiB),
    (MiB + 1, MID_SEGMENT, MiB + 256, MID_SEGMENT - MiB - 256),
    (9 * MiB, MID_SEGMENT, 9 * MiB, 11 * MiB),
    (10 * MiB, 10 * MiB, 10 * MiB, 0),
    (10 * MiB + 1, 12 * MiB, 10 * MiB + 256, 2 * MiB - 256),
    # the rest of the segment (1 MiB or less) is not worth a split: the block gets it
    (11 * MiB, 12 * MiB, 12 * MiB, 0),
    (11 * MiB + 1, 12 * MiB, 12 * MiB, 0),
    (24 * MiB + 1, 26 * MiB, 24 * MiB + 256, 2 * MiB - 256),
    (25 * MiB, 26 * MiB, 26 * MiB, 0),
]


@pytest.mark.parametrize("nbytes,segment,block,inactive", SIZE_CLASSES,
                         ids=[str(c[0]) for c in SIZE_CLASSES])
def test_size_classes_and_split_thresholds(dev, nbytes, segment, block, inactive):
    s0 = require_idle(dev)
    t = alloc(nbytes, dev)
    s1 = stats(dev)
    assert delta(s1, s0, "reserved_bytes") == segment
    assert delta(s1, s0, "allocated_bytes") == block
    assert delta(s1, s0, "requested_bytes") == nbytes
    assert s1["inactive_split_bytes"] == inactive
    assert s1["cached_bytes"] == segment - block
    assert delta(s1, s0, "num_raw_allocs") == 1
    assert delta(s1, s0, "num_segments") == 1
    del t
    s2 = stats(dev)
    assert s2["allocated_bytes"] == 0 and s2["inactive_split_bytes"] == 0
    assert s2["reserved_bytes"] == segment  # cached, not returned
    assert pyxtts.empty_cache(dev) == segment


def test_small_blocks_are_carved_from_one_segment(dev):
    require_idle(dev)
    a = alloc(1000, dev)
    b = alloc(1000, dev)
    c = alloc(300, dev)
    assert b.data_ptr() == a.data_ptr() + 1024
    assert c.data_ptr() == b.data_ptr() + 1024
    s = stats(dev)
    assert s["reserved_bytes"] == SMALL_SEGMENT and s["num_segments"] == 1
    assert s["allocated_bytes"] == 1024 + 1024 + 512
    assert s["inactive_split_bytes"] == SMALL_SEGMENT - 2560
    del a, b, c


def test_large_cached_block_is_split_for_smaller_requests(dev):
    require_idle(dev)
    t = alloc(9 * MiB, dev)
    base = t.data_ptr()
    del t  # the 20 MiB segment is cached as one free block
    raw = stats(dev)["num_raw_allocs"]
    a = alloc(2 * MiB, dev)
    b = alloc(3 * MiB, dev)
    s = stats(dev)
    assert s["num_raw_allocs"] == raw, "a cached segment should have served both"
    assert (a.data_ptr(), b.data_ptr()) == (base, base + 2 * MiB)
    assert s["allocated_bytes"] == 5 * MiB
    assert s["inactive_split_bytes"] == 15 * MiB
    # 14.5 MiB out of the 15 MiB left: the 0.5 MiB rest is not split off
    c = alloc(14 * MiB + 512 * KiB, dev)
    assert c.data_ptr() == base + 5 * MiB
    s = stats(dev)
    assert s["allocated_bytes"] == MID_SEGMENT and s["inactive_split_bytes"] == 0
    assert s["num_raw_allocs"] == raw
    del a, b, c


# A free block and a bigger request of the same size class (bins hold 4 classes
# per power of two, so a bin mixes sizes on both sides of a request).
# (free block, request, allocated after: the request's block and a 256 B fence)
SAME_CLASS = [(2048, 2304, 2304 + 256), (4096, 4608, 4608 + 256),
              (12 * MiB, 13 * MiB, 14 * MiB + 256)]  # a new 14 MiB segment, not split


@pytest.mark.parametrize("free,request_,allocated", SAME_CLASS, ids=[str(c[0]) for c in SAME_CLASS])
def test_a_too_small_free_block_of_the_same_class_is_not_handed_out(dev, free, request_,
                                                                     allocated):
    require_idle(dev)
    a = alloc(free, dev)
    fence = alloc(256, dev)  # keeps a's block from merging with the tail
    a_ptr = a.data_ptr()
    del a
    t = alloc(request_, dev)
    assert t.data_ptr() != a_ptr
    spans = sorted([(t.data_ptr(), t.data_ptr() + request_), (fence.data_ptr(), fence.data_ptr() + 256)])
    assert spans[0][1] <= spans[1][0]
    assert stats(dev)["allocated_bytes"] == allocated
    del t, fence


# ---- merging ------------------------------------------------------------------

@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
@pytest.mark.parametrize("nbytes", [1000, 3 * MiB], ids=["small", "large"])
def test_free_neighbours_merge_into_one_block(dev, order, nbytes):
    require_idle(dev)
    blocks = [alloc(nbytes, dev) for _ in range(3)]
    segment = stats(dev)["reserved_bytes"]
    assert stats(dev)["num_segments"] == 1
    for i in order:
        blocks[i] = None
    s = stats(dev)
    assert s["allocated_bytes"] == 0
    # merged back into one free block: the segment is no longer split...
    assert s["inactive_split_bytes"] == 0
    # ...so empty_cache can hand all of it back
    assert pyxtts.empty_cache(dev) == segment
    assert stats(dev)["reserved_bytes"] == 0


def test_merged_neighbours_serve_a_bigger_request_in_place(dev):
    require_idle(dev)
    quarter = 256 * KiB
    blocks = [alloc(quarter, dev) for _ in range(SMALL_SEGMENT // quarter)]  # fills the segment
    s0 = stats(dev)
    assert s0["num_segments"] == 1 and s0["inactive_split_bytes"] == 0
    target = blocks[3].data_ptr()
    blocks[3] = blocks[4] = None  # two neighbours: one 512 KiB free block if merged
    t = alloc(2 * quarter, dev)
    assert t.data_ptr() == target
    assert stats(dev)["num_raw_allocs"] == s0["num_raw_allocs"]
    del t, blocks


def test_a_freed_block_with_a_live_neighbour_keeps_its_segment(dev):
    require_idle(dev)
    a = alloc(1000, dev)
    b = alloc(1000, dev)
    del a
    assert pyxtts.empty_cache(dev) == 0, "a segment with a live block must stay"
    assert stats(dev)["inactive_split_bytes"] == SMALL_SEGMENT - 1024
    del b
    assert pyxtts.empty_cache(dev) == SMALL_SEGMENT


# ---- reuse and empty_cache ----------------------------------------------------

@pytest.mark.parametrize("nbytes", [1, 1000, 64 * KiB, MiB, 3 * MiB, 12 * MiB, 30 * MiB])
def test_freed_block_is_reused_without_a_raw_allocation(dev, nbytes):
    t = alloc(nbytes, dev)
    del t
    t = alloc(nbytes, dev)
    ptr = t.data_ptr()
    del t  # merged back: the same free block serves every later request
    s0 = stats(dev)
    for _ in range(50):
        t = alloc(nbytes, dev)
        assert t.data_ptr() == ptr
        del t
    s1 = stats(dev)
    assert s1["num_raw_allocs"] == s0["num_raw_allocs"]
    assert s1["reserved_bytes"] == s0["reserved_bytes"]
    assert delta(s1, s0, "num_allocs") == 50 and delta(s1, s0, "num_frees") == 50


def test_empty_cache_releases_exactly_the_wholly_free_segments(dev):
    s0 = require_idle(dev)
    keep = pyxtts.tensor(np.arange(100, dtype=np.int32), device=dev)  # small segment 1
    drop = alloc(MiB, dev)  # fits in the rest of segment 1
    other = alloc(MiB, dev)  # 1 MiB - 512 left there: small segment 2
    mid = alloc(5 * MiB, dev)  # a 20 MiB segment
    big = alloc(30 * MiB, dev)  # a 30 MiB segment
    s1 = stats(dev)
    assert delta(s1, s0, "num_segments") == 4
    assert delta(s1, s0, "reserved_bytes") == 2 * SMALL_SEGMENT + MID_SEGMENT + 30 * MiB
    assert pyxtts.empty_cache(dev) == 0  # everything is in use
    del drop, other, mid, big  # segment 1 still holds `keep`
    before = stats(dev)
    released = pyxtts.empty_cache(dev)
    after = stats(dev)
    assert released == SMALL_SEGMENT + MID_SEGMENT + 30 * MiB
    assert delta(before, after, "reserved_bytes") == released
    assert delta(after, before, "num_raw_frees") == 3
    assert delta(after, s0, "num_segments") == 1
    assert pyxtts.empty_cache(dev) == 0  # nothing left to give
    np.testing.assert_array_equal(np.asarray(keep), np.arange(100, dtype=np.int32))
    del keep
    assert pyxtts.empty_cache(dev) == SMALL_SEGMENT


# ---- threads ------------------------------------------------------------------

def test_concurrent_alloc_and_free_from_eight_threads(dev):
    """8 threads copy 1 MiB arrays in and out (the GIL is released around the
    copies) while a ninth empties the cache (also without the GIL) and reads
    stats; every tensor must keep its own bytes and the stats must add up."""
    s0 = stats(dev)
    # a long segment list for each empty_cache to walk without the GIL while
    # the workers allocate and free
    n_ballast = 600
    ballast = [alloc(MiB, dev) for _ in range(n_ballast)]
    n_threads, rounds = 8, 60
    errors: list[BaseException] = []
    done = threading.Event()
    barrier = threading.Barrier(n_threads + 1)

    def worker(k: int) -> None:
        rng = random.Random(f"{SEED}:{k}")
        try:
            barrier.wait()
            keep = []
            for r in range(rounds):
                value = (k * rounds + r) % 251
                src = np.full(MiB, value, dtype=np.uint8)
                t = pyxtts.tensor(src, device=dev)
                small = alloc(rng.randint(1, 64 * KiB), dev)
                # a segment of its own, wholly free again at once: the
                # janitor races the next round's reuse of it
                big = alloc(12 * MiB + rng.randint(0, MiB), dev)
                del big
                keep.append((t, value))
                if len(keep) > 3:
                    old, old_value = keep.pop(rng.randrange(len(keep)))
                    back = np.asarray(old)
                    if not (back == old_value).all():
                        raise AssertionError(f"thread {k}: a block was overwritten")
                del small
            for t, value in keep:
                if not (np.asarray(t) == value).all():
                    raise AssertionError(f"thread {k}: a block was overwritten")
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def janitor() -> None:
        try:
            barrier.wait()
            while not done.is_set():
                pyxtts.empty_cache(dev)
                s = stats(dev)
                # one snapshot, taken under the allocator's lock: it must add up
                assert s["allocated_bytes"] <= s["reserved_bytes"]
                assert s["num_allocs"] - s["num_frees"] == s["num_active_blocks"]
                assert s["cached_bytes"] == s["reserved_bytes"] - s["allocated_bytes"]
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    jt = threading.Thread(target=janitor)
    for t in threads + [jt]:
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    jt.join(60)
    assert not errors, errors[0]
    del ballast
    s1 = stats(dev)
    assert s1["allocated_bytes"] == s0["allocated_bytes"]
    assert s1["requested_bytes"] == s0["requested_bytes"]
    assert s1["num_active_blocks"] == s0["num_active_blocks"]
    assert delta(s1, s0, "num_allocs") == delta(s1, s0, "num_frees") == 3 * n_threads * rounds + n_ballast
    pyxtts.empty_cache(dev)
    s2 = stats(dev)
    assert s2["reserved_bytes"] == s0["reserved_bytes"]
    assert delta(s2, s0, "num_raw_allocs") == delta(s2, s0, "num_raw_frees")


# ---- fault injection ----------------------------------------------------------

SEQUENCE = [1000, 3000, MiB, 3 * MiB, 12 * MiB, 256, 5000, 9 * MiB, 1, 40 * MiB]


def test_injected_oom_fails_exactly_the_chosen_request(dev):
    for i in range(len(SEQUENCE)):
        pyxtts.testing.inject_oom(i, dev)
        live, failed = [], []
        for j, n in enumerate(SEQUENCE):
            before = stats(dev)
            try:
                live.append(alloc(n, dev))
            except pyxtts.OutOfMemoryError as e:
                failed.append(j)
                after = stats(dev)
                assert e.requested_bytes == n
                assert after["allocated_bytes"] == before["allocated_bytes"]
                assert after["reserved_bytes"] == before["reserved_bytes"]
                assert delta(after, before, "num_allocs") == 0
                assert delta(after, before, "num_ooms") == 1
        assert failed == [i]
        live.append(alloc(1000, dev))  # one-shot: the hook is spent
        del live
        pyxtts.empty_cache(dev)


def test_injected_oom_ignores_the_cache(dev):
    t = alloc(1000, dev)
    del t  # a cached block that would serve the next request
    pyxtts.testing.inject_oom(0, dev)
    with pytest.raises(pyxtts.OutOfMemoryError, match="out of memory"):
        alloc(1000, dev)
    pyxtts.testing.inject_oom(1, dev)
    a = alloc(1000, dev)
    pyxtts.testing.inject_oom(None, dev)  # cleared before it fires
    b = alloc(1000, dev)
    c = alloc(1000, dev)
    del a, b, c


def _segment_requests(device: str) -> list[int]:
    """Indices of SEQUENCE requests that take a new segment, from an empty cache."""
    pyxtts.empty_cache(device)
    live, needs = [], []
    for j, n in enumerate(SEQUENCE):
        raw = stats(device)["num_raw_allocs"]
        live.append(alloc(n, device))
        if stats(device)["num_raw_allocs"] != raw:
            needs.append(j)
    del live
    pyxtts.empty_cache(device)
    return needs


def test_injected_raw_failure_at_each_segment_goes_through_the_retry(dev):
    needs = _segment_requests(dev)
    assert len(needs) >= 4
    for i in range(len(needs) + 1):
        pyxtts.empty_cache(dev)
        s0 = stats(dev)
        pyxtts.testing.inject_oom(i, dev, raw=True)
        live, retried = [], []
        for j, n in enumerate(SEQUENCE):
            before = stats(dev)["num_alloc_retries"]
            live.append(alloc(n, dev))  # never raises: the retry gets the segment
            if stats(dev)["num_alloc_retries"] != before:
                retried.append(j)
        s1 = stats(dev)
        assert retried == ([needs[i]] if i < len(needs) else [])
        assert delta(s1, s0, "num_raw_allocs") == len(needs)
        assert delta(s1, s0, "num_ooms") == 0
        pyxtts.testing.inject_oom(None, dev)
        del live


def test_injected_raw_failure_releases_the_cache_and_retries(dev):
    require_idle(dev)
    t = alloc(1000, dev)
    del t  # a cached small segment, useless to the large pool
    s0 = stats(dev)
    assert s0["reserved_bytes"] == SMALL_SEGMENT
    pyxtts.testing.inject_oom(0, dev, raw=True)
    big = alloc(12 * MiB, dev)
    s1 = stats(dev)
    assert delta(s1, s0, "num_alloc_retries") == 1
    assert delta(s1, s0, "num_raw_frees") == 1  # the cached segment went back
    assert s1["reserved_bytes"] == 12 * MiB
    assert delta(s1, s0, "num_ooms") == 0
    del big


# ---- randomised properties ----------------------------------------------------

_small = st.integers(1, 4 * KiB)
_medium = st.integers(4 * KiB + 1, MiB)
_large = st.integers(MiB + 1, 64 * MiB)
SIZES = st.one_of(_small, _small, _small, _medium, _medium, _large)  # weighted toward small
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), SIZES),
        st.tuples(st.just("alloc"), SIZES),
        st.tuples(st.just("free"), st.integers(0, 1 << 16)),
        st.tuples(st.just("empty_cache"), st.just(0)),
        st.tuples(st.just("inject"), st.tuples(st.integers(0, 5), st.booleans())),
    ),
    max_size=40,
)
LIMITS = st.one_of(st.none(), st.integers(0, 4 * MiB), st.integers(0, 160 * MiB))


def _check_invariants(device, base, live, limit):
    s = stats(device)
    sizes = [n for _, n in live]
    allocated = s["allocated_bytes"] - base["allocated_bytes"]
    rounded = sum(r256(n) for n in sizes)
    n_large = sum(r256(n) > SMALL_MAX for n in sizes)
    assert s["allocated_bytes"] <= s["reserved_bytes"]
    if limit is not None:
        assert s["reserved_bytes"] <= limit
    # small blocks are exact; a large block may hold an unsplit rest of <= 1 MiB
    assert rounded <= allocated <= rounded + n_large * MiB
    assert s["requested_bytes"] - base["requested_bytes"] == sum(sizes)
    assert (s["num_allocs"] - s["num_frees"]) - (base["num_allocs"] - base["num_frees"]) == len(live)
    assert s["num_active_blocks"] - base["num_active_blocks"] == len(live)
    assert s["allocated_bytes"] + s["inactive_split_bytes"] <= s["reserved_bytes"]
    assert s["peak_allocated_bytes"] >= s["allocated_bytes"]
    assert s["peak_reserved_bytes"] >= s["reserved_bytes"]


@pytest.mark.slow
@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(limit=LIMITS, ops=OPS)
@seed(SEED)
def test_random_sequences_keep_the_books(dev, limit, ops):
    reset(dev)
    base = stats(dev)
    # the limit counts from what others hold, so it always leaves `limit` bytes
    lim = None if limit is None else base["reserved_bytes"] + limit
    pyxtts.set_memory_limit(lim, dev)
    live: list = []
    countdown = None  # requests before an injected (not raw) failure
    raw_pending = False  # an injected raw failure may still come
    try:
        for op, arg in ops:
            before = stats(dev)
            if op == "alloc":
                injected = countdown == 0
                countdown = None if countdown in (None, 0) else countdown - 1
                # the free bytes of every segment together are at most this
                must_fail = lim is not None and r256(arg) > lim - before["allocated_bytes"]
                try:
                    live.append((alloc(arg, dev), arg))  # no other name may hold it
                except pyxtts.OutOfMemoryError as e:
                    after = stats(dev)
                    assert e.requested_bytes == arg and e.limit_bytes == lim
                    assert (e.allocated_bytes, e.reserved_bytes) == (
                        after["allocated_bytes"], after["reserved_bytes"])
                    assert after["allocated_bytes"] == before["allocated_bytes"]
                    assert delta(after, before, "num_allocs") == 0
                    assert delta(after, before, "num_ooms") == 1
                    if injected:  # as if the device were full: nothing else moves
                        assert "inject" in str(e)
                        assert after["reserved_bytes"] == before["reserved_bytes"]
                        assert delta(after, before, "num_alloc_retries") == 0
                    else:
                        assert lim is not None, "failed without a limit"
                        assert after["reserved_bytes"] <= before["reserved_bytes"]
                        assert delta(after, before, "num_alloc_retries") == 1
                        assert pyxtts.empty_cache(dev) == 0  # the retry gave back all
                        if "raw allocation failed" in str(e):
                            # the device said no to the last resort (a segment
                            # of just the block), after the cache went back
                            assert raw_pending and "inject" in str(e)
                            raw_pending = False
                        else:
                            # it failed only because it had to: even with no
                            # unused segment left, no segment that can hold
                            # the request fits under the limit
                            assert after["reserved_bytes"] + min_segment(arg) > lim
                else:
                    assert not injected, "the injected fault did not fire"
                    assert not must_fail, "succeeded with less room than it needs"
                    assert live[-1][0].data_ptr() % ALIGN == 0
            elif op == "inject":
                n, raw = arg
                pyxtts.testing.inject_oom(n, dev, raw=raw)
                countdown = None if raw else n
                raw_pending = raw
            elif op == "free" and live:
                live.pop(arg % len(live))
            elif op == "empty_cache":
                released = pyxtts.empty_cache(dev)
                assert stats(dev)["reserved_bytes"] == before["reserved_bytes"] - released
            _check_invariants(dev, base, live, lim)
        random.Random(f"{SEED}:{len(ops)}").shuffle(live)
        while live:
            live.pop()
            _check_invariants(dev, base, live, lim)
        end = stats(dev)
        assert end["allocated_bytes"] == base["allocated_bytes"]
        assert end["requested_bytes"] == base["requested_bytes"]
        pyxtts.empty_cache(dev)
        assert stats(dev)["reserved_bytes"] == base["reserved_bytes"]
    finally:
        live.clear()
        reset(dev)


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(SIZES, min_size=1, max_size=8), room=st.integers(0, 40 * MiB))
@seed(SEED)
def test_a_request_that_fits_with_an_empty_cache_never_fails(dev, sizes, room):
    """From an idle, emptied allocator, a request whose smallest segment fits
    under the limit must succeed, whatever came before it was freed."""
    reset(dev)
    base = stats(dev)
    try:
        for n in sizes:
            # leave some cache around first: it must not stand in the way
            junk = [alloc(m, dev) for m in sizes]
            del junk
            lim = base["reserved_bytes"] + min_segment(n) + room
            pyxtts.set_memory_limit(lim, dev)
            before = stats(dev)["reserved_bytes"]  # may exceed lim: cached junk
            t = alloc(n, dev)
            # a cached block may serve it; a new segment must fit under the limit
            assert stats(dev)["reserved_bytes"] <= max(lim, before)
            del t
            pyxtts.set_memory_limit(None, dev)
            pyxtts.empty_cache(dev)
    finally:
        reset(dev)

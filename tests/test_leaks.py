"""Leaks: many create/destroy cycles leave the allocator's books, the process's
resident memory and the reference counts of NumPy sources where they were."""
from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest

import pyxtts
import pyxtts.testing
from conftest import reset

KiB = 1 << 10
MiB = 1 << 20
RSS_SLACK = 2 * MiB
WARMUP = 1000
# Under AddressSanitizer (CI's second run) freed host memory waits in ASan's
# quarantine, so RSS grows by design there: the plain run checks RSS, the
# sanitizer run checks the allocator's books and reference counts.
SANITIZED = bool(os.environ.get("PYXTTS_SANITIZED"))


@pytest.fixture
def cpu(request):
    gc.collect()
    reset("cpu")
    start = pyxtts.memory_stats("cpu")
    yield "cpu"
    reset("cpu")
    rep = getattr(request.node, "_pxt_rep_call", None)  # set by conftest's report hook
    if rep is not None and rep.failed:
        return  # the traceback holds the test's tensors; one failure is enough
    end = pyxtts.memory_stats("cpu")
    assert end["allocated_bytes"] == start["allocated_bytes"], "the test left live blocks"
    assert end["reserved_bytes"] == start["reserved_bytes"], "the test left segments behind"


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE")


def books(device: str) -> tuple[int, int, int, int]:
    s = pyxtts.memory_stats(device)
    return (s["allocated_bytes"], s["requested_bytes"], s["reserved_bytes"],
            s["num_active_blocks"])


def run_flat(cycle, n: int, device: str = "cpu", warmup: int = WARMUP) -> None:
    """Runs cycle() warmup times, then n times; the books and the RSS must not move."""
    for _ in range(warmup):
        cycle()
    gc.collect()
    books0, rss0 = books(device), rss()
    for _ in range(n):
        cycle()
    gc.collect()
    assert books(device) == books0
    grown = rss() - rss0
    assert SANITIZED or grown <= RSS_SLACK, f"RSS grew by {grown / MiB:.1f} MiB over {n} cycles"


@pytest.mark.slow
def test_empty_and_tensor_cycles_are_flat(cpu):
    src32 = np.arange(64, dtype=np.float32)
    src64 = np.arange(33, dtype=np.float64)  # cast on the way in
    src8 = np.arange(300, dtype=np.uint8)
    refs = [sys.getrefcount(a) for a in (src32, src64, src8)]

    dtypes = (pyxtts.uint8, pyxtts.float32)
    dtype_refs = [sys.getrefcount(d) for d in dtypes]

    def cycle():
        a = pyxtts.empty(100, dtype=pyxtts.uint8, device=cpu)
        b = pyxtts.tensor(src32, device=cpu)
        c = pyxtts.tensor(src64)
        d = pyxtts.empty((3, 7), dtype=pyxtts.float32, device=cpu)
        e = pyxtts.tensor(src8)
        got = (a.dtype, b.shape, c.device, d.dtype)  # getters hand out references
        del a, b, c, d, e, got

    # 300,000 cycles: a leak of even 8 bytes a cycle shows above the slack
    run_flat(cycle, 300_000)
    assert [sys.getrefcount(a) for a in (src32, src64, src8)] == refs
    assert [sys.getrefcount(d) for d in dtypes] == dtype_refs


def test_numpy_round_trip_cycles_are_flat(cpu):
    src = np.linspace(0, 1, 257, dtype=np.float32)
    refs = sys.getrefcount(src)

    def cycle():
        t = pyxtts.tensor(src)
        back = np.asarray(t)
        z = pyxtts.zeros(50, dtype=pyxtts.int64)
        del t, back, z

    run_flat(cycle, 30_000)
    assert sys.getrefcount(src) == refs


def test_out_of_memory_cycles_are_flat(cpu):
    """The failure path (tensor from NumPy and empty, under an injected fault
    and under a limit) frees what it took and drops its references."""
    src = np.arange(1000, dtype=np.float32)
    refs = sys.getrefcount(src)
    oom = pyxtts.OutOfMemoryError

    def cycle():
        pyxtts.testing.inject_oom(0, cpu)
        try:
            pyxtts.tensor(src)
        except oom:
            pass
        else:
            raise AssertionError("the injected fault did not fire")
        pyxtts.set_memory_limit(0, cpu)
        try:
            pyxtts.empty(4 * MiB, dtype=pyxtts.uint8)
        except oom:
            pass
        else:
            raise AssertionError("a zero limit let an allocation through")
        pyxtts.set_memory_limit(None, cpu)

    ooms0 = pyxtts.memory_stats(cpu)["num_ooms"]
    run_flat(cycle, 10_000)
    assert pyxtts.memory_stats(cpu)["num_ooms"] - ooms0 == 2 * (WARMUP + 10_000)
    assert sys.getrefcount(src) == refs


def test_segment_churn_is_flat(cpu):
    """Segments taken from the device and handed back over and over: the
    allocator's bookkeeping (segments, block records) must not pile up."""
    s0 = pyxtts.memory_stats(cpu)

    def cycle():
        a = pyxtts.empty(1000, dtype=pyxtts.uint8)
        b = pyxtts.empty(3 * MiB, dtype=pyxtts.uint8)
        c = pyxtts.empty(30 * MiB, dtype=pyxtts.uint8)
        del a, b, c
        assert pyxtts.empty_cache(cpu) == (2 + 20 + 30) * MiB

    # 20,000 cycles so that a record of 48 bytes lost per segment shows in the RSS. Under
    # the sanitizers the RSS is not judged (see SANITIZED) and each 30 MiB segment costs
    # ASan ~12 ms of shadow poisoning (254 s in all, a sixth of CI's sanitized run): there
    # a few hundred cycles check the books and the raw counts as well.
    warmup, n = (100, 200) if SANITIZED else (WARMUP, 20_000)
    run_flat(cycle, n, warmup=warmup)
    s1 = pyxtts.memory_stats(cpu)
    assert s1["num_raw_allocs"] - s0["num_raw_allocs"] == 3 * (warmup + n)
    assert s1["num_raw_allocs"] - s0["num_raw_allocs"] == s1["num_raw_frees"] - s0["num_raw_frees"]


def test_many_live_blocks_then_all_freed(cpu, rng):
    """Thousands of live small blocks (many segments, long free lists), freed
    in a scrambled order, leave nothing behind once the cache is emptied."""
    s0 = pyxtts.memory_stats(cpu)
    sizes = rng.integers(1, 20 * KiB, size=20_000)
    live = [pyxtts.empty(int(n), dtype=pyxtts.uint8) for n in sizes]
    s1 = pyxtts.memory_stats(cpu)
    assert s1["allocated_bytes"] - s0["allocated_bytes"] == sum(-(-int(n) // 256) * 256 for n in sizes)
    for i in rng.permutation(len(live)):
        live[i] = None
    s2 = pyxtts.memory_stats(cpu)
    assert s2["allocated_bytes"] == s0["allocated_bytes"]
    assert s2["inactive_split_bytes"] == s0["inactive_split_bytes"]
    released = pyxtts.empty_cache(cpu)
    assert released == s1["reserved_bytes"] - s0["reserved_bytes"]

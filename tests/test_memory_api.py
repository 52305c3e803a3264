"""The allocator's Python API: stats, peaks, budgets (limit, fraction), the
OutOfMemoryError, the fault hook, memory_summary, cleanup_gpu_memory and
device arguments."""
from __future__ import annotations

import gc
import math
import os
import re
import sys

import numpy as np
import pytest

import pyxtts
import pyxtts.testing
from conftest import requires_cuda, reset

KiB = 1 << 10
MiB = 1 << 20
SMALL_SEGMENT = 2 * MiB
MID_SEGMENT = 20 * MiB


STAT_KEYS = {
    "device", "allocated_bytes", "requested_bytes", "reserved_bytes", "peak_allocated_bytes",
    "peak_reserved_bytes", "limit_bytes", "inactive_split_bytes", "cached_bytes", "num_allocs",
    "num_frees", "num_ooms", "num_alloc_retries", "num_raw_allocs", "num_raw_frees",
    "num_segments", "num_active_blocks", "device_total_bytes", "pinned",
}


def stats(device: str) -> dict:
    return pyxtts.memory_stats(device)


def alloc(nbytes: int, device: str):
    return pyxtts.empty(nbytes, dtype=pyxtts.uint8, device=device)


def require_idle(device: str) -> dict:
    s = stats(device)
    assert s["allocated_bytes"] == 0 and s["reserved_bytes"] == 0, (
        f"allocator of {device} not idle at test start (another test leaked tensors): {s}")
    return s


def fmt(n: int | None) -> str:
    """memory_summary's byte format, written out independently."""
    if n is None:
        return "none"
    if n < 1024:
        return f"{n} B"
    for i, unit in enumerate(("KiB", "MiB", "GiB", "TiB"), 1):
        if n < 1024 ** (i + 1) or unit == "TiB":
            return f"{n / 1024 ** i:.2f} {unit}"
    raise AssertionError


# ---- stats --------------------------------------------------------------------

def test_scripted_stats_are_exact(dev):
    s0 = require_idle(dev)
    pyxtts.reset_peak_memory_stats(dev)
    a = alloc(1000, dev)
    s = stats(dev)
    assert s["device"] == dev
    assert set(s) == STAT_KEYS
    assert s["allocated_bytes"] == 1024
    assert s["requested_bytes"] == 1000
    assert s["reserved_bytes"] == SMALL_SEGMENT
    assert s["inactive_split_bytes"] == SMALL_SEGMENT - 1024
    assert s["cached_bytes"] == SMALL_SEGMENT - 1024
    assert s["limit_bytes"] is None
    assert (s["num_allocs"] - s0["num_allocs"], s["num_frees"] - s0["num_frees"]) == (1, 0)
    assert s["num_active_blocks"] == 1 and s["num_segments"] == 1
    assert s["num_raw_allocs"] - s0["num_raw_allocs"] == 1
    assert s["peak_allocated_bytes"] == 1024 and s["peak_reserved_bytes"] == SMALL_SEGMENT

    b = alloc(2 * MiB, dev)  # > 1 MiB: the large pool, a 20 MiB segment
    s = stats(dev)
    assert s["allocated_bytes"] == 1024 + 2 * MiB
    assert s["reserved_bytes"] == SMALL_SEGMENT + MID_SEGMENT
    assert s["inactive_split_bytes"] == (SMALL_SEGMENT - 1024) + (MID_SEGMENT - 2 * MiB)
    assert s["num_segments"] == 2

    del a
    s = stats(dev)
    assert s["allocated_bytes"] == 2 * MiB
    assert s["requested_bytes"] == 2 * MiB
    # the small segment is wholly free now: cached, not "inactive split"
    assert s["inactive_split_bytes"] == MID_SEGMENT - 2 * MiB
    assert s["cached_bytes"] == SMALL_SEGMENT + MID_SEGMENT - 2 * MiB
    assert s["peak_allocated_bytes"] == 1024 + 2 * MiB
    assert s["num_frees"] - s0["num_frees"] == 1 and s["num_active_blocks"] == 1
    del b
    s = stats(dev)
    assert (s["allocated_bytes"], s["inactive_split_bytes"]) == (0, 0)
    assert s["reserved_bytes"] == SMALL_SEGMENT + MID_SEGMENT
    assert pyxtts.empty_cache(dev) == SMALL_SEGMENT + MID_SEGMENT
    s = stats(dev)
    assert (s["reserved_bytes"], s["num_segments"]) == (0, 0)
    assert s["num_raw_frees"] - s0["num_raw_frees"] == 2
    assert s["peak_reserved_bytes"] == SMALL_SEGMENT + MID_SEGMENT


def test_stat_functions_agree_with_memory_stats(dev):
    t = alloc(3 * MiB, dev)
    s = stats(dev)
    assert pyxtts.memory_allocated(dev) == s["allocated_bytes"]
    assert pyxtts.memory_reserved(dev) == s["reserved_bytes"]
    assert pyxtts.max_memory_allocated(dev) == s["peak_allocated_bytes"]
    assert pyxtts.max_memory_reserved(dev) == s["peak_reserved_bytes"]
    assert pyxtts.memory_allocated(device=dev) == s["allocated_bytes"]
    del t


def test_peaks_and_reset(dev):
    s0 = stats(dev)
    pyxtts.reset_peak_memory_stats(dev)
    assert pyxtts.max_memory_allocated(dev) == s0["allocated_bytes"]
    t = alloc(5 * MiB, dev)
    u = alloc(7 * MiB, dev)
    peak = pyxtts.memory_allocated(dev)
    del t, u
    assert pyxtts.memory_allocated(dev) == s0["allocated_bytes"]
    assert pyxtts.max_memory_allocated(dev) == peak  # peaks stay after frees
    reserved = pyxtts.memory_reserved(dev)
    pyxtts.empty_cache(dev)
    assert pyxtts.max_memory_reserved(dev) == reserved
    pyxtts.reset_peak_memory_stats(dev)  # peaks := current
    assert pyxtts.max_memory_allocated(dev) == pyxtts.memory_allocated(dev)
    assert pyxtts.max_memory_reserved(dev) == pyxtts.memory_reserved(dev)
    t = alloc(1000, dev)
    assert pyxtts.max_memory_allocated(dev) == pyxtts.memory_allocated(dev)
    del t


def test_memory_summary_shows_the_device_and_current_numbers(dev):
    a = alloc(1000, dev)
    b = alloc(3 * MiB, dev)
    pyxtts.set_memory_limit(512 * MiB, dev)
    s = stats(dev)
    text = pyxtts.memory_summary(dev)
    assert dev in text.splitlines()[0]
    rows = {}
    for line in text.splitlines():
        m = re.match(r"(\S.*?)\s{2,}(\S.*)$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    assert rows["allocated"].split()[:2] == fmt(s["allocated_bytes"]).split()
    assert rows["allocated"].split()[2:] == fmt(s["peak_allocated_bytes"]).split()
    assert rows["reserved"].split()[:2] == fmt(s["reserved_bytes"]).split()
    assert rows["limit"] == "512.00 MiB"
    assert rows["inactive split"] == fmt(s["inactive_split_bytes"])
    assert rows["allocations"] == str(s["num_allocs"])
    assert rows["frees"] == str(s["num_frees"])
    assert rows["active blocks"] == str(s["num_active_blocks"])
    assert rows["segments"] == str(s["num_segments"])
    del a, b
    text = pyxtts.memory_summary(dev)  # and it follows the numbers
    assert re.search(r"^frees\s+%d$" % (s["num_frees"] + 2), text, re.M)
    pyxtts.set_memory_limit(None, dev)
    assert re.search(r"^limit\s+none$", pyxtts.memory_summary(dev), re.M)


# ---- empty_cache and cleanup_gpu_memory ---------------------------------------

def test_empty_cache_returns_what_reserved_loses(dev):
    live = alloc(500, dev)
    ts = [alloc(n, dev) for n in (1000, 2 * MiB, 15 * MiB, 33 * MiB)]
    del ts
    before = pyxtts.memory_reserved(dev)
    released = pyxtts.empty_cache(dev)
    assert released >= MID_SEGMENT + 34 * MiB
    assert pyxtts.memory_reserved(dev) == before - released
    assert pyxtts.empty_cache(dev) == 0
    assert live.nbytes == 500  # untouched
    del live


def test_cleanup_gpu_memory_collects_cycles_and_releases(dev):
    s0 = stats(dev)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the cycle must survive until cleanup collects it
    try:
        holder: list = [alloc(5 * MiB, dev), alloc(1000, dev)]
        holder.append(holder)
        del holder
        s1 = stats(dev)
        assert s1["allocated_bytes"] - s0["allocated_bytes"] == 5 * MiB + 1024
        released = pyxtts.cleanup_gpu_memory()
    finally:
        if gc_was_enabled:
            gc.enable()
    s2 = stats(dev)
    assert s2["allocated_bytes"] == s0["allocated_bytes"]
    assert s2["reserved_bytes"] == s0["reserved_bytes"]
    assert released >= s1["reserved_bytes"] - s0["reserved_bytes"] == MID_SEGMENT + SMALL_SEGMENT
    assert pyxtts.cleanup_gpu_memory(dev) == 0


def test_cleanup_gpu_memory_for_one_device(dev):
    t = alloc(3 * MiB, dev)
    del t
    assert pyxtts.cleanup_gpu_memory(dev) == MID_SEGMENT
    with pytest.raises(ValueError, match="device"):
        pyxtts.cleanup_gpu_memory("gpu")


# ---- budget -------------------------------------------------------------------

def test_limit_is_reported_and_removed(dev):
    pyxtts.set_memory_limit(100 * MiB, dev)
    assert stats(dev)["limit_bytes"] == 100 * MiB
    pyxtts.set_memory_limit(None, dev)
    assert stats(dev)["limit_bytes"] is None
    pyxtts.set_memory_limit(nbytes=0, device=dev)
    assert stats(dev)["limit_bytes"] == 0
    # a limit past what a size_t can count limits nothing
    pyxtts.set_memory_limit(2**64 + 5, dev)
    assert stats(dev)["limit_bytes"] is None
    pyxtts.set_memory_limit(2**63 - 1, dev)
    assert stats(dev)["limit_bytes"] == 2**63 - 1
    t = alloc(30 * MiB, dev)  # no overflow in reserved + segment vs. limit
    del t


@pytest.mark.parametrize("bad", [-1, -(2**70)])
def test_negative_limit_is_a_value_error(dev, bad):
    with pytest.raises(ValueError, match="nbytes"):
        pyxtts.set_memory_limit(bad, dev)


@pytest.mark.parametrize("bad", [1.5, "1", True])
def test_limit_must_be_an_int(dev, bad):
    with pytest.raises(TypeError, match="nbytes"):
        pyxtts.set_memory_limit(bad, dev)


def test_over_the_limit_raises_out_of_memory_with_details(dev):
    keep = alloc(1000, dev)
    s0 = stats(dev)
    limit = s0["reserved_bytes"] + 4 * MiB
    pyxtts.set_memory_limit(limit, dev)
    request = 5 * MiB + 3
    with pytest.raises(pyxtts.OutOfMemoryError) as info:
        alloc(request, dev)
    e = info.value
    assert isinstance(e, MemoryError) and isinstance(e, RuntimeError)
    assert issubclass(pyxtts.OutOfMemoryError, MemoryError)
    assert issubclass(pyxtts.OutOfMemoryError, RuntimeError)
    s1 = stats(dev)
    assert e.requested_bytes == request
    assert e.allocated_bytes == s0["allocated_bytes"] == s1["allocated_bytes"]
    assert e.reserved_bytes == s0["reserved_bytes"] == s1["reserved_bytes"]
    assert e.limit_bytes == limit
    assert e.device == dev
    msg = str(e)
    assert "out of memory" in msg.lower()
    for number in (request, s0["allocated_bytes"], s0["reserved_bytes"], limit):
        assert str(number) in msg
    assert dev in msg
    assert s1["num_ooms"] - s0["num_ooms"] == 1
    assert s1["num_alloc_retries"] - s0["num_alloc_retries"] == 1
    assert s1["num_allocs"] == s0["num_allocs"]
    # what fits still works
    t = alloc(3 * MiB, dev)
    del t, keep


def test_over_the_limit_first_releases_the_cache(dev):
    require_idle(dev)
    t = alloc(3 * MiB, dev)
    del t  # a cached 20 MiB segment the small pool cannot use
    s0 = stats(dev)
    assert s0["reserved_bytes"] == MID_SEGMENT
    pyxtts.set_memory_limit(MID_SEGMENT + MiB, dev)  # no room for a 2 MiB segment
    small = alloc(1000, dev)
    s1 = stats(dev)
    assert s1["num_alloc_retries"] - s0["num_alloc_retries"] == 1
    assert s1["num_raw_frees"] - s0["num_raw_frees"] == 1
    assert s1["reserved_bytes"] == SMALL_SEGMENT
    assert s1["num_ooms"] == s0["num_ooms"]
    # and fails when even an empty cache is not enough
    with pytest.raises(pyxtts.OutOfMemoryError) as info:
        alloc(20 * MiB, dev)
    assert info.value.reserved_bytes == SMALL_SEGMENT
    del small


def test_near_the_limit_a_segment_of_just_the_block(dev):
    require_idle(dev)
    pyxtts.set_memory_limit(4096, dev)  # far below a 2 MiB segment
    a = alloc(1000, dev)
    s = stats(dev)
    assert (s["allocated_bytes"], s["reserved_bytes"]) == (1024, 1024)
    assert a.data_ptr() % 256 == 0
    b = alloc(3000, dev)
    assert stats(dev)["reserved_bytes"] == 4096
    with pytest.raises(pyxtts.OutOfMemoryError):
        alloc(1, dev)
    del a
    c = alloc(1024, dev)  # the cached block serves it
    assert stats(dev)["reserved_bytes"] == 4096
    del b, c


def test_zero_limit_refuses_everything(dev):
    pyxtts.set_memory_limit(0, dev)
    for n in (1, 1000, 3 * MiB, 30 * MiB):
        with pytest.raises(pyxtts.OutOfMemoryError):
            alloc(n, dev)
    pyxtts.set_memory_limit(None, dev)
    t = alloc(1000, dev)
    del t


def test_limit_below_reserved_still_uses_the_cache(dev):
    t = alloc(3 * MiB, dev)
    ptr = t.data_ptr()
    del t
    pyxtts.set_memory_limit(0, dev)
    t = alloc(3 * MiB, dev)  # no new segment needed
    assert t.data_ptr() == ptr
    del t


def test_zero_bytes_take_no_memory(dev):
    s0 = stats(dev)
    pyxtts.set_memory_limit(0, dev)
    t = pyxtts.empty((0, 4), dtype=pyxtts.float32, device=dev)
    assert t.nbytes == 0
    assert stats(dev)["num_allocs"] == s0["num_allocs"]
    del t


def test_huge_request_is_out_of_memory_not_a_crash(dev):
    pyxtts.set_memory_limit(2**62, dev)
    s0 = stats(dev)
    with pytest.raises(pyxtts.OutOfMemoryError) as info:
        pyxtts.empty(2**59 - 1, dtype=pyxtts.int64, device=dev)  # ~4 EiB
    assert info.value.requested_bytes == (2**59 - 1) * 8
    assert stats(dev)["allocated_bytes"] == s0["allocated_bytes"]


def test_memory_fraction_of_the_device_total(dev):
    total = stats(dev)["device_total_bytes"]
    assert total > 0
    if dev == "cpu":
        assert total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    for f in (1.0, 0.5, 0.001):
        pyxtts.set_memory_fraction(f, dev)
        assert stats(dev)["limit_bytes"] == int(f * total)
    pyxtts.set_memory_fraction(fraction=1e-6, device=dev)
    limit = stats(dev)["limit_bytes"]
    with pytest.raises(pyxtts.OutOfMemoryError) as info:
        alloc(limit + 1, dev)
    assert info.value.limit_bytes == limit


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.0000001, 2, math.nan, math.inf, -math.inf])
def test_memory_fraction_outside_zero_one_is_a_value_error(dev, bad):
    with pytest.raises(ValueError, match="fraction"):
        pyxtts.set_memory_fraction(bad, dev)
    # the message shows the value even when it came as a keyword
    with pytest.raises(ValueError, match=r"got %s$" % re.escape(repr(float(bad)))):
        pyxtts.set_memory_fraction(fraction=bad, device=dev)
    assert stats(dev)["limit_bytes"] is None


# ---- the fault hook -----------------------------------------------------------

def test_inject_oom_counts_requests_and_fires_once(dev):
    s0 = stats(dev)
    pyxtts.testing.inject_oom(after=2, device=dev)
    a = alloc(10, dev)
    b = pyxtts.tensor(np.zeros(10, dtype=np.float32), device=dev)
    with pytest.raises(pyxtts.OutOfMemoryError) as info:
        alloc(123, dev)
    e = info.value
    assert "out of memory" in str(e).lower() and "inject" in str(e)
    assert (e.requested_bytes, e.device, e.limit_bytes) == (123, dev, None)
    assert e.allocated_bytes == stats(dev)["allocated_bytes"]
    c = alloc(123, dev)  # fired once
    s1 = stats(dev)
    assert s1["num_ooms"] - s0["num_ooms"] == 1
    assert s1["num_alloc_retries"] == s0["num_alloc_retries"]
    del a, b, c


def test_inject_oom_none_clears(dev):
    pyxtts.testing.inject_oom(0, dev)
    pyxtts.testing.inject_oom(None, dev)
    t = alloc(100, dev)
    pyxtts.testing.inject_oom(0, dev, raw=True)
    pyxtts.testing.inject_oom(None, dev)
    s0 = stats(dev)
    u = alloc(50 * MiB, dev)  # a new segment, no retry
    assert stats(dev)["num_alloc_retries"] == s0["num_alloc_retries"]
    del t, u


def test_inject_oom_rejects_bad_arguments(dev):
    with pytest.raises(ValueError, match="after"):
        pyxtts.testing.inject_oom(-1, dev)
    with pytest.raises(TypeError):
        pyxtts.testing.inject_oom("1", dev)
    with pytest.raises(ValueError, match="device"):
        pyxtts.testing.inject_oom(0, "tpu")


def test_failed_tensor_from_numpy_keeps_the_books(dev):
    src = np.arange(1000, dtype=np.float32)
    refs = sys.getrefcount(src)
    s0 = stats(dev)
    pyxtts.testing.inject_oom(0, dev)
    with pytest.raises(pyxtts.OutOfMemoryError):
        pyxtts.tensor(src, device=dev)
    s1 = stats(dev)
    assert s1["allocated_bytes"] == s0["allocated_bytes"]
    assert s1["num_allocs"] == s0["num_allocs"]
    assert sys.getrefcount(src) == refs


# ---- device arguments ---------------------------------------------------------

DEVICE_FUNCS = [
    ("memory_stats", lambda d: pyxtts.memory_stats(d)),
    ("memory_allocated", lambda d: pyxtts.memory_allocated(d)),
    ("memory_reserved", lambda d: pyxtts.memory_reserved(d)),
    ("max_memory_allocated", lambda d: pyxtts.max_memory_allocated(d)),
    ("max_memory_reserved", lambda d: pyxtts.max_memory_reserved(d)),
    ("reset_peak_memory_stats", lambda d: pyxtts.reset_peak_memory_stats(d)),
    ("empty_cache", lambda d: pyxtts.empty_cache(d)),
    ("memory_summary", lambda d: pyxtts.memory_summary(d)),
    ("cleanup_gpu_memory", lambda d: pyxtts.cleanup_gpu_memory(d)),
    ("set_memory_limit", lambda d: pyxtts.set_memory_limit(None, d)),
    ("set_memory_fraction", lambda d: pyxtts.set_memory_fraction(1.0, d)),
    ("inject_oom", lambda d: pyxtts.testing.inject_oom(None, d)),
]
BAD_DEVICES = ["gpu", "", "CPU", "cpu:1", "cuda:", "cuda:x", "cuda:-1", "cuda:0:1", "cuda:999",
               " cpu", "cuda 0"]


@pytest.fixture
def clean_cpu():
    reset("cpu")
    yield
    reset("cpu")


@pytest.mark.parametrize("name,fn", DEVICE_FUNCS, ids=[n for n, _ in DEVICE_FUNCS])
@pytest.mark.parametrize("bad", BAD_DEVICES)
def test_bad_device_strings_are_value_errors(clean_cpu, name, fn, bad):
    with pytest.raises(ValueError, match="device"):
        fn(bad)


@pytest.mark.parametrize("name,fn", DEVICE_FUNCS, ids=[n for n, _ in DEVICE_FUNCS])
def test_device_spellings(clean_cpu, name, fn):
    fn("cpu")
    fn("cpu:0")
    if pyxtts.cuda_available():
        fn("cuda")
        fn("cuda:0")
        with pytest.raises(ValueError, match="device"):
            fn(f"cuda:{pyxtts.device_count()}")
    else:
        for d in ("cuda", "cuda:0", "cuda:1", 0):
            with pytest.raises(ValueError, match="device"):
                fn(d)


def test_device_argument_of_the_wrong_type():
    with pytest.raises(TypeError, match="device"):
        pyxtts.memory_stats(1.5)
    with pytest.raises(TypeError, match="device"):
        pyxtts.empty_cache([])


@requires_cuda
def test_stats_are_per_device(clean_cpu):
    cpu0 = stats("cpu")
    t = alloc(3 * MiB, "cuda:0")
    assert stats("cpu")["allocated_bytes"] == cpu0["allocated_bytes"]
    assert stats("cuda:0")["allocated_bytes"] >= 3 * MiB
    pyxtts.set_memory_limit(0, "cuda:0")
    try:
        u = alloc(3 * MiB, "cpu")  # the CPU has no limit
        with pytest.raises(pyxtts.OutOfMemoryError) as info:
            alloc(30 * MiB, "cuda:0")
        assert info.value.device == "cuda:0"
    finally:
        reset("cuda:0")
    del t, u
    pyxtts.empty_cache("cuda:0")

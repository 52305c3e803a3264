"""CUDA-only behaviour of the runtime core. Skipped without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

import pyxtts
from pyxtts.testing import inject_oom
from conftest import requires_cuda

pytestmark = requires_cuda

DTYPES = [pyxtts.float32, pyxtts.float16, pyxtts.bfloat16, pyxtts.int32, pyxtts.int64, pyxtts.uint8, pyxtts.bool]


def edge_and_random(dt, rng) -> np.ndarray:
    """Source data of dtype dt: random values plus the edges casts must get right."""
    if dt.is_floating_point:
        edges = np.array([0.0, -0.0, 1.0, -1.5, 2.5, 65504.0, 65519.0, 65520.0, 1e-8, -3e-40, 1e30,
                          -1e30, 2.0**31, -2.0**31 - 4096, 3e9, np.inf, -np.inf, np.nan, 255.9, -0.7], np.float32)
        vals = np.concatenate([edges, rng.standard_normal(100_000).astype(np.float32) * 1000])
        return vals.astype(dt.numpy)
    info = np.iinfo(dt.numpy) if dt is not pyxtts.bool else None
    if info is None:
        return rng.integers(0, 2, 100_000).astype(np.bool_)
    vals = rng.integers(info.min, info.max, 100_000, dtype=dt.numpy, endpoint=True)
    return np.concatenate([np.array([info.min, info.max, 0, 1], dt.numpy), vals])


@pytest.mark.parametrize("src", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dst", DTYPES, ids=lambda d: d.name)
def test_cast_kernel_matches_cpu_bitwise(src, dst, rng):
    a = edge_and_random(src, rng)
    cpu = pyxtts.tensor(a, dtype=src).to(dtype=dst).numpy()
    gpu = pyxtts.tensor(a, dtype=src, device="cuda").to(dtype=dst).numpy()
    assert cpu.view(np.uint8).tobytes() == gpu.view(np.uint8).tobytes()


def test_oom_message_is_cuda_style_and_state_is_kept():
    before = pyxtts.memory_allocated("cuda")
    total = pyxtts.device_info("cuda")["total_memory"]
    with pytest.raises(pyxtts.OutOfMemoryError, match="CUDA out of memory.") as ei:
        pyxtts.empty(2 * total, dtype=pyxtts.uint8, device="cuda")
    assert ei.value.device == "cuda:0" and ei.value.requested_bytes == 2 * total
    assert pyxtts.memory_allocated("cuda") == before


def test_fraction_limit_and_injected_fault_on_gpu():
    try:
        pyxtts.set_memory_fraction(0.01, "cuda")
        limit = pyxtts.memory_stats("cuda")["limit_bytes"]
        assert limit == int(0.01 * pyxtts.device_info("cuda")["total_memory"])
        with pytest.raises(pyxtts.OutOfMemoryError):
            pyxtts.empty(limit + 1, dtype=pyxtts.uint8, device="cuda")
        inject_oom(0, "cuda")
        with pytest.raises(pyxtts.OutOfMemoryError, match="injected"):
            pyxtts.empty(1024, device="cuda")
        x = pyxtts.empty(1024, device="cuda")  # one-shot: the next one works
        assert x.device == "cuda:0"
    finally:
        pyxtts.set_memory_limit(None, "cuda")
        inject_oom(None, "cuda")


def test_empty_cache_returns_memory_to_the_driver():
    pyxtts.empty_cache("cuda")
    free0 = pyxtts.device_info("cuda")["free_memory"]
    x = pyxtts.empty(256 << 20, dtype=pyxtts.uint8, device="cuda")
    del x
    assert pyxtts.memory_reserved("cuda") >= 256 << 20
    released = pyxtts.empty_cache("cuda")
    assert released >= 256 << 20
    assert pyxtts.device_info("cuda")["free_memory"] >= free0 - (64 << 20)


def test_large_round_trip_and_gpu_to_gpu_copy(rng):
    a = rng.standard_normal(64 << 18, dtype=np.float32)  # 64 MiB
    t = pyxtts.tensor(a, device="cuda")
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(t.to(copy=True).numpy(), a)

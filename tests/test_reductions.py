"""The deterministic reductions' exact bits: bias_backward, layernorm's dweight and dbias,
embedding_backward.

backend.h fixes the order of every addition (rows cut into chunks by the shape alone,
double sums per chunk, chunk sums in order, one float32 rounding at the end), so the result
is a function of the inputs alone: every backend, thread count and GPU must give the bits
of the float64 NumPy mirror in reference.py, element for element. Each test runs on the CPU
and, where there is one, on the GPU (the `device` fixture), at tiny sizes, sizes where the
chunking matters (several chunks, a ragged last chunk, one chunk per 16 rows) and XTTS v2's
sizes. Outputs start from random values (they accumulate) and are checked whole.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import NP_DTYPE, assert_bits_equal
from helpers.arrays import rand
from helpers.reductions import add_once, colsum_chunk_rows, colsum_exact, embedding_backward_exact

import pyxtts
from pyxtts import _C

pytestmark = pytest.mark.usefixtures("check_memory")

FLOATS = ["float32", "float16", "bfloat16"]
XTTS_ROWS = 8 * 490  # batch 8 x 490 positions


def on(device, a, dtype="float32"):
    return pyxtts.tensor(np.asarray(a), dtype=getattr(pyxtts, dtype), device=device)


def test_chunking_depends_on_the_shape_alone():
    # the mirror's rule, as backend.h states it: about 2^17 partial sums, >= 16 rows a chunk
    assert colsum_chunk_rows(XTTS_ROWS, 1024) == 31  # 127 chunks of a (3920, 1024) bias
    assert colsum_chunk_rows(XTTS_ROWS, 4096) == 123
    assert colsum_chunk_rows(256, 6681) == 16
    assert colsum_chunk_rows(1, 1) == 16


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("M,N", [(1, 1), (7, 3), (16, 5), (17, 5), (1000, 130), (5000, 7),
                                 (XTTS_ROWS, 1024), (XTTS_ROWS, 4096), (256, 6681)], ids=str)
def test_bias_backward_bits(device, rng, seed, M, N, dtype):
    if dtype != "float32" and M * N > 5e6:
        pytest.skip("the largest shape in float32 only (test time)")
    dout = rand(rng, (M, N), dtype, scale=3.0)
    db0 = rand(rng, N)
    given = on(device, db0)
    got = _C._op_bias_backward(on(device, dout, dtype), dbias=given)
    assert got is given
    want = add_once(db0, colsum_exact(dout.astype(np.float64)))
    assert_bits_equal(given.numpy(), want, f"seed={seed} {M, N} {dtype} on {device}")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("N,C", [(1, 1), (3, 8), (33, 5), (700, 96), (XTTS_ROWS, 1024)], ids=str)
def test_layernorm_dparams_bits(device, rng, seed, N, C, dtype):
    if dtype != "float32" and N * C > 1e6:
        pytest.skip("the largest shape in float32 only (test time)")
    x = rand(rng, (N, C), dtype, scale=2.0) + np.float32(0.25)
    x = x.astype(NP_DTYPE[dtype]).astype(np.float32)
    w, b, dout = rand(rng, C, dtype), rand(rng, C, dtype), rand(rng, (N, C), dtype)
    # the statistics as the forward saves them (float32), taken from the CPU kernel
    _, mean, rstd = _C._op_layernorm_forward(on("cpu", x, dtype), on("cpu", w, dtype), on("cpu", b, dtype))
    mean, rstd = mean.numpy(), rstd.numpy()
    dw0, db0 = rand(rng, C), rand(rng, C)
    gw, gb = on(device, dw0), on(device, db0)
    _C._op_layernorm_backward(on(device, dout, dtype), on(device, x, dtype), on(device, w, dtype),
                              on(device, mean), on(device, rstd), dweight=gw, dbias=gb)
    n = (x - mean[:, None]) * rstd[:, None]  # float32, as the kernels form it
    msg = f"seed={seed} {N, C} {dtype} on {device}"
    assert_bits_equal(gw.numpy(), add_once(dw0, colsum_exact(n.astype(np.float64) * dout)), msg + " dweight")
    assert_bits_equal(gb.numpy(), add_once(db0, colsum_exact(dout.astype(np.float64))), msg + " dbias")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("N,V,C,ids", [
    (1, 1, 1, "random"), (64, 5, 3, "random"), (65, 5, 3, "one"), (300, 1026, 33, "random"),
    (608, 608, 64, "positions"), (1000, 4, 130, "random"), (XTTS_ROWS, 6681, 256, "random"),
    (XTTS_ROWS, 1026, 1024, "skewed")], ids=str)
def test_embedding_backward_bits(device, rng, seed, N, V, C, ids, dtype):
    if dtype != "float32" and N * C > 1e6:
        pytest.skip("the largest shapes in float32 only (test time)")
    if ids == "one":  # one id throughout: its rows cross every chunk
        idx = np.full(N, V - 1, np.int32)
    elif ids == "positions":  # a position table: every sample's 0, 1, 2, ...
        idx = (np.arange(N) % 150).astype(np.int32)
    elif ids == "skewed":  # a padding token on half the rows, the rest spread
        idx = np.where(rng.random(N) < 0.5, 0, rng.integers(0, V, N)).astype(np.int32)
    else:
        idx = rng.integers(0, V, N).astype(np.int32)
    dout = rand(rng, (N, C), dtype)
    d0 = rand(rng, (V, C))
    given = on(device, d0)
    _C._op_embedding_backward(on(device, idx, "int32"), on(device, dout, dtype), V, dtable=given)
    want = embedding_backward_exact(d0, idx, dout)
    assert_bits_equal(given.numpy(), want, f"seed={seed} {N, V, C} {ids} {dtype} on {device}")

"""Exact tiled attention: pyxtts.attention_forward / attention_backward / attention
against torch.nn.functional.scaled_dot_product_attention in float64 (math backend),
the model's strided (B, T, 3C) layout, memory linear in T, determinism, and the guard.

Tolerances. float32: every error is bounded by tol * (|ref| + max|ref|) with
tol = 1e-5. The kernel computes in fp32 (unit roundoff u = 6e-8): scores sum
D <= 128 products, the softmax and P.V sum Tk <= ~200 terms and exp is a ~1-ulp
polynomial, so typical errors are sqrt(n) u ~ 1e-6 of the tensor's scale; 1e-5
keeps a 10x margin while a wrong mask, a lost tile or a wrong rescale errs by
1e-3 or more. float16/bfloat16: inputs convert to fp32 exactly and the math is
the fp32 math, so each output must be within one unit in the last place (of the
16-bit type) of the fp32 kernel run on the same values: only the final rounding
differs. Elements the contract fixes (masked rows and keys) must be exactly 0.
"""
from __future__ import annotations

import gc
import os
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")
import torch.nn.functional as F  # noqa: E402
from conftest import requires_cuda, run_python  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import pyxtts  # noqa: E402
from pyxtts import _C  # noqa: E402
from helpers import allowed_mask, make_rng  # noqa: E402

pytestmark = pytest.mark.usefixtures("check_memory")

NP = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
      "bfloat16": np.dtype(ml_dtypes.bfloat16)}
FP32_TOL = 1e-5


def available_isas() -> list[str]:
    found = []
    for name in ("generic", "avx2", "avx512"):
        try:
            _C._attention_cpu_isa(name)
            found.append(name)
        except ValueError:
            pass
    _C._attention_cpu_isa("auto")
    return found


ISAS = available_isas()


def skip_if_missing(exc: NotImplementedError, device: str):
    pytest.skip(f"attention is not implemented on {device} yet: {exc}")


# ---- the reference --------------------------------------------------------------------


def reference(q, k, v, dout, allowed, scale):
    """float64 torch SDPA (math backend) with a boolean mask; rows without a valid
    key are zeros with zero gradients. Returns out, lse, dq, dk, dv (NumPy)."""
    tq, tk, tv = (torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v))
    mask = torch.tensor(allowed)[:, None]                         # (B, 1, Tq, Tk)
    has_key = mask.any(-1, keepdim=True)                           # (B, 1, Tq, 1)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask | ~has_key, scale=scale)
    out = out * has_key                                            # fully masked rows: zeros
    out.backward(torch.tensor(np.asarray(dout, np.float64)))
    with torch.no_grad():
        s = (tq @ tk.transpose(-1, -2)) * scale
        lse = torch.logsumexp(s.masked_fill(~mask, float("-inf")), -1)
    return (out.detach().numpy(), lse.numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())


def check_close(actual, ref, tol, what, floor=0.0):
    """|actual - ref| <= tol (|ref| + max|ref|) + floor elementwise; floor is the
    error scale of a result that cancels (see grad_floors)."""
    actual = np.asarray(actual, np.float64)
    assert actual.shape == ref.shape, f"{what}: shape {actual.shape} != {ref.shape}"
    nan = np.argwhere(np.isnan(actual))
    assert not nan.size, f"{what}: NaN at {nan[:5].tolist()}"
    finite = np.isfinite(ref)
    assert np.array_equal(actual[~finite], ref[~finite]), f"{what}: infinities differ"
    scale = np.abs(ref[finite]).max() if finite.any() else 0.0
    err = np.where(finite, np.abs(np.where(finite, actual, 0) - np.where(finite, ref, 0)), 0)
    bound = tol * (np.abs(ref) + scale) + floor
    bad = finite & (err > bound)
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        pytest.fail(f"{what}: {bad.sum()} elements off, first at {idx}: {actual[idx]!r} vs "
                    f"{ref[idx]!r} (bound {bound[idx]:.3g}, max err {err[finite].max():.3g})")


def rms(x) -> float:
    return float(np.sqrt(np.mean(np.square(x)))) if np.size(x) else 0.0


def grad_floors(q, k, v, dout, tol):
    """dS = P (dP - Di) cancels: dP and Di = rowsum(dO * O) are each ~ |dO| |v|
    and their fp32 difference carries an error of that size, even where the exact
    gradient is 0 (one key: P = 1, dS = 0). dq and dk inherit it times |k| and
    |q| (scale * sqrt(D) = 1)."""
    g = tol * rms(dout) * rms(v)
    return g * rms(k), g * rms(q)


def check_zero(actual, where, what):
    """Elements the contract fixes to 0 are exactly 0."""
    a = np.asarray(actual, np.float64)[where]
    assert np.all(a == 0), f"{what}: expected exact zeros, got {a[a != 0][:5]}"


def poison(arrays):
    """Fills the allocator's cache with NaN blocks of these byte sizes, so an
    output element the kernel forgets to write shows up as NaN."""
    blocks = [pyxtts.tensor(np.full(max(n // 4, 1), np.nan, np.float32)) for n in arrays]
    del blocks


# ---- cases ----------------------------------------------------------------------------

# (B, H, Tq, Tk, D, causal, options); options name which masks to draw
CASES = [
    (3, 4, 17, 17, 64, True, ""),
    (3, 4, 17, 17, 64, False, ""),
    (3, 4, 130, 130, 32, True, "q_lengths,k_lengths"),
    (3, 4, 130, 130, 128, True, "key_mask"),
    (3, 4, 100, 100, 64, False, "key_mask,q_lengths"),
    (2, 3, 70, 150, 64, True, "k_lengths"),           # cross, Tq < Tk
    (2, 3, 150, 70, 32, True, "key_mask"),            # cross, Tq > Tk: late rows see all keys
    (2, 3, 150, 70, 64, False, "q_lengths"),
    (2, 2, 1, 1, 64, True, ""),                       # T = 1
    (2, 2, 1, 90, 32, False, "k_lengths"),
    (2, 2, 65, 65, 17, True, "key_mask,k_lengths"),   # odd D, T = tile + 1
    (1, 2, 33, 20, 1, False, ""),                     # D = 1
    (3, 2, 40, 40, 80, True, "empty_rows"),           # rows with no valid key
]


def case_id(c):
    B, H, Tq, Tk, D, causal, opts = c
    return f"B{B}H{H}q{Tq}k{Tk}D{D}{'c' if causal else 'b'}{'-' + opts if opts else ''}"


def draw(rng, case):
    """Random inputs (float64 values on the fp32 grid) and masks of a case."""
    B, H, Tq, Tk, D, causal, opts = case
    q = rng.standard_normal((B, H, Tq, D)) * 1.5     # peaky enough softmax rows
    k = rng.standard_normal((B, H, Tk, D))
    v = rng.standard_normal((B, H, Tk, D))
    dout = rng.standard_normal((B, H, Tq, D))
    q, k, v, dout = (x.astype(np.float32).astype(np.float64) for x in (q, k, v, dout))
    m = {"q_lengths": None, "k_lengths": None, "key_mask": None}
    if "q_lengths" in opts:
        m["q_lengths"] = rng.integers(0, Tq + 1, B)
        m["q_lengths"][0] = Tq
    if "k_lengths" in opts:
        m["k_lengths"] = rng.integers(0, Tk + 1, B)
        m["k_lengths"][-1] = Tk
    if "key_mask" in opts:  # XTTS: padding in the middle, after each sample's text
        km = np.ones((B, Tk), bool)
        for b in range(B):
            a = int(rng.integers(0, Tk))
            km[b, a:a + int(rng.integers(1, max(2, Tk // 3)))] = False
        km[:, rng.random(Tk) < 0.1] = False
        m["key_mask"] = km
    if "empty_rows" in opts:  # the first keys masked: causal rows before them see nothing
        km = np.ones((B, Tk), bool)
        km[:, :5] = False
        km[1, :] = False                       # a sample with no valid key at all
        m["key_mask"] = km
        m["q_lengths"] = np.array([Tq, Tq - 3, 0])[:B]
    return q, k, v, dout, m


def nan_padding(x, allowed_rows=None, allowed_keys=None):
    """A float32 copy with NaN wherever the kernel must not look."""
    y = np.array(x, np.float32)
    if allowed_rows is not None:
        y[~np.broadcast_to(allowed_rows[:, None, :, None], y.shape)] = np.nan
    if allowed_keys is not None:
        y[~np.broadcast_to(allowed_keys[:, None, :, None], y.shape)] = np.nan
    return y


# ---- forward and backward against torch ---------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_torch_float64(case, device, rng, seed):
    B, H, Tq, Tk, D, causal, opts = case
    q, k, v, dout, m = draw(rng, case)
    scale = 1.0 / np.sqrt(D)
    allowed = allowed_mask(B, Tq, Tk, causal, **m)
    r_out, r_lse, r_dq, r_dk, r_dv = reference(q, k, v, dout, allowed, scale)

    # never-read positions hold NaN: rows past q_length, keys masked or past k_length
    rows = np.arange(Tq)[None, :] < (m["q_lengths"][:, None] if m["q_lengths"] is not None else Tq)
    keys = np.ones((B, Tk), bool)
    if m["k_lengths"] is not None:
        keys &= np.arange(Tk)[None, :] < m["k_lengths"][:, None]
    if m["key_mask"] is not None:
        keys &= m["key_mask"]
    qn, dn = nan_padding(q, allowed_rows=rows), nan_padding(dout, allowed_rows=rows)
    kn, vn = nan_padding(k, allowed_keys=keys), nan_padding(v, allowed_keys=keys)
    pq, pk, pv, pd = (pyxtts.tensor(x, device=device) for x in (qn, kn, vn, dn))
    msg = f"seed={seed} {case_id(case)} device={device}"

    poison([q.size * 4, B * H * Tq * 4] * 2)
    try:
        out, lse = pyxtts.attention_forward(pq, pk, pv, causal=causal, **m)
    except NotImplementedError as exc:
        skip_if_missing(exc, device)
    assert out.shape == (B, H, Tq, D) and out.dtype is pyxtts.float32 and out.device == pq.device
    assert lse.shape == (B, H, Tq) and lse.dtype is pyxtts.float32
    out_np, lse_np = out.numpy(), lse.numpy()
    no_key = ~allowed.any(-1)                                    # (B, Tq)
    check_close(out_np, r_out, FP32_TOL, f"out; {msg}")
    check_close(lse_np, r_lse, FP32_TOL, f"lse; {msg}")
    check_zero(out_np, np.broadcast_to(no_key[:, None, :, None], out_np.shape), f"out; {msg}")
    assert np.all(lse_np[np.broadcast_to(no_key[:, None], lse_np.shape)] == -np.inf), msg

    poison([q.size * 4, k.size * 4, v.size * 4] * 2)
    dq, dk, dv = pyxtts.attention_backward(pd, pq, pk, pv, out, lse, causal=causal, **m)
    fq, fk = grad_floors(q, k, v, dout, FP32_TOL)
    check_close(dq.numpy(), r_dq, FP32_TOL, f"dq; {msg}", fq)
    check_close(dk.numpy(), r_dk, FP32_TOL, f"dk; {msg}", fk)
    check_close(dv.numpy(), r_dv, FP32_TOL, f"dv; {msg}")
    check_zero(dq.numpy(), np.broadcast_to(no_key[:, None, :, None], dq.shape), f"dq; {msg}")
    dead = np.broadcast_to(~keys[:, None, :, None], dk.shape)
    check_zero(dk.numpy(), dead, f"dk; {msg}")
    check_zero(dv.numpy(), dead, f"dv; {msg}")

    # attention() is the forward's output
    np.testing.assert_array_equal(
        pyxtts.attention(pq, pk, pv, causal=causal, **m).numpy(), out_np, err_msg=msg)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", [CASES[3], CASES[6], CASES[10]], ids=case_id)
def test_every_instruction_set(isa, case, rng, seed):
    """The generic, AVX2 and AVX-512 tiles (those this CPU runs) all match torch."""
    B, H, Tq, Tk, D, causal, _ = case
    q, k, v, dout, m = draw(rng, case)
    allowed = allowed_mask(B, Tq, Tk, causal, **m)
    ref = reference(q, k, v, dout, allowed, 1.0 / np.sqrt(D))
    try:
        assert _C._attention_cpu_isa(isa) == isa
        pq, pk, pv, pd = (pyxtts.tensor(x.astype(np.float32)) for x in (q, k, v, dout))
        out, lse = pyxtts.attention_forward(pq, pk, pv, causal=causal, **m)
        grads = pyxtts.attention_backward(pd, pq, pk, pv, out, lse, causal=causal, **m)
    finally:
        _C._attention_cpu_isa("auto")
    floors = (0.0, 0.0, *grad_floors(q, k, v, dout, FP32_TOL), 0.0)
    for name, a, r, fl in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), ref, floors):
        check_close(a.numpy(), r, FP32_TOL, f"{name}; isa={isa} seed={seed} {case_id(case)}", fl)


def ulp16(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """The spacing of the 16-bit type at |x| (its ulp), as float64."""
    x16 = np.abs(x).astype(dt)
    if dt == NP["bfloat16"]:  # ml_dtypes has no nextafter: step the bit pattern
        up = (x16.view(np.uint16) + 1).view(dt)
    else:
        up = np.nextafter(x16, np.float16(np.inf))
    return up.astype(np.float64) - x16.astype(np.float64)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", [CASES[2], CASES[5], CASES[10]], ids=case_id)
def test_16bit_is_the_fp32_result_rounded(dtype, case, device, rng, seed):
    B, H, Tq, Tk, D, causal, _ = case
    if device != "cpu" and D in (64, 128) and os.environ.get("PYXTTS_CUDA_ATTENTION") != "simple":
        pytest.skip("16-bit D = 64 / 128 takes the tensor-core path on sm_80+, which rounds P and dS "
                    "to 16 bits (not the fp32 result rounded once): test_cuda_attention_tc.py checks it")
    q, k, v, dout, m = draw(rng, case)
    dt = NP[dtype]
    q16, k16, v16, d16 = (x.astype(dt) for x in (q, k, v, dout))
    msg = f"seed={seed} {dtype} {case_id(case)} device={device}"
    t16 = [pyxtts.tensor(x, device=device) for x in (q16, k16, v16, d16)]
    t32 = [pyxtts.tensor(x.astype(np.float32), device=device) for x in (q16, k16, v16, d16)]
    try:
        out16, lse16 = pyxtts.attention_forward(*t16[:3], causal=causal, **m)
    except NotImplementedError as exc:
        skip_if_missing(exc, device)
    assert out16.dtype is getattr(pyxtts, dtype)
    out32, lse32 = pyxtts.attention_forward(*t32[:3], causal=causal, **m)
    o16, o32 = out16.numpy(), out32.numpy()
    assert np.all(np.abs(o16.astype(np.float64) - o32) <= ulp16(o32, dt)), f"out; {msg}"
    np.testing.assert_allclose(lse16.numpy(), lse32.numpy(), rtol=1e-6, atol=1e-6, err_msg=msg)
    # backward from the same 16-bit out and dout, in both precisions
    g16 = pyxtts.attention_backward(t16[3], *t16[:3], out16, lse16, causal=causal, **m)
    out16_as32 = pyxtts.tensor(o16.astype(np.float32), device=device)
    g32 = pyxtts.attention_backward(t32[3], *t32[:3], out16_as32, lse16, causal=causal, **m)
    for name, a, b in zip(("dq", "dk", "dv"), g16, g32):
        a, b = a.numpy(), b.numpy()
        assert a.dtype == dt, f"{name}; {msg}"
        err = np.abs(a.astype(np.float64) - b)
        assert np.all(err <= ulp16(b, dt)), f"{name}: max err {err.max()}; {msg}"
    # and the 16-bit results are near the float64 truth (16-bit inputs, loose)
    allowed = allowed_mask(B, Tq, Tk, causal, **m)
    r_out = reference(*(x.astype(np.float64) for x in (q16, k16, v16, d16)), allowed,
                      1.0 / np.sqrt(D))[0]
    check_close(o16, r_out, 2.0 ** -6, f"out vs float64; {msg}")


# ---- the model's layout: q, k, v as strided views into (B, T, 3C) ------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal,masks", [(True, True), (False, False), (True, False)])
def test_strided_qkv_layout(dtype, causal, masks, rng, seed):
    """q, k, v as views with strides (T*3C, D, 3C) and out/dout (T*C, D, C): the
    same bits as the dense (B, H, T, D) call on the permuted copies."""
    B, T, H, D = 3, 77, 4, 32
    C = H * D
    dt = NP[dtype]
    qkv = rng.standard_normal((B, T, 3 * C)).astype(dt)
    dout = rng.standard_normal((B, T, C)).astype(dt)
    m = {"q_lengths": None, "k_lengths": None, "key_mask": None}
    if masks:
        m["q_lengths"] = np.array([T, 50, 3])
        m["key_mask"] = rng.random((B, T)) > 0.2
        m["key_mask"][:, 30:40] = False
    def heads(x):
        return np.ascontiguousarray(x.reshape(B, T, H, D).transpose(0, 2, 1, 3))

    q4, k4, v4 = heads(qkv[..., :C]), heads(qkv[..., C:2 * C]), heads(qkv[..., 2 * C:])
    out4, lse4 = pyxtts.attention_forward(q4, k4, v4, causal=causal, **m)
    dq, dk, dv = pyxtts.attention_backward(heads(dout), q4, k4, v4, out4, lse4, causal=causal, **m)
    msg = f"seed={seed} {dtype} causal={causal} masks={masks}"

    poison([B * T * C * dt.itemsize, B * T * 3 * C * dt.itemsize])
    out, lse = _C._attention_qkv_forward(qkv, H, causal=causal, **m)
    assert out.shape == (B, T, C) and lse.shape == (B, H, T)
    def flat(x):
        return x.transpose(0, 2, 1, 3).reshape(B, T, C)

    np.testing.assert_array_equal(out.numpy(), flat(out4.numpy()), err_msg=f"out; {msg}")
    np.testing.assert_array_equal(lse.numpy(), lse4.numpy(), err_msg=f"lse; {msg}")
    dqkv = _C._attention_qkv_backward(dout, qkv, out, lse, H, causal=causal, **m)
    want = np.concatenate([flat(g.numpy()) for g in (dq, dk, dv)], axis=-1)
    np.testing.assert_array_equal(dqkv.numpy(), want, err_msg=f"dqkv; {msg}")


# ---- edge sizes -------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0, 2, 5, 5, 8), (2, 0, 5, 5, 8), (2, 2, 0, 5, 8),
                                   (2, 2, 5, 0, 8)], ids=str)
def test_empty_sizes(shape, rng):
    B, H, Tq, Tk, D = shape
    q = rng.standard_normal((B, H, Tq, D)).astype(np.float32)
    k = rng.standard_normal((B, H, Tk, D)).astype(np.float32)
    out, lse = pyxtts.attention_forward(q, k, k, causal=False)
    assert out.shape == (B, H, Tq, D) and lse.shape == (B, H, Tq)
    assert np.all(out.numpy() == 0) and np.all(lse.numpy() == -np.inf)  # no key: zeros, -inf
    dq, dk, dv = pyxtts.attention_backward(q, q, k, k, out, lse, causal=False)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape
    assert not np.any(dq.numpy()) and not np.any(dk.numpy()) and not np.any(dv.numpy())


def test_extreme_scores_stay_finite(rng):
    """Scores in the thousands (scale 100): the online softmax subtracts the running
    max, nothing overflows. The comparison is as tight as fp32 scores allow: a
    score s carries an error ~ |s| u sqrt(D) ~ 1e-3 here, which moves softmax
    weights by that relative amount."""
    B, H, T, D = 2, 2, 150, 16
    q = (rng.standard_normal((B, H, T, D)) * 3).astype(np.float32)
    k = (rng.standard_normal((B, H, T, D)) * 3).astype(np.float32)
    v = rng.standard_normal((B, H, T, D)).astype(np.float32)
    out, lse = pyxtts.attention_forward(q, k, v, causal=True, scale=100.0)
    g = pyxtts.attention_backward(v, q, k, v, out, lse, causal=True, scale=100.0)
    assert all(np.isfinite(x.numpy()).all() for x in (out, lse, *g))
    r = reference(q, k, v, v, allowed_mask(B, T, T, True, None, None, None), 100.0)
    check_close(out.numpy(), r[0], 1e-2, "out")
    check_close(lse.numpy(), r[1], 1e-5, "lse")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [True, False])
def test_overflow_and_nan_are_nan_never_zeros(rng, seed, causal, dtype, device):
    """Scores past float's range (scale 3e38, or q and k ~ 1e20) and NaN inputs make the
    rows that see a key NaN, as torch does, so a training step sees a non-finite loss
    and skips; only a row that sees no key (past its length) is zeros with lse -inf.
    The backward carries the NaN on (a NaN lse is not a row without keys). On cuda:0,
    float32 takes the general kernels and bfloat16 at D 64 the tensor-core ones, but for
    scale 3e38, past their limit (test_scale_past_the_base_2_limit_keeps_finite_rows);
    tests/test_cuda_emu.py's "overflow" run checks their source at 3e38 too."""
    B, H, T, D = 2, 2, 37, 64
    q, k, v = (rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(3))
    lengths = [T, 20]
    # bf16 inputs are exact in float32, so the float64 reference sees the same numbers;
    # its outputs are rounded to bf16 once (2^-8 relative), float32's exact to 1e-5
    to = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    q, k, v = (x.astype(to).astype(np.float32) for x in (q, k, v))
    tol = 1e-2 if dtype == "bfloat16" else 1e-5
    for name, args, kw in [("scale 3e38", (q, k, v), dict(scale=3e38)),
                           ("|q|, |k| ~ 1e20", (q * 1e20, k * 1e20, v), {}),
                           ("NaN in q", (np.where(np.arange(T)[:, None] == 5, np.nan, q), k, v), {})]:
        msg = f"seed={seed} {name} causal={causal} {dtype} {device}"
        targs = [pyxtts.tensor(x.astype(to), device=device) for x in args]
        out, lse = pyxtts.attention_forward(*targs, causal=causal, q_lengths=lengths, **kw)
        o, s = out.numpy().astype(np.float32), lse.numpy()
        assert np.all(o[1, :, 20:] == 0) and np.all(s[1, :, 20:] == -np.inf), msg + ": rows past the length"
        rows = np.zeros((B, H, T), bool)
        rows[0] = True
        rows[1, :, :20] = True
        if name == "NaN in q":  # only query 5 is NaN; the others are exact
            bad = rows & (np.arange(T) == 5)
            r = reference(q, k, v, v, allowed_mask(B, T, T, causal, lengths, None, None), 1 / np.sqrt(D))
            check_close(o[rows & ~bad].reshape(-1, D), r[0][rows & ~bad].reshape(-1, D), tol, msg)
        else:
            bad = rows & ~np.isfinite(s)
            assert bad.sum() > rows.sum() // 2, msg + ": most scores overflow"
        assert np.isnan(o[bad]).all() and np.isnan(s[bad]).all(), msg + ": overflowed rows are NaN"
        dout = pyxtts.tensor(v.astype(to), device=device)
        dq, dk, dv = pyxtts.attention_backward(dout, *targs, out, lse, causal=causal, q_lengths=lengths, **kw)
        assert np.isnan(dq.numpy().astype(np.float32)[bad]).all(), msg + ": the backward carries the NaN"
        assert np.all(dq.numpy().astype(np.float32)[1, :, 20:] == 0), msg + ": padding rows' dq"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_scale_past_the_base_2_limit_keeps_finite_rows(rng, seed, dtype, device):
    """Scores s * scale in float's range stay finite for any finite scale. The tensor-core
    kernels score in base 2, and scale * log2 e overflows past 2.36e38: with scale 3e38
    they made every row NaN (an inf times a tiny score), where the CPU gives finite rows;
    such a scale now takes the general kernels on cuda:0. |q| in [2e-38, 4e-38] and |k|
    in [0.03, 0.06], all normal floats (a subnormal product may be flushed), put the scores
    near 3 (q * scale is in range: the CPU scales q first). The true dq (scale dS k) is
    past float's range, so only out, lse, dk and dv are compared."""
    B, H, T, D = 2, 2, 37, 64
    to = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    sign = lambda: np.where(rng.random((B, H, T, D)) < 0.5, -1.0, 1.0)  # noqa: E731
    q = sign() * (2 + 2 * rng.random((B, H, T, D))) * 1e-38
    k = sign() * (1 + rng.random((B, H, T, D))) * 0.03
    v, dout = (rng.standard_normal((B, H, T, D)) for _ in range(2))
    q, k, v, dout = (x.astype(to).astype(np.float64) for x in (q, k, v, dout))
    scale, lengths = 3e38, [T, 20]
    r = reference(q, k, v, dout, allowed_mask(B, T, T, True, lengths, None, None), scale)
    t = [pyxtts.tensor(x.astype(to), device=device) for x in (q, k, v, dout)]
    out, lse = pyxtts.attention_forward(*t[:3], causal=True, q_lengths=lengths, scale=scale)
    dq, dk, dv = pyxtts.attention_backward(t[3], *t[:3], out, lse, causal=True, q_lengths=lengths, scale=scale)
    # 16-bit: the outputs are rounded, and Di = rowsum(dO * O) uses the rounded out
    tol = 2e-2 if dtype == "bfloat16" else 1e-4
    msg = f"seed={seed} {dtype} {device}"
    s = lse.numpy()
    assert np.all(s[1, :, 20:] == -np.inf), f"{msg}: rows past the length"
    check_close(np.concatenate([s[0].ravel(), s[1, :, :20].ravel()]),
                np.concatenate([r[1][0].ravel(), r[1][1, :, :20].ravel()]), tol, f"{msg}: lse")
    for name, got, want in (("out", out, r[0]), ("dk", dk, r[3]), ("dv", dv, r[4])):
        got = got.numpy().astype(np.float64)
        assert np.isfinite(got).all(), f"{msg}: {name} has non-finite values"
        check_close(got, want, tol, f"{msg}: {name}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_of_no_key_leave_other_gradients_finite(rng, seed, dtype, device):
    """A row that sees no key has P = dS = 0, but its q * scale may overflow float (here
    1e10 * 1e30): 0 * inf in dK += dS^T (q * scale) made the gradients of its tile's
    keys NaN while every output was finite (CPU and the general CUDA kernels; found by
    the fuzz). Rows 0..9 of sample 1 see no key (keys 0..9 masked, causal); the other
    rows' scores are ordinary (q ~ 1e-30). Keys 20.. of sample 1 lie past its q_length:
    no valid row sees them, so their gradients are exactly 0."""
    B, H, T, D = 2, 2, 37, 64
    to = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    q = rng.standard_normal((B, H, T, D)) * 1e-30
    q[1, :, :10] = rng.standard_normal((H, 10, D)) * 1e10
    k, v, dout = (rng.standard_normal((B, H, T, D)) for _ in range(3))
    q, k, v, dout = (pyxtts.tensor(x.astype(to), device=device) for x in (q, k, v, dout))
    key_mask = np.ones((B, T), bool)
    key_mask[1, :10] = False
    kw = dict(causal=True, q_lengths=[T, 20], key_mask=key_mask, scale=1e30)
    out, lse = pyxtts.attention_forward(q, k, v, **kw)
    dq, dk, dv = (x.numpy().astype(np.float32) for x in pyxtts.attention_backward(dout, q, k, v, out, lse, **kw))
    msg = f"seed={seed} {dtype} {device}"
    assert np.isfinite(out.numpy().astype(np.float32)).all() and np.all(lse.numpy()[1, :, :10] == -np.inf), msg
    assert all(np.isfinite(g).all() for g in (dq, dk, dv)), msg + ": a NaN from 0 * inf"
    assert np.all(dq[1, :, :10] == 0) and np.all(dq[1, :, 20:] == 0), msg + ": rows of no key, padding rows"
    assert np.all(dk[1, :, 20:] == 0) and np.all(dv[1, :, 20:] == 0), msg + ": keys no row sees"
    assert np.all(dk[1, :, :10] == 0) and np.all(dv[1, :, :10] == 0), msg + ": masked keys"
    assert np.abs(dk[1, :, 10:20]).max() > 0 and np.abs(dk[0]).max() > 0, msg + ": the others are not all 0"


# ---- workspace and memory --------------------------------------------------------


def peak_increase(T: int, rng) -> int:
    B, H, D = 1, 2, 64
    x = [pyxtts.tensor(rng.standard_normal((B, H, T, D)).astype(np.float32)) for _ in range(4)]
    gc.collect()
    base = pyxtts.memory_allocated("cpu")
    pyxtts.reset_peak_memory_stats("cpu")
    out, lse = pyxtts.attention_forward(x[0], x[1], x[2], causal=True)
    grads = pyxtts.attention_backward(x[3], x[0], x[1], x[2], out, lse, causal=True)
    peak = pyxtts.max_memory_allocated("cpu")
    del out, lse, grads
    return peak - base


@pytest.mark.slow
def test_memory_is_linear_in_sequence_length(rng):
    """Outputs plus workspace grow like T, never like T^2 (a T x T fp32 matrix
    would be 64 MiB per head at T = 4096)."""
    small, large = peak_increase(1024, rng), peak_increase(4096, rng)
    ratio = large / small
    assert 3.0 < ratio < 6.0, f"peak increase {small} -> {large} bytes: ratio {ratio:.2f}"
    # and the absolute amount: outputs (out, dq, dk, dv) and little more
    outputs = 4 * 2 * 4096 * 64 * 4
    assert large < outputs * 1.25 + (4 << 20), f"{large} bytes for {outputs} bytes of outputs"


# ---- determinism --------------------------------------------------------------------

DETERMINISM_SCRIPT = textwrap.dedent("""
    import sys, hashlib, numpy as np, pyxtts
    rng = np.random.default_rng(int(sys.argv[1]))
    B, H, T, D = 1, 3, 200, 64          # 3 heads: one pass on 1 thread, two passes on 2+
    h = hashlib.sha256()
    for dt in (pyxtts.float32, pyxtts.bfloat16):
        q, k, v, do = (pyxtts.tensor(rng.standard_normal((B, H, T, D)).astype(np.float32), dtype=dt)
                       for _ in range(4))
        km = rng.random((B, T)) > 0.1
        out, lse = pyxtts.attention_forward(q, k, v, causal=True, key_mask=km)
        g = pyxtts.attention_backward(do, q, k, v, out, lse, causal=True, key_mask=km)
        for t in (out, lse, *g):
            h.update(t.numpy().tobytes())
    print(h.hexdigest())
""")


def test_backward_is_bit_identical_across_runs(rng, seed):
    B, H, T, D = 2, 3, 150, 32
    q, k, v, do = (rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(4))
    km = rng.random((B, T)) > 0.2
    out, lse = pyxtts.attention_forward(q, k, v, causal=True, key_mask=km)
    a = pyxtts.attention_backward(do, q, k, v, out, lse, causal=True, key_mask=km)
    b = pyxtts.attention_backward(do, q, k, v, out, lse, causal=True, key_mask=km)
    for x, y in zip(a, b):
        assert x.numpy().tobytes() == y.numpy().tobytes(), f"seed={seed}"


@pytest.mark.slow
def test_bit_identical_for_any_thread_count(seed):
    """OMP_NUM_THREADS=1 (one pass per head) and 2..5 (dK/dV and dQ passes) agree bit for
    bit, float32 and bfloat16."""
    digests = {}
    for threads in range(1, 6):
        res = run_python(DETERMINISM_SCRIPT, str(seed % 2**31), env={"OMP_NUM_THREADS": str(threads)})
        assert res.returncode == 0, res.stderr
        digests[threads] = res.stdout.strip()
    assert len(set(digests.values())) == 1, f"seed={seed}: results depend on the thread count: {digests}"


# ---- the guard ------------------------------------------------------------------------


def _args(B=2, H=3, Tq=10, Tk=12, D=8, dtype=np.float32):
    rng = make_rng("test_attention._args")
    q = rng.standard_normal((B, H, Tq, D)).astype(dtype)
    k = rng.standard_normal((B, H, Tk, D)).astype(dtype)
    v = rng.standard_normal((B, H, Tk, D)).astype(dtype)
    return q, k, v


Q, K, V = _args()
BAD_FORWARD = [
    # (kwargs changes, exception, words the message must contain)
    (dict(q=Q[0]), ValueError, ["q", "4-d", "(3, 10, 8)"]),
    (dict(q=Q.astype(np.int32)), TypeError, ["q", "float32", "int32"]),
    (dict(q=None), TypeError, ["q", "None"]),
    (dict(k=K[:1]), ValueError, ["k", "(2, 3, *, 8)", "(1, 3, 12, 8)"]),
    (dict(k=K[:, :2]), ValueError, ["k", "(2, 3, *, 8)"]),
    (dict(k=K[..., :4]), ValueError, ["k", "(2, 3, *, 8)", "(2, 3, 12, 4)"]),
    (dict(v=V[:, :, :11]), ValueError, ["v", "Tk=12", "11"]),
    (dict(k=K.astype(np.float16)), TypeError, ["k", "float32", "float16"]),
    (dict(v=V.astype(ml_dtypes.bfloat16)), TypeError, ["v", "float32", "bfloat16"]),
    (dict(q=Q[..., :0], k=K[..., :0], v=V[..., :0]), ValueError, ["q", "D >= 1"]),
    (dict(q_lengths=np.array([1.0, 2.0])), TypeError, ["q_lengths", "int32 or int64", "float"]),
    (dict(q_lengths=np.array([1, 2, 3])), ValueError, ["q_lengths", "(2)", "(3)"]),
    (dict(q_lengths=np.array([1, 11])), ValueError, ["q_lengths", "[0, Tq=10]", "11", "index 1"]),
    (dict(q_lengths=np.array([-1, 5], np.int32)), ValueError, ["q_lengths", "-1", "index 0"]),
    (dict(k_lengths=np.array([13, 2])), ValueError, ["k_lengths", "[0, Tk=12]", "13"]),
    (dict(k_lengths=np.array([[1, 2]])), ValueError, ["k_lengths", "(2)", "(1, 2)"]),
    (dict(k_lengths=np.array([1, 2], np.uint8)), TypeError, ["k_lengths", "uint8"]),
    (dict(key_mask=np.ones((2, 12), np.float32)), TypeError, ["key_mask", "bool or uint8",
                                                               "float32"]),
    (dict(key_mask=np.ones((2, 10), bool)), ValueError, ["key_mask", "(2, 12)", "(2, 10)"]),
    (dict(scale=float("nan")), ValueError, ["scale", "finite", "nan"]),
    (dict(scale="x"), TypeError, ["scale", "str"]),
    (dict(max_sequence_length=11), ValueError, ["longer than the configured maximum", "Tk=12",
                                                "max_sequence_length=11", "never truncate"]),
    (dict(max_sequence_length=9), ValueError, ["longer than the configured maximum", "Tq=10"]),
    (dict(max_sequence_length=0), ValueError, ["max_sequence_length", ">= 1", "0"]),
    (dict(max_sequence_length=3.5), TypeError, ["max_sequence_length", "float"]),
]


@pytest.mark.parametrize("fn", ["attention_forward", "attention"])
@pytest.mark.parametrize("change,exc,words", BAD_FORWARD, ids=lambda x: None)
def test_forward_guard(fn, change, exc, words):
    kwargs = dict(q=Q, k=K, v=V, causal=True)
    kwargs.update(change)
    refs = [sys.getrefcount(x) for x in (Q, K, V)]
    before = pyxtts.memory_allocated("cpu")
    with pytest.raises(exc) as info:
        getattr(pyxtts, fn)(**kwargs)
    for w in words:
        assert w in str(info.value), f"{w!r} not in {str(info.value)!r}"
    assert pyxtts.memory_allocated("cpu") == before
    del info
    assert [sys.getrefcount(x) for x in (Q, K, V)] == refs


def test_max_sequence_length_allows_the_maximum():
    out = pyxtts.attention(Q, K, V, max_sequence_length=12)
    assert out.shape == Q.shape


OUT, LSE = pyxtts.attention_forward(Q, K, V)
OUT_NP, LSE_NP = OUT.numpy(), LSE.numpy()
del OUT, LSE
BAD_BACKWARD = [
    (dict(dout=OUT_NP[:, :, :9]), ValueError, ["dout", "(2, 3, 10, 8)", "(2, 3, 9, 8)"]),
    (dict(dout=OUT_NP.astype(np.float16)), TypeError, ["dout", "float32", "float16"]),
    (dict(out=OUT_NP[:, :, :9]), ValueError, ["out", "(2, 3, 10, 8)", "(2, 3, 9, 8)"]),
    (dict(out=OUT_NP[0]), ValueError, ["out", "4-d"]),
    (dict(lse=LSE_NP.astype(ml_dtypes.bfloat16)), TypeError, ["lse", "float32", "bfloat16"]),
    (dict(lse=LSE_NP[:, :, :9]), ValueError, ["lse", "(2, 3, 10)", "(2, 3, 9)"]),
    (dict(lse=LSE_NP[None]), ValueError, ["lse", "(2, 3, 10)", "(1, 2, 3, 10)"]),
    (dict(k=K[..., :4]), ValueError, ["k", "(2, 3, *, 8)"]),
    (dict(v=V[:, :, 1:]), ValueError, ["v", "Tk=12"]),
    (dict(q=Q.astype(np.float16)), TypeError, ["k", "float16", "float32"]),
    (dict(k_lengths=np.array([1, 99])), ValueError, ["k_lengths", "[0, Tk=12]", "99"]),
    (dict(key_mask=np.ones((3, 12), bool)), ValueError, ["key_mask", "(2, 12)", "(3, 12)"]),
]


@pytest.mark.parametrize("change,exc,words", BAD_BACKWARD, ids=lambda x: None)
def test_backward_guard(change, exc, words):
    kwargs = dict(dout=OUT_NP, q=Q, k=K, v=V, out=OUT_NP, lse=LSE_NP, causal=True)
    kwargs.update(change)
    before = pyxtts.memory_allocated("cpu")
    with pytest.raises(exc) as info:
        pyxtts.attention_backward(**kwargs)
    for w in words:
        assert w in str(info.value), f"{w!r} not in {str(info.value)!r}"
    assert pyxtts.memory_allocated("cpu") == before


def test_guard_accepts_tensors_lists_and_every_lengths_form(rng):
    q, k, v = (pyxtts.tensor(x) for x in (Q, K, V))
    ref, _ = pyxtts.attention_forward(q, k, v, q_lengths=np.array([4, 10]))
    for ql in ([4, 10], np.array([4, 10], np.int32), pyxtts.tensor(np.array([4, 10], np.int64)),
               pyxtts.tensor(np.array([4, 10], np.int32))):
        out, _ = pyxtts.attention_forward(q, k, v, q_lengths=ql)
        np.testing.assert_array_equal(out.numpy(), ref.numpy())
    km = rng.random((2, 12)) > 0.3
    a = pyxtts.attention(q, k, v, key_mask=km).numpy()
    b = pyxtts.attention(q, k, v, key_mask=km.astype(np.uint8) * 7).numpy()  # nonzero = valid
    np.testing.assert_array_equal(a, b)


def test_reference_counts_are_exact_on_success():
    q, k, v = (pyxtts.tensor(x) for x in (Q, K, V))
    ql, km = pyxtts.tensor(np.array([4, 10], np.int32)), np.ones((2, 12), bool)
    objs = (q, k, v, ql, km)
    before = [sys.getrefcount(x) for x in objs]
    for _ in range(3):
        out, lse = pyxtts.attention_forward(q, k, v, q_lengths=ql, key_mask=km)
        assert sys.getrefcount(out) == sys.getrefcount(lse) == 2  # only the local names
        grads = pyxtts.attention_backward(out, q, k, v, out, lse, q_lengths=ql, key_mask=km)
        assert [sys.getrefcount(g) for g in grads] == [3, 3, 3]  # the tuple and the call
        del out, lse, grads
    qkv = pyxtts.tensor(np.ones((2, 5, 3 * 8), np.float32))
    for _ in range(3):
        out, lse = _C._attention_qkv_forward(qkv, 2)
        d = _C._attention_qkv_backward(out, qkv, out, lse, 2)
        assert sys.getrefcount(d) == 2
        del out, lse, d
    assert [sys.getrefcount(x) for x in objs] == before
    assert sys.getrefcount(qkv) == 2


def test_out_of_memory_at_every_allocation_leaves_no_trace():
    """An allocation failing anywhere in the call raises OutOfMemoryError and frees
    everything the call had made (the check_memory fixture counts the bytes)."""
    import pyxtts.testing
    kw = dict(causal=True, q_lengths=[5, 10], k_lengths=np.array([12, 3], np.int64))
    calls = [lambda: pyxtts.attention_forward(Q, K, V, **kw),
             lambda: pyxtts.attention_backward(OUT_NP, Q, K, V, OUT_NP, LSE_NP, **kw)]
    for call in calls:
        for n in range(0, 20):
            before = pyxtts.memory_allocated("cpu")
            pyxtts.testing.inject_oom(n, "cpu")
            try:
                call()
            except pyxtts.OutOfMemoryError:
                assert pyxtts.memory_allocated("cpu") == before
                continue
            finally:
                pyxtts.testing.inject_oom(None, "cpu")
            break  # n allocations were all the call needed
        else:
            pytest.fail("the call never completed")


@requires_cuda
def test_operands_on_different_devices():
    q = pyxtts.tensor(Q)
    k = pyxtts.tensor(K, device="cuda:0")
    with pytest.raises(ValueError, match="k: expected a tensor on cpu, got one on cuda:0"):
        pyxtts.attention_forward(q, k, pyxtts.tensor(V))


def test_exported():
    for name in ("attention", "attention_forward", "attention_backward"):
        assert name in pyxtts.__all__ and callable(getattr(pyxtts, name))
    assert "exact" in pyxtts.attention_forward.__doc__.lower()


def test_isa_selection_rejects_unknown_names():
    with pytest.raises(ValueError, match="isa"):
        _C._attention_cpu_isa("sse9")
    assert _C._attention_cpu_isa() in ISAS


@pytest.mark.parametrize("causal", [True, False])
def test_backward_is_the_derivative_of_forward(rng, causal):
    """Finite differences of the kernel's own fp32 forward along random directions:
    (L(x + h u) - L(x - h u)) / 2h against <dL/dx, u>, L = sum(out * w). With h = 1e-2
    the truncation error is ~h^2 and fp32 rounding ~1e-7 |L| / h: 1e-2 relative holds."""
    B, H, Tq, Tk, D = 2, 2, 9, 9 if causal else 13, 16
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in
               ((B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, D)))
    key_mask = np.ones((B, Tk), np.uint8)
    key_mask[1, 3] = 0  # a hole in the middle
    w = rng.standard_normal((B, H, Tq, D)).astype(np.float32)

    def loss(q_, k_, v_):
        out = pyxtts.attention(q_, k_, v_, causal=causal, key_mask=key_mask).numpy()
        return float((out.astype(np.float64) * w).sum())

    out, lse = pyxtts.attention_forward(q, k, v, causal=causal, key_mask=key_mask)
    grads = [g.numpy() for g in pyxtts.attention_backward(w, q, k, v, out, lse, causal=causal,
                                                          key_mask=key_mask)]
    h = 1e-2
    for i, (name, x) in enumerate((("q", q), ("k", k), ("v", v))):
        for _ in range(3):
            u = rng.standard_normal(x.shape).astype(np.float32)
            args_p = [q, k, v]
            args_m = [q, k, v]
            args_p[i] = (x + h * u).astype(np.float32)
            args_m[i] = (x - h * u).astype(np.float32)
            fd = (loss(*args_p) - loss(*args_m)) / (2 * h)
            analytic = float((grads[i].astype(np.float64) * u).sum())
            assert abs(fd - analytic) <= 1e-2 * max(abs(analytic), 1.0), (name, fd, analytic)

"""The conditioning path's kernels (GroupNorm, RMS norm, GEGLU) and dropout (rows and
attention probabilities) against float64 NumPy / torch, finite differences and an
independent Philox (tests/philox.py). The norms and GEGLU run on every device of DEVICES
(cuda:0 skips without a GPU) against the same float64 references and bounds, and the GPU
against the CPU backend (test_cuda_matches_the_cpu_*).

Tolerances follow test_ops.py: a kernel's float32 error is bounded by a few units of
float32 rounding (u = 2^-24) times the magnitude of the terms it adds, 2^-20 (16 u) of
them for the backwards, whose terms pass through a dozen roundings; the NumPy gradients
are checked by central differences in float64 (h = 1e-6, 1e-6 relative) and the kernels'
own fp32 forwards by central differences (h = 1e-2, 1e-2 relative). 16-bit kernels load
exactly and compute in float32, so they equal the fp32 kernel's results rounded once.
On the GPU, erff and expf are CUDA's (2 ulp at most): inside the same bounds.
Dropout masks must equal the NumPy Philox's bit for bit; their statistics are checked
against binomial bounds of 6 standard deviations (a false alarm below 1e-8 per check).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")
from conftest import assert_bits_equal, requires_cuda, run_python  # noqa: E402
from test_attention import ISAS  # noqa: E402
from helpers.arrays import f64, rand  # noqa: E402
from test_ops import HALF, U, T, assert_within, check_fd, fd, r16  # noqa: E402

import philox  # noqa: E402
import pyxtts  # noqa: E402
from pyxtts import _C  # noqa: E402

pytestmark = pytest.mark.usefixtures("check_memory")

# XTTS v2 sizes: 8 samples of 517 mel frames, d = 1024 in 32 groups; 8 x 32 latents
GN_CASES = [(1, 1, 16, 8), (2, 5, 48, 16), (3, 17, 64, 16), (8, 517, 1024, 32)]
RMS_SHAPES = [(1, 1), (3, 7), (2, 5, 33), (8 * 32, 1024)]
GEGLU_SHAPES = [(1, 2), (3, 10), (2, 5, 66), (8 * 32, 2 * 2730)]


def Td(a, dtype="float32", device="cpu"):
    """A tensor of `a` in a pyxtts dtype on `device` (rounding to nearest even)."""
    return pyxtts.tensor(np.asarray(a), dtype=getattr(pyxtts, dtype), device=device)


def poison(device, *specs):
    """poison_cache on `device`: NaN blocks the op's fresh outputs get next."""
    held = [Td(np.full(shape, np.nan, np.float32), dtype, device) for shape, dtype in specs]
    del held


# ---- float64 references ----------------------------------------------------------------

def gn_ref(x, w, b, G, eps=1e-5):
    """x (B, S, C): out, mean (B, G), rstd (B, G), and the normalised x."""
    B, S, C = x.shape
    xg = x.reshape(B, S, G, C // G)
    m = xg.mean((1, 3))
    r = 1 / np.sqrt(((xg - m[:, None, :, None]) ** 2).mean((1, 3)) + eps)
    n = ((xg - m[:, None, :, None]) * r[:, None, :, None]).reshape(B, S, C)
    return n * w + b, m, r, n


def gn_grad_ref(dout, x, w, G, eps=1e-5):
    """(dinp, dweight, dbias) of sum(out * dout), and the magnitudes of dinp's terms."""
    B, S, C = x.shape
    _, m, r, n = gn_ref(x, w, 0 * w, G, eps)
    g = (dout * w).reshape(B, S, G, C // G)
    ng = n.reshape(B, S, G, C // G)
    mg, mgn = g.mean((1, 3), keepdims=True), (g * ng).mean((1, 3), keepdims=True)
    rr = r[:, None, :, None]
    dinp = (rr * (g - mg - ng * mgn)).reshape(B, S, C)
    xg = x.reshape(B, S, G, C // G)
    terms = rr * (np.abs(g) + np.abs(mg) + np.abs(ng * mgn) + np.abs(g).mean((1, 3), keepdims=True)
                  + np.abs(ng) * np.abs(g * ng).mean((1, 3), keepdims=True)
                  + (np.abs(xg) + np.abs(m[:, None, :, None])) * rr * (np.abs(mgn) + np.abs(ng * mg)))
    dw_terms = ((np.abs(n) + (np.abs(x) + np.abs(m).repeat(C // G, 1)[:, None, :])
                 * r.repeat(C // G, 1)[:, None, :]) * np.abs(dout)).sum((0, 1))
    return dinp, (dout * n).sum((0, 1)), dout.sum((0, 1)), terms.reshape(B, S, C), dw_terms


def rms_ref(x, g, scale, eps=1e-12):
    n = np.sqrt((x * x).sum(-1, keepdims=True))
    return x / np.maximum(n, eps) * scale * g, n[..., 0]


def rms_grad_ref(dout, x, g, scale, eps=1e-12):
    n = np.sqrt((x * x).sum(-1, keepdims=True))
    d = np.maximum(n, eps)
    gg = dout * g * scale
    xh = x / d
    dinp = np.where(n > eps, (gg - xh * (xh * gg).sum(-1, keepdims=True)) / d, gg / eps)
    terms = (np.abs(gg) + np.abs(xh) * (np.abs(xh * gg)).sum(-1, keepdims=True)) / d
    rows = tuple(range(x.ndim - 1))
    return dinp, (dout * xh * scale).sum(rows), terms, (np.abs(dout * xh * scale)).sum(rows)


def phi_cdf(x):
    return 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def geglu_ref(x):
    F = x.shape[-1] // 2
    a, g = x[..., :F], x[..., F:]
    return a * g * phi_cdf(g)


def geglu_grad_ref(x, dout):
    F = x.shape[-1] // 2
    a, g = x[..., :F], x[..., F:]
    cdf, pdf = phi_cdf(g), np.exp(-0.5 * g * g) / math.sqrt(2 * math.pi)
    return np.concatenate([dout * g * cdf, dout * a * (cdf + g * pdf)], -1)


# ---- GroupNorm ----------------------------------------------------------------------------

@pytest.mark.parametrize("B,S,C,G", GN_CASES, ids=str)
def test_groupnorm_forward(rng, seed, B, S, C, G, device):
    x = rand(rng, (B, S, C), scale=2.0, offset=3.0)
    w, b = rand(rng, C), rand(rng, C, scale=0.5)
    msg = f"seed={seed} B,S,C,G={B},{S},{C},{G} {device}"
    xt, wt, bt = Td(x, device=device), Td(w, device=device), Td(b, device=device)
    poison(device, ((B, S, C), "float32"), ((B, G), "float32"), ((B, G), "float32"))
    out, mean, rstd = _C._op_groupnorm_forward(xt, wt, bt, G)
    assert out.shape == (B, S, C) and mean.shape == (B, G) and rstd.shape == (B, G), msg
    x64 = x.astype(np.float64)
    ref, m, r, n = gn_ref(x64, w, b, G)
    # statistics: double sums rounded once to float32
    assert_within(f64(mean), m, 2 * U * np.abs(m) + 1e-12 * np.abs(x64).max(), msg + " mean")
    assert_within(f64(rstd), r, 4 * U * r, msg + " rstd")
    # out: float32 roundings of (x - mean) * rstd * w + b, and of x - mean (|x| rstd u)
    rr = r.repeat(C // G, 1)[:, None, :]
    terms = np.abs(n * w) + np.abs(b) + np.abs(x64) * rr * np.abs(w)
    assert_within(f64(out), ref, 1e-6 * terms + 1e-30, msg + " out")
    if x.size < 1e5:  # torch's GroupNorm on the (B, C, S) layout agrees with the reference
        tref = torch.nn.functional.group_norm(torch.from_numpy(x64).transpose(1, 2), G,
                                              torch.from_numpy(w.astype(np.float64)),
                                              torch.from_numpy(b.astype(np.float64)), 1e-5)
        np.testing.assert_allclose(ref, tref.transpose(1, 2).numpy(), rtol=1e-12, atol=1e-12, err_msg=msg)


@pytest.mark.parametrize("B,S,C,G", GN_CASES, ids=str)
def test_groupnorm_backward(rng, seed, B, S, C, G, device):
    x = rand(rng, (B, S, C), scale=2.0, offset=3.0)
    w, dout = rand(rng, C), rand(rng, (B, S, C))
    msg = f"seed={seed} B,S,C,G={B},{S},{C},{G} {device}"
    T = lambda a: Td(a, device=device)  # noqa: E731, N806
    _, mean, rstd = _C._op_groupnorm_forward(T(x), T(w), T(np.zeros(C)), G)
    x64, w64, d64 = (a.astype(np.float64) for a in (x, w, dout))
    dinp, dw, db, terms, dw_terms = gn_grad_ref(d64, x64, w64, G)
    di0, dw0, db0 = rand(rng, (B, S, C)), rand(rng, C), rand(rng, C)  # accumulated into (+=)
    gi, gw, gb = T(di0), T(dw0), T(db0)
    res = _C._op_groupnorm_backward(T(dout), T(x), T(w), mean, rstd, G, dinp=gi, dweight=gw, dbias=gb)
    assert res[0] is gi and res[1] is gw and res[2] is gb, msg
    assert_within(f64(gi), di0 + dinp, 2.0**-20 * terms + U * np.abs(di0 + dinp), msg + " dinp")
    assert_within(f64(gw), dw0 + dw, 8 * U * dw_terms + U * np.abs(dw0 + dw), msg + " dweight")
    assert_within(f64(gb), db0 + db, 2 * U * (np.abs(db0 + db) + np.abs(d64).sum((0, 1))), msg + " dbias")
    if x.size < 1e5:  # torch autograd in float64 agrees with the NumPy gradients
        tx = torch.from_numpy(x64).requires_grad_()
        tw, tb = torch.from_numpy(w64).requires_grad_(), torch.zeros(C, dtype=torch.float64, requires_grad=True)
        torch.nn.functional.group_norm(tx.transpose(1, 2), G, tw, tb, 1e-5).transpose(1, 2).backward(
            torch.from_numpy(d64))
        for ours, theirs in [(dinp, tx.grad), (dw, tw.grad), (db, tb.grad)]:
            np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-10, atol=1e-10, err_msg=msg)


def test_groupnorm_finite_differences(rng, seed, device):
    B, S, C, G = 2, 3, 8, 4
    x, w, b, dout = rand(rng, (B, S, C), scale=1.5, offset=0.5), rand(rng, C), rand(rng, C), rand(rng, (B, S, C))
    x64, w64, b64, d64 = (a.astype(np.float64) for a in (x, w, b, dout))
    msg = f"seed={seed} {device}"
    T = lambda a: Td(a, device=device)  # noqa: E731, N806
    dinp, dw, db, _, _ = gn_grad_ref(d64, x64, w64, G)
    ref_loss = {"x": lambda a: (gn_ref(a, w64, b64, G)[0] * d64).sum(),
                "weight": lambda a: (gn_ref(x64, a, b64, G)[0] * d64).sum(),
                "bias": lambda a: (gn_ref(x64, w64, a, G)[0] * d64).sum()}
    _, mean, rstd = _C._op_groupnorm_forward(T(x), T(w), T(b), G)
    gi, gw, gb = (f64(g) for g in _C._op_groupnorm_backward(T(dout), T(x), T(w), mean, rstd, G))
    fwd = lambda xx, ww, bb: f64(_C._op_groupnorm_forward(T(xx), T(ww), T(bb), G)[0])  # noqa: E731
    our_loss = {"x": lambda a: (fwd(a, w, b) * d64).sum(), "weight": lambda a: (fwd(x, a, b) * d64).sum(),
                "bias": lambda a: (fwd(x, w, a) * d64).sum()}
    for name, at, g_ref, g_ours in [("x", x64, dinp, gi), ("weight", w64, dw, gw), ("bias", b64, db, gb)]:
        for _ in range(3):
            v = rng.standard_normal(at.shape)
            check_fd(fd(ref_loss[name], at, v, 1e-6), float((g_ref * v).sum()), float(np.abs(g_ref * v).sum()),
                     1e-6, msg + f" NumPy reference d/d{name}")
            check_fd(fd(our_loss[name], at, v, 1e-2), float((g_ours * v).sum()), float(np.abs(g_ours * v).sum()),
                     1e-2, msg + f" kernel d/d{name}")


@pytest.mark.parametrize("dtype", HALF)
def test_groupnorm_16bit(rng, seed, dtype, device):
    # 3 channels per group: on the GPU every dtype reads one element per vector, so the
    # 16-bit and fp32 kernels add the same floats in the same tree
    B, S, C, G = 3, 40, 96, 32
    x, w, b = rand(rng, (B, S, C), dtype, scale=2.0, offset=1.0), rand(rng, C, dtype=dtype), rand(rng, C, dtype=dtype)
    dout, di0 = rand(rng, (B, S, C), dtype=dtype), rand(rng, (B, S, C), dtype=dtype)
    msg = f"seed={seed} {dtype} {device}"
    T = lambda a, dt="float32": Td(a, dt, device)  # noqa: E731, N806
    o16, m16, r16_ = _C._op_groupnorm_forward(T(x, dtype), T(w, dtype), T(b, dtype), G)
    o32, m32, r32 = _C._op_groupnorm_forward(T(x), T(w), T(b), G)
    assert_bits_equal(o16.numpy(), r16(o32.numpy(), dtype), msg + " out")
    assert_bits_equal(m16.numpy(), m32.numpy(), msg + " mean")
    assert_bits_equal(r16_.numpy(), r32.numpy(), msg + " rstd")
    g16 = _C._op_groupnorm_backward(T(dout, dtype), T(x, dtype), T(w, dtype), m16, r16_, G, dinp=T(di0, dtype))
    g32 = _C._op_groupnorm_backward(T(dout), T(x), T(w), m32, r32, G, dinp=T(di0))
    assert_bits_equal(g16[0].numpy(), r16(g32[0].numpy(), dtype), msg + " dinp")
    assert_bits_equal(g16[1].numpy(), g32[1].numpy(), msg + " dweight")
    assert_bits_equal(g16[2].numpy(), g32[2].numpy(), msg + " dbias")


def test_groupnorm_errors():
    x, w = T(np.ones((2, 3, 8))), T(np.ones(8))
    with pytest.raises(ValueError, match=r"^groups: expected a divisor of the channels C=8"):
        _C._op_groupnorm_forward(x, w, w, 3)
    with pytest.raises(ValueError, match=r"^groups: expected an integer in \[1, 2147483647\], got 0"):
        _C._op_groupnorm_forward(x, w, w, 0)
    with pytest.raises(ValueError, match=r"^x: expected shape \(\*, \*, \*\), got \(3, 8\)"):
        _C._op_groupnorm_forward(T(np.ones((3, 8))), w, w, 2)
    with pytest.raises(ValueError, match=r"^weight: expected shape \(8\), got \(4\)"):
        _C._op_groupnorm_forward(x, T(np.ones(4)), w, 2)
    _, m, r = _C._op_groupnorm_forward(x, w, w, 2)
    with pytest.raises(ValueError, match=r"^mean: expected shape \(2, 4\), got \(2, 2\)"):
        _C._op_groupnorm_backward(x, x, w, m, r, 4)


# ---- RMS norm --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", RMS_SHAPES, ids=str)
def test_rmsnorm_forward_and_backward(rng, seed, shape, device):
    C = shape[-1]
    x, g, dout = rand(rng, shape, scale=1.5, offset=0.5), rand(rng, C), rand(rng, shape)
    scale = math.sqrt(C)
    msg = f"seed={seed} shape={shape} {device}"
    T = lambda a: Td(a, device=device)  # noqa: E731, N806
    xt, gt = T(x), T(g)
    poison(device, (shape, "float32"), (shape[:-1], "float32"))
    out, norm = _C._op_rmsnorm_forward(xt, gt, scale)
    x64, g64, d64 = (a.astype(np.float64) for a in (x, g, dout))
    ref, n = rms_ref(x64, g64, scale)
    assert_within(f64(norm), n, 2 * U * n, msg + " norm")
    assert_within(f64(out), ref, 8 * U * np.abs(ref) + 1e-30, msg + " out")
    di0, dg0 = rand(rng, shape), rand(rng, C)
    gi, gg = T(di0), T(dg0)
    res = _C._op_rmsnorm_backward(T(dout), xt, gt, norm, scale, dinp=gi, dgamma=gg)
    assert res[0] is gi and res[1] is gg, msg
    dinp, dgam, terms, dg_terms = rms_grad_ref(d64, x64, g64, scale)
    assert_within(f64(gi), di0 + dinp, 2.0**-20 * terms + U * np.abs(di0 + dinp), msg + " dinp")
    assert_within(f64(gg), dg0 + dgam, 8 * U * dg_terms + U * np.abs(dg0 + dgam), msg + " dgamma")
    if x.size < 1e5:  # torch: F.normalize(x) * scale * gamma, autograd in float64
        tx, tg = torch.from_numpy(x64).requires_grad_(), torch.from_numpy(g64).requires_grad_()
        tout = torch.nn.functional.normalize(tx, dim=-1) * scale * tg
        tout.backward(torch.from_numpy(d64))
        np.testing.assert_allclose(ref, tout.detach().numpy(), rtol=1e-12, atol=1e-12, err_msg=msg)
        np.testing.assert_allclose(dinp, tx.grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=msg)
        np.testing.assert_allclose(dgam, tg.grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=msg)


def test_rmsnorm_zero_row_and_finite_differences(rng, seed, device):
    # a row of zeros takes F.normalize's eps branch: out 0, gradient dout * gamma * scale / eps
    T = lambda a: Td(a, device=device)  # noqa: E731, N806
    x = rand(rng, (3, 6))
    x[1] = 0.0
    g, dout = rand(rng, 6), rand(rng, (3, 6))
    out, norm = _C._op_rmsnorm_forward(T(x), T(g), 2.0, eps=1e-3)
    assert np.all(out.numpy()[1] == 0) and norm.numpy()[1] == 0
    di, _ = _C._op_rmsnorm_backward(T(dout), T(x), T(g), norm, 2.0, eps=1e-3)
    assert_within(f64(di)[1], dout[1].astype(np.float64) * g * 2.0 / 1e-3, 1e-4 * np.abs(dout[1] * g) / 1e-3, "eps")
    x[1] = rand(rng, 6)
    msg = f"seed={seed} {device}"
    x64, g64, d64 = (a.astype(np.float64) for a in (x, g, dout))
    dinp, dgam, _, _ = rms_grad_ref(d64, x64, g64, 2.0)
    _, norm = _C._op_rmsnorm_forward(T(x), T(g), 2.0)
    gi, gg = (f64(t) for t in _C._op_rmsnorm_backward(T(dout), T(x), T(g), norm, 2.0))
    ref_loss = {"x": lambda a: (rms_ref(a, g64, 2.0)[0] * d64).sum(),
                "gamma": lambda a: (rms_ref(x64, a, 2.0)[0] * d64).sum()}
    our_loss = {"x": lambda a: (f64(_C._op_rmsnorm_forward(T(a), T(g), 2.0)[0]) * d64).sum(),
                "gamma": lambda a: (f64(_C._op_rmsnorm_forward(T(x), T(a), 2.0)[0]) * d64).sum()}
    for name, at, g_ref, g_ours in [("x", x64, dinp, gi), ("gamma", g64, dgam, gg)]:
        for _ in range(3):
            v = rng.standard_normal(at.shape)
            check_fd(fd(ref_loss[name], at, v, 1e-6), float((g_ref * v).sum()), float(np.abs(g_ref * v).sum()),
                     1e-6, msg + f" NumPy reference d/d{name}")
            check_fd(fd(our_loss[name], at, v, 1e-2), float((g_ours * v).sum()), float(np.abs(g_ours * v).sum()),
                     1e-2, msg + f" kernel d/d{name}")


# ---- GEGLU -------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", GEGLU_SHAPES, ids=str)
def test_geglu_forward_and_backward(rng, seed, shape, device):
    x = rand(rng, shape, scale=2.0)
    F = shape[-1] // 2
    dout = rand(rng, shape[:-1] + (F,))
    msg = f"seed={seed} shape={shape} {device}"
    T = lambda a: Td(a, device=device)  # noqa: E731, N806
    xt = T(x)
    poison(device, (shape[:-1] + (F,), "float32"), (shape, "float32"))
    out = _C._op_geglu_forward(xt)
    x64, d64 = x.astype(np.float64), dout.astype(np.float64)
    ref = geglu_ref(x64)
    a, g = np.abs(x64[..., :F]), np.abs(x64[..., F:])
    # erff and expf to a few ulp, then products: 8 u of the product's magnitude
    assert_within(f64(out), ref, 8 * U * a * g + 1e-30, msg + " out")
    din = _C._op_geglu_backward(xt, T(dout))
    want = geglu_grad_ref(x64, d64)
    mag = np.concatenate([np.abs(d64) * g, np.abs(d64) * a * (1 + g * g)], -1)
    assert_within(f64(din), want, 8 * U * mag + 1e-30, msg + " dinp")
    if x.size < 1e5:  # torch's exact GELU in float64
        tx = torch.from_numpy(x64).requires_grad_()
        ta, tg = tx.chunk(2, dim=-1)
        tout = ta * torch.nn.functional.gelu(tg)
        tout.backward(torch.from_numpy(d64))
        np.testing.assert_allclose(ref, tout.detach().numpy(), rtol=1e-12, atol=1e-12, err_msg=msg)
        np.testing.assert_allclose(want, tx.grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=msg)


@pytest.mark.parametrize("dtype", HALF)
def test_geglu_16bit(rng, seed, dtype, device):
    x, dout = rand(rng, (40, 66), dtype, scale=2.0), rand(rng, (40, 33), dtype=dtype)
    msg = f"seed={seed} {dtype} {device}"
    T = lambda a, dt="float32": Td(a, dt, device)  # noqa: E731, N806
    assert_bits_equal(_C._op_geglu_forward(T(x, dtype)).numpy(), r16(_C._op_geglu_forward(T(x)).numpy(), dtype), msg)
    assert_bits_equal(_C._op_geglu_backward(T(x, dtype), T(dout, dtype)).numpy(),
                      r16(_C._op_geglu_backward(T(x), T(dout)).numpy(), dtype), msg)


def test_geglu_errors():
    with pytest.raises(ValueError, match=r"^x: the last dimension must be even"):
        _C._op_geglu_forward(T(np.ones((2, 5))))
    with pytest.raises(ValueError, match=r"^dout: expected shape \(2, 3\), got \(2, 6\)"):
        _C._op_geglu_backward(T(np.ones((2, 6))), T(np.ones((2, 6))))


# ---- the GPU against the CPU backend ------------------------------------------------------------
# The same inputs on both. Weight gradients (backend.h's chunked column sums of the same
# float terms, from the same statistics) are the CPU's bits. The rest adds its double sums
# in a tree, not in order: a statistic may differ by one float32 rounding (2 u of itself),
# an fp32 output by 8 u of the magnitude of its terms, a 16-bit output by that and one step
# of its grid (2 x U16 of itself: the same float, rounded the other way). GEGLU's erff and
# expf are CUDA's: 8 u of its terms too. A second GPU run gives the same bits.

GPU = "cuda:0"
FLOATS = ["float32", "float16", "bfloat16"]
U16 = {"float32": 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def both(a, dtype):
    return Td(a, dtype), Td(a, dtype, GPU)


def assert_close_16(got, want, terms, dtype, msg):
    # each side rounds its float32 result to the 16-bit type once: below float16's normal
    # range (2^-14) its spacing is 2^-24 absolute, so one such step too (seen on an H200:
    # 2 of 698,880 GEGLU outputs near 3e-6 one subnormal step apart)
    want = f64(want)
    sub = 2.0**-24 if dtype == "float16" else 0.0
    assert_within(f64(got), want, 8 * U * terms + 2 * U16[dtype] * np.abs(want) + sub + 1e-30, msg)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("B,S,C,G", [(2, 5, 48, 16), (3, 17, 64, 16), (2, 9, 256, 2), (8, 517, 1024, 32)], ids=str)
def test_cuda_matches_the_cpu_groupnorm(rng, seed, B, S, C, G, dtype):
    msg = f"seed={seed} B,S,C,G={B},{S},{C},{G} {dtype}"
    x0 = rand(rng, (B, S, C), dtype, scale=2.0, offset=1.0)
    (x, xg), (w, wg), (b, bg) = both(x0, dtype), both(rand(rng, C, dtype=dtype), dtype), both(
        rand(rng, C, dtype, scale=0.5), dtype)
    poison(GPU, ((B, S, C), dtype), ((B, G), "float32"), ((B, G), "float32"))
    out, mean, rstd = _C._op_groupnorm_forward(x, w, b, G)
    outg, meang, rstdg = _C._op_groupnorm_forward(xg, wg, bg, G)
    assert_within(f64(meang), f64(mean), 2 * U * np.abs(f64(mean)) + 1e-30, msg + " mean")
    assert_within(f64(rstdg), f64(rstd), 2 * U * f64(rstd), msg + " rstd")
    k = np.repeat(np.arange(G), C // G)
    m, r = f64(mean)[:, None, k], f64(rstd)[:, None, k]  # (B, 1, C)
    w64, b64 = f64(w), f64(b)
    n = (x0 - m) * r
    assert_close_16(outg, out, np.abs(n * w64) + np.abs(b64) + (np.abs(x0) + np.abs(m)) * r * np.abs(w64),
                    dtype, msg + " out")
    # the backward from the CPU's statistics on both
    dout0, di0 = rand(rng, (B, S, C), dtype=dtype), rand(rng, (B, S, C), dtype=dtype)
    (d, dg), (mc, mg), (rc, rg) = both(dout0, dtype), both(mean.numpy(), "float32"), both(rstd.numpy(), "float32")
    dw0, db0 = rand(rng, C), rand(rng, C)
    runs = []
    for _ in range(2):
        (di, dig), (dw, dwg), (dbb, dbg) = both(di0, dtype), both(dw0, "float32"), both(db0, "float32")
        _C._op_groupnorm_backward(dg, xg, wg, mg, rg, G, dinp=dig, dweight=dwg, dbias=dbg)
        runs.append((dig.numpy(), dwg.numpy(), dbg.numpy()))
    _C._op_groupnorm_backward(d, x, w, mc, rc, G, dinp=di, dweight=dw, dbias=dbb)
    for got, want, what in [(runs[1][0], runs[0][0], "dinp twice"), (runs[1][1], runs[0][1], "dweight twice"),
                            (runs[0][1], dw.numpy(), "dweight"), (runs[0][2], dbb.numpy(), "dbias")]:
        assert_bits_equal(got, want, f"{msg} {what}")
    g = np.abs(dout0 * w64)
    gs = g.reshape(B, S, G, C // G)
    ng = np.abs(n).reshape(B, S, G, C // G)
    mg_ = np.repeat(gs.mean((1, 3)), C // G, 1)[:, None]
    mgn = np.repeat((gs * ng).mean((1, 3)), C // G, 1)[:, None]
    assert_close_16(dig, di, r * (g + mg_ + np.abs(n) * mgn) + np.abs(di0), dtype, msg + " dinp")


@requires_cuda
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("N,C", [(1, 1), (3, 7), (10, 33), (8 * 32, 1024)], ids=str)
def test_cuda_matches_the_cpu_rmsnorm(rng, seed, N, C, dtype):
    msg = f"seed={seed} N,C={N},{C} {dtype}"
    scale = math.sqrt(C)
    x0, g0 = rand(rng, (N, C), dtype, scale=1.5, offset=0.5), rand(rng, C, dtype=dtype)
    (x, xg), (g, gg) = both(x0, dtype), both(g0, dtype)
    poison(GPU, ((N, C), dtype), ((N,), "float32"))
    out, norm = _C._op_rmsnorm_forward(x, g, scale)
    outg, normg = _C._op_rmsnorm_forward(xg, gg, scale)
    assert_within(f64(normg), f64(norm), 2 * U * f64(norm), msg + " norm")
    assert_close_16(outg, out, np.abs(f64(out)), dtype, msg + " out")
    dout0, di0, dg0 = rand(rng, (N, C), dtype=dtype), rand(rng, (N, C), dtype=dtype), rand(rng, C)
    (d, dg), (nc, ng) = both(dout0, dtype), both(norm.numpy(), "float32")
    runs = []
    for _ in range(2):
        (di, dig), (dgm, dgmg) = both(di0, dtype), both(dg0, "float32")
        _C._op_rmsnorm_backward(dg, xg, gg, ng, scale, dinp=dig, dgamma=dgmg)
        runs.append((dig.numpy(), dgmg.numpy()))
    _C._op_rmsnorm_backward(d, x, g, nc, scale, dinp=di, dgamma=dgm)
    assert_bits_equal(runs[1][0], runs[0][0], msg + " dinp twice")
    assert_bits_equal(runs[0][1], dgm.numpy(), msg + " dgamma")
    nn = f64(norm)[:, None]
    gm = np.abs(dout0 * g0) * scale
    xh = np.abs(x0) / nn
    assert_close_16(dig, di, (gm + xh * (xh * gm).sum(-1, keepdims=True)) / nn + np.abs(di0), dtype, msg + " dinp")


@requires_cuda
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("N,F", [(1, 1), (3, 5), (40, 33), (8 * 32, 2730)], ids=str)
def test_cuda_matches_the_cpu_geglu(rng, seed, N, F, dtype):
    msg = f"seed={seed} N,F={N},{F} {dtype}"
    x0, dout0 = rand(rng, (N, 2 * F), dtype, scale=2.0), rand(rng, (N, F), dtype=dtype)
    (x, xg), (d, dg) = both(x0, dtype), both(dout0, dtype)
    poison(GPU, ((N, F), dtype), ((N, 2 * F), dtype))
    a, g = np.abs(x0[:, :F]), np.abs(x0[:, F:])
    assert_close_16(_C._op_geglu_forward(xg), _C._op_geglu_forward(x), a * g, dtype, msg + " out")
    got = _C._op_geglu_backward(xg, dg)
    assert_bits_equal(got.numpy(), _C._op_geglu_backward(xg, dg).numpy(), msg + " twice")
    mag = np.concatenate([np.abs(dout0) * g, np.abs(dout0) * a * (1 + g * g)], -1)
    assert_close_16(got, _C._op_geglu_backward(x, d), mag, dtype, msg + " dinp")


# ---- dropout of rows ---------------------------------------------------------------------------

def test_philox_reference_known_answers():
    for ctr, key, want in philox.KNOWN_ANSWERS:
        got = philox.philox4x32_10(np.array(ctr, np.uint64), key)
        assert tuple(int(v) for v in got) == want


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("N,C,T_,seg1,seg2,sample0", [(1, 1, 1, 1, 1, 0), (24, 10, 8, 2, 5, 7),
                                                      (3 * 80, 1026, 80, 32, 50, 2**32 - 4)], ids=str)
def test_row_masks_are_philox_bit_for_bit(rng, seed, p, N, C, T_, seg1, seg2, sample0):
    key = int(rng.integers(0, 2**63)) * 2 + 1
    msg = f"seed={seed} key={key}"
    want = philox.row_mask(p, key, N, C, T_, seg1, seg2, sample0)
    x, resid = rand(rng, (N, C)), rand(rng, (N, C))
    kw = dict(rows_per_sample=T_, seg1=seg1, seg2=seg2, sample0=sample0)
    xt = T(x)
    got = _C._op_dropout_forward(xt, p, key, **kw).numpy()
    assert_bits_equal(got, (x * want).astype(np.float32), msg + " x * mask")
    assert_bits_equal(xt.numpy(), x, msg + " x unchanged")
    got = _C._op_dropout_forward(xt, p, key, resid=T(resid), **kw).numpy()
    assert_bits_equal(got, (resid + x * want).astype(np.float32), msg + " resid + x * mask")
    assert_bits_equal(_C._op_dropout_backward(xt, p, key, **kw).numpy(), (x * want).astype(np.float32), msg)
    assert _C.dropout_key(seed, 3, 5) == philox.dropout_key(seed, 3, 5)


def test_row_masks_keep_rate_scaling_and_independence(rng, seed):
    p, N, C = 0.1, 4096, 1024
    key = _C.dropout_key(seed, 0, 0)
    z = _C._op_dropout_forward(T(np.ones((N, C))), p, key).numpy()
    kept = z != 0
    assert np.all(z[kept] == np.float32(1 / (1 - np.float32(p)))), "a kept element is scaled by 1 / (1 - p)"
    n = z.size
    sd = math.sqrt(n * p * (1 - p))
    assert abs((~kept).sum() - n * p) < 6 * sd, f"seed={seed}: {(~kept).sum()} dropped of {n}"
    assert abs(z.mean() - 1) < 6 * sd / n / (1 - p), "the mean is kept"
    # neighbours (same Philox call, next call, next row) are uncorrelated: the chance a
    # pair is dropped together is p^2 within binomial bounds
    for a, b in [(kept[:, 0::4], kept[:, 1::4]), (kept[:, 0::4], kept[:, 4::4]), (kept[:-1], kept[1:])]:
        m = min(a.shape[1], b.shape[1])
        both = (~a[:, :m] & ~b[:, :m]).mean()
        k = a[:, :m].size
        assert abs(both - p * p) < 6 * math.sqrt(p * p * (1 - p * p) / k), f"seed={seed}: correlated masks"
    # another step, another site: other masks
    assert not np.array_equal(z, _C._op_dropout_forward(T(np.ones((N, C))), p, _C.dropout_key(seed, 1, 0)).numpy())
    assert not np.array_equal(z, _C._op_dropout_forward(T(np.ones((N, C))), p, _C.dropout_key(seed, 0, 1)).numpy())


@pytest.mark.parametrize("dtype", HALF)
def test_row_dropout_16bit(rng, seed, dtype):
    x, resid = rand(rng, (50, 70), dtype=dtype), rand(rng, (50, 70), dtype=dtype)
    key = _C.dropout_key(seed, 2, 9)
    got = _C._op_dropout_forward(T(x, dtype), 0.2, key, resid=T(resid, dtype)).numpy()
    want = _C._op_dropout_forward(T(x), 0.2, key, resid=T(resid)).numpy()
    assert_bits_equal(got, r16(want, dtype), f"seed={seed}")


@requires_cuda
@pytest.mark.parametrize("dtype", ["float32", *HALF])
@pytest.mark.parametrize("N,C,T_,seg1,seg2", [(1, 1, 1, 1, 1), (3 * 80, 1026, 80, 32, 50),
                                            (8 * 490, 1024, 490, 32, 182)], ids=str)
def test_row_dropout_on_the_gpu_is_the_cpus_bits(rng, seed, dtype, N, C, T_, seg1, seg2):
    """The CUDA kernels draw the same Philox words and round as the CPU: the same bits, every
    element (the last shape is a batch of XTTS v2: 8 samples of 32 + 150 + 308 rows)."""
    key = int(rng.integers(0, 2**63)) * 2 + 1
    kw = dict(rows_per_sample=T_, seg1=seg1, seg2=seg2, sample0=int(rng.integers(0, 2**32 - 8)))
    x, resid = rand(rng, (N, C), dtype=dtype), rand(rng, (N, C), dtype=dtype)
    msg = f"seed={seed} key={key} {kw}"

    def on(a, device):
        return pyxtts.tensor(a, dtype=getattr(pyxtts, dtype), device=device)

    for r in (None, resid):
        want = _C._op_dropout_forward(on(x, "cpu"), 0.1, key, resid=None if r is None else on(r, "cpu"), **kw)
        got = _C._op_dropout_forward(on(x, "cuda:0"), 0.1, key, resid=None if r is None else on(r, "cuda:0"),
                                     **kw)
        assert_bits_equal(got.numpy(), want.numpy(), msg + f" forward resid={r is not None}")
    want = _C._op_dropout_backward(on(x, "cpu"), 0.1, key, **kw)
    assert_bits_equal(_C._op_dropout_backward(on(x, "cuda:0"), 0.1, key, **kw).numpy(), want.numpy(),
                      msg + " backward")


def test_dropout_errors():
    with pytest.raises(ValueError, match=r"^p: must be a number in \[0, 1\), got 1.0"):
        _C._op_dropout_forward(T(np.ones((2, 3))), 1.0, 5)
    with pytest.raises(ValueError, match=r"^seg2: must be >= seg1=3, got 1"):
        _C._op_dropout_forward(T(np.ones((2, 3))), 0.1, 5, seg1=3, seg2=1)
    with pytest.raises(ValueError, match=r"^key: expected an integer in \[0, 2\*\*64\)"):
        _C._op_dropout_forward(T(np.ones((2, 3))), 0.1, -1)


# ---- dropout of the attention probabilities -----------------------------------------------------

def attention_ref(q, k, v, causal, Z, dout):
    """float64 torch: out = (softmax(q k^T / sqrt(D)) * Z) v, and the gradients of sum(out * dout)."""
    tq, tk, tv = (torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (q, k, v))
    s = tq @ tk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    o = (torch.softmax(s, -1) * torch.from_numpy(Z.astype(np.float64))) @ tv
    o.backward(torch.from_numpy(dout.astype(np.float64)))
    return o.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B,H,T_,D", [(1, 1, 5, 8), (2, 3, 70, 64), (1, 4, 131, 16)], ids=str)
def test_attention_dropout_matches_reference(rng, seed, B, H, T_, D, causal, isa):
    p = 0.3
    key = _C.dropout_key(seed, 1, 2)
    q, k, v, dout = (rand(rng, (B, H, T_, D)) for _ in range(4))
    Z = philox.attention_mask(p, key, B, H, T_, T_)
    msg = f"seed={seed} B,H,T,D={B},{H},{T_},{D} causal={causal} isa={isa}"
    ro, rq, rk, rv = attention_ref(q, k, v, causal, Z, dout)
    try:
        assert _C._attention_cpu_isa(isa) == isa
        out, lse = _C.attention_forward(T(q), T(k), T(v), causal=causal, dropout_p=p, dropout_key=key)
        _, lse0 = _C.attention_forward(T(q), T(k), T(v), causal=causal)
        dq, dk, dv = _C.attention_backward(T(dout), T(q), T(k), T(v), out, lse, causal=causal, dropout_p=p,
                                           dropout_key=key)
    finally:
        _C._attention_cpu_isa("auto")
    # fp32 tiles against float64: 1e-5 of the largest output (sums of T fp32 products)
    assert_within(f64(out), ro, 1e-5 * np.abs(ro).max(), msg + " out")
    # the lse is the undropped softmax's (the same as without dropout)
    assert_bits_equal(lse.numpy(), lse0.numpy(), msg + " lse")
    # gradients: 1e-4 of each tensor's largest element (fp32 sums over T rows)
    for name, got, want in [("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)]:
        assert np.abs(want).max() > 0, msg
        assert_within(f64(got), want, 1e-4 * np.abs(want).max(), msg + " " + name)


DETERMINISM_SCRIPT = r"""
import hashlib, sys
import numpy as np
import pyxtts
from pyxtts import _C
seed = int(sys.argv[1])
rng = np.random.default_rng(seed)
q, k, v, d = (pyxtts.tensor(rng.standard_normal((2, 8, 300, 64)).astype(np.float32)) for _ in range(4))
key = _C.dropout_key(seed, 4, 1)
out, lse = _C.attention_forward(q, k, v, dropout_p=0.1, dropout_key=key)
grads = _C.attention_backward(d, q, k, v, out, lse, dropout_p=0.1, dropout_key=key)
x = pyxtts.tensor(rng.standard_normal((3000, 1024)).astype(np.float32))
rows = _C._op_dropout_forward(x, 0.1, key, rows_per_sample=1000, seg1=32, seg2=300)
h = hashlib.sha256()
for t in (out, lse, *grads, rows):
    h.update(t.numpy().tobytes())
print(h.hexdigest())
"""


def test_masks_do_not_depend_on_the_thread_count(seed):
    digests = {}
    for threads in (1, 2, 3):
        res = run_python(DETERMINISM_SCRIPT, str(seed), env={"OMP_NUM_THREADS": str(threads)})
        assert res.returncode == 0, res.stderr
        digests[threads] = res.stdout.strip()
    assert len(set(digests.values())) == 1, f"seed={seed}: results depend on the thread count: {digests}"

"""The tensor-core attention path (cuda/attention_tc.cu: bfloat16/float16, D = 64
or 128, sm_80+) against torch float64 (CPU) and against the CUDA fallback path
(attention.cu), every element. Skipped without a GPU.

PYXTTS_CUDA_ATTENTION is read once per process, so each path runs in a child
process: "tc" (a call the tensor-core path cannot take raises, so a passing case
did run it), "one-pass" (the same with PYXTTS_CUDA_ATTENTION_BWD=one-pass: the
backward as one kernel with dQ through split partials) and "simple" (the fallback).
The children get the same inputs through an .npz file; this process draws the inputs
and computes the references. The one-pass backward's dK and dV come from the same
code and products as the dK/dV kernel's: the same bits; its dQ sums the same terms in
another fp32 order, so the bounds below hold for it as they stand.

Tolerances, from 16-bit rounding (u = 2^-8 bfloat16, 2^-11 float16, the unit
roundoff). Q, K, V, dO enter the mma exactly and S, dP and all sums are fp32
(errors ~1e-6 relative, covered by a 1e-5 floor). What the tensor-core path
rounds to 16 bits, and the error that costs, elementwise:
  out = sum_j p_j v_j / l with each p_j rounded (relative u): |err| <= u (P|v|),
        plus u|out| for the final rounding to the 16-bit output;
  dv  = P^T dO with P rounded: u (P^T |dO|) + u|dv|;
  dS  = scale P (dP - Di) rounded (scale u|dS|); Di = rowsum(dO * O) uses the 16-bit out,
        which is off by at most u(|O| + P|v|) (above), so Di is off by
        Dsum = sum_d |dO| (|O| + P|v|) u and dS by P Dsum; E = u(|dS| + P Dsum);
  dk  = (scale dS)^T Q: scale (E^T |q|) + u|dk|;   dq = (scale dS) K: scale (E |k|) + u|dq|;
  float16 only: p and scale dS under 2^-14 are subnormal, 2^-25 absolute per term.
These are worst-case bounds (every rounding at its maximum, same sign); the test
allows 2x them. A wrong mask, a lost tile or a wrong rescale errs by a fraction of
the result itself, far above u (P|v|) ~ 0.4% (bfloat16) of it. Against the fallback
(whose results are the fp32 result rounded once: u|ref|), the two bounds add.
Elements the contract fixes (rows without a valid key, masked keys) must be 0.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SEED, requires_cuda, run_python
from test_attention import (
    NP,
    allowed_mask,
    case_id,
    check_close,
    check_zero,
    draw,
    nan_padding,
    reference,
)

pytestmark = [requires_cuda]

U = {"float16": 2.0**-11, "bfloat16": 2.0**-8}

# (B, H, Tq, Tk, D, causal, options) as in test_attention.CASES
CASES = [
    (2, 3, 256, 256, 64, True, ""),
    (2, 3, 256, 256, 64, False, ""),
    (2, 2, 1024, 1024, 64, True, "q_lengths,k_lengths"),
    (1, 2, 1024, 1024, 128, True, ""),
    (2, 2, 300, 300, 128, False, "key_mask"),
    (2, 3, 70, 150, 64, True, "k_lengths"),            # cross, Tq < Tk
    (2, 3, 150, 70, 128, True, "key_mask"),            # cross, Tq > Tk: late rows see all keys
    (2, 2, 200, 333, 64, False, "q_lengths,key_mask"),
    (3, 2, 100, 100, 64, True, "empty_rows"),          # rows with no valid key
    (2, 2, 1, 1, 128, True, ""),                        # T = 1
    (2, 2, 65, 65, 128, True, "key_mask,k_lengths"),    # T = tile + 1
    (2, 2, 129, 97, 64, False, "k_lengths"),
]
DTYPES = ["bfloat16", "float16"]
PARAMS = [(c, dt) for c in CASES for dt in DTYPES]
QKV = (2, 333, 4, 64)  # the model's strided (B, T, 3C) layout: B, T, H, D
MODES = {"tc": {"PYXTTS_CUDA_ATTENTION": "tc"},
         "one-pass": {"PYXTTS_CUDA_ATTENTION": "tc", "PYXTTS_CUDA_ATTENTION_BWD": "one-pass"},
         "simple": {"PYXTTS_CUDA_ATTENTION": "simple"}}
TC_MODES = ("tc", "one-pass")

CHILD = r"""
import json, sys
import ml_dtypes, numpy as np
import pyxtts
from pyxtts import _C
NP = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
data = np.load(sys.argv[1])
params = json.loads(str(data["params"]))
res = {}
f32 = lambda t: np.asarray(t.numpy()).astype(np.float32)
def masks(n):
    return {k: (data[f"{n}_{k}"] if f"{n}_{k}" in data else None)
            for k in ("q_lengths", "k_lengths", "key_mask")}
for n, (case, dtype) in enumerate(params):
    causal, dt = bool(case[5]), NP[dtype]
    q, k, v, d = (pyxtts.tensor(data[f"{n}_{x}"].astype(dt), device="cuda:0") for x in "qkvd")
    m = masks(n)
    out, lse = pyxtts.attention_forward(q, k, v, causal=causal, **m)
    g = pyxtts.attention_backward(d, q, k, v, out, lse, causal=causal, **m)
    again = pyxtts.attention_backward(d, q, k, v, out, lse, causal=causal, **m)
    res[f"{n}_det"] = np.array(all(np.array_equal(f32(a).view(np.uint32), f32(b).view(np.uint32))
                                   for a, b in zip(g, again)))
    for name, t in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *g)):
        res[f"{n}_{name}"] = f32(t)
B, T, H, D = (int(x) for x in data["qkv_shape"])
for dtype in NP:
    qkv = pyxtts.tensor(data["qkv"].astype(NP[dtype]), device="cuda:0")
    dout = pyxtts.tensor(data["qkv_dout"].astype(NP[dtype]), device="cuda:0")
    lengths = data["qkv_lengths"]
    out, lse = _C._attention_qkv_forward(qkv, H, causal=True, q_lengths=lengths, k_lengths=lengths)
    dqkv = _C._attention_qkv_backward(dout, qkv, out, lse, H, causal=True, q_lengths=lengths,
                                      k_lengths=lengths)
    res[f"qkv_{dtype}_out"], res[f"qkv_{dtype}_lse"], res[f"qkv_{dtype}_dqkv"] = f32(out), f32(lse), f32(dqkv)
# which calls the forced path refuses (the message names why)
refusals = {}
for name, dtype, Dx in (("fp32", pyxtts.float32, 64), ("d32", pyxtts.bfloat16, 32)):
    x = pyxtts.tensor(np.zeros((1, 1, 8, Dx), np.float32), dtype=dtype, device="cuda:0")
    try:
        pyxtts.attention_forward(x, x, x)
        refusals[name] = "ran"
    except NotImplementedError as exc:
        refusals[name] = "NotImplementedError: " + str(exc)
res["refusals"] = np.array(json.dumps(refusals))
np.savez(sys.argv[2], **res)
"""


def _inputs(rng):
    """The cases' inputs (16-bit values as float32, NaN where never read) and masks."""
    arrays, exact = {"params": np.array(json.dumps(PARAMS))}, []
    for n, (case, dtype) in enumerate(PARAMS):
        B, _, Tq, Tk, _, _, _ = case
        q, k, v, dout, m = draw(rng, case)
        q, k, v, dout = (x.astype(NP[dtype]).astype(np.float64) for x in (q, k, v, dout))
        rows = np.arange(Tq)[None, :] < (m["q_lengths"][:, None] if m["q_lengths"] is not None else Tq)
        keys = np.ones((B, Tk), bool)
        if m["k_lengths"] is not None:
            keys &= np.arange(Tk)[None, :] < m["k_lengths"][:, None]
        if m["key_mask"] is not None:
            keys &= m["key_mask"]
        arrays[f"{n}_q"], arrays[f"{n}_d"] = nan_padding(q, rows), nan_padding(dout, rows)
        arrays[f"{n}_k"], arrays[f"{n}_v"] = nan_padding(k, None, keys), nan_padding(v, None, keys)
        for key, val in m.items():
            if val is not None:
                arrays[f"{n}_{key}"] = np.asarray(val, np.int32 if key != "key_mask" else np.bool_)
        exact.append((q, k, v, dout, m, keys))
    B, T, H, D = QKV
    arrays["qkv_shape"] = np.array(QKV)
    arrays["qkv"] = rng.standard_normal((B, T, 3 * H * D)).astype(np.float32)
    arrays["qkv_dout"] = rng.standard_normal((B, T, H * D)).astype(np.float32)
    arrays["qkv_lengths"] = np.array([T, T // 2 + 7], np.int32)
    return arrays, exact


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Inputs, then the results of the "tc" and the "simple" child."""
    rng = np.random.default_rng(SEED)
    arrays, exact = _inputs(rng)
    tmp = tmp_path_factory.mktemp("attn_tc")
    np.savez(tmp / "in.npz", **arrays)
    results = {}
    for mode, env in MODES.items():
        p = run_python(CHILD, str(tmp / "in.npz"), str(tmp / f"{mode}.npz"), env=env, timeout=600)
        assert p.returncode == 0, f"{env} child failed (seed={SEED}):\n{p.stderr[-4000:]}"
        results[mode] = dict(np.load(tmp / f"{mode}.npz"))
    return arrays, exact, results


def tc_bounds(q, k, v, dout, m, causal, dtype, ref):
    """The elementwise error bounds of the module docstring (float64, (B, H, ...))."""
    B, _, Tq, D = q.shape
    Tk = k.shape[2]
    u, scale = U[dtype], 1.0 / np.sqrt(D)
    r_out, r_lse, r_dq, r_dk, r_dv = ref
    allowed = allowed_mask(B, Tq, Tk, causal, **m)[:, None]          # (B, 1, Tq, Tk)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    # P = exp(s - lse) where allowed, else 0 (rows without a key: lse = -inf, all 0)
    lse0 = np.where(np.isfinite(r_lse), r_lse, 0.0)[..., None]
    P = np.exp(np.where(allowed, s, -np.inf) - lse0)
    Pv = P @ np.abs(v)                                               # (B, H, Tq, D)
    dP = np.einsum("bhid,bhjd->bhij", dout, v)
    Di = np.sum(dout * r_out, -1, keepdims=True)
    dS = P * (dP - Di)
    Dsum = np.sum(np.abs(dout) * (np.abs(r_out) + Pv), -1, keepdims=True) * u
    E = u * np.abs(dS) + P * Dsum
    # float16 flushes p and scale * dS below 2^-14 to its subnormals: an absolute error
    # of up to 2^-25 per term (bfloat16 has fp32's range: none)
    tiny = 2.0**-25 if dtype == "float16" else 0.0
    mx = [np.abs(x).max() if x.size else 0.0 for x in (v, dout, q, k)]
    return {"out": 2 * (u * (Pv + np.abs(r_out)) + tiny * Tk * mx[0]),
            "dv": 2 * (u * (np.swapaxes(P, -1, -2) @ np.abs(dout) + np.abs(r_dv)) + tiny * Tq * mx[1]),
            "dk": 2 * (scale * (np.swapaxes(E, -1, -2) @ np.abs(q)) + u * np.abs(r_dk) + tiny * Tq * mx[2]),
            "dq": 2 * (scale * (E @ np.abs(k)) + u * np.abs(r_dq) + tiny * Tk * mx[3])}


def fp32_floor(x):
    """fp32 arithmetic (S, dP, the sums): ~1e-6 of the tensor's scale."""
    return 1e-5 * (np.abs(x).max() if x.size else 0.0)


@pytest.mark.parametrize("n", range(len(PARAMS)), ids=[f"{case_id(c)}-{dt}" for c, dt in PARAMS])
def test_tensor_cores_match_torch_float64_and_the_fallback(runs, n):
    _, exact, results = runs
    case, dtype = PARAMS[n]
    B, _, Tq, Tk, D, causal, _ = case
    q, k, v, dout, m, keys = exact[n]
    ref = reference(q, k, v, dout, allowed_mask(B, Tq, Tk, causal, **m), 1.0 / np.sqrt(D))
    bounds = tc_bounds(q, k, v, dout, m, causal, dtype, ref)
    simple = results["simple"]
    for mode in TC_MODES:
        check_tc_case(results[mode], simple, n, m, keys, ref, bounds,
                      f"seed={SEED} {case_id(case)} {dtype} {mode}")
    for name in ("dk", "dv"):  # the same code and products in both backward schedules
        a, b = results["tc"][f"{n}_{name}"], results["one-pass"][f"{n}_{name}"]
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{name}: the two backwards differ"


def check_tc_case(tc, simple, n, m, keys, ref, bounds, msg):
    """One case of one tensor-core child against float64 and the fallback."""
    case, _ = PARAMS[n]
    B, _, Tq, Tk, _, causal, _ = case
    assert bool(tc[f"{n}_det"]) and bool(simple[f"{n}_det"]), f"backward not deterministic; {msg}"
    no_key = ~allowed_mask(B, Tq, Tk, causal, **m).any(-1)          # (B, Tq)
    for i, name in enumerate(("out", "lse", "dq", "dk", "dv")):
        r = ref[i]
        got, alt = tc[f"{n}_{name}"].astype(np.float64), simple[f"{n}_{name}"].astype(np.float64)
        if name == "lse":
            check_close(got, r, 1e-5, f"lse (tc); {msg}")
            assert np.array_equal(np.isinf(got), np.isinf(alt)), f"lse -inf rows differ; {msg}"
            continue
        assert not np.isnan(got).any(), f"{name}: NaN; {msg}"
        bound = bounds[name] + fp32_floor(r)
        # the fallback is within u|ref| (+ its Di's share) of float64: 2x the bound covers both
        for what, err, b in (("tc vs float64", np.abs(got - r), bound),
                             ("tc vs fallback", np.abs(got - alt), 2 * bound)):
            bad = err > b
            if bad.any():
                idx = tuple(np.argwhere(bad)[0])
                pytest.fail(f"{name} {what}: {int(bad.sum())} of {bad.size} off, first at {idx}: tc "
                            f"{got[idx]!r}, fallback {alt[idx]!r}, float64 {r[idx]!r} (bound "
                            f"{b[idx]:.3g}); {msg}")
    check_zero(tc[f"{n}_out"], np.broadcast_to(no_key[:, None, :, None], tc[f"{n}_out"].shape), f"out; {msg}")
    check_zero(tc[f"{n}_dq"], np.broadcast_to(no_key[:, None, :, None], tc[f"{n}_dq"].shape), f"dq; {msg}")
    assert np.all(tc[f"{n}_lse"][np.broadcast_to(no_key[:, None], tc[f"{n}_lse"].shape)] == -np.inf), msg
    dead = np.broadcast_to(~keys[:, None, :, None], tc[f"{n}_dk"].shape)
    check_zero(tc[f"{n}_dk"], dead, f"dk; {msg}")
    check_zero(tc[f"{n}_dv"], dead, f"dv; {msg}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_cores_on_the_strided_qkv_layout(runs, dtype):
    """q, k, v as views into (B, T, 3C), out and dout (B, T, C): against float64."""
    arrays, _, results = runs
    B, T, H, D = QKV
    C = H * D
    qkv = arrays["qkv"].astype(NP[dtype]).astype(np.float64)
    dout = arrays["qkv_dout"].astype(NP[dtype]).astype(np.float64)
    lengths = arrays["qkv_lengths"]

    def heads(x):
        return x.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    def flat(x):
        return x.transpose(0, 2, 1, 3).reshape(B, T, C)

    q, k, v = heads(qkv[..., :C]), heads(qkv[..., C:2 * C]), heads(qkv[..., 2 * C:])
    m = {"q_lengths": lengths, "k_lengths": lengths, "key_mask": None}
    rows = np.arange(T)[None, :] < lengths[:, None]
    q = np.where(rows[:, None, :, None], q, 0.0)    # padding rows are never read: any value
    ref = reference(q, k, v, heads(dout) * rows[:, None, :, None], allowed_mask(B, T, T, True, **m),
                    1.0 / np.sqrt(D))
    bounds = tc_bounds(q, k, v, heads(dout) * rows[:, None, :, None], m, True, dtype, ref)
    msg = f"seed={SEED} qkv {QKV} {dtype}"
    for mode in TC_MODES:
        tc = results[mode]
        got = {"out": tc[f"qkv_{dtype}_out"]}
        dqkv = tc[f"qkv_{dtype}_dqkv"]
        got["dq"], got["dk"], got["dv"] = dqkv[..., :C], dqkv[..., C:2 * C], dqkv[..., 2 * C:]
        for name, i in (("out", 0), ("dq", 2), ("dk", 3), ("dv", 4)):
            r = flat(ref[i])
            b = flat(bounds[name]) + fp32_floor(r)
            err = np.abs(got[name].astype(np.float64) - r)
            assert not np.any(err > b), f"{name}: max err {err.max():.3g}; {msg} {mode}"
        check_close(tc[f"qkv_{dtype}_lse"].astype(np.float64), ref[1], 1e-5, f"lse; {msg} {mode}")


def test_forced_tensor_cores_refuse_what_they_cannot_run(runs):
    """PYXTTS_CUDA_ATTENTION=tc: float32 and D = 32 raise instead of falling back."""
    refusals = json.loads(str(runs[2]["tc"]["refusals"]))
    assert refusals["fp32"].startswith("NotImplementedError") and "bfloat16 or float16" in refusals["fp32"]
    assert refusals["d32"].startswith("NotImplementedError") and "64 or 128" in refusals["d32"]
    simple = json.loads(str(runs[2]["simple"]["refusals"]))
    assert simple == {"fp32": "ran", "d32": "ran"}


def test_a_bad_backward_switch_value_is_an_error():
    code = ("import numpy as np, pyxtts\n"
            "x = pyxtts.tensor(np.zeros((1, 1, 8, 64), np.float32), dtype=pyxtts.bfloat16, device='cuda:0')\n"
            "out, lse = pyxtts.attention_forward(x, x, x)\n"
            "pyxtts.attention_backward(x, x, x, x, out, lse)\n")
    p = run_python(code, env={"PYXTTS_CUDA_ATTENTION_BWD": "fast"})
    assert p.returncode != 0 and "PYXTTS_CUDA_ATTENTION_BWD=fast" in p.stderr, p.stderr[-2000:]
    assert "two-kernel or one-pass" in p.stderr, p.stderr[-2000:]


def test_a_bad_switch_value_is_an_error():
    code = ("import numpy as np, pyxtts\n"
            "x = pyxtts.tensor(np.zeros((1, 1, 8, 64), np.float32), dtype=pyxtts.bfloat16, device='cuda:0')\n"
            "pyxtts.attention_forward(x, x, x)\n")
    p = run_python(code, env={"PYXTTS_CUDA_ATTENTION": "fast"})
    assert p.returncode != 0 and "PYXTTS_CUDA_ATTENTION=fast" in p.stderr, p.stderr[-2000:]

"""The fused GEMM entry (_C._op_gemm_fused): a product with its epilogue.

Each epilogue against float64 NumPy on the operands as stored, on every device:
  none         D = alpha op(A) op(B) + beta C
  bias         D = ... + bias
  bias_gelu    pre = ... + bias, D = gelu_tanh(pre)
  dgelu_bgrad  D = (op(A) op(B)) * gelu_tanh'(pre), dbias += column sums of D
  bgrad_b      D = ..., dbias += column sums of op(B)
On the CPU the entry is the composition of the unfused ops, so its results are also
compared bit for bit with those ops called one by one. On a GPU the epilogues are
cuBLASLt's (where it has a kernel) and must agree with the CPU within the products'
rounding, and be the same bits on a second run.

Tolerances: products accumulate in fp32, 1e-5 of the summed magnitudes (as test_ops'
gemm tests: random signs stay far below the K u worst case); a 16-bit output adds half
an ulp of its dtype; GELU and its gradient evaluated by the kernels in float add a few
float32 roundings of their magnitude; bias gradients are double sums (CPU, and the GPU's
composition) or cuBLASLt's fp32 sums, 1e-5 of the summed magnitudes.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from conftest import NP_DTYPE, assert_bits_equal, requires_cuda, run_python
from helpers.arrays import f64, rand
from test_ops import GELU_K, U16, assert_within, gelu_grad_ref, gelu_ref

import pyxtts
from pyxtts import _C

pytestmark = pytest.mark.usefixtures("check_memory")

EPILOGUES = ["none", "bias", "bias_gelu", "dgelu_bgrad", "bgrad_b"]
XTTS_ROWS = 8 * 490


def on(device, a, dtype="float32"):
    return pyxtts.tensor(np.asarray(a), dtype=getattr(pyxtts, dtype), device=device)


def case(rng, epi, M, N, K, ta, tb, dt_ab, dt_c, beta):
    """Operands of one call (float32 arrays holding dtype values) and its kwargs."""
    A = rand(rng, (K, M) if ta else (M, K), dt_ab)
    B = rand(rng, (N, K) if tb else (K, N), dt_ab)
    ops = {"A": A, "B": B}
    if beta:
        ops["C"] = rand(rng, (M, N), dt_c)
    if epi in ("bias", "bias_gelu"):
        ops["bias"] = rand(rng, N, dt_c)
    if epi == "dgelu_bgrad":
        ops["pre"] = rand(rng, (M, N), dt_c, scale=2.0)
    if epi in ("dgelu_bgrad", "bgrad_b"):
        ops["dbias"] = rand(rng, N)
    alpha = 1.0 if epi in ("dgelu_bgrad", "bgrad_b") else 0.75
    return ops, alpha


def run(device, ops, epi, ta, tb, alpha, beta, dt_ab, dt_c):
    kw = {"epilogue": epi, "trans_a": ta, "trans_b": tb, "alpha": alpha, "beta": beta,
          "out_dtype": getattr(pyxtts, dt_c)}
    for k, v in ops.items():
        if k in ("A", "B"):
            continue
        kw[k] = on(device, v, "float32" if k == "dbias" else dt_c)
    return _C._op_gemm_fused(on(device, ops["A"], dt_ab), on(device, ops["B"], dt_ab), **kw)


def expected(ops, epi, ta, tb, alpha, beta):
    """float64 D, pre and dbias, and the magnitudes their tolerances scale with."""
    A, B = ops["A"].astype(np.float64), ops["B"].astype(np.float64)
    opA, opB = (A.T if ta else A), (B.T if tb else B)
    P = alpha * (opA @ opB)
    mag = abs(alpha) * (np.abs(opA) @ np.abs(opB))
    if beta:
        P = P + beta * ops["C"]
        mag = mag + abs(beta) * np.abs(ops["C"])
    # inter: what the composition rounds to a 16-bit output before its epilogue
    out = {"D": P, "P": P, "mag": mag, "inter": np.zeros_like(P)}
    if epi == "bias":
        out["D"] = P + ops["bias"]
        out["mag"] = mag + np.abs(ops["bias"])
        out["inter"] = np.abs(P)
    elif epi == "bias_gelu":
        out["pre"] = P + ops["bias"]
        out["mag"] = mag + np.abs(ops["bias"])
        out["inter"] = np.abs(P)
    elif epi == "dgelu_bgrad":
        x = ops["pre"].astype(np.float64)
        g = gelu_grad_ref(x)
        out["D"] = P * g
        # gelu' in float errs by a few roundings of its terms, times exp's amplification
        # |2u| (test_ops' bound), plus float32's normal range in the far negative tail
        u = GELU_K * (x + 0.044715 * x**3)
        sg = 1 / (1 + np.exp(np.minimum(-2 * u, 700)))
        du = GELU_K * (1 + 3 * 0.044715 * x**2)
        gerr = (12 + 6 * np.abs(2 * u)) * 2.0**-24 * (sg + np.abs(2 * x * sg * (1 - sg) * du))
        gerr = gerr + 2.0**-126 * (1 + np.abs(2 * x * du))
        out["mag"] = mag * np.abs(g) + 1e5 * np.abs(P) * gerr  # (tolerances take 1e-5 of mag)
        out["inter"] = np.abs(P * g)
        out["dbias"] = ops["dbias"] + out["D"].sum(0)
        out["dbias_mag"] = np.abs(ops["dbias"]) + out["mag"].sum(0)
    elif epi == "bgrad_b":
        out["dbias"] = ops["dbias"] + opB.sum(0)
        out["dbias_mag"] = np.abs(ops["dbias"]) + np.abs(opB).sum(0)
    return out


# cuBLASLt's GELU epilogues (the GPU's bias_gelu and dgelu_bgrad) evaluate the tanh form
# with a fast tanh, and from the float32 accumulator rather than the stored pre. Measured on
# an H200 (cuBLASLt 13.1): 1.9e-5 relative in the body, 0 (flushed) below x ~ -5 where the
# exact value is ~ -5e-7, and gelu' flushed to 0 where it is ~ -5e-4. Their tanh is taken
# to be no worse than PTX's tanh.approx.f32 (absolute error 2^-10.987; 2^-10 here), which
# bounds, in float64 terms, |gelu_lt - gelu| <= 0.5 |x| E and
# |gelu_lt' - gelu'| <= 0.5 E (1 + 2 |x| u'(x)), u' = k (1 + 3 * 0.044715 x^2).
LT_TANH_ERR = 2.0**-10


def lt_gelu_err(x):
    return 0.5 * np.abs(x) * LT_TANH_ERR


def lt_gelu_grad_err(x):
    du = GELU_K * (1 + 3 * 0.044715 * x * x)
    return 0.5 * LT_TANH_ERR * (1 + 2 * np.abs(x) * du)


SHAPES = [(1, 1, 1), (3, 5, 7), (37, 24, 16), (150, 300, 33)]
PAIRS = [("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16"),
         ("bfloat16", "float32")]


@pytest.mark.parametrize("dt_ab,dt_c", PAIRS, ids=lambda p: p)
@pytest.mark.parametrize("epi", EPILOGUES)
@pytest.mark.parametrize("M,N,K", SHAPES, ids=str)
def test_epilogues_against_float64(device, rng, seed, M, N, K, epi, dt_ab, dt_c):
    for ta, tb in [(False, False), (True, False), (False, True), (True, True)]:
        if epi == "bgrad_b" and tb:
            continue
        for beta in ([0.0] if epi == "dgelu_bgrad" else [0.0, -0.5]):
            ops, alpha = case(rng, epi, M, N, K, ta, tb, dt_ab, dt_c, beta)
            D, pre, dbias = run(device, ops, epi, ta, tb, alpha, beta, dt_ab, dt_c)
            want = expected(ops, epi, ta, tb, alpha, beta)
            msg = f"seed={seed} {M, N, K} {epi} {dt_ab}->{dt_c} trans={ta},{tb} beta={beta} on {device}"
            u = U16.get(dt_c, 0.0)
            tiny = 2.0**-25 if dt_c == "float16" else 1e-30  # half float16's subnormal spacing
            # a 16-bit output: half an ulp, plus one of the intermediate the composition stores
            if epi == "bias_gelu":
                assert_within(f64(pre), want["pre"],
                              1e-5 * want["mag"] + u * (np.abs(want["pre"]) + want["inter"]) + tiny,
                              msg + " pre")
                # D is gelu of the stored pre evaluated in float (test_ops' bound: exp
                # amplifies u's relative error by |2u|), rounded once to the output
                p64 = f64(pre)
                g = gelu_ref(p64)
                z = 2 * GELU_K * np.abs(p64 + 0.044715 * p64**3)
                tol = (u + (8 + 6 * z) * 2.0**-24) * np.abs(g) + tiny
                if device != "cpu":  # cuBLASLt's GELU, of the accumulator pre rounds (gelu' < 1.13)
                    tol = tol + lt_gelu_err(p64) + 1.13 * u * np.abs(p64)
                assert_within(f64(D), g, tol, msg + " D")
            else:
                tol = 1e-5 * want["mag"] + u * (np.abs(want["D"]) + want["inter"]) + tiny
                if epi == "dgelu_bgrad" and device != "cpu":  # cuBLASLt's gelu'
                    tol = tol + np.abs(want["P"]) * lt_gelu_grad_err(ops["pre"].astype(np.float64))
                assert_within(f64(D), want["D"], tol, msg + " D")
            if "dbias" in want:
                tol = 1e-5 * want["dbias_mag"] + 1e-30
                if epi == "dgelu_bgrad":  # the sums read D as stored: its roundings too
                    tol = tol + u * (np.abs(want["D"]) + want["inter"]).sum(0)
                    if device != "cpu":
                        tol = tol + (np.abs(want["P"]) * lt_gelu_grad_err(ops["pre"].astype(np.float64))).sum(0)
                assert_within(f64(dbias), want["dbias"], tol, msg + " dbias")


@pytest.mark.parametrize("epi", EPILOGUES)
def test_cpu_is_the_composition_of_the_ops(rng, seed, epi):
    M, N, K = 67, 45, 33
    for dt_ab, dt_c in [("float32", "float32"), ("bfloat16", "bfloat16"), ("bfloat16", "float32")]:
        ops, alpha = case(rng, epi, M, N, K, True, False, dt_ab, dt_c, 0.0 if epi == "dgelu_bgrad" else 0.5)
        beta = 0.0 if epi == "dgelu_bgrad" else 0.5
        D, pre, dbias = run("cpu", ops, epi, True, False, alpha, beta, dt_ab, dt_c)
        C = on("cpu", ops.get("C", np.zeros((M, N), np.float32)), dt_c)
        P = _C._op_gemm(on("cpu", ops["A"], dt_ab), on("cpu", ops["B"], dt_ab), trans_a=True,
                        alpha=alpha, beta=beta, C=C, out_dtype=getattr(pyxtts, dt_c))
        msg = f"seed={seed} {epi} {dt_ab}->{dt_c}"
        if epi in ("bias", "bias_gelu"):
            _C._op_add_bias(P, on("cpu", ops["bias"], dt_c))
        if epi == "bias_gelu":
            assert_bits_equal(pre.numpy(), P.numpy(), msg + " pre")
            P = _C._op_gelu_forward(P)
        if epi == "dgelu_bgrad":
            P = _C._op_gelu_backward(on("cpu", ops["pre"], dt_c), P)
            assert_bits_equal(dbias.numpy(), _C._op_bias_backward(P, dbias=on("cpu", ops["dbias"])).numpy(),
                              msg + " dbias")
        if epi == "bgrad_b":
            want = _C._op_bias_backward(on("cpu", ops["B"], dt_ab), dbias=on("cpu", ops["dbias"]))
            assert_bits_equal(dbias.numpy(), want.numpy(), msg + " dbias")
        assert_bits_equal(D.numpy(), P.numpy(), msg + " D")


def test_accumulates_into_D_and_C_may_be_D(device, rng, seed):
    """beta with no C accumulates into the given D (the weight gradients' use); C given
    as D itself is the same; D stays the very tensor passed."""
    A, B = rand(rng, (40, 24)), rand(rng, (40, 16))
    D0, db0 = rand(rng, (24, 16)), rand(rng, 16)
    D, dbias = on(device, D0), on(device, db0)
    got = _C._op_gemm_fused(on(device, A), on(device, B), epilogue="bgrad_b", trans_a=True, beta=1.0,
                            D=D, dbias=dbias)
    assert got[0] is D and got[2] is dbias
    want = D0 + A.astype(np.float64).T @ B
    assert_within(f64(D), want, 1e-5 * (np.abs(A).T @ np.abs(B) + np.abs(D0)), f"seed={seed} D")
    assert_within(f64(dbias), db0 + B.astype(np.float64).sum(0), 1e-5 * (np.abs(B).sum(0) + np.abs(db0)),
                  f"seed={seed} dbias")
    again = on(device, D0)
    _C._op_gemm_fused(on(device, A), on(device, B), trans_a=True, beta=1.0, C=again, D=again)
    assert_within(f64(again), want, 1e-5 * (np.abs(A).T @ np.abs(B) + np.abs(D0)), f"seed={seed} C is D")


def test_bad_arguments_name_the_argument():
    A, B = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32)
    with pytest.raises(ValueError, match="^epilogue: expected one of 'none', 'bias'"):
        _C._op_gemm_fused(A, B, epilogue="relu")
    with pytest.raises(ValueError, match="^pre: the 'dgelu_bgrad' epilogue reads it; got None"):
        _C._op_gemm_fused(A, B, epilogue="dgelu_bgrad")
    with pytest.raises(ValueError, match=r"needs alpha = 1 and beta = 0, got 2 and 0"):
        _C._op_gemm_fused(A, B, epilogue="dgelu_bgrad", alpha=2.0, pre=np.ones((4, 5), np.float32))
    with pytest.raises(ValueError, match="needs alpha = 1 and B not transposed"):
        _C._op_gemm_fused(A, B.T.copy(), epilogue="bgrad_b", trans_b=True)
    with pytest.raises(ValueError, match="bias is NULL"):
        _C._op_gemm_fused(A, B, epilogue="bias")
    with pytest.raises(TypeError, match="^bias: expected dtype float32, got bfloat16"):
        _C._op_gemm_fused(A, B, epilogue="bias", bias=pyxtts.tensor(np.ones(5), dtype=pyxtts.bfloat16))
    with pytest.raises(ValueError, match=r"^bias: expected shape \(5\), got \(4\)"):
        _C._op_gemm_fused(A, B, epilogue="bias", bias=np.ones(4, np.float32))
    with pytest.raises(ValueError, match="^beta: must be 0 when neither C nor D is given"):
        _C._op_gemm_fused(A, B, beta=1.0)
    S = pyxtts.tensor(np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match="^D: must not share memory with the inputs"):
        _C._op_gemm_fused(S, np.ones((4, 4), np.float32), D=S)


# ---- the GPU: cuBLASLt's epilogues against the CPU ------------------------------------------

GPU_SHAPES = [(37, 24, 16), (XTTS_ROWS, 3072, 1024), (XTTS_ROWS, 4096, 1024), (XTTS_ROWS, 1024, 4096),
              (1024, 4096, XTTS_ROWS)]


@requires_cuda
@pytest.mark.parametrize("epi", EPILOGUES)
@pytest.mark.parametrize("M,N,K", GPU_SHAPES, ids=str)
def test_gpu_agrees_with_cpu_and_is_deterministic(rng, seed, M, N, K, epi):
    # the engine's uses: bias / bias_gelu (forward), dgelu_bgrad (dfc), bgrad_b (dW, fp32 out)
    ta, tb = (True, False) if epi == "bgrad_b" else (False, epi == "dgelu_bgrad")
    dt_c = "float32" if epi == "bgrad_b" else "bfloat16"
    beta = 1.0 if epi in ("bgrad_b", "none") else 0.0
    ops, alpha = case(rng, epi, M, N, K, ta, tb, "bfloat16", dt_c, beta)
    cpu = run("cpu", ops, epi, ta, tb, alpha, beta, "bfloat16", dt_c)
    gpu = run("cuda:0", ops, epi, ta, tb, alpha, beta, "bfloat16", dt_c)
    again = run("cuda:0", ops, epi, ta, tb, alpha, beta, "bfloat16", dt_c)
    want = expected(ops, epi, ta, tb, alpha, beta)
    msg = f"seed={seed} {M, N, K} {epi}"
    u = U16.get(dt_c, 0.0)
    for name, g, c, a in zip(("D", "pre", "dbias"), gpu, cpu, again):
        if g is None:
            continue
        assert_bits_equal(g.numpy(), a.numpy(), f"{msg} {name}: not deterministic")
        # the CPU's composition rounds the product to bf16 before its epilogue (inter); the
        # GPU's tensor cores accumulate with truncation (Fasi et al., "Numerical behavior of
        # NVIDIA tensor cores", 2021), so their error takes the classical K u bound with
        # u = 2^-23 (seen at K = 1024: 1.6e-5 of the summed magnitudes, over the CPU's 1e-5)
        acc = (1e-5 + K * 2.0**-23) * want["mag"]
        if epi == "dgelu_bgrad":
            lt = np.abs(want["P"]) * lt_gelu_grad_err(ops["pre"].astype(np.float64))
        if name == "dbias":
            tol = 1e-5 * want["dbias_mag"]
            if epi == "dgelu_bgrad":
                tol = tol + (acc + u * (np.abs(want["D"]) + want["inter"]) + lt).sum(0)
        else:
            ref = f64(c)
            tol = acc + 2 * u * np.abs(ref) + u * want["inter"] + 1e-30
            if name == "D" and epi == "bias_gelu":  # gelu of pre values that may differ by an ulp
                p = np.abs(f64(gpu[1]))
                tol = tol + 2 * u * p + lt_gelu_err(p)
            if name == "D" and epi == "dgelu_bgrad":
                tol = tol + lt
        assert_within(f64(g), f64(c), tol, f"{msg} {name} vs the CPU")


@requires_cuda
def test_gpu_takes_cublaslt_at_xtts_shapes():
    """With PYXTTS_CUDA_GEMM_FUSED=lt a case cuBLASLt has no kernel for is an error, so
    this proves which of the engine's products at XTTS v2 sizes run fused, and that they
    agree with the composition (PYXTTS_CUDA_GEMM_FUSED=composed). The forward's bias and
    bias + GELU products and the weight gradients with their bias gradients must; fc's
    GELU gradient with its bias gradient may not: cuBLASLt 13.1 on an H200 has no
    DGELU_BGRAD kernel for bf16 at (3920, 4096, 1024), so the engine composes it there
    (docs/gpu.md), and the test says which it was."""
    code = """
import numpy as np, os, sys, pyxtts
from pyxtts import _C
rng = np.random.default_rng(int(os.environ["PYXTTS_TEST_SEED"]))  # both runs draw the same
M, C = 8 * 490, 1024
def t(a, dt): return pyxtts.tensor(a.astype(np.float32), dtype=getattr(pyxtts, dt), device="cuda:0")
x, w, b = rng.standard_normal((M, C)), rng.standard_normal((C, 4 * C)) * 0.03, rng.standard_normal(4 * C)
out = {}
out["D"], out["pre"], _ = _C._op_gemm_fused(t(x, "bfloat16"), t(w, "bfloat16"), epilogue="bias_gelu",
                                            bias=t(b, "bfloat16"))
dy = rng.standard_normal((M, C))
try:  # fc_proj's weight (4C, C) gives dy (M, C) @ W^T the shape of pre (M, 4C)
    out["D2"], _, out["db"] = _C._op_gemm_fused(t(dy, "bfloat16"), t(np.ascontiguousarray(w.T), "bfloat16"),
                                                epilogue="dgelu_bgrad", trans_b=True, pre=out["pre"])
except NotImplementedError as exc:
    print("dgelu_bgrad:", exc)
out["dW"], _, out["db2"] = _C._op_gemm_fused(t(x, "bfloat16"), t(dy, "bfloat16"), epilogue="bgrad_b",
                                             trans_a=True, out_dtype=pyxtts.float32)
out["y"], _, _ = _C._op_gemm_fused(t(x, "bfloat16"), t(w[:, :C], "bfloat16"), epilogue="bias",
                                   bias=t(b[:C], "bfloat16"), beta=1.0, C=t(dy, "bfloat16"))
np.savez(sys.argv[1], **{k: v.numpy().astype(np.float32) for k, v in out.items()})
"""
    outs = {}
    for mode in ("lt", "composed"):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "out.npz")
            p = run_python(code, path, env={"PYXTTS_CUDA_GEMM_FUSED": mode}, timeout=300)
            assert p.returncode == 0, f"PYXTTS_CUDA_GEMM_FUSED={mode}:\n{p.stdout}{p.stderr}"
            with np.load(path) as z:
                outs[mode] = {k: z[k].astype(np.float64) for k in z.files}
            if mode == "lt" and "D2" not in outs[mode]:
                assert "no kernel" in p.stdout, p.stdout
                print(p.stdout.strip())  # shown with -rP / -s: the product the engine composes
    lt, comp = outs["lt"], outs["composed"]
    assert set(comp) == {"D", "pre", "D2", "db", "dW", "db2", "y"}
    assert {"D", "pre", "dW", "db2", "y"} <= set(lt), "a forward or weight-gradient product is not fused"
    for k, v in lt.items():
        scale = np.abs(comp[k]).max()
        assert np.isfinite(v).all(), k
        assert np.abs(v - comp[k]).max() <= 2e-2 * scale, f"{k}: cuBLASLt's epilogue and the composition disagree"

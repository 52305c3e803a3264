"""The CUDA backend's kernels against the CPU backend (the reference), element by
element. Skipped without a GPU.

What must match how. Ops whose CUDA version does the CPU's float operations in the
CPU's order give the CPU's bits: add_bias, add, bias_backward and layernorm's
dweight/dbias (column sums in double, rows in order), embedding forward and backward
(additions in index order), AdamW (-fmad=false build). Ops with an exp (gelu, xent),
a different reduction order (layernorm rows, sum, cuBLAS) or another tiling
(attention) are checked to a few float32 roundings of the magnitudes involved, and
their CUDA results must be the same bits on a second run (determinism).
attention is also checked against torch float64 by tests/test_attention.py, whose
tests take the `device` fixture and so run on "cuda:0" too.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import NP_DTYPE, assert_bits_equal, requires_cuda
from helpers.arrays import f64, rand

import pyxtts
from pyxtts import _C

pytestmark = [requires_cuda, pytest.mark.usefixtures("check_memory")]

GPU = "cuda:0"
U = 2.0**-24
FLOATS = ["float32", "float16", "bfloat16"]
HALF = ["float16", "bfloat16"]
U16 = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
N_REAL = 8 * 430


def pair(a, dtype="float32"):
    """The same values as a CPU tensor and a GPU tensor of `dtype`."""
    dt = getattr(pyxtts, dtype)
    return pyxtts.tensor(np.asarray(a), dtype=dt), pyxtts.tensor(np.asarray(a), dtype=dt, device=GPU)


def close(gpu, cpu, tol, msg):
    g, c = f64(gpu), f64(cpu)
    assert g.shape == c.shape, msg
    err = np.abs(g - c)
    bad = ~(err <= np.broadcast_to(tol, c.shape))
    assert not bad.any(), f"{int(bad.sum())} of {bad.size} off, max err {err.max():.3g}; {msg}"


def same_bits(gpu, cpu, msg):
    assert_bits_equal(gpu.numpy(), cpu.numpy(), msg)


# ---- matmul ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (3, 5, 7), (150, 300, 33), (N_REAL // 8, 1026, 256)], ids=str)
def test_gemm_fp32(rng, seed, M, N, K, ta, tb):
    A = rand(rng, (K, M) if ta else (M, K))
    B = rand(rng, (N, K) if tb else (K, N))
    C0 = rand(rng, (M, N))
    (a, ag), (b, bg) = pair(A), pair(B)
    (c, cg) = pair(C0)
    ref = _C._op_gemm(a, b, trans_a=ta, trans_b=tb, alpha=0.5, beta=-2.0, C=c)
    got = _C._op_gemm(ag, bg, trans_a=ta, trans_b=tb, alpha=0.5, beta=-2.0, C=cg)
    opA, opB = (A.T if ta else A).astype(np.float64), (B.T if tb else B).astype(np.float64)
    terms = 0.5 * np.abs(opA) @ np.abs(opB) + 2.0 * np.abs(C0)
    close(got, ref, 4e-6 * terms + 1e-30, f"seed={seed} {M, N, K} ta={ta} tb={tb}")


@pytest.mark.parametrize("out_dtype", FLOATS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("M,N,K", [(3, 5, 7), (150, 300, 33), (N_REAL // 4, 300, 256)], ids=str)
def test_gemm_mixed(rng, seed, M, N, K, dtype, out_dtype):
    """Every (A/B dtype, C dtype) pair, with beta, incl. float32 A/B into a 16-bit C (staged)."""
    A, B, C0 = rand(rng, (M, K), dtype=dtype), rand(rng, (N, K), dtype=dtype), rand(rng, (M, N), dtype=out_dtype)
    (a, ag), (b, bg) = pair(A, dtype), pair(B, dtype)
    c, cg = pair(C0, out_dtype)
    ref = _C._op_gemm(a, b, trans_b=True, beta=1.0, C=c, out_dtype=getattr(pyxtts, out_dtype))
    got = _C._op_gemm(ag, bg, trans_b=True, beta=1.0, C=cg, out_dtype=getattr(pyxtts, out_dtype))
    assert got.dtype is getattr(pyxtts, out_dtype)
    exact = A.astype(np.float64) @ B.T.astype(np.float64) + C0
    terms = np.abs(A.astype(np.float64)) @ np.abs(B.T.astype(np.float64)) + np.abs(C0)
    u = U16.get(out_dtype, 0.0)
    # both are the fp32 sum rounded once: each within half an ulp16 of it
    close(got, ref, 2 * u * np.abs(exact) + 8e-6 * terms + 1e-30, f"seed={seed} {dtype}->{out_dtype}")


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype,out_dtype", [("float32", "float32"), ("bfloat16", "float32"),
                                             ("bfloat16", "bfloat16"), ("float32", "bfloat16")])
def test_gemm_of_wider_operands(rng, seed, ta, tb, dtype, out_dtype):
    """The heads' products: rows further apart than the product's widths (gemm_ld), the
    extra columns of A and B NaN (never read), C's kept; k = 0 too."""
    M, N, K = 256, 6681, 64

    def wider(x, pad, fill, dt):
        return np.concatenate([x, np.full((x.shape[0], pad), fill, NP_DTYPE[dt])], 1)

    A = rand(rng, (K, M) if ta else (M, K), dtype=dtype)
    B = rand(rng, (N, K) if tb else (K, N), dtype=dtype)
    C0 = rand(rng, (M, N), dtype=out_dtype)
    (a, ag), (b, bg) = pair(wider(A, 8, np.nan, dtype), dtype), pair(wider(B, 3, np.nan, dtype), dtype)
    c, cg = pair(wider(C0, 7, 5.0, out_dtype), out_dtype)
    kw = dict(trans_a=ta, trans_b=tb, alpha=0.5, beta=-2.0, out_dtype=getattr(pyxtts, out_dtype), sizes=(M, N, K))
    ref = _C._op_gemm(a, b, C=c, **kw)
    got = _C._op_gemm(ag, bg, C=cg, **kw)
    opA, opB = (A.T if ta else A).astype(np.float64), (B.T if tb else B).astype(np.float64)
    exact = 0.5 * opA @ opB - 2.0 * C0.astype(np.float64)
    terms = 0.5 * np.abs(opA) @ np.abs(opB) + 2.0 * np.abs(C0.astype(np.float64))
    u = U16.get(out_dtype, 0.0)
    msg = f"seed={seed} {dtype}->{out_dtype} ta={ta} tb={tb}"
    close(got.numpy()[:, :N], ref.numpy()[:, :N], 2 * u * np.abs(exact) + 8e-6 * terms + 1e-30, msg)
    assert np.all(f64(got)[:, N:] == 5.0), msg + ": C's columns past N"
    k0 = dict(kw, sizes=(M, N, 0))
    same_bits(_C._op_gemm(ag, bg, C=cg, **k0), _C._op_gemm(a, b, C=c, **k0), msg + " k = 0")


def test_gemm_k0_and_fresh_output(rng):
    A, B = np.zeros((4, 0), np.float32), np.zeros((0, 3), np.float32)
    C0 = rand(rng, (4, 3))
    (a, ag), (b, bg), (c, cg) = pair(A), pair(B), pair(C0)
    same_bits(_C._op_gemm(ag, bg, beta=0.5, C=cg), _C._op_gemm(a, b, beta=0.5, C=c), "k = 0")
    out = _C._op_gemm(ag, bg)
    assert np.array_equal(out.numpy(), np.zeros((4, 3), np.float32))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("M,N", [(1, 1), (7, 3), (130, 70), (N_REAL, 1024)], ids=str)
def test_bias_forward_and_backward_are_the_cpus_bits(rng, seed, M, N, dtype):
    out0, bias0, dout = rand(rng, (M, N), dtype=dtype), rand(rng, N, dtype=dtype), rand(rng, (M, N), dtype=dtype)
    (o, og), (b, bg) = pair(out0, dtype), pair(bias0, dtype)
    _C._op_add_bias(o, b)
    _C._op_add_bias(og, bg)
    same_bits(og, o, f"add_bias seed={seed}")
    d, dg = pair(dout, dtype)
    db0 = rand(rng, N)
    (db, dbg) = pair(db0)
    same_bits(_C._op_bias_backward(dg, dbias=dbg), _C._op_bias_backward(d, dbias=db), f"bias_backward seed={seed}")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("M,N,ld", [(7, 3, 8), (256, 6681, 6688), (N_REAL, 1026, 1032)], ids=str)
def test_bias_backward_of_leading_columns_is_the_cpus_bits(rng, seed, M, N, ld, dtype):
    dout = rand(rng, (M, ld), dtype=dtype)
    dout[:, N:] = np.nan  # never read
    d, dg = pair(dout, dtype)
    db, dbg = pair(rand(rng, N))
    same_bits(_C._op_bias_backward(dg, dbias=dbg, cols=N), _C._op_bias_backward(d, dbias=db, cols=N),
              f"seed={seed} {M, N, ld} {dtype}")


# ---- layernorm, gelu, add ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 8), (5, 33), (N_REAL, 1024)], ids=str)
def test_layernorm(rng, seed, shape, dtype):
    C = shape[-1]
    x0 = rand(rng, shape, dtype, scale=2.0) + np.float32(0.5)
    x0 = x0.astype(NP_DTYPE[dtype]).astype(np.float32)
    w0, b0, dout = rand(rng, C, dtype=dtype), rand(rng, C, dtype=dtype), rand(rng, shape, dtype=dtype)
    (x, xg), (w, wg), (b, bg), (d, dg) = pair(x0, dtype), pair(w0, dtype), pair(b0, dtype), pair(dout, dtype)
    out, mean, rstd = _C._op_layernorm_forward(x, w, b)
    outg, meang, rstdg = _C._op_layernorm_forward(xg, wg, bg)
    msg = f"seed={seed} {shape} {dtype}"
    close(meang, mean, 1e-6 * (np.abs(x0).mean(-1) + 1e-30), f"mean; {msg}")
    close(rstdg, rstd, 4 * U * f64(rstd), f"rstd; {msg}")
    u = U16.get(dtype, 0.0)
    close(outg, out, (2 * u + 1e-5) * (np.abs(f64(out)) + np.abs(b0) + 1e-3), f"out; {msg}")
    # the backward from the CPU's statistics on both: dweight, dbias are the CPU's bits
    (m, mg), (r, rg) = pair(mean.numpy()), pair(rstd.numpy())
    dinp0 = rand(rng, shape, dtype=dtype)
    (di, dig), (dw, dwg), (dbb, dbg) = pair(dinp0, dtype), pair(np.ones(C, np.float32)), pair(np.ones(C, np.float32))
    _C._op_layernorm_backward(d, x, w, m, r, dinp=di, dweight=dw, dbias=dbb)
    _C._op_layernorm_backward(dg, xg, wg, mg, rg, dinp=dig, dweight=dwg, dbias=dbg)
    same_bits(dwg, dw, f"dweight; {msg}")
    same_bits(dbg, dbb, f"dbias; {msg}")
    g = np.abs(dout * w0)
    terms = f64(r)[:, None] * (g + g.mean(-1, keepdims=True) * 3) + np.abs(dinp0)
    close(dig, di, (2 * u + 1e-5) * (terms + np.abs(f64(di))), f"dinp; {msg}")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [1, 7, 5 * 33, N_REAL * 1024])
def test_gelu_and_add(rng, seed, n, dtype):
    x0 = rand(rng, n, dtype, scale=3.0)
    x0[: min(n, 4)] = np.array([-200.0, 200.0, -9.0, 0.0], np.float32)[: min(n, 4)]
    dout = rand(rng, n, dtype=dtype)
    (x, xg), (d, dg) = pair(x0, dtype), pair(dout, dtype)
    msg = f"seed={seed} n={n} {dtype}"
    u = U16.get(dtype, 0.0)
    y, yg = _C._op_gelu_forward(x), _C._op_gelu_forward(xg)
    close(yg, y, (2 * u + 8 * U) * np.abs(f64(y)) + 1e-37, f"gelu; {msg}")
    gx, gxg = _C._op_gelu_backward(x, d), _C._op_gelu_backward(xg, dg)
    close(gxg, gx, (2 * u + 8 * U) * (np.abs(f64(gx)) + np.abs(dout)) + 1e-37, f"gelu'; {msg}")
    same_bits(_C._op_add(xg, dg), _C._op_add(x, d), f"add; {msg}")


# ---- embedding --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("N,V,C", [(1, 1, 1), (10, 7, 5), (N_REAL, 1026, 256), (1000, 3, 130)], ids=str)
def test_embedding_is_the_cpus_bits(rng, seed, N, V, C, dtype):
    ids0 = rng.integers(0, V, N).astype(np.int32)
    table0, out0, dout = rand(rng, (V, C), dtype=dtype), rand(rng, (N, C), dtype=dtype), rand(rng, (N, C), dtype=dtype)
    (ids, idsg), (t, tg) = pair(ids0, "int32"), pair(table0, dtype)
    msg = f"seed={seed} {N, V, C} {dtype}"
    same_bits(_C._op_embedding_forward(idsg, tg), _C._op_embedding_forward(ids, t), f"forward; {msg}")
    o, og = pair(out0, dtype)
    _C._op_embedding_forward(ids, t, out=o)
    _C._op_embedding_forward(idsg, tg, out=og)
    same_bits(og, o, f"forward +=; {msg}")
    d, dg = pair(dout, dtype)
    dt0 = rand(rng, (V, C))
    (dt, dtg) = pair(dt0)
    _C._op_embedding_backward(ids, d, V, dtable=dt)
    _C._op_embedding_backward(idsg, dg, V, dtable=dtg)
    same_bits(dtg, dt, f"backward (repeated ids, in order); {msg}")


# ---- cross-entropy and sum ----------------------------------------------------------------------


@pytest.mark.parametrize("N,V", [(1, 1), (1, 2), (6, 5), (N_REAL // 2, 1026), (N_REAL, 6681)], ids=str)
def test_softmax_xent(rng, seed, N, V):
    logits0 = rand(rng, (N, V), scale=4.0)
    targets0 = rng.integers(-1, V, N).astype(np.int32)
    (lg, lgg), (tg, tgg) = pair(logits0), pair(targets0, "int32")
    msg = f"seed={seed} {N, V}"
    for backward in (False, True):
        loss, grad = _C._op_softmax_xent(lg, tg, scale=0.25, backward=backward)
        lossg, gradg = _C._op_softmax_xent(lgg, tgg, scale=0.25, backward=backward)
        lse_terms = np.abs(logits0).max(-1) + np.log(V) + 1
        close(lossg, loss, 1e-6 * lse_terms, f"losses; {msg}")
        assert np.all(lossg.numpy()[targets0 < 0] == 0), msg
        if backward:
            # softmax - onehot cancels at the target: allow an absolute error of a few
            # roundings of the softmax (~1) there
            hot = np.zeros((N, V))
            hot[targets0 >= 0, targets0[targets0 >= 0]] = 1
            close(gradg, grad, 1e-5 * np.abs(f64(grad)) + 0.25 * 1e-6 * hot + 1e-30, f"dlogits; {msg}")
            assert np.all(gradg.numpy()[targets0 < 0] == 0), msg
            again = _C._op_softmax_xent(lgg, tgg, scale=0.25)[1]
            same_bits(again, gradg, f"deterministic; {msg}")


@pytest.mark.parametrize("N,V,ld", [(6, 5, 8), (256, 6681, 6688), (256, 1026, 1032)], ids=str)
def test_softmax_xent_of_leading_columns_with_a_bias(rng, seed, N, V, ld):
    """The heads' call: rows ld apart, the bias added inside, the pad columns zeroed."""
    logits0 = rand(rng, (N, ld), scale=4.0)
    logits0[:, V:] = np.nan  # never read
    bias0 = rand(rng, V)
    targets0 = rng.integers(-1, V, N).astype(np.int32)
    (lg, lgg), (tg, tgg), (b, bg) = pair(logits0), pair(targets0, "int32"), pair(bias0)
    msg = f"seed={seed} {N, V, ld}"
    for backward in (False, True):
        loss, grad = _C._op_softmax_xent(lg, tg, scale=0.25, backward=backward, bias=b, vocab=V)
        lossg, gradg = _C._op_softmax_xent(lgg, tgg, scale=0.25, backward=backward, bias=bg, vocab=V)
        lse_terms = np.abs(logits0[:, :V] + bias0).max(-1) + np.log(V) + 1
        close(lossg, loss, 1e-6 * lse_terms, f"losses; {msg}")
        if backward:
            hot = np.zeros((N, V))
            hot[targets0 >= 0, targets0[targets0 >= 0]] = 1
            g, c = gradg.numpy(), grad.numpy()
            close(g[:, :V], c[:, :V], 1e-5 * np.abs(f64(c[:, :V])) + 0.25 * 1e-6 * hot + 1e-30, f"dlogits; {msg}")
            assert np.array_equal(g[:, V:], np.zeros((N, ld - V), np.float32)), msg + ": the pad columns"


@pytest.mark.parametrize("n", [0, 1, 3, 255, 257, 100_003, N_REAL * 1026])
def test_sum(rng, seed, n):
    x0 = rand(rng, n) + np.float32(1.0)
    x, xg = pair(x0)
    want, got = _C._op_sum(x), _C._op_sum(xg)
    assert abs(got - want) <= 1e-13 * np.abs(x0.astype(np.float64)).sum() + 1e-300, f"seed={seed} n={n}"
    assert _C._op_sum(xg) == got  # the same bits every run


# ---- attention: the model's strided layout, determinism ------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B,T,H,D", [(2, 37, 4, 64), (2, 70, 2, 128), (1, 5, 3, 16)], ids=str)
def test_attention_qkv_layout_matches_cpu(rng, seed, B, T, H, D, causal, dtype):
    C = H * D
    qkv0 = rand(rng, (B, T, 3 * C), dtype=dtype)
    dout0 = rand(rng, (B, T, C), dtype=dtype)
    (qkv, qkvg), (d, dg) = pair(qkv0, dtype), pair(dout0, dtype)
    lengths = np.array([T, max(1, T // 2)][:B], np.int32)
    out, lse = _C._attention_qkv_forward(qkv, H, causal=causal, q_lengths=lengths, k_lengths=lengths)
    outg, lseg = _C._attention_qkv_forward(qkvg, H, causal=causal, q_lengths=lengths, k_lengths=lengths)
    msg = f"seed={seed} {B, T, H, D} causal={causal} {dtype}"
    u = U16.get(dtype, 0.0)
    close(outg, out, (2 * u + 1e-5) * (np.abs(f64(out)) + np.abs(f64(out)).max()), f"out; {msg}")
    lc, lgp = lse.numpy(), lseg.numpy()
    assert np.array_equal(np.isinf(lc), np.isinf(lgp)), msg
    fin = np.isfinite(lc)
    assert np.all(np.abs(lgp[fin] - lc[fin]) <= 1e-5 * (np.abs(lc[fin]) + 1)), msg
    dq = _C._attention_qkv_backward(d, qkv, out, lse, H, causal=causal, q_lengths=lengths, k_lengths=lengths)
    dqg = _C._attention_qkv_backward(dg, qkvg, outg, lseg, H, causal=causal, q_lengths=lengths,
                                     k_lengths=lengths)
    ref = f64(dq)
    close(dqg, dq, (2 * u + 1e-4) * (np.abs(ref) + np.abs(ref).max()), f"dqkv; {msg}")
    again = _C._attention_qkv_backward(dg, qkvg, outg, lseg, H, causal=causal, q_lengths=lengths,
                                       k_lengths=lengths)
    same_bits(again, dqg, f"deterministic backward; {msg}")


def test_attention_rejects_head_dims_over_128():
    q = pyxtts.tensor(np.zeros((1, 1, 4, 136), np.float32), device=GPU)
    with pytest.raises(NotImplementedError, match="D <= 128"):
        pyxtts.attention_forward(q, q, q)


# ---- the whole model and the optimizer (grad_sumsq, adamw, swap) -----------------------------------

# the GPT core without dropout: what the CUDA backend has kernels for today
SMALL = pyxtts.ModelConfig(n_layers=2, d_model=64, n_heads=4, text_vocab_size=37, audio_vocab_size=29,
                           max_text_tokens=24, max_audio_tokens=40, n_cond_latents=3, conditioning=False,
                           dropout=0.0)


def test_train_steps_match_the_cpu(rng):
    from helpers import random_batch

    models = {dev: pyxtts.XTTSGPT(SMALL, device=dev, seed=3) for dev in ("cpu", GPU)}
    opts = {dev: pyxtts.AdamW(m, lr=1e-3, weight_decay=0.1, grad_clip=0.5, ema_decay=0.9)
            for dev, m in models.items()}
    for step in range(3):
        batch = random_batch(rng, SMALL, 3, 10, 14)
        res = {}
        for dev, m in models.items():
            opts[dev].zero_grad()
            loss = m.forward_backward(batch)
            res[dev] = (loss, {k: v.numpy() for k, v in m.gradients().items()}, opts[dev].step())
        (lc, gc_, rc), (lg, gg, rg) = res["cpu"], res[GPU]
        for key in ("text_loss", "audio_loss"):
            assert lg[key] == pytest.approx(lc[key], rel=1e-5, abs=1e-6), (step, key)
        for name, g in gc_.items():
            scale = np.abs(g).max() + 1e-12
            assert np.abs(gg[name] - g).max() <= 1e-4 * scale, (step, name)
        assert rg["grad_norm"] == pytest.approx(rc["grad_norm"], rel=1e-5), step
        assert rg["skipped"] is rc["skipped"] is False
    sc, sg = opts["cpu"].state_dict(), opts[GPU].state_dict()
    for key in ("master", "m", "v", "ema"):
        a, b = sc[key].astype(np.float64), sg[key].astype(np.float64)
        assert np.abs(a - b).max() <= 1e-4 * (np.abs(a).max() + 1e-12), key
    # swap_ema on the GPU: the parameters become the EMA, and back (the swap kernel)
    trained = {k: v.numpy() for k, v in models[GPU].parameters().items()}
    assert opts[GPU].swap_ema() is True
    swapped = {k: v.numpy() for k, v in models[GPU].parameters().items()}
    assert any(not np.array_equal(swapped[k], trained[k]) for k in trained)
    assert opts[GPU].swap_ema() is False
    for k, v in models[GPU].parameters().items():
        assert np.array_equal(v.numpy(), trained[k]), k


def test_adamw_step_is_the_cpus_bits_for_the_same_gradients(rng):
    """Same parameters and the same gradients (copied from the CPU run) on both devices:
    the AdamW update does the CPU's float operations in order, so the bits agree."""
    from helpers import random_batch

    mc = pyxtts.XTTSGPT(SMALL, device="cpu", seed=4)
    mg = pyxtts.XTTSGPT(SMALL, device=GPU, seed=4)
    oc = pyxtts.AdamW(mc, lr=1e-3, weight_decay=0.1, ema_decay=0.5)
    og = pyxtts.AdamW(mg, lr=1e-3, weight_decay=0.1, ema_decay=0.5)
    for _ in range(2):
        oc.zero_grad()
        og.zero_grad()
        mc.forward_backward(random_batch(rng, SMALL, 2, 8, 10))
        grads = {k: v.numpy() for k, v in mc.gradients().items()}
        gviews = mg.gradients()
        for k, g in grads.items():  # the CPU's gradients into the GPU's flat buffer
            gviews[k].copy_(pyxtts.tensor(g))
        oc.step()
        og.step()
    sc, sg = oc.state_dict(), og.state_dict()
    for key in ("master", "m", "v", "ema"):
        assert_bits_equal(sg[key], sc[key], key)

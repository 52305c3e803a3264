"""Dropout in training, where GPT-2 applies it (the summed input embeddings, the attention
probabilities, both residual branches; Coqui's conditioning modules apply none): the step
against the float64 reference applying the very masks of tests/philox.py, the masks' keep
rate and scaling, identical masks under recomputation and after a resume, none in
evaluation, and the step counter that keys them.

Tolerances as test_model.py: losses to 1e-5 relative, each gradient element to 1e-4 of its
tensor's largest magnitude (fp32 against float64, the masks identical on both sides).
Statistics: 6 standard deviations of the binomial (a false alarm below 1e-8).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")
import philox  # noqa: E402
import pyxtts  # noqa: E402
from conftest import NP_DTYPE, requires_cuda, run_python  # noqa: E402
from helpers import attn_probe, random_batch  # noqa: E402
from helpers.torch_ref import RefGPT  # noqa: E402
from pyxtts import _C  # noqa: E402
from test_conditioning import assert_grads_agree, mel_batch, randomized_state  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

CFG = pyxtts.ModelConfig(n_layers=2, d_model=64, n_heads=4, text_vocab_size=97, audio_vocab_size=61,
                         max_text_tokens=24, max_audio_tokens=40, n_cond_latents=5, dropout=0.2,
                         max_cond_frames=60)
POLICIES = ["none", "selective", "full"]


def grads(m):
    return {k: v.numpy().copy() for k, v in m.gradients().items()}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("cond", ["mels", "latents"])
def test_step_matches_the_reference_with_the_same_masks(policy, cond, rng, seed):
    m = pyxtts.XTTSGPT(CFG, checkpointing=policy, seed=seed % 1000)
    m.load_state_dict(randomized_state(m, rng, 0.1))
    batch = mel_batch(rng, CFG, 3, 14, 22, 30) if cond == "mels" else random_batch(rng, CFG, 3, 14, 22)
    step, offset = int(rng.integers(0, 1 << 40)), int(rng.integers(0, 1000))
    r = m.forward_backward(batch, dropout_step=step, sample_offset=offset)
    ref = RefGPT(CFG, dropout=(m.dropout_seed, step, offset))
    ref.load(m.state_dict())
    loss, text_loss, audio_loss = ref(batch)
    loss.backward()
    msg = f"seed={seed} policy={policy} cond={cond} step={step} offset={offset}"
    for k, want in [("loss", loss), ("text_loss", text_loss), ("audio_loss", audio_loss)]:
        assert r[k] == pytest.approx(float(want.detach()), rel=1e-5), msg + " " + k
    want = ref.grads()
    names = [k for k in want if cond == "mels" or not k.startswith("conditioning")]
    assert_grads_agree(grads(m), want, names, msg)
    # the control: without the masks the reference's gradients are far outside the tolerance
    plain = RefGPT(CFG)
    plain.load(m.state_dict())
    plain(batch)[0].backward()
    off = plain.grads()
    worst = max(np.abs(off[k] - want[k]).max() / np.abs(want[k]).max() for k in names)
    assert worst > 1e-2, msg


@pytest.mark.parametrize("prec", ["fp32", "bf16"])
def test_recomputation_draws_the_same_masks(prec, rng):
    batch = mel_batch(rng, CFG, 2, 12, 20, 25)
    state = randomized_state(pyxtts.XTTSGPT(CFG), rng, 0.1)
    results = []
    for policy in POLICIES:
        m = pyxtts.XTTSGPT(CFG, precision=prec, checkpointing=policy, seed=4)
        m.load_state_dict(state)
        results.append((m.forward_backward(batch)["loss"], grads(m)))
    for loss, g in results[1:]:
        assert loss == results[0][0]
        for k in g:
            assert np.array_equal(g[k], results[0][1][k]), k


def test_the_step_counter_keys_the_masks(rng):
    m = pyxtts.XTTSGPT(CFG, seed=1)
    batch = random_batch(rng, CFG, 2, 10, 16)
    assert m.dropout_step == 0 and m.dropout_seed == 1
    a = m.forward_backward(batch)["loss"]
    assert m.dropout_step == 1
    b = m.forward_backward(batch)["loss"]
    assert m.dropout_step == 2 and a != b, "another step, other masks"
    assert m.forward_backward(batch, dropout_step=0)["loss"] == a, "step 0 again, the same masks"
    assert m.dropout_step == 2, "a pinned step leaves the counter alone"
    m.dropout_step = 1
    assert m.forward_backward(batch)["loss"] == b and m.dropout_step == 2
    m.dropout_seed = 99
    assert m.forward_backward(batch, dropout_step=0)["loss"] != a, "another seed, other masks"
    assert m.forward(batch)["loss"] == m.forward(batch)["loss"] and m.dropout_step == 2, "evaluation: no masks"
    for bad, exc in [(-1, ValueError), (2**64, ValueError), (1.5, TypeError), (True, TypeError)]:
        with pytest.raises(exc, match="dropout_step"):
            m.forward_backward(batch, dropout_step=bad)
        with pytest.raises(exc, match="dropout_step"):
            m.dropout_step = bad
    with pytest.raises(ValueError, match="sample_offset"):
        m.forward_backward(batch, sample_offset=2**32)
    with pytest.raises(ValueError, match=r"ModelConfig.dropout: must be in \[0, 1\), got 1"):
        pyxtts.ModelConfig(dropout=1.0)


def test_evaluation_applies_none(rng):
    batch = mel_batch(rng, CFG, 2, 10, 16, 20)
    state = randomized_state(pyxtts.XTTSGPT(CFG), rng, 0.1)
    heavy = pyxtts.XTTSGPT(dataclasses.replace(CFG, dropout=0.5))
    none = pyxtts.XTTSGPT(dataclasses.replace(CFG, dropout=0.0))
    heavy.load_state_dict(state)
    none.load_state_dict(state)
    assert heavy.forward(batch)["loss"] == none.forward(batch)["loss"]
    assert heavy.forward_backward(batch)["loss"] != none.forward_backward(batch)["loss"]


def test_resume_draws_what_the_straight_run_draws(tmp_path, rng):
    batches = [mel_batch(rng, CFG, 2, 10, 16, 20) for _ in range(5)]

    def train(model, opt, todo):
        for b in todo:
            opt.zero_grad()
            model.forward_backward(b)
            opt.step()

    straight = pyxtts.XTTSGPT(CFG, seed=7)
    opt = pyxtts.AdamW(straight, lr=1e-3)
    train(straight, opt, batches)
    first = pyxtts.XTTSGPT(CFG, seed=7)
    opt1 = pyxtts.AdamW(first, lr=1e-3)
    train(first, opt1, batches[:3])
    pyxtts.save_checkpoint(tmp_path / "c.safetensors", first, opt1, step=3)
    resumed = pyxtts.XTTSGPT(CFG, seed=8)  # another seed: the checkpoint brings the masks' own
    opt2 = pyxtts.AdamW(resumed, lr=1e-3)
    pyxtts.load_checkpoint(tmp_path / "c.safetensors", resumed, opt2)
    assert (resumed.dropout_seed, resumed.dropout_step) == (7, 3)
    train(resumed, opt2, batches[3:])
    for k, v in straight.state_dict().items():
        assert np.array_equal(resumed.state_dict()[k], v), k


def attention_masks(B, H, T, p, key):
    """The CPU kernel's own attention mask: with q = k = 0 every probability is 1/T, and
    v = the identity makes out[b, h, i, j] = Z[b, h, i, j] / T, exactly (T a power of 2)."""
    q = np.zeros((B, H, T, T), np.float32)
    v = np.broadcast_to(np.eye(T, dtype=np.float32), (B, H, T, T)).copy()
    out = _C.attention_forward(q, q, v, causal=False, dropout_p=p, dropout_key=key)[0].numpy()
    return out * np.float32(T)


def test_attention_masks_keep_rate_scaling_and_bits(seed):
    p, B, H, T = 0.1, 4, 8, 128
    key = _C.dropout_key(seed, 17, 4)
    z = attention_masks(B, H, T, p, key)
    assert np.array_equal(z, philox.attention_mask(p, key, B, H, T, T)), f"seed={seed}: not Philox's bits"
    kept = z != 0
    assert np.all(z[kept] == np.float32(1 / (1 - np.float32(p))))
    n = z.size
    assert abs((~kept).sum() - n * p) < 6 * math.sqrt(n * p * (1 - p)), f"seed={seed}"
    # heads, samples, queries and keys each draw their own: no two slices share a mask
    assert not np.array_equal(kept[0, 0], kept[0, 1]) and not np.array_equal(kept[0, 0], kept[1, 0])
    assert not np.array_equal(kept[0, 0, 0], kept[0, 0, 1])
    both = (~kept[..., :-1] & ~kept[..., 1:]).mean()  # neighbouring keys dropped together: p^2
    k = kept[..., :-1].size
    assert abs(both - p * p) < 6 * math.sqrt(p * p * (1 - p * p) / k), f"seed={seed}"


def test_rows_keep_rate_over_a_batch_layout(seed):
    """Rows laid out as the model lays out a batch (4 samples of 200 positions in three
    segments): the fraction dropped is p and the mean is kept."""
    p = CFG.dropout
    key = _C.dropout_key(seed, 3, 0)
    N, C = 4 * 200, CFG.d_model
    z = _C._op_dropout_forward(np.ones((N, C), np.float32), p, key, rows_per_sample=200, seg1=5,
                               seg2=30).numpy()
    dropped = (z == 0).sum()
    assert abs(dropped - z.size * p) < 6 * math.sqrt(z.size * p * (1 - p))
    assert np.allclose(z.mean(), 1.0, atol=6 * math.sqrt(p / (1 - p) / z.size))


# ---- dropout of the attention probabilities on every device ----------------------------------------
# The CUDA kernels draw the CPU's bits (dropout.h): float32 runs the general kernels,
# bfloat16 / float16 with D = 64 or 128 the tensor-core ones (attention_tc.cuh).

ATTN_DTYPES = ["float32", "bfloat16", "float16"]
U16 = {"float16": 2.0**-11, "bfloat16": 2.0**-8}  # unit roundoff of the 16-bit types


def _on(a, device, dtype):
    """a (float32 values) as a tensor of dtype on device (rounded to nearest even)."""
    return pyxtts.tensor(np.ascontiguousarray(a, np.float32), dtype=getattr(pyxtts, dtype), device=device)


def _f64(t) -> np.ndarray:
    return np.asarray(t.numpy()).astype(np.float64)


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("T", [64, 128])
def test_attention_masks_read_back_exactly(device, dtype, causal, T, rng, seed):
    """Each kernel's mask read back exactly against tests/philox.py (helpers/attn_probe.py
    says how; p = 0.5, D = T)."""
    B, H = 2, 3
    key = _C.dropout_key(seed, 9, 5)
    q, k = (rng.standard_normal((B, H, T, T)).astype(np.float32) for _ in range(2))
    kept = philox.attention_mask(attn_probe.P, key, B, H, T, T) != 0
    res = attn_probe.run(q, k, causal, key, device, dtype)
    attn_probe.check(res, kept, causal, f"seed={seed} {device} {dtype} T={T} causal={causal}")


PROBE_CHILD = r"""
import sys
import numpy as np
from helpers import attn_probe
data = np.load(sys.argv[1])
res = {}
for dtype in ("bfloat16", "float16"):
    for causal in (0, 1):
        out = attn_probe.run(data["q"], data["k"], bool(causal), int(data["key"]), "cuda:0", dtype)
        res.update({f"{dtype}_{causal}_{n}": v for n, v in out.items()})
np.savez(sys.argv[2], **res)
"""


@requires_cuda
@pytest.mark.parametrize("T", [64, 128])
def test_attention_masks_of_both_cuda_paths(T, rng, seed, tmp_path):
    """16-bit inputs, D = 64 / 128, on each CUDA path by PYXTTS_CUDA_ATTENTION (read once
    per process: a child each): "tc" (the tensor-core kernels; a call they cannot take
    raises) and "simple" (the general kernels) read back the masks of tests/philox.py."""
    B, H = 2, 2
    key = _C.dropout_key(seed, 2, 6)
    q, k = (rng.standard_normal((B, H, T, T)).astype(np.float32) for _ in range(2))
    np.savez(tmp_path / "in.npz", q=q, k=k, key=np.uint64(key))
    kept = philox.attention_mask(attn_probe.P, key, B, H, T, T) != 0
    for mode in ("tc", "simple"):
        p = run_python(PROBE_CHILD, str(tmp_path / "in.npz"), str(tmp_path / f"{mode}.npz"),
                       env={"PYXTTS_CUDA_ATTENTION": mode}, timeout=300)
        assert p.returncode == 0, f"PYXTTS_CUDA_ATTENTION={mode} (seed={seed}):\n{p.stderr[-4000:]}"
        data = np.load(tmp_path / f"{mode}.npz")
        for dtype in ("bfloat16", "float16"):
            for causal in (0, 1):
                res = {n: data[f"{dtype}_{causal}_{n}"] for n in ("out", "dv", "out2", "dq")}
                attn_probe.check(res, kept, bool(causal), f"seed={seed} {mode} {dtype} T={T} causal={causal}")


def attention_dropout_ref(q, k, v, dout, allowed, Z):
    """float64: P = softmax over the allowed keys, out = (P Z) v, lse of the undropped
    softmax, Di = rowsum(dout * out), dS = P (dP Z - Di); (out, lse, dq, dk, dv, parts)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = np.where(allowed, q @ k.swapaxes(-1, -2) * scale, -np.inf)
    mx = s.max(-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(s - mx)
    l = e.sum(-1, keepdims=True)
    P = np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0)
    lse = np.where(l[..., 0] > 0, (mx + np.log(np.where(l > 0, l, 1.0)))[..., 0], -np.inf)
    PZ = P * Z
    out = PZ @ v
    Di = np.sum(dout * out, -1, keepdims=True)
    dS = P * ((dout @ v.swapaxes(-1, -2)) * Z - Di)
    dq, dk, dv = scale * dS @ k, scale * dS.swapaxes(-1, -2) @ q, PZ.swapaxes(-1, -2) @ dout
    return out, lse, dq, dk, dv, (P, PZ, dS, scale)


ATTN_CASES = [  # (B, H, Tq, Tk, D, causal, lengths and key mask)
    (2, 3, 300, 300, 64, True, False),
    (2, 2, 200, 200, 128, False, True),
    (1, 2, 77, 77, 64, True, True),
    (2, 2, 70, 150, 64, False, False),  # cross, Tq < Tk
    (2, 1, 150, 70, 128, True, False),  # cross, Tq > Tk
]


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: "x".join(map(str, c[:5])) + ("-causal" if c[5] else "")
                         + ("-masks" if c[6] else ""))
def test_attention_dropout_matches_float64(device, dtype, case, rng, seed):
    """out, lse, dq, dk, dv with dropout (p = 0.2) against float64 with tests/philox.py's
    masks, every element. Tolerances: float32 (fp32 sums over T): 1e-5 of the largest
    output, 1e-4 of each gradient's largest element. 16-bit: the tensor-core kernels
    round P Z and dS to 16 bits (u = 2^-8 bfloat16, 2^-11 float16): the elementwise bound
    of test_cuda_attention_tc.py with P Z where P multiplies V or dO, twice over, plus
    the 1e-5 fp32 floor; the general kernels' fp32 result rounded once (u |ref|) and the
    CPU's lie within it. A wrong mask bit errs by P_ij |v| / (1 - p), far above these."""
    from test_attention import allowed_mask

    B, H, Tq, Tk, D, causal, masks = case
    p, key = 0.2, _C.dropout_key(seed, 3, 8)
    dt = NP_DTYPE[dtype]
    q, dout = (rng.standard_normal((B, H, Tq, D)).astype(dt).astype(np.float64) for _ in range(2))
    k, v = (rng.standard_normal((B, H, Tk, D)).astype(dt).astype(np.float64) for _ in range(2))
    m = {"q_lengths": None, "k_lengths": None, "key_mask": None}
    if masks:
        m = {"q_lengths": np.array([Tq, Tq // 2 + 3][:B] + [Tq] * max(0, B - 2), np.int32),
             "k_lengths": np.array([Tk - 5, Tk][:B] + [Tk] * max(0, B - 2), np.int32),
             "key_mask": rng.random((B, Tk)) > 0.2}
    allowed = allowed_mask(B, Tq, Tk, causal, **m)[:, None]
    # the Python API's positions (csrc/python/attention.c, dropout_of): the indices, one
    # segment ending at Tq (keys past it, in cross attention, are a second), samples from 0
    Z = philox.attention_mask(p, key, B, H, Tq, Tk, seg1=Tq, seg2=Tq).astype(np.float64)
    ref = attention_dropout_ref(q, k, v, dout, allowed, Z)
    rows_ok = allowed.any(-1, keepdims=True)
    dev_args = {n: (pyxtts.tensor(x, device=device) if x is not None else None) for n, x in m.items()}
    kw = dict(causal=causal, dropout_p=p, dropout_key=key, **dev_args)
    Q, K, V, DO = (_on(x, device, dtype) for x in (q, k, v, dout))
    out, lse = _C.attention_forward(Q, K, V, **kw)
    dq, dk, dv = _C.attention_backward(DO, Q, K, V, out, lse, **kw)
    got = dict(zip(("out", "lse", "dq", "dk", "dv"), map(_f64, (out, lse, dq, dk, dv))))
    want = dict(zip(("out", "lse", "dq", "dk", "dv"), ref[:5]))
    msg = f"seed={seed} {device} {dtype} {case}"
    # the lse is the undropped softmax's: fp32 logsumexp, 1e-5 relative
    fin = np.isfinite(want["lse"])
    assert np.array_equal(np.isfinite(got["lse"]), fin), msg + " lse -inf rows"
    assert np.all(np.abs(got["lse"][fin] - want["lse"][fin]) <= 1e-5 * (1 + np.abs(want["lse"][fin]))), msg
    if dtype == "float32":
        bounds = {n: (1e-5 if n == "out" else 1e-4) * np.abs(want[n]).max() for n in ("out", "dq", "dk", "dv")}
    else:
        P, PZ, dS, scale = ref[5]
        u = U16[dtype]
        av, ado, aq, ak = (np.abs(x) for x in (v, dout, q, k))
        PZv = PZ @ av
        Dsum = np.sum(ado * (np.abs(want["out"]) + PZv), -1, keepdims=True) * u
        E = u * np.abs(dS) + P * Dsum
        tiny = 2.0**-25 if dtype == "float16" else 0.0  # float16's subnormal p and dS
        bounds = {"out": 2 * (u * (PZv + np.abs(want["out"])) + tiny * Tk * av.max()),
                  "dv": 2 * (u * (PZ.swapaxes(-1, -2) @ ado + np.abs(want["dv"])) + tiny * Tq * ado.max()),
                  "dk": 2 * (scale * (E.swapaxes(-1, -2) @ aq) + u * np.abs(want["dk"]) + tiny * Tq * aq.max()),
                  "dq": 2 * (scale * (E @ ak) + u * np.abs(want["dq"]) + tiny * Tk * ak.max())}
        bounds = {n: b + 1e-5 * np.abs(want[n]).max() for n, b in bounds.items()}
    for n in ("out", "dq", "dk", "dv"):
        err = np.abs(got[n] - want[n])
        bad = ~(err <= bounds[n])  # NaN fails
        if bad.any():
            idx = tuple(np.argwhere(bad)[0])
            pytest.fail(f"{n}: {int(bad.sum())} of {bad.size} off, first at {idx}: {got[n][idx]!r} vs "
                        f"{want[n][idx]!r} (bound {np.broadcast_to(bounds[n], err.shape)[idx]:.3g}); {msg}")
    # rows without a valid key and keys nobody may see: exact zeros
    assert np.all(got["out"][np.broadcast_to(~rows_ok, got["out"].shape)] == 0), msg
    assert np.all(got["dq"][np.broadcast_to(~rows_ok, got["dq"].shape)] == 0), msg


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
def test_attention_dropout_zero_is_no_dropout(device, dtype, rng):
    """p = 0 takes the kernels without dropout: the bits of a call without it."""
    q, k, v, d = (_on(rng.standard_normal((2, 2, 70, 64)).astype(np.float32), device, dtype) for _ in range(4))
    out, lse = _C.attention_forward(q, k, v)
    out0, lse0 = _C.attention_forward(q, k, v, dropout_p=0.0, dropout_key=123)
    g = _C.attention_backward(d, q, k, v, out, lse)
    g0 = _C.attention_backward(d, q, k, v, out0, lse0, dropout_p=0.0, dropout_key=123)
    for a, b in zip((out, lse, *g), (out0, lse0, *g0)):
        assert np.array_equal(_f64(a), _f64(b))

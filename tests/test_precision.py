"""Mixed precision: bf16 / fp16 compute copy and activations, fp32 gradients and master.

Tolerances. A 16-bit model stores parameters and activations in dt and computes in
fp32, so compared with the fp32 model holding the *same* (rounded) parameters and
inputs, the only differences are the roundings of activations to dt: a relative
2**-9 (bf16) or 2**-12 (fp16) per stored value, a few dozen of them stacked along
the tiny models' depth. The loss (a mean of log-probabilities) then moves by well
under 1e-2 relative and every gradient keeps its direction (cosine > 0.99; the
random seeds measured 0.9999+ for bf16, 0.99999+ for fp16).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import pyxtts
from helpers import SMALL, TINY, random_batch

HALF = ["bf16", "fp16"]
NP = {"bf16": pyxtts.bfloat16.numpy, "fp16": np.dtype(np.float16), "fp32": np.dtype(np.float32)}


@pytest.fixture(autouse=True)
def clean_allocator():
    pyxtts.testing.inject_oom(None, "cpu")
    pyxtts.set_memory_limit(None, "cpu")
    yield
    pyxtts.set_memory_limit(None, "cpu")


def grads_of(model, scale=1.0):
    return {k: v.numpy() / np.float32(scale) for k, v in model.gradients().items()}


def cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---- construction, dtypes, state dicts -------------------------------------------------

@pytest.mark.parametrize("prec", HALF)
def test_16bit_model_stores_dt_parameters_and_fp32_gradients(prec):
    m = pyxtts.XTTSGPT(TINY, precision=prec, seed=4)
    ref = pyxtts.XTTSGPT(TINY, seed=4)
    assert m.dtype.numpy == NP[prec] and m.precision == prec
    sd, sd32 = m.state_dict(), ref.state_dict()
    for k, v in sd.items():
        assert v.dtype == NP[prec], k
        # initialised in fp32 (same draws as the fp32 model), then rounded to nearest even
        assert np.array_equal(v, sd32[k].astype(NP[prec])), k
        assert m.gradients()[k].numpy().dtype == np.float32
    # load converts (RNE) and round-trips
    m2 = pyxtts.XTTSGPT(TINY, precision=prec, seed=9)
    m2.load_state_dict(sd32)
    for k, v in m2.state_dict().items():
        assert np.array_equal(v, sd[k]), k
    m2.load_state_dict({k: v.astype(np.float32) * 0 + 1 for k, v in sd.items()})
    assert all((v.astype(np.float32) == 1).all() for v in m2.state_dict().values())


def test_fp16_load_refuses_overflow_and_bad_precision():
    m = pyxtts.XTTSGPT(TINY, precision="fp16")
    before = m.state_dict()
    big = {k: v.astype(np.float32) for k, v in before.items()}
    big["text_head.bias"][0] = 1e6  # beyond float16's 65504
    with pytest.raises(ValueError, match="overflows"):
        m.load_state_dict(big)
    for k, v in m.state_dict().items():
        assert np.array_equal(v, before[k]), k
    with pytest.raises(ValueError, match="precision"):
        pyxtts.XTTSGPT(TINY, precision="fp8")
    with pytest.raises(ValueError, match="precision"):
        pyxtts.estimate_memory(TINY, 1, 4, 4, precision="int8")


# ---- one step against fp32 ---------------------------------------------------------------

@pytest.mark.parametrize("prec", HALF)
def test_loss_and_gradients_match_fp32_with_the_same_rounded_parameters(prec, rng):
    batch = random_batch(rng, SMALL, B=2, Lt=20, La=33)
    m = pyxtts.XTTSGPT(SMALL, precision=prec, seed=int(rng.integers(1 << 30)))
    ref = pyxtts.XTTSGPT(SMALL, seed=1)
    ref.load_state_dict({k: v.astype(np.float32) for k, v in m.state_dict().items()})
    # the same inputs for both: cond_latents rounded to dt as the 16-bit model does
    b32 = dict(batch, cond_latents=batch["cond_latents"].astype(NP[prec]).astype(np.float32))
    scale = 2.0 ** 10 if prec == "fp16" else None  # fp16 gradients need the loss scaled
    out = m.forward_backward(b32, loss_scale=scale)
    want = ref.forward_backward(b32)
    for k in ("loss", "text_loss", "audio_loss"):
        assert out[k] == pytest.approx(want[k], rel=1e-2), k  # reported losses unscaled
    g, gr = grads_of(m, scale or 1.0), grads_of(ref)
    flat = np.concatenate([g[k].ravel() for k in g]), np.concatenate([gr[k].ravel() for k in g])
    assert cosine(*flat) > 0.99
    for k in g:
        assert np.isfinite(g[k]).all(), k
        if np.linalg.norm(gr[k]) > 0:
            assert cosine(g[k], gr[k]) > 0.99, k
    assert np.linalg.norm(flat[0]) == pytest.approx(np.linalg.norm(flat[1]), rel=2e-2)
    # evaluation gives the same loss as the training step's forward
    assert m.forward(b32)["loss"] == out["loss"]


def test_loss_scale_multiplies_gradients_exactly_and_not_the_losses(rng):
    batch = random_batch(rng, TINY, B=2, Lt=10, La=20)
    a, b = pyxtts.XTTSGPT(TINY, seed=2), pyxtts.XTTSGPT(TINY, seed=2)
    oa = a.forward_backward(batch)
    ob = b.forward_backward(batch, loss_scale=8.0)  # a power of two: every product exact
    assert oa == ob
    ga, gb = grads_of(a), grads_of(b)
    for k in ga:
        assert np.array_equal(ga[k] * np.float32(8), gb[k]), k
    for bad, exc in ((0.0, ValueError), (float("inf"), ValueError), (-1.0, ValueError), ("2", TypeError)):
        with pytest.raises(exc, match="loss_scale"):
            a.forward_backward(batch, loss_scale=bad)


@pytest.mark.parametrize("prec", HALF)
def test_cond_latents_are_converted_to_the_model_dtype(prec, rng):
    batch = random_batch(rng, TINY, B=2, Lt=8, La=12)
    m = pyxtts.XTTSGPT(TINY, precision=prec, seed=3)
    base = m.forward(batch)["loss"]
    # any float dtype in, the same rounded values used
    for dt in (np.float64, np.float32, NP[prec]):
        assert m.forward(dict(batch, cond_latents=batch["cond_latents"].astype(dt)))["loss"] == base
    # the native step refuses a cond array of another dtype
    arrays, counts = m._prepare(batch)
    arrays = list(arrays[:10])  # the last, mels, is None here
    arrays[9] = arrays[9].astype(np.float32)
    with pytest.raises(TypeError, match="cond"):
        m._core._step(*arrays, float(counts[0]), float(counts[1]), False)
    if prec == "fp16":
        with pytest.raises(ValueError, match="overflows"):
            m.forward(dict(batch, cond_latents=batch["cond_latents"] * 1e6))


# ---- the plan ------------------------------------------------------------------------------

def test_plan_parameter_and_activation_bytes_halve_in_16_bit():
    # N = B * T = 2 * (4 + 20 + 40) = 128 rows: every span is a multiple of the 256-byte
    # alignment in both precisions, so the halving is exact
    kw = dict(batch_size=2, text_len=20, audio_len=40, cond_len=4)
    p32 = pyxtts.estimate_memory(SMALL, **kw)
    N, C, H = 128, SMALL.d_model, SMALL.n_heads
    stats_block = 4 * N * 4 + N * H * 4  # mean1, rstd1, mean2, rstd2, lse (fp32 always)
    stats_final = 4 * N * 4
    for prec in HALF:
        p16 = pyxtts.estimate_memory(SMALL, **kw, precision=prec)
        assert p16.precision == prec and p32.precision == "fp32"
        # the flat buffers: numel (tensors plus alignment padding) * itemsize
        assert 2 * p16.parameters == p32.parameters == p32.gradients == p16.gradients  # grads fp32
        assert p32.parameters >= 4 * pyxtts.XTTSGPT(SMALL).num_parameters
        assert 2 * p16.residuals == p32.residuals == (SMALL.n_layers + 1) * N * C * 4
        for b16, b32 in zip(p16.saved_per_block, p32.saved_per_block):
            assert 2 * (b16 - stats_block) == b32 - stats_block
        assert 2 * (p16.final_norms - stats_final) == p32.final_norms - stats_final
        assert 2 * p16.activation_gradients == p32.activation_gradients
        assert p16.logits == p32.logits  # fp32 logits chunk
        V = max(SMALL.text_vocab_size, SMALL.audio_vocab_size)
        V = -(-V // 8) * 8  # the logits' rows padded to 16-byte alignment (plan.h's pxt_head_ld)
        al = lambda n: -(-n // 256) * 256  # noqa: E731
        assert p32.head_casts == 0
        assert p16.head_casts == al((SMALL.text_vocab_size + SMALL.audio_vocab_size) * 4) + al(p16.logits_rows * V * 2)
        assert p16.total < 0.75 * p32.total
        # with AdamW: moments + the fp32 master copy
        o16 = pyxtts.estimate_memory(SMALL, **kw, precision=prec, optimizer=True)
        o32 = pyxtts.estimate_memory(SMALL, **kw, optimizer=True)
        n4 = p32.gradients
        assert n4 <= o16.optimizer - o32.optimizer <= n4 + (1 << 21)  # one allocator block
        # the model's own plan is the same as the config's
        m = pyxtts.XTTSGPT(SMALL, precision=prec)
        assert m.estimate_memory(2, 20, 40, 4).total == p16.total
    assert "bf16" in str(pyxtts.estimate_memory(SMALL, **kw, precision="bf16"))


# ---- fp16 loss scaling with AdamW --------------------------------------------------------------

def test_fp16_overflow_skips_the_step_and_halves_the_scale(rng):
    batch = random_batch(rng, TINY, B=2, Lt=10, La=20)
    m = pyxtts.XTTSGPT(TINY, precision="fp16", seed=5)
    opt = pyxtts.AdamW(m, lr=1e-3, loss_scale=2.0 ** 24)
    before = m.state_dict()
    out = m.forward_backward(batch, loss_scale=opt.loss_scale)
    assert np.isfinite(out["loss"])  # the losses are unscaled and finite
    assert not all(np.isfinite(g).all() for g in grads_of(m).values())
    r = opt.step()
    assert r["skipped"] is True and opt.loss_scale == 2.0 ** 23 and opt.step_count == 0
    for k, v in m.state_dict().items():
        assert np.array_equal(v, before[k]), k
    # a sane scale then trains
    opt.zero_grad()
    m.forward_backward(batch, loss_scale=2.0 ** 12)
    assert all(np.isfinite(g).all() for g in grads_of(m).values())


@pytest.fixture
def one_thread():
    """The curves run one OpenMP thread: a tiny model's step is ~1 ms alone but tens of
    ms when threads spin against other work on a small, busy machine."""
    try:
        gomp = ctypes.CDLL("libgomp.so.1")
    except OSError:
        yield
        return
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(1)
    try:
        yield
    finally:
        gomp.omp_set_num_threads(before)


def train_curve(prec, batches, steps, seed, lr=5e-4):
    m = pyxtts.XTTSGPT(TINY, precision=prec, seed=seed)
    scaling = prec == "fp16"  # dynamic loss scaling from 2**16, passed explicitly each step
    opt = pyxtts.AdamW(m, lr=lr, weight_decay=0.0, loss_scale=2.0 ** 16 if scaling else None)
    losses, skipped = [], 0
    for step in range(steps):
        opt.zero_grad()
        out = m.forward_backward(batches[step % len(batches)],
                                 loss_scale=opt.loss_scale if scaling else None)
        skipped += opt.step()["skipped"]
        losses.append(out["loss"])
    return np.array(losses), skipped


@pytest.mark.slow
def test_16bit_training_follows_fp32_loss_curve(one_thread, rng):
    """200 AdamW steps over 4 fixed batches: the mean of the last 10 losses within 2%.
    At lr 5e-4 the loss falls to about half (measured over 8 seeds: worst 0.7% bf16, 0.6%
    fp16). At 1e-3 the tiny model memorises to a fifth of its first loss, where any
    rounding (fp32 run against fp32 run with another thread count too) lets trajectories
    drift apart chaotically by up to 3%: that measures chaos, not precision."""
    batches = [random_batch(rng, TINY, B=4, Lt=10, La=16) for _ in range(4)]
    seed = int(rng.integers(1 << 30))
    ref, _ = train_curve("fp32", batches, 200, seed)
    assert ref[-10:].mean() < 0.8 * ref[:10].mean(), "fp32 did not learn"
    for prec in HALF:
        got, skipped = train_curve(prec, batches, 200, seed)
        assert np.isfinite(got).all()
        rel = abs(got[-10:].mean() / ref[-10:].mean() - 1)
        assert rel < 0.02, (prec, rel, got[-10:].mean(), ref[-10:].mean(), skipped)
        assert skipped <= 2, (prec, skipped)

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

import philox
import pyxtts
from helpers import random_batch
from helpers.torch_ref import RefGPT
from pyxtts import _C
from test_conditioning import assert_grads_agree, mel_batch, randomized_state

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

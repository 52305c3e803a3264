"""XTTS v2's conditioning path in the engine (Coqui's conditioning encoder and perceiver
resampler, trained from batch["cond_mels"]): its 54 tensors, the step against Coqui's own
GPT (coqui-tts 0.28.0, where installed: `sh tests/install_coqui.sh`) and against the float64
reference written from Coqui's source (helpers/torch_ref.py, always), every checkpointing
policy, mels of different lengths, 16-bit against fp32, the plan against the measured
peak, a fault at every allocation, and the optimizer leaving an unused path alone.

Tolerances. pyxtts computes in fp32 with sums in other orders than Coqui's torch fp32
(tiled attention, fused heads, double-sum norms): losses agree to 1e-5 relative and
every element of every gradient to 1e-4 of its tensor's largest magnitude, floored at 1e-6
of the model's largest gradient (assert_grads_agree says why) (measured: ~1e-7 on the
losses, ~2e-6 on the gradients). Against float64 the same bounds hold.
16-bit models round every stored activation (2^-9 bf16, 2^-12 fp16 relative, a few
dozen roundings deep): losses to 1e-2 relative, gradients in the same direction
(cosine > 0.99), as test_precision.py bounds the GPT alone.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")

import pyxtts  # noqa: E402
from conftest import requires_cuda  # noqa: E402
from coqui import coqui_installed, require_coqui  # noqa: E402
from helpers import random_batch  # noqa: E402
from helpers.torch_ref import RefGPT  # noqa: E402
from pyxtts.testing import inject_oom  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

POLICIES = ["none", "selective", "full", "auto"]
PREFIXES = ("conditioning_encoder.", "conditioning_perceiver.")
# two layers of d = 64 with Coqui's own sizes for its derived tables: 20 + 2 text and
# 30 + 3 audio positions, 32 perceiver latents; dropout 0 (test_dropout.py has it)
SMALL = pyxtts.ModelConfig(n_layers=2, d_model=64, n_heads=4, text_vocab_size=300, audio_vocab_size=1026,
                           max_text_tokens=22, max_audio_tokens=33, n_cond_latents=32, dropout=0.0,
                           max_cond_frames=517)


def coquis_names_and_shapes(cfg) -> dict[str, tuple]:
    """The conditioning tensors of Coqui's GPT (read from its source): ConditioningEncoder(80, d,
    num_attn_heads=heads) and PerceiverResampler(dim=d, depth=2, num_latents=32, dim_head=64,
    heads=8, ff_mult=4), with n_cond_latents latents."""
    d, F = cfg.d_model, int(cfg.d_model * 4 * 2 / 3)
    out = {"conditioning_encoder.init.weight": (d, 80, 1), "conditioning_encoder.init.bias": (d,)}
    for k in range(6):
        a = f"conditioning_encoder.attn.{k}."
        out.update({a + "norm.weight": (d,), a + "norm.bias": (d,), a + "qkv.weight": (3 * d, d, 1),
                    a + "qkv.bias": (3 * d,), a + "proj_out.weight": (d, d, 1), a + "proj_out.bias": (d,)})
    out["conditioning_perceiver.latents"] = (cfg.n_cond_latents, d)
    for k in range(2):
        a = f"conditioning_perceiver.layers.{k}."
        out.update({a + "0.to_q.weight": (512, d), a + "0.to_kv.weight": (1024, d), a + "0.to_out.weight": (d, 512),
                    a + "1.0.weight": (2 * F, d), a + "1.0.bias": (2 * F,), a + "1.2.weight": (d, F),
                    a + "1.2.bias": (d,)})
    out["conditioning_perceiver.norm.gamma"] = (d,)
    return out


def mel_batch(rng, cfg, B, Lt, La, S, four_d=False):
    """random_batch with cond_mels (B, 80, S) (or (B, 1, 80, S)) in place of cond_latents."""
    batch = random_batch(rng, cfg, B, Lt, La, n_cond=0)
    mels = rng.standard_normal((B, 80, S)).astype(np.float32)
    batch["cond_mels"] = mels[:, None] if four_d else mels
    return batch


def randomized_state(model, rng, scale=0.05):
    """Every tensor drawn afresh, N(0, scale^2) (the zero-initialised proj_out included), so
    no comparison passes on zeros."""
    return {k: (rng.standard_normal(v.shape) * scale).astype(np.float32) for k, v in model.state_dict().items()}


def assert_grads_agree(got, want, names, msg):
    """Every element to 1e-4 of its tensor's largest magnitude, that magnitude floored at
    1e-6 of the largest gradient of the model: a tensor whose whole gradient is a sum that
    cancels to ~1e-10 of the others (the first perceiver layer's to_q behind attention
    over 549 keys can be) holds fp32 rounding of the terms, not of the result; a zeroed or
    wrong gradient of such a tensor still fails (its error is its scale, over the floor)."""
    scales = {k: float(np.abs(want[k]).max()) for k in names}
    floor = 1e-6 * max(scales.values())
    for k in names:
        assert scales[k] > 0, f"{k}: a zero reference gradient proves nothing; {msg}"
        err = float(np.abs(got[k] - want[k]).max())
        tol = 1e-4 * max(scales[k], floor)
        assert err <= tol, f"{k}: max error {err:.3g} vs scale {scales[k]:.3g} (tolerance {tol:.3g}); {msg}"


# ---- the tensors -----------------------------------------------------------------------

def test_the_54_tensors_have_coquis_names_and_shapes():
    m = pyxtts.XTTSGPT(SMALL)
    shapes = {k: v.shape for k, v in m.parameters().items() if k.startswith(PREFIXES)}
    assert shapes == coquis_names_and_shapes(SMALL)
    assert len(m.parameters()) == 12 * SMALL.n_layers + 12 + 54 == 90
    off = pyxtts.XTTSGPT(dataclasses.replace(SMALL, conditioning=False))
    assert not [k for k in off.parameters() if k.startswith(PREFIXES)]
    assert m.num_parameters - off.num_parameters == sum(math.prod(s) for s in shapes.values())
    assert all(g.shape == shapes[k] and np.all(g.numpy() == 0) for k, g in m.gradients().items() if k in shapes)


def test_xtts_v2_trains_441m_parameters_as_coqui():
    # Coqui's GPT at XTTS v2 size has 441,018,563 parameters, 46,299,816 of them conditioning
    plan = pyxtts.estimate_memory(pyxtts.ModelConfig(), 1, 1, 1)
    core = pyxtts.estimate_memory(pyxtts.ModelConfig(conditioning=False), 1, 1, 1)
    assert plan.parameter_count == 441_018_563
    assert plan.parameter_count - core.parameter_count == 46_299_816


def test_initialisation_is_torchs():
    d = 256
    cfg = dataclasses.replace(SMALL, d_model=d)
    sd = pyxtts.XTTSGPT(cfg, seed=5).state_dict()
    assert np.all(sd["conditioning_encoder.attn.3.proj_out.weight"] == 0)  # zero_module
    assert np.all(sd["conditioning_encoder.attn.3.proj_out.bias"] == 0)
    assert np.all(sd["conditioning_encoder.attn.0.norm.weight"] == 1)
    assert np.all(sd["conditioning_perceiver.norm.gamma"] == 1)
    assert abs(sd["conditioning_perceiver.latents"].std() - 0.02) < 2e-3
    for name, fan_in in [("conditioning_encoder.attn.1.qkv.weight", d), ("conditioning_encoder.init.weight", 80),
                         ("conditioning_perceiver.layers.0.1.2.weight", int(d * 8 / 3)),
                         ("conditioning_encoder.init.bias", 80)]:
        w, bound = sd[name], 1 / math.sqrt(fan_in)  # U(-b, b): std b / sqrt(3)
        assert np.abs(w).max() <= bound and abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound, name
    assert np.array_equal(sd["gpt.h.0.attn.c_attn.weight"],
                          pyxtts.XTTSGPT(dataclasses.replace(cfg, conditioning=False), seed=5).state_dict()[
                              "gpt.h.0.attn.c_attn.weight"]), "the GPT's draws do not depend on the path"


# ---- the step against Coqui's GPT ---------------------------------------------------------

def coqui_gpt(cfg):
    c = require_coqui()
    return c.GPT(layers=cfg.n_layers, model_dim=cfg.d_model, heads=cfg.n_heads, max_text_tokens=cfg.max_text_tokens - 2,
                 max_mel_tokens=cfg.max_audio_tokens - 3, max_prompt_tokens=70,
                 number_text_tokens=cfg.text_vocab_size, num_audio_tokens=cfg.audio_vocab_size,
                 start_audio_token=cfg.audio_vocab_size - 2, stop_audio_token=cfg.audio_vocab_size - 1,
                 start_text_token=261, stop_text_token=0, use_perceiver_resampler=True, code_stride_len=1024)


def framed(cfg, texts, codes, mels, four_d):
    """The batch Coqui's GPT.forward builds from these samples, as pyxtts takes it: text
    [START, t, STOP-target], audio [START, c, STOP x 3] with targets [c, STOP x 4]."""
    start_a, stop_a = cfg.audio_vocab_size - 2, cfg.audio_vocab_size - 1
    B, Lt, La = len(texts), max(map(len, texts)) + 2, max(map(len, codes)) + 4
    b = {"text_inputs": np.zeros((B, Lt), np.int64), "text_targets": np.full((B, Lt), -1),
         "audio_inputs": np.zeros((B, La), np.int64), "audio_targets": np.full((B, La), -1),
         "text_lengths": np.zeros(B, np.int64), "audio_lengths": np.zeros(B, np.int64),
         "cond_mels": mels[:, None] if four_d else mels}
    for i, (t, a) in enumerate(zip(texts, codes)):
        x, y = np.concatenate([[261], t]), np.concatenate([t, [0]])
        b["text_inputs"][i, :len(x)], b["text_targets"][i, :len(y)], b["text_lengths"][i] = x, y, len(x)
        x, y = np.concatenate([[start_a], a, [stop_a] * 3]), np.concatenate([a, [stop_a] * 4])
        b["audio_inputs"][i, :len(x)], b["audio_targets"][i, :len(y)], b["audio_lengths"][i] = x, y, len(x)
    return b


COQUI_CASES = {  # (config, B, longest text, longest codes, mel frames)
    "tiny": (SMALL, 3, 12, 20, 37),
    "one frame": (SMALL, 2, 5, 6, 1),
    "realistic": (dataclasses.replace(SMALL, n_layers=3, d_model=128, n_heads=8, text_vocab_size=6681,
                                      max_text_tokens=404, max_audio_tokens=608, max_attention_sequence_length=None),
                  2, 150, 250, 517),
}


@pytest.mark.skipif(not coqui_installed(), reason="coqui-tts is not installed here; `sh tests/install_coqui.sh`")
@pytest.mark.parametrize("case, policy, four_d", [("tiny", p, p == "selective") for p in POLICIES]
                         + [("one frame", "none", False), ("realistic", "full", True), ("realistic", "none", False)])
def test_step_matches_coquis_gpt(case, policy, four_d, rng, seed):
    c = require_coqui()
    cfg, B, max_text, max_codes, S = COQUI_CASES[case]
    gpt = coqui_gpt(cfg)
    m = pyxtts.XTTSGPT(cfg, checkpointing=policy)
    state = randomized_state(m, rng)
    with torch.no_grad():
        gpt.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    gpt.eval()  # dropout off; nothing else in GPT.forward depends on it
    texts = [rng.integers(0, cfg.text_vocab_size, int(rng.integers(1, max_text + 1))) for _ in range(B)]
    codes = [rng.integers(0, cfg.audio_vocab_size - 2, int(rng.integers(1, max_codes + 1))) for _ in range(B)]
    texts[0], codes[-1] = rng.integers(0, cfg.text_vocab_size, max_text), codes[-1][:1]  # padding in the middle
    mels = rng.standard_normal((B, 80, S)).astype(np.float32)
    text = np.zeros((B, max(map(len, texts))), np.int64)
    audio = rng.integers(0, cfg.audio_vocab_size - 2, (B, max(map(len, codes)) + 2))
    for i, (t, a) in enumerate(zip(texts, codes)):
        text[i, :len(t)], audio[i, :len(a)] = t, a
    wav = np.array([len(a) * 1024 - int(rng.integers(0, 1024)) for a in codes])
    lt, lm, _ = gpt(torch.from_numpy(text), torch.tensor([len(t) for t in texts]), torch.from_numpy(audio),
                    torch.from_numpy(wav), cond_mels=torch.from_numpy(mels)[:, None])
    (cfg.text_loss_weight * lt + cfg.audio_loss_weight * lm).backward()
    ref = {k: p.grad.numpy() for k, p in gpt.named_parameters()}
    m.load_state_dict(state, strict=True)
    r = m.forward_backward(framed(cfg, texts, codes, mels, four_d))
    msg = f"seed={seed} case={case} policy={policy}"
    assert r["text_loss"] == pytest.approx(float(lt.detach()), rel=1e-5), msg
    assert r["audio_loss"] == pytest.approx(float(lm.detach()), rel=1e-5), msg
    grads = {k: v.numpy() for k, v in m.gradients().items()}
    assert set(grads) == set(ref) and len(ref) == 12 * cfg.n_layers + 66, msg
    assert_grads_agree(grads, ref, ref, msg)
    del c


@pytest.mark.skipif(not coqui_installed(), reason="coqui-tts is not installed here; `sh tests/install_coqui.sh`")
def test_state_dicts_load_both_ways_with_strict(rng):
    gpt = coqui_gpt(SMALL)
    m = pyxtts.XTTSGPT(SMALL)
    assert {k: tuple(v.shape) for k, v in gpt.state_dict().items()} == {k: v.shape for k, v in m.parameters().items()}
    state = randomized_state(m, rng)
    gpt.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    m.load_state_dict({k: v.numpy() for k, v in gpt.state_dict().items()}, strict=True)
    assert all(np.array_equal(v, state[k]) for k, v in m.state_dict().items())
    gpt2 = coqui_gpt(SMALL)
    gpt2.load_state_dict({k: torch.from_numpy(v) for k, v in m.state_dict().items()}, strict=True)
    assert all(torch.equal(v, gpt.state_dict()[k]) for k, v in gpt2.state_dict().items())


# ---- the step against the float64 reference (no Coqui needed) --------------------------------

@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("S", [1, 23, 517])
def test_step_matches_the_float64_reference(policy, S, rng, seed):
    cfg = dataclasses.replace(SMALL, n_cond_latents=5)
    m = pyxtts.XTTSGPT(cfg, checkpointing=policy)
    m.load_state_dict(randomized_state(m, rng))
    batch = mel_batch(rng, cfg, 3, 12, 20, S, four_d=S == 23)
    ref = RefGPT(cfg)
    ref.load(m.state_dict())
    loss, text_loss, audio_loss = ref(batch)
    loss.backward()
    r = m.forward_backward(batch)
    msg = f"seed={seed} S={S} policy={policy}"
    for k, want in [("loss", loss), ("text_loss", text_loss), ("audio_loss", audio_loss)]:
        assert r[k] == pytest.approx(float(want.detach()), rel=1e-5), msg + " " + k
    want = ref.grads()
    assert_grads_agree({k: v.numpy() for k, v in m.gradients().items()}, want, want, msg)


@requires_cuda
@pytest.mark.parametrize("policy", ["none", "selective"])
@pytest.mark.parametrize("prec", ["fp32", "bf16"])
def test_step_on_cuda_matches_the_cpu(policy, prec, rng, seed):
    """The whole path on the GPU (GroupNorm, RMS norm and GEGLU kernels, the encoder's and
    the perceiver's attention, their GEMMs) against the CPU backend, one step from the same
    weights: fp32 to this module's bounds; bf16, whose activations both round, to its
    16-bit bounds."""
    cfg = dataclasses.replace(SMALL, n_cond_latents=6)
    state = randomized_state(pyxtts.XTTSGPT(cfg), rng, 0.1)
    batch = mel_batch(rng, cfg, 2, 10, 16, 64)
    res = {}
    for dev in ("cpu", "cuda:0"):
        m = pyxtts.XTTSGPT(cfg, device=dev, precision=prec, checkpointing=policy)
        m.load_state_dict(state)
        r = m.forward_backward(batch)
        res[dev] = (r, {k: v.numpy().astype(np.float32) for k, v in m.gradients().items()})
    (rc, gc_), (rg, gg) = res["cpu"], res["cuda:0"]
    msg = f"seed={seed} policy={policy} {prec}"
    names = [k for k in gc_ if k.startswith(PREFIXES)]
    assert len(names) == 54, msg
    for k in ("loss", "text_loss", "audio_loss"):
        assert rg[k] == pytest.approx(rc[k], rel=1e-5 if prec == "fp32" else 1e-2), f"{k}; {msg}"
    if prec == "fp32":
        assert_grads_agree(gg, gc_, list(gc_), msg)
    else:
        for k in names:
            g, gr = gg[k], gc_[k]
            assert np.isfinite(g).all(), k
            if np.linalg.norm(gr) > 0:
                cos = float(g.ravel() @ gr.ravel() / (np.linalg.norm(g) * np.linalg.norm(gr)))
                assert cos > 0.99, (k, cos, msg)


def test_mels_and_latents_paths_of_one_model(rng):
    """The latents the path makes, given as fixed cond_latents, give the same loss; the
    GPT's gradients agree, and only the mel step reaches the conditioning tensors."""
    cfg = dataclasses.replace(SMALL, n_cond_latents=4)
    m = pyxtts.XTTSGPT(cfg, seed=2)
    m.load_state_dict(randomized_state(m, rng))
    batch = mel_batch(rng, cfg, 2, 8, 10, 30)
    ref = RefGPT(cfg)
    ref.load(m.state_dict())
    with torch.no_grad():
        latents = ref.conditioning(torch.from_numpy(batch["cond_mels"].astype(np.float64))).float().numpy()
    a = m.forward_backward(batch)
    ga = {k: v.numpy().copy() for k, v in m.gradients().items()}
    m.zero_grad()
    fixed = {k: v for k, v in batch.items() if k != "cond_mels"}
    fixed["cond_latents"] = latents
    b = m.forward_backward(fixed)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for k, g in m.gradients().items():
        if k.startswith(PREFIXES):
            assert np.all(g.numpy() == 0) and np.abs(ga[k]).max() > 0, k
        else:
            np.testing.assert_allclose(g.numpy(), ga[k], rtol=0, atol=1e-4 * np.abs(ga[k]).max(), err_msg=k)


# ---- 16-bit -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("prec", ["bf16", "fp16"])
def test_16bit_matches_fp32_with_the_same_rounded_values(prec, rng):
    np_dt = {"bf16": pyxtts.bfloat16.numpy, "fp16": np.dtype(np.float16)}[prec]
    cfg = dataclasses.replace(SMALL, n_cond_latents=6)
    m = pyxtts.XTTSGPT(cfg, precision=prec, checkpointing="selective")
    m.load_state_dict(randomized_state(m, rng, 0.1))
    ref = pyxtts.XTTSGPT(cfg)
    ref.load_state_dict({k: v.astype(np.float32) for k, v in m.state_dict().items()})
    batch = mel_batch(rng, cfg, 2, 10, 16, 64)
    batch["cond_mels"] = batch["cond_mels"].astype(np_dt).astype(np.float32)  # what the 16-bit model sees
    scale = 2.0**10 if prec == "fp16" else None
    out, want = m.forward_backward(batch, loss_scale=scale), ref.forward_backward(batch)
    for k in ("loss", "text_loss", "audio_loss"):
        assert out[k] == pytest.approx(want[k], rel=1e-2), k
    for k, g in m.gradients().items():
        g, gr = g.numpy() / np.float32(scale or 1.0), ref.gradients()[k].numpy()
        assert np.isfinite(g).all(), k
        if np.linalg.norm(gr) > 0:
            cos = float(g.ravel() @ gr.ravel() / (np.linalg.norm(g) * np.linalg.norm(gr)))
            assert cos > 0.99, (k, cos)


# ---- memory -----------------------------------------------------------------------------------------

# d = 256: the parameters and the arena are large-pool blocks, each on a segment of its own,
# so the allocator's blocks are the plan's exactly
PLAN_CFG = dataclasses.replace(SMALL, d_model=256, n_heads=4, text_vocab_size=300, audio_vocab_size=200,
                               max_text_tokens=64, max_audio_tokens=128, n_cond_latents=8,
                               max_attention_sequence_length=None)


@pytest.mark.parametrize("prec", ["fp32", "bf16"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("S", [40, pytest.param(517, marks=pytest.mark.slow)])  # 517: 5-9 s each
def test_plan_equals_the_measured_peak_with_the_conditioning_path(S, policy, prec, rng):
    pyxtts.empty_cache("cpu")
    base = pyxtts.memory_allocated("cpu")
    m = pyxtts.XTTSGPT(PLAN_CFG, checkpointing=policy, precision=prec)
    batch = mel_batch(rng, PLAN_CFG, 3, 40, 100, S)
    batch["text_lengths"][:], batch["audio_lengths"][:] = 40, 100
    plan = m.estimate_memory(3, 40, 100, cond_frames=S)
    assert plan.cond_frames == S and plan.conditioning_saved > 0 and plan.conditioning_policy is not None
    assert plan.arena == plan.inputs + plan.saved + plan.scratch
    pyxtts.reset_peak_memory_stats("cpu")
    m.forward_backward(batch)
    assert pyxtts.max_memory_allocated("cpu") - base == plan.total, (S, policy, prec)
    allocs = pyxtts.memory_stats("cpu")["num_allocs"]
    m.forward_backward(batch)
    assert pyxtts.memory_stats("cpu")["num_allocs"] == allocs, "a step of the same shape allocated"
    # evaluation reserves its own (smaller) plan's arena
    m.forward(batch)
    ev = m.estimate_memory(3, 40, 100, cond_frames=S, train=False)
    assert m._core.arena_bytes == ev.arena < plan.arena
    del m


def test_policies_trade_memory_for_recomputation_in_the_path():
    plans = {p: pyxtts.estimate_memory(PLAN_CFG, 4, 40, 100, checkpointing=p, cond_frames=517) for p in POLICIES[:3]}
    saved = [plans[p].conditioning_saved for p in POLICIES[:3]]
    assert saved[0] > saved[1] > saved[2] > 0
    assert [plans[p].conditioning_policy for p in POLICIES[:3]] == POLICIES[:3]
    none = pyxtts.estimate_memory(PLAN_CFG, 4, 40, 100, checkpointing="none")
    assert none.cond_frames == 0 and none.conditioning_saved == 0 and plans["none"].total > none.total
    # auto recomputes the conditioning path first, then the blocks: a budget 6 MiB short of
    # the all-none plan (beyond the parameters' block rounding) takes the path selective
    auto = pyxtts.estimate_memory(PLAN_CFG, 4, 40, 100, checkpointing="auto", cond_frames=517,
                                  budget=plans["none"].total - (6 << 20), optimizer=False)
    assert auto.conditioning_policy == "selective" and set(auto.policies) == {"none"}
    assert auto.total <= plans["none"].total - (6 << 20)


def test_fault_at_every_allocation_leaves_everything_unchanged(rng):
    cfg = dataclasses.replace(SMALL, n_cond_latents=4)
    m = pyxtts.XTTSGPT(cfg, checkpointing="auto")
    batch = mel_batch(rng, cfg, 2, 12, 20, 50)
    before = pyxtts.memory_stats("cpu")["num_allocs"]
    m.forward_backward(batch)
    n_allocs = pyxtts.memory_stats("cpu")["num_allocs"] - before
    assert n_allocs >= 1
    m.zero_grad()
    params, step = m.state_dict(), m.dropout_step
    for i in range(n_allocs):
        m.release_memory()
        allocated = pyxtts.memory_allocated("cpu")
        inject_oom(i, "cpu")
        with pytest.raises(pyxtts.OutOfMemoryError):
            m.forward_backward(batch)
        inject_oom(None, "cpu")
        assert pyxtts.memory_allocated("cpu") == allocated
        assert all(np.array_equal(v, params[k]) for k, v in m.state_dict().items())
        assert all(np.all(g.numpy() == 0) for g in m.gradients().values())
        assert m.dropout_step == step


def test_find_optimal_batch_size_plans_the_longest_mels(rng):
    # no cached segment of an earlier test for the parameters to split: blocks as planned
    pyxtts.empty_cache("cpu")
    cfg = dataclasses.replace(PLAN_CFG, max_cond_frames=200)
    m = pyxtts.XTTSGPT(cfg)
    opt = pyxtts.AdamW(m)
    # half way between the plans of 3 and 4 samples (the small pool's segments fit in the half)
    three, four = (m.estimate_memory(b, 64, 128, cond_frames=200, optimizer=True).total for b in (3, 4))
    pyxtts.set_memory_limit((three + four) // 2, "cpu")
    before = m.state_dict()
    found = pyxtts.find_optimal_batch_size(m, opt, safety_margin=0.0)
    assert found == 3, "the plan of 3 samples with 200-frame mels fits, 4 does not"
    assert all(np.array_equal(v, before[k]) for k, v in m.state_dict().items())


# ---- the optimizer and an unused path ------------------------------------------------------------------

def test_adamw_leaves_the_path_alone_when_no_gradient_reached_it(rng):
    """As torch's AdamW skips parameters whose .grad is None: a step after a batch with
    fixed cond_latents neither decays nor moves the conditioning tensors."""
    cfg = dataclasses.replace(SMALL, n_cond_latents=4)
    m = pyxtts.XTTSGPT(cfg, seed=3)
    opt = pyxtts.AdamW(m, lr=1e-2, weight_decay=0.1)
    before = m.state_dict()
    m.forward_backward(random_batch(rng, cfg, 2, 8, 10))  # cond_latents
    opt.step()
    after = m.state_dict()
    for k in before:
        assert np.array_equal(after[k], before[k]) == k.startswith(PREFIXES), k
    opt.zero_grad()
    m.forward_backward(mel_batch(rng, cfg, 2, 8, 10, 12))
    opt.step()
    assert not np.array_equal(m.state_dict()["conditioning_perceiver.latents"], after["conditioning_perceiver.latents"])


# ---- bad input -------------------------------------------------------------------------------------------

def test_bad_cond_mels_are_refused_before_any_work(rng):
    cfg = dataclasses.replace(SMALL, n_cond_latents=4, max_cond_frames=40)
    m = pyxtts.XTTSGPT(cfg)
    good = mel_batch(rng, cfg, 2, 6, 8, 10)
    cases = [
        (dict(good, cond_mels=good["cond_mels"][:, :79]), ValueError, r"expected shape \(2, 80, S\)"),
        (dict(good, cond_mels=good["cond_mels"][:1]), ValueError, r"expected shape \(2, 80, S\)"),
        (dict(good, cond_mels=np.zeros((2, 80, 0), np.float32)), ValueError, "S >= 1"),
        (dict(good, cond_mels=np.zeros((2, 2, 80, 5), np.float32)), ValueError, r"\(2, 1, 80, S\)"),
        (dict(good, cond_mels=np.zeros((2, 80, 41), np.float32)), ValueError, "41 mel frames exceed max_cond_frames=40"),
        (dict(good, cond_mels=good["cond_mels"].astype(np.int32)), TypeError, "expected a float array"),
        (dict(good, cond_mels=np.full((2, 80, 5), np.nan, np.float32)), ValueError, "NaN"),
        (dict(good, cond_latents=np.zeros((2, 4, cfg.d_model), np.float32)), ValueError, "exclusive"),
    ]
    for batch, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            m.forward_backward(batch)
        assert all(np.all(g.numpy() == 0) for g in m.gradients().values())
        assert m.dropout_step == 0
    off = pyxtts.XTTSGPT(dataclasses.replace(cfg, conditioning=False))
    with pytest.raises(ValueError, match=r"no conditioning path \(ModelConfig.conditioning=False\)"):
        off.forward_backward(good)
    with pytest.raises(ValueError, match="max_cond_frames=40"):
        m.estimate_memory(2, 6, 8, cond_frames=41)
    with pytest.raises(ValueError, match="conditioning is False"):
        off.estimate_memory(2, 6, 8, cond_frames=10)
    with pytest.raises(ValueError, match="n_cond_latents: must be >= 1 with conditioning"):
        pyxtts.ModelConfig(n_cond_latents=0, conditioning=True)
    with pytest.raises(ValueError, match="use_perceiver_resampler=False"):
        pyxtts.ModelConfig(use_perceiver_resampler=False, conditioning=True)
    # unset, the path is there when it has latents to make and the conditioning is XTTS v2's
    assert pyxtts.ModelConfig().conditioning is True
    assert pyxtts.ModelConfig(n_cond_latents=0).conditioning is False
    assert pyxtts.ModelConfig(use_perceiver_resampler=False).conditioning is False
    with pytest.raises(ValueError, match="GroupNorm needs more than 2 groups"):
        pyxtts.ModelConfig(d_model=6, n_heads=2, n_cond_latents=1)
    with pytest.raises(TypeError, match="ModelConfig.conditioning: expected bool"):
        pyxtts.ModelConfig(conditioning=1)


def test_a_perceiver_too_large_is_refused_naming_the_rows_it_would_need():
    """n_cond_latents near 2**31: the refusal's own sum of frames and latents overflowed an
    int (UBSan reported it; the message said a negative number). The rows are counted in
    64 bits."""
    with pytest.raises(ValueError, match=r"\(64 x 2147484164\) is too large"):
        dataclasses.replace(SMALL, n_cond_latents=2**31 - 1)

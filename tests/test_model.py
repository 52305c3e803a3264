"""XTTSGPT: parameters, the step against a PyTorch reference, checkpointing, the plan."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")

import pyxtts  # noqa: E402
from pyxtts.testing import inject_oom  # noqa: E402
from helpers import MEDIUM, SMALL, TINY, random_batch  # noqa: E402
from helpers.torch_ref import RefGPT  # noqa: E402

POLICIES = ["none", "selective", "full"]


pytestmark = pytest.mark.usefixtures("no_limit_no_fault")


def reference_step(model, batch, token_counts=None):
    """float64 loss parts and gradients of the same parameters in PyTorch."""
    ref = RefGPT(model.config)
    ref.load(model.state_dict())
    loss, text_loss, audio_loss = ref(batch, token_counts)
    loss.backward()
    return float(loss.detach()), float(text_loss.detach()), float(audio_loss.detach()), ref.grads()


def grads_of(model):
    return {k: v.numpy() for k, v in model.gradients().items()}


def assert_grads_close(got, want, rtol):
    """Every tensor: relative error of the whole tensor, and every element within
    rtol of the tensor's scale (elements near zero are judged against the scale)."""
    for name, w in want.items():
        g = got[name]
        scale = np.abs(w).max()
        assert scale > 0 or np.abs(g).max() == 0, name
        err = np.abs(g - w).max()
        assert err <= rtol * max(scale, 1e-30), f"{name}: max error {err:.3g} vs scale {scale:.3g}"


# ---- parameters --------------------------------------------------------------

def test_parameter_names_and_shapes_follow_design():
    # the GPT core; the conditioning path's 54 tensors are test_conditioning.py's
    m = pyxtts.XTTSGPT(dataclasses.replace(TINY, conditioning=False))
    p = m.parameters()
    d, V, A = TINY.d_model, TINY.text_vocab_size, TINY.audio_vocab_size
    want = {
        "text_embedding.weight": (V, d), "mel_embedding.weight": (A, d),
        "text_pos_embedding.emb.weight": (TINY.max_text_tokens, d),
        "mel_pos_embedding.emb.weight": (TINY.max_audio_tokens, d),
        "gpt.ln_f.weight": (d,), "gpt.ln_f.bias": (d,), "final_norm.weight": (d,), "final_norm.bias": (d,),
        "text_head.weight": (V, d), "text_head.bias": (V,), "mel_head.weight": (A, d), "mel_head.bias": (A,),
    }
    for i in range(TINY.n_layers):
        h = f"gpt.h.{i}."
        want.update({h + "ln_1.weight": (d,), h + "ln_1.bias": (d,), h + "attn.c_attn.weight": (d, 3 * d),
                     h + "attn.c_attn.bias": (3 * d,), h + "attn.c_proj.weight": (d, d),
                     h + "attn.c_proj.bias": (d,), h + "ln_2.weight": (d,), h + "ln_2.bias": (d,),
                     h + "mlp.c_fc.weight": (d, 4 * d), h + "mlp.c_fc.bias": (4 * d,),
                     h + "mlp.c_proj.weight": (4 * d, d), h + "mlp.c_proj.bias": (d,)})
    assert {k: v.shape for k, v in p.items()} == want
    assert m.num_parameters == sum(math.prod(s) for s in want.values())
    assert set(m.gradients()) == set(want)


def test_gpt2_initialisation_statistics_and_seed():
    cfg = pyxtts.ModelConfig(n_layers=4, d_model=128, n_heads=4, text_vocab_size=500, audio_vocab_size=300,
                             max_text_tokens=64, max_audio_tokens=64, n_cond_latents=0, conditioning=False)
    sd = pyxtts.XTTSGPT(cfg, seed=7).state_dict()
    assert abs(sd["text_embedding.weight"].std() - 0.02) < 0.001
    assert abs(sd["gpt.h.0.attn.c_attn.weight"].std() - 0.02) < 0.001
    resid = 0.02 / math.sqrt(2 * cfg.n_layers)
    assert abs(sd["gpt.h.1.attn.c_proj.weight"].std() - resid) < 0.1 * resid
    assert abs(sd["gpt.h.1.mlp.c_proj.weight"].std() - resid) < 0.1 * resid
    assert np.all(sd["gpt.h.2.ln_1.weight"] == 1) and np.all(sd["gpt.h.2.mlp.c_fc.bias"] == 0)
    again = pyxtts.XTTSGPT(cfg, seed=7).state_dict()
    other = pyxtts.XTTSGPT(cfg, seed=8).state_dict()
    assert all(np.array_equal(sd[k], again[k]) for k in sd)
    assert not np.array_equal(sd["mel_head.weight"], other["mel_head.weight"])
    assert np.all(pyxtts.XTTSGPT(cfg).gradients()["mel_head.weight"].numpy() == 0)


# ---- the step against PyTorch ------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("cfg", [TINY, SMALL], ids=["tiny", "small"])
def test_forward_backward_matches_pytorch(cfg, policy, rng):
    # fp32 against float64: the loss to 1e-5 relative; gradients to 1e-4 of each
    # tensor's largest element (sums over B*T rows of fp32 products lose ~1e-6 each)
    m = pyxtts.XTTSGPT(cfg, checkpointing=policy, seed=int(rng.integers(1 << 30)))
    batch = random_batch(rng, cfg, B=3, Lt=cfg.max_text_tokens // 2, La=cfg.max_audio_tokens // 2)
    out = m.forward_backward(batch)
    loss, tl, al, ref_grads = reference_step(m, batch)
    assert out["loss"] == pytest.approx(loss, rel=1e-5)
    assert out["text_loss"] == pytest.approx(tl, rel=1e-5)
    assert out["audio_loss"] == pytest.approx(al, rel=1e-5)
    assert_grads_close(grads_of(m), ref_grads, rtol=1e-4)


@pytest.mark.parametrize("padding", ["middle", "end"])
def test_heads_gather_rows_across_samples(padding, rng):
    """8 samples of 40 audio rows are 320 rows: the heads take them in chunks of 256
    gathered across samples, one chunk ending inside a sample. With padding only at
    each sample's end (every text full) the step passes no key mask, causal
    attention being enough; with text padding (in the middle) it must pass one.
    Both against the float64 reference."""
    m = pyxtts.XTTSGPT(TINY, seed=int(rng.integers(1 << 30)))
    batch = random_batch(rng, TINY, B=8, Lt=20, La=40)
    if padding == "end":
        batch["text_lengths"][:] = 20
    assert m.estimate_memory(8, 20, 40).logits_rows == 256
    out = m.forward_backward(batch)
    loss, tl, al, ref_grads = reference_step(m, batch)
    assert out["text_loss"] == pytest.approx(tl, rel=1e-5)
    assert out["audio_loss"] == pytest.approx(al, rel=1e-5)
    assert_grads_close(grads_of(m), ref_grads, rtol=1e-4)


def test_without_conditioning_latents_and_with_empty_text_sample(rng):
    m = pyxtts.XTTSGPT(TINY)
    batch = random_batch(rng, TINY, B=3, Lt=7, La=11, n_cond=0)
    batch["text_lengths"][2] = 0  # no text at all: its queries see only audio keys
    out = m.forward_backward(batch)
    loss, _, _, ref_grads = reference_step(m, batch)
    assert out["loss"] == pytest.approx(loss, rel=1e-5)
    assert_grads_close(grads_of(m), ref_grads, rtol=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_policies_give_bit_identical_gradients(precision, rng):
    batch = random_batch(rng, SMALL, B=2, Lt=20, La=33)
    results = []
    for policy in POLICIES:
        m = pyxtts.XTTSGPT(SMALL, precision=precision, checkpointing=policy, seed=3)
        out = m.forward_backward(batch)
        results.append((out["loss"], grads_of(m)))
    for loss, grads in results[1:]:
        assert loss == results[0][0]
        for k in grads:
            assert np.array_equal(grads[k], results[0][1][k]), k


def test_accumulation_with_token_counts_equals_one_big_batch(rng):
    big = random_batch(rng, TINY, B=4, Lt=9, La=14)
    m1 = pyxtts.XTTSGPT(TINY, seed=1)
    out = m1.forward_backward(big)
    m2 = pyxtts.XTTSGPT(TINY, seed=1)
    counts = (out["text_tokens"], out["audio_tokens"])
    total = 0.0
    for lo in (0, 2):
        part = {k: v[lo:lo + 2] for k, v in big.items()}
        total += m2.forward_backward(part, token_counts=counts)["loss"]
    assert total == pytest.approx(out["loss"], rel=1e-6)
    g1, g2 = grads_of(m1), grads_of(m2)
    for k in g1:
        np.testing.assert_allclose(g2[k], g1[k], rtol=1e-6, atol=1e-6 * np.abs(g1[k]).max(), err_msg=k)


def test_forward_evaluates_without_touching_gradients(rng):
    m = pyxtts.XTTSGPT(SMALL, checkpointing="full")
    batch = random_batch(rng, SMALL, B=2, Lt=10, La=21)
    ev = m.forward(batch)
    assert all(np.all(g.numpy() == 0) for g in m.gradients().values())
    tr = m.forward_backward(batch)
    assert ev["loss"] == pytest.approx(tr["loss"], rel=1e-6)
    assert ev["text_tokens"] == tr["text_tokens"]


def test_padding_content_never_matters(rng):
    m = pyxtts.XTTSGPT(TINY)
    batch = random_batch(rng, TINY, B=3, Lt=8, La=12)
    a = m.forward_backward(batch)
    ga = grads_of(m)
    m.zero_grad()
    noisy = {k: np.array(v, copy=True) for k, v in batch.items()}
    for key, lens in (("text_inputs", "text_lengths"), ("audio_inputs", "audio_lengths")):
        pad = np.arange(noisy[key].shape[1])[None] >= noisy[lens][:, None]
        noisy[key][pad] = 10**6  # out of vocabulary, but padding: never read
    b = m.forward_backward(noisy)
    assert a["loss"] == b["loss"]
    for k, v in grads_of(m).items():
        assert np.array_equal(v, ga[k]), k


# ---- memory ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("policy", POLICIES)
def test_plan_total_matches_measured_peak_and_arena_is_reused(rng, precision, policy):
    pyxtts.empty_cache("cpu")
    base = pyxtts.memory_allocated("cpu")
    m = pyxtts.XTTSGPT(MEDIUM, precision=precision, checkpointing=policy)
    batch = random_batch(rng, MEDIUM, B=4, Lt=40, La=100, full=True)
    plan = m.estimate_memory(4, 40, 100)
    pyxtts.reset_peak_memory_stats("cpu")
    m.forward_backward(batch)
    peak = pyxtts.max_memory_allocated("cpu") - base
    assert abs(peak - plan.total) <= 0.01 * plan.total, (precision, policy, peak, plan.total)
    allocs = pyxtts.memory_stats("cpu")["num_allocs"]
    m.forward_backward(batch)
    m.forward_backward(batch)
    assert pyxtts.memory_stats("cpu")["num_allocs"] == allocs, "a step of the same shape allocated"
    del m


def test_plan_of_xtts_v2_size_allocates_nothing():
    before = pyxtts.memory_stats("cpu")
    plans = {p: pyxtts.estimate_memory(pyxtts.ModelConfig(), 8, 150, 308, checkpointing=p) for p in POLICIES}
    after = pyxtts.memory_stats("cpu")
    assert after["num_allocs"] == before["num_allocs"]
    assert plans["none"].total > plans["selective"].total > plans["full"].total
    assert plans["none"].parameters == pyxtts.estimate_memory(pyxtts.ModelConfig(), 1, 1, 1).parameters
    assert "total" in str(plans["full"])


def test_auto_checkpointing_fits_the_limit_with_fewest_recomputed_blocks():
    cfg = SMALL
    plans = {p: pyxtts.estimate_memory(cfg, 4, 40, 90, checkpointing=p) for p in POLICIES}
    budget = (plans["none"].total + plans["selective"].total) // 2
    auto = pyxtts.estimate_memory(cfg, 4, 40, 90, checkpointing="auto", budget=budget)
    assert auto.total <= budget
    assert "selective" in auto.policies and "full" not in auto.policies
    assert "none" in auto.policies  # not every block had to give up its activations
    tight = pyxtts.estimate_memory(cfg, 4, 40, 90, checkpointing="auto",
                                   budget=(plans["selective"].total + plans["full"].total) // 2)
    assert "full" in tight.policies and tight.total <= (plans["selective"].total + plans["full"].total) // 2


def test_oom_at_the_step_allocation_leaves_everything_unchanged(rng):
    m = pyxtts.XTTSGPT(TINY)
    batch = random_batch(rng, TINY, B=2, Lt=6, La=9)
    params = m.state_dict()
    m.forward_backward(batch)
    grads = grads_of(m)
    batch2 = random_batch(rng, TINY, B=3, Lt=7, La=10)  # a new shape needs a new arena
    m.release_memory()
    before = pyxtts.memory_allocated("cpu")
    inject_oom(0, "cpu")
    with pytest.raises(pyxtts.OutOfMemoryError):
        m.forward_backward(batch2)
    assert pyxtts.memory_allocated("cpu") == before
    assert all(np.array_equal(v, params[k]) for k, v in m.state_dict().items())
    assert all(np.array_equal(v, grads[k]) for k, v in grads_of(m).items())
    m.forward_backward(batch2)  # and the model still works


def test_memory_limit_stops_the_step_before_it_starts(rng):
    # without the conditioning path the parameters stay in the small pool, so the arena
    # is the only block of its pool and needs a segment of its own
    m = pyxtts.XTTSGPT(dataclasses.replace(SMALL, conditioning=False))
    batch = random_batch(rng, SMALL, B=8, Lt=40, La=90)
    plan = m.estimate_memory(8, 40, 90)
    assert plan.arena > 2 << 20  # a large-pool block: only a new segment can hold it
    pyxtts.empty_cache("cpu")
    pyxtts.set_memory_limit(pyxtts.memory_reserved("cpu") + plan.arena // 2, "cpu")
    with pytest.raises(pyxtts.OutOfMemoryError, match="out of memory"):
        m.forward_backward(batch)
    assert all(np.all(g.numpy() == 0) for g in m.gradients().values())


# ---- input validation --------------------------------------------------------

def bad_batches(rng):
    base = random_batch(rng, TINY, B=2, Lt=5, La=6)

    def edit(**changes):
        b = {k: np.array(v, copy=True) for k, v in base.items()}
        for k, v in changes.items():
            if v is None:
                del b[k]
            else:
                b[k] = v(b[k]) if callable(v) else v
        return b

    def set_at(idx, value):
        def f(a):
            a[idx] = value
            return a
        return f

    return [
        (edit(text_inputs=None), KeyError, "missing key 'text_inputs'"),
        (dict(base, text_input=base["text_inputs"]), KeyError, "did you mean 'text_inputs'"),
        (edit(text_inputs=lambda a: a.astype(np.float32)), TypeError, "integer"),
        (edit(text_inputs=set_at((0, 1), TINY.text_vocab_size)), ValueError, "out of range"),
        (edit(audio_inputs=set_at((1, 0), -1)), ValueError, "out of range"),
        (edit(audio_targets=set_at((0, 2), TINY.audio_vocab_size)), ValueError, "out of range"),
        (edit(text_lengths=np.array([6, 1])), ValueError, "text_lengths"),
        (edit(audio_lengths=np.array([1, -1])), ValueError, "audio_lengths"),
        (edit(audio_targets=lambda a: a[:, :3]), ValueError, "audio_targets"),
        (edit(cond_latents=lambda a: a[:, :, :5]), ValueError, "cond_latents"),
        (edit(cond_latents=set_at((0, 0, 0), np.nan)), ValueError, "NaN"),
        (edit(text_inputs=np.zeros((2, TINY.max_text_tokens + 1), np.int64),
              text_targets=np.zeros((2, TINY.max_text_tokens + 1), np.int64)), ValueError, "never truncates"),
    ]


@pytest.mark.parametrize("case", range(12))
def test_bad_batches_are_refused_before_any_work(case, rng):
    batch, exc, msg = bad_batches(rng)[case]
    m = pyxtts.XTTSGPT(TINY)
    with pytest.raises(exc, match=msg):
        m.forward_backward(batch)
    assert all(np.all(g.numpy() == 0) for g in m.gradients().values())


def test_sequence_longer_than_the_maximum_raises(rng):
    cfg = pyxtts.ModelConfig(**{**TINY.__dict__, "max_attention_sequence_length": 20})
    m = pyxtts.XTTSGPT(cfg)
    batch = random_batch(rng, cfg, B=1, Lt=10, La=10)  # 3 + 20 > 20
    with pytest.raises(ValueError, match="exceeds max_attention_sequence_length=20"):
        m.forward_backward(batch)
    with pytest.raises(ValueError, match="never truncates"):
        m.estimate_memory(1, 10, 10)


def test_bad_configs_and_arguments():
    with pytest.raises(ValueError, match="d_model"):
        pyxtts.ModelConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_layers"):
        pyxtts.ModelConfig(n_layers=0)
    with pytest.raises(TypeError, match="n_heads"):
        pyxtts.ModelConfig(n_heads=2.5)
    with pytest.raises(ValueError, match="checkpointing"):
        pyxtts.XTTSGPT(TINY, checkpointing="sometimes")
    with pytest.raises(ValueError, match="precision"):
        pyxtts.XTTSGPT(TINY, precision="fp64")
    with pytest.raises(ValueError, match="device"):
        pyxtts.XTTSGPT(TINY, device="tpu")


# ---- state dicts -------------------------------------------------------------

def test_state_dict_round_trip_and_xtts_checkpoint_keys():
    a, b = pyxtts.XTTSGPT(TINY, seed=1), pyxtts.XTTSGPT(TINY, seed=2)
    sd = a.state_dict()
    b.load_state_dict(sd)
    assert all(np.array_equal(v, sd[k]) for k, v in b.state_dict().items())
    full = {"gpt." + k: torch.from_numpy(v) for k, v in sd.items()}  # an XTTS v2 checkpoint's keys
    full["hifigan_decoder.waveform_decoder.conv_pre.weight"] = torch.zeros(3)
    c = pyxtts.XTTSGPT(TINY, seed=3)
    with pytest.raises(KeyError, match="unexpected 1 keys"):
        c.load_state_dict(full)
    missing, unexpected = c.load_state_dict(full, strict=False)
    assert missing == [] and unexpected == ["hifigan_decoder.waveform_decoder.conv_pre.weight"]
    assert all(np.array_equal(v, sd[k]) for k, v in c.state_dict().items())


def test_load_state_dict_refuses_bad_input_and_changes_nothing():
    m = pyxtts.XTTSGPT(TINY, seed=1)
    before = m.state_dict()
    good = pyxtts.XTTSGPT(TINY, seed=2).state_dict()
    cases = [
        ({k: v for k, v in good.items() if k != "mel_head.bias"}, KeyError, "missing 1 keys"),
        ({**good, "text_head.weight": good["text_head.weight"][:, :5]}, ValueError, "expected shape"),
        ({**good, "final_norm.bias": np.full(TINY.d_model, np.nan, np.float32)}, ValueError, "NaN"),
        ({**good, "final_norm.bias": np.zeros(TINY.d_model, np.int32)}, TypeError, "floating-point"),
        ({**good, "gpt.final_norm.bias": good["final_norm.bias"]}, ValueError, "both name"),
    ]
    for state, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            m.load_state_dict(state)
        assert all(np.array_equal(v, before[k]) for k, v in m.state_dict().items())


def test_fault_at_every_allocation_of_a_step(rng):
    m = pyxtts.XTTSGPT(SMALL, checkpointing="auto")
    batch = random_batch(rng, SMALL, B=2, Lt=12, La=20)
    before = pyxtts.memory_stats("cpu")["num_allocs"]
    m.forward_backward(batch)
    n_allocs = pyxtts.memory_stats("cpu")["num_allocs"] - before
    assert n_allocs >= 1  # the arena; the planner allows nothing else
    m.zero_grad()
    params = m.state_dict()
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

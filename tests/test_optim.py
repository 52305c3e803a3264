"""pyxtts.AdamW: torch.optim.AdamW + clip_grad_norm_ semantics over the flat buffers,
weight decay, accumulation, loss scaling, EMA, state, memory plan, determinism, leaks."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")

import helpers  # noqa: E402
import pyxtts  # noqa: E402
from conftest import run_python  # noqa: E402
from helpers import random_batch  # noqa: E402
from helpers.torch_ref import RefGPT  # noqa: E402

# AdamW's math against torch's: the GPT without its conditioning path, whose tensors a batch
# of cond_latents leaves without gradients (test_conditioning.py covers what a step does then)
TINY = dataclasses.replace(helpers.TINY, conditioning=False)


pytestmark = pytest.mark.usefixtures("no_limit_no_fault")


def params_of(model):
    return {k: v.numpy() for k, v in model.parameters().items()}


def torch_optimizer(ref, lr, wd, betas=(0.9, 0.96), eps=1e-8):
    """torch's AdamW with the usual groups: decay for 2+ dim tensors only."""
    decay = [ref.w(n) for n in ref.names if ref.w(n).ndim >= 2]
    no_decay = [ref.w(n) for n in ref.names if ref.w(n).ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps, foreach=False)


def key_bias_free(name, a, d):
    """The key third of c_attn.bias has a gradient of exactly 0 in exact arithmetic
    (softmax ignores a per-query constant), so in fp32 it is rounding noise that Adam
    turns into full-size steps of either sign, in torch as here: left out of
    comparisons between independently computed gradients."""
    return np.concatenate([a[:d], a[2 * d:]]) if name.endswith("c_attn.bias") else a


def flat_padding_mask(model):
    """True at the elements of the flat buffers between tensors (256-byte padding)."""
    views = {k: torch.from_dlpack(v) for k, v in model.parameters().items()}
    base = min(t.data_ptr() for t in views.values())
    n = pyxtts.AdamW(model).state_dict()["num_elements"]
    pad = np.ones(n, bool)
    for t in views.values():
        off = (t.data_ptr() - base) // 4
        pad[off:off + t.numel()] = False
    return pad


# ---- torch equivalence ----------------------------------------------------------

@pytest.mark.parametrize("clip", [1.0, 0.05, None, 0])
def test_matches_torch_adamw_with_clipping(clip, rng):
    """Both optimizers get the same gradients (ours) for 20 steps: parameters and
    moments agree to 1e-5 relative (the arithmetic is torch's, op for op)."""
    lr, wd = 1e-3, 0.1
    m = pyxtts.XTTSGPT(TINY, seed=1)
    ref = RefGPT(TINY, dtype=torch.float32)
    ref.load(m.state_dict())
    topt = torch_optimizer(ref, lr, wd)
    opt = pyxtts.AdamW(m, lr=lr, weight_decay=wd, grad_clip=clip)
    clipped = 0
    for _ in range(20):
        m.zero_grad()
        m.forward_backward(random_batch(rng, TINY, 3, 10, 14))
        for n, g in m.gradients().items():
            ref.w(n).grad = torch.from_numpy(g.numpy())
        if clip:
            norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), clip))
        r = opt.step()
        topt.step()
        assert r["skipped"] is False and r["lr"] == lr and r["loss_scale"] is None
        if clip:
            assert r["grad_norm"] == pytest.approx(norm, rel=1e-5)
            clipped += norm > clip
    if clip == 0.05:
        assert clipped == 20
    assert opt.step_count == 20
    state = opt.state_dict()
    views = {k: torch.from_dlpack(v) for k, v in m.parameters().items()}
    base = min(t.data_ptr() for t in views.values())
    for n, v in params_of(m).items():
        w = ref.w(n).detach().numpy()
        assert np.abs(v - w).max() <= 1e-5 * np.abs(w).max(), n
        off = (views[n].data_ptr() - base) // 4
        ts = topt.state[ref.w(n)]
        for key, tkey in (("m", "exp_avg"), ("v", "exp_avg_sq")):
            got = state[key][off:off + v.size].reshape(v.shape)
            want = ts[tkey].numpy()
            assert np.abs(got - want).max() <= 1e-5 * max(np.abs(want).max(), 1e-30), (n, key)


def test_trains_like_the_torch_reference_in_float32(rng):
    """End to end: RefGPT in float32 with its own backward, torch's clip and AdamW,
    20 steps on random batches, against the engine with pyxtts.AdamW.

    eps = 1e-6: with 1e-8, an element whose gradient in some step is a sum that cancels
    to fp32 noise (a rarely used token's embedding row) moves by +-lr on the sign of that
    noise, in torch as here; on random batches that cost up to 0.05 lr (8x the tolerance
    below) in 1 seed of 12. 1e-6 bounds such a step to lr * noise / eps, and the worst of
    16 seeds is then 0.25 of the tolerance. eps itself is tested on shared gradients above."""
    lr, wd, eps = 1e-4, 0.01, 1e-6
    m = pyxtts.XTTSGPT(TINY, seed=2)
    ref = RefGPT(TINY, dtype=torch.float32)
    ref.load(m.state_dict())
    topt = torch_optimizer(ref, lr, wd, eps=eps)
    opt = pyxtts.AdamW(m, lr=lr, weight_decay=wd, grad_clip=1.0, eps=eps)
    for _ in range(20):
        batch = random_batch(rng, TINY, 2, 8, 12)
        opt.zero_grad()
        loss = m.forward_backward(batch)["loss"]
        topt.zero_grad()
        tloss = ref(batch)[0]
        tloss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        topt.step()
        assert loss == pytest.approx(tloss.item(), rel=1e-5)
    for n, v in params_of(m).items():
        w = ref.w(n).detach().numpy()
        v, w = key_bias_free(n, v.ravel(), TINY.d_model), key_bias_free(n, w.ravel(), TINY.d_model)
        # relative to the tensor's scale; biases start at 0, so for them the scale of the
        # model's weights (the init std, 0.02) is the floor
        assert np.abs(v - w).max() <= 1e-5 * max(np.abs(w).max(), 0.02), n


def test_weight_decay_only_on_matrices_and_padding_untouched(rng):
    """Zero gradients: the moments stay 0, so the step is the decay alone: matrices
    and embeddings scale by float32(1 - lr * wd), vectors keep their bits."""
    lr, wd = 1e-2, 0.5
    m = pyxtts.XTTSGPT(TINY, seed=3)
    before = params_of(m)
    opt = pyxtts.AdamW(m, lr=lr, weight_decay=wd, ema_decay=0.5)
    for _ in range(2):
        opt.step()
    factor = np.float32(1 - lr * wd)
    for n, v in params_of(m).items():
        want = before[n] * factor * factor if before[n].ndim >= 2 else before[n]
        assert np.array_equal(v, want), n
    pad = flat_padding_mask(m)
    assert pad.any()
    m.zero_grad()
    m.forward_backward(random_batch(rng, TINY, 2, 8, 9))
    opt.step()
    state = opt.state_dict()
    for key in ("m", "v", "master", "ema"):
        assert np.isfinite(state[key]).all(), key
        assert not state[key][pad].any(), key


# ---- accumulation -----------------------------------------------------------------

def test_accumulated_micro_batches_step_like_the_big_batch(rng):
    big = random_batch(rng, TINY, 8, 12, 16)
    counts = (int((np.arange(12)[None] < big["text_lengths"][:, None]).sum()),
              int(((np.arange(16)[None] < big["audio_lengths"][:, None]) & (big["audio_targets"] >= 0)).sum()))
    results = []
    for micro in (8, 2):
        m = pyxtts.XTTSGPT(TINY, seed=4)
        # eps well above fp32 summation noise: Adam's first step is lr g / (|g| + eps),
        # whose slope in g is up to lr / eps; with eps=1e-6 (slope 1e3) the ~1e-9
        # summation noise of a gradient became a 1.2e-6 parameter difference (seed
        # 407879408); eps=1e-4 bounds it near 1e-8
        opt = pyxtts.AdamW(m, lr=1e-3, eps=1e-4, weight_decay=0.1)
        for i in range(0, 8, micro):
            part = {k: v[i:i + micro] for k, v in big.items()}
            m.forward_backward(part, token_counts=counts if micro < 8 else None)
        r = opt.step()
        results.append((params_of(m), r["grad_norm"]))
    (p8, n8), (p2, n2) = results
    assert n2 == pytest.approx(n8, rel=1e-6)
    for n in p8:
        a, b = key_bias_free(n, p8[n].ravel(), TINY.d_model), key_bias_free(n, p2[n].ravel(), TINY.d_model)
        assert np.abs(a - b).max() <= 1e-6, n


# ---- loss scaling -----------------------------------------------------------------

def test_loss_scale_unscales_exactly(rng):
    """Gradients of a loss scaled by 2^k step exactly like unscaled ones."""
    batches = [random_batch(rng, TINY, 2, 8, 10) for _ in range(3)]
    out = []
    for scale in (None, 1024.0):
        m = pyxtts.XTTSGPT(TINY, seed=5)
        opt = pyxtts.AdamW(m, lr=1e-3, grad_clip=0.1, loss_scale=scale)
        for b in batches:
            opt.zero_grad()
            m.forward_backward(b)
            if scale:
                for g in m.gradients().values():
                    g.copy_(g.numpy() * np.float32(scale))
            r = opt.step()
        out.append((params_of(m), r["grad_norm"]))
    assert out[0][1] == out[1][1]
    for n in out[0][0]:
        assert np.array_equal(out[0][0][n], out[1][0][n]), n


def test_loss_scale_skips_non_finite_steps_and_grows(rng):
    m = pyxtts.XTTSGPT(TINY, seed=6)
    opt = pyxtts.AdamW(m, lr=1e-3, loss_scale=256.0, growth_interval=3, ema_decay=0.9)
    batch = random_batch(rng, TINY, 2, 8, 10)
    for i in range(3):
        opt.zero_grad()
        m.forward_backward(batch)
        r = opt.step()
        assert r["skipped"] is False
    assert r["loss_scale"] == 512.0 and opt.loss_scale == 512.0 and opt.step_count == 3
    before, state = params_of(m), opt.state_dict()
    for bad in (np.inf, np.nan):
        g = m.gradients()["gpt.h.1.mlp.c_fc.weight"]
        a = g.numpy()
        a[3, 5] = bad
        g.copy_(a)
        r = opt.step()
        assert r["skipped"] is True and not np.isfinite(r["grad_norm"])
        after = opt.state_dict()
        for k in ("m", "v", "master", "ema"):
            assert np.array_equal(after[k], state[k]), k
        for n, v in params_of(m).items():
            assert np.array_equal(v, before[n]), n
    assert opt.loss_scale == 128.0 and opt.step_count == 3
    # without loss scaling a non-finite gradient skips the step too (nothing changes)
    plain = pyxtts.AdamW(m)
    assert plain.step()["skipped"] is True and plain.step_count == 0
    assert all(np.array_equal(v, before[n]) for n, v in params_of(m).items())


# ---- EMA ----------------------------------------------------------------------------

def test_ema_follows_numpy_recurrence_and_swaps(rng):
    d = 0.8
    m = pyxtts.XTTSGPT(TINY, seed=8)
    opt = pyxtts.AdamW(m, lr=1e-3, ema_decay=d)
    ema = opt.state_dict()["master"].copy()
    assert np.array_equal(opt.state_dict()["ema"], ema)
    for _ in range(4):
        opt.zero_grad()
        m.forward_backward(random_batch(rng, TINY, 2, 8, 10))
        opt.step()
        master = opt.state_dict()["master"]
        ema = np.float32(d) * ema + np.float32(1 - d) * master
    state = opt.state_dict()
    np.testing.assert_allclose(state["ema"], ema, rtol=1e-6, atol=1e-7)
    trained = params_of(m)
    assert opt.swap_ema() is True and opt.ema_swapped
    views = {k: torch.from_dlpack(v) for k, v in m.parameters().items()}
    base = min(t.data_ptr() for t in views.values())
    for n, v in params_of(m).items():
        off = (views[n].data_ptr() - base) // 4
        assert np.array_equal(v.ravel(), state["ema"][off:off + v.size]), n
    m.forward(random_batch(rng, TINY, 2, 8, 10))  # evaluation with the EMA weights
    with pytest.raises(RuntimeError, match="swap_ema"):
        opt.step()
    with pytest.raises(RuntimeError, match="swap_ema"):
        opt.state_dict()
    assert opt.swap_ema() is False
    for n, v in params_of(m).items():
        assert np.array_equal(v, trained[n]), n
    assert np.array_equal(opt.state_dict()["ema"], state["ema"])
    with pytest.raises(RuntimeError, match="no EMA"):
        pyxtts.AdamW(m).swap_ema()


# ---- state ----------------------------------------------------------------------------

def test_state_dict_round_trip_continues_bit_identically(rng):
    batches = [random_batch(rng, TINY, 2, 8, 10) for _ in range(6)]
    kw = dict(lr=2e-3, weight_decay=0.05, grad_clip=0.5, loss_scale=64.0, growth_interval=2, ema_decay=0.9)
    a = pyxtts.XTTSGPT(TINY, seed=11)
    oa = pyxtts.AdamW(a, **kw)

    def step(model, opt, b):
        opt.zero_grad()
        model.forward_backward(b)
        for g in model.gradients().values():
            g.copy_(g.numpy() * np.float32(opt.loss_scale))
        return opt.step()

    for b in batches[:3]:
        step(a, oa, b)
    oa.lr = 1e-3
    model_state, opt_state = a.state_dict(), oa.state_dict()
    assert opt_state["step"] == 3 and opt_state["lr"] == 1e-3 and opt_state["loss_scale"] == 128.0
    b_ = pyxtts.XTTSGPT(TINY, seed=99)
    b_.load_state_dict(model_state)
    ob = pyxtts.AdamW(b_, **kw)
    ob.load_state_dict(opt_state)
    assert ob.lr == 1e-3 and ob.step_count == 3 and ob.loss_scale == 128.0
    for b in batches[3:]:
        ra, rb = step(a, oa, b), step(b_, ob, b)
        assert ra == rb
    pa, pb = params_of(a), params_of(b_)
    assert all(np.array_equal(pa[n], pb[n]) for n in pa)
    sa, sb = oa.state_dict(), ob.state_dict()
    for k in sa:
        assert np.array_equal(sa[k], sb[k]) if isinstance(sa[k], np.ndarray) else sa[k] == sb[k], k


@pytest.mark.parametrize("betas", [(0.9, 0.96), (0.9, 0.999)])
def test_state_of_gradients_too_small_for_v_round_trips(rng, betas):
    """A gradient whose (1 - b2) g^2 underflows float leaves v = 0 (or a subnormal) while
    m keeps it; the moment check that refuses swapped or foreign m and v once refused
    this, the optimizer's own state, and so a genuine checkpoint (found by the fuzz)."""
    m = pyxtts.XTTSGPT(TINY, seed=13)
    opt = pyxtts.AdamW(m, betas=betas)
    for k in range(2):  # gradients from 1e-30 to 1e-19: v underflows for most of them
        for g in m.gradients().values():
            mag = 10.0 ** rng.uniform(-30, -19, g.shape)
            g.copy_((mag * rng.choice([-1.0, 1.0], g.shape)).astype(np.float32))
        opt.step()
    s = opt.state_dict()
    assert ((s["m"] != 0) & (s["v"] == 0)).sum() > 1000, "the case: m kept what v lost"
    pyxtts.AdamW(m, betas=betas).load_state_dict(s)  # accepted
    bad = dict(s, m=s["m"] + np.float32(1e-3) * (s["v"] == 0))  # but not an m no v explains
    with pytest.raises(ValueError, match=r"state\['m'\]: \|m\| = "):
        pyxtts.AdamW(m, betas=betas).load_state_dict(bad)


def test_load_state_dict_refusals_change_nothing(rng):
    m = pyxtts.XTTSGPT(TINY, seed=12)
    opt = pyxtts.AdamW(m, lr=1e-3)
    m.forward_backward(random_batch(rng, TINY, 2, 8, 10))
    opt.step()
    params = params_of(m)
    fresh = pyxtts.AdamW(m, lr=5e-4, ema_decay=0.9)

    def bad_cases(good):
        n = good["num_elements"]
        nan = good["m"].copy()
        nan[7] = np.nan
        return [
            (ValueError, "'m'", {**good, "m": good["m"][:-1]}),
            (TypeError, "float32", {**good, "v": good["v"].astype(np.float64)}),
            (ValueError, "NaN", {**good, "m": nan}),
            (ValueError, "'master'", {**good, "master": np.zeros((n, 1), np.float32)}),
            (KeyError, "step", {k: v for k, v in good.items() if k != "step"}),
            (ValueError, "lr", {**good, "lr": -1.0}),
            (ValueError, "betas", {**good, "betas": (0.9, 1.5)}),
            (ValueError, "loss_scale", {**good, "loss_scale": 8.0}),
            (TypeError, "state", [1, 2]),
            (ValueError, r"^state\['num_elements'\]: expected \d+ \(this optimizer's model\), got",
             {**good, "num_elements": n + 1}),
            (TypeError, "num_elements", {**good, "num_elements": "7"}),
        ]

    for o in (opt, fresh):
        before = o.state_dict()
        for exc, match, state in bad_cases({**before, "step": 5, "lr": 1.0}):
            with pytest.raises(exc, match=match):
                o.load_state_dict(state)
            after = o.state_dict()
            for k in before:
                same = (np.array_equal(before[k], after[k]) if isinstance(before[k], np.ndarray)
                        else before[k] == after[k])
                assert same, (match, k)
            assert all(np.array_equal(v, params[k]) for k, v in params_of(m).items())
    good = opt.state_dict()
    with pytest.raises(ValueError, match="ema"):  # fresh keeps an EMA, good has none
        fresh.load_state_dict(good)
    older = {k: v for k, v in good.items() if k != "num_elements"}  # state dicts before it
    pyxtts.AdamW(m, lr=1e-3).load_state_dict(older)
    with pytest.raises(ValueError, match="num_elements"):  # another model size, named as such
        pyxtts.AdamW(pyxtts.XTTSGPT(pyxtts.ModelConfig(
            n_layers=1, d_model=32, n_heads=4, text_vocab_size=37, audio_vocab_size=29,
            max_text_tokens=24, max_audio_tokens=40, n_cond_latents=3, conditioning=False))).load_state_dict(good)


# ---- arguments ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(lr=-1.0), ValueError, "lr"), (dict(lr=float("nan")), ValueError, "lr"),
    (dict(lr="0.1"), TypeError, "lr"), (dict(betas=(0.9, 1.0)), ValueError, r"betas\[1\]"),
    (dict(betas=0.9), TypeError, "betas"), (dict(betas=(-0.1, 0.9)), ValueError, r"betas\[0\]"),
    (dict(eps=0.0), ValueError, "eps"), (dict(weight_decay=-0.1), ValueError, "weight_decay"),
    (dict(weight_decay=float("inf")), ValueError, "weight_decay"),
    (dict(grad_clip=-1.0), ValueError, "grad_clip"), (dict(loss_scale=0.0), ValueError, "loss_scale"),
    (dict(loss_scale=float("inf")), ValueError, "loss_scale"),
    (dict(ema_decay=1.0), ValueError, "ema_decay"), (dict(ema_decay=-0.5), ValueError, "ema_decay"),
    (dict(growth_interval=0), ValueError, "growth_interval"),
])
def test_bad_arguments_name_the_argument(kwargs, exc, match):
    m = pyxtts.XTTSGPT(TINY)
    with pytest.raises(exc, match=match):
        pyxtts.AdamW(m, **kwargs)
    assert m.estimate_memory(1, 4, 4).optimizer == 0


def test_model_argument_lr_attribute_and_zero_grad(rng):
    with pytest.raises(TypeError, match="model: expected a pyxtts.XTTSGPT"):
        pyxtts.AdamW(torch.nn.Linear(2, 2, device="meta"))  # a torch model (never initialised)
    m = pyxtts.XTTSGPT(TINY)
    opt = pyxtts.AdamW(m)
    assert (opt.lr, opt.betas, opt.eps, opt.weight_decay, opt.grad_clip, opt.loss_scale, opt.ema_decay) == \
        (1e-4, (0.9, 0.96), 1e-8, 0.01, 1.0, None, None)
    assert pyxtts.AdamW(m, grad_clip=0).grad_clip is None
    opt.lr = 3e-4
    assert opt.lr == 3e-4 and opt.step()["lr"] == 3e-4
    for bad in (-1e-3, float("inf")):
        with pytest.raises(ValueError, match="lr"):
            opt.lr = bad
    assert opt.lr == 3e-4
    m.forward_backward(random_batch(rng, TINY, 2, 8, 10))
    assert any(g.numpy().any() for g in m.gradients().values())
    opt.zero_grad()
    assert not any(g.numpy().any() for g in m.gradients().values())


# ---- memory ---------------------------------------------------------------------------

def test_plan_counts_optimizer_state_and_matches_measured_peak(rng):
    # 3 layers: a plan without allocator rounding, so before the first step the allocator
    # holds the plan's total less the arena, to the byte
    cfg = pyxtts.ModelConfig(n_layers=3, d_model=128, n_heads=4, text_vocab_size=300, audio_vocab_size=200,
                             max_text_tokens=64, max_audio_tokens=128, n_cond_latents=8, dropout=0.0)
    batch = random_batch(rng, cfg, B=4, Lt=40, La=100, full=True)
    for ema in (None, 0.99):
        pyxtts.empty_cache("cpu")
        base = pyxtts.memory_allocated("cpu")
        m = pyxtts.XTTSGPT(cfg)
        bare = m.estimate_memory(4, 40, 100)
        default = m.estimate_memory(4, 40, 100, optimizer=True)
        assert bare.optimizer == 0 and default.total == bare.total + default.optimizer
        assert pyxtts.estimate_memory(cfg, 4, 40, 100, optimizer=True).total == default.total
        assert pyxtts.estimate_memory(cfg, 4, 40, 100).optimizer == 0
        opt = pyxtts.AdamW(m, ema_decay=ema)
        plan = m.estimate_memory(4, 40, 100)
        assert plan.optimizer == opt.state_bytes >= 2 * 4 * m.num_parameters
        assert plan.total == bare.total + opt.state_bytes
        assert m.estimate_memory(4, 40, 100, optimizer=False).total == bare.total
        assert (plan.optimizer == default.optimizer) == (ema is None)
        fixed = pyxtts.memory_allocated("cpu") - base  # parameters, gradients, optimizer state
        pyxtts.reset_peak_memory_stats("cpu")
        m.forward_backward(batch)
        opt.step()
        # the arena is the first step's one lasting allocation: with it, the plan's total
        # exactly (its block is the arena's bytes, or a whole 2 MiB-rounded segment when
        # the rest would be too small to split off: the plan counts the same)
        arena_block = pyxtts.memory_allocated("cpu") - base - fixed
        assert fixed + arena_block == plan.total
        assert 0 <= arena_block - plan.arena < 2 << 20
        peak = pyxtts.max_memory_allocated("cpu") - base
        assert abs(peak - plan.total) <= 0.01 * plan.total, (ema, peak, plan.total)
        allocs = pyxtts.memory_stats("cpu")["num_allocs"]
        opt.step()
        opt.zero_grad()
        assert pyxtts.memory_stats("cpu")["num_allocs"] == allocs, "the step allocated"
        del opt
        assert m.estimate_memory(4, 40, 100).total == bare.total
        del m


def test_create_destroy_cycles_do_not_leak():
    m = pyxtts.XTTSGPT(TINY)
    pyxtts.AdamW(m, ema_decay=0.9)  # warm the allocator's pools
    base = pyxtts.memory_allocated("cpu")
    for i in range(1000):
        opt = pyxtts.AdamW(m, ema_decay=0.9 if i % 2 else None, loss_scale=8.0)
        if i % 100 == 0:
            opt.step()
            opt.state_dict()
        del opt
    assert pyxtts.memory_allocated("cpu") == base
    assert m.estimate_memory(1, 4, 4).optimizer == 0


# ---- determinism ----------------------------------------------------------------------

# Every CPU kernel partitions its work by the problem's shape, never by the thread count,
# so a training step has the same bits under any OMP_NUM_THREADS. Each run below is a fresh
# process; 3 and 5 threads on a 2-core machine oversubscribe it (fine: only bits are compared).
# "d96" is the model whose (132, 96, 96) products OpenBLAS rounds differently when they are
# split into thread-count panels; its 3 x 2 heads make attention's backward change mode at
# 4 threads (one pass per head below, two passes from there). "d256" has XTTS v2's
# vocabularies and products large enough that their rows and columns are cut into tiles.
DETERMINISM = r"""
import hashlib, sys, numpy as np, pyxtts
from helpers import random_batch
seed, name, precision = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if name == "d96":
    cfg = pyxtts.ModelConfig(n_layers=2, d_model=96, n_heads=2, text_vocab_size=301, audio_vocab_size=203,
                             max_text_tokens=32, max_audio_tokens=48, n_cond_latents=4)
    B, Lt, La = 3, 16, 24
else:
    cfg = pyxtts.ModelConfig(n_layers=2, d_model=256, n_heads=4, text_vocab_size=6681, audio_vocab_size=1026,
                             max_text_tokens=64, max_audio_tokens=208, n_cond_latents=32)
    B, Lt, La = 4, 60, 200
m = pyxtts.XTTSGPT(cfg, seed=3, precision=precision)
opt = pyxtts.AdamW(m, lr=1e-3, grad_clip=0.5, ema_decay=0.9)
rng = np.random.default_rng(seed)
out = []
for _ in range(2):
    opt.zero_grad()
    res = m.forward_backward(random_batch(rng, cfg, B, Lt, La))
    out += [float(res["loss"]).hex(), opt.step()["grad_norm"].hex()]
s = opt.state_dict()
h = hashlib.sha256(b"".join(s[k].tobytes() for k in ("m", "v", "master", "ema")))
h.update(b"".join(p.numpy().tobytes() for p in m.parameters().values()))
print(m.num_parameters, *out, h.hexdigest())
"""


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["d96", "d256"])
def test_step_is_deterministic_across_thread_counts(seed, name, precision):
    """Losses, gradient norms, AdamW state and parameters after two steps are
    bit-identical under OMP_NUM_THREADS = 1, 2, 3, 4 and 5."""
    outs = {}
    for threads in range(1, 6):
        p = run_python(DETERMINISM, str(seed), name, precision, env={"OMP_NUM_THREADS": str(threads)})
        assert p.returncode == 0, p.stderr
        outs[threads] = p.stdout.strip()
    assert int(outs[1].split()[0]) > 32768  # the parallel paths run
    assert len(set(outs.values())) == 1, f"seed={seed} {name} {precision}: " + "\n".join(
        f"{t} threads: {o}" for t, o in outs.items())

"""find_optimal_batch_size (plan, bisection, verified step, state untouched) and
train_step_with_accumulation (remainder rows, exact accumulation, OOM recovery)."""
from __future__ import annotations

import numpy as np
import pytest

import pyxtts
import pyxtts.testing
from helpers import make_rng, random_batch
from helpers.state import assert_same, full_state
from pyxtts.batch import _synthetic_batch

# dropout on: accumulation draws the whole batch's masks. The GPT alone keeps every buffer
# but the arena in the small pool, so the plans' fresh-segment blocks are what the allocator
# gives (test_conditioning.py searches with the conditioning path)
CFG = pyxtts.ModelConfig(n_layers=2, d_model=64, n_heads=4, text_vocab_size=101, audio_vocab_size=53,
                         max_text_tokens=32, max_audio_tokens=48, n_cond_latents=4, conditioning=False)


pytestmark = pytest.mark.usefixtures("no_limit_no_fault")


def fits_real_step(model, opt, B):
    """One real forward, backward and step at the full lengths (state restored)."""
    snap = full_state(model, opt)
    ok = True
    try:
        opt.zero_grad()
        c = model.config  # the search's own batch: full lengths, mels when it plans them
        model.forward_backward(_synthetic_batch(c, B, c.max_text_tokens, c.max_audio_tokens,
                                                c.n_cond_latents, c.planned_cond_frames))
        opt.step()
    except pyxtts.OutOfMemoryError:
        ok = False
    part = lambda tag: {k[2:]: v for k, v in snap.items() if k.startswith(tag)}  # noqa: E731
    opt.load_state_dict(part("o."))
    model.load_state_dict(part("p."))
    for k, g in model.gradients().items():
        g.copy_(part("g.")[k])
    model.release_memory()
    pyxtts.cleanup_gpu_memory("cpu")
    return ok


@pytest.mark.slow
@pytest.mark.parametrize("limit_mib", [30, 60])
def test_found_batch_fits_and_is_close_to_the_true_largest(limit_mib, rng):
    m = pyxtts.XTTSGPT(CFG, seed=1)
    opt = pyxtts.AdamW(m, lr=1e-3, ema_decay=0.9)
    m.forward_backward(random_batch(rng, CFG, 2, 8, 12))  # non-zero gradients and moments to preserve
    opt.step()
    m.forward_backward(random_batch(rng, CFG, 2, 8, 12))
    before = full_state(m, opt)
    pyxtts.set_memory_limit(limit_mib << 20, "cpu")
    found = pyxtts.find_optimal_batch_size(m, opt)
    assert_same(full_state(m, opt), before, "the model and optimizer")
    # brute force: real steps at growing sizes until one fails (memory is monotone)
    true = 0
    while fits_real_step(m, opt, true + 1):
        true += 1
    assert found <= true, "the chosen size does not fit a real step"
    assert fits_real_step(m, opt, found)
    assert found >= 0.85 * true, (found, true)
    print(f"limit {limit_mib} MiB: found {found}, brute force {true}")
    assert_same(full_state(m, opt), before, "the model and optimizer")


@pytest.mark.slow
def test_the_parameters_segments_free_space_is_not_counted_as_room_for_the_step():
    """The CPU demo's model: its 3 MB flat buffers sit in 20 MiB segments, whose 11 MB of
    free space the plan counts as room but the step's 40 MB arena cannot use, so the first
    verification step runs out of memory. The retry once planned below the budget less
    the shortfall, which kept the failed size's slack: its second step failed too and it
    answered 1 at a 64 MiB limit, where 13 fits, and a larger limit gave a smaller answer.
    It now plans below the failed size's total less the shortfall and the margin."""
    cfg = pyxtts.XTTSConfig.load("cpu_demo").model
    m = pyxtts.XTTSGPT(cfg, seed=4)
    opt = pyxtts.AdamW(m)
    before = full_state(m, opt)
    found = []
    for limit_mib in (48, 64, 96):
        pyxtts.set_memory_limit(limit_mib << 20, "cpu")
        n0 = pyxtts.memory_stats("cpu")["num_ooms"]
        size = pyxtts.find_optimal_batch_size(m, opt, max_batch_size=64)
        assert pyxtts.memory_stats("cpu")["num_ooms"] - n0 <= 1, f"{limit_mib} MiB: the retry failed too"
        true = size
        while fits_real_step(m, opt, true + 1):
            true += 1
        assert size >= 0.85 * true, (limit_mib, size, true)
        found.append(size)
    assert found == sorted(found) and found[0] < found[-1], found
    assert_same(full_state(m, opt), before, "the model and optimizer")


def test_search_respects_bounds_and_needs_no_optimizer():
    m = pyxtts.XTTSGPT(CFG, seed=2)
    pyxtts.set_memory_limit(40 << 20, "cpu")
    params = m.state_dict()
    b = pyxtts.find_optimal_batch_size(m, text_len=8, audio_len=8, max_batch_size=5)
    assert b == 5
    assert pyxtts.find_optimal_batch_size(m, verify=False) >= 1
    assert all(np.array_equal(v, params[k]) for k, v in m.state_dict().items())
    assert m.estimate_memory(1, 4, 4).optimizer == 0  # the temporary AdamW is gone
    with pytest.raises(ValueError, match="budget"):
        pyxtts.set_memory_limit(1 << 20, "cpu")
        pyxtts.find_optimal_batch_size(m)
    with pytest.raises(ValueError, match="max_batch_size"):
        pyxtts.find_optimal_batch_size(m, start_batch_size=4, max_batch_size=2)


@pytest.mark.slow
def test_verification_falls_back_after_an_oom():
    m = pyxtts.XTTSGPT(CFG, seed=3)
    opt = pyxtts.AdamW(m)
    pyxtts.set_memory_limit(40 << 20, "cpu")
    plain = pyxtts.find_optimal_batch_size(m, opt)
    before = full_state(m, opt)
    pyxtts.testing.inject_oom(0, "cpu")  # the first real step fails as on a full device
    after_oom = pyxtts.find_optimal_batch_size(m, opt)
    assert after_oom < plain
    assert fits_real_step(m, opt, after_oom)
    assert_same(full_state(m, opt), before, "the model and optimizer")


def test_small_budget_whose_segments_outgrow_the_plan_still_finds_a_size():
    """A few MiB over a tiny model, whose large blocks the allocator rounds to segments
    (near the limit a block takes a segment of its size rounded up to 2 MiB, which the plan
    does not model): the search once raised 'no batch size >= 1 fits' there (found by the
    fuzz). A verification step may run out of memory; the retry finds a size."""
    cfg = pyxtts.ModelConfig(n_layers=1, d_model=8, n_heads=2, text_vocab_size=7, audio_vocab_size=5,
                             max_text_tokens=6, max_audio_tokens=8, n_cond_latents=2, dropout=0.0,
                             max_cond_frames=12)
    m = pyxtts.XTTSGPT(cfg, seed=0)
    opt = pyxtts.AdamW(m)
    before = full_state(m, opt)
    pyxtts.set_memory_limit(pyxtts.memory_allocated("cpu") + (8 << 20), "cpu")
    size = pyxtts.find_optimal_batch_size(m, opt)
    assert size >= 1 and fits_real_step(m, opt, size)
    assert_same(full_state(m, opt), before, "the model and optimizer")


def test_after_two_failed_steps_the_last_try_is_start_batch_size():
    """Two verification steps that run out of memory (injected): the third and last is
    start_batch_size, so that the error it would raise says what did not fit."""
    m = pyxtts.XTTSGPT(CFG, seed=5)
    opt = pyxtts.AdamW(m)
    pyxtts.set_memory_limit(40 << 20, "cpu")
    plain = pyxtts.find_optimal_batch_size(m, opt)
    before = full_state(m, opt)
    sizes = []
    run = m.forward_backward

    def failing_twice(batch, *args, **kwargs):
        sizes.append(len(batch["text_inputs"]))
        if len(sizes) <= 2:
            pyxtts.testing.inject_oom(0, "cpu")
        return run(batch, *args, **kwargs)

    m.forward_backward = failing_twice
    assert pyxtts.find_optimal_batch_size(m, opt, start_batch_size=2) == 2
    assert sizes[0] == plain and sizes[0] > sizes[1] > 2 and sizes[2] == 2, sizes
    assert_same(full_state(m, opt), before, "the model and optimizer")


# ---- accumulation -------------------------------------------------------------------

def fresh(seed=0):
    """eps=1e-6: Adam's first step is lr * g / (|g| + eps), which for a gradient of ~1e-8
    (a dead GELU unit) turns float rounding of the summation order into a visible step;
    eps bounds that amplification so 1e-6 compares the accumulation, not Adam's sign()."""
    m = pyxtts.XTTSGPT(CFG, seed=seed)
    return m, pyxtts.AdamW(m, lr=1e-4, weight_decay=0.01, eps=1e-6)  # lr: AdamW's default


def key_bias_free(name, a):
    """The key third of c_attn.bias has a gradient of exactly 0 in exact arithmetic, so it
    is rounding noise that Adam turns into full-size steps: left out (see test_optim)."""
    d = CFG.d_model
    return np.concatenate([a[:d], a[2 * d:]]) if name.endswith("c_attn.bias") else a


def max_diff(a, b):
    return max(np.abs(key_bias_free(k, a[k]) - key_bias_free(k, b[k])).max() for k in a)


BATCH = random_batch(make_rng("test_batch.BATCH"), CFG, 10, 20, 30)


def clean_reference():
    m, opt = fresh()
    opt.zero_grad()
    out = m.forward_backward(BATCH)
    grads = {k: v.numpy() for k, v in m.gradients().items()}
    step = opt.step()
    return m.state_dict(), out, step, grads


def test_splits_keep_remainder_rows():
    from pyxtts.batch import _splits
    assert [hi - lo for lo, hi in _splits(10, 4)] == [3, 3, 2, 2]
    assert [hi - lo for lo, hi in _splits(7, 7)] == [1] * 7
    assert _splits(10, 4)[-1][1] == 10


@pytest.mark.parametrize("steps", [1, 3, 4, 10, 16])
def test_accumulation_equals_one_big_step(steps):
    ref, out, step, grads = clean_reference()
    m, opt = fresh()
    r = pyxtts.train_step_with_accumulation(m, opt, BATCH, steps)
    assert r.oom_splits == 0 and not r.skipped
    assert r.micro_batch_size == -(-10 // min(steps, 10))
    assert r.loss == pytest.approx(out["loss"], rel=1e-6)
    assert r.audio_loss == pytest.approx(out["audio_loss"], rel=1e-6)
    assert r.grad_norm == pytest.approx(step["grad_norm"], rel=1e-5)
    assert r.tokens_per_s > 0 and r.peak_memory_bytes > 0
    # the micro-batches' fp32 gradients summed in another order: over 40 seeds (2026-11-28)
    # the worst element was 9.8e-7 of its tensor's largest gradient, the worst parameter
    # 6.2e-7 off, so a bound of 1e-6 failed a few runs in a hundred; 4x the worst seen
    for k, g in m.gradients().items():  # the step leaves the accumulated gradient
        np.testing.assert_allclose(g.numpy(), grads[k], rtol=0, atol=4e-6 * np.abs(grads[k]).max() + 1e-12)
    assert max_diff(m.state_dict(), ref) <= 4e-6


@pytest.mark.parametrize("raw", [False, True])
def test_injected_oom_anywhere_gives_the_clean_parameters(raw):
    ref = clean_reference()[0]
    m, opt = fresh()
    pyxtts.cleanup_gpu_memory("cpu")  # so that raw=True counts the step's new segments
    n0 = pyxtts.memory_stats("cpu")["num_raw_allocs" if raw else "num_allocs"]
    pyxtts.train_step_with_accumulation(m, opt, BATCH, 2)
    n = pyxtts.memory_stats("cpu")["num_raw_allocs" if raw else "num_allocs"] - n0
    assert n >= 1
    for after in range(n + 1):
        m, opt = fresh()
        pyxtts.cleanup_gpu_memory("cpu")
        pyxtts.testing.inject_oom(after, "cpu", raw=raw)
        r = pyxtts.train_step_with_accumulation(m, opt, BATCH, 2)
        pyxtts.testing.inject_oom(None, "cpu")
        assert max_diff(m.state_dict(), ref) <= 1e-6, after
        if not raw:
            assert r.oom_splits == (1 if after < n else 0), after
            if r.oom_splits:
                assert r.micro_batch_size < 5


def test_memory_limit_forces_splits_with_the_same_result():
    ref = clean_reference()[0]
    m, opt = fresh()
    need_full = m.estimate_memory(10, 20, 30, CFG.n_cond_latents).total
    need_two = m.estimate_memory(2, 20, 30, CFG.n_cond_latents).total
    pyxtts.cleanup_gpu_memory("cpu")
    pyxtts.set_memory_limit((need_full + need_two) // 2 + (2 << 20), "cpu")
    r = pyxtts.train_step_with_accumulation(m, opt, BATCH, 1)
    assert r.oom_splits >= 1 and r.micro_batch_size < 10
    assert max_diff(m.state_dict(), ref) <= 1e-6


def test_raises_when_one_sample_does_not_fit_and_validates_first():
    m, opt = fresh()
    before = m.state_dict()
    pyxtts.cleanup_gpu_memory("cpu")
    pyxtts.set_memory_limit(pyxtts.memory_reserved("cpu"), "cpu")
    filler = []  # take the free space of the reserved segments: nothing else fits
    try:
        while True:
            filler.append(pyxtts.empty((16384,)))
    except pyxtts.OutOfMemoryError:
        pass
    with pytest.raises(pyxtts.OutOfMemoryError):
        pyxtts.train_step_with_accumulation(m, opt, BATCH, 1)
    del filler
    pyxtts.set_memory_limit(None, "cpu")
    assert all(np.array_equal(v, before[k]) for k, v in m.state_dict().items())
    bad = dict(BATCH, audio_inputs=BATCH["audio_inputs"] + 100)
    with pytest.raises(ValueError, match="audio_inputs"):
        pyxtts.train_step_with_accumulation(m, opt, bad, 2)
    with pytest.raises(ValueError, match="accumulation_steps"):
        pyxtts.train_step_with_accumulation(m, opt, BATCH, 0)


# ---- what the two calls are given -------------------------------------------------------

def test_an_optimizer_built_on_another_model_is_refused_with_nothing_changed(rng):
    """A step of model A with model B's AdamW once updated B (weight decay on zero
    gradients) and left A as it was, reporting a normal step."""
    a, opt_a = fresh(seed=6)
    b, opt_b = fresh(seed=7)
    before = full_state(a, opt_a), full_state(b, opt_b)
    with pytest.raises(ValueError, match=r"^optimizer: this AdamW was built on another model"):
        pyxtts.train_step_with_accumulation(a, opt_b, BATCH, 2)
    with pytest.raises(ValueError, match=r"^optimizer: this AdamW was built on another model"):
        pyxtts.find_optimal_batch_size(a, opt_b)
    assert_same(full_state(a, opt_a), before[0], "model A")
    assert_same(full_state(b, opt_b), before[1], "model B")
    assert opt_a.steps(a) and not opt_a.steps(b) and opt_b.steps(b)


@pytest.mark.parametrize("call, name, shown", [
    (lambda m, o: pyxtts.train_step_with_accumulation(None, o, BATCH, 1), "model", "NoneType"),
    (lambda m, o: pyxtts.train_step_with_accumulation(o, m, BATCH, 1), "model", "AdamW"),
    (lambda m, o: pyxtts.train_step_with_accumulation(m, None, BATCH, 1), "optimizer", "NoneType"),
    (lambda m, o: pyxtts.train_step_with_accumulation(m, "adamw", BATCH, 1), "optimizer", "str"),
    (lambda m, o: pyxtts.train_step_with_accumulation(m, o, BATCH, 1, strategy="ddp"), "strategy", "'ddp'"),
    (lambda m, o: pyxtts.find_optimal_batch_size(m.config), "model", "ModelConfig"),
    (lambda m, o: pyxtts.find_optimal_batch_size(m, "adamw"), "optimizer", "str"),
    (lambda m, o: pyxtts.find_optimal_batch_size(m, o, strategy=1), "strategy", "1"),
])
def test_wrong_objects_are_type_errors_naming_the_argument(call, name, shown):
    m, opt = fresh(seed=8)
    before = full_state(m, opt)
    with pytest.raises(TypeError, match=rf"^{name}: expected .*{shown}"):
        call(m, opt)
    assert_same(full_state(m, opt), before, "the model and optimizer")


def test_offload_true_with_an_optimizer_whose_state_is_on_the_device_is_refused():
    """offload=True plans a temporary optimizer's state in host memory; a given optimizer's
    state is where it is, so the flag with one on the device was silently ignored."""
    m = pyxtts.XTTSGPT(CFG, seed=9)
    on_device = pyxtts.AdamW(m)
    before = full_state(m, on_device)
    with pytest.raises(ValueError, match=r"^offload: True plans .*state_device=None"):
        pyxtts.find_optimal_batch_size(m, on_device, offload=True)
    assert_same(full_state(m, on_device), before, "the model and optimizer")
    del on_device
    pyxtts.set_memory_limit(40 << 20, "cpu")
    offloaded = pyxtts.AdamW(m, state_device="cpu")
    assert pyxtts.find_optimal_batch_size(m, offloaded) == pyxtts.find_optimal_batch_size(m, offloaded, offload=True)

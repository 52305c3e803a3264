"""A failure changes nothing (issue 11, items 5-8 and 14): out-of-memory errors injected at
every allocation of the stateful calls, each trial checking parameters, gradients,
optimizer state and the allocator's counters; and writes refused while a step runs in
another thread."""
from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

import pyxtts
import pyxtts.testing
from helpers import make_rng, random_batch, trained
from helpers.state import assert_same, full_state

CFG = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=37, audio_vocab_size=29,
                         max_text_tokens=24, max_audio_tokens=40, n_cond_latents=3)

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")


# ---- 5. load_state_dict and load_checkpoint: all or nothing --------------------------

@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_load_state_dict_allocates_nothing_and_writes_all(precision):
    """The per-tensor device temporaries that an out-of-memory error could interrupt
    (leaving 1-35 of 36 tensors written) are gone: the load makes no allocator request,
    so a fault injected at any point never fires inside it."""
    m, _, _ = trained(CFG, precision, salt="failure_state")
    new = {k: make_rng("new", k).standard_normal(v.shape) for k, v in m.state_dict().items()}
    n0 = pyxtts.memory_stats("cpu")["num_allocs"]
    for after in range(4):
        pyxtts.testing.inject_oom(after, "cpu")
        m.load_state_dict(new)
        pyxtts.testing.inject_oom(None, "cpu")
    assert pyxtts.memory_stats("cpu")["num_allocs"] == n0
    want = m.dtype.numpy
    for k, v in m.state_dict().items():  # float64 -> float32 -> the model's dtype, nearest even
        ref = new[k].astype(np.float32).astype(want)
        assert np.array_equal(v.view(np.uint8), ref.view(np.uint8)), k


def test_load_state_dict_refusal_writes_nothing():
    """A bad tensor late in the mapping: the ones before it are not written."""
    m, opt, _ = trained(CFG, salt="failure_state")
    before = full_state(m, opt)
    new = {k: np.full(v.shape, 0.5, np.float32) for k, v in m.state_dict().items()}
    last = list(new)[-1]
    new[last] = np.full(new[last].shape, np.nan, np.float32)
    with pytest.raises(ValueError, match="NaN"):
        m.load_state_dict(new)
    assert_same(full_state(m, opt), before, "after a refused load_state_dict")


# load_checkpoint and find_optimal_batch_size (with and without an optimizer) under an
# out-of-memory error at every allocation: rows of tests/test_oom_sweep.py's table.


# ---- 7. the step arena: released by a failed reservation, documented -----------------

def test_failed_step_releases_the_arena_of_another_shape_and_nothing_else():
    m, opt, batch = trained(CFG, salt="failure_state")
    before = full_state(m, opt)
    assert m._core.arena_bytes > 0
    arena = pyxtts.memory_allocated("cpu")
    bigger = random_batch(make_rng("failure_state.bigger"), CFG, 6, 24, 40)
    pyxtts.testing.inject_oom(0, "cpu")
    with pytest.raises(pyxtts.OutOfMemoryError):
        m.forward_backward(bigger, loss_scale=opt.loss_scale)
    pyxtts.testing.inject_oom(None, "cpu")
    assert_same(full_state(m, opt), before, "a step that did not fit")
    assert m._core.arena_bytes == 0
    assert pyxtts.memory_allocated("cpu") < arena  # lower, never higher: the cache went
    m.forward_backward(batch, loss_scale=opt.loss_scale)  # and comes back with the next step
    assert m._core.arena_bytes > 0


# ---- 8. train_step_with_accumulation after an out-of-memory error ---------------------

@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_accumulation_after_oom_equals_the_call_at_the_micro_batch_that_fitted(precision):
    """What docs/api.md states (Batch size and accumulation): bit for bit the step of a
    call whose micro-batches are those that fitted; and close to the never-failed step
    (summation order only)."""
    batch = random_batch(make_rng("failure_state.acc"), CFG, 8, 12, 20)

    def run(steps, inject):
        m = pyxtts.XTTSGPT(CFG, precision=precision, seed=3)
        opt = pyxtts.AdamW(m, loss_scale=2.0**10 if precision == "fp16" else None, eps=1e-6)
        if inject:
            pyxtts.testing.inject_oom(0, "cpu")
        try:
            r = pyxtts.train_step_with_accumulation(m, opt, batch, steps)
        finally:
            pyxtts.testing.inject_oom(None, "cpu")
        return r, full_state(m, opt)

    r_oom, after_oom = run(1, inject=True)
    assert r_oom.oom_splits == 1 and r_oom.micro_batch_size == 4
    r_halved, halved = run(2, inject=False)
    assert r_halved.oom_splits == 0 and r_halved.micro_batch_size == 4
    assert_same(after_oom, halved, "after an OOM vs. the call at the micro-batch that fitted")
    _, clean = run(1, inject=False)
    for k, v in clean.items():
        if k.startswith("p.") and not k.endswith("c_attn.bias"):  # see test_batch.key_bias_free
            a, b = v.astype(np.float32), after_oom[k].astype(np.float32)
            tol = 1e-5 if precision == "fp32" else 2e-3  # one fp16 ulp near 1 is 1e-3
            assert np.abs(a - b).max() <= tol, k


def test_forward_backward_zero_grad_zeroes_only_once_the_step_fits():
    """zero_grad=True: a step that does not fit leaves the gradients as they were (what
    train_step_with_accumulation relies on); one that fits equals zero_grad() then the step."""
    m, opt, batch = trained(CFG, salt="failure_state")
    before = full_state(m, opt)
    m.release_memory()
    pyxtts.testing.inject_oom(0, "cpu")
    with pytest.raises(pyxtts.OutOfMemoryError):
        m.forward_backward(batch, zero_grad=True)
    pyxtts.testing.inject_oom(None, "cpu")
    assert_same(full_state(m, opt), before, "a step that did not fit")
    m.forward_backward(batch, zero_grad=True, dropout_step=0)
    got = full_state(m, opt)
    m.zero_grad()
    m.forward_backward(batch, dropout_step=0)
    assert_same(got, full_state(m, opt), "zero_grad=True vs zero_grad() then the step")
    with pytest.raises(TypeError, match="zero_grad: expected a bool, got int"):
        m.forward_backward(batch, zero_grad=1)


def test_keep_larger_arena_steps_a_smaller_batch_in_the_cached_arena():
    """keep_larger_arena=True: a smaller step allocates nothing in the larger cached arena
    and computes what it computes in its own (same loss and gradient bits)."""
    batch = random_batch(make_rng("failure_state.keep"), CFG, 4, 12, 20)
    small = {k: v[:3] for k, v in batch.items()}
    m = pyxtts.XTTSGPT(CFG, seed=5)
    want = m.forward_backward(small, zero_grad=True, dropout_step=0)
    grads = {k: g.numpy().copy() for k, g in m.gradients().items()}
    m.forward_backward(batch, dropout_step=0)
    arena, n0 = m._core.arena_bytes, pyxtts.memory_stats("cpu")["num_allocs"]
    got = m.forward_backward(small, zero_grad=True, dropout_step=0, keep_larger_arena=True)
    assert pyxtts.memory_stats("cpu")["num_allocs"] == n0 and m._core.arena_bytes == arena
    assert got == want
    for k, g in m.gradients().items():
        assert np.array_equal(g.numpy().view(np.uint8), grads[k].view(np.uint8)), k


# ---- 14. writes refused while a step runs in another thread --------------------------

# what the two tests below tried, for tests/bench/hardening_report.py: per test the writes
# tried, those refused, and those accepted while the step ran (must be 0)
THREAD_TRIALS: dict[str, dict[str, int]] = {}


def test_mutations_refused_during_a_step_in_another_thread():
    """A step runs without the GIL; zero_grad, load_state_dict, copy_ into a parameter or
    gradient view, checkpointing and AdamW's writes are refused until it ends, and the
    step's result is exactly that of an undisturbed step. Every write tried is a no-op
    (the values already there), so one that slips in before the step starts or after it
    ends cannot change the result; one accepted between two refusals is a failure."""
    cfg = pyxtts.ModelConfig(n_layers=4, d_model=128, n_heads=4, text_vocab_size=300,
                             audio_vocab_size=200, max_text_tokens=64, max_audio_tokens=128,
                             n_cond_latents=0)
    batch = random_batch(make_rng("failure_state.threads"), cfg, 8, 64, 128)
    ref = pyxtts.XTTSGPT(cfg, seed=5)
    ref.forward_backward(batch)
    want = {k: v.numpy() for k, v in ref.gradients().items()}
    m = pyxtts.XTTSGPT(cfg, seed=5)
    opt = pyxtts.AdamW(m)
    params, grads = m.parameters(), m.gradients()
    name = next(iter(params))
    state, opt_state = m.state_dict(), opt.state_dict()
    attempts = {
        "zero_grad": m.zero_grad,
        "opt.zero_grad": opt.zero_grad,
        "load_state_dict": lambda: m.load_state_dict(state),
        "param.copy_": lambda: params[name].copy_(state[name]),
        "grad.copy_": lambda: grads[name].copy_(want[name]),
        "checkpointing": lambda: setattr(m, "checkpointing", "none"),
        "opt.load_state_dict": lambda: opt.load_state_dict(opt_state),
    }
    events: list[tuple[str, bool]] = []
    done = threading.Event()
    errors = []

    def step():
        try:
            m.forward_backward(batch)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            done.set()

    def attempt(k):
        try:
            attempts[k]()
            events.append((k, True))
        except RuntimeError as exc:
            assert "running" in str(exc), (k, exc)
            events.append((k, False))

    t = threading.Thread(target=step)
    t.start()
    # a harmless write until the step has begun (refused), then every kind
    while not done.is_set() and not any(not ok for _, ok in events):
        attempt("checkpointing")
    while not done.is_set():
        for k in attempts:
            attempt(k)
    t.join()
    assert not errors, errors
    refused = [i for i, (_, ok) in enumerate(events) if not ok]
    assert refused, "the step ended before anything was tried"
    inside = events[refused[0]:refused[-1] + 1]
    THREAD_TRIALS["forward_backward"] = {"writes_tried": len(events), "refused": len(refused),
                                         "accepted_during_step": sum(ok for _, ok in inside)}
    assert all(not ok for _, ok in inside), \
        f"accepted while the step ran: {sorted({k for k, ok in inside if ok})}"
    assert {k for k, _ in inside} == set(attempts), "not every kind was tried during the step"
    # after the step's end the loop may have zeroed the gradients; anything else it wrote
    # is what was there
    zeroed = any(k in ("zero_grad", "opt.zero_grad") for k, _ in events[refused[-1] + 1:])
    for k, v in m.gradients().items():
        assert np.array_equal(v.numpy(), np.zeros_like(want[k]) if zeroed else want[k]), k


def test_optimizer_step_refuses_model_writes_in_another_thread():
    """The same during AdamW.step (which once accepted 341,861 writes)."""
    cfg = pyxtts.ModelConfig(n_layers=8, d_model=256, n_heads=4, text_vocab_size=300,
                             audio_vocab_size=200, max_text_tokens=64, max_audio_tokens=128,
                             n_cond_latents=0)
    m = pyxtts.XTTSGPT(cfg, seed=6)
    for g in m.gradients().values():
        g.copy_(np.full(g.shape, 1e-3, np.float32))
    ref_m = pyxtts.XTTSGPT(cfg, seed=6)
    for g in ref_m.gradients().values():
        g.copy_(np.full(g.shape, 1e-3, np.float32))
    pyxtts.AdamW(ref_m).step()
    want = ref_m.state_dict()
    opt = pyxtts.AdamW(m)
    params = m.parameters()
    name = next(iter(params))
    events: list[bool] = []
    done = threading.Event()

    def attempt(f):
        try:
            f()
            events.append(True)
        except RuntimeError as exc:
            assert "running" in str(exc), exc
            events.append(False)

    t = threading.Thread(target=lambda: (opt.step(), done.set()))
    t.start()
    # a harmless write until the step has begun; then writes of the values the step
    # leaves, so one that lands after its end changes nothing
    while not done.is_set() and False not in events:
        attempt(lambda: setattr(m, "checkpointing", "none"))
    while not done.is_set():
        for f in (m.zero_grad, lambda: params[name].copy_(want[name]), lambda: m.load_state_dict(want)):
            attempt(f)
    t.join()
    got = m.state_dict()
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    assert False in events, "the step ended before anything was tried"
    first, last = events.index(False), len(events) - 1 - events[::-1].index(False)
    THREAD_TRIALS["AdamW.step"] = {"writes_tried": len(events), "refused": events.count(False),
                                   "accepted_during_step": sum(events[first:last + 1])}
    assert not any(events[first:last + 1]), "a write was accepted during AdamW.step"


# ---- 11., 13. numerics: a step never leaves a non-finite parameter ---------------------

@pytest.mark.parametrize("precision,lr,wd", [("fp32", 1e38, 0.0), ("bf16", 1e38, 0.0), ("fp16", 1e10, 0.0),
                                             ("fp32", 1e-4, 1e300), ("fp32", 2.0, 1.0)])
def test_hyper_parameters_that_could_overflow_a_step_are_refused(precision, lr, wd):
    """Once accepted: the first step wrote inf/NaN and reported skipped=False."""
    m = pyxtts.XTTSGPT(CFG, precision=precision, seed=0)
    with pytest.raises(ValueError, match="lr"):
        pyxtts.AdamW(m, lr=lr, weight_decay=wd)
    opt = pyxtts.AdamW(m, weight_decay=0.01)
    before = opt.lr
    with pytest.raises(ValueError, match="lr"):  # lr alone too large, or lr * 0.01 > 1
        opt.lr = lr if wd == 0 else 101.0
    assert opt.lr == before
    state = opt.state_dict()
    state["lr"] = lr
    state["weight_decay"] = wd
    with pytest.raises(ValueError, match="lr"):
        opt.load_state_dict(state)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_the_largest_accepted_lr_keeps_parameters_finite(precision, rng):
    """At the bound: large gradients of both signs, several steps, every parameter finite
    and the steps reported as taken."""
    m = pyxtts.XTTSGPT(CFG, precision=precision, seed=0)
    u = 1.0 / np.sqrt((1 - 0.96) * (1 - 0.9**2 / 0.96))
    top = (65504.0 if precision == "fp16" else float(np.finfo(np.float32).max)) / 2 / u
    opt = pyxtts.AdamW(m, lr=top, weight_decay=0.0, grad_clip=None)
    for _ in range(3):
        for g in m.gradients().values():
            g.copy_(rng.standard_normal(g.shape).astype(np.float32) * 1e3)
        assert opt.step()["skipped"] is False
        for k, v in m.state_dict().items():
            assert np.isfinite(v.astype(np.float32)).all(), k


def test_loss_scale_is_capped():
    """Zero gradients and growth_interval=1 once doubled the scale to inf by step 1007."""
    m = pyxtts.XTTSGPT(CFG, precision="fp16", seed=0)
    opt = pyxtts.AdamW(m, loss_scale=2.0**20, growth_interval=1)
    m.zero_grad()
    for _ in range(10):
        opt.step()
    assert opt.loss_scale == 2.0**24
    with pytest.raises(ValueError, match="loss_scale"):
        pyxtts.AdamW(m, loss_scale=2.0**25)


# ---- 12. a non-finite state is never saved, so never pruned for ------------------------

def test_non_finite_parameters_are_not_saved(tmp_path):
    m = pyxtts.XTTSGPT(CFG, seed=0)
    name = next(iter(m.parameters()))
    a = m.parameters()[name].numpy()
    a.flat[0] = np.inf
    m.parameters()[name].copy_(a)
    with pytest.raises(ValueError, match="NaN or infinity"):
        pyxtts.save_checkpoint(tmp_path / "c.safetensors", m)
    assert not list(tmp_path.iterdir())


def test_trainer_save_and_load_make_no_allocator_request(tmp_path):
    """Trainer.save and Trainer.load read and write host copies only, so an out-of-memory
    error injected at any allocation index cannot fire inside them: the counters of the
    allocator do not move, and the state round-trips exactly."""
    cfg = pyxtts.XTTSConfig()
    cfg.model = CFG
    cfg.training.device = "cpu"
    cfg.training.checkpoint_dir = str(tmp_path / "run")
    tr = pyxtts.Trainer(cfg, progress=False)
    tr.model.forward_backward(random_batch(make_rng("failure_state.trainer"), CFG, 2, 6, 9))
    tr.optimizer.step()
    want = full_state(tr.model, tr.optimizer)
    stats = pyxtts.memory_stats("cpu")
    pyxtts.testing.inject_oom(0, "cpu")
    try:
        path = tr.save()
        tr.model.zero_grad()
        tr.load(path)
    finally:
        pyxtts.testing.inject_oom(None, "cpu")
    after = pyxtts.memory_stats("cpu")
    assert (after["num_allocs"], after["allocated_bytes"]) == (stats["num_allocs"], stats["allocated_bytes"])
    got = full_state(tr.model, tr.optimizer)
    for k in want:
        if not k.startswith("g."):
            assert_same({k: got[k]}, {k: want[k]}, "save then load")

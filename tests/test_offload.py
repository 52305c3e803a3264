"""AdamW with its state in host memory (``state_device="cpu"``): the offloaded step
against the plain one bit for bit (accumulation, clipping, weight-decay groups, EMA, fp16
loss scaling with skipped steps, steps that leave the conditioning path alone, chunks that
cut tensors in two), its state and checkpoints interchangeable with the plain optimizer's,
its memory where the plan says, and its refusals.

On the CPU the model's device is host memory too: the offloaded state then sits in the
host pool, apart from the CPU allocator, and every transfer goes through the staging
buffers as on a GPU, so the path a GPU takes (chunking, fences, parameters written back)
is exercised here. The ``cuda:0`` cases run where a GPU is."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import pyxtts
import pyxtts.testing
from conftest import DEVICES
from helpers import make_rng, random_batch
from helpers.state import full_state, state_diff

pytestmark = pytest.mark.usefixtures("check_memory")

# 2 layers of d=32 with the conditioning path (3 latents from up to 24 mel frames) and
# dropout: the smallest model with every kind of tensor the optimizer steps
CFG = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=37, audio_vocab_size=29,
                         max_text_tokens=24, max_audio_tokens=40, n_cond_latents=3, max_cond_frames=24,
                         dropout=0.1)
HYPER = dict(lr=3e-3, betas=(0.9, 0.96), eps=1e-8, weight_decay=0.1, grad_clip=0.05, ema_decay=0.9)


def batch(rng, mels: bool) -> dict:
    """4 rows; the conditioning path trained from reference mels, or left alone (fixed
    cond_latents: a step then skips its tensors, as torch skips parameters without .grad)."""
    b = random_batch(rng, CFG, 4, 10, 16, n_cond=0 if mels else None)
    if mels:
        b["cond_mels"] = rng.standard_normal((4, 80, 20)).astype(np.float32)
    return b


def optimizer(model, offload: bool, chunk: int | None = None, **kw):
    hyper = {**HYPER, **kw}
    if model.precision == "fp16":  # a scale that overflows at first: skipped steps, halvings
        hyper.update(loss_scale=2.0**24, growth_interval=3)
    if offload:
        hyper.update(state_device="cpu", offload_chunk=chunk)
    return pyxtts.AdamW(model, **hyper)


def train(device: str, precision: str, offload: bool, chunk: int | None, steps: int, salt: str) -> list[dict]:
    """Every step's state (parameters, gradients, every optimizer array and scalar) and
    result, for ``steps`` steps of 2 accumulated micro-batches."""
    model = pyxtts.XTTSGPT(CFG, device=device, precision=precision, seed=5)
    opt = optimizer(model, offload, chunk)
    rng = make_rng("test_offload", salt, precision)
    out = []
    for step in range(steps):
        r = pyxtts.train_step_with_accumulation(model, opt, batch(rng, mels=step % 3 != 1), 2)
        # the norm and loss by their bits: a skipped step's norm is inf or NaN
        out.append({**full_state(model, opt), "skipped": r.skipped, "grad_norm": np.array([r.grad_norm]),
                    "loss": np.array([r.loss])})
    return out


def assert_same_runs(a: list[dict], b: list[dict], what: str) -> None:
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        diff = state_diff(x, y)
        assert not diff, f"{what}: step {step} differs in {diff[:6]}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_offloaded_steps_have_the_plain_steps_bits(device, precision):
    """20 steps, each of 2 micro-batches, with clipping (the norm is always above 0.05),
    decoupled decay on the default tensors, an EMA, the conditioning path trained on two
    steps of three, and in fp16 a loss scale that overflows first (skipped steps): the
    offloaded state is the plain one's, bit for bit, after every step, whether the flat
    buffers go over in one chunk, in chunks of 1000 elements (tensors cut in two, chunks
    of padding alone) or of 64."""
    plain = train(device, precision, False, None, 20, "bits")
    assert any(not s["skipped"] for s in plain)
    if precision == "fp16":
        assert plain[0]["skipped"] and sum(s["skipped"] for s in plain) >= 2
    for chunk in (None, 1000, 64):
        assert_same_runs(train(device, precision, True, chunk, 20, "bits"), plain, f"chunk {chunk}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_swap_ema_and_state_round_trip_as_the_plain_optimizer(device, precision):
    rng = make_rng("test_offload", "swap", precision)
    models, opts = [], []
    for offload in (False, True):
        m = pyxtts.XTTSGPT(CFG, device=device, precision=precision, seed=9)
        models.append(m)
        opts.append(optimizer(m, offload, 700))
    batches = [batch(rng, mels=True) for _ in range(3)]
    for m, o in zip(models, opts):
        for b in batches:
            pyxtts.train_step_with_accumulation(m, o, b, 1)
    plain, off = models
    assert opts[1].state_device == "cpu" and opts[0].state_device is None
    assert state_diff(full_state(off, opts[1]), full_state(plain, opts[0])) == []
    trained = plain.state_dict()
    for o in opts:
        assert o.swap_ema() is True
    assert state_diff(off.state_dict(), plain.state_dict()) == []
    assert state_diff(plain.state_dict(), trained) != [], "the EMA differs from the weights"
    for o in opts:
        assert o.swap_ema() is False
    assert state_diff(off.state_dict(), trained) == [] and state_diff(plain.state_dict(), trained) == []
    # one state_dict format: each loads the other's, and they step on alike
    sp, so = opts[0].state_dict(), opts[1].state_dict()
    assert sp.keys() == so.keys()
    opts[0].load_state_dict(so)
    opts[1].load_state_dict(sp)
    b = batch(rng, mels=False)
    for m, o in zip(models, opts):
        pyxtts.train_step_with_accumulation(m, o, b, 2)
    assert state_diff(full_state(off, opts[1]), full_state(plain, opts[0])) == []


def test_checkpoints_resume_across_placements(tmp_path):
    """A run saved with its state in host memory resumes with it on the device, and the
    reverse; every combination is bit-exact against the uninterrupted run."""
    rng = make_rng("test_offload", "resume")
    batches = [batch(rng, mels=i % 2 == 0) for i in range(6)]

    def run(start: bool, end: bool) -> dict:
        m = pyxtts.XTTSGPT(CFG, precision="bf16", seed=3)
        o = optimizer(m, start, 900)
        for b in batches[:3]:
            pyxtts.train_step_with_accumulation(m, o, b, 2)
        path = tmp_path / f"{start}-{end}.safetensors"
        pyxtts.save_checkpoint(path, m, o, step=3, extra={"dropout_step": m.dropout_step})
        del m, o
        m = pyxtts.XTTSGPT(CFG, precision="bf16", seed=4)  # other weights, then the checkpoint's
        o = optimizer(m, end, 900)
        meta = pyxtts.load_checkpoint(path, m, o)
        m.dropout_step = meta["extra"]["dropout_step"]
        for b in batches[3:]:
            pyxtts.train_step_with_accumulation(m, o, b, 2)
        return full_state(m, o)

    m = pyxtts.XTTSGPT(CFG, precision="bf16", seed=3)
    o = optimizer(m, False, None)
    for b in batches:
        pyxtts.train_step_with_accumulation(m, o, b, 2)
    whole = full_state(m, o)
    for start in (False, True):
        for end in (False, True):
            assert state_diff(run(start, end), whole) == [], (start, end)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_memory_is_where_the_plan_says(device, precision):
    model = pyxtts.XTTSGPT(CFG, device=device, precision=precision, seed=1)
    dev0, host0 = pyxtts.memory_allocated(device), pyxtts.memory_allocated("host")
    opt = optimizer(model, True, 1000)
    assert pyxtts.memory_allocated(device) - dev0 == opt.state_bytes > 0  # the norm's workspace
    assert pyxtts.memory_allocated("host") - host0 == opt.host_state_bytes
    plain = model.estimate_memory(2, 10, 16, optimizer=True, offload=False)
    attached = model.estimate_memory(2, 10, 16)  # optimizer=None: the attached one, where it lives
    assert (attached.optimizer, attached.host_optimizer) == (opt.state_bytes, opt.host_state_bytes)
    assert attached.total == plain.total - plain.optimizer + opt.state_bytes
    pinned = device.startswith("cuda") or pyxtts.cuda_available()  # the pool is pinned where a GPU is
    assert (attached.host_pinned, attached.host_pageable) == ((opt.host_state_bytes, 0) if pinned
                                                              else (0, opt.host_state_bytes))
    assert pyxtts.memory_stats("host")["pinned"] is pinned
    # a default AdamW's (no EMA, the default chunk): the plan without a model gives its bytes
    del opt
    opt = pyxtts.AdamW(model, state_device="cpu")
    free = pyxtts.estimate_memory(CFG, 2, 10, 16, optimizer=True, offload=True, device=device, precision=precision)
    assert (free.optimizer, free.host_optimizer) == (opt.state_bytes, opt.host_state_bytes)
    assert "host: optimizer state (offloaded)" in str(free)
    del opt
    assert pyxtts.memory_allocated("host") == host0


def test_a_host_too_small_is_an_out_of_memory_error_before_anything_changes():
    model = pyxtts.XTTSGPT(CFG, seed=2)
    before = model.state_dict()
    host0, cpu0 = pyxtts.memory_allocated("host"), pyxtts.memory_allocated("cpu")
    pyxtts.empty_cache("host")  # no cached segment to serve the state from
    pyxtts.set_memory_limit(pyxtts.memory_reserved("host") + (1 << 16), "host")
    try:
        with pytest.raises(pyxtts.OutOfMemoryError, match="host pool") as info:
            optimizer(model, True)
    finally:
        pyxtts.set_memory_limit(None, "host")
    assert info.value.device == "host" and info.value.requested_bytes > 0
    assert "Host out of memory" in str(info.value)
    assert pyxtts.memory_allocated("host") == host0 and pyxtts.memory_allocated("cpu") == cpu0
    assert state_diff(model.state_dict(), before) == []
    # and an injected fault at the host pool's first request likewise
    pyxtts.testing.inject_oom(0, "host")
    try:
        with pytest.raises(pyxtts.OutOfMemoryError):
            optimizer(model, True)
    finally:
        pyxtts.testing.inject_oom(None, "host")
    assert pyxtts.memory_allocated("host") == host0 and state_diff(model.state_dict(), before) == []


@pytest.mark.parametrize("offload", [False, True])
def test_a_failed_construction_leaves_the_models_plans_as_they_were(offload):
    """The bytes of the state are added to the model's plans once it is built; a
    construction that ran out of memory took off bytes it had never added (the plans said
    -72704 bytes of optimizer state after one)."""
    model = pyxtts.XTTSGPT(CFG, seed=2)
    before = model.estimate_memory(2, 10, 16)
    pool = "host" if offload else "cpu"
    for after in range(8):
        pyxtts.testing.inject_oom(after, pool)
        try:
            opt = optimizer(model, offload, 1000)
        except pyxtts.OutOfMemoryError:
            opt = None
        finally:
            pyxtts.testing.inject_oom(None, pool)
        if opt is None:
            assert model.estimate_memory(2, 10, 16) == before, after
        else:  # past the construction's requests: it was built, and counts
            assert model.estimate_memory(2, 10, 16).optimizer == opt.state_bytes
            del opt
            assert model.estimate_memory(2, 10, 16) == before
            break
    else:
        raise AssertionError("the construction never got past its faults")


@pytest.mark.parametrize("kwargs, kind, text", [
    ({"state_device": "cuda:0"}, ValueError, "state_device: expected None .* or 'cpu' .*, got 'cuda:0'"),
    ({"state_device": "host"}, ValueError, "state_device: .*got 'host'"),
    ({"state_device": "CPU"}, ValueError, "state_device: .*got 'CPU'"),
    ({"state_device": 0}, TypeError, "state_device: expected None or 'cpu', got int"),
    ({"state_device": b"cpu"}, TypeError, "state_device: expected None or 'cpu', got bytes"),
    ({"offload_chunk": 1024}, ValueError, "offload_chunk: only with state_device='cpu'"),
    ({"state_device": "cpu", "offload_chunk": 0}, ValueError, "offload_chunk"),
    ({"state_device": "cpu", "offload_chunk": -5}, ValueError, "offload_chunk"),
    ({"state_device": "cpu", "offload_chunk": 2**41}, ValueError, "offload_chunk"),
    ({"state_device": "cpu", "offload_chunk": 1.5}, TypeError, "offload_chunk"),
])
def test_bad_placements_are_refused_naming_the_argument(kwargs, kind, text):
    model = pyxtts.XTTSGPT(CFG, seed=2)
    host0, cpu0 = pyxtts.memory_allocated("host"), pyxtts.memory_allocated("cpu")
    with pytest.raises(kind, match=text):
        pyxtts.AdamW(model, **kwargs)
    assert pyxtts.memory_allocated("host") == host0 and pyxtts.memory_allocated("cpu") == cpu0


def test_a_checkpoint_of_another_model_is_refused_by_the_offloaded_optimizer(tmp_path):
    small = pyxtts.XTTSGPT(dataclasses.replace(CFG, n_layers=1), seed=1)
    other = pyxtts.AdamW(small, state_device="cpu")
    pyxtts.save_checkpoint(tmp_path / "small.safetensors", small, other)
    model = pyxtts.XTTSGPT(CFG, seed=2)
    opt = optimizer(model, True, 500)
    before = full_state(model, opt)
    with pytest.raises(pyxtts.CheckpointError):
        pyxtts.load_checkpoint(tmp_path / "small.safetensors", model, opt)
    with pytest.raises(ValueError, match="num_elements"):
        opt.load_state_dict(other.state_dict())
    assert state_diff(full_state(model, opt), before) == []


def test_optimizer_offload_in_the_config_and_the_trainer(tmp_path):
    from pyxtts.config import TrainingConfig, XTTSConfig, offload_for

    assert TrainingConfig().optimizer_offload == "auto"
    with pytest.raises(ValueError, match=r"training.optimizer_offload: expected true, false or 'auto', got 'yes'"):
        TrainingConfig(optimizer_offload="yes")
    with pytest.raises(TypeError, match="training.optimizer_offload"):
        TrainingConfig(optimizer_offload=1)
    model = {k: getattr(CFG, k) for k in ("n_layers", "d_model", "n_heads", "text_vocab_size", "audio_vocab_size",
                                          "max_text_tokens", "max_audio_tokens", "n_cond_latents")}
    for value, offloaded in (("auto", False), (True, True), (False, False)):
        cfg = XTTSConfig.from_dict({"model": {**model, "conditioning": False},
                                    "training": {"device": "cpu", "optimizer_offload": value, "max_steps": 2,
                                                 "epochs": None, "checkpoint_dir": str(tmp_path / str(value)),
                                                 "enable_memory_cleanup": False, "lr_schedule": "constant"},
                                    "data": {"batch_size": 2, "num_workers": 0}})
        assert XTTSConfig.from_yaml(cfg.to_yaml()) == cfg
        assert offload_for(cfg) is offloaded  # "auto" never offloads on the CPU: it is the same RAM
        tr = pyxtts.Trainer(cfg, progress=False)
        assert tr.optimizer.state_device == ("cpu" if offloaded else None)
        assert (tr.optimizer.host_state_bytes > 0) is offloaded
        tr.fit(pyxtts.SyntheticDataset(cfg.model, 4, seed=1))
        del tr


def test_cleanup_gpu_memory_empties_the_host_pool_too():
    """The notebook's `del trainer; cleanup_gpu_memory()` left a deleted offloaded
    optimizer's state cached in the host pool (page-locked where a GPU is: 4.94 GiB for
    XTTS v2); only empty_cache('host') released it."""
    m = pyxtts.XTTSGPT(CFG, seed=0)
    opt = pyxtts.AdamW(m, state_device="cpu")
    held = pyxtts.memory_stats("host")["reserved_bytes"]
    assert held > 0
    del opt
    assert pyxtts.memory_stats("host")["reserved_bytes"] == held  # cached, not returned
    assert pyxtts.cleanup_gpu_memory() >= held
    assert pyxtts.memory_stats("host")["reserved_bytes"] == 0

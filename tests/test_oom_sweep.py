"""Out-of-memory at every allocation of every stateful public call (issue 11): one table.

Each row of ``CASES`` is a stateful call on a tiny model. ``sweep`` runs it once clean,
counting the allocator's requests n (``num_allocs``; with ``raw`` its new segments,
``num_raw_allocs``, after the cache was emptied), then once per index 0..n+1 with
``inject_oom(index)`` armed, each trial on a world built afresh by the row's ``setup``.
A trial passes when one of these holds:

- the call raised ``OutOfMemoryError`` (or the row's documented wrapping exception) and
  "unchanged" holds: every parameter, gradient and optimizer tensor by its bits and every
  optimizer scalar (``helpers.state.full_state``), the model's ``dropout_seed`` and
  ``dropout_step``, a Trainer's position (step, epoch, batch_in_epoch), the names and bytes
  of every file in the world's checkpoint folder (the JSONL training log excepted: it is
  a log, appended as things happen), and ``memory_allocated``, which is either exactly as
  before or lower by exactly the cached step arena the model held (a failed reservation of
  a step of another shape frees the old arena first: docs/hardening.md, "What a failure leaves unchanged";
  then ``arena_bytes`` is 0). ``Trainer.fit`` is a loop of committed steps: a raise there
  must leave exactly the state of a clean run stopped at the trainer's ``step`` (0, 1 or 2
  steps), and every checkpoint on disk byte-identical to the clean run's of that name; the
  best checkpoint, written at an evaluation before the fault, holds the parameters a clean
  run had at the step it names;
- or the call returned, and its result, the state after it and the change of
  ``memory_allocated`` are exactly those of the clean call (results compared field by
  field: every tensor by its bits, numbers by ==; timings and peak-memory figures left
  out; checkpoint files by their tensors and metadata, since two saves of one state order
  the safetensors header's metadata keys differently; the logs, JSONL and TensorBoard's,
  are left out too); for
  ``train_step_with_accumulation`` that recovered by halving its micro-batch, exactly those
  of the clean call at the micro-batch that fitted, as its docstring states; for
  ``find_optimal_batch_size`` whose verification step failed, a smaller size (documented),
  everything else as clean.

Indices n and n+1 never fire (n requests are made), so they must return the clean result.
``python tests/bench/hardening_report.py`` counts the trials of every row.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import safetensors.numpy

import pyxtts
import pyxtts.testing
from helpers import make_rng, random_batch
from helpers.state import full_state, same_value, state_diff
from pyxtts.data import Sample, TTSDataset
from pyxtts.framing import code_count

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

# The cheapest model with every part: 2 layers of d=32, the conditioning path (built from
# n_cond_latents > 0) and no dropout; the recipe model is the same with dropout 0.1 and
# cond_mels batches (Coqui's recipe trains the conditioning path from reference mels).
TINY = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=37, audio_vocab_size=29,
                          max_text_tokens=24, max_audio_tokens=40, n_cond_latents=3, dropout=0.0,
                          max_cond_frames=24)
RECIPE = dataclasses.replace(TINY, dropout=0.1)
TRAINER_MODEL = {"n_layers": 2, "d_model": 32, "n_heads": 4, "text_vocab_size": 37, "audio_vocab_size": 29,
                 "max_text_tokens": 16, "max_audio_tokens": 32, "n_cond_latents": 0, "conditioning": False,
                 "dropout": 0.1}
# Coqui's recipe in the Trainer: framing ids, the conditioning path trained from reference
# slices of each sample's recording (cond_mels of up to 24 frames), dropout 0.1
RECIPE_TRAINER_MODEL = {"n_layers": 2, "d_model": 32, "n_heads": 4, "text_vocab_size": 40, "audio_vocab_size": 20,
                        "max_text_tokens": 24, "max_audio_tokens": 40, "n_cond_latents": 3, "max_cond_frames": 24,
                        "start_text_token": 1, "stop_text_token": 0, "start_audio_token": 18,
                        "stop_audio_token": 19, "dropout": 0.1}
LOG_NAME = "train_log.jsonl"


@dataclass
class World:
    """What one trial's call acts on; ``dir`` is the checkpoint folder whose files count."""

    dir: Path
    model: Any = None
    opt: Any = None
    trainer: Any = None
    data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """One stateful call: ``setup`` builds a fresh world, ``call`` acts on it, ``digest``
    turns the world and the call's return value into what a success must reproduce."""

    name: str
    setup: Callable[[Path], World]
    call: Callable[[World], Any]
    digest: Callable[[World, Any], dict]
    raw: bool = False
    errors: tuple = (pyxtts.OutOfMemoryError,)
    prefix_ok: bool = False  # Trainer.fit: a raise leaves the state of a clean shorter run
    smaller_ok: bool = False  # find_optimal_batch_size: a fault may settle on a smaller size
    pool: str = "cpu"  # the allocator whose requests are counted and faulted: "cpu" or "host"


@dataclass
class SweepResult:
    name: str
    allocations: int  # n: the clean call's allocator requests (raw: new segments)
    trials: int  # n + 2
    fired: int  # trials whose fault fired (num_ooms or num_alloc_retries moved)
    raised: int
    failures: list[str]  # trials whose state or result broke the contract, each saying how


# ---- batches and worlds ------------------------------------------------------------

def batch_of(cfg: pyxtts.ModelConfig, salt: str, B: int, Lt: int, La: int, mels: int = 0) -> dict:
    rng = make_rng("oom_sweep", salt)
    b = random_batch(rng, cfg, B, Lt, La, n_cond=0 if mels else None)
    if mels:
        b["cond_mels"] = rng.standard_normal((B, 80, mels)).astype(np.float32)
    return b


def trained(tmp: Path, precision: str = "fp32", cfg: pyxtts.ModelConfig = TINY, mels: int = 0,
            offload: bool = False) -> World:
    """A model and optimizer one step in, with gradients left in place and a cached step
    arena of another shape than the calls' batches (so a call's reservation can fail);
    with ``offload`` the optimizer's state is in the host pool."""
    m = pyxtts.XTTSGPT(cfg, precision=precision, seed=1)
    opt = pyxtts.AdamW(m, weight_decay=0.01, loss_scale=2.0**10 if precision == "fp16" else None,
                       **({"state_device": "cpu", "offload_chunk": 700} if offload else {}))
    b = batch_of(cfg, "warm", 2, 6, 8, min(mels, 8))  # an arena of the small pool (<= 1 MiB)
    m.forward_backward(b, loss_scale=opt.loss_scale)
    opt.step()
    m.forward_backward(b, loss_scale=opt.loss_scale)
    return World(tmp, m, opt)


def with_batch(cfg: pyxtts.ModelConfig = TINY, mels: int = 0, precision: str = "fp32",
               shape: tuple[int, int, int] = (4, 12, 20), offload: bool = False) -> Callable[[Path], World]:
    """A trained world and the call's batch of ``shape`` (rows, text, audio)."""
    def setup(tmp: Path) -> World:
        w = trained(tmp, precision, cfg, mels, offload)
        w.data["batch"] = batch_of(cfg, "call", *shape, mels)
        return w
    return setup


def with_checkpoint(tmp: Path) -> World:
    """A trained world, a checkpoint of another model to load, an older one to overwrite."""
    src = trained(tmp, cfg=TINY)
    src.model.load_state_dict({k: v * 0.5 for k, v in src.model.state_dict().items()})
    w = trained(tmp)
    w.data["src"] = tmp / "src.safetensors"
    pyxtts.save_checkpoint(w.data["src"], src.model, src.opt, step=9)
    w.data["dst"] = tmp / "dst.safetensors"
    pyxtts.save_checkpoint(w.data["dst"], w.model, w.opt, step=1)
    return w


def trainer_config(tmp: Path, recipe: bool = False, offload: bool = False) -> pyxtts.XTTSConfig:
    """Micro-batches of one sample (2 per step), so every fault in a training step raises
    (nothing left to halve) and a success is the clean run's, bit for bit."""
    t = {"learning_rate": 3e-3, "lr_schedule": "constant", "max_steps": 2, "epochs": None,
         "checkpoint_dir": str(tmp / "run"), "checkpoint_interval": 1, "eval_interval": 1,
         "log_interval": 1, "device": "cpu", "enable_memory_cleanup": False, "max_memory_fraction": 1.0,
         "gradient_accumulation_steps": 2, "optimizer_offload": offload}
    return pyxtts.XTTSConfig.from_dict({"model": RECIPE_TRAINER_MODEL if recipe else TRAINER_MODEL, "training": t,
                                        "data": {"batch_size": 1, "bucketing": False, "num_workers": 0}})


def recordings(n: int, salt: str) -> TTSDataset:
    """Samples as pyxtts prepare writes them: ids, codes, and the recording (0.14-0.4 s)
    the Trainer draws each step's reference slice from."""
    rng = make_rng("oom_sweep.recordings", salt)
    out = []
    for i in range(n):
        wav = (rng.standard_normal(int(rng.integers(3000, 9000))) * 0.1).astype(np.float32)
        out.append(Sample(rng.integers(2, 40, int(rng.integers(3, 10))), rng.integers(0, 18, code_count(len(wav), 1024)),
                          source=f"sample {i}", ref_audio=wav, ref_is_clip=True))
    return TTSDataset(out, mel_stats=make_rng("oom_sweep.mel_stats").uniform(1.0, 5.0, 80))


def with_trainer(tmp: Path, steps: int = 1, recipe: bool = False, offload: bool = False) -> World:
    """A Trainer that has trained ``steps`` steps and saved them, with its datasets."""
    cfg = trainer_config(tmp, recipe, offload)
    if recipe:
        train, held = recordings(4, "train"), recordings(2, "held")
    else:
        train, held = pyxtts.SyntheticDataset(cfg.model, 6, seed=0).split(2)
    tr = pyxtts.Trainer(cfg, progress=False)
    if steps:
        cfg.training.max_steps = steps
        tr.fit(train, held)
        cfg.training.max_steps = 2
    per_epoch = -(-len(train) // cfg.effective_batch_size)
    return World(tr.checkpoint_dir, tr.model, tr.optimizer, tr, {"train": train, "held": held, "per_epoch": per_epoch})


def fresh_trainer(tmp: Path) -> World:
    return with_trainer(tmp, steps=0)


def recipe_trainer(tmp: Path) -> World:
    return with_trainer(tmp, steps=1, recipe=True)


def fresh_recipe_trainer(tmp: Path) -> World:
    return with_trainer(tmp, steps=0, recipe=True)


def fresh_offload_trainer(tmp: Path) -> World:
    return with_trainer(tmp, steps=0, recipe=True, offload=True)


def offload_checkpoint(tmp: Path) -> World:
    """A trained world whose optimizer is offloaded, and a checkpoint of a plain one to load."""
    src = with_checkpoint(tmp)
    w = trained(tmp, offload=True)
    w.data["src"] = src.data["src"]
    return w


def trainer_and_checkpoint(tmp: Path) -> World:
    other = with_trainer(tmp / "other", steps=2)
    w = with_trainer(tmp, steps=1)
    w.data["src"] = other.trainer.checkpoints()[-1]
    return w


# ---- what a success must reproduce ---------------------------------------------------

def d_none(w: World, r: Any) -> dict:
    return {}


def d_loss(w: World, r: dict) -> dict:
    return dict(r)


def d_model(w: World, r: Any) -> dict:
    return {"new." + k: v for k, v in full_state(r).items()}


def d_opt(w: World, r: Any) -> dict:
    return {"new." + k: v for k, v in r.state_dict().items()}


def d_step(w: World, r: Any) -> dict:
    s = dataclasses.asdict(r)
    for k in ("tokens_per_s", "peak_memory_bytes", "oom_splits"):  # timings; the split count
        s.pop(k)  # (compared against the reference that ran at that micro-batch instead)
    return s


def d_value(w: World, r: Any) -> dict:
    return {"value": r}


def d_fit(w: World, r: Any) -> dict:
    return {"step": r.step, "epoch": r.epoch, "stopped": r.stopped, "final_loss": r.final_loss,
            "eval_loss": r.eval_loss, "checkpoint": r.checkpoint.name,
            "losses": [h["loss"] for h in r.history], "evals": [e["loss"] for e in r.evals]}


def d_meta(w: World, r: dict) -> dict:
    return {"step": r["step"], "extra": r.get("extra")}


# ---- the table -----------------------------------------------------------------------

def _acc(steps: int) -> Callable[[World], Any]:
    return lambda w: pyxtts.train_step_with_accumulation(w.model, w.opt, w.data["batch"], steps)


def step_cases(raw: bool) -> list[Case]:
    """The step calls; with ``raw`` a failed new segment, which the allocator answers by
    releasing its cache and retrying (on the large-pool batch, which needs a segment)."""
    def batch(cfg: pyxtts.ModelConfig = TINY, mels: int = 0, precision: str = "fp32") -> Callable[[Path], World]:
        # raw: an arena of the allocator's large pool (> 1 MiB), which needs a new segment
        # where the world holds only small-pool ones (its warm-up arena among them)
        shape = (8, 24, 40) if raw else (4, 12, 20)
        return with_batch(cfg, mels, precision, shape)

    fobs = pyxtts.find_optimal_batch_size
    cases = [
        Case("XTTSGPT.forward_backward", batch(),
             lambda w: w.model.forward_backward(w.data["batch"], loss_scale=w.opt.loss_scale), d_loss),
        Case("XTTSGPT.forward_backward recipe (cond_mels, dropout 0.1)", batch(RECIPE, mels=20),
             lambda w: w.model.forward_backward(w.data["batch"]), d_loss),
        Case("XTTSGPT.forward", batch(), lambda w: w.model.forward(w.data["batch"]), d_loss),
        Case("AdamW.step fp32", batch(), lambda w: w.opt.step(), d_loss),
        Case("AdamW.step fp16 loss scale", batch(precision="fp16"), lambda w: w.opt.step(), d_loss),
        Case("train_step_with_accumulation", batch(), _acc(2), d_step),
        Case("train_step_with_accumulation recipe", batch(RECIPE, mels=20), _acc(2), d_step),
        Case("train_step_with_accumulation micro-batch 1", batch(), _acc(8), d_step),
        Case("find_optimal_batch_size", batch(), lambda w: fobs(w.model, w.opt, max_batch_size=8), d_value,
             smaller_ok=True),
        Case("find_optimal_batch_size without optimizer", batch(), lambda w: fobs(w.model, max_batch_size=4),
             d_value, smaller_ok=True),
        Case("find_optimal_batch_size recipe", batch(RECIPE, mels=20),
             lambda w: fobs(w.model, w.opt, max_batch_size=4), d_value, smaller_ok=True),
    ]
    return [dataclasses.replace(c, name=c.name + " [raw]", raw=True) for c in cases] if raw else cases


CASES: list[Case] = [
    Case("XTTSGPT()", lambda tmp: World(tmp), lambda w: pyxtts.XTTSGPT(TINY, seed=2), d_model),
    Case("XTTSGPT() fp16", lambda tmp: World(tmp), lambda w: pyxtts.XTTSGPT(TINY, precision="fp16", seed=2),
         d_model),
    Case("AdamW()", lambda tmp: World(tmp, pyxtts.XTTSGPT(TINY, seed=2)),
         lambda w: pyxtts.AdamW(w.model, weight_decay=0.01), d_opt),
    Case("AdamW() fp16 loss scale", lambda tmp: World(tmp, pyxtts.XTTSGPT(TINY, precision="fp16", seed=2)),
         lambda w: pyxtts.AdamW(w.model, loss_scale=2.0**12), d_opt),
    # the optimizer's state in the host pool: its construction faulted on each allocator
    *(Case(f"AdamW(state_device='cpu') bf16 [{pool}]",
           lambda tmp: World(tmp, pyxtts.XTTSGPT(TINY, precision="bf16", seed=2)),
           lambda w: pyxtts.AdamW(w.model, weight_decay=0.01, ema_decay=0.99, state_device="cpu",
                                  offload_chunk=500), d_opt, pool=pool) for pool in ("cpu", "host")),
    # its step allocates nothing on either side; the step of a batch and a Trainer's run
    *(Case(f"AdamW.step offloaded [{pool}]", with_batch(offload=True), lambda w: w.opt.step(), d_loss, pool=pool)
      for pool in ("cpu", "host")),
    Case("train_step_with_accumulation offloaded", with_batch(offload=True), _acc(2), d_step),
    Case("find_optimal_batch_size offload=True [host]", with_batch(),
         lambda w: pyxtts.find_optimal_batch_size(w.model, max_batch_size=4, offload=True), d_value,
         smaller_ok=True, pool="host"),
    Case("load_checkpoint into an offloaded optimizer", offload_checkpoint,
         lambda w: pyxtts.load_checkpoint(w.data["src"], w.model, w.opt), d_meta),
    Case("Trainer() offloaded (optimizer_offload: true) [host]", lambda tmp: World(tmp),
         lambda w: pyxtts.Trainer(trainer_config(w.dir, recipe=True, offload=True), progress=False) and None,
         d_none, pool="host"),
    *(Case(f"Trainer.fit 2 steps offloaded (optimizer_offload: true) [{pool}]", fresh_offload_trainer,
           lambda w: w.trainer.fit(w.data["train"], w.data["held"]), d_fit, prefix_ok=True, pool=pool)
      for pool in ("cpu", "host")),
    *step_cases(raw=False),
    *step_cases(raw=True),
    Case("XTTSGPT.load_state_dict", with_checkpoint,
         lambda w: w.model.load_state_dict({k: v * 0.25 for k, v in w.model.state_dict().items()}), d_none),
    Case("load_checkpoint", with_checkpoint, lambda w: pyxtts.load_checkpoint(w.data["src"], w.model, w.opt),
         d_meta),
    Case("save_checkpoint", with_checkpoint,
         lambda w: pyxtts.save_checkpoint(w.data["dst"], w.model, w.opt, step=2), d_none),
    Case("Trainer.save", with_trainer, lambda w: w.trainer.save(), d_none),
    Case("Trainer.load", trainer_and_checkpoint, lambda w: w.trainer.load(w.data["src"]), d_meta),
    Case("Trainer.evaluate", with_trainer, lambda w: w.trainer.evaluate(w.data["held"]), d_loss),
    Case("Trainer.evaluate recipe (reference slices)", recipe_trainer,
         lambda w: w.trainer.evaluate(w.data["held"]), d_loss),
    Case("Trainer.fit 2 steps", fresh_trainer, lambda w: w.trainer.fit(w.data["train"], w.data["held"]), d_fit,
         prefix_ok=True),
    Case("Trainer.fit 2 steps recipe (reference slices, dropout 0.1)", fresh_recipe_trainer,
         lambda w: w.trainer.fit(w.data["train"], w.data["held"]), d_fit, prefix_ok=True),
]


# ---- the sweep -------------------------------------------------------------------------

def snapshot(w: World) -> dict:
    """Everything "unchanged" covers, but the allocator's counters (see allocator_ok)."""
    s: dict = {}
    if w.model is not None:
        s.update(full_state(w.model, w.opt))
        s["dropout_seed"], s["dropout_step"] = w.model.dropout_seed, w.model.dropout_step
    if w.trainer is not None:
        s["position"] = (w.trainer.step, w.trainer.epoch, w.trainer.batch_in_epoch)
    # the logs are left out: the JSONL log, and TensorBoard's event files, whose names hold
    # the time and the process
    files = sorted(p for p in w.dir.rglob("*") if p.is_file() and p.name != LOG_NAME
                   and not p.name.startswith("events.out.tfevents.")) if w.dir.is_dir() else []
    s["files"] = [str(p.relative_to(w.dir)) for p in files]
    for p in files:
        s[f"file {p.relative_to(w.dir)}"] = np.frombuffer(p.read_bytes(), np.uint8)
    return s


def _counter(raw: bool) -> str:
    return "num_raw_allocs" if raw else "num_allocs"


# the device's allocator and the host pool (an offloaded optimizer's state)
POOLS = ("cpu", "host")


def _faults(pool: str) -> int:
    st = pyxtts.memory_stats(pool)
    return st["num_ooms"] + st["num_alloc_retries"]


def _arena(w: World) -> int:
    return w.model._core.arena_bytes if w.model is not None else 0


def _run(case: Case, tmp: Path, after: int | None) -> dict:
    """One trial: a fresh world in ``tmp`` (emptied first: every trial writes the same
    paths, which a Trainer's checkpoints record), the call with the fault armed at
    ``after`` (None: the clean call)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for pool in POOLS:
        pyxtts.testing.inject_oom(None, pool)
        pyxtts.set_memory_limit(None, pool)
    w = case.setup(tmp)
    pyxtts.cleanup_gpu_memory("cpu")  # raw=True counts the call's own new segments
    pyxtts.empty_cache("host")
    before, arena = snapshot(w), _arena(w)
    allocated, host0 = pyxtts.memory_allocated("cpu"), pyxtts.memory_allocated("host")
    n0, f0 = pyxtts.memory_stats(case.pool)[_counter(case.raw)], _faults(case.pool)
    error = result = None
    try:
        if after is not None:
            pyxtts.testing.inject_oom(after, case.pool, raw=case.raw)
        result = case.call(w)
    except Exception as exc:  # noqa: BLE001 - judged below; only its type and text are kept
        error = (type(exc), str(exc))
    finally:
        pyxtts.testing.inject_oom(None, case.pool)
    # the world itself is not kept: its cached arena would serve the next trial's requests
    out = {"before": before, "after": snapshot(w), "error": error, "arena": arena, "arena_after": _arena(w),
           "step": w.trainer.step if w.trainer is not None else None, "per_epoch": w.data.get("per_epoch"),
           "rows": len(w.data["batch"]["text_lengths"]) if "batch" in w.data else None,
           "allocated": allocated, "allocated_delta": pyxtts.memory_allocated("cpu") - allocated,
           "host_delta": pyxtts.memory_allocated("host") - host0,
           "requests": pyxtts.memory_stats(case.pool)[_counter(case.raw)] - n0, "fired": _faults(case.pool) > f0}
    out["digest"] = case.digest(w, result) if error is None else None
    pyxtts.set_memory_limit(None, "cpu")
    return out


def _allocator_ok(t: dict) -> bool:
    """memory_allocated as before, or lower by exactly the cached arena it released."""
    if t["allocated_delta"] == 0:
        return True
    return t["arena"] > 0 and t["arena_after"] == 0 and t["allocated_delta"] == -t["arena"]


def sweep(case: Case, tmp: Path | None = None) -> SweepResult:
    """Every index 0..n+1 of ``case``; see the module doc for what each trial must hold."""
    with tempfile.TemporaryDirectory(prefix="oom_sweep.") as own:
        root = Path(tmp if tmp is not None else own)
        clean = _run(case, root / "world", None)
        if clean["error"] is not None:
            raise AssertionError(f"{case.name}: the clean call raised {clean['error']}")
        n = clean["requests"]
        references: dict[int, dict] = {}  # train_step_with_accumulation: steps -> its clean run
        prefixes: dict[int, dict] = {}  # Trainer.fit: steps -> a clean run of that many
        failures: list[str] = []
        fired = raised = 0
        for after in range(n + 2):
            t = _run(case, root / "world", after)
            fired += t["fired"]
            why = _judge(case, root, t, clean, references, prefixes)
            raised += t["error"] is not None
            if why:
                failures.append(f"{case.name}: inject_oom({after}{', raw=True' if case.raw else ''}): {why}")
            if after >= n and (t["error"] is not None or t["fired"]):
                failures.append(f"{case.name}: inject_oom({after}) past the {n} requests fired")
    return SweepResult(case.name, n, n + 2, fired, raised, failures)


def _judge(case: Case, root: Path, t: dict, clean: dict, references: dict, prefixes: dict) -> str:
    """'' when the trial holds the contract, else what broke it."""
    if t["error"] is not None:
        kind, text = t["error"]
        if not issubclass(kind, case.errors):
            return f"raised {kind.__name__}: {text}"
        if not _allocator_ok(t):
            return f"memory_allocated {t['allocated']} changed by {t['allocated_delta']} (arena {t['arena']})"
        if t["host_delta"] != 0:
            return f"memory_allocated('host') changed by {t['host_delta']}"
        got, want = t["after"], t["before"]
        best_diff: list[str] = []
        if case.prefix_ok and BEST in got["files"]:  # judged on its own, then left out
            best_diff = _best_diff(case, root, got, t["before"], prefixes)
            got = {k: v for k, v in got.items() if not k.startswith(f"file {BEST}")}
            got["files"] = [f for f in got["files"] if f != BEST]
        if case.prefix_ok and t["step"] > 0:  # the state of the steps it took
            want = _prefix(case, root, t["step"], prefixes)
            want = {k: v for k, v in want.items() if not k.startswith(f"file {BEST}")}
        if case.prefix_ok and t["step"] > 0:
            per_epoch = t["per_epoch"]
            got, want = _position(got, per_epoch), _position(want, per_epoch)
            diff = state_diff(_no_files(got), _no_files(want))
            diff += [k for k in got["files"] if k not in clean["after"]["files"]]
            mine = _files(_contents(got))
            theirs = {k: v for k, v in _files(_contents(clean["after"])).items() if not k.startswith(f"file {BEST}")}
            diff += [k for k in mine if k not in theirs or not same_value(mine[k], theirs[k])]
        else:
            diff = state_diff(got, want)
        diff += best_diff
        return f"raised {kind.__name__} with state changed: {diff[:8]}" if diff else ""
    ref, digest = clean, t["digest"]
    micro = digest.get("micro_batch_size")
    halved = micro is not None and micro != clean["digest"]["micro_batch_size"]
    if halved:  # after a fault
        ref = _halved(case, root, t, references)
    if case.smaller_ok and t["fired"] and digest["value"] < clean["digest"]["value"]:
        digest = {**digest, "value": clean["digest"]["value"]}  # the next smaller size, as documented
    diff = state_diff(_contents(t["after"]), _contents(ref["after"])) + state_diff(digest, ref["digest"])
    # a return holds what the clean call holds; a recovery by halving at most that: the
    # fault released the cached arena of the world's earlier step, which the clean call at
    # the smaller micro-batch keeps and steps in (train_step_with_accumulation keeps a
    # larger arena for smaller micro-batches)
    if t["allocated_delta"] > ref["allocated_delta"] or (not halved and t["allocated_delta"] != ref["allocated_delta"]):
        diff.append("memory_allocated")
    if t["host_delta"] != ref["host_delta"]:
        diff.append("memory_allocated('host')")
    return f"returned with another result or state: {diff[:8]}" if diff else ""


BEST = "best.safetensors"


def _best_diff(case: Case, root: Path, got: dict, before: dict, prefixes: dict) -> list[str]:
    """What differs between the best checkpoint a failed fit left and the parameters a
    clean run had at the step the checkpoint names (before the fit, for step 0)."""
    raw = got[f"file {BEST}"].tobytes()
    n = int.from_bytes(raw[:8], "little")
    step = int(json.loads(json.loads(raw[8:8 + n])["__metadata__"]["pyxtts"])["step"])
    if step > got["position"][0]:
        return [f"{BEST} of step {step}, after the trainer's step {got['position'][0]}"]
    clean = before if step == 0 else _prefix(case, root, step, prefixes)
    tensors = safetensors.numpy.load(raw)
    params = {k[2:]: v for k, v in clean.items() if k.startswith("p.")}
    return [f"{BEST} {name}" for name, v in params.items() if not same_value(tensors.get(f"model.{name}"), v)]


def _position(snap: dict, per_epoch: int) -> dict:
    """A Trainer's (step, epoch, batch_in_epoch) with "past the last batch of an epoch"
    written as "batch 0 of the next": the same place to go on from (fit rolls the epoch
    over when it next looks), and what a run that ended there holds."""
    step, epoch, batch = snap["position"]
    return {**snap, "position": (step, epoch + 1, 0) if batch >= per_epoch else (step, epoch, batch)}


def _no_files(snap: dict) -> dict:
    return {k: v for k, v in snap.items() if not k.startswith("file")}


def _files(snap: dict) -> dict:
    return {k: v for k, v in snap.items() if k.startswith("file ")}


def _contents(snap: dict) -> dict:
    """Checkpoint bytes as their tensors and metadata: two saves of one state differ in
    the order of the safetensors header's metadata keys, nothing else."""
    out = {}
    for k, v in snap.items():
        if not (k.startswith("file ") and k.endswith(".safetensors")):
            out[k] = v
            continue
        raw = v.tobytes()
        n = int.from_bytes(raw[:8], "little")
        out[k + " metadata"] = json.loads(raw[8:8 + n]).get("__metadata__")
        out.update({f"{k} {name}": a for name, a in safetensors.numpy.load(raw).items()})
    return out


def _halved(case: Case, root: Path, t: dict, references: dict) -> dict:
    """The clean call at the micro-batch that fitted."""
    pieces = -(-t["rows"] // t["digest"]["micro_batch_size"])
    if pieces not in references:
        references[pieces] = _run(dataclasses.replace(case, call=_acc(pieces)), root / "world", None)
    return references[pieces]


def _prefix(case: Case, root: Path, steps: int, prefixes: dict) -> dict:
    """The state of a clean fit stopped after ``steps`` steps."""
    if steps not in prefixes:
        def call(w: World) -> Any:
            w.trainer.config.training.max_steps = steps
            return w.trainer.fit(w.data["train"], w.data["held"])
        prefixes[steps] = _run(dataclasses.replace(case, call=call), root / "world", None)["after"]
    return prefixes[steps]


def sweep_all(cases: list[Case] | None = None) -> list[SweepResult]:
    return [sweep(c) for c in (CASES if cases is None else cases)]


# ---- the test ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_oom_at_every_allocation_changes_nothing(case, tmp_path):
    r = sweep(case, tmp_path)
    assert not r.failures, "\n".join(r.failures)
    assert r.trials == r.allocations + 2


def test_the_sweep_sees_a_call_that_changes_state_before_failing(tmp_path):
    """The sweep itself: a call that zeroes the gradients, then takes a step that fails,
    is caught at that index (and only there), and a clean trial is not."""
    def call(w: World) -> Any:
        w.model.zero_grad()
        return w.model.forward_backward(w.data["batch"])

    r = sweep(Case("zero_grad then forward_backward", with_batch(), call, d_loss), tmp_path)
    assert (r.allocations, r.trials, r.raised) == (1, 3, 1)
    assert len(r.failures) == 1 and "inject_oom(0)" in r.failures[0] and "g." in r.failures[0], r.failures

"""``Trainer(config).fit(dataset)``: the training loop of the notebook and the CLI.

One optimizer step per effective batch (``data.batch_size`` x
``training.gradient_accumulation_steps`` samples) through
``train_step_with_accumulation``, so an out-of-memory error halves the micro-batch and
redoes the step instead of ending the run. The loop says what happened (the run starts,
resumes, takes a step, is evaluated, saved, ends) to its callbacks (``pyxtts.callbacks``),
which do the rest:

- a tqdm bar with the loss, tokens/s (over the last ``RATE_WINDOW`` steps) and the step's
  peak memory, and a line every ``log_interval`` steps (readable in a log file too);
- a JSONL log, one object per optimizer step (``"type": "train"``) and per evaluation
  (``"type": "eval"``), by default ``<checkpoint_dir>/train_log.jsonl``; TensorBoard event
  files of the same numbers beside it when the tensorboard package is installed;
- evaluation every ``eval_interval`` steps (and before the first step) on an optional
  evaluation set: token-weighted mean losses, no gradients; the checkpoint of the lowest
  evaluation loss kept as ``<checkpoint_dir>/best.safetensors``, and early stopping after
  ``early_stopping_patience`` evaluations without improvement;
- checkpoints every ``checkpoint_interval`` steps, at the end and on Ctrl-C, written
  atomically as ``<checkpoint_dir>/step_<N>.safetensors`` (model, optimizer, position in
  the data, the best evaluation so far), the newest ``keep_checkpoints`` kept;
- ``fit(..., resume=True)`` continues from the newest checkpoint at the same batch of
  the same epoch: the data order is a function of ``(shuffle_seed, epoch)``, so a resumed
  run takes the same steps as one that never stopped;
- ``cleanup_gpu_memory`` every ``cleanup_interval`` steps when ``enable_memory_cleanup``.

Started by torchrun (``torchrun --nproc_per_node=N -m pyxtts train ...``), each process
trains on its device (``cuda:LOCAL_RANK``, or the CPU) through
``pyxtts.distributed.DataParallel``. The effective batch is the global one: every process
draws the same batches of ``data.batch_size x gradient_accumulation_steps`` samples and
takes its contiguous slice of each (micro-batches of ``data.batch_size``), so N processes
train the step of one process, and a run resumes on any number of them. Rank 0 writes the
log, TensorBoard, samples and checkpoints; evaluation is shared; every process stops at
the same step (SIGTERM or Ctrl-C's SIGINT on any of them: at the next step boundary, with
a checkpoint).
"""
from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import shutil
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from pyxtts import _C
from pyxtts._args import flag, path_arg
from pyxtts._files import lock_folder, lock_holder, remove_stale_temps
from pyxtts._interrupts import end_commit, holding_sigint
from pyxtts.batch import find_optimal_batch_size, train_step_with_accumulation
from pyxtts.callbacks import (BEST_NAME, MAX_SKIPPED, BestCheckpoint, Callback, CallbackList, Evaluation,
                              JSONLLog, Progress, Reporter, Run, RunState, SpokenSamples, StepCheckpoints,
                              StopOnDivergence, TensorBoardLog, samples_dir)
from pyxtts.callbacks.checkpoints import CHECKPOINT_RE, checkpoint_step, step_checkpoint_name
from pyxtts.checkpoint import (ArchitectureError, CheckpointError, load_checkpoint, load_checkpoint_checked,
                               save_checkpoint)
from pyxtts.config import XTTSConfig, _yaml_word, offload_for
from pyxtts.coqui_config import coqui_decay
from pyxtts.data import DataError, Sample, TTSDataset, batch_groups, collate, collate_references
from pyxtts.data import _checked as _checked_sample
from pyxtts.fingerprint import check_fingerprint as _check_fingerprint
from pyxtts.fingerprint import data_fingerprint as _data_fingerprint
from pyxtts.fingerprint import saved_extra as _saved_extra
from pyxtts.fingerprint import saved_meta as _saved_meta
from pyxtts._words import counted, setting_changes
from pyxtts.memory import cleanup_gpu_memory, format_bytes
from pyxtts.model import XTTSGPT
from pyxtts.monitor import _rss_bytes
from pyxtts.schedule import ConstantLR, LRSchedule, MultiStepLR, WarmupCosineLR
from pyxtts.strategy import SingleProcess, Strategy

__all__ = ["CHECKPOINT_RE", "MAX_SKIPPED", "FitResult", "RunExistsError", "RunFolder", "RunInUseError",
           "Terminated", "Trainer", "hold_run_folder", "model_from_config", "optimizer_from_config", "run_checkpoint",
           "schedule_from_config"]

# Steps the tokens/s shown is averaged over: one step's rate swings several-fold with the
# machine's other load and the batch's lengths.
RATE_WINDOW = 20


def schedule_from_config(t) -> LRSchedule:
    """The learning-rate schedule a ``TrainingConfig`` names."""
    if t.lr_schedule == "constant":
        return ConstantLR(t.learning_rate)
    if t.lr_schedule == "warmup_cosine":
        return WarmupCosineLR(t.learning_rate, t.warmup_steps, t.max_steps, t.min_lr)
    return MultiStepLR(t.learning_rate, t.lr_milestones, t.lr_gamma)


def model_from_config(config: XTTSConfig, device: str) -> XTTSGPT:
    """The ``XTTSGPT`` a config describes (precision, checkpointing, seed) on ``device``."""
    t = config.training
    return XTTSGPT(config.model, device=device, precision=t.precision, checkpointing=t.checkpointing,
                   seed=t.seed)


def optimizer_from_config(model: XTTSGPT, t, offload: bool = False) -> Any:
    """The ``AdamW`` a ``TrainingConfig`` describes; fp16 gets a dynamic loss scale.
    ``weight_decay_on`` "weights" decays the tensors Coqui's recipe decays
    (``pyxtts.coqui_config.coqui_decay``), "matrices" every tensor of 2+ dims. With
    ``offload`` its state lives in host memory (``state_device="cpu"``; whether a config
    wants it: ``pyxtts.config.offload_for``)."""
    decay = coqui_decay(model.parameters()) if t.weight_decay_on == "weights" else None
    try:
        return _C.AdamW(model, lr=t.learning_rate, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay,
                        grad_clip=t.grad_clip, loss_scale=2.0**16 if t.precision == "fp16" else None,
                        decay=decay, state_device="cpu" if offload else None)
    except ValueError as exc:  # AdamW's rules (a step that could overflow) in the config's names
        raise ValueError(f"training: AdamW refuses learning_rate={t.learning_rate!r}, "
                         f"weight_decay={t.weight_decay!r}, eps={t.eps!r}, betas={t.betas!r}, "
                         f"grad_clip={t.grad_clip!r} with precision {t.precision!r}: {exc}") from None


class Terminated(KeyboardInterrupt):
    """The run was asked to stop by a signal (SIGTERM, what cluster schedulers send before
    killing a job; with several processes Ctrl-C's SIGINT too): ``fit`` saved a checkpoint
    first, as on Ctrl-C. ``signum`` is the signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by signal {signal.Signals(signum).name}")


def _stop_signals(world_size: int) -> tuple[signal.Signals, ...]:
    """The signals ``fit`` notes and stops on at the next step boundary. SIGTERM always.
    SIGINT (Ctrl-C) only with several processes: one process raises ``KeyboardInterrupt``
    at once and saves, but several would each be interrupted at another point of the step,
    with no step they all finished to save.

    What Ctrl-C does under torchrun (torch 2.13, torch/distributed/elastic): every worker
    is started in a session of its own (``start_new_session``), so a terminal's SIGINT
    reaches torchrun alone. torchrun sends the signal it got to each worker's process group,
    waits up to ``--shutdown-timeout`` (default 30 s, ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``),
    then SIGKILLs them. A second Ctrl-C makes it send SIGTERM and wait again."""
    return (signal.SIGTERM,) if world_size == 1 else (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def _stop_on(signums: tuple[signal.Signals, ...]) -> Iterator[list[int]]:
    """While inside, each of ``signums`` is noted (in the yielded list) instead of ending
    the process or raising ``KeyboardInterrupt``; the loop stops at the next step boundary.
    Only the main thread can take signals: in any other, they keep their handlers."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in signums}
    for s in signums:
        # system calls the signal interrupts restart instead of failing: a collective of
        # several processes (a socket read in gloo) must not end with EINTR because the
        # signal came then
        signal.siginterrupt(s, False)
    try:
        yield noted
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _sample_folders(checkpoint_dir: Path) -> list[Path]:
    """The spoken samples' ``samples/step_<N>`` folders of the run in ``checkpoint_dir``."""
    folder = samples_dir(checkpoint_dir)
    if not folder.is_dir():
        return []
    return sorted(f for f in folder.iterdir() if f.is_dir() and re.fullmatch(r"step_\d+", f.name))


class RunInUseError(BlockingIOError):
    """Another run is training into this ``checkpoint_dir`` now (another process, or another
    ``fit`` of this one): nothing was read or written. ``checkpoint_dir`` and ``pid`` (the
    process that holds it, where the system says; else None) say which."""

    def __init__(self, checkpoint_dir: Path, pid: int | None) -> None:
        self.checkpoint_dir, self.pid = checkpoint_dir, pid
        who = "another training run" + (f" (process {pid})" if pid is not None and pid != os.getpid() else "")
        super().__init__(errno.EAGAIN, f"{str(checkpoint_dir)!r} is in use by {who}: two runs in one folder would "
                                       "mix their checkpoints and logs; wait for it to end, or train into another "
                                       "folder (--checkpoint-dir DIR, training.checkpoint_dir)")


@dataclass
class RunFolder:
    """A run's ``folder`` held for it (``hold_run_folder``) until ``release``: ``lock``, the
    lock's file descriptor (rank 0's; None on the other processes, and where the file system
    keeps no locks); ``made``: holding it made the folder."""

    folder: Path
    lock: int | None
    made: bool

    def release(self) -> None:
        """Lets go of the folder (once; again does nothing); a folder that holding it made
        and that is still empty is removed first, while no other run can be in it."""
        lock, self.lock = self.lock, None
        if lock is None:
            return
        try:
            if self.made and not any(self.folder.iterdir()):
                self.folder.rmdir()
        except OSError:  # removed meanwhile: nothing to tidy
            pass
        finally:
            os.close(lock)


def hold_run_folder(checkpoint_dir: str | os.PathLike, strategy: Strategy | None = None) -> RunFolder:
    """Holds ``checkpoint_dir`` (made when missing) for one run, its only writer: rank 0
    locks it for the processes of a run (``strategy``; None: one process). Another run into
    the same folder at the same time would mix its checkpoints, best checkpoint and log with
    this one's, so it is refused with ``RunInUseError`` on every process; the hold ends with
    ``RunFolder.release``, or with the process however it ends. Held, the folder loses the
    temporary files of saves whose process died mid-write (a checkpoint of another step than
    the next saves would stay there for good)."""
    folder = Path(checkpoint_dir)
    strategy = SingleProcess() if strategy is None else strategy
    hold, busy = RunFolder(folder, None, False), None
    if strategy.is_main:
        hold.made = not folder.exists()
        try:
            hold.lock = lock_folder(folder)
        except BlockingIOError:
            busy = RunInUseError(folder, lock_holder(folder))
        else:  # the folder is this run's: what saves killed mid-write left goes
            remove_stale_temps(folder)
    # several processes: every one stops when rank 0 cannot hold the folder (on rank 0's
    # machine /proc/locks names the holder)
    if strategy.failed_rank(busy is not None) is not None:
        try:
            raise busy or RunInUseError(folder, lock_holder(folder))
        finally:  # no cycle through this frame: a trainer goes when the caller lets go of the error
            busy = None
    return hold


class RunExistsError(FileExistsError):
    """A fresh run's ``checkpoint_dir`` holds an earlier run's checkpoints: nothing was
    deleted. ``checkpoint_dir`` and ``newest`` (the newest checkpoint) say which."""

    def __init__(self, checkpoint_dir: Path, newest: Path) -> None:
        self.checkpoint_dir, self.newest = checkpoint_dir, newest
        super().__init__(f"{checkpoint_dir} holds checkpoints of an earlier run (newest: {newest.name}); pass "
                         "resume=True to continue it, overwrite=True to start over (deletes them and the log), "
                         "or set training.checkpoint_dir")


@dataclass
class FitResult:
    """What ``Trainer.fit`` did. Ctrl-C and SIGTERM end ``fit`` with ``KeyboardInterrupt``
    (``Terminated``) after saving a checkpoint, so no result says "interrupted"."""

    step: int  # optimizer steps taken in all (a resumed run counts the earlier ones)
    epoch: int  # epochs completed
    # "max_steps", "epochs", or "early_stopping" (training.early_stopping_patience
    # evaluations without improvement); a callback's Run.stop reason otherwise
    stopped: str
    final_loss: float | None  # loss of the last step of this call
    eval_loss: float | None  # the last evaluation's loss
    checkpoint: Path | None  # the last step checkpoint written (or resumed from)
    log_path: Path
    elapsed_s: float
    # this call's step records, the newest HISTORY_LIMIT (10,000) of them: the JSONL log has every one
    history: list[dict] = field(repr=False, default_factory=list)
    evals: list[dict] = field(repr=False, default_factory=list)  # this call's evaluations
    best_checkpoint: Path | None = None  # <checkpoint_dir>/best.safetensors when there is one
    steps_taken: int = field(repr=False, default=0)  # this call's optimizer steps (0: a resumed run at its end)


@dataclass
class _Totals:
    """What the closing line says of all of a ``fit`` call's steps, summed as they are
    taken: the history keeps the newest records only."""

    tokens: int = 0
    seconds: float = 0.0
    peak: int = 0
    first_loss: float | None = None

    def add(self, rec: dict) -> None:
        self.tokens += rec["text_tokens"] + rec["audio_tokens"]
        self.seconds += rec["step_time_s"]
        self.peak = max(self.peak, rec["peak_allocated_bytes"])
        if self.first_loss is None:
            self.first_loss = rec["loss"]


class Trainer:
    """Builds the model, optimizer and schedule a config describes and trains them.

    ``training.init_checkpoint`` names the weights the model starts from (e.g. an
    imported XTTS checkpoint). ``device`` overrides ``training.device``. The device's memory budget is set to
    ``training.max_memory_fraction`` of its total, unless a stricter limit is already set.
    ``log_path`` defaults to ``<checkpoint_dir>/train_log.jsonl``; ``progress=False``
    silences the bar and the log lines (the JSONL log is always written). ``callbacks``
    (``pyxtts.callbacks.Callback``) watch the run beside the built-in ones: after the
    writers (progress, the JSONL log, TensorBoard), before those that act (divergence,
    evaluation, the best checkpoint, step checkpoints). ``strategy``: the processes that
    train together (``pyxtts.strategy``); by default ``DataParallel`` when torchrun
    started this process (its environment says so), else one process; several processes
    put the model on ``cuda:LOCAL_RANK`` (or the CPU) unless ``device`` says otherwise.
    ``fit`` holds ``checkpoint_dir`` for its run (``hold_run_folder``); a caller that writes
    into the folder before (``pyxtts train --init``) holds it first and sets ``folder_hold``,
    which the next ``fit`` takes over and lets go of."""

    def __init__(self, config: XTTSConfig, *, device: str | None = None, log_path: str | os.PathLike | None = None,
                 progress: bool = True, callbacks: Sequence[Callback] = (), strategy: Strategy | None = None) -> None:
        if not isinstance(config, XTTSConfig):
            raise TypeError(f"config: expected an XTTSConfig, got {type(config).__name__}")
        if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Sequence):
            raise TypeError(f"callbacks: expected a sequence of pyxtts.callbacks.Callback, got {callbacks!r}")
        for i, cb in enumerate(callbacks):
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks[{i}]: expected a pyxtts.callbacks.Callback, got {type(cb).__name__}")
        config.validate()  # a config changed by attribute since it was built or loaded
        log_path = None if log_path is None else path_arg("log_path", log_path)
        self.config = config
        t = config.training
        self.progress = flag("progress", progress)
        # how an interrupted run's message says to continue it (the CLI puts its command here)
        self.resume_hint = "fit(..., resume=True)"
        self.strategy, device = _strategy(strategy, device, t)
        self.state = RunState(rank=self.strategy.rank, world_size=self.strategy.world_size)
        self._reporter = Reporter(self.progress, rank=self.state.rank)
        # the writers, the caller's, then those that act (evaluate, save, stop): in this order
        # the step's record is logged before its evaluation's (pyxtts.callbacks.base)
        self.callbacks = CallbackList([Progress(self.progress), JSONLLog(), TensorBoardLog(), SpokenSamples(),
                                       *callbacks,
                                       StopOnDivergence(), Evaluation(), BestCheckpoint(t.early_stopping_patience),
                                       StepCheckpoints()])
        self.device = device if device is not None else t.resolved_device()
        limit = _C.memory_stats(self.device)["limit_bytes"]
        try:
            self._apply_memory_fraction(t.max_memory_fraction)
            self.model = model_from_config(config, self.device)
            if t.init_checkpoint is not None:  # before the optimizer takes its master copy
                try:
                    load_checkpoint(t.init_checkpoint, self.model)
                except (OSError, CheckpointError) as exc:  # named by the field it came from
                    raise type(exc)(f"training.init_checkpoint: {exc}") from exc
            # the optimizer's state in host memory when the config says so, or says "auto"
            # and the plan does not fit the device without (pyxtts.config.offload_for; its
            # plan counts the collectives of several processes, so it gets the budget before
            # they are held back below)
            budget = _C.memory_stats(self.device)["limit_bytes"]
            self.optimizer = optimizer_from_config(self.model, t,
                                                   offload=offload_for(config, self.device, budget=budget))
            self._hold_back_communication()
        except BaseException:  # a trainer that was not built changes no process-wide setting
            _C.set_memory_limit(limit, self.device)
            raise
        self.schedule = schedule_from_config(t)
        self.checkpoint_dir = Path(t.checkpoint_dir)
        self.log_path = log_path if log_path is not None else self.checkpoint_dir / "train_log.jsonl"
        self._data_fingerprint: dict | None = None  # of the data fit trains on (_data_fingerprint)
        # checkpoint_dir held already (hold_run_folder), for the next fit to take over: pyxtts
        # train holds it before --init writes into it
        self.folder_hold: RunFolder | None = None
        self._totals = _Totals()  # of the steps of the fit call under way

    # the position of the run (pyxtts.callbacks.RunState): the step, and what follows from it
    @property
    def step(self) -> int:
        """Optimizer steps taken."""
        return self.state.step

    @property
    def epoch(self) -> int:
        """The current epoch (0-based): epochs completed."""
        return self.state.epoch

    @property
    def batch_in_epoch(self) -> int:
        """Batches of the current epoch already consumed."""
        return self.state.batch_in_epoch

    @property
    def best_checkpoint(self) -> Path | None:
        """The checkpoint of the lowest evaluation loss so far, or None while there is none."""
        path = self.checkpoint_dir / BEST_NAME
        return path if path.is_file() else None

    def _hold_back_communication(self) -> None:
        """Several processes: the allocator's limit leaves room for what the collectives take
        on this device (NCCL's buffers, outside pyxtts's allocator), so the batch search and
        the steps stay within what the plan of one of several processes allows."""
        plan = getattr(self.strategy, "communication", lambda: None)()
        limit = _C.memory_stats(self.device)["limit_bytes"]
        if plan is not None and plan.total > 0 and limit is not None:
            _C.set_memory_limit(max(limit - plan.total, 0), self.device)

    def _apply_memory_fraction(self, fraction: float) -> None:
        s = _C.memory_stats(self.device)
        wanted = int(s["device_total_bytes"] * fraction)
        if s["limit_bytes"] is None or s["limit_bytes"] > wanted:
            _C.set_memory_fraction(fraction, self.device)

    # ---- batch size --------------------------------------------------------------------
    def find_optimal_batch_size(self, apply: bool = False, **kwargs: Any) -> int:
        """``pyxtts.find_optimal_batch_size`` for this model and optimizer at the data
        config's longest sequences (keyword arguments pass through). With ``apply`` the
        micro-batch becomes the largest divisor of the effective batch that fits, and the
        accumulation steps make up the rest, so the effective batch is unchanged."""
        d = self.config.data
        kwargs.setdefault("text_len", d.max_text_tokens)
        kwargs.setdefault("audio_len", d.max_audio_tokens)
        apply = flag("apply", apply)
        size = find_optimal_batch_size(self.model, self.optimizer, strategy=self.strategy, **kwargs)
        if apply:
            effective = self.config.effective_batch_size
            micro = max(m for m in range(1, min(size, effective) + 1) if effective % m == 0)
            d.batch_size = micro
            self.config.training.gradient_accumulation_steps = effective // micro
        return size

    # ---- evaluation ----------------------------------------------------------------------
    def evaluate(self, dataset: Sequence[Sample]) -> dict:
        """Token-weighted mean losses over ``dataset`` (in order, micro-batches of
        ``data.batch_size``), nothing learnt. Several processes share the micro-batches
        (every ``world_size``-th) and sum their sums."""
        c = self.config
        dataset = self._as_dataset("dataset", dataset)
        text = audio = 0.0
        n_text = n_audio = 0
        refs = self._reference_draw(dataset)
        groups = batch_groups(dataset, c.data.batch_size, shuffle=False, bucket_factor=1)
        for g in groups[self.strategy.rank::self.strategy.world_size]:
            samples = [dataset[int(i)] for i in g]
            batch = (collate(samples, config=c.model) if refs is None else
                     collate_references(samples, g, c.model, refs, epoch=0, evaluation=True))
            r = self.model.forward(batch)
            text += r["text_loss"] * r["text_tokens"]
            audio += r["audio_loss"] * r["audio_tokens"]
            n_text += r["text_tokens"]
            n_audio += r["audio_tokens"]
        if self.strategy.world_size > 1:
            text, audio, n_text, n_audio = self.strategy.sum_floats([text, audio, n_text, n_audio])
            n_text, n_audio = int(n_text), int(n_audio)
        tl = text / n_text if n_text else 0.0
        al = audio / n_audio if n_audio else 0.0
        m = c.model
        return {"loss": m.text_loss_weight * tl + m.audio_loss_weight * al, "text_loss": tl, "audio_loss": al,
                "text_tokens": n_text, "audio_tokens": n_audio}

    # ---- checkpoints ---------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """The step checkpoints in ``checkpoint_dir``, oldest first."""
        if not self.checkpoint_dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.checkpoint_dir.iterdir()
                 if (m := CHECKPOINT_RE.fullmatch(p.name))]
        return [p for _, p in sorted(found)]

    def save(self, path: str | os.PathLike | None = None, weights_only: bool = False) -> Path:
        """Writes model, optimizer, the position in the data and the callbacks' state (the
        best evaluation so far) atomically; default ``<checkpoint_dir>/step_<N>.safetensors``,
        pruned to ``keep_checkpoints`` (a file elsewhere, ``best.safetensors`` too, is never
        pruned), and the temporaries of the run's checkpoints that a killed save left are
        removed. ``weights_only``: without the optimizer's state (not a file to resume
        from; ``load_checkpoint`` loads it into a model)."""
        weights_only = flag("weights_only", weights_only)
        p = Path(path) if path is not None else self.checkpoint_dir / step_checkpoint_name(self.step)
        if self.strategy.is_main:  # every process holds the same bits: rank 0 writes them
            extra = {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "config": self.config.to_dict(),
                     "data": self._data_fingerprint}
            if self.strategy.world_size > 1:
                extra["world_size"] = self.strategy.world_size
            states = self.callbacks.state_dict()
            if states:  # absent without them, so a run without evaluation writes what it always did
                extra["callbacks"] = states
            save_checkpoint(p, self.model, None if weights_only else self.optimizer, step=self.step, extra=extra)
        if self.strategy.world_size > 1:  # no process goes on (or resumes) before the file is there
            self.strategy.barrier()
        if path is None:
            self.state.last_checkpoint = p
            keep = self.config.training.keep_checkpoints
            if keep is not None and self.strategy.is_main:
                for old in self.checkpoints()[:-keep]:
                    old.unlink()
        return p

    def load(self, path: str | os.PathLike) -> dict:
        """Loads a checkpoint written by ``save`` (model, optimizer, position, the
        callbacks' state); returns its metadata. A refusal (``CheckpointError``) leaves
        everything unchanged."""
        position: dict[str, Any] = {}

        def check(meta: dict) -> None:  # before anything is written
            extra = meta.get("extra")
            for key in ("epoch", "batch_in_epoch"):
                v = extra.get(key) if isinstance(extra, dict) else None
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise CheckpointError(f"{path}: extra[{key!r}] missing or not an int >= 0 (got {v!r}): "
                                          "not a checkpoint of Trainer.save, whose position in the data "
                                          "it needs; load_checkpoint loads the model alone")
                position[key] = v
            position["steps_per_epoch"] = _steps_per_epoch(path, int(meta["step"]), position["epoch"],
                                                           position["batch_in_epoch"], extra.get("data"))

        meta = load_checkpoint_checked(path, self.model, self.optimizer, check)
        self.state.step = int(meta["step"])
        self.state.steps_per_epoch = position["steps_per_epoch"]
        self.callbacks.load_state_dict(meta["extra"].get("callbacks"))
        if CHECKPOINT_RE.fullmatch(Path(path).name):
            self.state.last_checkpoint = Path(path)
        return meta

    def _say(self, line: str) -> None:
        """A progress line (through tqdm, so a live bar stays below it); none with progress=False."""
        self._reporter.say(line)

    def _resume(self, resume: bool | str | os.PathLike, fingerprint: dict) -> Path | None:
        """Loads the checkpoint to resume from: ``resume`` True takes the newest in
        ``checkpoint_dir`` and falls back to the next older one when it cannot be read (a
        crash mid-write, a damaged disk), saying so; a path is that file or an error. A
        checkpoint of other data or batch settings (``fingerprint``) is refused before
        anything is loaded, naming what changed."""
        if resume is True:
            found = self.checkpoints()
            if not found:
                # said even without progress: a resume that starts afresh (a typo in the
                # folder?) must not pass unseen
                self._reporter.warn(f"resume: no checkpoint in {self.checkpoint_dir}; starting from step 0")
                return None
            candidates = found[::-1]
        else:
            candidates = [Path(resume)]
            if not candidates[0].is_file():
                raise FileNotFoundError(f"resume: no checkpoint file {str(candidates[0])!r}")
        unusable: list[str] = []
        for path in candidates:
            try:
                _check_fingerprint(path, _saved_extra(path).get("data"), fingerprint)
                self.load(path)
            except ArchitectureError as exc:  # the run's older checkpoints hold that model too
                raise ArchitectureError(f"resume: {exc}; {_restart_hint(self.config)}") from exc
            except CheckpointError as exc:
                if resume is not True:
                    raise
                unusable.append(f"{path.name}: {exc}")
                self._reporter.warn(f"resume: {path} cannot be used ({exc})" + (
                    "; falling back to the previous checkpoint" if path != candidates[-1] else ""))
                continue
            if unusable:
                self._reporter.warn(f"resume: resuming from {path.name}, the newest usable checkpoint "
                                    f"({len(unusable)} newer one(s) could not be used)")
            saved = _saved_extra(path).get("config")
            changed = setting_changes(saved, self.config.to_dict(), word=_yaml_word)  # as the YAML file says them
            if changed:  # allowed (a lower learning rate, say), but never unseen
                self._reporter.warn(f"resume: the config differs from the one {path.name} was saved with: "
                                    + "; ".join(changed[:6]) + (f"; and {len(changed) - 6} more" if len(changed) > 6
                                                                 else ""))
                jump = self._rate_change(saved)
                if jump is not None:
                    self._reporter.warn(jump)
            self.state.last_checkpoint = path
            self._say(f"resumed from {path} at step {self.step} (epoch {self.epoch}, batch {self.batch_in_epoch})")
            if self.strategy.is_main:
                self._set_aside_newer(path)
            return path
        raise CheckpointError(f"resume: none of the {len(unusable)} checkpoints in {self.checkpoint_dir} can be "
                              "used: " + "; ".join(unusable))

    def _rate_change(self, saved: Any) -> str | None:
        """What the changed settings do to the learning rate the run goes on with, when the
        schedule of the saved config (``saved``) gave another at this step: a longer
        ``max_steps`` stretches warmup_cosine's curve, so a run extended past its end climbs
        back from ``min_lr``."""
        t = saved.get("training") if isinstance(saved, dict) else None
        try:
            before = schedule_from_config(SimpleNamespace(**t))(self.step) if isinstance(t, dict) else None
        except (AttributeError, TypeError, ValueError):  # a config of an older pyxtts, or not one
            return None
        after = self.schedule(self.step)
        if before is None or before == after:
            return None
        return (f"resume: with these settings the learning rate of step {self.step + 1} is {after:.3g}, where the "
                f"schedule the run was saved with gave {before:.3g} ({self.config.training.lr_schedule})")

    def _set_aside_newer(self, resumed: Path) -> None:
        """A resume from a checkpoint older than the folder's newest starts a branch: the
        newer step checkpoints and a best checkpoint saved after it are the abandoned
        branch's. Left in place, pruning would delete the checkpoint resumed from, the
        branch's evaluations would overwrite a better best, and the next ``resume=True``
        would jump back to the old branch. They move to ``superseded_from_step_<N>/``,
        with a copy of the log as it was (the resumed run trims it to step N).

        Resumed from the newest step checkpoint, the run is no branch: it stopped without
        saving (a crash) and takes the steps after it again, whose evaluations remake the
        best checkpoint and the spoken samples they had made, at the same steps."""
        step = self.step
        newer = [p for p in self.checkpoints() if (checkpoint_step(p) or 0) > step]
        if not newer:
            return
        best = self.checkpoint_dir / BEST_NAME
        if best.is_file():
            try:
                best_step = _saved_meta(best).get("step")
            except CheckpointError:
                best_step = None
            if isinstance(best_step, int) and best_step > step:
                newer.append(best)
        aside = self.checkpoint_dir / f"superseded_from_step_{step:08d}"
        aside.mkdir(exist_ok=True)
        for p in newer:
            p.replace(aside / p.name)
        spoken = [f for f in _sample_folders(self.checkpoint_dir) if int(f.name[len("step_"):]) > step]
        if spoken:
            (aside / "samples").mkdir(exist_ok=True)
            for f in spoken:
                f.replace(aside / "samples" / f.name)
        log = self.log_path
        if log.is_file():
            shutil.copy2(log, aside / log.name)
        self._reporter.warn(f"resume: {resumed.name} is older than the run's newest checkpoint; "
                            f"{counted(len(newer), 'newer checkpoint')} ({', '.join(p.name for p in newer)}) "
                            f"moved to {aside}, with a copy of the log: this run continues from step {step}")

    def _step_record(self, r, samples: int, lr: float, seconds: float, data_wait: float = 0.0) -> dict:
        """The JSONL record of the optimizer step just taken (``self.step``) over a batch of
        ``samples`` (with several processes: all of theirs; the micro-batches are this one's),
        which took ``seconds`` after the loop had waited ``data_wait`` seconds for its batch."""
        return {"type": "train", "step": self.step, "epoch": self.epoch, "lr": lr,
                "loss": r.loss, "text_loss": r.text_loss, "audio_loss": r.audio_loss,
                "grad_norm": r.grad_norm, "skipped": r.skipped, "loss_scale": self.optimizer.loss_scale,
                "samples": samples, "text_tokens": r.text_tokens, "audio_tokens": r.audio_tokens,
                "micro_batch_size": r.micro_batch_size,
                "accumulation_steps": -(-samples // (r.micro_batch_size * self.strategy.world_size)),
                "oom_splits": r.oom_splits, "step_time_s": seconds, "data_wait_s": data_wait,
                "tokens_per_s": r.tokens_per_s,
                "peak_allocated_bytes": r.peak_memory_bytes,
                "allocated_bytes": _C.memory_allocated(self.device),
                "reserved_bytes": _C.memory_reserved(self.device), "rss_bytes": _rss_bytes(),
                "optimizer_host_bytes": int(self.optimizer.host_state_bytes), "time": time.time()}

    def _reference_draw(self, dataset: Sequence[Sample]) -> Any:
        """How each step draws the reference slices (``pyxtts.references.References``) when
        the model trains its conditioning path and the samples carry their recordings
        (``pyxtts prepare``'s shards); None otherwise (fixed ``cond_latents``, or none)."""
        m = self.config.model
        if not m.conditioning or len(dataset) == 0 or dataset[0].ref_audio is None:
            return None
        stats = getattr(dataset, "mel_stats", None)
        if stats is None:
            raise DataError(f"{dataset[0].source or 'dataset'}: the samples carry reference recordings for the "
                            "conditioning path but the dataset has no mel_stats (the mel_stats.npy pyxtts prepare "
                            "writes beside its shards, or TTSDataset(..., mel_stats=...))")
        from pyxtts.references import References  # pyxtts.prepare: imported only for such data

        d = self.config.data
        return References.for_model(m, stats, seed=d.shuffle_seed, mask_targets=d.mask_reference_targets)

    # ---- the loop --------------------------------------------------------------------------
    def fit(self, dataset: Sequence[Sample], eval_dataset: Sequence[Sample] | None = None, *,
            resume: bool | str | os.PathLike = False, overwrite: bool = False) -> FitResult:
        """Trains until ``training.max_steps`` optimizer steps or ``training.epochs``
        epochs, whichever comes first, or until ``training.early_stopping_patience``
        evaluations in a row do not improve on the best; called again (after raising
        ``max_steps``, say) it goes on from where this trainer stands. ``resume=True``
        continues from the newest checkpoint in ``checkpoint_dir`` (from step 0 when there
        is none), a path from that file. A fresh run refuses a ``checkpoint_dir`` that holds
        another run's checkpoints unless ``overwrite`` (which deletes them, the best
        checkpoint and the log). Every sample is validated against the data config's maxima
        before the first step (``DataError``; nothing is truncated). Ctrl-C saves a
        checkpoint, then raises ``KeyboardInterrupt``; so does SIGTERM (in the main thread),
        at the end of the step under way, raising ``Terminated`` (a ``KeyboardInterrupt``).
        With several processes Ctrl-C's SIGINT does as SIGTERM: every process stops at the
        same step boundary.
        The collating threads end with the call, whichever way it ends."""
        overwrite = flag("overwrite", overwrite)
        if not isinstance(resume, (bool, np.bool_)):
            resume = path_arg("resume", resume)  # True/False, or the checkpoint to resume from
        else:
            resume = bool(resume)
        c = self.config.validate()  # changed by attribute since (a notebook's "train more")
        train, held = self._checked_data(dataset, eval_dataset)
        if c.training.test_sentences:  # before anything is written: what the child would fail on
            from pyxtts.speak import check_test_sentences

            check_test_sentences(c.training.test_sentences, c.training.xtts_dir, c.model.max_text_tokens,
                                 samples_dir(self.checkpoint_dir), vocab=c.training.vocab, model=c.model)
        fingerprint = _data_fingerprint(train.samples, c)
        refs = self._reference_draw(train)
        if refs is None and c.model.conditioning and train[0].cond is None:
            self._say("note: the samples carry no reference recordings (ref_audio) or conditioning latents, so the "
                      "conditioning encoder and perceiver are not trained; pyxtts prepare's shards carry them")
        hold = self._hold_folder()
        try:
            return self._fit_held(train, held, refs, resume, overwrite, fingerprint)
        finally:
            hold.release()

    def _hold_folder(self) -> RunFolder:
        """``folder_hold`` when the caller holds ``checkpoint_dir`` already (it is this fit's
        now), else ``hold_run_folder``."""
        held, self.folder_hold = self.folder_hold, None
        if held is None:
            return hold_run_folder(self.checkpoint_dir, self.strategy)
        if held.folder != self.checkpoint_dir:
            held.release()
            raise ValueError(f"folder_hold: holds {str(held.folder)!r}, not this run's checkpoint_dir "
                             f"{str(self.checkpoint_dir)!r}")
        return held

    def _fit_held(self, train: TTSDataset, held: TTSDataset | None, refs: Any, resume: bool | str | os.PathLike,
                  overwrite: bool, fingerprint: dict) -> FitResult:
        """``fit`` from the resume on, its checkpoint folder held."""
        c = self.config
        resumed = self._start(resume, overwrite, fingerprint)
        continuing = resumed is not None or self.step > 0
        self._data_fingerprint = fingerprint
        effective = c.effective_batch_size
        per_epoch = -(-len(train) // effective)  # the last, smaller batch is kept
        t = c.training
        total = t.max_steps if t.max_steps is not None else t.epochs * per_epoch
        if t.max_steps is not None and t.epochs is not None:
            total = min(total, t.epochs * per_epoch)
        self.state.steps_per_epoch = per_epoch
        self.state.stop_reason = None
        self._totals = _Totals()
        run = Run(state=self.state, config=c, total_steps=total, continuing=continuing, log_path=self.log_path,
                  checkpoint_dir=self.checkpoint_dir, eval_dataset=held, say=self._reporter.say,
                  warn=self._reporter.warn, evaluate_with=self._evaluation, save_with=self._checkpoint,
                  audio_with=self.callbacks.audio, optimizer=self.optimizer, model=self.model,
                  resume_hint=self.resume_hint)
        offloaded = getattr(self.optimizer, "state_device", None) == "cpu"
        self._say(f"training {self.model.num_parameters:,} parameters on {self.device} ({t.precision}, "
                  f"checkpointing {t.checkpointing}"
                  f"{', optimizer state in host memory' if offloaded else ''}): {len(train)} samples, batch {effective} = "
                  f"{c.data.batch_size} x {t.gradient_accumulation_steps} accumulation, "
                  f"{counted(per_epoch, 'step')} an epoch, {counted(total, 'step')} in all")
        if offloaded and not self.progress:  # said without progress too: it costs host memory and time
            self._reporter.warn(f"optimizer state in host memory: {format_bytes(self.optimizer.host_state_bytes)} "
                                f"(training.optimizer_offload: {_yaml_word(t.optimizer_offload)})")
        if effective > len(train):  # said even without progress: the recipe's batch on a small set
            self._reporter.warn(f"the effective batch ({effective} samples an optimizer step) is larger than the "
                                f"{len(train)} training samples: each step takes the whole set, so a run takes "
                                f"{counted(total, 'optimizer step')}; lower gradient_accumulation_steps for "
                                "more, smaller steps on a small set")
        t_start = time.perf_counter()
        error: BaseException | None = None
        # SIGTERM (and, with several processes, SIGINT) noted; a single process's Ctrl-C held
        # while a step's update is counted (pyxtts._interrupts); around the Ctrl-C save too
        with _stop_on(_stop_signals(self.strategy.world_size)) as signals, holding_sigint():
            try:
                self.callbacks.fit_start(run)
                if resumed is not None:
                    self.callbacks.resume(run, resumed)
                self.callbacks.train_start(run)
                self._loop(run, train, refs, signals)
                if self.state.stop_reason is None:
                    self.state.stop_reason = ("max_steps" if t.max_steps is not None and self.step >= t.max_steps
                                              else "epochs")
                self.callbacks.train_end(run)
            except BaseException as exc:
                error = exc
                raise
            finally:  # every path: the writers close, Ctrl-C saves (pyxtts.callbacks)
                try:
                    self.callbacks.fit_end(run, error)
                finally:
                    # the error's traceback holds this frame: dropped, so that no cycle keeps
                    # the trainer (and its model's memory) alive after a failed fit
                    error = None
        return self._result(run, time.perf_counter() - t_start)

    @staticmethod
    def _as_dataset(name: str, ds: Any) -> TTSDataset:
        """A non-empty sequence of samples as a ``TTSDataset``; the argument ``name``d when not."""
        if not isinstance(ds, Sequence) or isinstance(ds, (str, bytes)):
            raise TypeError(f"{name}: expected a sequence of samples (a TTSDataset), got {type(ds).__name__}")
        if len(ds) == 0:
            raise ValueError(f"{name}: expected a non-empty sequence of samples (a TTSDataset), got an empty "
                             f"{type(ds).__name__}")
        if isinstance(ds, TTSDataset):
            return ds
        return TTSDataset([_checked_sample(s, i, name) for i, s in enumerate(ds)])

    def _checked_data(self, dataset: Any, eval_dataset: Any) -> tuple[TTSDataset, TTSDataset | None]:
        """Both sets as ``TTSDataset``s, every sample checked against the data config's maxima."""
        checked: list[TTSDataset | None] = []
        for name, ds in (("dataset", dataset), ("eval_dataset", eval_dataset)):
            if ds is None:
                checked.append(None)
                continue
            checked.append(self._as_dataset(name, ds))
            checked[-1].validate(_data_limits(self.config), _tighter_caps(self.config))
        train, held = checked
        if train is None:
            raise ValueError("dataset: expected a non-empty sequence of samples (a TTSDataset), got None")
        patience = self.config.training.early_stopping_patience
        if patience is not None and held is None:
            raise ValueError(f"eval_dataset: expected evaluation samples, since training.early_stopping_patience "
                             f"is {patience} (it counts evaluations); got None. Pass eval_dataset or set "
                             "early_stopping_patience to null")
        _check_shares(len(train), self.config.effective_batch_size, self.strategy.world_size)
        return train, held

    def _start(self, resume: bool | str | os.PathLike, overwrite: bool, fingerprint: dict) -> Path | None:
        """Resumes (the checkpoint resumed from), or checks that a fresh run may start in
        ``checkpoint_dir`` (None). A fresh run removes a best checkpoint left there by a
        run that wrote no step checkpoint: it is no part of the new run."""
        resumed = None
        if resume is not False:
            resumed = self._resume(resume, fingerprint)
        elif self.step == 0 and self.checkpoints():  # (step > 0: this trainer's own run goes on)
            if not overwrite:
                raise RunExistsError(self.checkpoint_dir, self.checkpoints()[-1])
            if self.strategy.is_main:
                for p in self.checkpoints():
                    p.unlink()
        if resumed is None and self.step == 0 and self.strategy.is_main:
            if self.best_checkpoint is not None:
                self.best_checkpoint.unlink()
            for folder in _sample_folders(self.checkpoint_dir):  # an earlier run's spoken samples
                shutil.rmtree(folder)
        if self.strategy.world_size > 1:  # every process saw the folder before rank 0 changed it
            self.strategy.barrier()
        return resumed

    def _loop(self, run: Run, train: TTSDataset, refs: Any, signals: list[int]) -> None:
        """The optimizer steps, until the run's end or a callback's ``Run.stop``."""
        c, state = self.config, self.state
        t, d = c.training, c.data
        bucket = d.bucket_size_multiplier if d.bucketing else 1
        micro_cap: int | None = None  # largest micro-batch that fitted after an out-of-memory error
        window: deque = deque(maxlen=RATE_WINDOW)  # (tokens, seconds) of the latest steps: the rate shown
        dp = self.strategy
        while state.step < run.total_steps and state.stop_reason is None:
            if signals and dp.world_size == 1:
                raise Terminated(signals[0])
            groups = batch_groups(train, c.effective_batch_size, shuffle=d.shuffle, seed=d.shuffle_seed + state.epoch,
                                  bucket_factor=bucket)
            # several processes: every one draws the global batches, and takes its slice of each
            slices = [dp.shard(len(g)) for g in groups]
            firsts = [lo for lo, _ in slices]
            mine = [g[lo:hi] for g, (lo, hi) in zip(groups, slices)]
            # closed on every way out of the block, so the collating threads end with it
            with contextlib.closing(_collated(train, mine[state.batch_in_epoch:], d.num_workers, c.model, refs,
                                              state.epoch)) as ahead:
                for k, (waited, g, batch) in enumerate(_waited(ahead), start=state.batch_in_epoch):
                    lr = self.schedule.apply(self.optimizer, state.step)
                    t0 = time.perf_counter()
                    accum = t.gradient_accumulation_steps if dp.world_size == 1 else -(-len(g) // d.batch_size)
                    steps = accum if micro_cap is None else max(accum, -(-len(g) // micro_cap))
                    r = train_step_with_accumulation(self.model, self.optimizer, batch, steps, strategy=dp,
                                                     first_row=firsts[k])
                    # the update is applied: move the position before anything can interrupt
                    state.step += 1
                    if r.oom_splits:  # remembered: later steps start at the micro-batch that fitted
                        micro_cap = r.micro_batch_size
                        self._say(f"step {state.step}: out of memory at micro-batch {-(-len(g) // steps)}; "
                                  f"going on with micro-batches of {micro_cap} (same effective batch)")
                    rec = self._step_record(r, len(groups[k]), lr, time.perf_counter() - t0, waited)
                    window.append((r.text_tokens + r.audio_tokens, rec["step_time_s"]))
                    rec["tokens_per_s_avg"] = sum(n for n, _ in window) / max(sum(s for _, s in window), 1e-9)
                    if t.enable_memory_cleanup and state.step % t.cleanup_interval == 0:
                        rec["cleanup_released_bytes"] = cleanup_gpu_memory(self.device)
                    run.history.append(rec)
                    run.steps_taken += 1
                    self._totals.add(rec)
                    self.callbacks.step_end(run, rec, acting=False)  # the step's record written
                    end_commit()  # a Ctrl-C since the update is raised now: the step is counted
                    self.callbacks.step_end(run, rec, acting=True)
                    signum = self._agree_after_step(signals) if dp.world_size > 1 else min(signals, default=None)
                    if signum is not None:
                        raise Terminated(signum)
                    if state.step >= run.total_steps or state.stop_reason is not None:
                        break

    def _agree_after_step(self, signals: list[int]) -> int | None:
        """Several processes, at a step boundary: the signal they all stop on now (so that
        they save at the same step), the lowest-numbered any of them noted, or None; every
        ``parameter_check_interval`` steps their parameters are compared
        (``DataParallel.check_identical``)."""
        dp, t = self.strategy, self.config.training
        # agree: the smallest value of any process; NSIG is above every signal's number
        lowest = dp.agree(min(signals, default=signal.NSIG))
        if t.parameter_check_interval is not None and self.step % t.parameter_check_interval == 0:
            check = getattr(dp, "check_identical", None)
            if check is not None:
                check(self.model)
        return None if lowest == signal.NSIG else lowest

    def _evaluation(self, run: Run) -> dict:
        """Evaluates now on the run's evaluation set; the record goes to every callback."""
        if run.eval_dataset is None:
            raise ValueError("evaluate: this run has no eval_dataset")
        t0 = time.perf_counter()
        r = self.evaluate(run.eval_dataset)
        rec = {"type": "eval", "step": self.step, "epoch": self.epoch, **r, "time_s": time.perf_counter() - t0}
        run.evals.append(rec)
        self.callbacks.evaluation(run, rec)
        return rec

    def _checkpoint(self, run: Run, path: str | os.PathLike | None = None, weights_only: bool = False) -> Path:
        """``save(path, weights_only)``; the path goes to every callback."""
        p = self.save(path, weights_only)
        self.callbacks.checkpoint(run, p)
        return p

    def _result(self, run: Run, elapsed: float) -> FitResult:
        history, totals = list(run.history), self._totals
        final = history[-1]["loss"] if history else None
        last_eval = run.evals[-1]["loss"] if run.evals else None
        ckpt = self.state.last_checkpoint
        if history:
            self._say(f"done: step {self.step}, loss {totals.first_loss:.4f} -> {final:.4f}"
                      + (f", eval loss {last_eval:.4f}" if last_eval is not None else "")
                      + f", {totals.tokens / max(totals.seconds, 1e-9):,.0f} tok/s, peak "
                      + format_bytes(totals.peak) + f", {elapsed:.1f} s; checkpoint {ckpt}")
        best = self.best_checkpoint
        return FitResult(step=self.step, epoch=self.epoch, stopped=self.state.stop_reason or "epochs",
                         final_loss=final, eval_loss=last_eval, checkpoint=ckpt, log_path=self.log_path,
                         elapsed_s=elapsed, history=history, evals=run.evals, best_checkpoint=best,
                         steps_taken=run.steps_taken)


def _check_shares(samples: int, effective: int, world: int) -> None:
    """Several processes take a contiguous share of every batch, at least one sample each
    (``DataParallel.shard``): of the full batches of ``effective`` samples, and of an
    epoch's last, smaller one (``samples`` modulo ``effective``: the batches are cut from
    pools of whole batches). A ValueError before anything is written when one has fewer
    samples than there are processes."""
    if world == 1:
        return
    if effective < world:
        raise ValueError(f"the effective batch, data.batch_size x gradient_accumulation_steps = {effective}, cannot "
                         f"be shared by {world} processes: each takes at least one sample of every batch; raise it "
                         f"to {world} or more, or train on fewer processes")
    last = samples % effective
    if 0 < last < world:
        raise ValueError(f"dataset: its {samples} samples leave a last batch of {counted(last, 'sample')} each epoch "
                         f"(the effective batch is {effective}), which {world} processes cannot share: each takes at "
                         f"least one sample of every batch; remove {counted(last, 'sample')} or add {world - last}, "
                         "change data.batch_size x gradient_accumulation_steps, or train on fewer processes")


def _strategy(strategy: Strategy | None, device: str | None, t: Any) -> tuple[Strategy, str]:
    """(the trainer's strategy, its device): ``DataParallel`` when torchrun started this
    process (on ``cuda:LOCAL_RANK`` when the config trains on a GPU, else the CPU, unless
    ``device`` says which), else one process on ``device`` or the config's."""
    if strategy is None:
        from pyxtts.distributed import launched

        if launched():
            from pyxtts.distributed import DataParallel

            if device is None and not t.resolved_device().startswith("cuda"):
                device = "cpu"
            strategy = DataParallel(device, timeout_s=t.distributed_timeout_s)
            device = strategy.device
        else:
            strategy = SingleProcess()
    elif device is None and isinstance(getattr(strategy, "device", None), str):
        device = strategy.device
    return strategy, device if device is not None else t.resolved_device()


def _collated(dataset: Sequence[Sample], groups: list, workers: int, model_config: Any, references: Any = None,
              epoch: int = 0) -> Iterator[tuple[Any, dict]]:
    """(indices, batch) for each group in order, framed as ``model_config`` says
    (``collate``), with the reference slices ``references`` draws at ``epoch`` when given
    (``collate_references``); with ``workers`` > 0 that many threads collate the next
    batches while a step runs (the engine releases the GIL)."""
    def collate_batch(g: np.ndarray) -> dict:
        samples = [dataset[int(i)] for i in g]
        if references is None:
            return collate(samples, config=model_config)
        return collate_references(samples, g, model_config, references, epoch)

    if workers == 0:
        for g in groups:
            yield g, collate_batch(g)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pyxtts-collate") as pool:
        todo = iter(groups)
        pending: deque = deque()
        try:
            for g in itertools.islice(todo, workers):
                pending.append((g, pool.submit(collate_batch, g)))
            while pending:
                g, future = pending.popleft()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(collate_batch, nxt)))
                # a failed collation's error holds this frame in its traceback, and the
                # future holds the error: let go of the future first, so that no cycle keeps
                # the trainer (and its model's memory) alive after the error
                box, future = [future], None
                yield g, _take(box)
        finally:
            for _, f in pending:
                f.cancel()


def _waited(batches: Iterator[tuple[Any, dict]]) -> Iterator[tuple[float, Any, dict]]:
    """``(seconds, indices, batch)`` for each of ``batches``: how long the loop waited for
    it (the step record's ``data_wait_s``). Near 0 while the collating threads keep ahead of
    the steps; the step's time (``step_time_s``) does not include it, so a run whose data
    side falls behind shows it here rather than as slower steps."""
    while True:
        t0 = time.perf_counter()
        nxt = next(batches, None)
        if nxt is None:
            return
        yield time.perf_counter() - t0, *nxt


def _take(box: list) -> Any:
    """The result of the future ``box`` holds, the future dropped (from the box and from
    this frame) before an error leaves."""
    future = box.pop()
    try:
        return future.result()
    finally:
        del future


def _steps_per_epoch(path: Any, step: int, epoch: int, batch: int, data: Any) -> int | None:
    """The optimizer steps an epoch of the run a checkpoint saved (its position is
    ``divmod(step, steps_per_epoch)``): from its data fingerprint, else from the position
    it holds; None while it cannot be known (in the first epoch, of an older pyxtts).
    A position that no length of epoch explains is refused."""
    if isinstance(data, dict) and isinstance(data.get("samples"), int) and isinstance(data.get("effective_batch"), int):
        per = -(-data["samples"] // max(data["effective_batch"], 1))
    elif epoch > 0 and (step - batch) % epoch == 0:
        per = (step - batch) // epoch
    else:
        per = None
    if (per is None and (epoch, batch) != (0, step)) or (per is not None and (epoch, batch) != divmod(step, per)):
        raise CheckpointError(f"{path}: its position in the data (epoch {epoch}, batch {batch}) does not follow "
                              f"from its step {step}" + (f" at {per} steps an epoch" if per else "")
                              + ": not a consistent checkpoint of Trainer.save")
    return per


def _restart_hint(config: XTTSConfig) -> str:
    """What to do when a run's checkpoints hold another model than the config's."""
    init = Path(config.training.checkpoint_dir) / "init_xtts.safetensors"
    if config.training.init_checkpoint is None and init.is_file():
        return (f"the run started from XTTS v2 (--init; {init} is its import): continue it with the --config "
                "and --init XTTS_DIR it started with")
    return "continue a run with the --config (and --init) it started with, or start a new one (--checkpoint-dir)"


def check_resumable(config: XTTSConfig, resume: bool | str | os.PathLike) -> None:
    """Before a Trainer builds the model (a minute and gigabytes at XTTS v2's size): the
    checkpoint ``resume`` names (True: the newest in the run's folder) holds the config's
    model, else ArchitectureError saying how to continue the run. Its tensors are not read:
    ``fit`` still checks everything."""
    from pyxtts.checkpoint import architecture_diffs

    if resume is False:
        return
    if resume is True:
        try:
            path = run_checkpoint(config.training.checkpoint_dir, "latest")
        except FileNotFoundError:
            return  # nothing to resume: fit says so
    else:
        path = Path(resume)
        if not path.is_file():
            return  # fit says so
    try:
        saved = _saved_meta(path).get("config")
    except CheckpointError:
        return  # unreadable: fit falls back to an older one, or says why
    if isinstance(saved, dict):
        diffs = architecture_diffs(saved, config.model)
        if diffs:
            raise ArchitectureError(f"resume: {path}: another architecture; the config differs in {len(diffs)} "
                                    f"field(s): {'; '.join(diffs)}; {_restart_hint(config)}")


def run_checkpoint(checkpoint_dir: str | os.PathLike, which: str) -> Path:
    """The checkpoint ``which`` names in a run's ``checkpoint_dir``: "best" (the lowest
    evaluation loss) or "latest" (the newest step checkpoint). FileNotFoundError when the
    run has none."""
    if which not in ("best", "latest"):
        raise ValueError(f"which: expected 'best' or 'latest', got {which!r}")
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"no run in {str(folder)!r}: it is not a folder (a typo in the checkpoint folder?)")
    if which == "best":
        path = folder / BEST_NAME
        if not path.is_file():
            raise FileNotFoundError(f"no best checkpoint in {folder} ({BEST_NAME} is written at the evaluations of "
                                    "a run with evaluation data)")
        return path
    found = sorted((int(m.group(1)), p) for p in (folder.iterdir() if folder.is_dir() else [])
                   if (m := CHECKPOINT_RE.fullmatch(p.name)))
    if not found:
        raise FileNotFoundError(f"no step checkpoint (step_<N>.safetensors) in {folder}")
    return found[-1][1]


def _tighter_caps(config: XTTSConfig) -> dict[str, str]:
    """"text"/"audio" to the data setting whose maximum is below the model's."""
    d, m = config.data, config.model
    return {what: f"data.max_{what}_tokens" for what in ("text", "audio")
            if getattr(d, f"max_{what}_tokens") is not None
            and getattr(d, f"max_{what}_tokens") < getattr(m, f"max_{what}_tokens")}


def _data_limits(config: XTTSConfig):
    """The model config with the data config's (possibly tighter) maxima: a sample longer
    than ``data.max_*_tokens`` is refused before training, as the memory plan assumed them."""
    import dataclasses

    return dataclasses.replace(config.model, max_text_tokens=config.data.max_text_tokens,
                               max_audio_tokens=config.data.max_audio_tokens)


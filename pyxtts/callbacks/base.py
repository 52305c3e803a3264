"""The run's state and the events a ``Trainer`` sends to its callbacks.

A callback watches a run (``on_fit_start``, ``on_resume``, ``on_train_start``,
``on_step_end``, ``on_evaluation``, ``on_checkpoint``, ``on_audio``, ``on_train_end``,
``on_fit_end``) and may ask it to evaluate, save or stop through the ``Run`` it is
handed; it never drives the loop itself. Every writer of a run (the JSONL log, the
progress output, TensorBoard, checkpoints, spoken samples) is one, so the loop in
``Trainer.fit`` says only what happened. What a callback's request causes (an
evaluation, a checkpoint) is sent to every callback at once, inside the event under way.
Callbacks that act (``acts``: evaluation, checkpoints, stopping) come last for the events
of the run, so every watcher hears of a step before the evaluation and checkpoints that
follow it; and first for its end (``on_train_end``, ``on_fit_end``), so the end's
evaluation and checkpoint reach the watchers before their files close.

Several processes (one per GPU, ``pyxtts.distributed``) train one run: a callback whose
``rank_zero_only`` is true (every writer) then runs in the process of rank 0 only;
``RunState.rank`` says which process this is, ``RunState.world_size`` how many there are.
Callbacks that act run in every process, on the same global figures, so that every process
evaluates, saves (rank 0 writes the file) and stops at the same step.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["HISTORY_LIMIT", "Callback", "CallbackList", "Run", "RunState"]

# The step records a run keeps in memory (``Run.history``, ``FitResult.history``): the
# newest. The JSONL log holds every one; all of them, at 1.4 KB each, made a process grow
# by 140 MB over 100,000 steps.
HISTORY_LIMIT = 10_000


def _history() -> deque:
    return deque(maxlen=HISTORY_LIMIT)


@dataclass
class RunState:
    """The counters of a run. The position in the data follows from ``step``: the data
    order is a function of (shuffle seed, epoch) and every epoch has ``steps_per_epoch``
    optimizer steps, so ``(epoch, batch_in_epoch)`` is ``divmod(step, steps_per_epoch)``."""

    step: int = 0  # optimizer steps taken (a resumed run counts the earlier ones)
    steps_per_epoch: int | None = None  # None until the data is known (fit, or a loaded checkpoint)
    rank: int = 0  # this process among the run's (data-parallel training: one per GPU)
    world_size: int = 1  # the run's processes
    stop_reason: str | None = None  # set by a callback (Run.stop): the loop ends after the step
    last_checkpoint: Path | None = None  # the newest checkpoint of this run this process wrote or loaded
    last_eval_loss: float | None = None  # the newest evaluation's loss

    @property
    def epoch(self) -> int:
        """The current epoch, 0-based (epochs completed)."""
        return self.step // self.steps_per_epoch if self.steps_per_epoch else 0

    @property
    def batch_in_epoch(self) -> int:
        """Batches of the current epoch already consumed."""
        return self.step % self.steps_per_epoch if self.steps_per_epoch else self.step

    @property
    def is_rank_zero(self) -> bool:
        return self.rank == 0


@dataclass
class Run:
    """What a callback sees of one ``fit`` call, and what it may ask of it."""

    state: RunState
    config: Any  # the XTTSConfig
    total_steps: int  # the step the run ends at (max_steps or epochs)
    continuing: bool  # resumed from a checkpoint, or a second fit of the same trainer
    log_path: Path
    checkpoint_dir: Path
    eval_dataset: Sequence | None
    say: Callable[[str], None]  # a progress line (silent with progress=False)
    warn: Callable[[str], None]  # a line the user must see whatever progress says
    # the trainer's: evaluate_with(run) and save_with(run, path) (methods below); they take the
    # run as an argument, so that no closure holds it and a finished run is freed at once
    evaluate_with: Callable[["Run"], dict]
    save_with: Callable[["Run", Path | None, bool], Path]
    audio_with: Callable[["Run", int, list], None]
    optimizer: Any = None
    model: Any = None
    resume_hint: str = "fit(..., resume=True)"  # how to continue an interrupted run (Trainer.resume_hint)
    history: deque = field(default_factory=_history)  # this call's newest HISTORY_LIMIT step records
    steps_taken: int = 0  # this call's optimizer steps (history keeps the newest records only)
    evals: list[dict] = field(default_factory=list)  # this call's evaluation records

    def evaluate(self) -> dict:
        """Evaluates now on ``eval_dataset``; every callback gets ``on_evaluation``."""
        return self.evaluate_with(self)

    def save(self, path: Path | None = None, weights_only: bool = False) -> Path:
        """A checkpoint now (a step checkpoint when ``path`` is None; without the optimizer's
        state with ``weights_only``); every callback gets ``on_checkpoint``."""
        return self.save_with(self, path, weights_only)

    def audio(self, step: int, clips: list[tuple[Path, str]]) -> None:
        """Audio was written at ``step``: (WAV file, its text) pairs; every callback gets
        ``on_audio``."""
        self.audio_with(self, step, clips)

    def stop(self, reason: str) -> None:
        """Ends the run cleanly after the step under way (the end's evaluation and
        checkpoint are made as at any end); ``reason`` becomes ``FitResult.stopped``."""
        if self.state.stop_reason is None:
            self.state.stop_reason = reason


class Callback:
    """A watcher of a run. Every method does nothing unless overridden.

    ``state_key``: a callback with state worth resuming (``state_dict``) names it here;
    the state is stored in each checkpoint's metadata under that name and handed back
    to ``load_state_dict`` when a checkpoint is loaded."""

    rank_zero_only = True
    acts = False  # evaluates, saves or stops the run (the order of events above)
    state_key: str | None = None

    def on_fit_start(self, run: Run) -> None:
        """Before the first step of a ``fit`` call (after any resume)."""

    def on_resume(self, run: Run, path: Path) -> None:
        """The run continues from checkpoint ``path`` (loaded; the state is its step's)."""

    def on_train_start(self, run: Run) -> None:
        """Every callback has started (and heard of the resume); the first step comes next."""

    def on_step_end(self, run: Run, record: dict) -> None:
        """An optimizer step was taken; ``record`` is its JSONL record."""

    def on_evaluation(self, run: Run, record: dict) -> None:
        """An evaluation was made; ``record`` is its JSONL record."""

    def on_checkpoint(self, run: Run, path: Path) -> None:
        """A checkpoint was written to ``path``."""

    def on_audio(self, run: Run, step: int, clips: list[tuple[Path, str]]) -> None:
        """Samples of the model's speech were written at ``step``: (WAV file, text) pairs."""

    def on_train_end(self, run: Run) -> None:
        """The run reached its end (max_steps, epochs, or a callback's ``Run.stop``);
        every writer is still open. Not called after an error or Ctrl-C."""

    def on_fit_end(self, run: Run, error: BaseException | None) -> None:
        """The ``fit`` call ends: normally (``error`` None), on an exception, or on
        Ctrl-C/SIGTERM (a ``KeyboardInterrupt``). Called on every path."""

    def state_dict(self) -> dict | None:
        """State to store in a checkpoint (JSON-serialisable), or None."""
        return None

    def load_state_dict(self, state: dict) -> None:
        """Takes back what ``state_dict`` returned when the checkpoint was saved (``{}``:
        the checkpoint holds none, so the callback starts anew)."""


class CallbackList:
    """Sends each event to the callbacks in order; a ``rank_zero_only`` callback is
    skipped in the other processes."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        for i, cb in enumerate(callbacks):
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks[{i}]: expected a pyxtts.callbacks.Callback, got {type(cb).__name__}")
        self.callbacks = list(callbacks)

    def _active(self, run: Run, end: bool = False) -> list[Callback]:
        """The callbacks of this process: those that act last, or first for the end."""
        mine = [cb for cb in self.callbacks if run.state.is_rank_zero or not cb.rank_zero_only]
        watchers = [cb for cb in mine if not cb.acts]
        actors = [cb for cb in mine if cb.acts]
        return actors + watchers if end else watchers + actors

    def fit_start(self, run: Run) -> None:
        for cb in self._active(run):
            cb.on_fit_start(run)

    def resume(self, run: Run, path: Path) -> None:
        for cb in self._active(run):
            cb.on_resume(run, path)

    def train_start(self, run: Run) -> None:
        for cb in self._active(run):
            cb.on_train_start(run)

    def step_end(self, run: Run, record: dict, acting: bool | None = None) -> None:
        """``acting``: only the callbacks that act (True) or only the others (False)."""
        for cb in self._active(run):
            if acting is None or cb.acts == acting:
                cb.on_step_end(run, record)

    def evaluation(self, run: Run, record: dict) -> None:
        for cb in self._active(run):
            cb.on_evaluation(run, record)

    def checkpoint(self, run: Run, path: Path) -> None:
        for cb in self._active(run):
            cb.on_checkpoint(run, path)

    def audio(self, run: Run, step: int, clips: list[tuple[Path, str]]) -> None:
        for cb in self._active(run):
            cb.on_audio(run, step, clips)

    def train_end(self, run: Run) -> None:
        for cb in self._active(run, end=True):
            cb.on_train_end(run)

    def fit_end(self, run: Run, error: BaseException | None) -> None:
        """Every callback's ``on_fit_end``, even when one raises (the first error is
        raised once all ran), so that each writer closes its files."""
        first: BaseException | None = None
        for cb in self._active(run, end=True):
            try:
                cb.on_fit_end(run, error)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                first = first or exc
        if first is not None:
            try:
                raise first
            finally:  # no cycle through this frame: the trainer goes when the caller lets go of the error
                first = None

    def state_dict(self) -> dict:
        """``{state_key: state}`` of the callbacks that have state."""
        out = {}
        for cb in self.callbacks:
            if cb.state_key is not None and (s := cb.state_dict()) is not None:
                out[cb.state_key] = s
        return out

    def load_state_dict(self, states: Any) -> None:
        """Each callback with a ``state_key`` gets its saved state, or ``{}`` (start anew)
        when the checkpoint has none for it."""
        states = states if isinstance(states, dict) else {}
        for cb in self.callbacks:
            if cb.state_key is not None:
                saved = states.get(cb.state_key)
                cb.load_state_dict(saved if isinstance(saved, dict) else {})

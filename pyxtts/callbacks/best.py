"""The best checkpoint and early stopping.

``<checkpoint_dir>/best.safetensors`` is the checkpoint of the lowest evaluation loss so
far (the evaluation before the first step included): written when an evaluation improves
on it, kept apart from the step checkpoints and never pruned. It holds the model's
weights (and the run's position and config in its metadata), not the optimizer's state:
it is for ``pyxtts export --checkpoint best`` or a new run's ``init_checkpoint``, and a
third of a step checkpoint's size; a run resumes from its step checkpoints. With
``training.early_stopping_patience`` N, the run stops cleanly after N evaluations in a
row without improvement (``FitResult.stopped == "early_stopping"``). The best loss, its
step and the count of evaluations since are stored in every checkpoint, so a resumed
run goes on with them."""
from __future__ import annotations

import math
from pathlib import Path

from pyxtts.callbacks.base import Callback, Run

__all__ = ["BEST_NAME", "BestCheckpoint"]

BEST_NAME = "best.safetensors"


class BestCheckpoint(Callback):
    acts = True
    rank_zero_only = False  # every process decides on the same global loss; rank 0 writes the file
    state_key = "best"

    def __init__(self, patience: int | None) -> None:
        self.patience = patience
        self.loss: float | None = None  # the lowest evaluation loss so far
        self.step: int | None = None  # its step
        self.since = 0  # evaluations since (without improvement)

    def path(self, run: Run) -> Path:
        return run.checkpoint_dir / BEST_NAME

    def _exhausted(self) -> bool:
        return self.patience is not None and self.since >= self.patience

    def _stop(self, run: Run) -> None:
        run.stop("early_stopping")
        best = ("no evaluation had a finite loss" if self.loss is None else
                f"the best, {self.loss:.4f} at step {self.step}, is {self.path(run)}")
        run.warn(f"early stopping at step {run.state.step}: the eval loss has not improved for {self.since} "
                 f"evaluations (training.early_stopping_patience {self.patience}); {best}")

    def on_train_start(self, run: Run) -> None:
        if self._exhausted():  # a resumed run that had stopped early stays stopped
            self._stop(run)

    def on_evaluation(self, run: Run, record: dict) -> None:
        loss = float(record["loss"])
        if math.isfinite(loss) and (self.loss is None or loss < self.loss):
            self.loss, self.step, self.since = loss, int(record["step"]), 0
            # after the update: the file holds the state it is the best of
            path = run.save(self.path(run), weights_only=True)
            run.say(f"step {self.step}: best eval loss so far ({loss:.4f}): {path}")
            return
        self.since += 1
        if self._exhausted():
            self._stop(run)

    def state_dict(self) -> dict | None:
        if self.loss is None:
            return None
        return {"loss": self.loss, "step": self.step, "evaluations_since": self.since}

    def load_state_dict(self, state: dict) -> None:
        loss, step, since = state.get("loss"), state.get("step"), state.get("evaluations_since")
        if isinstance(loss, (int, float)) and isinstance(step, int) and isinstance(since, int):
            self.loss, self.step, self.since = float(loss), step, since
        else:  # a checkpoint written before any evaluation, or before best checkpoints existed
            self.loss, self.step, self.since = None, None, 0

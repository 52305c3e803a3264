"""A run whose optimizer steps keep being skipped (non-finite gradients) has diverged:
after ``MAX_SKIPPED[precision]`` in a row it ends with a ``FloatingPointError`` saying
where the last good state is."""
from __future__ import annotations

from pyxtts.callbacks.base import Callback, Run
from pyxtts.callbacks.best import BEST_NAME

__all__ = ["MAX_SKIPPED", "StopOnDivergence"]

# fp16's dynamic loss scale skips steps while it finds its level; others should not skip
MAX_SKIPPED = {"fp16": 50, "bf16": 10, "fp32": 10}


class StopOnDivergence(Callback):
    acts = True
    rank_zero_only = False  # every process stops

    def __init__(self) -> None:
        self.in_a_row = 0

    def on_fit_start(self, run: Run) -> None:
        self.in_a_row = 0

    def on_step_end(self, run: Run, record: dict) -> None:
        t = run.config.training
        self.in_a_row = self.in_a_row + 1 if record["skipped"] else 0
        if self.in_a_row < MAX_SKIPPED[t.precision]:
            return
        step, last = record["step"], run.state.last_checkpoint
        saved = (f"the newest checkpoint is {last}" if last is not None else
                 f"no checkpoint of this run was written (the first was due at step {t.checkpoint_interval})")
        best = run.checkpoint_dir / BEST_NAME
        if best.exists():
            saved += f"; the weights of the lowest eval loss are in {best}"
        raise FloatingPointError(
            f"training diverged: {self.in_a_row} optimizer steps in a row had non-finite gradients (the last "
            f"at step {step}, loss {record['loss']}); the model in memory holds the parameters of step "
            f"{step - self.in_a_row} (a skipped step changes nothing); {saved}. Lower training.learning_rate, "
            "keep grad_clip, or use bf16 instead of fp16")

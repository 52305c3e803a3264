"""When the run is evaluated: before the first step of a fresh run, every
``training.eval_interval`` steps, and at the end (unless the last step was just
evaluated). How is ``Trainer.evaluate``'s; the records go to every callback."""
from __future__ import annotations

from pyxtts.callbacks.base import Callback, Run

__all__ = ["Evaluation"]


class Evaluation(Callback):
    acts = True
    rank_zero_only = False  # with several processes each evaluates its share

    def on_train_start(self, run: Run) -> None:
        if run.eval_dataset is not None and not run.continuing:
            run.evaluate()

    def on_step_end(self, run: Run, record: dict) -> None:
        if run.eval_dataset is not None and record["step"] % run.config.training.eval_interval == 0:
            run.evaluate()

    def on_train_end(self, run: Run) -> None:
        if (run.eval_dataset is not None and run.history
                and run.state.step % run.config.training.eval_interval != 0):
            run.evaluate()

"""When the run is evaluated: before the first step of a fresh run, every
``training.eval_interval`` steps, and at the end (unless the last step was just
evaluated). How is ``Trainer.evaluate``'s; the records go to every callback.

The step of the last evaluation that finished (every callback saw it: the best
checkpoint written, the samples spoken) is kept in the checkpoints, so that a run
interrupted during an evaluation makes it first when it resumes, instead of losing it."""
from __future__ import annotations

from pyxtts.callbacks.base import Callback, Run

__all__ = ["Evaluation"]


class Evaluation(Callback):
    acts = True
    rank_zero_only = False  # with several processes each evaluates its share
    state_key = "evaluation"

    def __init__(self) -> None:
        self.finished: int | None = None  # the step of the last evaluation that finished
        self.kept = False  # whether the run keeps that step (its checkpoints say it)

    def _evaluate(self, run: Run) -> None:
        run.evaluate()
        self.finished = run.state.step

    def on_train_start(self, run: Run) -> None:
        known, self.kept = self.kept, run.eval_dataset is not None  # from here, the checkpoints say it
        if run.eval_dataset is None:
            return
        step = run.state.step
        if not run.continuing:
            self._evaluate(run)
        elif (known and (self.finished is None or self.finished < step)
              and step % run.config.training.eval_interval == 0):
            self._evaluate(run)  # its evaluation was interrupted (a checkpoint saved on Ctrl-C)

    def on_step_end(self, run: Run, record: dict) -> None:
        if run.eval_dataset is not None and record["step"] % run.config.training.eval_interval == 0:
            self._evaluate(run)

    def on_train_end(self, run: Run) -> None:
        if (run.eval_dataset is not None and run.steps_taken
                and run.state.step % run.config.training.eval_interval != 0):
            self._evaluate(run)

    def state_dict(self) -> dict | None:
        # a run with evaluation data: even before its first evaluation finished (null), so
        # that an interrupted step-0 evaluation is made on resume too
        return {"step": self.finished} if self.kept else None

    def load_state_dict(self, state: dict) -> None:
        step = state.get("step")
        # a checkpoint from before this was kept, or of a run without evaluation data:
        # nothing known, nothing redone
        self.kept = "step" in state and (step is None or (isinstance(step, int) and not isinstance(step, bool)
                                                          and step >= 0))
        self.finished = step if self.kept else None

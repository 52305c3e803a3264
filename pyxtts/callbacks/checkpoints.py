"""Step checkpoints: every ``training.checkpoint_interval`` steps, once at the end, and
on Ctrl-C or SIGTERM (then the run says how to resume). ``Trainer.save`` writes them
and prunes them to ``training.keep_checkpoints``."""
from __future__ import annotations

import re
import signal
from pathlib import Path

from pyxtts.callbacks.base import Callback, Run

__all__ = ["CHECKPOINT_RE", "StepCheckpoints", "checkpoint_step", "step_checkpoint_name"]

CHECKPOINT_RE = re.compile(r"step_(\d+)\.safetensors")


def step_checkpoint_name(step: int) -> str:
    return f"step_{step:08d}.safetensors"


def checkpoint_step(path: Path | None) -> int | None:
    """N of a step_<N>.safetensors path, None for anything else."""
    m = CHECKPOINT_RE.fullmatch(path.name) if path is not None else None
    return int(m.group(1)) if m else None


class StepCheckpoints(Callback):
    acts = True
    rank_zero_only = False  # every process takes part in a save (rank 0 writes, all wait for it)

    def on_step_end(self, run: Run, record: dict) -> None:
        if record["step"] % run.config.training.checkpoint_interval == 0:
            run.save()

    def on_fit_end(self, run: Run, error: BaseException | None) -> None:
        # several processes: only a stop they agreed on (a signal noted, then agreed at a step
        # boundary: Terminated) finds them all at the same step to save; a KeyboardInterrupt
        # raised otherwise reaches each at another point, so the last checkpoint stays the run's
        agreed = run.state.world_size == 1 or getattr(error, "signum", None) is not None
        if isinstance(error, KeyboardInterrupt) and agreed:
            path = run.save()
            signum = getattr(error, "signum", None)
            why = f" by {signal.Signals(signum).name}" if signum is not None else ""
            run.warn(f"\ninterrupted{why} at step {run.state.step}: saved {path}; continue with {run.resume_hint}")

    def on_train_end(self, run: Run) -> None:
        if checkpoint_step(run.state.last_checkpoint) != run.state.step:  # the end is saved once
            run.save()

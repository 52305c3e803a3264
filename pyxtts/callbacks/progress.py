"""What a person watching the run reads: a tqdm bar (on a terminal or in a notebook) and
a line every ``training.log_interval`` steps and at each evaluation (readable in a log
file too, with the time the run has taken and what it has left, for runs nobody watches
on a terminal). ``progress=False`` silences both; ``Reporter.warn`` lines are shown
anyway."""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

from pyxtts.callbacks.base import Callback, Run
from pyxtts.memory import format_bytes

__all__ = ["Progress", "Reporter", "drop_output", "format_duration"]


def format_duration(seconds: float) -> str:
    """A duration in its two largest units: 45s, 12m05s, 3h07m, 2d04h."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


class Reporter:
    """The one way the trainer and its callbacks speak to the user: through tqdm, so a
    live bar stays below the lines. ``say`` is silent with ``enabled`` false; ``warn``
    (a checkpoint that cannot be used, an interrupted run) is not. Only rank 0 speaks."""

    def __init__(self, enabled: bool, rank: int = 0) -> None:
        self.enabled = enabled
        self.rank = rank

    def say(self, line: str) -> None:
        if self.enabled:
            self.warn(line)

    def warn(self, line: str) -> None:
        if self.rank != 0:
            return
        from tqdm import tqdm

        try:
            tqdm.write(line, file=sys.stderr)
        except BrokenPipeError:  # `pyxtts train 2>&1 | head`: the reader has gone, the run goes on
            drop_output(sys.stderr)


def drop_output(stream: Any) -> None:
    """Points ``stream``'s file descriptor at the null device, once its reader has gone (a
    pipe closed at the other end), so that what would have been shown is dropped instead
    of raising BrokenPipeError at every line."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a notebook's stream)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


class Progress(Callback):
    """The bar (loss, tokens/s over the last steps, the step's peak memory) and the lines.
    A line's time left is this process's wall time per step so far (evaluations and
    checkpoints included, as they recur) times the steps left. The clock starts with the
    training (``on_train_start``): the setup before it (a resume's copies of the logs, which
    grow with the run) does not recur."""

    def __init__(self, enabled: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self.bar: Any = None
        self.clock = clock
        self.t0 = 0.0
        self.step0 = 0

    def on_fit_start(self, run: Run) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        live = sys.stderr.isatty() or "ipykernel" in sys.modules
        self.bar = tqdm(total=run.total_steps, initial=min(run.state.step, run.total_steps), unit="step",
                        desc="train", dynamic_ncols=True, mininterval=0.5, file=sys.stderr, disable=not live)

    def on_train_start(self, run: Run) -> None:
        self.t0, self.step0 = self.clock(), run.state.step

    def on_step_end(self, run: Run, record: dict) -> None:
        rate, peak = record["tokens_per_s_avg"], format_bytes(record["peak_allocated_bytes"])
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {record['loss']:.4f}, {rate:,.0f} tok/s, mem {peak}", refresh=False)
            self.bar.update(1)
        if record["step"] % run.config.training.log_interval == 0:
            run.say(f"step {record['step']}/{run.total_steps}: loss {record['loss']:.4f} (text "
                    f"{record['text_loss']:.4f}, audio {record['audio_loss']:.4f}), grad norm "
                    f"{record['grad_norm']:.3g}, lr {record['lr']:.3g}, {rate:,.0f} tok/s, peak {peak}"
                    f"{self.timing(record['step'], run.total_steps)}")

    def timing(self, step: int, total: int) -> str:
        """", 4m10s elapsed, ~1h02m left" at ``step`` of ``total``."""
        elapsed, done = self.clock() - self.t0, step - self.step0
        left = f", ~{format_duration(elapsed / done * (total - step))} left" if 0 < done and step < total else ""
        return f", {format_duration(elapsed)} elapsed{left}"

    def on_evaluation(self, run: Run, record: dict) -> None:
        run.say(f"step {record['step']}: eval loss {record['loss']:.4f} (text {record['text_loss']:.4f}, "
                f"audio {record['audio_loss']:.4f})")

    def on_fit_end(self, run: Run, error: BaseException | None) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

"""Ctrl-C held across the one place where it would tear a training step.

A single-process ``Trainer.fit`` lets Ctrl-C raise ``KeyboardInterrupt`` where it lands,
and saves a checkpoint at the run's step. Between the optimizer's update and the run
counting it, that checkpoint would hold step N + 1's weights under step N's number, and
the resumed run would train that batch twice. ``train_step_with_accumulation`` opens a
commit just before the update (``begin_commit``); the trainer closes it once the step is
counted and logged (``end_commit``), which raises a Ctrl-C that came meanwhile. Only the
handler ``holding_sigint`` installs honours it: elsewhere ``begin_commit`` changes nothing.

``deferred_sigint`` holds Ctrl-C across a few steps anywhere (the renames that put an
export's files in place), and raises it after them.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["begin_commit", "deferred_sigint", "end_commit", "holding_sigint"]


class _Commit:
    active = False  # the optimizer's update has started; the run has not counted it yet
    pending = False  # a Ctrl-C came meanwhile


_commit = _Commit()


def begin_commit() -> None:
    """From here to ``end_commit``, Ctrl-C is noted, not raised."""
    _commit.active = True


def end_commit() -> None:
    """The step is counted: a Ctrl-C noted since ``begin_commit`` is raised now."""
    pending = _commit.pending
    _commit.active = _commit.pending = False
    if pending:
        raise KeyboardInterrupt


def _on_sigint(signum: int, frame: object) -> None:
    if _commit.active:
        _commit.pending = True
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def holding_sigint() -> Iterator[None]:
    """Inside, SIGINT raises ``KeyboardInterrupt`` as Python's own handler does, except
    within a commit. Only in the main thread, and only over Python's own handler (a
    handler someone else installed is left alone)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _commit.active = _commit.pending = False
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _commit.active = _commit.pending = False


@contextlib.contextmanager
def deferred_sigint() -> Iterator[None]:
    """Inside, a Ctrl-C is noted, not raised; on leaving, one that came is handed to the
    handler that was there before (Python's raises ``KeyboardInterrupt``). For the few
    steps that must all happen or none (the renames that put several files in place):
    they are done before the interrupt is. Only in the main thread, where Python runs its
    signal handlers, over a handler Python knows (not one installed from C); elsewhere it
    changes nothing."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return
    came: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if came and callable(previous):
            previous(signal.SIGINT, None)
        elif came and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)

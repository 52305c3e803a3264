"""Learning-rate schedules: plain callables ``schedule(step) -> lr``.

Each schedule is a pure function of the optimizer step (0 for the first update), so
resuming from a checkpoint only needs the step count. Use it as::

    sched = pyxtts.WarmupCosineLR(3e-4, warmup_steps=500, total_steps=50_000)
    for step in range(start, total):
        sched.apply(optimizer, step)          # same as optimizer.lr = sched(step)
        ...
        optimizer.step()

The values match PyTorch's ``MultiStepLR`` and ``LinearLR`` + ``CosineAnnealingLR``
(closed form, so no drift accumulates over a long run).
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

from pyxtts._args import integer, real

__all__ = ["ConstantLR", "LRSchedule", "MultiStepLR", "WarmupCosineLR"]


class LRSchedule:
    """Base class: ``schedule(step)`` is the learning rate of optimizer step ``step``."""

    def __call__(self, step: int) -> float:
        return self._lr(integer("step", step))

    def _lr(self, step: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def apply(self, optimizer: Any, step: int) -> float:
        """Sets ``optimizer.lr = self(step)`` and returns that rate."""
        lr = self(step)
        optimizer.lr = lr
        return lr

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class ConstantLR(LRSchedule):
    """The same rate at every step."""

    def __init__(self, lr: float) -> None:
        self.lr = real("lr", lr, minimum=0.0)

    def _lr(self, step: int) -> float:
        return self.lr


class WarmupCosineLR(LRSchedule):
    """Linear warmup from 0 to ``lr`` over ``warmup_steps`` (step 0 has rate 0), then a
    cosine from ``lr`` down to ``min_lr`` at ``total_steps``; ``min_lr`` afterwards."""

    def __init__(self, lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> None:
        self.lr = real("lr", lr, minimum=0.0)
        self.warmup_steps = integer("warmup_steps", warmup_steps)
        self.total_steps = integer("total_steps", total_steps, minimum=1)
        self.min_lr = real("min_lr", min_lr, minimum=0.0)
        if self.warmup_steps >= self.total_steps:
            raise ValueError(f"warmup_steps: must be < total_steps={self.total_steps}, "
                             f"got {self.warmup_steps}")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr: must be <= lr={self.lr!r}, got {self.min_lr!r}")

    def _lr(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * step / self.warmup_steps
        if step >= self.total_steps:
            return self.min_lr
        t, t_max = step - self.warmup_steps, self.total_steps - self.warmup_steps
        return self.min_lr + (self.lr - self.min_lr) * (1 + math.cos(t * math.pi / t_max)) / 2


class MultiStepLR(LRSchedule):
    """``lr * gamma ** k`` where k is the number of milestones <= step (XTTS v2 recipe:
    milestones ``[50000 * 18, 150000 * 18, 300000 * 18]``, gamma 0.5)."""

    def __init__(self, lr: float, milestones: Iterable[int], gamma: float = 0.5) -> None:
        self.lr = real("lr", lr, minimum=0.0)
        if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Iterable):
            raise TypeError(f"milestones: expected a sequence of ints, got {milestones!r}")
        ms: Sequence[int] = [integer("milestones", m) for m in milestones]
        if any(b <= a for a, b in itertools.pairwise(ms)):
            raise ValueError(f"milestones: must be strictly increasing, got {list(ms)}")
        self.milestones = list(ms)
        self.gamma = real("gamma", gamma, minimum=0.0)
        if self.gamma <= 0:
            raise ValueError(f"gamma: must be > 0, got {gamma!r}")

    def _lr(self, step: int) -> float:
        return self.lr * self.gamma ** bisect.bisect_right(self.milestones, step)

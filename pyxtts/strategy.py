"""Who takes part in a training step: the strategy ``train_step_with_accumulation`` asks.

A step over a global batch of n rows runs on ``world_size`` processes. Each process takes a
contiguous slice of the rows (``shard``), normalises by the whole batch's target counts
(``reduce_counts``), and adds its gradients into every process's (``all_reduce_grads``,
which may start during the last micro-batch's backward through ``gradient_hook``).
Then every process runs the same optimizer step on the same gradients. Out of memory is
agreed (``failed_rank``, ``agree``): all processes halve their micro-batch together, so
the step's math stays the global batch's.

``SingleProcess`` is one process: every collective is the identity, and the step is
today's, bit for bit. ``pyxtts.distributed.DataParallel`` is several, over
torch.distributed; it is the only module that imports torch.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

__all__ = ["SingleProcess", "Strategy", "contiguous_slice"]


def contiguous_slice(n: int, parts: int, index: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of part ``index`` when n rows are cut into ``parts`` contiguous
    parts whose sizes differ by at most one, the larger first (10 in 4: 3, 3, 2, 2)."""
    q, r = divmod(n, parts)
    lo = index * q + min(index, r)
    return lo, lo + q + (1 if index < r else 0)


class Strategy(Protocol):
    rank: int
    world_size: int

    @property
    def is_main(self) -> bool: ...

    def shard(self, n: int) -> tuple[int, int]: ...

    def reduce_counts(self, counts: tuple[int, int]) -> tuple[int, int]: ...

    def failed_rank(self, failed: bool) -> int | None: ...

    def agree(self, micro_batch: int) -> int: ...

    def gradient_hook(self, model: Any) -> Callable[[int, int], None] | None: ...

    def all_reduce_grads(self, model: Any) -> None: ...

    def reduce_losses(self, losses: tuple[float, float]) -> tuple[float, float]: ...

    def sum_floats(self, values: list[float]) -> list[float]: ...

    def barrier(self) -> None: ...


class SingleProcess:
    """One process: the global batch is this process's, every collective the identity."""

    rank = 0
    world_size = 1

    @property
    def is_main(self) -> bool:
        return True

    def shard(self, n: int) -> tuple[int, int]:
        return 0, n

    def reduce_counts(self, counts: tuple[int, int]) -> tuple[int, int]:
        return counts

    def failed_rank(self, failed: bool) -> int | None:
        """The lowest rank whose ``failed`` is true; None when no process failed."""
        return 0 if failed else None

    def agree(self, micro_batch: int) -> int:
        return micro_batch

    def gradient_hook(self, model: Any) -> Callable[[int, int], None] | None:
        return None

    def all_reduce_grads(self, model: Any) -> None:
        return None

    def reduce_losses(self, losses: tuple[float, float]) -> tuple[float, float]:
        return losses

    def sum_floats(self, values: list[float]) -> list[float]:
        return list(values)

    def barrier(self) -> None:
        return None

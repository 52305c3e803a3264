"""Test hooks: fault injection into the allocator."""
from __future__ import annotations

from pyxtts import _C


def inject_oom(after: int | None, device: str | int = "cpu", raw: bool = False) -> None:
    """Make the (after+1)-th allocation from now on ``device`` fail.

    By default it counts allocation requests, and the failing one raises
    ``OutOfMemoryError`` exactly as a full device would, whatever the cache
    holds. With ``raw=True`` it counts allocations of new segments from the
    device instead; that failure goes through the allocator's normal path
    (release the cache, retry). ``inject_oom(None, device)`` clears it. The
    hook fires once.
    """
    _C._inject_oom(after, device, raw)

"""Argument converters shared by the Python layer: one per kind of argument, each raising
a ``TypeError`` or ``ValueError`` that names the argument, the expected and the received
value."""
from __future__ import annotations

import operator
from typing import Any

import numpy as np


def integer(name: str, value: Any, *, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as a Python int in [``minimum``, ``maximum``] (no upper bound when
    ``maximum`` is None).

    Accepts what ``operator.index`` accepts (ints, NumPy integer scalars, 0-d integer
    arrays); refuses bools and anything that only converts with rounding, such as a
    float or a 0-d float array (``int()`` would turn 2.5 into 2 silently)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an int, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {value!r}") from None
    if maximum is not None and not minimum <= v <= maximum:
        raise ValueError(f"{name}: expected an int in [{minimum}, {maximum}], got {v}")
    if v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {v}")
    return v


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool: ``True``/``False`` or a NumPy bool, nothing judged by its truth
    value (``"no"`` would be true, an array ambiguous)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return bool(value)

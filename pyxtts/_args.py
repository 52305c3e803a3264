"""Argument converters shared by the Python layer: one per kind of argument, each raising
a ``TypeError`` or ``ValueError`` that names the argument, the expected and the received
value."""
from __future__ import annotations

import math
import numbers
import operator
import os
import re
from pathlib import Path
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


def real(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
         above: bool = False, below: bool = False) -> float:
    """``value`` as a finite Python float, >= ``minimum`` (> with ``above``) and <= ``maximum``
    (< with ``below``) where those are given.

    Accepts any real number: ints, floats, NumPy integer and floating scalars (``np.float32``
    is not a ``float``), 0-d arrays of those; refuses bools, strings and complex numbers
    (``float("0.5")`` would take a string), NaN and infinities."""
    a = value if isinstance(value, np.ndarray) else None
    if isinstance(value, (bool, np.bool_)) or not (
            isinstance(value, numbers.Real) or (a is not None and a.ndim == 0 and a.dtype.kind in "iuf")):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int past float's range
        v = math.inf
    if (math.isfinite(v)
            and (minimum is None or (v > minimum if above else v >= minimum))
            and (maximum is None or (v < maximum if below else v <= maximum))):
        return v
    if minimum is not None and maximum is not None:
        rule = f" in {'(' if above else '['}{minimum:g}, {maximum:g}{')' if below else ']'}"
    elif minimum is not None:
        rule = f" {'>' if above else '>='} {minimum:g}"
    elif maximum is not None:
        rule = f" {'<' if below else '<='} {maximum:g}"
    else:
        rule = ""
    raise ValueError(f"{name}: expected a finite number{rule}, got {value!r}")


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool: ``True``/``False`` or a NumPy bool, nothing judged by its truth
    value (``"no"`` would be true, an array ambiguous)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return bool(value)


# each CLI command's flags by the name of the API argument they set (filled by
# pyxtts.cli.main): an error that names an argument ("out: ...") is shown with its flag
CLI_FLAGS: dict[str, dict[str, str]] = {}


# an argument a message tells to pass: overwrite=True, vocab='shards-vi/vocab.json'
_PASSED_RE = re.compile(r"(?<![\w.])([a-z][a-z_]*)=(?:True\b|'([^']*)')")


def as_flags(command: str, message: str) -> str:
    """``message`` with a leading API argument name (``eval_fraction: ...``) spelt as the
    command's flag (``--eval-fraction: ...``), and the arguments it tells to pass, written
    ``overwrite=True`` or ``vocab='v.json'``, spelt ``--overwrite`` and ``--vocab v.json``:
    as the person at the command line types them."""
    import shlex

    flags = CLI_FLAGS.get(command.split(" ")[0], {})
    head, sep, rest = message.partition(":")
    item = re.fullmatch(r"(\w+)\[(\d+)\]", head)  # texts[1]: the second of a repeated flag's values
    flag = flags.get(item.group(1) if item else head)
    if sep and flag is not None:
        message = f"{flag} #{int(item.group(2)) + 1}{sep}{rest}" if item else f"{flag}{sep}{rest}"

    def spelt(m: re.Match) -> str:
        flag = flags.get(m.group(1))
        if flag is None:
            return m.group(0)
        return flag if m.group(2) is None else f"{flag} {shlex.quote(m.group(2))}"

    return _PASSED_RE.sub(spelt, message)


def path_arg(name: str, value: Any) -> Path:
    """``value`` as a ``Path``: a non-empty str or os.PathLike (None, an int or ``""`` once
    failed inside pathlib without naming the argument)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a path (str or os.PathLike), got {type(value).__name__} {value!r}")
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"{name}: expected a path, got {value!r}")
    return Path(value)

"""The state a failure must leave alone, and its bit-exact comparison (issue 11).

NumPy and pyxtts only. ``full_state`` is every parameter, gradient and optimizer tensor
and scalar of a model (and optimizer); ``state_diff`` names what differs between two such
snapshots (a tensor by its bits, so -0.0 != 0.0 and NaN payloads count); ``assert_same``
fails naming the first difference."""
from __future__ import annotations

from typing import Any

import numpy as np


def full_state(model: Any, opt: Any = None, gradients: bool = True) -> dict:
    """Every array and scalar a failure must leave alone: ``p.<name>`` parameters,
    ``g.<name>`` gradients (unless ``gradients=False``: what a checkpoint holds), ``o.<key>``
    the optimizer's state_dict (moments, master copy, step, loss scale, hyper-parameters)."""
    s = {f"p.{k}": v for k, v in model.state_dict().items()}
    if gradients:
        s.update({f"g.{k}": v.numpy() for k, v in model.gradients().items()})
    if opt is not None:
        for k, v in opt.state_dict().items():
            s[f"o.{k}"] = v
    return s


def same_value(x: Any, y: Any) -> bool:
    """Arrays by dtype, shape and bits; anything else by ==."""
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
            return False
        return (x.dtype == y.dtype and x.shape == y.shape
                and np.array_equal(np.ascontiguousarray(x).view(np.uint8), np.ascontiguousarray(y).view(np.uint8)))
    return bool(x == y)


def state_diff(a: dict, b: dict) -> list[str]:
    """The keys whose values differ (or that only one side has), sorted."""
    out = sorted(set(a) ^ set(b))
    out += sorted(k for k in set(a) & set(b) if not same_value(a[k], b[k]))
    return out


def assert_same(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), f"{what}: keys {sorted(set(a) ^ set(b))}"
    for k in a:
        assert same_value(a[k], b[k]), f"{what}: {k}: {a[k]!r} != {b[k]!r}"

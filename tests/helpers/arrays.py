"""Array helpers of the op, kernel and reduction tests (NumPy and pyxtts only).

- ``NP_DTYPE``: the NumPy dtype of each pyxtts dtype name (bfloat16 from ml_dtypes).
- ``rand(rng, shape, dtype, scale=, offset=)``: normal values representable in ``dtype``,
  returned as float32, so a reference computes on exactly what the tensor holds.
- ``f64(t)``: a tensor's values as a float64 NumPy array.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

NP_DTYPE = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}


def rand(rng: np.random.Generator, shape, dtype: str = "float32", *, scale: float = 1.0,
         offset: float = 0.0) -> np.ndarray:
    """offset + scale x standard normal, rounded to ``dtype`` and returned as float32."""
    a = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
    return a.astype(NP_DTYPE[dtype]).astype(np.float32)


def f64(t) -> np.ndarray:
    """A pyxtts tensor's values as float64 (a copy)."""
    return np.asarray(t.numpy()).astype(np.float64)

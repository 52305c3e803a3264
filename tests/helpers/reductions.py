"""The deterministic reductions' exact semantics (backend.h), in float64 NumPy.

Mirrors of the chunking every backend follows: a kernel's result must be these bits
exactly, on the CPU and on a GPU.
"""
from __future__ import annotations

import numpy as np

COLSUM_PARALLEL = 1 << 17
COLSUM_MIN_ROWS = 16
EMB_CHUNK = 64


def colsum_chunk_rows(rows: int, cols: int) -> int:
    want = max(1, COLSUM_PARALLEL // max(cols, 1))
    return max(-(-rows // want), COLSUM_MIN_ROWS)


def colsum_exact(terms: np.ndarray) -> np.ndarray:
    """Column sums of terms (rows, cols) float64: chunks of colsum_chunk_rows rows, each
    summed from 0.0 row by row, then the chunk sums from 0.0 in chunk order."""
    rows, cols = terms.shape
    r = colsum_chunk_rows(rows, cols)
    total = np.zeros(cols)
    for i0 in range(0, rows, r):
        part = np.zeros(cols)
        for row in terms[i0:i0 + r]:
            part += row
        total += part
    return total


def add_once(acc32: np.ndarray, total64: np.ndarray) -> np.ndarray:
    """(float)(acc + total): the fp32 accumulator plus the double total, rounded once."""
    return (acc32.astype(np.float64) + total64).astype(np.float32)


def embedding_backward_exact(dtable: np.ndarray, ids: np.ndarray, dout: np.ndarray) -> np.ndarray:
    """dtable (V, C) fp32 after the scatter of dout (N, C) by ids (N): per chunk of EMB_CHUNK
    rows and id, the id's rows from 0.0 in order; per id, its chunk sums from 0.0 in chunk
    order; added once. Ids that never occur keep their rows untouched."""
    d64 = dout.astype(np.float64)
    total = np.zeros((dtable.shape[0], dout.shape[1]))
    for c0 in range(0, len(ids), EMB_CHUNK):
        part = np.zeros_like(total)
        np.add.at(part, ids[c0:c0 + EMB_CHUNK], d64[c0:c0 + EMB_CHUNK])  # unbuffered, in order
        present = np.unique(ids[c0:c0 + EMB_CHUNK])
        total[present] += part[present]
    out = dtable.copy()
    seen = np.unique(ids)
    out[seen] = add_once(dtable[seen], total[seen])
    return out

"""Probes of dropout's masks in the attention kernels (NumPy and pyxtts only, so that a
child process can run them with PYXTTS_CUDA_ATTENTION set).

With p = 0.5 (Z in {0, 2}) and D = T, each kernel's mask is read back exactly:
- forward and dK/dV: v = dout = I, so out[i, j] = P_ij Z_ij and dv[j, i] = P_ij Z_ij are
  nonzero exactly where (i, j) is seen and kept;
- dQ: k = 4 I, v = I, dout = 1, so dq[i, j] = 4 scale P_ij (Z_ij - Di), Di = rowsum(out):
  > 0 where kept, < 0 where dropped in rows with Di in (0.05, 1.95), 0 where (i, j) is
  not seen.
"""
from __future__ import annotations

import numpy as np

import pyxtts
from pyxtts import _C

P = 0.5


def run(q, k, causal: bool, key: int, device: str, dtype: str) -> dict[str, np.ndarray]:
    """The probes' outputs (float64) for q, k (B, H, T, T) float32."""
    B, H, T, _ = q.shape
    on = lambda a: pyxtts.tensor(np.ascontiguousarray(a, np.float32), dtype=getattr(pyxtts, dtype),
                                 device=device)
    f64 = lambda t: np.asarray(t.numpy()).astype(np.float64)
    eye = np.broadcast_to(np.eye(T, dtype=np.float32), (B, H, T, T))
    kw = dict(causal=causal, dropout_p=P, dropout_key=key)
    Q, K, E = on(q), on(k), on(eye)
    out, lse = _C.attention_forward(Q, K, E, **kw)
    dv = _C.attention_backward(E, Q, K, E, out, lse, **kw)[2]
    K4, ones = on(4 * eye), on(np.ones((B, H, T, T), np.float32))
    out2, lse2 = _C.attention_forward(Q, K4, E, **kw)
    dq = _C.attention_backward(ones, Q, K4, E, out2, lse2, **kw)[0]
    return {"out": f64(out), "dv": f64(dv), "out2": f64(out2), "dq": f64(dq)}


def check(res: dict[str, np.ndarray], kept: np.ndarray, causal: bool, msg: str) -> None:
    """kept (B, H, T, T): the masks' keep flags (tests/philox.py)."""
    T = kept.shape[-1]
    seen = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
    want = kept & seen
    assert np.array_equal(res["out"] != 0, want), msg + ": the forward's mask"
    assert np.array_equal(res["dv"].swapaxes(-1, -2) != 0, want), msg + ": the dK/dV kernel's mask"
    dq = res["dq"]
    di = res["out2"].sum(-1, keepdims=True)
    rows = np.broadcast_to((di > 0.05) & (di < 1.95), dq.shape) & seen
    assert rows.sum() > dq.size // 4, msg + ": too few rows to probe"
    assert np.all(np.where(want, dq > 0, dq < 0)[rows]), msg + ": the dQ kernel's mask"
    assert np.all(dq[np.broadcast_to(~seen, dq.shape)] == 0), msg

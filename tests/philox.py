"""Dropout masks in NumPy, written from the Philox paper (Salmon et al., SC'11) and the
mask layout of csrc/engine/dropout.h: the independent reference the engine's masks are
checked against (element for element), and the masks the float64 references apply.

Vectorised over counters: uint64 arithmetic holds each 32x32 -> 64-bit product exactly.
"""
from __future__ import annotations

import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85
LO = np.uint64(0xFFFFFFFF)
U64 = (1 << 64) - 1

# Random123's known-answer vectors of Philox4x32-10: (counter, key, output)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox4x32_10(ctr: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """ctr (..., 4) of uint32 values -> (..., 4) uint32 outputs, key (k0, k1)."""
    c = [np.asarray(ctr[..., i], dtype=np.uint64) for i in range(4)]
    k0, k1 = int(key[0]), int(key[1])
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & LO, (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1),
             p0 & LO]
        k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
    return np.stack(c, axis=-1).astype(np.uint32)


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
    return z ^ (z >> 31)


def dropout_key(seed: int, step: int, site: int) -> int:
    k = mix64((seed + 0x9E3779B97F4A7C15) & U64)
    k = mix64(k ^ ((step + 0x632BE59BD9B4E019) & U64))
    return mix64(k ^ ((site + 0x8CB92BA72F3D8DD7) & U64))


def threshold(p: float) -> int:
    return min(int(np.float64(np.float32(p)) * 2.0**32 + 0.5), 0xFFFFFFFF)


def threshold16(p: float) -> int:
    """The attention masks' threshold on 16-bit halves: round(p 2^16)."""
    return min(int(np.float64(np.float32(p)) * 2.0**16 + 0.5), 0xFFFF)


def positions(T: int, seg1: int, seg2: int) -> np.ndarray:
    """The position of each index 0..T-1: segment number above bit 28, place below."""
    t = np.arange(T, dtype=np.int64)
    pos = np.where(t < seg1, t, np.where(t < seg2, (1 << 28) + t - seg1, (2 << 28) + t - seg2))
    return pos.astype(np.uint64)


def _factor(words: np.ndarray, p: float) -> np.ndarray:
    scale = np.float32(1.0 / (1.0 - np.float64(np.float32(p))))
    return np.where(words >= np.uint32(threshold(p)), scale, np.float32(0.0)).astype(np.float32)


def row_mask(p: float, key: int, N: int, C: int, T: int | None = None, seg1: int | None = None,
             seg2: int | None = None, sample0: int = 0) -> np.ndarray:
    """(N, C) factors (0 or 1/(1-p)) of a row dropout: row r is index r % T of sample
    sample0 + r // T; counter {c / 4, pos, 0, sample}, word c % 4."""
    T = N if T is None else T
    seg1 = T if seg1 is None else seg1
    seg2 = T if seg2 is None else seg2
    r = np.arange(N)
    pos = positions(T, seg1, seg2)[r % T] if N else np.zeros(0, np.uint64)
    c = np.arange(C)
    ctr = np.zeros((N, C, 4), np.uint64)
    ctr[..., 0] = (c >> 2)[None, :]
    ctr[..., 1] = pos[:, None]
    ctr[..., 3] = (sample0 + r // T)[:, None]
    words = philox4x32_10(ctr, (key & 0xFFFFFFFF, key >> 32))
    return _factor(np.take_along_axis(words, (c & 3)[None, :, None].repeat(N, 0), 2)[..., 0], p)


def attention_mask(p: float, key: int, B: int, H: int, Tq: int, Tk: int, seg1: int | None = None,
                   seg2: int | None = None, sample0: int = 0) -> np.ndarray:
    """(B, H, Tq, Tk) factors of the attention probabilities: counter {kpos / 8, qpos,
    head + 1, sample}, 16-bit half kpos % 8 (the low half of word w is 2w, its high half
    2w + 1), kept where it is >= round(p 2^16); query and key positions by the same
    segments."""
    T = max(Tq, Tk)
    seg1 = T if seg1 is None else seg1
    seg2 = T if seg2 is None else seg2
    pos = positions(T, seg1, seg2)
    qpos, kpos = pos[:Tq], pos[:Tk]
    ctr = np.zeros((B, H, Tq, Tk, 4), np.uint64)
    ctr[..., 0] = (kpos >> np.uint64(3))[None, None, None, :]
    ctr[..., 1] = qpos[None, None, :, None]
    ctr[..., 2] = (np.arange(H) + 1)[None, :, None, None]
    ctr[..., 3] = (sample0 + np.arange(B))[:, None, None, None]
    words = philox4x32_10(ctr, (key & 0xFFFFFFFF, key >> 32))
    half = (kpos & np.uint64(7)).astype(np.int64)
    picked = np.take_along_axis(words, np.broadcast_to((half >> 1)[None, None, None, :, None],
                                                       (B, H, Tq, Tk, 1)), 4)[..., 0]
    u16 = (picked >> (16 * (half & 1)).astype(np.uint32)[None, None, None, :]) & np.uint32(0xFFFF)
    scale = np.float32(1.0 / (1.0 - np.float64(np.float32(p))))
    return np.where(u16 >= np.uint32(threshold16(p)), scale, np.float32(0.0)).astype(np.float32)

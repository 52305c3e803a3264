"""The fuzz's child process (run by tests/test_fuzz.py; not a test module itself).

Draws `count` cases with hypothesis from the run's seed, each one public entry point
called with hostile arguments (wrong types, dtypes, shapes, strides, NaN/inf, ids out of
range, lengths beyond the arrays, missing/misspelled/extra batch keys, huge sizes, odd
device strings, damaged and foreign files). Before a case runs its description is printed
and flushed, so a child that dies names the case it died in. A call must return, or raise
one of the exception types a caller is promised (TypeError, ValueError and its subclasses
CheckpointError/DataError, KeyError for batch keys, BufferError from DLPack, MemoryError
for sizes no machine has); anything else (OverflowError, AttributeError, SystemError, ...)
is a finding. A call that RETURNS is then checked against a reference that shares no code
with what it checks (NumPy's own conversions, a float64 NumPy attention, the float64 torch
GPT of tests/helpers/torch_ref.py, the documented defaults and formats): a wrong result is
a finding too, as is a model left with a non-finite parameter. Usage:
python fuzz_child.py COUNT SEED [KIND,KIND...]
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import re
import shutil
import sys
import tempfile
import time
import zipfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, NamedTuple

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import pyxtts
from helpers import allowed_mask

ALLOWED = (TypeError, ValueError, KeyError, BufferError, MemoryError, NotImplementedError)
NAMED = re.compile(r"^.{1,160}?: ", re.S)  # the refused argument, field or file, then ": "
# dropout 0: forward and forward_backward compute the same loss, which the reference checks;
# 12 mel frames at most: find_optimal_batch_size's trial steps (which plan the longest mel)
# stay cheap
CFG = pyxtts.ModelConfig(n_layers=1, d_model=8, n_heads=2, text_vocab_size=7, audio_vocab_size=5,
                         max_text_tokens=6, max_audio_tokens=8, n_cond_latents=2, dropout=0.0,
                         max_cond_frames=12)
MODEL = pyxtts.XTTSGPT(CFG, seed=0)
OPT = pyxtts.AdamW(MODEL)
SPARE = pyxtts.XTTSGPT(CFG, seed=1)  # a second model: references of "before", fresh loads
SPARE_OPT = pyxtts.AdamW(SPARE)
# the checkpoints, manifests and .pth files the cases write; removed at exit, so that runs
# do not pile up folders in the temp directory (tests/test_fuzz.py checks it)
TMP = Path(tempfile.mkdtemp(prefix="pyxtts-fuzz-"))
atexit.register(shutil.rmtree, TMP, True)
BF16 = np.dtype(ml_dtypes.bfloat16)
ref_counts: dict[str, int] = {}  # batches compared with the float64 torch GPT, by kind
accepted: dict[str, int] = {}  # accepted calls by kind, reported at the end
seconds: dict[str, float] = {}  # time by kind (drawing, calling, checking)


class Wrong(AssertionError):
    """An accepted call whose result differs from the reference."""


def expect(ok: Any, what: str) -> None:
    if not ok:
        raise Wrong(what)


class Case(NamedTuple):
    name: str
    desc: Any
    call: Callable[[], Any]
    check: Callable[[Any], None] | None = None


# ---- references: element conversions (tests/test_dtype_cast.py's rules) -----------------

NAMES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16,
         "int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "uint8": np.dtype(np.uint8),
         "bool": np.dtype(np.bool_)}
FLOAT_NAMES = ("float32", "float16", "bfloat16")
# spellings of a dtype argument whose meaning the docs fix (DESIGN.md, tests/test_tensor.py)
SPELLED = {"float32": "float32", "fp32": "float32", "float": "float32", "torch.float32": "float32",
           "float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16",
           "bf16": "bfloat16", "int32": "int32", "int64": "int64", "long": "int64", "uint8": "uint8",
           "bool": "bool"}
NOT_DTYPES = ("int8", "float64", "none", "", "full", "cpu", "complex64", "int16")


def dtype_name(spelling: Any) -> str | None:
    """The pyxtts dtype a spelling names; None for "default"; "?" for one we do not judge."""
    if spelling is None:
        return None
    if isinstance(spelling, pyxtts.dtype):
        return spelling.name
    if isinstance(spelling, str):
        return SPELLED.get(spelling, "!" if spelling in NOT_DTYPES else "?")
    for t, name in ((np.float32, "float32"), (np.float16, "float16"), (np.int32, "int32"), (np.int64, "int64"),
                    (np.uint8, "uint8"), (np.bool_, "bool")):
        if spelling is t:
            return name
    return "?"


def default_name(dt: np.dtype) -> str | None:
    """pyxtts.tensor's dtype for a NumPy array without dtype=; None: refused."""
    if dt == BF16:
        return "bfloat16"
    if dt.kind == "f":
        return "float16" if dt.itemsize == 2 else "float32"
    if dt.kind == "b":
        return "bool"
    if dt.kind == "u":
        return {1: "uint8", 2: "int32", 4: "int64"}.get(dt.itemsize)  # uint64 needs a dtype
    if dt.kind == "i":
        return "int64" if dt.itemsize == 8 else "int32"
    return None


def ref_cast(x: np.ndarray, dst: str) -> np.ndarray:
    """x (native byte order) converted by the documented rules: floats round to nearest even
    (float64 straight from the double, others through float32), float -> int truncates,
    saturates and maps NaN to 0, int -> int wraps, int -> float goes through float32,
    anything -> bool is != 0."""
    want = NAMES[dst]
    is_float = x.dtype.kind == "f" or x.dtype == BF16
    with np.errstate(all="ignore"):
        if dst == "bool":
            return (x.astype(np.float64) != 0) if is_float else (x != 0)
        if is_float and dst in FLOAT_NAMES:
            return (x if x.dtype == np.float64 else x.astype(np.float32)).astype(want)
        if is_float:
            info = np.iinfo(want)
            v = x.astype(np.float64).reshape(-1)
            out = [0 if np.isnan(f) else info.min if f <= info.min else info.max if f >= info.max + 1
                   else int(f) for f in v]
            return np.array(out, dtype=want).reshape(x.shape)
        if dst in FLOAT_NAMES:
            return x.astype(np.float32).astype(want)
        return x.astype(want)


def same_elements(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Shape, dtype and every element; NaN equals NaN (payloads are not specified)."""
    expect(got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}")
    expect(got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}")
    if want.dtype.kind == "f" or want.dtype == BF16:
        g, w = got.astype(np.float32), want.astype(np.float32)
        nan = np.isnan(w)
        expect(np.array_equal(np.isnan(g), nan), f"{what}: NaN at other positions")
        same = (g[~nan] == w[~nan]) & (np.signbit(g[~nan]) == np.signbit(w[~nan]))
        expect(same.all(), f"{what}: {int((~same).sum())} elements differ, e.g. {g[~nan][~same][:3]} "
                           f"for {w[~nan][~same][:3]}")
    else:
        expect(np.array_equal(got, want), f"{what}: elements differ")


def native(a: np.ndarray) -> np.ndarray:
    return a.astype(a.dtype.newbyteorder("=")) if a.dtype.kind in "fiub" else a


def check_tensor_from(src: np.ndarray, spelling: Any, device: Any, what: str) -> Callable[[Any], None]:
    """The check of pyxtts.tensor(src, dtype=spelling, device=device) (and of copies)."""
    before = src.copy() if isinstance(src, np.ndarray) and src.dtype != object else None
    name = dtype_name(spelling)

    def check(t: Any) -> None:
        expect(isinstance(t, pyxtts.Tensor), f"{what}: returned {type(t).__name__}")
        expect(device in (None, "cpu", "cpu:0") and t.device == "cpu" or device not in (None, "cpu", "cpu:0"),
               f"{what}: device {t.device!r} for {device!r}")
        if before is not None:
            same_elements(src, before, f"{what}: the source changed")
        if not isinstance(src, np.ndarray) or name in ("?",):
            return
        expect(name != "!", f"{what}: accepted dtype={spelling!r}, which names no pyxtts dtype")
        x = native(np.asarray(src))
        target = default_name(x.dtype) if name is None else name
        expect(target is not None, f"{what}: accepted a {x.dtype} array without dtype=")
        expect(t.dtype.name == target, f"{what}: dtype {t.dtype.name}, expected {target}")
        same_elements(t.numpy(), ref_cast(x, target), what)
    return check


# ---- reference: attention in float64 NumPy ---------------------------------------------

U32 = 2.0 ** -24  # fp32 unit roundoff
HALF_ULP = {"float32": 0.0, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}  # one ulp, relative


def allowed_keys(B: int, Tq: int, Tk: int, opts: dict) -> np.ndarray:
    """(B, Tq, Tk) bool: query i of sample b may see key j, from attention's keywords."""
    return allowed_mask(B, Tq, Tk, opts.get("causal", True), opts.get("q_lengths"), opts.get("k_lengths"),
                        opts.get("key_mask"))


def ref_attention(q, k, v, opts: dict) -> dict:
    """float64 softmax attention: out (B, H, Tq, D), lse, the probabilities, and per row
    whether it has a key, must be NaN (a NaN score, or one past float32's range: the CPU
    kernel's contract, tests/test_attention.py) or is too extreme to judge, and the
    row's error bound from the fp32 scores."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, H, Tq, D = q.shape
    scale = opts.get("scale")
    scale = 1 / np.sqrt(D) if scale is None else float(scale)
    ok = np.broadcast_to(allowed_keys(B, Tq, k.shape[2], opts)[:, None], (B, H, Tq, k.shape[2]))
    with np.errstate(all="ignore"):
        s = np.einsum("bhid,bhjd->bhij", q, k) * scale
        mag = np.einsum("bhid,bhjd->bhij", np.abs(q), np.abs(k)) * abs(scale)  # sum |q_d k_d|
        has = ok.any(-1)
        # a score past float32's range overflows to +inf in any order of the fp32 sum when no
        # term and no sum of the negative terms overflows on its own; otherwise the kernel may
        # get -inf or NaN (reported: the key is then dropped, a finite wrong row), not judged
        terms = q[:, :, :, None, :] * k[:, :, None, :, :] * scale  # (B, H, Tq, Tk, D)
        clean = (np.abs(terms) < 3.4e38).all(-1) & (np.where(terms < 0, terms, 0).sum(-1) > -3.4e38)
        over = s > 3.5e38
        nan_row = (ok & (np.isnan(s) | (over & clean))).any(-1)
        unclear = (ok & over & ~clean).any(-1)
        # a non-finite v at a key the row does not see only causally is not judged: the CPU
        # kernel multiplies its zero probability in (0 * NaN), as torch's math path does
        # (reported; lengths and key_mask keep such keys out)
        seen = np.broadcast_to(allowed_keys(B, Tq, k.shape[2], opts | {"causal": False})[:, None], ok.shape)
        extreme = (ok & ~(mag < 1e30)).any(-1) | (seen & ~np.isfinite(v).all(-1)[:, :, None, :]).any(-1)
        sm = np.where(ok, s, -np.inf)
        m = np.where(has, sm.max(-1, initial=-np.inf), 0)
        e = np.where(ok, np.exp(sm - m[..., None]), 0)
        z = e.sum(-1)
        p = np.where(has[..., None], e / np.where(has, z, 1)[..., None], 0)
        out = np.einsum("bhij,bhjd->bhid", p, np.where(np.isfinite(v), v, 0))
        lse = np.where(has, m + np.log(np.where(has, z, 1)), -np.inf)
        # a score's fp32 error is <= (D + 2) u sum|q_d k_d|; a probability moves by twice the
        # largest of them
        err = (D + 2) * U32 * np.where(ok, mag, 0).max(-1, initial=0.0)
    return {"out": out, "lse": lse, "p": p, "has": has, "nan": nan_row & ~unclear & has,
            "skip": ((extreme | unclear) & ~(nan_row & ~unclear)) & has,
            "err": err, "scale": scale, "ok": ok}


def check_attention(r: dict, out: np.ndarray, lse: np.ndarray | None, v: np.ndarray, dt: str, what: str) -> None:
    out = np.asarray(out, np.float64)
    expect(out.shape == r["out"].shape, f"{what}: out shape {out.shape}, expected {r['out'].shape}")
    none = ~r["has"]
    expect((out[none] == 0).all(), f"{what}: a row with no visible key is not zeros")
    if lse is not None:
        expect(lse.shape == r["lse"].shape, f"{what}: lse shape {lse.shape}")
        expect((lse[none] == -np.inf).all(), f"{what}: lse of a row with no key is not -inf")
        expect(np.isnan(lse[r["nan"]]).all(), f"{what}: lse of an overflowing row is not NaN")
    expect(np.isnan(out[r["nan"]]).all(), f"{what}: a row whose scores overflow (or are NaN) is not NaN")
    judge = r["has"] & ~r["nan"] & ~r["skip"]
    if not judge.any():
        return
    vmax = np.abs(np.where(r["ok"].any(-2)[..., None], np.asarray(v, np.float64), 0)).max(-2, initial=0)  # (B,H,D)
    # fp32: 1e-5 of the row's scale (sums of <= ~50 terms at u = 6e-8 stay near 1e-6) plus
    # twice the fp32 score error; 16-bit inputs: one more ulp of the output type
    tol = (1e-5 + 2 * r["err"] + HALF_ULP[dt])[..., None] * (np.abs(r["out"]) + vmax[:, :, None, :].max(-1, keepdims=True))
    bad = judge[..., None] & ~(np.abs(out - r["out"]) <= tol)
    if bad.any():
        raise Wrong(f"{what}: {int(bad.sum())} elements off, first at {np.argwhere(bad)[0].tolist()}: "
                    f"{out[bad][:3]} vs {r['out'][bad][:3]}")
    if lse is not None:
        lbad = judge & ~(np.abs(lse - r["lse"]) <= 1e-5 * (1 + np.abs(r["lse"])) + 2 * r["err"])
        if lbad.any():
            raise Wrong(f"{what}: lse off at {np.argwhere(lbad)[0].tolist()}: {lse[lbad][:3]} vs {r['lse'][lbad][:3]}")


def ref_attention_grads(r: dict, q, k, v, dout) -> tuple:
    """The float64 gradients of the reference: dV = P^T dO, dS = P (dO V^T - rowsum(dO O)),
    dQ = scale dS K, dK = scale dS^T Q; rows with no key contribute nothing."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    p = r["p"]
    dv = np.einsum("bhij,bhid->bhjd", p, do)
    dp = np.einsum("bhid,bhjd->bhij", do, v)
    di = (do * r["out"]).sum(-1, keepdims=True)
    ds = p * (dp - di)
    return r["scale"] * np.einsum("bhij,bhjd->bhid", ds, k), r["scale"] * np.einsum("bhij,bhid->bhjd", ds, q), dv


def check_grad(got: np.ndarray, want: np.ndarray, floor: float, what: str) -> None:
    """1e-4 of the tensor's largest element plus floor: dS = P (dP - Di) cancels, so an
    element whose exact value is 0 carries fp32 error of |dO| |V| |K| (floor)."""
    got = np.asarray(got, np.float64)
    expect(got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}")
    tol = 1e-4 * (np.abs(want) + np.abs(want).max(initial=0)) + floor
    bad = ~(np.abs(got - want) <= tol)
    if bad.any():
        raise Wrong(f"{what}: {int(bad.sum())} elements off, first at {np.argwhere(bad)[0].tolist()}: "
                    f"{got[bad][:3]} vs {want[bad][:3]}")


# ---- reference: the XTTS GPT in float64 torch (tests/helpers/torch_ref.py) -------------

def ref_loss(state: dict, batch: dict, token_counts: Any, kind: str) -> float | None:
    """The float64 loss of this batch for parameters `state` (~6 ms); None where torch cannot."""
    mels = batch.get("cond_mels")
    if mels is not None and np.shape(mels)[-1] < 2:
        return None  # torch's group_norm refuses one value per group (8 channels in 8 groups, 1 frame)
    ref_counts[kind] = ref_counts.get(kind, 0) + 1
    import torch  # only once a batch is accepted: the import costs ~2 s

    from helpers.torch_ref import RefGPT

    # one thread: tiny ops, and torch's OpenMP threads beside the engine's cost ~8 ms an op
    torch.set_num_threads(1)

    ref = RefGPT(CFG)
    ref.load(state)
    plain = {k: (v.numpy() if isinstance(v, pyxtts.Tensor) else v) for k, v in batch.items()}
    with torch.no_grad():
        loss, _, _ = ref(plain, None if token_counts is None else tuple(float(c) for c in token_counts))
    return float(loss)


def close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def check_step_result(state: dict, batch: dict, tc: Any, kind: str) -> Callable[[Any], None]:
    """forward / forward_backward accepted: a finite loss, the same from both calls (1e-6: the
    same fp32 forward, only the backward added), and the float64 reference's to 1e-5
    (test_model.py's tolerance: fp32 sums over a few hundred products)."""
    def check(out: Any) -> None:
        expect(isinstance(out, dict) and np.isfinite(out["loss"]), f"loss not finite: {out!r}"[:200])
        other = SPARE.forward if kind == "forward_backward" else SPARE.forward_backward
        SPARE.load_state_dict(state)
        again = other(batch, token_counts=tc)
        SPARE.zero_grad()
        expect(close(out["loss"], again["loss"], 1e-6),
               f"forward and forward_backward disagree: {out['loss']!r} vs {again['loss']!r}")
        want = ref_loss(state, batch, tc, kind)
        expect(want is None or close(out["loss"], want, 1e-5), f"loss {out['loss']!r}, float64 reference {want!r}")
    return check


# ---- strategies -------------------------------------------------------------------------

huge_ints = st.sampled_from([-(2**70), -(2**31), -1, 0, 1, 2, 3, 2**31 - 1, 2**31, 2**32, 2**63, 2**70])
odd_floats = st.sampled_from([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45, 1e38, 3e38, 1e308, -1.0])
odd_strings = st.sampled_from(["", "cpu", "cuda", "cuda:0", "cuda:99", "cpu:1", "cuda:-1", "CPU", "cuda:0 ",
                               "\ud800", "full\x00junk", "fp32", "bf16", "float16", "none", "full", "auto",
                               "selective", "torch.float32", "int8", "é", "cuda:" + "9" * 30])
# NumPy scalars: what a value read out of an array is (np.float32 is no float, np.int64 no int)
numpy_scalars = st.sampled_from([np.int64(3), np.int32(-1), np.uint8(200), np.int64(2**62), np.float32(0.5),
                                 np.float16(2.5), np.float64(1e-3), np.float32(np.nan), np.bool_(True),
                                 np.longdouble(4.0), np.complex64(1j)])
dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.int8, np.int32, np.int64, np.uint8,
                          np.uint64, np.bool_, np.complex64, object, BF16])


@st.composite
def arrays(draw, max_dims=4, max_side=5):
    dt = draw(dtypes)
    shape = tuple(draw(st.lists(st.integers(0, max_side), max_size=max_dims)))
    n = int(np.prod(shape)) if shape else 1
    if dt is object:
        a = np.empty(shape, dtype=object)
    else:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        base = draw(st.sampled_from([np.arange(n) - 2, np.full(n, np.nan), np.full(n, 1e38), np.ones(n),
                                     rng.standard_normal(n) * 300, np.array([2.5, -2.5, 65520, -0.0, 1e10, 3e9,
                                                                             np.inf, -np.inf] * n)[:n]]))
        with np.errstate(all="ignore"):
            a = np.asarray(base).astype(dt).reshape(shape)
    kind = draw(st.sampled_from(["plain", "fortran", "strided", "readonly", "byteswapped"]))
    if kind == "fortran":
        a = np.asfortranarray(a)
    elif kind == "strided" and a.ndim:
        a = np.repeat(a, 2, axis=-1)[..., ::2]
    elif kind == "readonly":
        a = a.copy()
        a.flags.writeable = False
    elif kind == "byteswapped" and a.dtype.kind in "fiu":
        a = a.astype(a.dtype.newbyteorder())
    return a


values = st.one_of(st.none(), st.booleans(), huge_ints, odd_floats, odd_strings, numpy_scalars, arrays(),
                   st.lists(st.integers(-3, 3), max_size=4), st.just(object()), st.just({}),
                   st.tuples(st.integers(-2, 70), st.integers(-2, 70)))


@st.composite
def mostly(draw, valid, hostile=values):
    """valid values three times in four: an accepted call is what the checks judge."""
    return draw(hostile) if draw(st.integers(0, 3)) == 3 else draw(valid)


dtype_args = mostly(st.sampled_from([None, "float32", "fp32", "bf16", "float16", "half", "int32", "int64",
                                     "uint8", "bool", "long", pyxtts.bfloat16, pyxtts.uint8, np.float32,
                                     np.int64, "int8", "float64"]))
device_args = mostly(st.sampled_from([None, "cpu", "cpu:0"]))
sizes = mostly(st.integers(0, 12))


@st.composite
def batches(draw, honest=False):
    """A batch of CFG's model: mostly valid (lengths, ids, shapes) when `honest`, else hostile."""
    B = draw(st.integers(1 if honest else 0, 3))
    # honest: within max_text_tokens, max_audio_tokens and, with 2 latents, the attention maximum
    Lt, La = (draw(st.integers(1, 5)), draw(st.integers(1, 7))) if honest else \
        (draw(st.integers(0, 8)), draw(st.integers(0, 10)))
    lo, hi = (0, 7) if honest else draw(st.sampled_from([(0, 7), (-2, 9), (0, 2**31 + 5)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lens = (lambda n, L: rng.integers(0, L + 1, n)) if honest else (lambda n, L: rng.integers(-1, L + 2, n))
    b = {"text_inputs": rng.integers(lo, hi, (B, Lt)), "text_targets": rng.integers(lo - 1, hi, (B, Lt)),
         "audio_inputs": rng.integers(lo, 5, (B, La)), "audio_targets": rng.integers(-1, 5, (B, La)),
         "text_lengths": lens(B, Lt), "audio_lengths": lens(B, La)}
    cond = draw(st.sampled_from(["none", "latents", "mels"]))
    if cond == "latents" and honest:
        b["cond_latents"] = rng.standard_normal((B, draw(st.integers(0, 2)), 8))
    elif cond == "mels" and honest:
        b["cond_mels"] = (rng.standard_normal((B, 80, draw(st.integers(1, 12)))) * 2).astype(np.float32)
    elif cond == "latents":
        b["cond_latents"] = draw(st.sampled_from([
            rng.standard_normal((B, 2, 8)).astype(np.float32), np.full((B, 2, 8), np.nan, np.float32),
            rng.standard_normal((B, 3, 7)), np.zeros((B, 0, 8)), rng.standard_normal((B, 1, 8))]))
    elif cond == "mels":  # the recipe mode: the conditioning path makes the latents
        S = draw(st.sampled_from([1, 3, 12, 13, 0]))
        m = (rng.standard_normal((B, 80, S)) * 2).astype(np.float32)
        b["cond_mels"] = draw(st.sampled_from([
            m, m.astype(np.float64), m[:, None], m.astype(BF16), m[:, :79], m[:1] if B > 1 else m[:, :, :0],
            np.where(rng.random(m.shape) < 0.05, np.nan, m), np.where(rng.random(m.shape) < 0.05, np.inf, m),
            m.astype(np.int32), m * 1e30]))
    if honest:
        return b
    edit = draw(st.sampled_from(["none", "drop", "misspell", "extra", "replace", "both_cond"]))
    key = draw(st.sampled_from(sorted(b)))
    if edit == "drop":
        b.pop(key)
    elif edit == "misspell":
        b[key[:-1] + "z"] = b.pop(key)
    elif edit == "extra":
        b["speaker"] = np.zeros(B)
    elif edit == "replace":
        b[key] = draw(values)
    elif edit == "both_cond":
        b["cond_latents"] = np.zeros((B, 2, 8), np.float32)
        b["cond_mels"] = np.zeros((B, 80, 3), np.float32)
    return b


def kw(draw, names, pool=values):
    return {n: draw(pool) for n in names if draw(st.booleans())}


def tensor_of(draw):
    a = draw(arrays())
    try:
        return pyxtts.tensor(a)
    except ALLOWED:
        return pyxtts.zeros((2, 3))


# ---- cases: tensors -----------------------------------------------------------------------

def case_tensor(draw) -> Case:
    a, dt, dev = draw(arrays()), draw(dtype_args), draw(device_args)
    return Case("tensor", (getattr(a, "dtype", a), getattr(a, "shape", None), dt, dev),
                lambda: pyxtts.tensor(a, dtype=dt, device=dev), check_tensor_from(a, dt, dev, "tensor"))


def case_empty(draw) -> Case:
    shape, dt, dev = draw(mostly(st.one_of(st.integers(0, 4), st.lists(st.integers(0, 3), max_size=3)))), \
        draw(dtype_args), draw(device_args)
    dims = [shape] if isinstance(shape, int) else shape if isinstance(shape, (list, tuple)) else [0]
    # zeros() writes every byte: only small shapes
    small = all(isinstance(n, int) and abs(n) < 1000 for n in dims) and abs(int(np.prod(dims))) < 2**20
    make = draw(st.sampled_from([pyxtts.empty, pyxtts.zeros])) if small else pyxtts.empty

    def check(t: Any) -> None:
        want = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else tuple(shape) \
            if isinstance(shape, (list, tuple)) else None
        expect(want is None or t.shape == want, f"shape {t.shape} for {shape!r}")
        name = dtype_name(dt)
        expect(name != "!", f"accepted dtype={dt!r}")
        expect(name in ("?",) or t.dtype.name == (name or "float32"), f"dtype {t.dtype.name} for {dt!r}")
        if make is pyxtts.zeros:
            expect(not np.asarray(t.numpy()).astype(np.float64).any(), "zeros() holds non-zeros")
    return Case(make.__name__, (shape, dt, dev), lambda: make(shape, dtype=dt, device=dev), check)


def case_from_dlpack(draw) -> Case:
    v = draw(mostly(arrays()))
    again = draw(st.booleans())  # through a second export: the read-only flag must survive it
    before = v.copy() if isinstance(v, np.ndarray) and v.dtype != object else None

    def call() -> Any:
        t = pyxtts.from_dlpack(v)
        return pyxtts.from_dlpack(t.__dlpack__()) if again else t

    def check(t: Any) -> None:
        expect(isinstance(v, np.ndarray), f"accepted a {type(v).__name__}")
        expect(t.dtype.numpy == v.dtype.newbyteorder("="), f"dtype {t.dtype} for {v.dtype}")
        same_elements(t.numpy(), np.array(v, order="C"), "from_dlpack")
        if not v.flags.writeable:  # a read-only source stays unwritten
            try:
                t.copy_(np.zeros(t.shape, t.dtype.numpy))
            except ALLOWED:
                pass
            same_elements(v, before, "from_dlpack of a read-only array: the source was written")
    return Case("from_dlpack", (getattr(v, "dtype", type(v).__name__), getattr(v, "shape", None), again), call, check)


def case_to(draw) -> Case:
    t = tensor_of(draw)
    dev, dt = draw(device_args), draw(dtype_args)
    src = t.numpy()

    def check(out: Any) -> None:
        same_elements(t.numpy(), src, ".to: the source tensor changed")
        name = dtype_name(dt)
        expect(name != "!", f"accepted dtype={dt!r}")
        if name != "?":
            target = name or t.dtype.name
            expect(out.dtype.name == target, f"dtype {out.dtype.name}, expected {target}")
            same_elements(out.numpy(), ref_cast(src, target), f".to({target})")
    return Case("to", (t.dtype, t.shape, dev, dt), lambda: t.to(device=dev, dtype=dt), check)


def case_copy(draw) -> Case:
    into_param = draw(st.booleans())
    if into_param:  # a view of the flat parameter buffer: only that view may change
        name = draw(st.sampled_from(sorted(MODEL.parameters())))
        t = MODEL.parameters()[name]
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        src = draw(st.sampled_from([rng.standard_normal(t.shape), rng.standard_normal(t.shape).astype(BF16),
                                    rng.integers(-3, 3, t.shape), np.full(t.shape, np.nan, np.float32),
                                    rng.standard_normal(t.shape)[..., None], "x"]))
    else:
        name, t = None, tensor_of(draw)
        src = draw(st.one_of(values, st.builds(lambda: pyxtts.zeros((2, 3))), arrays()))
    before = MODEL.state_dict()
    src_before = src.copy() if isinstance(src, np.ndarray) and src.dtype != object else None

    def check(_: Any) -> None:
        s = src.numpy() if isinstance(src, pyxtts.Tensor) else np.asarray(src)
        if src_before is not None:
            same_elements(src, src_before, "copy_: the source changed")
        expect(s.shape == t.shape, f"copy_ accepted a source of shape {s.shape} into {t.shape}")
        same_elements(t.numpy(), ref_cast(native(s), t.dtype.name), "copy_")
        after = MODEL.state_dict()
        changed = [k for k in after if k != name and not np.array_equal(after[k], before[k], equal_nan=True)]
        expect(not changed, f"copy_ into {name!r} changed {changed[:3]}")
    return Case("copy_", (name, t.shape, getattr(src, "shape", src)), lambda: t.copy_(src), check)


def case_dlpack(draw) -> Case:
    t = tensor_of(draw)
    args = kw(draw, ["stream", "max_version", "dl_device", "copy"],
              mostly(st.sampled_from([None, (1, 0), (0, 8), (1, 3), True, False, (1, 0), 0])))
    src = t.numpy()

    def check(cap: Any) -> None:  # the capsule's data, read back, equals the tensor
        same_elements(pyxtts.from_dlpack(cap).numpy(), src, "__dlpack__ round trip")
    return Case("dlpack", args, lambda: t.__dlpack__(**args), check)


# ---- cases: attention ---------------------------------------------------------------------

@st.composite
def attention_inputs(draw):
    """q, k, v and options: mostly well-formed (random floats, every kind of mask), sometimes
    hostile (odd shapes, dtypes, lengths, NaN/inf, huge values)."""
    if draw(st.integers(0, 3)) == 0:
        shapes = [tuple(draw(st.lists(st.integers(0, 5), min_size=3, max_size=5))) for _ in range(3)]
        qkv = [np.ones(s, np.float32) if draw(st.booleans()) else draw(arrays()) for s in shapes]
        return qkv, kw(draw, ["causal", "q_lengths", "k_lengths", "key_mask", "scale", "max_sequence_length"])
    B, H, Tq, Tk, D = (draw(st.integers(lo, hi)) for lo, hi in ((0, 3), (1, 3), (0, 9), (0, 9), (1, 8)))
    if draw(st.booleans()):
        Tk = Tq
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dt = draw(st.sampled_from([np.float32, np.float32, np.float16, BF16]))
    mag = draw(st.sampled_from([1.0, 1.0, 1.0, 5.0, 1e20]))
    q, k, v = (rng.standard_normal(s) * m for s, m in (((B, H, Tq, D), mag), ((B, H, Tk, D), mag), ((B, H, Tk, D), 1)))
    if draw(st.integers(0, 5)) == 0:
        which, bad = draw(st.sampled_from([q, k, v])), draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        if which.size:
            which.reshape(-1)[rng.integers(0, which.size, 2)] = bad
    opts: dict[str, Any] = {"causal": draw(st.booleans())}
    if draw(st.booleans()):
        opts["q_lengths"] = rng.integers(0, Tq + 1, B)
    if draw(st.booleans()):
        opts["k_lengths"] = rng.integers(0, Tk + 1, B)
    if draw(st.booleans()):
        opts["key_mask"] = rng.random((B, Tk)) < 0.7
    if draw(st.booleans()):
        opts["scale"] = draw(st.sampled_from([0.5, 2.0, 1e-3, 100.0, 3e38, -1.0, 0.0]))
    if draw(st.booleans()):
        opts["max_sequence_length"] = draw(st.integers(0, 12))
    with np.errstate(all="ignore"):
        return [x.astype(dt) for x in (q, k, v)], opts


def float_name(a: Any) -> str:
    dt = getattr(a, "dtype", None)
    return "bfloat16" if dt == BF16 else "float16" if dt == np.float16 else "float32"


def case_attention(draw, which: str) -> Case:
    (q, k, v), opts = draw(attention_inputs())
    desc = ([getattr(x, "shape", x) for x in (q, k, v)], float_name(q), {n: getattr(x, "shape", x) for n, x in opts.items()})
    fwd = [pyxtts.attention, pyxtts.attention_forward][which != "attention"]

    def fwd_check(res: Any) -> dict:
        out, lse = (res, None) if which == "attention" else res
        r = ref_attention(q, k, v, opts)
        check_attention(r, out.numpy(), None if lse is None else lse.numpy(), v, float_name(q), which)
        return r

    if which != "attention_backward":
        return Case(which, desc, lambda: fwd(q, k, v, **opts), lambda res: fwd_check(res) and None)
    bopts = {n: x for n, x in opts.items() if n != "max_sequence_length"}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dout = rng.standard_normal(np.shape(q)).astype(getattr(q, "dtype", np.float32)) if np.ndim(q) == 4 else q
    fwd_out: list = []

    def call() -> Any:
        res = pyxtts.attention_forward(q, k, v, **opts)
        fwd_out.append(res)
        return pyxtts.attention_backward(dout, q, k, v, *res, **bopts)

    def check(grads: Any) -> None:
        r = fwd_check(fwd_out[0])
        good = r["has"] & ~r["nan"] & ~r["skip"]
        if not (good | ~r["has"]).all() or float_name(q) != "float32" or \
                not all(np.isfinite(x).all() for x in (q, k, v)):
            return  # gradients judged only where every row is exact, in fp32
        want = ref_attention_grads(r, q, k, v, dout)
        g = float(np.abs(dout).max(initial=0)) * float(np.abs(v).max(initial=0)) * 1e-5
        floors = (g * float(np.abs(k).max(initial=0)) * r["scale"] * np.shape(q)[-1],
                  g * float(np.abs(q).max(initial=0)) * r["scale"] * np.shape(q)[-1], 0.0)
        for name, got, w, f in zip(("dq", "dk", "dv"), grads, want, floors):
            check_grad(got.numpy(), w, f, f"attention_backward {name}")
    return Case(which, desc, call, check)


# ---- cases: configs ------------------------------------------------------------------------

CONFIG_FIELDS = ["n_layers", "d_model", "n_heads", "text_vocab_size", "audio_vocab_size", "max_text_tokens",
                 "max_audio_tokens", "n_cond_latents", "layer_norm_eps", "text_loss_weight",
                 "max_attention_sequence_length", "start_text_token", "dropout", "conditioning",
                 "use_perceiver_resampler", "max_cond_frames"]
XTTS_V2 = {"n_layers": 30, "d_model": 1024, "n_heads": 16, "text_vocab_size": 6681, "audio_vocab_size": 1026,
           "max_text_tokens": 404, "max_audio_tokens": 608, "n_cond_latents": 32, "layer_norm_eps": 1e-5,
           "text_loss_weight": 0.01, "audio_loss_weight": 1.0, "dropout": 0.1, "use_perceiver_resampler": True,
           "max_cond_frames": 517, "start_text_token": None, "code_stride_len": 1024}


def check_model_config(c: Any, args: dict, what: str) -> None:
    """Every field as passed, else the documented default (DESIGN.md: XTTS v2's sizes);
    the derived ones by their documented rule."""
    for f, default in XTTS_V2.items():
        want = args.get(f, default)
        expect(getattr(c, f) == want and type(getattr(c, f)) is type(want) or
               (isinstance(want, (int, float)) and getattr(c, f) == want),
               f"{what}: {f} = {getattr(c, f)!r}, expected {want!r}")
    n = args.get("n_cond_latents", 32) + args.get("max_text_tokens", 404) + args.get("max_audio_tokens", 608)
    expect(c.max_attention_sequence_length == (args.get("max_attention_sequence_length") or n),
           f"{what}: max_attention_sequence_length {c.max_attention_sequence_length}")
    cond = args.get("conditioning")
    cond = (args.get("use_perceiver_resampler", True) and c.n_cond_latents > 0) if cond is None else bool(cond)
    expect(c.conditioning == cond, f"{what}: conditioning {c.conditioning}, expected {cond}")


FIELD_VALUES = {"n_layers": [1, 2], "d_model": [8, 16], "n_heads": [1, 2, 4], "text_vocab_size": [1, 7, 300],
                "audio_vocab_size": [2, 5], "max_text_tokens": [1, 6, 40], "max_audio_tokens": [1, 8],
                "n_cond_latents": [0, 2], "layer_norm_eps": [1e-5, 1e-6, 1], "text_loss_weight": [0.01, 0.0, 2],
                "max_attention_sequence_length": [None, 30, 100], "start_text_token": [None], "dropout": [0.0, 0.1],
                "conditioning": [None, False, True], "use_perceiver_resampler": [True, False],
                "max_cond_frames": [1, 12, 517]}


def config_args(draw, names=CONFIG_FIELDS) -> dict:
    """Some fields, each mostly a value a small model takes."""
    return {n: draw(mostly(st.sampled_from(FIELD_VALUES[n]))) for n in names if draw(st.booleans())}


def case_config(draw) -> Case:
    args = config_args(draw)
    return Case("config", args, lambda: pyxtts.ModelConfig(**args),
                lambda c: check_model_config(c, args, "ModelConfig"))


def case_xtts_config(draw) -> Case:
    """XTTSConfig.from_dict / from_yaml on hostile dicts and text: accepted, every field
    passed is the field's value, and to_dict() round-trips."""
    section = draw(st.sampled_from(["model", "training", "data", "bogus", 3]))
    names = {"model": CONFIG_FIELDS[:8], "training": ["learning_rate", "betas", "gradient_accumulation_steps",
                                                      "precision", "checkpointing", "max_memory_fraction",
                                                      "seed", "keep_checkpoints"],
             "data": ["batch_size", "max_text_tokens", "shuffle", "num_workers"]}.get(section, ["x"])
    pools = {"learning_rate": [1e-4, 0.5], "betas": [[0.9, 0.99]], "gradient_accumulation_steps": [1, 3],
             "precision": ["fp32", "bf16"], "checkpointing": ["none", "full"], "max_memory_fraction": [0.5, 0.9],
             "seed": [0, 5], "keep_checkpoints": [1, 3], "batch_size": [1, 8], "max_text_tokens": [6, 404],
             "shuffle": [True, False], "num_workers": [0, 2], "x": [1]} | FIELD_VALUES
    body = {n: draw(mostly(st.sampled_from(pools[n]))) for n in names if draw(st.booleans())}
    d = draw(mostly(st.sampled_from([{section: body}, {section: body, "model": None}]),
                    st.sampled_from([[body], None, {"model": 7}, {section: body, 4: {}}])))
    as_yaml = draw(st.booleans())
    if as_yaml:
        import yaml

        try:
            text = yaml.safe_dump(d) if draw(st.booleans()) else draw(st.sampled_from(
                ["model: {n_layers: [", "model:\n  n_layers: !!python/object:os.system x", "- 1\n- 2",
                 "model: &a {n_layers: *a}", "\x00", "model:\n  d_model: 1e400", "training: {seed: .nan}"]))
        except Exception:  # noqa: BLE001 - a value yaml cannot dump: the raw text then
            text = "model: {n_layers: 2}"
        call = lambda: pyxtts.XTTSConfig.from_yaml(text)  # noqa: E731
    else:
        call = lambda: pyxtts.XTTSConfig.from_dict(d)  # noqa: E731

    def check(c: Any) -> None:
        if not as_yaml and isinstance(d, dict):
            for sec, vals in d.items():
                for key, value in (vals or {}).items():
                    if value is None:
                        continue  # None asks for the documented default or derived value
                    got = getattr(getattr(c, sec), key)
                    expect(got == value or (isinstance(value, list) and list(got) == value),
                           f"{sec}.{key} = {got!r}, passed {value!r}")
        expect(pyxtts.XTTSConfig.from_dict(c.to_dict()) == c, "to_dict() does not round-trip")
    return Case("xtts_config", (as_yaml, d if not as_yaml else text)[:2], call, check)


UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30,
         "t": 2**40, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def case_memory_size(draw) -> Case:
    num = draw(mostly(st.sampled_from(["12", "1.5", "4.35", "2.01", "0.1", "99999999999999999999", "3.3", "١٢"]),
                      st.sampled_from(["0", "1e3", "-1", "", ".5", "5.", "12 12", "0.0000001", "nan", "inf"])))
    unit = draw(mostly(st.sampled_from(["", "B", "GiB", "gb", "G", "KiB", "MB", "m", "TB"]),
                       st.sampled_from(["PiB", "g i b", "ĸ", "GiBs"])))
    s = draw(st.sampled_from([f"{num}{unit}", f" {num} {unit} ", f"{num}\n{unit}", f"{num}{unit}\x00"]))
    v = draw(st.one_of(st.just(s), st.just(s), st.sampled_from([12, 0, -5, 2**70, 1.5, 3.0, True, None, b"12G"])))

    def check(n: Any) -> None:
        expect(type(n) is int and n > 0, f"{n!r}")
        if isinstance(v, str):
            m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", v)  # any script's digits
            expect(m is not None and m.group(2).lower() in UNITS, f"accepted {v!r} as {n}")
            exact = Fraction(m.group(1)) * UNITS[m.group(2).lower()]
            expect(n == int(exact), f"{v!r} is {exact} bytes (whole bytes: {int(exact)}), got {n}")
        else:
            expect(n == v, f"{v!r} -> {n}")
    return Case("parse_memory_size", v, lambda: pyxtts.parse_memory_size(v), check)


# ---- cases: the model -------------------------------------------------------------------

def case_model(draw) -> Case:
    pools = {"device": ["cpu", "cpu:0"], "precision": ["fp32", "bf16", "fp16"],
             "checkpointing": ["none", "full", "selective"], "seed": [0, 7, 2**63 - 1]}
    args = {n: draw(mostly(st.sampled_from(p))) for n, p in pools.items() if draw(st.booleans())}

    def check(m: Any) -> None:
        expect(m.checkpointing == args.get("checkpointing", "none"), f"checkpointing {m.checkpointing!r}")
        expect(all(np.isfinite(a.astype(np.float32)).all() for a in m.state_dict().values()), "non-finite init")
    return Case("model", args, lambda: pyxtts.XTTSGPT(CFG, **args), check)


def case_step(draw, which: str) -> Case:
    b = draw(batches(honest=draw(st.booleans())))
    tc = draw(st.one_of(st.none(), st.none(), st.tuples(st.integers(0, 40), st.integers(0, 40)),
                        st.tuples(huge_ints, huge_ints), values))
    f = MODEL.forward_backward if which == "forward_backward" else MODEL.forward
    state = MODEL.state_dict()
    return Case(which, {k: getattr(v, "shape", v) for k, v in b.items()} | {"tc": tc},
                lambda: f(b, token_counts=tc), check_step_result(state, b, tc, which))


def check_plan(plan: Any, what: str) -> None:
    """Every byte count >= 0; the parts add up as MemoryPlan documents: total = parameters +
    gradients + optimizer + arena + allocator rounding, arena = inputs + saved + scratch,
    saved = residuals + saved blocks + final norms + the conditioning path's."""
    d = dataclasses.asdict(plan)
    neg = [k for k, v in d.items() if isinstance(v, int) and not isinstance(v, bool) and v < 0]
    expect(not neg and all(v >= 0 for v in plan.saved_per_block), f"{what}: negative {neg}")
    expect(plan.total == plan.parameters + plan.gradients + plan.optimizer + plan.arena + plan.allocator_rounding,
           f"{what}: total {plan.total} is not the sum of its parts")
    expect(plan.arena == plan.inputs + plan.saved + plan.scratch, f"{what}: arena != inputs + saved + scratch")
    expect(plan.saved == plan.residuals + plan.saved_activations + plan.final_norms + plan.conditioning_saved,
           f"{what}: saved != residuals + blocks + final norms + conditioning")


def case_estimate(draw, on_model: bool) -> Case:
    b, t, a = draw(mostly(st.integers(1, 9))), draw(mostly(st.integers(1, 6))), draw(mostly(st.integers(1, 8)))
    extra = kw(draw, ["cond_len", "checkpointing", "budget"] if on_model else ["cond_len"],
               mostly(st.one_of(st.integers(0, 6), st.sampled_from(["none", "full", "selective"]))))

    def est(batch: Any) -> Any:
        return MODEL.estimate_memory(batch, t, a, **extra) if on_model \
            else pyxtts.estimate_memory(CFG, batch, t, a, **extra)

    def check(plan: Any) -> None:
        check_plan(plan, f"plan of batch {b}")
        expect(plan.batch_size == b, f"batch_size {plan.batch_size} for {b!r}")
        if "budget" in extra:
            return  # "auto" may choose another policy per batch size
        try:
            bigger = est(b + 1)
        except MemoryError:
            return  # b + 1 past what can be planned
        check_plan(bigger, f"plan of batch {b + 1}")
        expect(bigger.total >= plan.total, f"total shrinks from batch {b} ({plan.total}) to {b + 1} ({bigger.total})")
    return Case("estimate" if on_model else "plan", (b, t, a, extra), lambda: est(b), check)


def case_load_state_dict(draw) -> Case:
    state = MODEL.state_dict()
    key = draw(st.sampled_from(sorted(state)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    good = draw(st.sampled_from([rng.standard_normal(state[key].shape), rng.standard_normal(state[key].shape)
                                 .astype(np.float16), rng.standard_normal(state[key].shape).astype(BF16),
                                 pyxtts.tensor(rng.standard_normal(state[key].shape))]))
    value = draw(st.one_of(st.just(good), st.just(good), values))
    spelled = draw(st.sampled_from([key, key, key + "x", "gpt." + key, 0]))
    strict = draw(st.booleans())
    given = dict(state) if draw(st.booleans()) else {}
    given[spelled] = value

    def check(_: Any) -> None:
        after = MODEL.state_dict()
        for name in after:
            src = given.get(name, given.get("gpt." + name))
            want = state[name] if src is None else np.asarray(
                src.numpy() if isinstance(src, pyxtts.Tensor) else src).astype(np.float32)
            same_elements(after[name], want.reshape(after[name].shape) if want.size == after[name].size
                          else want, f"state_dict()[{name!r}] after loading")
    return Case("load_state_dict", (spelled, getattr(value, "shape", value), strict, len(given)),
                lambda: MODEL.load_state_dict(given, strict=strict), check)


def is_zero(value: Any) -> bool:
    """A number that is 0: a Python one, a NumPy scalar or a 0-d array (not a bool)."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return False
    a = np.asarray(value) if isinstance(value, (int, float, np.generic, np.ndarray)) else None
    return a is not None and a.ndim == 0 and a.dtype.kind in "fiu" and float(a) == 0


def same_optimizer_state(got: dict, want: dict, what: str) -> None:
    expect(set(got) == set(want), f"{what}: keys {sorted(set(got) ^ set(want))}")
    for k, w in want.items():
        g = got[k]
        if k == "grad_clip" and is_zero(w):
            w = None  # documented: a clip of 0 (or -0.0) is off, and reads back as None
        if isinstance(w, np.ndarray) or isinstance(g, np.ndarray):
            same_elements(np.asarray(g), np.asarray(w).astype(np.asarray(g).dtype), f"{what}[{k!r}]")
        elif isinstance(w, (list, tuple)) and isinstance(g, (list, tuple)):
            expect(tuple(g) == tuple(w), f"{what}[{k!r}] = {g!r}, gave {w!r}")
        else:
            expect(g == w, f"{what}[{k!r}] = {g!r}, gave {w!r}")


def case_opt_load(draw) -> Case:
    state = OPT.state_dict()
    key = draw(st.sampled_from(sorted(state)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = state["num_elements"]
    same = state[key].copy() if isinstance(state[key], np.ndarray) else state[key]
    state[key] = draw(mostly(st.sampled_from([same, same, rng.standard_normal(n).astype(np.float32),
                                              np.abs(rng.standard_normal(n)).astype(np.float32), 3, 0.5,
                                              (0.8, 0.9), None, 1e-3]),
                             st.one_of(values, st.sampled_from([-np.ones(n, np.float32), 2**40, np.float32(1e-3)]))))

    def check(_: Any) -> None:
        same_optimizer_state(OPT.state_dict(), state, "AdamW.state_dict() after load_state_dict")
    return Case("opt_load", (key, getattr(state[key], "shape", state[key])), lambda: OPT.load_state_dict(state), check)


def case_accumulate(draw) -> Case:
    b = draw(batches(honest=draw(st.booleans())))
    steps = draw(mostly(st.integers(1, 4)))
    state = MODEL.state_dict()

    def check(res: Any) -> None:
        """The loss a step reports is forward of the same batch on the parameters before it
        (1e-5: fp32 sums in another order, micro-batch by micro-batch)."""
        SPARE.load_state_dict(state)
        want = SPARE.forward(b)["loss"]
        expect(close(res.loss, want, 1e-5), f"loss {res.loss!r}, forward before the step {want!r}")
        expect(all(np.isfinite(v).all() for v in MODEL.state_dict().values()), "non-finite parameters")
        # the optimizer's state after a real step is one its load accepts (it once refused
        # the moments of gradients too small for v to hold, and so a genuine checkpoint)
        try:
            pyxtts.AdamW(SPARE).load_state_dict(OPT.state_dict())
        except ValueError as exc:
            raise Wrong(f"AdamW refuses its own state after the step: {exc}") from None
    return Case("accumulate", ({k: getattr(v, "shape", v) for k, v in b.items()}, steps),
                lambda: pyxtts.train_step_with_accumulation(MODEL, OPT, b, steps), check)


# ---- cases: checkpoints, workflow, data, files -------------------------------------------

def same_state(model: Any, state: dict, what: str) -> None:
    got = model.state_dict()
    expect(set(got) == set(state), f"{what}: other parameter names")
    for k in state:
        expect(got[k].tobytes() == state[k].tobytes(), f"{what}: {k} differs")


def case_save(draw) -> Case:
    step, extra = draw(mostly(st.integers(0, 10**6))), draw(mostly(
        st.sampled_from([None, {"epoch": 2}, {"a": [1, 2.5, "x"]}])))
    with_opt = draw(st.booleans())
    path = TMP / "f.safetensors"

    def check(_: Any) -> None:
        """A fresh model loads back the same bits (and the optimizer its state)."""
        fresh = pyxtts.XTTSGPT(CFG, seed=7)
        fresh_opt = pyxtts.AdamW(fresh) if with_opt else None
        meta = pyxtts.load_checkpoint(path, fresh, fresh_opt)
        same_state(fresh, MODEL.state_dict(), "save -> load into a fresh model")
        if with_opt:
            same_optimizer_state(fresh_opt.state_dict(), OPT.state_dict(), "the optimizer saved and loaded")
        expect(meta.get("step") == step, f"step {meta.get('step')!r}, saved {step!r}")
    return Case("save", (step, extra, with_opt),
                lambda: pyxtts.save_checkpoint(path, MODEL, OPT if with_opt else None, step=step, extra=extra), check)


def case_load(draw) -> Case:
    path = TMP / "g.safetensors"
    pyxtts.save_checkpoint(path, MODEL, OPT)
    saved, saved_opt = MODEL.state_dict(), OPT.state_dict()
    raw = bytearray(path.read_bytes())
    # positions drawn independently of the file's length, which hypothesis must not see
    i = draw(st.integers(0, 2**31)) % len(raw)
    raw[i] ^= draw(st.integers(0, 255))  # 0: an undamaged file, which must load
    cut = draw(st.one_of(st.none(), st.none(), st.integers(0, 2**31)))
    path.write_bytes(bytes(raw if cut is None else raw[:cut % len(raw)]))

    def check(_: Any) -> None:  # accepted: exactly what was saved, else a corrupt file got in
        same_state(MODEL, saved, f"damaged checkpoint (byte {i}, cut {cut}) accepted")
        same_optimizer_state(OPT.state_dict(), saved_opt, "damaged checkpoint accepted: the optimizer")
    return Case("load", (i, cut), lambda: pyxtts.load_checkpoint(path, MODEL, OPT), check)


def case_checkpointing(draw) -> Case:
    v = draw(mostly(st.sampled_from(["none", "full", "selective", "auto"])))

    def check(_: Any) -> None:
        expect(MODEL.checkpointing == v, f"getter {MODEL.checkpointing!r} after setting {v!r}")
    return Case("checkpointing", (v,), lambda: setattr(MODEL, "checkpointing", v), check)


def full_batch(n: int, text_len: int, audio_len: int) -> dict:
    """A full-length batch of n samples with the reference mel the plan assumes."""
    z = np.zeros
    return {"text_inputs": z((n, text_len), np.int64), "text_targets": z((n, text_len), np.int64),
            "audio_inputs": z((n, audio_len), np.int64), "audio_targets": z((n, audio_len), np.int64),
            "text_lengths": np.full(n, text_len), "audio_lengths": np.full(n, audio_len),
            "cond_mels": z((n, 80, CFG.max_cond_frames), np.float32)}


def case_find_batch(draw) -> Case:
    args = kw(draw, ["text_len", "audio_len", "start_batch_size", "safety_margin"],
              mostly(st.one_of(st.integers(1, 6), st.sampled_from([0.05, 0.5, 0.99]))))
    # a cap: uncapped (a hostile None), short sequences make the search pick thousands (1.5 s)
    args["max_batch_size"] = draw(mostly(st.integers(1, 8)))

    def find() -> Any:  # a small budget, so that the verification step stays small
        pyxtts.set_memory_limit(pyxtts.memory_allocated("cpu") + (64 << 20), "cpu")
        return pyxtts.find_optimal_batch_size(MODEL, OPT, **args)

    def check(n: Any) -> None:
        cap = args.get("max_batch_size")
        expect(type(n) is int and 1 <= n and (cap is None or n <= cap), f"returned {n!r}")
        # a step at that size runs under the same limit
        b = full_batch(n, args.get("text_len") or CFG.max_text_tokens, args.get("audio_len") or CFG.max_audio_tokens)
        MODEL.forward_backward(b)
        OPT.step()
    return Case("find_batch", args, find, check)


def case_adamw(draw) -> Case:
    pools = {"lr": [1e-3, 0.0, 0.5], "betas": [(0.9, 0.99), (0.0, 0.5)], "eps": [1e-8, 1.0],
             "weight_decay": [0.0, 0.1], "grad_clip": [None, 1.0], "loss_scale": [None, 1024.0],
             "ema_decay": [None, 0.99], "growth_interval": [1, 2000], "decay": [None, 0.5],  # decay: names
             "state_device": [None, "cpu"], "offload_chunk": [1, 64, 1000]}
    args = {n: draw(mostly(st.sampled_from(p))) for n, p in pools.items() if draw(st.integers(0, 2)) == 0}

    def check(opt: Any) -> None:
        s = opt.state_dict()
        expect(opt.state_device == args.get("state_device"), f"state_device {opt.state_device!r}")
        expect((opt.host_state_bytes > 0) == (opt.state_device == "cpu"), f"host bytes {opt.host_state_bytes}")
        for k in ("lr", "eps", "weight_decay", "grad_clip", "loss_scale", "growth_interval", "ema_decay"):
            if k in args:
                want = None if k == "grad_clip" and args[k] == 0 else args[k]  # documented: 0 is off
                expect(s[k] == want, f"state_dict()[{k!r}] = {s[k]!r}, passed {args[k]!r}")
        if "betas" in args:
            expect(tuple(s["betas"]) == tuple(args["betas"]), f"betas {s['betas']!r}")
    return Case("adamw", args, lambda: pyxtts.AdamW(MODEL, **args), check)


@st.composite
def samples(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    text = draw(mostly(st.sampled_from([rng.integers(0, 7, draw(st.integers(1, 6))), [1, 2, 3],
                                        np.array([5], np.uint8)]),
                       st.sampled_from([np.array([], np.int64), np.array([[1, 2]]), np.array([1.5, 2.0]), "abc",
                                        None, np.array([2**40, -3])])))
    audio = draw(mostly(st.sampled_from([rng.integers(0, 5, draw(st.integers(1, 8))), np.array([3], np.uint8),
                                         [4, 4]]), st.sampled_from([np.array([], np.int64), None])))
    cond = draw(mostly(st.sampled_from([None, rng.standard_normal((2, 8)).astype(np.float32)]),
                       st.sampled_from([rng.standard_normal((3, 8)), np.zeros(8), "x"])))
    return pyxtts.Sample(text, audio, cond)


def case_collate(draw) -> Case:
    ss = draw(st.lists(samples(), min_size=draw(mostly(st.just(1), st.just(0))), max_size=4))
    stops = draw(st.one_of(st.none(), st.integers(-2, 9), values)), draw(st.one_of(st.none(), st.integers(-2, 9)))

    def check(out: Any) -> None:
        """Padded to the longest; inputs the ids, targets the next id, then the stop or -1;
        padding id 0, target -1 (pyxtts/data.py's docstring)."""
        texts, audios = [np.asarray(s.text) for s in ss], [np.asarray(s.audio) for s in ss]
        for key, ids, stop in (("text", texts, stops[0]), ("audio", audios, stops[1])):
            L = max(len(x) for x in ids)
            inp, tgt = out[f"{key}_inputs"], out[f"{key}_targets"]
            expect(inp.shape == (len(ss), L) and tgt.shape == (len(ss), L), f"{key} shapes {inp.shape}")
            expect(list(out[f"{key}_lengths"]) == [len(x) for x in ids], f"{key}_lengths")
            for i, x in enumerate(ids):
                n = len(x)
                want_t = list(x[1:]) + [-1 if stop is None else stop] + [-1] * (L - n)
                expect(list(inp[i]) == list(x) + [0] * (L - n), f"{key}_inputs[{i}]")
                expect(list(tgt[i]) == want_t, f"{key}_targets[{i}] = {list(tgt[i])}, expected {want_t}")
        conds = [s.cond for s in ss]
        if conds[0] is not None:
            same_elements(out["cond_latents"], np.stack([np.asarray(c, np.float32) for c in conds]), "cond_latents")
    return Case("collate", (len(ss), stops), lambda: pyxtts.collate(ss, *stops), check)


def case_manifest(draw) -> Case:
    """TTSDataset.from_manifest on hostile JSON-lines files."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    np.save(TMP / "ids.npy", rng.integers(0, 5, 4))
    np.save(TMP / "bad.npy", np.array(["a", "b"]))
    good = st.sampled_from(['{"text": [1, 2, 3], "audio": [4, 1]}', '{"text": [1], "audio": "ids.npy"}',
                            '{"text": "ids.npy", "audio": [2], "cond": [[0.5, 1.0]]}', ''])
    lines = draw(st.lists(mostly(good, st.sampled_from([
        '{"text": [1, 2, 3], "audio": [4, 1]}', '{"text": [1], "audio": "ids.npy"}',
        '{"text": [1], "audio": [2], "cond": [[0.5, 1.0]]}', '{"text": [], "audio": [1]}',
        '{"text": [1.5], "audio": [1]}', '{"text": "bad.npy", "audio": [1]}', '{"text": "nope.npy", "audio": [1]}',
        '{"text": [1]}', '[1, 2]', '{"text": [1], "audio": [2], "cond": [1, 2]}', 'not json', '',
        '{"text": [1e400], "audio": [1]}', '{"text": [[1]], "audio": [1]}', '{"text": [1], "audio": "/etc"}',
        '{"text": [99999999999999999999999], "audio": [1]}', '\x00\xff'])), max_size=4))
    path = TMP / "manifest.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))

    def check(ds: Any) -> None:
        recs = [json.loads(x) for x in lines if x.strip()]
        expect(len(ds) == len(recs), f"{len(ds)} samples from {len(recs)} records")
        for s, r in zip(ds, recs):
            for key in ("text", "audio"):
                want = np.load(TMP / r[key]) if isinstance(r[key], str) else np.asarray(r[key])
                expect(np.array_equal(getattr(s, key), want), f"{key}: {getattr(s, key)} from {r[key]!r}")
    return Case("from_manifest", lines, lambda: pyxtts.TTSDataset.from_manifest(path), check)


TORCH_PICKLE: list[bytes] = []


def torch_pickle() -> bytes:
    """A torch.save'd checkpoint whose GPT tensors have shapes no model has."""
    if not TORCH_PICKLE:
        import io

        import torch

        buf = io.BytesIO()
        torch.save({"model": {"gpt.text_embedding.weight": torch.zeros(3, 5), "gpt.mel_embedding.weight":
                              torch.zeros(2, 4), "gpt.gpt.h.0.ln_1.weight": torch.zeros(7),
                              "gpt.text_head.weight": torch.zeros(3)}}, buf)
        TORCH_PICKLE.append(buf.getvalue())
    return TORCH_PICKLE[0]


def case_import(draw) -> Case:
    """import_xtts_checkpoint / read_xtts_checkpoint on files that hold no usable GPT: each
    must be refused (ValueError family), never accepted."""
    kind = draw(st.sampled_from(["random", "empty", "zip", "pickle", "pickle-cut", "pickle-flip"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    path = TMP / "model.pth"
    if kind == "random":
        data = rng.bytes(draw(st.integers(1, 300)))
    elif kind == "empty":
        data = b""
    elif kind == "zip":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("archive/data.pkl", rng.bytes(40))
        data = path.read_bytes()
    else:
        data = torch_pickle()
        if kind == "pickle-cut":
            data = data[:int(rng.integers(0, len(data)))]
        elif kind == "pickle-flip":
            raw = bytearray(data)
            raw[int(rng.integers(0, len(raw)))] ^= int(rng.integers(1, 256))
            data = bytes(raw)
    path.write_bytes(data)
    which = draw(st.booleans())
    call = (lambda: pyxtts.import_xtts_checkpoint(path, TMP / "out.safetensors")) if which else \
        (lambda: __import__("pyxtts.coqui_checkpoint").coqui_checkpoint.read_xtts_checkpoint(path).file.close())

    def check(_: Any) -> None:
        raise Wrong(f"accepted a {kind} file ({len(data)} bytes) as an XTTS checkpoint")
    return Case("import" if which else "read_xtts", kind, call, check)


def case_optimize(draw) -> Case:
    cfg = pyxtts.XTTSConfig.from_dict({"model": dataclasses.asdict(CFG), "data": {
        "batch_size": draw(st.integers(1, 8)), "max_text_tokens": 6, "max_audio_tokens": 8}})
    mem = draw(st.one_of(st.sampled_from([2**20, 2**24, 2**30, "1GiB", "3MB", 0, -1, "x", None]), values))
    args = kw(draw, ["margin", "keep_precision", "device"], st.one_of(st.sampled_from([0.1, 0.0, 0.99, True,
                                                                                       "cpu"]), values))

    def check(res: Any) -> None:
        """The effective batch is kept and the chosen plan fits the memory less the margin."""
        new, why = res
        expect(isinstance(why, str), "no explanation")
        expect(new.effective_batch_size == cfg.effective_batch_size,
               f"effective batch {new.effective_batch_size}, was {cfg.effective_batch_size}")
        if mem is not None:
            budget = pyxtts.parse_memory_size(mem) * new.training.max_memory_fraction * (1 - args.get("margin", 0.1))
            expect(new.memory_plan("cpu").total <= budget, f"plan {new.memory_plan('cpu').total} > budget {budget}")
    return Case("optimize_config", (mem, args), lambda: pyxtts.optimize_config(cfg, mem, **args), check)


def case_memory(draw) -> Case:
    f = draw(st.sampled_from([pyxtts.memory_stats, pyxtts.memory_allocated, pyxtts.empty_cache,
                              pyxtts.device_info, pyxtts.reset_peak_memory_stats]))
    v = draw(st.one_of(device_args, st.just("host")))  # "host": the host pool (device_info refuses it)
    return Case("memory", (f.__name__, v), lambda: f(v))


def case_block(draw) -> Case:
    v1, v2 = draw(sizes), draw(sizes)
    args = kw(draw, ["checkpointing", "device", "seed"])
    return Case("block", (v1, v2, args), lambda: pyxtts.Block(v1, v2, **args))


KINDS: dict[str, Callable[[Any], Case]] = {
    "tensor": case_tensor, "empty": case_empty, "from_dlpack": case_from_dlpack, "to": case_to,
    "copy_": case_copy, "dlpack": case_dlpack,
    "attention": lambda d: case_attention(d, "attention"),
    "attention_forward": lambda d: case_attention(d, "attention_forward"),
    "attention_backward": lambda d: case_attention(d, "attention_backward"),
    "config": case_config, "xtts_config": case_xtts_config, "parse_memory_size": case_memory_size,
    "model": case_model, "forward_backward": lambda d: case_step(d, "forward_backward"),
    "forward": lambda d: case_step(d, "forward"), "estimate": lambda d: case_estimate(d, True),
    "plan": lambda d: case_estimate(d, False), "load_state_dict": case_load_state_dict, "adamw": case_adamw,
    "opt_load": case_opt_load, "memory": case_memory, "block": case_block, "accumulate": case_accumulate,
    "save": case_save, "load": case_load, "checkpointing": case_checkpointing, "find_batch": case_find_batch,
    "collate": case_collate, "from_manifest": case_manifest, "import": case_import,
    "optimize_config": case_optimize,
}


@st.composite
def cases(draw, kinds: tuple[str, ...]) -> Case:
    return KINDS[draw(st.sampled_from(kinds))](draw)


def describe(case: Case) -> str:
    return f"{case.name} {case.desc!r}"[:400]


def run_case(case: Case, findings: list[str]) -> None:
    """Calls it; a refusal of a promised type passes, any other exception is a finding, and
    an accepted call must pass its check."""
    try:
        result = case.call()
    except ALLOWED as exc:
        # the message names what it refuses ("name: ...", "path:line: ..."): a message
        # without one is an error of NumPy's or Python's that escaped (once "the truth value
        # of an array ... is ambiguous" for causal=array). Out of memory is exempt: its
        # message starts as torch's does ("CUDA out of memory."), which tools match on
        if not isinstance(exc, MemoryError) and not NAMED.match(str(exc)):
            findings.append(describe(case)[:300] + f" -> {type(exc).__name__} naming nothing: {exc}"[:300])
        return
    except Exception as exc:  # noqa: BLE001 - every other type is a finding
        findings.append(describe(case)[:300] + f" -> {type(exc).__name__}: {exc}"[:300])
        return
    accepted[case.name] = accepted.get(case.name, 0) + 1
    if case.check is None:
        return
    try:
        case.check(result)
    except Exception as exc:  # noqa: BLE001 - a wrong result, or a check that could not run
        kind = "WRONG" if isinstance(exc, Wrong) else f"check failed with {type(exc).__name__}"
        findings.append(describe(case)[:300] + f" -> {kind}: {exc}"[:400])


def main() -> None:
    np.seterr(all="ignore")  # the references overflow on purpose (huge scores, casts)
    count, SEED = int(sys.argv[1]), int(sys.argv[2])  # the run's seed, from tests/test_fuzz.py
    kinds = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else tuple(sorted(KINDS))  # by hand: some kinds
    findings: list[str] = []
    tried = [0]
    opt_state = OPT.state_dict()

    @seed(SEED)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        state = MODEL.state_dict()
        t0 = time.perf_counter()
        case = data.draw(cases(kinds))
        tried[0] += 1
        print(json.dumps({"start": describe(case)}), flush=True)
        try:
            run_case(case, findings)
        finally:
            pyxtts.set_memory_limit(None, "cpu")
            MODEL.checkpointing = "none"
            MODEL.load_state_dict(state)  # the next case starts from the same model and optimizer
            MODEL.zero_grad()
            OPT.load_state_dict(opt_state)
        if not all(np.isfinite(v.astype(np.float32)).all() for v in MODEL.state_dict().values()):
            findings.append(describe(case)[:300] + " -> left a non-finite parameter")
        seconds[case.name] = seconds.get(case.name, 0.0) + time.perf_counter() - t0

    run()
    print(json.dumps({"done": tried[0], "findings": findings, "reference_checks": ref_counts,
                      "accepted": dict(sorted(accepted.items())),
                      "seconds": {k: round(v, 2) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}}), flush=True)


if __name__ == "__main__":
    main()

"""Element type conversions: .to(dtype=...) and pyxtts.tensor(x, dtype=...).

Reference semantics (csrc/cpu/cast.c, the same on every backend):
- float32 -> float16 / bfloat16 rounds to nearest even; overflow gives inf,
  underflow gives subnormals or signed zero; NaN stays NaN with its sign;
- float16 / bfloat16 -> float32 is exact;
- float -> int truncates toward zero, saturates at the integer's bounds, NaN -> 0;
- int -> int keeps the value where it fits, else wraps (low bits, like NumPy);
- int -> float goes through float32 (round to nearest even);
- anything -> bool is "!= 0" (NaN is True, -0.0 is False).
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import (BF16, DTYPE_NAMES, FLOAT_NAMES, NP_DTYPE, assert_bits_equal,
                      assert_floats_equal, bits, random_array)

import pyxtts

pytestmark = pytest.mark.usefixtures("check_memory")

F32 = np.float32


def f32(*bit_patterns) -> np.ndarray:
    return np.array(bit_patterns, np.uint32).view(F32)


def cast(x: np.ndarray, dtype: str, device: str = "cpu") -> np.ndarray:
    """x -> pyxtts on device -> .to(dtype) -> back as NumPy."""
    t = pyxtts.tensor(x, device=device)
    assert t.dtype.numpy == x.dtype
    out = t.to(dtype=dtype)
    assert out.dtype is getattr(pyxtts, dtype) and out.shape == x.shape and out.device == t.device
    return out.numpy()


# ---- half precision: exhaustive and against NumPy / ml_dtypes ------------------------


def test_float16_to_float32_all_65536_patterns(device):
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    with np.errstate(all="ignore"):
        expected = h.astype(F32)
    got = cast(h, "float32", device)
    assert_floats_equal(got, expected, "float16 -> float32")
    # NaN keeps its payload too (top 10 bits of the float32 mantissa)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(bits(got)[nan] & 0x7FFFFF, (bits(h)[nan].astype(np.uint32) & 0x3FF) << 13)
    assert nan.sum() == 2 * 1023  # the test really saw every NaN


def test_bfloat16_to_float32_all_65536_patterns(device):
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(BF16)
    expected = h.astype(F32)
    got = cast(h, "float32", device)
    assert_floats_equal(got, expected, "bfloat16 -> float32")
    # exact: the bfloat16 bits are the float32's top half, NaNs included
    np.testing.assert_array_equal(bits(got), bits(h).astype(np.uint32) << 16)


def _f32_samples(rng) -> np.ndarray:
    """Random bit patterns, plus values in and around the half types' ranges."""
    u = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    mag = np.exp2(rng.uniform(-27, 18, size=200_000)).astype(F32)
    sign = np.where(rng.random(200_000) < 0.5, -1, 1).astype(F32)
    # every float32 in [1, 2) with the low 16 bits on and near a tie
    ties = (0x3F800000 + (rng.integers(0, 1 << 7, 20_000, dtype=np.uint32) << 16)
            + rng.choice(np.array([0x7FFF, 0x8000, 0x8001, 0x0FFF, 0x1000, 0x1001], np.uint32), 20_000))
    return np.concatenate([u.view(F32), mag * sign, ties.astype(np.uint32).view(F32)])


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_float32_to_half_random_matches_numpy(device, target, rng, seed):
    x = _f32_samples(rng)
    with np.errstate(all="ignore"):
        expected = x.astype(NP_DTYPE[target])
    assert_floats_equal(cast(x, target, device), expected, f"seed={seed} float32 -> {target}")
    # the same numbers through pyxtts.tensor(..., dtype=...)
    t = pyxtts.tensor(x, dtype=target, device=device)
    assert_floats_equal(t.numpy(), expected, f"seed={seed} tensor(float32, dtype={target})")


# (float32 input, float16 bits expected)
F16_EDGES = [
    (1.0, 0x3C00),
    (65504.0, 0x7BFF),                     # largest finite
    (65519.99, 0x7BFF),                    # just below the overflow tie
    (65520.0, 0x7C00),                     # the tie rounds to even: infinity
    (-65520.0, 0xFC00),
    (1e6, 0x7C00),
    (float("inf"), 0x7C00),
    (float("-inf"), 0xFC00),
    (0.0, 0x0000),
    (-0.0, 0x8000),
    (1.0 + 2**-11, 0x3C00),                # tie, even neighbour below
    (1.0 + 3 * 2**-11, 0x3C02),            # tie, even neighbour above
    (1.0 + 2**-11 + 2**-20, 0x3C01),       # just above the tie
    (2049.0, 0x6800),                      # tie between 2048 and 2050
    (2051.0, 0x6802),                      # tie between 2050 and 2052
    (-2051.0, 0xE802),
    (2**-14, 0x0400),                      # smallest normal
    (2**-14 - 2**-25, 0x0400),             # tie between the largest subnormal and it
    (2**-14 - 2**-24, 0x03FF),             # largest subnormal
    (2**-24, 0x0001),                      # smallest subnormal
    (-2**-24, 0x8001),
    (2**-25, 0x0000),                      # tie with zero: even is zero
    (float(np.nextafter(F32(2**-25), F32(1))), 0x0001),
    (3 * 2**-25, 0x0002),                  # tie between 1 and 2 subnormal units
    (5 * 2**-25, 0x0002),                  # tie between 2 and 3: even is 2
    (1e-10, 0x0000),
    (-1e-10, 0x8000),                      # underflow keeps the sign
    (1e-45, 0x0000),                       # a float32 subnormal
]

# (float32 input, bfloat16 bits expected)
BF16_EDGES = [
    (1.0, 0x3F80),
    (1.0 + 2**-8, 0x3F80),                 # tie, even below
    (1.0 + 3 * 2**-8, 0x3F82),             # tie, even above
    (1.0 + 2**-8 + 2**-20, 0x3F81),
    (-(1.0 + 3 * 2**-8), 0xBF82),
    (float(f32(0x7F7F7FFF)[0]), 0x7F7F),   # below the tie under the largest float32
    (float(f32(0x7F7F8000)[0]), 0x7F80),   # the tie: rounds up to infinity (0x7F7F is odd)
    (float(f32(0x7F7FFFFF)[0]), 0x7F80),   # largest float32 -> inf
    (float("inf"), 0x7F80),
    (float("-inf"), 0xFF80),
    (0.0, 0x0000),
    (-0.0, 0x8000),
    (float(f32(0x00008000)[0]), 0x0000),   # float32 subnormal tie: even is zero
    (float(f32(0x00018000)[0]), 0x0002),   # tie: even above
    (float(f32(0x00010001)[0]), 0x0001),
    (float(f32(0x00000001)[0]), 0x0000),   # smallest float32 subnormal
    (float(f32(0x80000001)[0]), 0x8000),
    (float(f32(0x007FFFFF)[0]), 0x0080),   # largest subnormal rounds to the smallest normal
]


@pytest.mark.parametrize("target,edges", [("float16", F16_EDGES), ("bfloat16", BF16_EDGES)])
def test_float32_to_half_edge_values(device, target, edges):
    x = np.array([v for v, _ in edges], F32)
    want = np.array([b for _, b in edges], np.uint16)
    with np.errstate(all="ignore"):
        ref = x.astype(NP_DTYPE[target])
    # the table agrees with NumPy / ml_dtypes
    np.testing.assert_array_equal(bits(ref), want, err_msg=f"reference table for {target}")
    got = cast(x, target, device)
    for v, g, w in zip(x, bits(got), want):
        assert g == w, f"{target}({float(v)!r}): got {g:#06x}, expected {w:#06x}"


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_nan_stays_nan_with_its_sign(device, target):
    nans = f32(0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0x7F802000)
    got = cast(nans, target, device)
    back = got.astype(F32)
    assert np.isnan(back).all(), bits(got)
    np.testing.assert_array_equal(np.signbit(back), np.signbit(nans))
    # a quiet NaN: signalling ones (0x7F800001 would truncate to infinity) are not infinities
    quiet = 0x0200 if target == "float16" else 0x0040
    assert (bits(got) & quiet).all(), [hex(b) for b in bits(got)]


def test_half_to_half(device, rng, seed):
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    for src, dst in (("float16", "bfloat16"), ("bfloat16", "float16")):
        x = h.view(NP_DTYPE[src])
        with np.errstate(all="ignore"):
            expected = x.astype(F32).astype(NP_DTYPE[dst])  # exact widening, one rounding
        assert_floats_equal(cast(x, dst, device), expected, f"{src} -> {dst}")


# ---- float -> integer and bool -----------------------------------------------------


def _ref_float_to_int(v: np.ndarray, dst: str) -> np.ndarray:
    """cast.c's documented rule, computed in Python integers."""
    info = np.iinfo(NP_DTYPE[dst])
    out = []
    for x in v.astype(np.float64).reshape(-1):
        if np.isnan(x):
            out.append(0)
        elif x <= info.min:
            out.append(info.min)
        elif x >= info.max + 1:
            out.append(info.max)
        else:
            out.append(int(x))  # truncates toward zero
    return np.array(out, dtype=NP_DTYPE[dst]).reshape(v.shape)


FLOAT_INT_EDGES = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 0.4, -0.4, 0.9999, -0.9999, 2.5,
                   -2.5, 2.9, -2.9, 7.0, 254.9, 255.0, 255.5, 256.0, 300.7, -1.0, -255.5, 1e10,
                   -1e10, 2**31 - 128, 2**31, -2**31, -2**31 - 256, 3e9, 2**62, 2**63, -2**63,
                   2**63 * 1.5, -2**64, 3.4e38, -3.4e38, 123456.75, -98765.5]


@pytest.mark.parametrize("src", FLOAT_NAMES)
@pytest.mark.parametrize("dst", ["int32", "int64", "uint8"])
def test_float_to_int_truncates_saturates_and_zeroes_nan(device, src, dst, rng, seed):
    with np.errstate(all="ignore"):
        x = np.concatenate([np.array(FLOAT_INT_EDGES, np.float64),
                            rng.standard_normal(500) * 10.0 ** rng.integers(0, 12, 500)]
                           ).astype(NP_DTYPE[src])
    got = cast(x, dst, device)
    expected = _ref_float_to_int(x, dst)
    np.testing.assert_array_equal(got, expected, err_msg=f"seed={seed} {src} -> {dst}")
    # a few spelled out, independent of the reference function
    spot = cast(np.array([np.nan, np.inf, -np.inf, -2.9, 2.9, -0.5], NP_DTYPE[src]), dst, device)
    info = np.iinfo(NP_DTYPE[dst])
    np.testing.assert_array_equal(spot, np.array([0, info.max, info.min, max(-2, info.min), 2, 0],
                                                 NP_DTYPE[dst]))


def test_float_to_int64_saturates_at_int64_bounds(device):
    x = np.array([np.inf, 2**63, 2**64, 3e38, -np.inf, -2**63, -3e38,
                  float(np.nextafter(F32(2**63), F32(0)))], F32)
    got = cast(x, "int64", device)
    imax, imin = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    np.testing.assert_array_equal(got, np.array([imax, imax, imax, imax, imin, imin, imin,
                                                 2**63 - 2**39], np.int64))


@pytest.mark.parametrize("src", DTYPE_NAMES)
def test_anything_to_bool_is_nonzero(device, src, rng, seed):
    x = random_array(rng, src, (400,))
    if src != "bool":  # zeros (and -0.0) among the values
        x[::7] = 0
    if src in FLOAT_NAMES:
        x[3::11] = -0.0
        x[5] = np.nan
    got = cast(x, "bool", device)
    with np.errstate(all="ignore"):
        expected = x.astype(F32) != 0 if src in FLOAT_NAMES else x != 0
    assert expected.any() and not expected.all()
    assert_bits_equal(got, expected, f"seed={seed} {src} -> bool")
    # bool is stored as 0/1 bytes, never other values
    assert set(np.unique(bits(got))) <= {0, 1}


# ---- integer sources -------------------------------------------------------------------


@pytest.mark.parametrize("src", ["int32", "int64", "uint8", "bool"])
@pytest.mark.parametrize("dst", ["int32", "int64", "uint8"])
def test_int_to_int_keeps_or_wraps(device, src, dst, rng, seed):
    x = random_array(rng, src, (600,))
    if src != "bool":
        info = np.iinfo(x.dtype)
        x[:6] = [info.min, info.max, 0, 1, 255 if info.max >= 255 else 1, 256 % (info.max + 1)]
    got = cast(x, dst, device)
    expected = x.astype(NP_DTYPE[dst])  # NumPy wraps the same way
    assert_bits_equal(got, expected, f"seed={seed} {src} -> {dst}")


def test_int64_to_int32_wraps_spelled_out(device):
    x = np.array([2**40 + 5, -2**40 - 7, 2**31, 2**32 + 2**31 - 1, -1, -2**63, 2**63 - 1], np.int64)
    np.testing.assert_array_equal(cast(x, "int32", device),
                                  np.array([5, -7, -2**31, 2**31 - 1, -1, 0, -1], np.int32))
    np.testing.assert_array_equal(cast(x, "uint8", device),
                                  np.array([5, 249, 0, 255, 255, 0, 255], np.uint8))


@pytest.mark.parametrize("src", ["int32", "int64", "uint8", "bool"])
@pytest.mark.parametrize("dst", FLOAT_NAMES)
def test_int_to_float_via_float32(device, src, dst, rng, seed):
    x = random_array(rng, src, (2000,))
    if src in ("int32", "int64"):
        x[:1000] //= np.array(2**20 if src == "int32" else 2**52, x.dtype)  # small values too
        x[:8] = [0, 1, -1, 2049, 2051, 65504, 65520, -65520]
        x[8:16] = [16777217, -16777217, 2**24 + 3, 257, 258, 2**31 - 1, -2**31, 1000001]
    with np.errstate(all="ignore"):
        expected = x.astype(F32).astype(NP_DTYPE[dst])
    assert_floats_equal(cast(x, dst, device), expected, f"seed={seed} {src} -> {dst}")


def test_int_to_float16_rounds_to_even(device):
    x = np.array([2049, 2051, 4097, 4103, 65504, 65519, 65520, 70000, -65520, 1], np.int64)
    got = cast(x, "float16", device)
    np.testing.assert_array_equal(got.astype(np.float64),
                                  [2048, 2052, 4096, 4104, 65504, 65504, np.inf, np.inf, -np.inf, 1])


def test_bool_sources_are_zero_or_one(device):
    # a bool byte other than 0/1 (foreign memory) still means True
    raw = np.array([0, 1, 2, 255, 0], np.uint8)
    b = pyxtts.tensor(raw.view(np.bool_), device=device)
    for dst, want in (("float32", [0, 1, 1, 1, 0]), ("int32", [0, 1, 1, 1, 0]),
                      ("int64", [0, 1, 1, 1, 0]), ("uint8", [0, 1, 1, 1, 0]),
                      ("bfloat16", [0, 1, 1, 1, 0]), ("float16", [0, 1, 1, 1, 0])):
        np.testing.assert_array_equal(b.to(dtype=dst).numpy().astype(np.float64), want, err_msg=dst)


# ---- every pair, every device ---------------------------------------------------------


def _ref_cast(x: np.ndarray, dst: str) -> np.ndarray:
    src_float = x.dtype.kind == "f" or x.dtype == BF16
    with np.errstate(all="ignore"):
        if dst == "bool":
            return (x.astype(F32) != 0) if src_float else (x != 0)
        if src_float:
            v = x.astype(F32)
            return _ref_float_to_int(v, dst) if dst in ("int32", "int64", "uint8") \
                else v.astype(NP_DTYPE[dst])
        if dst in FLOAT_NAMES:
            return x.astype(F32).astype(NP_DTYPE[dst])
        return x.astype(NP_DTYPE[dst])


@pytest.mark.parametrize("src", DTYPE_NAMES)
@pytest.mark.parametrize("dst", DTYPE_NAMES)
def test_every_pair(device, src, dst, rng, seed):
    x = random_array(rng, src, (3, 41))
    if src in FLOAT_NAMES:  # random bits are mostly huge or tiny: add ordinary numbers
        with np.errstate(all="ignore"):
            x[0] = (rng.standard_normal(41) * 300).astype(NP_DTYPE[src])
    got = cast(x, dst, device)
    expected = _ref_cast(x, dst)
    msg = f"seed={seed} {src} -> {dst} on {device}"
    if dst in FLOAT_NAMES:
        assert_floats_equal(got, expected, msg)
    else:
        assert_bits_equal(got, expected, msg)
    # a tensor built with that dtype from this source holds the same
    t = pyxtts.tensor(x, dtype=dst, device=device)
    (assert_floats_equal if dst in FLOAT_NAMES else assert_bits_equal)(t.numpy(), got, msg)
    # and a cast to the same dtype is an exact copy
    if src == dst:
        assert_bits_equal(got, x, msg)


@pytest.mark.parametrize("shape", [(), (0,), (4, 0, 2)], ids=str)
def test_casts_of_empty_and_0d(device, shape, rng):
    for src in DTYPE_NAMES:
        x = random_array(rng, src, shape)
        for dst in DTYPE_NAMES:
            got = cast(x, dst, device)
            assert got.shape == shape
            if x.size:
                (assert_floats_equal if dst in FLOAT_NAMES else assert_bits_equal)(
                    got, _ref_cast(x, dst), f"{src}->{dst}")

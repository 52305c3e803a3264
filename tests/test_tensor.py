"""pyxtts.Tensor: construction from NumPy data, copies back, properties, errors, leaks."""
from __future__ import annotations

import gc
import sys
import weakref

import ml_dtypes
import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")
from conftest import (BF16, DTYPE_NAMES, HAS_CUDA, NP_DTYPE, assert_bits_equal, bits,  # noqa: E402
                      assert_floats_equal, random_array, requires_cuda)

import pyxtts  # noqa: E402

pytestmark = pytest.mark.usefixtures("check_memory")

SHAPES = [(), (1,), (7,), (3, 5, 7), (0,), (0, 5, 7), (3, 0, 7), (3, 5, 0), (2, 1, 3, 1, 2, 1, 2, 1)]


def dev_name(device: str) -> str:
    return "cpu" if device == "cpu" else f"cuda:{int(device.split(':')[1])}"


# ---- round trips --------------------------------------------------------------------


@pytest.mark.parametrize("name", DTYPE_NAMES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_every_dtype_and_shape(device, name, shape, rng, seed):
    x = random_array(rng, name, shape)
    t = pyxtts.tensor(x, device=device)
    msg = f"seed={seed} dtype={name} shape={shape} device={device}"
    assert t.dtype is getattr(pyxtts, name), msg
    assert t.shape == shape and t.ndim == len(shape), msg
    assert t.device == dev_name(device), msg
    assert t.numel() == x.size and t.nbytes == x.nbytes and t.itemsize == x.itemsize, msg
    assert t.is_cuda == (device != "cpu"), msg
    out = t.numpy()
    assert out.flags.c_contiguous and out.flags.writeable and out.flags.owndata, msg
    assert_bits_equal(out, x, msg)
    # both copies are separate: changing the source or the result changes nothing
    expected = x.copy()
    if x.size:
        bits(x).reshape(-1)[0] ^= 1
        bits(out).reshape(-1)[0] ^= 1
    assert_bits_equal(t.numpy(), expected, msg)


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_round_trip_through_devices(devices, name, rng, seed):
    x = random_array(rng, name, (4, 33))
    for a in devices:
        for b in devices:
            t = pyxtts.tensor(x, device=a).to(b)
            assert t.device == b
            back = t.to("cpu")
            assert back.device == "cpu"
            assert_bits_equal(back.numpy(), x, f"seed={seed} {name} {a}->{b}")


def test_large_round_trip_releases_the_gil_path(device, rng, seed):
    # >= 64 KiB copies and casts run without the GIL; same results either way
    x = random_array(rng, "float32", (300, 257))
    t = pyxtts.tensor(x, device=device)
    assert_bits_equal(t.numpy(), x, f"seed={seed}")
    with np.errstate(all="ignore"):
        assert_floats_equal(t.to(dtype="bfloat16").numpy(), x.astype(BF16), f"seed={seed}")
        assert_floats_equal(t.to(dtype="float16").numpy(), x.astype(np.float16), f"seed={seed}")


# ---- inputs NumPy has to rearrange ------------------------------------------------


def _strided_views(rng, name):
    base = random_array(rng, name, (6, 10, 4))
    return {
        "step": base[::2, 1::3, :],
        "negative": base[::-1, :, ::-2],
        "transposed": base.transpose(2, 0, 1),
        "fortran": np.asfortranarray(base),
        "broadcast": np.broadcast_to(base[:1, :1, :], (3, 5, 4)),
        "column": base[:, 3, 1],
        "zero-size-strided": base[::2, 5:5, ::-1],
        "0-d from slice": base[1, 2, 3, ...],
    }


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_strided_inputs_are_gathered(device, name, rng, seed):
    for label, view in _strided_views(rng, name).items():
        t = pyxtts.tensor(view, device=device)
        assert t.shape == view.shape, label
        assert_bits_equal(t.numpy(), np.array(view, order="C"), f"seed={seed} {name} {label}")


@pytest.mark.parametrize("name,swapped", [("float32", ">f4"), ("float16", ">f2"),
                                          ("int32", ">i4"), ("int64", ">i8")])
def test_byte_swapped_inputs(device, name, swapped, rng, seed):
    x = random_array(rng, name, (5, 9))
    be = x.astype(swapped)
    assert not be.dtype.isnative and bits(be).tobytes() != bits(x).tobytes()
    for label, src in (("contiguous", be), ("strided", be[::-1, ::2])):
        t = pyxtts.tensor(src, device=device)
        assert t.dtype is getattr(pyxtts, name)
        assert_bits_equal(t.numpy(), np.ascontiguousarray(src).astype(x.dtype),
                          f"seed={seed} {swapped} {label}")


def test_unaligned_input(rng, seed):
    x = random_array(rng, "int64", (11,))
    buf = bytearray(x.nbytes + 1)
    un = np.frombuffer(buf, dtype=np.int64, offset=1)
    un[...] = x
    assert not un.flags.aligned
    assert_bits_equal(pyxtts.tensor(un).numpy(), x, f"seed={seed}")


def test_python_lists_and_scalars():
    cases = [
        ([1, -2, 3], pyxtts.int64, np.array([1, -2, 3], np.int64)),
        ([[1.5, -2.25], [3.0, 4.0]], pyxtts.float32, np.array([[1.5, -2.25], [3, 4]], np.float32)),
        ([True, False, True], pyxtts.bool, np.array([True, False, True])),
        (3.5, pyxtts.float32, np.array(3.5, np.float32)),
        (-7, pyxtts.int64, np.array(-7, np.int64)),
        (True, pyxtts.bool, np.array(True)),
        ([], pyxtts.float32, np.zeros(0, np.float32)),
        ([[], []], pyxtts.float32, np.zeros((2, 0), np.float32)),
        (np.float32(2.5), pyxtts.float32, np.array(2.5, np.float32)),
        (np.int32(-9), pyxtts.int32, np.array(-9, np.int32)),
        (memoryview(np.arange(1, 5, dtype=np.int32)), pyxtts.int32, np.arange(1, 5, dtype=np.int32)),
    ]
    for data, dt, expected in cases:
        t = pyxtts.tensor(data)
        assert t.dtype is dt, (data, t.dtype)
        assert_bits_equal(t.numpy(), expected, repr(data))


def test_default_dtype_mapping(rng, seed):
    x64 = rng.standard_normal((4, 6)) * 1e3
    t = pyxtts.tensor(x64)
    assert t.dtype is pyxtts.float32
    assert_bits_equal(t.numpy(), x64.astype(np.float32), f"seed={seed}")
    for src, want in [(np.int8, pyxtts.int32), (np.int16, pyxtts.int32), (np.uint16, pyxtts.int32),
                      (np.uint32, pyxtts.int64), (np.uint8, pyxtts.uint8), (np.int32, pyxtts.int32),
                      (np.int64, pyxtts.int64), (np.float16, pyxtts.float16), (np.bool_, pyxtts.bool),
                      (BF16, pyxtts.bfloat16)]:
        info = np.iinfo(src) if np.dtype(src).kind in "iu" else None
        if info is not None:  # the extremes must survive the widening
            x = np.concatenate([[info.min, info.max, 0],
                                rng.integers(info.min, info.max, 20, dtype=src, endpoint=True)]).astype(src)
        else:
            x = random_array(rng, pyxtts.tensor(np.zeros(1, src)).dtype.name, (20,))
        t = pyxtts.tensor(x)
        assert t.dtype is want, src
        np.testing.assert_array_equal(t.numpy().astype(np.int64) if info else bits(t.numpy()),
                                      x.astype(np.int64) if info else bits(x),
                                      err_msg=f"seed={seed} {np.dtype(src)}")
    # float64 -> float16 / bfloat16 round once, from the double
    xs = rng.standard_normal(200) * 100
    assert_bits_equal(pyxtts.tensor(xs, dtype="float16").numpy(), xs.astype(np.float16), f"seed={seed}")
    assert_bits_equal(pyxtts.tensor(xs, dtype="bfloat16").numpy(), xs.astype(BF16), f"seed={seed}")
    # longdouble is a float too
    assert pyxtts.tensor(np.ones(2, np.longdouble)).dtype is pyxtts.float32


def test_float64_into_integers_follows_the_cast_rules(device, rng, seed):
    # straight from the double: truncate, saturate, NaN -> 0 (not NumPy's C cast)
    x = np.array([np.nan, 1e10, -1e10, np.inf, -np.inf, 2.9, -2.9, -0.5, 16777217.0,
                  2.0**62 + 2048, 1e300, -0.0, 255.9, 256.0, 2.0**63, -2.0**63])
    x = np.concatenate([x, rng.standard_normal(100) * 1e6])
    for name in ("int32", "int64", "uint8"):
        info = np.iinfo(NP_DTYPE[name])
        want = [0 if np.isnan(v) else info.min if v <= info.min else info.max if v >= info.max + 1
                else int(v) for v in x]
        for src in (x, x.astype(np.longdouble)[::-1][::-1]):
            got = pyxtts.tensor(src, dtype=name, device=device).numpy()
            np.testing.assert_array_equal(got, np.array(want, NP_DTYPE[name]),
                                          err_msg=f"seed={seed} {src.dtype} -> {name}")
    np.testing.assert_array_equal(pyxtts.tensor(x, dtype="bool", device=device).numpy(), x != 0)


def test_uint64_needs_an_explicit_dtype():
    x = np.array([1, 2**40, 7], np.uint64)
    with pytest.raises(TypeError, match=r"data:.*uint64.*dtype=pyxtts\.int64"):
        pyxtts.tensor(x)
    np.testing.assert_array_equal(pyxtts.tensor(x, dtype="int64").numpy(), x.astype(np.int64))


@pytest.mark.parametrize("spelling", [pyxtts.float16, "float16", "fp16", "half", "torch.float16",
                                      np.float16, np.dtype("<f2"), np.dtype(">f2"), torch.float16])
def test_dtype_spellings(spelling):
    t = pyxtts.tensor([1.0, 2.0], dtype=spelling)
    assert t.dtype is pyxtts.float16
    np.testing.assert_array_equal(t.numpy(), np.array([1.0, 2.0], np.float16))


def test_every_dtype_name_and_alias():
    aliases = {"float32": ["fp32", "float", np.float32, torch.float32],
               "bfloat16": ["bf16", ml_dtypes.bfloat16, BF16, torch.bfloat16],
               "int32": [np.int32, torch.int32], "int64": ["long", np.int64, torch.int64, int],
               "uint8": [np.uint8, torch.uint8], "bool": [np.bool_, torch.bool, bool]}
    for name in DTYPE_NAMES:
        obj = getattr(pyxtts, name)
        assert isinstance(obj, pyxtts.dtype) and obj.name == name and repr(obj) == f"pyxtts.{name}"
        assert obj.itemsize == NP_DTYPE[name].itemsize
        assert obj.is_floating_point == (name in ("float32", "float16", "bfloat16"))
        assert obj.numpy == NP_DTYPE[name]
        for spelling in [name, obj] + aliases.get(name, []):
            assert pyxtts.empty(2, dtype=spelling).dtype is obj, spelling


def test_dtypes_pickle_to_themselves():
    import pickle

    for name in DTYPE_NAMES:
        obj = getattr(pyxtts, name)
        assert pickle.loads(pickle.dumps(obj)) is obj


# ---- properties, repr, len -------------------------------------------------------


def test_properties_and_repr(device):
    t = pyxtts.tensor(np.array([[1.5, -2.0, 3.25], [4.0, 5.5, -6.75]], np.float32), device=device)
    assert t.shape == (2, 3) and isinstance(t.shape, tuple)
    assert len(t) == 2 and t.ndim == 2 and t.nbytes == 24 and t.itemsize == 4 and t.numel() == 6
    assert t.dtype is pyxtts.float32
    r = repr(t)
    assert r.startswith(f"pyxtts.Tensor(shape=(2, 3), dtype=float32, device='{dev_name(device)}')"), r
    for v in ("1.5", "-2.", "3.25", "5.5", "-6.75"):
        assert v in r, r
    b = pyxtts.tensor([0.5, 1.0], dtype="bfloat16", device=device)
    assert "dtype=bfloat16" in repr(b) and "0.5" in repr(b)
    s = pyxtts.tensor(7, device=device)
    assert s.shape == () and s.ndim == 0 and s.numel() == 1 and s.nbytes == 8
    assert "shape=()" in repr(s) and "7" in repr(s)
    with pytest.raises(TypeError, match="0-d"):
        len(s)
    assert len(pyxtts.empty((0, 4), device=device)) == 0


def test_repr_of_a_big_tensor_leaves_the_values_out():
    t = pyxtts.zeros(100_001)
    assert repr(t) == "pyxtts.Tensor(shape=(100001,), dtype=float32, device='cpu')"


def test_numpy_protocols(rng, seed):
    x = random_array(rng, "int32", (3, 4))
    t = pyxtts.tensor(x)
    a = np.asarray(t)
    assert_bits_equal(a, x, f"seed={seed}")
    assert a.ctypes.data != t.data_ptr()  # __array__ is a copy
    np.testing.assert_array_equal(np.asarray(t, dtype=np.float64), x.astype(np.float64))
    with pytest.raises(ValueError, match="copy"):
        np.asarray(t, copy=False)
    with pytest.raises(ValueError, match="copy"):
        t.__array__(copy=False)


# ---- .to() -------------------------------------------------------------------------


def test_to_returns_self_when_nothing_changes(device, rng):
    t = pyxtts.tensor(random_array(rng, "float32", (3,)), device=device)
    assert t.to() is t
    assert t.to(device) is t and t.to(dtype=pyxtts.float32) is t
    assert t.to(device=device, dtype="float32") is t
    c = t.to(copy=True)
    assert c is not t and c.data_ptr() != t.data_ptr()
    assert_bits_equal(c.numpy(), t.numpy())


def test_to_accepts_a_dtype_first(device, rng, seed):
    x = rng.standard_normal(50).astype(np.float32) * 10
    t = pyxtts.tensor(x, device=device)
    for spelling in (pyxtts.bfloat16, ml_dtypes.bfloat16, torch.bfloat16):
        b = t.to(spelling)
        assert b.dtype is pyxtts.bfloat16 and b.device == t.device
        assert_bits_equal(b.numpy(), x.astype(BF16), f"seed={seed}")
    h = t.to(device, "float16")
    assert_bits_equal(h.numpy(), x.astype(np.float16), f"seed={seed}")


def test_device_spellings():
    t = pyxtts.tensor([1, 2])
    for spelling in ("cpu", "cpu:0", torch.device("cpu")):
        assert pyxtts.tensor([1, 2], device=spelling).device == "cpu"
        assert t.to(spelling) is t


@requires_cuda
def test_cuda_device_spellings():
    for spelling in ("cuda", "cuda:0", 0, torch.device("cuda:0")):
        t = pyxtts.tensor([3, 4], device=spelling)
        assert t.device == "cuda:0" and t.is_cuda
        np.testing.assert_array_equal(t.numpy(), [3, 4])
        assert "device='cuda:0'" in repr(t)


def test_tensor_of_a_tensor_is_a_copy(device, rng, seed):
    x = random_array(rng, "int64", (9,))
    t = pyxtts.tensor(x, device=device)
    c = pyxtts.tensor(t, device=device)
    assert c is not t and c.data_ptr() != t.data_ptr() and c.device == t.device
    assert_bits_equal(c.numpy(), x, f"seed={seed}")
    h = pyxtts.tensor(t, dtype="float32")  # default device: cpu
    assert h.device == "cpu" and h.dtype is pyxtts.float32
    np.testing.assert_array_equal(h.numpy(), x.astype(np.float32))
    assert pyxtts.Tensor(x).dtype is pyxtts.int64  # the type is callable too


# ---- empty / zeros -------------------------------------------------------------------


@pytest.mark.parametrize("shape,expect", [(5, (5,)), ((2, 3), (2, 3)), ([4], (4,)), ((), ()),
                                          ((0, 3), (0, 3)), ([1] * 8, (1,) * 8)])
def test_empty_and_zeros_shapes(device, shape, expect):
    for make in (pyxtts.empty, pyxtts.zeros):
        t = make(shape, device=device)
        assert t.shape == expect and t.dtype is pyxtts.float32 and t.device == dev_name(device)
        assert t.nbytes == 4 * int(np.prod(expect))
        if t.nbytes:
            assert t.data_ptr() % 256 == 0
        else:
            assert t.data_ptr() == 0


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_zeros_are_zero_even_in_a_reused_block(device, name):
    shape = (37, 29)
    nbytes = int(np.prod(shape)) * NP_DTYPE[name].itemsize
    # poison blocks of exactly this size, then hand them back to the cache
    poison = [pyxtts.tensor(np.full(nbytes, 0xFF, np.uint8), device=device) for _ in range(4)]
    ptrs = {p.data_ptr() for p in poison}
    del poison
    e = pyxtts.empty(shape, dtype=name, device=device)
    if e.data_ptr() in ptrs:  # proof the poison is there to be found
        assert (bits(e.numpy()) == np.iinfo(bits(e.numpy()).dtype).max).all()
    del e
    z = pyxtts.zeros(shape, dtype=name, device=device)
    assert z.data_ptr() in ptrs, "the cache did not reuse a poisoned block; the test proves nothing"
    assert z.dtype is getattr(pyxtts, name) and z.shape == shape
    out = z.numpy()
    assert out.shape == shape and not bits(out).any()


# ---- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize("data,exc,pattern", [
    (np.array([object(), 1]), TypeError, r"data: .*dtype\('O'\)"),
    (np.array([1 + 2j]), TypeError, r"data: .*complex128"),
    (np.array(["a", "b"]), TypeError, r"data: .*<U1"),
    (np.zeros(3, "V2"), TypeError, r"data: .*V2"),
    (np.zeros(2, "datetime64[s]"), TypeError, r"data: .*<M8\[s\]"),
    ([[1], [1, 2]], TypeError, r"data: expected something NumPy can view"),
    ([None], TypeError, r"data: .*dtype\('O'\)"),
    (None, TypeError, r"data: "),
    (np.zeros([1] * 9, np.float32), ValueError, r"data: at most 8 dimensions, got 9"),
    (np.zeros(3, np.uint64), TypeError, r"data: .*uint64"),
])
def test_bad_data(data, exc, pattern):
    with pytest.raises(exc, match=pattern):
        pyxtts.tensor(data)


class ArrayOfAMissingKey:
    def __array__(self, dtype=None, copy=None):
        return {}["missing"]  # a KeyError set in C, by the dict lookup


def test_a_refusal_quotes_its_cause_as_str_does():
    """The cause reads as str(exception) on every Python: before 3.12 an error set in C
    could be held with only its argument, and the message ended in "('missing',)"."""
    with pytest.raises(TypeError) as info:
        pyxtts.tensor(ArrayOfAMissingKey())
    assert str(info.value) == ("data: expected something NumPy can view as an array, got "
                               "ArrayOfAMissingKey: 'missing'")


@pytest.mark.parametrize("dev,exc,pattern", [
    ("gpu", ValueError, r"device: expected 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    ("cuda:x", ValueError, r"device: .*'cuda:x'"),
    ("cuda:-1", ValueError, r"device: .*'cuda:-1'"),
    ("cuda:", ValueError, r"device: .*'cuda:'"),
    ("cuda:0 ", ValueError, r"device: .*'cuda:0 '"),
    ("CPU", ValueError, r"device: .*'CPU'"),
    ("cpus", ValueError, r"device: .*'cpus'"),
    ("cpu:1", ValueError, r"device: .*'cpu:1'"),
    ("", ValueError, r"device: .*''"),
    ("cpu\0junk", ValueError, r"device: "),
    ("cuda:64", ValueError, r"device: "),
    (-1, ValueError, r"device: device index must be in \[0, 64\), got -1"),
    (1.5, TypeError, r"device: expected .* got float"),
    ([0], TypeError, r"device: expected .* got list"),
])
def test_bad_device(dev, exc, pattern):
    with pytest.raises(exc, match=pattern):
        pyxtts.tensor([1.0], device=dev)
    with pytest.raises(exc, match=pattern):
        pyxtts.zeros(2, device=dev)
    with pytest.raises(exc, match=pattern):
        pyxtts.tensor([1.0]).to(dev)


# a CPU-only build and a CUDA build on a machine without GPUs say it differently
NO_CUDA_DEVICE = r"device: (device cuda:\d+ does not exist|this build of pyxtts has no CUDA backend)"


@pytest.mark.skipif(HAS_CUDA, reason="needs a machine without a GPU")
@pytest.mark.parametrize("dev", ["cuda", "cuda:0", "cuda:1", 0, "cuda:63"])
def test_cuda_device_when_there_is_none(dev):
    for call in (lambda: pyxtts.tensor([1.0], device=dev), lambda: pyxtts.empty(3, device=dev),
                 lambda: pyxtts.zeros(3, device=dev), lambda: pyxtts.tensor([1.0]).to(dev),
                 lambda: pyxtts.tensor([1.0]).to(device=dev, dtype="float16")):
        with pytest.raises(ValueError, match=NO_CUDA_DEVICE):
            call()


@requires_cuda
def test_cuda_device_index_out_of_range():
    n = pyxtts.device_count()
    with pytest.raises(ValueError, match=rf"device: device cuda:{n} does not exist"):
        pyxtts.tensor([1.0], device=f"cuda:{n}")


@pytest.mark.parametrize("dt,exc,pattern", [
    ("float64", ValueError, r"dtype: expected one of float32, .*got 'float64'"),
    ("f4", ValueError, r"dtype: .*'f4'"),
    ("", ValueError, r"dtype: .*''"),
    ("float32\0", ValueError, r"dtype: "),
    ("torch.float64", ValueError, r"dtype: .*'torch.float64'"),
    (torch.float64, ValueError, r"dtype: .*float64"),
    (np.float64, TypeError, r"dtype: NumPy dtype dtype\('float64'\) has no pyxtts equivalent"),
    (np.complex64, TypeError, r"dtype: .*complex64"),
    (np.int16, TypeError, r"dtype: .*int16"),
    (3, TypeError, r"dtype: expected a pyxtts dtype.*got 3"),
    (1.5, TypeError, r"dtype: .*1\.5"),
])
def test_bad_dtype(dt, exc, pattern):
    with pytest.raises(exc, match=pattern):
        pyxtts.tensor([1.0], dtype=dt)
    with pytest.raises(exc, match=pattern):
        pyxtts.empty(2, dtype=dt)
    with pytest.raises(exc, match=pattern):
        pyxtts.tensor([1.0]).to(dtype=dt)


@pytest.mark.parametrize("shape,exc,pattern", [
    ((-1,), ValueError, r"shape: sizes must be >= 0, got -1 at dim 0"),
    ((2, -3), ValueError, r"shape: sizes must be >= 0, got -3 at dim 1"),
    (-4, ValueError, r"shape: sizes must be >= 0, got -4"),
    ((1.5,), TypeError, r"shape: expected ints, got float at dim 0"),
    ((2, None), TypeError, r"shape: expected ints, got NoneType at dim 1"),
    (("a",), TypeError, r"shape: expected ints, got str"),
    (2.0, TypeError, r"shape: expected an int or a sequence of ints, got float"),
    (None, TypeError, r"shape: expected an int or a sequence of ints"),
    ((1,) * 9, ValueError, r"shape: at most 8 dimensions, got 9"),
    ((2**40, 2**40), ValueError, r"shape: the number of elements overflows: a tensor holds at most "
                                 r"2\*\*59 - 1 elements, got shape \(1099511627776, 1099511627776\)"),
    ((2**62, 2**62, 0), ValueError, r"got shape \(4611686018427387904, 4611686018427387904, 0\)"),
    ((2**59,), ValueError, r"shape: the number of elements overflows: .* got shape \(576460752303423488,\)"),
    ((2**31, 2**31, 2**31, -1), ValueError, r"shape: the number of elements overflows"),
])
def test_bad_shape(shape, exc, pattern):
    for make in (pyxtts.empty, pyxtts.zeros):
        with pytest.raises(exc, match=pattern):
            make(shape)


def test_the_largest_shape_is_out_of_memory_not_refused():
    # 2**59 - 1 elements pass the size rule; no machine holds them
    with pytest.raises(pyxtts.OutOfMemoryError, match="out of memory"):
        pyxtts.empty(2**59 - 1, dtype=pyxtts.uint8)
    # an empty tensor multiplies no size after its 0, as before
    assert pyxtts.empty((0, 2**62, 2**62)).shape == (0, 2**62, 2**62)


def test_bad_keywords():
    with pytest.raises(TypeError):
        pyxtts.tensor()
    with pytest.raises(TypeError):
        pyxtts.tensor([1], colour="red")
    with pytest.raises(TypeError):
        pyxtts.tensor([1]).to("cpu", "float32", True)  # copy is keyword-only


# ---- references and memory -----------------------------------------------------------


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_source_refcount_unchanged(device, name, rng):
    x = random_array(rng, name, (8, 3))
    views = {"c": x, "strided": x[::2], "transposed": x.T}
    if x.dtype.itemsize > 1 and x.dtype != BF16:
        views["swapped"] = x.astype(x.dtype.newbyteorder())
    for label, src in views.items():
        before = sys.getrefcount(src)
        t = pyxtts.tensor(src, device=device)
        assert sys.getrefcount(src) == before, label
        t2 = t.to(dtype="float32")
        out = t2.numpy()
        assert sys.getrefcount(src) == before, label
        del t, t2, out
        gc.collect()
        assert sys.getrefcount(src) == before, label


def test_memory_is_accounted_and_returned(device, rng):
    gc.collect()
    start = pyxtts.memory_allocated(device)
    t = pyxtts.tensor(random_array(rng, "float32", (1000,)), device=device)
    assert pyxtts.memory_allocated(device) >= start + 4000
    h = t.to(dtype="float16")
    assert pyxtts.memory_allocated(device) >= start + 6000
    z = pyxtts.empty((0, 9), device=device)  # nothing to allocate
    del t, h
    assert pyxtts.memory_allocated(device) == start
    del z
    gc.collect()
    assert pyxtts.memory_allocated(device) == start


def test_failed_calls_leak_nothing(rng):
    x = random_array(rng, "float32", (64,))
    before = sys.getrefcount(x)
    gc.collect()
    start = pyxtts.memory_allocated("cpu")
    for _ in range(3):
        with pytest.raises(ValueError):
            pyxtts.tensor(x, device="gpu")
        with pytest.raises(ValueError):
            pyxtts.tensor(x, dtype="float64")
        with pytest.raises(TypeError):
            pyxtts.tensor(np.array([1j, 2j]))
        with pytest.raises(ValueError):
            pyxtts.empty((4, -1))
    assert sys.getrefcount(x) == before
    assert pyxtts.memory_allocated("cpu") == start


def test_weakrefs_and_gc():
    t = pyxtts.tensor([1, 2, 3])
    r = weakref.ref(t)
    assert r() is t
    del t
    assert r() is None


def test_many_tensors_do_not_grow_memory(rng):
    x = random_array(rng, "float32", (257,))
    gc.collect()
    start = pyxtts.memory_allocated("cpu")
    for _ in range(200):
        t = pyxtts.tensor(x).to(dtype="bfloat16")
    del t
    assert pyxtts.memory_allocated("cpu") == start

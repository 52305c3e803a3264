"""DLPack: Tensor.__dlpack__ / __dlpack_device__ and pyxtts.from_dlpack, with NumPy and torch."""
from __future__ import annotations

import ctypes
import gc
import sys
import weakref

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")
from conftest import (BF16, DTYPE_NAMES, HAS_CUDA, assert_bits_equal, bits, random_array,  # noqa: E402
                      requires_cuda)

import pyxtts  # noqa: E402

pytestmark = pytest.mark.usefixtures("check_memory")

# NumPy cannot export or import bfloat16 through DLPack; torch can
NUMPY_DLPACK = [n for n in DTYPE_NAMES if n != "bfloat16"]
TORCH_DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool}
kDLCPU, kDLCUDA = 1, 2
READ_ONLY, IS_COPIED = 1, 2


# ---- reading capsules with ctypes ---------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype, _get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def capsule_name(cap) -> str:
    return _get_name(cap).decode()


def read_capsule(cap):
    """(managed struct, its DLTensor) of a live capsule, either layout."""
    name = capsule_name(cap)
    ptr = _get_pointer(cap, name.encode())
    kind = DLManagedTensorVersioned if name == "dltensor_versioned" else DLManagedTensor
    m = kind.from_address(ptr)
    return m, m.dl_tensor


DL_CODE = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "int32": (0, 32),
           "int64": (0, 64), "uint8": (1, 8), "bool": (6, 8)}


# ---- export: the capsule itself -----------------------------------------------------


@pytest.mark.parametrize("name", DTYPE_NAMES)
@pytest.mark.parametrize("versioned", [False, True], ids=["legacy", "versioned"])
def test_capsule_contents(device, name, versioned, rng):
    x = random_array(rng, name, (3, 4, 5))
    t = pyxtts.tensor(x, device=device)
    before = sys.getrefcount(t)
    cap = t.__dlpack__(max_version=(1, 0)) if versioned else t.__dlpack__()
    assert capsule_name(cap) == ("dltensor_versioned" if versioned else "dltensor")
    assert sys.getrefcount(t) == before + 1  # the capsule keeps the tensor alive
    m, dl = read_capsule(cap)
    if versioned:
        assert (m.major, m.minor) == (1, 0) and m.flags == 0
    assert m.deleter
    assert dl.data == t.data_ptr() and dl.byte_offset == 0
    dev_type = kDLCPU if device == "cpu" else kDLCUDA
    assert (dl.device.device_type, dl.device.device_id) == (dev_type, 0)
    assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (*DL_CODE[name], 1)
    assert dl.ndim == 3
    assert [dl.shape[i] for i in range(3)] == [3, 4, 5]
    assert [dl.strides[i] for i in range(3)] == [20, 5, 1]
    del cap, m, dl  # never consumed: the capsule's destructor lets the tensor go
    gc.collect()
    assert sys.getrefcount(t) == before


def test_dlpack_device(device):
    t = pyxtts.tensor([1, 2], device=device)
    assert t.__dlpack_device__() == ((kDLCPU, 0) if device == "cpu" else (kDLCUDA, 0))


@pytest.mark.parametrize("max_version,name", [(None, "dltensor"), ((0, 8), "dltensor"),
                                              ((1, 0), "dltensor_versioned"),
                                              ((1, 3), "dltensor_versioned"),
                                              ((2, 0), "dltensor_versioned")])
def test_max_version_picks_the_layout(max_version, name):
    t = pyxtts.tensor([1.5, 2.5])
    cap = t.__dlpack__(max_version=max_version)
    assert capsule_name(cap) == name
    if name == "dltensor_versioned":
        m, _ = read_capsule(cap)
        assert (m.major, m.minor) == (1, 0)  # what we produce, whatever was allowed
    np.testing.assert_array_equal(pyxtts.from_dlpack(cap).numpy(), [1.5, 2.5])


@pytest.mark.parametrize("a", [np.arange(3, dtype=">f4"), np.array(["ab"]), np.zeros(2, "M8[s]")])
def test_a_producer_refusal_names_from_dlpack(a):
    """NumPy's own refusals ("DLPack only supports native byte order.") came out naming
    nothing; they keep their type and their text, after the name."""
    with pytest.raises(BufferError, match=r"^from_dlpack: obj's __dlpack__ refused to export it: DLPack "):
        pyxtts.from_dlpack(a)


def test_dlpack_arguments_are_checked():
    t = pyxtts.tensor([1, 2, 3])
    with pytest.raises(TypeError, match="max_version: expected \\(major, minor\\)"):
        t.__dlpack__(max_version="1.0")
    with pytest.raises(TypeError, match="dl_device: expected a \\(device_type, device_id\\) tuple"):
        t.__dlpack__(dl_device="cpu")
    with pytest.raises(BufferError, match="dl_device: device type 9 is not supported"):
        t.__dlpack__(dl_device=(9, 0))
    with pytest.raises(ValueError, match=r"^dl_device: "):  # a device this machine has not
        t.__dlpack__(dl_device=(2, 14))  # (the engine's message once came without the name)
    with pytest.raises(TypeError):
        t.__dlpack__(None)  # keyword-only, as the standard says
    with pytest.raises(TypeError):
        t.__dlpack__(colour=1)


def test_copy_and_dl_device():
    x = np.arange(1, 11, dtype=np.int32)
    t = pyxtts.tensor(x)
    cap = t.__dlpack__(copy=True, max_version=(1, 0))
    m, dl = read_capsule(cap)
    assert m.flags & IS_COPIED and dl.data != t.data_ptr()
    c = pyxtts.from_dlpack(cap)
    assert c.data_ptr() != t.data_ptr()
    np.testing.assert_array_equal(c.numpy(), x)
    # copy=False and dl_device=cpu on a CPU tensor: the same memory
    for kwargs in ({"copy": False}, {"dl_device": (kDLCPU, 0)}, {"dl_device": (kDLCPU, 0), "copy": False}):
        cap = t.__dlpack__(max_version=(1, 0), **kwargs)
        m, dl = read_capsule(cap)
        assert dl.data == t.data_ptr() and not m.flags & IS_COPIED, kwargs
        assert pyxtts.from_dlpack(cap).data_ptr() == t.data_ptr()
    # leaving the device needs a copy
    with pytest.raises(BufferError, match="copy=False"):
        t.__dlpack__(dl_device=(kDLCUDA, 0), copy=False)


@pytest.mark.skipif(HAS_CUDA, reason="needs a machine without a GPU")
def test_dl_device_cuda_without_a_gpu():
    with pytest.raises(ValueError, match="cuda:0 does not exist|no CUDA backend"):
        pyxtts.tensor([1.0]).__dlpack__(dl_device=(kDLCUDA, 0))


@requires_cuda
def test_dl_device_moves_between_cpu_and_gpu(rng, seed):
    x = random_array(rng, "float32", (17,))
    t = pyxtts.tensor(x)
    cap = t.__dlpack__(dl_device=(kDLCUDA, 0), max_version=(1, 0))
    m, dl = read_capsule(cap)
    assert dl.device.device_type == kDLCUDA and m.flags & IS_COPIED
    g = pyxtts.from_dlpack(cap)
    assert g.device == "cuda:0"
    assert_bits_equal(g.numpy(), x, f"seed={seed}")
    h = pyxtts.from_dlpack(g.__dlpack__(dl_device=(kDLCPU, 0)))
    assert h.device == "cpu"
    assert_bits_equal(h.numpy(), x, f"seed={seed}")


def test_unconsumed_capsules_free_everything(rng):
    x = random_array(rng, "float32", (1000,))
    gc.collect()
    start = pyxtts.memory_allocated("cpu")
    t = pyxtts.tensor(x)
    r = weakref.ref(t)
    caps = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0)), t.__dlpack__(copy=True),
            t.__dlpack__(copy=True, max_version=(1, 0))]
    assert pyxtts.memory_allocated("cpu") >= start + 3 * x.nbytes  # the two copies exist
    del t
    assert r() is not None  # the capsules hold it
    del caps
    gc.collect()
    assert r() is None
    assert pyxtts.memory_allocated("cpu") == start


# ---- pyxtts -> NumPy / torch (zero-copy) --------------------------------------------------


@pytest.mark.parametrize("name", NUMPY_DLPACK)
def test_numpy_from_dlpack_is_zero_copy(name, rng, seed):
    x = random_array(rng, name, (6, 7))
    t = pyxtts.tensor(x)
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr()
    assert_bits_equal(a, x, f"seed={seed}")
    # shared memory: a write through NumPy shows in the tensor
    bits(a)[2, 3] ^= 1
    expected = x.copy()
    bits(expected)[2, 3] ^= 1
    assert_bits_equal(t.numpy(), expected, f"seed={seed}")


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_torch_from_dlpack_is_zero_copy(name, rng, seed):
    x = random_array(rng, name, (5, 3))
    t = pyxtts.tensor(x)
    tt = torch.from_dlpack(t)
    assert tt.dtype == TORCH_DTYPE[name] and tuple(tt.shape) == (5, 3)
    assert tt.data_ptr() == t.data_ptr()
    assert tt.stride() == (3, 1)
    assert_bits_equal(_torch_to_numpy(tt), x, f"seed={seed}")
    tt[0, 0] = tt[4, 2] if name != "bool" else ~tt[0, 0]
    assert_bits_equal(t.numpy(), _torch_to_numpy(tt), f"seed={seed}")


def _torch_to_numpy(tt: torch.Tensor) -> np.ndarray:
    if tt.dtype == torch.bfloat16:
        return tt.view(torch.int16).numpy().view(np.uint16).view(BF16)
    return tt.numpy()


def test_exported_data_outlives_the_tensor(rng, seed):
    x = random_array(rng, "int64", (4096,))
    gc.collect()
    start = pyxtts.memory_allocated("cpu")
    t = pyxtts.tensor(x)
    r = weakref.ref(t)
    a = np.from_dlpack(t)
    tt = torch.from_dlpack(t)
    del t
    gc.collect()
    assert r() is not None
    # if the block had gone back to the cache these would take it and overwrite it
    churn = [pyxtts.tensor(np.full(4096, -1, np.int64)) for _ in range(4)]
    assert_bits_equal(a, x, f"seed={seed}")
    assert_bits_equal(tt.numpy(), x, f"seed={seed}")
    del churn, a
    gc.collect()
    assert r() is not None  # torch still holds it
    del tt
    gc.collect()
    assert r() is None
    assert pyxtts.memory_allocated("cpu") == start


def test_zero_size_and_0d_exports():
    z = pyxtts.tensor(np.zeros((0, 3), np.float32))
    assert np.from_dlpack(z).shape == (0, 3)
    assert tuple(torch.from_dlpack(z).shape) == (0, 3)
    s = pyxtts.tensor(np.float32(3.5))
    assert np.from_dlpack(s).shape == () and np.from_dlpack(s)[()] == 3.5
    assert torch.from_dlpack(s).item() == 3.5


# ---- NumPy / torch -> pyxtts (zero-copy) ---------------------------------------------------


@pytest.mark.parametrize("name", NUMPY_DLPACK)
def test_from_numpy_is_zero_copy(name, rng, seed):
    x = random_array(rng, name, (5, 8))
    before = sys.getrefcount(x)
    t = pyxtts.from_dlpack(x)
    assert t.data_ptr() == x.ctypes.data
    assert t.dtype is getattr(pyxtts, name) and t.shape == (5, 8) and t.device == "cpu"
    assert_bits_equal(t.numpy(), x, f"seed={seed}")
    bits(x)[1, 2] ^= 1  # shared memory
    assert_bits_equal(t.numpy(), x, f"seed={seed}")
    assert sys.getrefcount(x) == before + 1  # NumPy's capsule keeps x for the tensor
    del t
    gc.collect()
    assert sys.getrefcount(x) == before


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_from_torch_is_zero_copy(name, rng, seed):
    x = random_array(rng, name, (4, 6))
    if name == "bfloat16":
        tt = torch.from_numpy(bits(x).view(np.int16)).view(torch.bfloat16)
    else:
        tt = torch.from_numpy(x.copy())
    t = pyxtts.from_dlpack(tt)
    assert t.data_ptr() == tt.data_ptr() and t.dtype is getattr(pyxtts, name)
    assert_bits_equal(t.numpy(), x, f"seed={seed}")
    r = weakref.ref(tt)
    del tt
    gc.collect()
    assert r() is not None  # the tensor keeps torch's memory alive
    del t
    gc.collect()
    assert r() is None


def test_source_deleted_first_numpy(rng, seed):
    x = random_array(rng, "float32", (2048,))
    expected = x.copy()
    t = pyxtts.from_dlpack(x)
    r = weakref.ref(x)
    del x
    gc.collect()
    assert r() is not None
    churn = [np.full(2048, -1.0, np.float32) for _ in range(8)]  # reuse of freed memory shows
    assert_bits_equal(t.numpy(), expected, f"seed={seed}")
    # and the imported tensor can be exported again, still zero-copy
    assert np.from_dlpack(t).ctypes.data == t.data_ptr()
    del churn, t
    gc.collect()
    assert r() is None


def test_source_deleted_first_torch(rng, seed):
    x = random_array(rng, "int32", (3000,))
    t = pyxtts.from_dlpack(torch.from_numpy(x.copy()))  # the torch tensor dies right away
    gc.collect()
    churn = [torch.full((3000,), -1, dtype=torch.int32) for _ in range(8)]
    assert_bits_equal(t.numpy(), x, f"seed={seed}")
    del churn


def test_pyxtts_to_pyxtts(device, rng, seed):
    x = random_array(rng, "bfloat16", (9, 2))
    t = pyxtts.tensor(x, device=device)
    u = pyxtts.from_dlpack(t)
    assert u.data_ptr() == t.data_ptr() and u.device == t.device and u.dtype is pyxtts.bfloat16
    r = weakref.ref(t)
    del t
    gc.collect()
    assert r() is not None
    assert_bits_equal(u.numpy(), x, f"seed={seed}")
    del u
    gc.collect()
    assert r() is None


def test_zero_size_and_0d_imports():
    assert pyxtts.from_dlpack(np.zeros((0, 3), np.float32)).shape == (0, 3)
    assert pyxtts.from_dlpack(torch.zeros(2, 0, dtype=torch.int64)).shape == (2, 0)
    s = pyxtts.from_dlpack(np.array(2.5, np.float32))
    assert s.shape == () and s.numpy()[()] == 2.5
    s = pyxtts.from_dlpack(torch.tensor(-7, dtype=torch.int32))
    assert s.shape == () and s.numpy()[()] == -7


def test_read_only_numpy_stays_read_only(rng):
    x = random_array(rng, "float32", (6,))
    x.flags.writeable = False
    t = pyxtts.from_dlpack(x)
    assert t.data_ptr() == x.ctypes.data
    m, _ = read_capsule(cap := t.__dlpack__(max_version=(1, 0)))
    assert m.flags & READ_ONLY
    del m, cap
    a = np.from_dlpack(t)
    assert not a.flags.writeable
    assert_bits_equal(a, x)


# ---- non-contiguous producers are gathered -------------------------------------------


def test_strided_numpy_sources_are_copied(rng, seed):
    base = random_array(rng, "int64", (8, 9, 5))
    for label, view in {"step": base[::3], "inner step": base[:, ::2, 1:4],
                        "negative": base[::-1, :, ::-2], "transposed": base.T,
                        "column": base[:, 4, 2]}.items():
        before = sys.getrefcount(base)
        t = pyxtts.from_dlpack(view)
        assert t.shape == view.shape, label
        assert t.data_ptr() != view.ctypes.data
        assert_bits_equal(t.numpy(), np.array(view, order="C"), f"seed={seed} {label}")
        assert sys.getrefcount(base) == before, label  # the producer's capsule was released


def test_strided_torch_sources_are_copied(rng, seed):
    x = random_array(rng, "float32", (6, 10))
    tt = torch.from_numpy(x)
    for label, view, ref in (("transposed", tt.T, x.T), ("step", tt[:, 1::3], x[:, 1::3]),
                             ("row step", tt[::2], x[::2]), ("bf16 transposed", tt.bfloat16().T,
                                                             x.astype(np.float32).T)):
        t = pyxtts.from_dlpack(view)
        assert t.shape == tuple(view.shape), label
        if view.dtype == torch.bfloat16:
            assert_bits_equal(t.numpy(), _torch_to_numpy(view.contiguous()), f"seed={seed} {label}")
        else:
            assert t.data_ptr() != view.data_ptr()
            assert_bits_equal(t.numpy(), np.array(ref, order="C"), f"seed={seed} {label}")


def test_size_one_dims_with_odd_strides_stay_zero_copy(rng):
    x = random_array(rng, "int32", (4, 1, 6))
    tt = torch.from_numpy(x).as_strided((4, 1, 6), (6, 1000, 1))  # stride of a size-1 dim is free
    t = pyxtts.from_dlpack(tt)
    assert t.data_ptr() == tt.data_ptr()
    assert_bits_equal(t.numpy(), x)


# ---- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("src", [np.zeros(3), np.zeros(2, np.complex64), np.zeros(2, np.int16),
                                 torch.zeros(3, dtype=torch.float64), torch.zeros(2, dtype=torch.int16)],
                         ids=["np-f64", "np-c64", "np-i16", "torch-f64", "torch-i16"])
def test_unsupported_dtype_raises_and_releases(src):
    before = sys.getrefcount(src)
    with pytest.raises(TypeError, match=r"from_dlpack: DLPack dtype \(code \d+, bits \d+, lanes 1\) "
                                        r"has no pyxtts equivalent"):
        pyxtts.from_dlpack(src)
    gc.collect()
    assert sys.getrefcount(src) == before  # the producer's capsule was freed


def test_not_a_dlpack_object():
    for obj in (3, [1, 2], "abc", np.float32(1.0)):
        with pytest.raises(TypeError, match="from_dlpack: obj must implement __dlpack__"):
            pyxtts.from_dlpack(obj)


@pytest.mark.parametrize("versioned", [False, True], ids=["legacy", "versioned"])
def test_capsule_consumed_twice_raises(versioned):
    t = pyxtts.tensor([4, 5, 6])
    cap = t.__dlpack__(max_version=(1, 0) if versioned else None)
    u = pyxtts.from_dlpack(cap)
    np.testing.assert_array_equal(u.numpy(), [4, 5, 6])
    assert capsule_name(cap).startswith("used_")
    with pytest.raises(ValueError, match="not a live DLPack capsule"):
        pyxtts.from_dlpack(cap)
    del u, cap
    gc.collect()
    r = weakref.ref(t)
    del t
    assert r() is None


def test_foreign_capsule_raises():
    import datetime  # any module with a capsule of another name

    cap = datetime.datetime_CAPI
    with pytest.raises(ValueError, match="not a live DLPack capsule"):
        pyxtts.from_dlpack(cap)


# ---- a hand-made producer: byte_offset, strides=NULL, odd fields ----------------------

_LEGACY_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                                   ctypes.c_void_p]
_NAMES = {False: b"dltensor", True: b"dltensor_versioned"}  # must outlive the capsules


class HandMade:
    """A DLPack capsule over a NumPy array's memory, fields set by hand."""

    def __init__(self, arr, shape, strides=None, byte_offset=0, dtype=(0, 32, 1), device=(1, 0),
                 versioned=False, major=1, flags=0, ndim=None):
        self.arr = arr  # the memory
        self.calls = 0
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)

        def deleter(_ptr):
            self.calls += 1
        self.deleter = _LEGACY_DELETER(deleter)
        dl = DLTensor(data=arr.ctypes.data, device=DLDevice(*device),
                      ndim=len(shape) if ndim is None else ndim, dtype=DLDataType(*dtype),
                      shape=ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64)),
                      strides=None if strides is None
                      else ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64)),
                      byte_offset=byte_offset)
        fn = ctypes.cast(self.deleter, ctypes.c_void_p)
        if versioned:
            self.managed = DLManagedTensorVersioned(major=major, minor=0, manager_ctx=None,
                                                    deleter=fn, flags=flags, dl_tensor=dl)
        else:
            self.managed = DLManagedTensor(dl_tensor=dl, manager_ctx=None, deleter=fn)
        self.capsule = _capsule_new(ctypes.addressof(self.managed), _NAMES[versioned], None)


def test_byte_offset_and_null_strides_are_honoured():
    arr = np.arange(100, 140, dtype=np.int32)
    h = HandMade(arr, shape=(2, 5), byte_offset=3 * 4)  # strides NULL: C order
    t = pyxtts.from_dlpack(h.capsule)
    assert t.data_ptr() == arr.ctypes.data + 12  # zero-copy, offset applied
    np.testing.assert_array_equal(t.numpy(), arr[3:13].reshape(2, 5))
    assert capsule_name(h.capsule) == "used_dltensor" and h.calls == 0
    del t
    gc.collect()
    assert h.calls == 1  # the producer's deleter runs exactly once, when the tensor goes


def test_hand_made_strided_source_is_gathered_and_released():
    arr = np.arange(60, dtype=np.int64)
    h = HandMade(arr, shape=(3, 4), strides=(-12, 3), byte_offset=8 * 25, dtype=(0, 64, 1),
                 versioned=True)
    t = pyxtts.from_dlpack(h.capsule)
    ref = np.array([arr[25 - 12 * i + 3 * j] for i in range(3) for j in range(4)]).reshape(3, 4)
    np.testing.assert_array_equal(t.numpy(), ref)
    assert t.data_ptr() != arr.ctypes.data
    assert h.calls == 1  # copied: the producer's memory is given back at once
    del t


def test_cuda_host_memory_reads_as_cpu():
    arr = np.arange(6, dtype=np.uint8) + 1
    h = HandMade(arr, shape=(6,), dtype=(1, 8, 1), device=(3, 0))  # kDLCUDAHost
    t = pyxtts.from_dlpack(h.capsule)
    assert t.device == "cpu" and t.data_ptr() == arr.ctypes.data
    np.testing.assert_array_equal(t.numpy(), arr)


def test_hand_made_read_only_flag_carries_over():
    arr = np.arange(8, dtype=np.float32) + 0.5
    h = HandMade(arr, shape=(8,), dtype=(2, 32, 1), versioned=True, flags=READ_ONLY)
    t = pyxtts.from_dlpack(h.capsule)
    m, _ = read_capsule(cap := t.__dlpack__(max_version=(1, 0)))
    assert m.flags & READ_ONLY
    del m, cap
    assert not np.from_dlpack(t).flags.writeable


@pytest.mark.parametrize("kwargs,exc,pattern", [
    ({"dtype": (2, 64, 1)}, TypeError, r"code 2, bits 64, lanes 1"),
    ({"dtype": (2, 32, 4)}, TypeError, r"lanes 4"),
    ({"dtype": (5, 64, 1)}, TypeError, r"code 5"),
    ({"device": (4, 0)}, BufferError, r"device type 4 is not supported"),
    ({"versioned": True, "major": 2}, BufferError, r"major version 2 is not supported"),
    ({"ndim": 9}, ValueError, r"at most 8 dimensions, got 9"),
    ({"shape": (2, -2)}, ValueError, r"shape: sizes must be >= 0, got -2 at dim 1"),
    ({"shape": (2**40, 2**40)}, ValueError,
     r"^from_dlpack: shape: the number of elements overflows: a tensor holds at most 2\*\*59 - 1 elements, "
     r"got shape \(1099511627776, 1099511627776\)$"),
    ({"shape": (2**40, 2**40), "strides": (2**40, 1)}, ValueError,
     r"^from_dlpack: shape: the number of elements overflows"),
], ids=["f64", "lanes", "complex", "opencl", "v2", "ndim9", "negative", "huge", "huge strided"])
def test_hand_made_rejections_leave_the_capsule_alone(kwargs, exc, pattern):
    arr = np.arange(4, dtype=np.int32)
    h = HandMade(arr, **{"shape": (4,), **kwargs})
    name = capsule_name(h.capsule)
    with pytest.raises(exc, match=pattern):
        pyxtts.from_dlpack(h.capsule)
    assert capsule_name(h.capsule) == name and h.calls == 0  # not consumed, still the caller's


def test_empty_strided_source_with_huge_sizes_after_its_zero():
    # the sizes after a 0 are not bounded (nothing is held): the C-order strides of such
    # a shape pass 64 bits, which no stride can equal
    arr = np.zeros(1, np.float32)
    h = HandMade(arr, shape=(0, 2**62, 2**62), strides=(1, 1, 1))
    t = pyxtts.from_dlpack(h.capsule)
    assert t.shape == (0, 2**62, 2**62) and t.numel() == 0 and t.nbytes == 0
    assert h.calls == 1  # not C-contiguous: gathered (nothing), the producer's memory given back


def test_deleter_runs_cleanly_when_import_fails_after_consuming():
    # a non-contiguous import that cannot get memory: the capsule is consumed,
    # then released while OutOfMemoryError is pending; the deleter must not see it
    from pyxtts.testing import inject_oom

    arr = np.arange(8, dtype=np.int32)
    h = HandMade(arr, shape=(4,), strides=(2,))
    inject_oom(0, "cpu")
    try:
        with pytest.raises(pyxtts.OutOfMemoryError):
            pyxtts.from_dlpack(h.capsule)
    finally:
        inject_oom(None, "cpu")
    assert h.calls == 1


# ---- GPU -------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA build of torch")
@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_torch_cuda_both_ways(name, rng, seed):
    x = random_array(rng, name, (5, 7))
    t = pyxtts.tensor(x, device="cuda:0")
    tt = torch.from_dlpack(t)
    assert tt.is_cuda and tt.data_ptr() == t.data_ptr()
    assert_bits_equal(_torch_to_numpy(tt.cpu()), x, f"seed={seed}")
    fresh = tt.clone()  # memory torch allocated, on torch's stream
    u = pyxtts.from_dlpack(fresh)
    assert u.device == "cuda:0" and u.data_ptr() == fresh.data_ptr()
    assert_bits_equal(u.numpy(), x, f"seed={seed}")
    with pytest.raises(ValueError, match="non-contiguous CUDA"):
        pyxtts.from_dlpack(tt.T)

"""PyTorch checkpoint files (the zip format of ``torch.save``) read and rewritten
without torch and without running anything they contain.

A ``.pth`` is a zip archive: ``<name>/data.pkl`` pickles the saved object, each tensor's
storage is the raw bytes of ``<name>/data/<key>``, and small records (``byteorder``,
``version``, ...) sit beside them. ``TorchFile`` unpickles ``data.pkl`` with a
restricted unpickler:

- a tensor becomes a ``TensorRef`` (storage key, dtype, offset, shape, stride) whose
  values ``TorchFile.array(ref)`` reads from the archive;
- plain containers (dict, OrderedDict, list, tuple, set) and scalars are themselves;
- every other class or function the pickle names becomes an inert ``PickledObject``
  subclass that records the module, the name, the arguments and the state it was
  given: nothing is imported, called or executed. A pickle whose ``__reduce__`` asks
  for ``os.system`` gets a record of that request, not a call.

``read_tensors(path)`` is the whole object at once with every tensor as a NumPy array,
for files that hold tensors and plain containers only (a state dict, a bare tensor):
anything else the pickle names is refused.

``rewrite_storages(src, dst, storages)`` writes a copy of an archive with some storages
replaced byte for byte: every other record, the pickle included, is copied unchanged,
so keys, dtypes, the other tensors and any pickled objects are exactly those of the
source. Records are aligned to 64 bytes as ``torch.save`` aligns them.

``resized_pickle(src, shapes)`` is the source's pickle with the first dimension of some
tensors changed (a vocabulary grown by rows): only the integers of their shape and of
their storage's element count are rewritten, each found where ``torch.save`` puts it and
checked against the value read, so the rest of the pickle stays byte for byte.
"""
from __future__ import annotations

import io
import os
import pickle
import pickletools
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import ml_dtypes
import numpy as np

__all__ = ["PickledObject", "StorageRef", "TensorRef", "TorchFile", "TorchFileError", "read_tensors",
           "resized_pickle", "rewrite_storages"]

ALIGNMENT = 64  # torch.save aligns every record's data to 64 bytes

# torch's legacy typed storage classes (what torch.save names) -> NumPy dtypes
STORAGE_DTYPES = {
    "FloatStorage": np.dtype(np.float32), "DoubleStorage": np.dtype(np.float64),
    "HalfStorage": np.dtype(np.float16), "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
    "LongStorage": np.dtype(np.int64), "IntStorage": np.dtype(np.int32),
    "ShortStorage": np.dtype(np.int16), "CharStorage": np.dtype(np.int8),
    "ByteStorage": np.dtype(np.uint8), "BoolStorage": np.dtype(np.bool_),
}


class TorchFileError(ValueError):
    """A file that is not a readable PyTorch zip checkpoint, or a tensor inside it that
    does not fit its storage."""


class PickledObject:
    """An object of a class the restricted unpickler does not build: ``module`` and
    ``name`` of the class (or function) the pickle named, ``args`` it was called with,
    ``state`` it was given (usually its ``__dict__``). Nothing of it ran."""

    module = ""
    name = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<pickled {self.module}.{self.name}>"


@dataclass(frozen=True)
class StorageRef:
    key: str  # the record data/<key>
    dtype: np.dtype
    numel: int


@dataclass(frozen=True)
class TensorRef:
    storage: StorageRef
    offset: int  # in elements
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return self.storage.dtype


def _record_class(module: str, name: str) -> type:
    return type(name, (PickledObject,), {"module": module, "name": name, "__module__": __name__})


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise TorchFileError(f"a tensor's storage is {type(storage).__name__}, not a storage record")
    try:
        shape = tuple(int(v) for v in size)
        strides = tuple(int(v) for v in stride)
        off = int(offset)
    except (TypeError, ValueError) as exc:
        raise TorchFileError(f"a tensor has a malformed shape or stride: {exc}") from exc
    if len(shape) != len(strides) or off < 0 or any(v < 0 for v in shape + strides):
        raise TorchFileError(f"a tensor has shape {shape}, stride {strides}, offset {off}")
    if all(shape):
        last = off + sum((n - 1) * s for n, s in zip(shape, strides))
        if last >= storage.numel:
            raise TorchFileError(f"a tensor of shape {shape} reaches element {last} of a storage of "
                                 f"{storage.numel}")
    return TensorRef(storage, off, shape, strides)


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    return data  # a Parameter is its tensor here


def _latin1_bytes(text: Any, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for bytes objects, and nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise TorchFileError(f"_codecs.encode({type(text).__name__}, {encoding!r}): only latin1 strings "
                             "are decoded")
    return text.encode("latin1")


# what the unpickler builds for real; everything else is a record
_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "bytearray"): bytearray,
    ("builtins", "complex"): complex,
    ("_codecs", "encode"): _latin1_bytes,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
}


_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}


class _StorageType:
    def __init__(self, name: str, dtype: np.dtype) -> None:
        self.name, self.dtype = name, dtype


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, sizes: Mapping[str, int]) -> None:
        super().__init__(io.BytesIO(data))
        self._sizes = sizes
        self._records: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str) -> Any:
        module = _PY2_MODULES.get(module, module)  # protocol 2 names builtins as Python 2 did
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name, STORAGE_DTYPES[name])
        key = (module, name)
        if key not in self._records:
            self._records[key] = _record_class(module, name)
        return self._records[key]

    def persistent_load(self, pid: Any) -> StorageRef:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise TorchFileError(f"unknown persistent id {pid!r:.100} (not a torch storage)")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType):
            raise TorchFileError(f"storage {key!r} has type {kind!r}, which this reader does not know")
        key = str(key)
        if key not in self._sizes:
            raise TorchFileError(f"storage {key!r} has no data record in the archive")
        size = self._sizes[key]
        if isinstance(numel, bool) or not isinstance(numel, int) or size != numel * kind.dtype.itemsize:
            raise TorchFileError(f"storage {key!r}: {numel!r} {kind.name} elements but {size} bytes")
        return StorageRef(key, kind.dtype, numel)


# what zipfile raises on a damaged archive or member (a CRC mismatch, bad deflate data,
# a cut, a compression method it lacks, an "encrypted" flag (RuntimeError), an offset
# before the file's start (OSError), a name that is not UTF-8 or an offset past C's (ValueError))
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, OSError, ValueError)


class TorchFile:
    """An open PyTorch zip checkpoint: ``obj`` is the unpickled object (tensors as
    ``TensorRef``), ``array(ref)`` reads a tensor. Use as a context manager or ``close()``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such file")
        try:
            is_zip = zipfile.is_zipfile(self.path)
        except ZIP_ERRORS as exc:  # an end record it cannot read (e.g. "spans multiple disks")
            raise TorchFileError(f"{self.path}: a damaged zip file: {type(exc).__name__}: {exc}") from exc
        if not is_zip:
            raise TorchFileError(f"{self.path}: not a PyTorch zip checkpoint (a file torch.save wrote with "
                                 "torch >= 1.6; an older or other format cannot be read without running it)")
        try:
            self._zip = zipfile.ZipFile(self.path)
        except ZIP_ERRORS as exc:
            raise TorchFileError(f"{self.path}: a damaged zip file: {type(exc).__name__}: {exc}") from exc
        try:
            names = self._zip.namelist()
            pkl = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pkl) != 1:
                raise TorchFileError(f"{self.path}: a zip file but not a PyTorch checkpoint (no single "
                                     f"<name>/data.pkl; found {names[:5]})")
            self.prefix = pkl[0][: -len("data.pkl")]
            order = self._read_optional("byteorder")
            if order not in (None, b"little"):
                raise TorchFileError(f"{self.path}: byte order {order!r}; only little-endian files are read")
            data_dir = self.prefix + "data/"
            self._sizes = {i.filename[len(data_dir):]: i.file_size for i in self._zip.infolist()
                           if i.filename.startswith(data_dir) and "/" not in i.filename[len(data_dir):]}
            try:
                self.obj = _Unpickler(self._read(pkl[0]), self._sizes).load()
            except TorchFileError as exc:
                raise TorchFileError(f"{self.path}: {exc}") from exc
            except Exception as exc:  # a malformed pickle: any of pickle's own errors
                raise TorchFileError(f"{self.path}: its data.pkl does not unpickle: "
                                     f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            self._zip.close()
            raise

    def _read(self, name: str) -> bytes:
        """A member's bytes; a damaged member (bad CRC, bad deflate data, cut short, an
        unknown compression) is a TorchFileError, not zipfile's or zlib's own error."""
        try:
            return self._zip.read(name)
        except ZIP_ERRORS as exc:
            raise TorchFileError(f"{self.path}: member {name!r} is damaged: {type(exc).__name__}: {exc}") from exc

    def _read_optional(self, name: str) -> bytes | None:
        try:
            return self._read(self.prefix + name).strip()
        except KeyError:
            return None

    def storage_bytes(self, storage: StorageRef) -> bytes:
        return self._read(f"{self.prefix}data/{storage.key}")

    def array(self, ref: TensorRef) -> np.ndarray:
        """A fresh contiguous NumPy copy of the tensor (bfloat16 as ml_dtypes.bfloat16)."""
        flat = np.frombuffer(self.storage_bytes(ref.storage), dtype=ref.dtype)
        return _view(flat, ref).copy()

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> "TorchFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_tensors(path: str | os.PathLike) -> Any:
    """The object a ``torch.save`` file of plain tensors holds (a state dict, a bare tensor,
    containers of them), every tensor a fresh NumPy array. Raises ``TorchFileError`` when
    the file names any other class or function (a model object, a config, code): such a
    file is not plain tensors, and nothing of it is run."""
    with TorchFile(path) as f:
        storages: dict[str, np.ndarray] = {}

        def arrays(obj: Any) -> Any:
            if isinstance(obj, TensorRef):
                key = obj.storage.key
                if key not in storages:  # views of one storage read it once
                    storages[key] = np.frombuffer(f.storage_bytes(obj.storage), dtype=obj.dtype)
                return _view(storages[key], obj).copy()
            if isinstance(obj, PickledObject):
                raise TorchFileError(f"{f.path}: holds a pickled {obj.module}.{obj.name}, not only tensors; "
                                     "it is not loaded (nothing from the file is executed)")
            if isinstance(obj, Mapping):
                return type(obj)((k, arrays(v)) for k, v in obj.items())
            if isinstance(obj, (list, tuple)):
                return type(obj)(arrays(v) for v in obj)
            return obj

        return arrays(f.obj)


def _view(flat: np.ndarray, ref: TensorRef) -> np.ndarray:
    item = flat.dtype.itemsize
    return np.lib.stride_tricks.as_strided(flat[ref.offset:], shape=ref.shape,
                                           strides=tuple(s * item for s in ref.stride),
                                           writeable=flat.flags.writeable)


def storages_with(src: TorchFile, values: Mapping[TensorRef, np.ndarray]) -> dict[str, bytes]:
    """The bytes of each storage that ``values`` (tensor -> new values, already of the
    tensor's dtype and shape) touches, with those tensors written in. Two tensors that
    share elements must get equal values there."""
    out: dict[str, np.ndarray] = {}
    written: dict[str, np.ndarray] = {}
    for ref, value in values.items():
        key = ref.storage.key
        if key not in out:
            out[key] = np.frombuffer(src.storage_bytes(ref.storage), dtype=ref.dtype).copy()
            written[key] = np.zeros(ref.storage.numel, dtype=bool)
        if value.dtype != ref.dtype or value.shape != ref.shape:
            raise TorchFileError(f"storage {key!r}: new values {value.dtype} {value.shape} for a tensor "
                                 f"{ref.dtype} {ref.shape}")
        view = _view(out[key], ref)
        mask = _view(written[key], ref)
        clash = mask & (view.view(np.uint8 if ref.dtype.itemsize == 1 else f"u{ref.dtype.itemsize}")
                        != value.view(np.uint8 if ref.dtype.itemsize == 1 else f"u{ref.dtype.itemsize}"))
        if clash.any():
            raise TorchFileError(f"storage {key!r} is shared by tensors given different values")
        view[...] = value
        mask[...] = True
    return {k: v.tobytes() for k, v in out.items()}


_INT_OPS = frozenset({"BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG"})
_TUPLE_OPS = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


def _int_op(value: int) -> bytes:
    """The pickle opcode (protocol 2) of a non-negative int."""
    return pickle.dumps(value, protocol=2)[2:-1]


def resized_pickle(src: TorchFile, shapes: Mapping[TensorRef, tuple[int, ...]]) -> bytes:
    """``src``'s ``data.pkl`` with each tensor of ``shapes`` given its new shape (module
    docstring). A tensor must own its storage (offset 0, contiguous, every element) and
    only its first dimension may change; ``TorchFileError`` when one does not, or when the
    pickle is not laid out as ``torch.save`` lays it out."""
    data = src._read(src.prefix + "data.pkl")
    ops = list(pickletools.genops(data))
    by_key: dict[str, tuple[TensorRef, tuple[int, ...]]] = {}
    for ref, shape in shapes.items():
        contiguous = tuple(int(np.prod(ref.shape[i + 1:])) for i in range(len(ref.shape)))
        if ref.offset != 0 or ref.stride != contiguous or int(np.prod(ref.shape)) != ref.storage.numel:
            raise TorchFileError(f"storage {ref.storage.key!r}: a tensor that does not own its whole storage "
                                 "cannot be resized")
        if len(shape) != len(ref.shape) or tuple(shape[1:]) != ref.shape[1:] or shape[0] < 1:
            raise TorchFileError(f"storage {ref.storage.key!r}: shape {ref.shape} -> {tuple(shape)}: only the first "
                                 "dimension may change")
        by_key[ref.storage.key] = (ref, tuple(int(v) for v in shape))
    patches: dict[int, bytes] = {}  # op index -> its new bytes

    def expect_int(j: int, value: int, what: str, key: str) -> None:
        if ops[j][0].name not in _INT_OPS or ops[j][1] != value:
            raise TorchFileError(f"storage {key!r}: the pickle does not hold its {what} ({value}) where torch.save "
                                 f"puts it (found {ops[j][0].name} {ops[j][1]!r})")

    memo_ops = ("BINPUT", "LONG_BINPUT", "MEMOIZE")

    def after(k: int) -> int:
        """The index of the first op after ``k`` that is not a memo write."""
        k += 1
        while k < len(ops) and ops[k][0].name in memo_ops:
            k += 1
        if k >= len(ops):
            raise TorchFileError("the pickle ends inside a tensor")
        return k

    found: set[str] = set()
    for j, (op, arg, _) in enumerate(ops):
        # torch.save: the key string, the location, numel, TUPLE, BINPERSID, the offset, the
        # shape's ints, a TUPLEn (after a MARK for more than 3 dimensions); memo writes between
        if op.name not in ("BINUNICODE", "SHORT_BINUNICODE") or arg not in by_key or arg in found:
            continue
        prev = j - 1
        while prev > 0 and ops[prev][0].name in memo_ops:
            prev -= 1
        storage_type = ops[prev][0].name in ("BINGET", "LONG_BINGET") or (
            ops[prev][0].name == "GLOBAL" and str(ops[prev][1]).startswith("torch ")
            and str(ops[prev][1]).endswith("Storage"))
        if not storage_type:  # the same text elsewhere (a config value "0"): not a storage's key
            continue
        ref, shape = by_key[arg]
        numel = after(after(j))  # past the location string (or its BINGET)
        expect_int(numel, ref.storage.numel, "element count", arg)
        k = after(numel)
        if ops[k][0].name != "TUPLE" or ops[after(k)][0].name != "BINPERSID":
            raise TorchFileError(f"storage {arg!r}: its persistent id is not where torch.save puts it")
        k = after(k)
        k = after(k)
        expect_int(k, 0, "offset", arg)
        k = after(k)
        if len(ref.shape) > 3:
            k = after(k)  # past the MARK
        first = k
        for d in range(len(ref.shape)):
            expect_int(k, ref.shape[d], f"dimension {d}", arg)
            k = after(k)
        close = ops[k][0].name
        if _TUPLE_OPS.get(close, 0) != len(ref.shape) and not (close == "TUPLE" and len(ref.shape) > 3):
            raise TorchFileError(f"storage {arg!r}: its shape is not a tuple where torch.save puts it")
        patches[numel] = _int_op(int(np.prod(shape)))
        patches[first] = _int_op(shape[0])
        found.add(arg)
    if found != set(by_key):
        raise TorchFileError(f"storages {sorted(set(by_key) - found)} are not named in the pickle")
    out = bytearray()
    for j, (op, _, pos) in enumerate(ops):
        end = ops[j + 1][2] if j + 1 < len(ops) else len(data)
        out += patches.get(j, data[pos:end])
    return bytes(out)


def rewrite_storages(src: TorchFile, dst: str | os.PathLike, storages: Mapping[str, bytes],
                     pickle_data: bytes | None = None) -> None:
    """Writes ``dst``: the archive of ``src`` record by record, in its order, with the
    data of the storages named in ``storages`` replaced (same sizes, unless ``pickle_data``,
    a new ``data.pkl`` from ``resized_pickle``, gives them new ones). Not atomic: the caller
    writes to a temporary name and renames."""
    sizes = src._sizes
    for key, data in storages.items():
        if key not in sizes or (sizes[key] != len(data) and pickle_data is None):
            raise TorchFileError(f"storage {key!r}: {len(data)} new bytes for a record of {sizes.get(key)}")
    data_dir = src.prefix + "data/"
    with open(dst, "wb") as fh, zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED,
                                                allowZip64=True) as out:
        for info in src._zip.infolist():
            name = info.filename
            key = name[len(data_dir):] if name.startswith(data_dir) else None
            if pickle_data is not None and name == src.prefix + "data.pkl":
                data = pickle_data
            else:
                data = storages[key] if key in storages else src._zip.read(info)
            zi = zipfile.ZipInfo(name, date_time=info.date_time)
            zi.compress_type = zipfile.ZIP_STORED
            zi.external_attr = info.external_attr
            # local header: 30 bytes, the name, then an extra field padding the data to 64
            start = fh.tell() + 30 + len(name.encode("utf-8")) + 4
            pad = -start % ALIGNMENT
            zi.extra = b"FB" + pad.to_bytes(2, "little") + b"Z" * pad
            out.writestr(zi, data)

"""Reads PyTorch ``.pth`` files of plain tensors (a state dict, or one tensor) into NumPy,
without torch and without running any code from the file.

``torch.save`` writes a zip archive: ``<name>/data.pkl`` (a pickle whose tensors refer to
storages by key) and ``<name>/data/<key>`` (each storage's raw bytes). The pickle is read
by an unpickler that knows only the few callables a tensor file needs (tensor and
parameter rebuilding, ``OrderedDict``, the typed storages); any other global in the file
is refused, so a file made to run code when loaded raises instead.
"""
from __future__ import annotations

import os
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["PthError", "read_pth"]


class PthError(ValueError):
    """A ``.pth`` file that is not a zip-format file of plain tensors."""


_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
    "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
    "BFloat16Storage": ml_dtypes.bfloat16,
}


class _StorageType:
    """Stands for ``torch.<X>Storage`` in the pickle: only its element dtype matters."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = np.dtype(_STORAGE_DTYPES[name])


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple, stride: tuple, *_: Any) -> np.ndarray:
    if not size:
        return storage[offset:offset + 1].reshape(()).copy()
    item = storage.itemsize
    needed = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset
    if needed > storage.size:
        raise PthError(f"a tensor of shape {tuple(size)} reaches past its storage of {storage.size} elements")
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                           strides=tuple(s * item for s in stride), writeable=False)
    return np.ascontiguousarray(view)


def _rebuild_parameter(data: np.ndarray, *_: Any) -> np.ndarray:
    return data


class _Unpickler(pickle.Unpickler):
    def __init__(self, fh: Any, archive: zipfile.ZipFile, prefix: str, byteorder: str, where: str) -> None:
        super().__init__(fh)
        self.archive, self.prefix, self.byteorder, self.where = archive, prefix, byteorder, where
        self.storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise PthError(f"{self.where}: refers to {module}.{name}, which a file of plain tensors does not "
                       "need; it is not loaded (nothing from the file is executed)")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise PthError(f"{self.where}: unknown persistent reference {pid!r:.80}")
        _, kind, key, _location, numel = pid
        if key not in self.storages:
            try:
                raw = self.archive.read(f"{self.prefix}data/{key}")
            except KeyError:
                raise PthError(f"{self.where}: storage {key!r} is missing from the archive") from None
            dtype = kind.dtype.newbyteorder("<" if self.byteorder == "little" else ">")
            if len(raw) < int(numel) * dtype.itemsize:
                raise PthError(f"{self.where}: storage {key!r} holds {len(raw)} bytes, "
                               f"{int(numel) * dtype.itemsize} expected")
            self.storages[key] = np.frombuffer(raw, dtype=dtype, count=int(numel)).astype(kind.dtype)
        return self.storages[key]


def read_pth(path: str | os.PathLike) -> Any:
    """The object a ``torch.save`` file holds, with every tensor as a NumPy array (a dict
    of them for a state dict). Raises ``PthError`` for anything but plain tensors."""
    path = Path(path)
    where = str(path)
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise PthError(f"{where}: not a zip-format PyTorch file (torch.save's default since PyTorch 1.6); "
                       "re-save it with torch.save(torch.load(path), path)") from None
    with archive:
        names = archive.namelist()
        pkl = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pkl) != 1:
            raise PthError(f"{where}: no single <name>/data.pkl in the archive")
        prefix = pkl[0][: -len("data.pkl")]
        byteorder = "little"
        if f"{prefix}byteorder" in names:
            byteorder = archive.read(f"{prefix}byteorder").decode().strip()
            if byteorder not in ("little", "big"):
                raise PthError(f"{where}: unknown byte order {byteorder!r}")
        with archive.open(pkl[0]) as fh:
            try:
                return _Unpickler(fh, archive, prefix, byteorder, where).load()
            except PthError:
                raise
            except (pickle.UnpicklingError, EOFError, TypeError, ValueError, KeyError, AttributeError) as exc:
                raise PthError(f"{where}: cannot read its pickle: {exc}") from exc

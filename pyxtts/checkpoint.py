"""Crash-safe checkpoints in the safetensors format.

A checkpoint is one ``.safetensors`` file:

- tensors ``model.<name>`` (the parameters, names as in ``XTTSGPT.state_dict()``),
  ``optimizer.<key>`` (the arrays of ``optimizer.state_dict()``; nested keys joined by
  ``.``) and ``carried.<name>``: tensors of an imported XTTS GPT that the model does not
  have (yet), kept so that nothing of the source is lost; ``load_checkpoint`` loads one
  into a model that has a parameter of that name, and reports the others. bfloat16
  arrays are stored as their uint16 bit patterns and named in the metadata, so every
  bit round-trips;
- one string metadata entry ``"pyxtts"``: JSON with the format marker and version, the
  pyxtts version, the model config, precision, step, the model's ``dropout_seed`` and
  ``dropout_step`` (which key its dropout masks; absent in older files: 0), the
  optimizer's non-array state
  (learning rate, step count, loss scale, ...), the caller's ``extra`` (for example
  ``{"rng": rng.bit_generator.state}``) and ``checksums``: for every tensor the CRC-32 of
  its name, dtype, shape and bytes;
- one string metadata entry ``"pyxtts.crc32"``: the CRC-32 of the ``"pyxtts"`` entry's
  text. Loading verifies both and refuses a file whose metadata lacks a field (format
  version 2). Files of format version 1 (no checksums) load with a ``CheckpointWarning``.

Saving writes ``<path>.tmp-<pid>`` in the same directory, flushes and fsyncs it, renames
it over ``path`` and fsyncs the directory (``pyxtts._files.write_atomic``): a process
killed at any moment leaves either the previous checkpoint or the new one, never a mix,
and a save that fails (a full disk, a read-only folder) leaves the folder as it was and
raises an ``OSError`` naming ``path`` and the cause. Loading checks the whole file
against the model (and optimizer) before writing anything, and nothing is unpickled.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import warnings
import zlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from pyxtts._args import integer
from pyxtts._files import scratch_folder, write_atomic

__all__ = ["FORMAT", "FORMAT_VERSION", "CheckpointError", "CheckpointWarning", "load_checkpoint",
           "read_checkpoint", "save_checkpoint"]

FORMAT = "pyxtts.checkpoint"
FORMAT_VERSION = 2  # 2: checksums of every tensor and of the metadata
META_KEY = "pyxtts"
META_CRC_KEY = "pyxtts.crc32"
# the fields of the metadata, every one present in a file of format version 2
META_FIELDS = ("format", "format_version", "pyxtts_version", "config", "precision", "step",
               "optimizer", "dtypes", "extra", "checksums")
# written since the model has dropout; absent in earlier version-2 files (read as 0)
OPTIONAL_META_FIELDS = ("dropout_seed", "dropout_step")
MODEL_PREFIX = "model."
OPTIM_PREFIX = "optimizer."
CARRIED_PREFIX = "carried."
_BF16 = np.dtype(ml_dtypes.bfloat16)
_TMP_RE = re.compile(r"\.tmp-(\d+)$")
_SCALAR_TYPES = (bool, int, float, str, type(None))
# config fields that are no part of the architecture: a checkpoint loads whatever they are
_TRAINING_FIELDS = ("dropout", "max_cond_frames")


class CheckpointError(ValueError):
    """A file that is not a usable pyxtts checkpoint for this model/optimizer. Raised
    before anything is written: the model and optimizer are unchanged."""


class ArchitectureError(CheckpointError):
    """A checkpoint of another model than the one it is loaded into (sizes, vocabularies,
    the conditioning path): every checkpoint of the same run is, so an older one is no help."""


class CheckpointWarning(UserWarning):
    """A checkpoint that loads but cannot be fully verified (format version 1: written
    before checksums; save it again to add them)."""


def _crc_text(text: str) -> str:
    return f"{zlib.crc32(text.encode('utf-8')):08x}"


def tensor_checksum(key: str, a: np.ndarray) -> str:
    """CRC-32 of a stored tensor's name, dtype, shape and bytes (as safetensors holds it:
    bfloat16 as uint16), 8 hex digits."""
    head = f"{key}|{np.dtype(a.dtype).str}|{tuple(int(n) for n in a.shape)}".encode()
    return f"{zlib.crc32(memoryview(np.ascontiguousarray(a)).cast('B'), zlib.crc32(head)):08x}"


def write_file(path: Path, meta: dict, tensors: dict[str, np.ndarray]) -> None:
    """Writes tensors and metadata atomically, the checksums computed here (the one
    place that seals a checkpoint)."""
    meta = {**meta, "checksums": {k: tensor_checksum(k, a) for k, a in tensors.items()}}
    text = json.dumps(meta, allow_nan=True)
    _write_atomic(path, tensors, {META_KEY: text, META_CRC_KEY: _crc_text(text)})


# ---- helpers -----------------------------------------------------------------

def _version() -> str:
    from pyxtts import _C

    return str(_C.build_info()["version"])


def _tensor_of(key: str, value: Any) -> tuple[np.ndarray, str | None]:
    """A contiguous array safetensors can store, and the dtype note for bfloat16."""
    a = value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else np.asarray(value)
    if a.dtype == _BF16:
        return np.ascontiguousarray(a).view(np.uint16), "bfloat16"
    if a.dtype.kind not in "fiub":
        raise TypeError(f"{key}: cannot store an array of dtype {a.dtype}")
    return np.ascontiguousarray(a), None


def _flatten_optimizer(state: Mapping[str, Any]) -> tuple[Any, dict[str, np.ndarray], dict[str, str]]:
    """optimizer.state_dict() -> (JSON skeleton, tensors, bf16 notes). In the skeleton
    each array is replaced by {"__tensor__": key} (plus "scalar": true for a NumPy
    scalar), so nested dicts and lists round-trip exactly."""
    tensors: dict[str, np.ndarray] = {}
    notes: dict[str, str] = {}

    def walk(value: Any, path: list[str]) -> Any:
        where = "optimizer.state_dict()" + "".join(f"[{p!r}]" for p in path)
        if isinstance(value, Mapping):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise TypeError(f"{where}: keys must be strings, got {k!r}")
                out[k] = walk(v, path + [k])
            return out
        if isinstance(value, (list, tuple)):
            return [walk(v, path + [str(i)]) for i, v in enumerate(value)]
        if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "__dlpack__"):
            key = OPTIM_PREFIX + ".".join(path)
            if key in tensors:
                raise ValueError(f"{where}: two arrays map to the tensor name {key!r}")
            a, note = _tensor_of(key, value)
            tensors[key] = a.reshape(1) if a.ndim == 0 else a  # safetensors stores 0-d as (1,)
            if note:
                notes[key] = note
            if isinstance(value, np.generic):
                return {"__tensor__": key, "scalar": True}
            return {"__tensor__": key, "shape": []} if a.ndim == 0 else {"__tensor__": key}
        if isinstance(value, _SCALAR_TYPES):
            return value
        raise TypeError(f"{where}: cannot store a {type(value).__name__}")

    if not isinstance(state, Mapping):
        raise TypeError(f"optimizer.state_dict(): expected a dict, got {type(state).__name__}")
    return walk(state, []), tensors, notes


def _unflatten_optimizer(skeleton: Any, tensors: Mapping[str, np.ndarray]) -> Any:
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            key = skeleton["__tensor__"]
            if key not in tensors:
                raise CheckpointError(f"optimizer state names tensor {key!r}, which the file lacks")
            a = tensors[key]
            if skeleton.get("scalar") or skeleton.get("shape") == []:
                if a.size != 1:
                    raise CheckpointError(f"optimizer tensor {key!r}: expected one element, got shape {a.shape}")
                a = a.reshape(())
            return a[()] if skeleton.get("scalar") else a
        return {k: _unflatten_optimizer(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [_unflatten_optimizer(v, tensors) for v in skeleton]
    return skeleton


def _describe(value: Any) -> str:
    if isinstance(value, (np.ndarray, np.generic)):
        return f"array {np.dtype(value.dtype)} {tuple(np.shape(value))}"
    return type(value).__name__


def _check_like(got: Any, want: Any, where: str) -> None:
    """The loaded optimizer state has the structure of the live one: same keys, arrays of
    the same shapes and dtypes, scalars of compatible types."""
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping):
            raise CheckpointError(f"{where}: expected a dict, the checkpoint has {_describe(got)}")
        missing = [k for k in want if k not in got]
        unexpected = [k for k in got if k not in want]
        if missing or unexpected:
            raise CheckpointError(f"{where}: keys differ from this optimizer's (missing {missing[:5]}, "
                                  f"unexpected {unexpected[:5]})")
        for k in want:
            _check_like(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        if not isinstance(got, list) or len(got) != len(want):
            raise CheckpointError(f"{where}: expected a list of {len(want)}, the checkpoint has {_describe(got)}")
        for i, (g, w) in enumerate(zip(got, want)):
            _check_like(g, w, f"{where}[{i}]")
    elif isinstance(want, (np.ndarray, np.generic)) or hasattr(want, "__dlpack__"):
        w = want.numpy() if hasattr(want, "numpy") and not isinstance(want, (np.ndarray, np.generic)) else np.asarray(want)
        g = np.asarray(got) if isinstance(got, (np.ndarray, np.generic)) else None
        if g is None or g.shape != w.shape or g.dtype != w.dtype:
            raise CheckpointError(f"{where}: expected array {w.dtype} {w.shape}, the checkpoint has {_describe(got)}")
    elif isinstance(want, bool) or want is None or isinstance(want, str):
        if type(got) is not type(want) and not (want is None or got is None):
            raise CheckpointError(f"{where}: expected {type(want).__name__}, the checkpoint has {_describe(got)}")
    elif isinstance(want, (int, float)) and (isinstance(got, bool) or not isinstance(got, (int, float))):
        raise CheckpointError(f"{where}: expected a number, the checkpoint has {_describe(got)}")


def _write_atomic(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    from safetensors.numpy import save_file

    def write(tmp: Path) -> None:
        # safetensors writes a file of its own beside the name it is given, then renames
        # it: in a folder of this save's, which goes with it (and after a crash, with the
        # next save's cleanup), a process killed mid-write leaves no file of unknown owner
        scratch = scratch_folder(tmp)
        scratch.mkdir()
        try:
            save_file(tensors, str(scratch / path.name), metadata=metadata)
            os.replace(scratch / path.name, tmp)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    write_atomic(path, write)


# ---- save --------------------------------------------------------------------

def save_checkpoint(path: str | os.PathLike, model: Any, optimizer: Any = None, step: int = 0,
                    extra: Any = None, carried: Mapping[str, Any] | None = None) -> None:
    """Writes model (and optimizer) state to ``path`` atomically (see the module doc).

    ``extra`` is any JSON-serialisable value (dicts, lists, str, int, float, bool, None),
    e.g. ``{"epoch": 3, "rng": rng.bit_generator.state}``; it comes back from
    ``load_checkpoint`` (tuples as lists). ``carried``: name -> array of tensors the model
    does not have, stored as ``carried.<name>`` (names the model has are refused)."""
    step = integer("step", step)
    try:
        json.dumps(extra, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"extra: must be JSON-serialisable (dicts with str keys, lists, str, numbers, "
                        f"bool, None): {exc}") from exc
    if not hasattr(model, "state_dict") or not hasattr(model, "config"):
        raise TypeError(f"model: expected an XTTSGPT, got {type(model).__name__}")
    path = Path(path)
    tensors: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for name, value in model.state_dict().items():
        key = MODEL_PREFIX + name
        if not np.isfinite(np.asarray(value, dtype=np.float32)).all():  # load_checkpoint would refuse it
            raise ValueError(f"model: {name} contains NaN or infinity; not saved, so that the last "
                             "checkpoint stays the last good one")
        tensors[key], note = _tensor_of(key, value)
        if note:
            dtypes[key] = note
    opt_meta = None
    if optimizer is not None:
        if not hasattr(optimizer, "state_dict"):
            raise TypeError(f"optimizer: expected an optimizer with state_dict(), got {type(optimizer).__name__}")
        skeleton, opt_tensors, notes = _flatten_optimizer(optimizer.state_dict())
        tensors.update(opt_tensors)
        dtypes.update(notes)
        opt_meta = {"type": type(optimizer).__name__, "state": skeleton}
    if carried is not None:
        if not isinstance(carried, Mapping):
            raise TypeError(f"carried: expected a mapping of name -> array, got {type(carried).__name__}")
        own = set(model.parameters())
        for name, value in carried.items():
            if not isinstance(name, str) or name in own:
                raise ValueError(f"carried: {name!r} " + ("is a parameter of the model; save it as one" if
                                                         name in own else "is not a str"))
            key = CARRIED_PREFIX + name
            tensors[key], note = _tensor_of(key, value)
            if note:
                dtypes[key] = note
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "pyxtts_version": _version(),
        "config": asdict(model.config),
        "precision": getattr(model, "precision", None),
        "step": step,
        "dropout_seed": int(getattr(model, "dropout_seed", 0)),
        "dropout_step": int(getattr(model, "dropout_step", 0)),
        "optimizer": opt_meta,
        "dtypes": dtypes,
        "extra": extra,
    }
    write_file(path, meta, tensors)


# ---- read and load -----------------------------------------------------------

def torch_file_hint(path: Path) -> str:
    """What to do with a PyTorch file (a zip ``torch.save`` writes, or an older bare pickle)
    given where a pyxtts checkpoint belongs, to end a refusal's message; "" for any other file."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return ""
    if head != b"PK\x03\x04" and head[:1] != b"\x80":
        return ""
    return ("; it is a PyTorch file, as Coqui's model.pth and its trainer's checkpoint_<N>.pth and best_model.pth "
            "are: pyxtts starts a run from those with `pyxtts train --init PATH` (pyxtts.import_xtts_checkpoint), "
            "and loads, resumes and exports only its own .safetensors checkpoints")


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, tensors) of a pyxtts checkpoint, bfloat16 restored; checks the
    container and the format marker and version only. Raises CheckpointError."""
    from safetensors import safe_open

    path = Path(path)
    if _TMP_RE.search(path.name):
        raise CheckpointError(f"{path}: is the temporary file of an unfinished save (name ends with "
                              "'.tmp-<pid>'), not a checkpoint")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    try:
        with safe_open(str(path), framework="numpy") as f:
            raw_meta = f.metadata() or {}
            if META_KEY not in raw_meta:
                raise CheckpointError(f"{path}: a safetensors file but not a pyxtts checkpoint "
                                      f"(no {META_KEY!r} metadata; found {sorted(raw_meta)[:5]})")
            meta = _parse_meta(path, raw_meta[META_KEY], raw_meta.get(META_CRC_KEY))
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is not iterable
    except CheckpointError:
        raise
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated, corrupt, or another "
                              f"format such as a pickled .pth; nothing is unpickled): "
                              f"{type(exc).__name__}: {exc}{torch_file_hint(path)}") from exc
    _verify_checksums(path, meta, tensors)
    dtypes = meta.get("dtypes") or {}
    if not isinstance(dtypes, dict):
        raise CheckpointError(f"{path}: metadata 'dtypes' must be a dict")
    for key, note in dtypes.items():
        if note != "bfloat16" or key not in tensors or tensors[key].dtype != np.uint16:
            raise CheckpointError(f"{path}: bad dtype note {key!r}: {note!r}")
        tensors[key] = tensors[key].view(_BF16)
    return meta, tensors


def _parse_meta(path: Path, text: str, crc: str | None) -> dict:
    if crc is not None and crc != _crc_text(text):  # checked before the JSON is trusted at all
        raise CheckpointError(f"{path}: the metadata's checksum does not match ({META_CRC_KEY} "
                              f"{crc!r}, computed {_crc_text(text)!r}): the file is corrupt")
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"{path}: pyxtts metadata is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a pyxtts checkpoint (format marker "
                              f"{meta.get('format') if isinstance(meta, dict) else meta!r}, expected {FORMAT!r})")
    version = meta.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise CheckpointError(f"{path}: unknown checkpoint format version {version!r} (this pyxtts "
                              f"{_version()} reads versions 1 to {FORMAT_VERSION}); upgrade pyxtts")
    if version >= 2:
        if crc is None:
            raise CheckpointError(f"{path}: the metadata entry {META_CRC_KEY!r} (its checksum) is missing")
        missing = [k for k in META_FIELDS if k not in meta]
        if missing:
            raise CheckpointError(f"{path}: metadata fields missing: {', '.join(missing)}")
        unknown = sorted(set(meta) - set(META_FIELDS) - set(OPTIONAL_META_FIELDS))
        if unknown:
            raise CheckpointError(f"{path}: unknown metadata fields: {', '.join(unknown[:5])}")
    else:
        warnings.warn(f"{path}: a checkpoint of format version 1, written before checksums: its "
                      "bytes cannot be verified; save it again to add them", CheckpointWarning,
                      stacklevel=4)
    for key, kind in (("config", dict), ("step", int)):
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise CheckpointError(f"{path}: metadata {key!r} missing or not a {kind.__name__}")
    if meta["step"] < 0:
        raise CheckpointError(f"{path}: metadata 'step' must be >= 0, got {meta['step']}")
    for key in ("dropout_seed", "dropout_step"):  # absent in checkpoints older than dropout
        v = meta.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
            raise CheckpointError(f"{path}: metadata {key!r} must be an int in [0, 2**64), got {v!r}")
    return meta


def _verify_checksums(path: Path, meta: dict, tensors: Mapping[str, np.ndarray]) -> None:
    """Every tensor has its checksum in the metadata and matches it (format version 2)."""
    if meta["format_version"] < 2:
        return
    sums = meta["checksums"]
    if not isinstance(sums, dict):
        raise CheckpointError(f"{path}: metadata 'checksums' must be a dict")
    missing = sorted(set(tensors) - set(sums))
    absent = sorted(set(sums) - set(tensors))
    if missing or absent:
        raise CheckpointError(f"{path}: tensors and checksums differ (tensors without a checksum: "
                              f"{missing[:3]}, checksums without a tensor: {absent[:3]})")
    for key, a in tensors.items():
        if tensor_checksum(key, a) != sums[key]:
            raise CheckpointError(f"{path}: tensor {key!r} does not match its checksum: the file is "
                                  "corrupt")


def architecture_diffs(saved: Mapping[str, Any], config: Any, absent: Mapping[str, Any] | None = None) -> list[str]:
    """The fields (training-only ones aside) in which a checkpoint's model config
    ``saved`` differs from ``config`` (a ModelConfig), as "name: checkpoint X, model Y";
    a field the file predates counts as ``absent``'s value for it, else its default."""
    absent = absent or {}
    got = {**{f.name: absent.get(f.name, f.default) for f in fields(config) if f.name not in saved}, **saved}
    got = {k: v for k, v in got.items() if k not in _TRAINING_FIELDS}
    want = {k: v for k, v in asdict(config).items() if k not in _TRAINING_FIELDS}
    return [f"{k}: checkpoint {got.get(k, '<absent>')!r}, model {want.get(k, '<absent>')!r}"
            for k in list(want) + [k for k in got if k not in want] if got.get(k, "<absent>") != want.get(k, "<absent>")]


def _validate_model(path: Path, meta: dict, tensors: Mapping[str, np.ndarray], model: Any,
                    has_optimizer: bool) -> tuple[dict[str, np.ndarray], list[str]]:
    """(the model's tensors, the carried names it does not take)."""
    names = {k.split(".", 1)[1] for k in tensors if k.startswith((MODEL_PREFIX, CARRIED_PREFIX))}
    # fields added after a file was written: what their absence meant, else their defaults
    absent = {"conditioning": "conditioning_perceiver.latents" in names}
    diffs = architecture_diffs(meta["config"], model.config, absent)
    if diffs:
        raise ArchitectureError(f"{path}: another architecture; the config differs in "
                                f"{len(diffs)} field(s): " + "; ".join(diffs))
    if has_optimizer and meta.get("precision") != getattr(model, "precision", None):
        raise CheckpointError(f"{path}: precision differs (checkpoint {meta.get('precision')!r}, model "
                              f"{getattr(model, 'precision', None)!r}); the optimizer state would not fit")
    params = model.parameters()
    state = {k[len(MODEL_PREFIX):]: v for k, v in tensors.items() if k.startswith(MODEL_PREFIX)}
    carried = {k[len(CARRIED_PREFIX):]: v for k, v in tensors.items() if k.startswith(CARRIED_PREFIX)}
    for name in [n for n in carried if n in params and n not in state]:  # a tensor the model gained
        state[name] = carried.pop(name)
    missing = [n for n in params if n not in state]
    unexpected = [n for n in state if n not in params]
    if missing or unexpected:
        raise CheckpointError(f"{path}: parameter names differ (missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, a in state.items():
        if tuple(a.shape) != tuple(params[name].shape):
            raise CheckpointError(f"{path}: model.{name} has shape {tuple(a.shape)}, the model expects "
                                  f"{tuple(params[name].shape)}")
        if a.dtype.kind != "f" and a.dtype != _BF16:
            raise CheckpointError(f"{path}: model.{name} has dtype {a.dtype}, expected floating point")
        if not np.isfinite(a.astype(np.float32)).all():
            raise CheckpointError(f"{path}: model.{name} contains NaN or infinity")
    return state, sorted(carried)


def load_checkpoint(path: str | os.PathLike, model: Any, optimizer: Any = None) -> dict:
    """Loads a checkpoint written by ``save_checkpoint`` into ``model`` (and ``optimizer``)
    and returns its metadata (``step``, ``extra``, ``config``, ``precision``,
    ``pyxtts_version``, ``optimizer`` (its non-array state), ``carried``: the names of
    the file's carried tensors the model has no parameter for, ...). A carried tensor
    the model has a parameter for is loaded into it.

    Everything is validated first (container, marker, format version, config, names,
    shapes, dtypes, finiteness, optimizer state structure); a refusal is a
    ``CheckpointError`` naming the problem, with model and optimizer unchanged."""
    return load_checkpoint_checked(path, model, optimizer, None)


def load_checkpoint_checked(path: str | os.PathLike, model: Any, optimizer: Any,
                            check: Callable[[dict], None] | None) -> dict:
    """load_checkpoint, with ``check(meta)`` called once everything else is validated and
    before anything is written (it raises CheckpointError to refuse the file)."""
    path = Path(path)
    meta, tensors = read_checkpoint(path)
    known = {k for k in tensors if k.startswith((MODEL_PREFIX, OPTIM_PREFIX, CARRIED_PREFIX))}
    if len(known) != len(tensors):
        strange = sorted(set(tensors) - known)[:3]
        raise CheckpointError(f"{path}: unexpected tensors {strange} (neither 'model.', 'optimizer.' "
                              "nor 'carried.')")
    state, carried = _validate_model(path, meta, tensors, model, optimizer is not None)
    opt_state = None
    if optimizer is not None:
        opt_meta = meta.get("optimizer")
        if not isinstance(opt_meta, dict) or "state" not in opt_meta:
            raise CheckpointError(f"{path}: holds no optimizer state (saved without an optimizer); "
                                  "load with optimizer=None for the model only")
        if opt_meta.get("type") != type(optimizer).__name__:
            raise CheckpointError(f"{path}: optimizer state of a {opt_meta.get('type')!r}, not of a "
                                  f"{type(optimizer).__name__!r}")
        opt_tensors = {k: v for k, v in tensors.items() if k.startswith(OPTIM_PREFIX)}
        opt_state = _unflatten_optimizer(opt_meta["state"], opt_tensors)
        _check_like(opt_state, optimizer.state_dict(), "optimizer state")
    if opt_state is not None:
        _check_master(path, model, optimizer, state, opt_state)
    if check is not None:
        check(meta)
    # everything checked: write the model, then the optimizer; should the optimizer
    # still refuse, the model is put back as it was
    backup = model.state_dict() if opt_state is not None else None
    model.load_state_dict(state, strict=True)
    if opt_state is not None:
        try:
            optimizer.load_state_dict(opt_state)
        except Exception as exc:
            model.load_state_dict(backup, strict=True)
            if isinstance(exc, (ValueError, TypeError, KeyError)):
                raise CheckpointError(f"{path}: the optimizer refused its state: {exc}") from exc
            raise
    if hasattr(model, "dropout_step"):  # the masks go on where the saved run stood
        if "dropout_seed" in meta:
            model.dropout_seed = meta["dropout_seed"]
        model.dropout_step = meta.get("dropout_step", 0)
    out = dict(meta)
    out.pop("dtypes", None)
    out.pop("checksums", None)
    out["carried"] = carried
    if isinstance(out.get("optimizer"), dict):  # the non-array optimizer state, for reading
        out["optimizer"] = {"type": out["optimizer"].get("type"),
                            "state": _strip_tensors(out["optimizer"].get("state"))}
    return out


def _check_master(path: Path, model: Any, optimizer: Any, state: Mapping[str, np.ndarray],
                  opt_state: Any) -> None:
    """pyxtts.AdamW's fp32 master copy and the model's tensors are one state: the
    parameters are the master rounded to the model's dtype (for fp32, the master itself).
    A file where they disagree would load one over the other silently."""
    from pyxtts import _C

    if not isinstance(optimizer, _C.AdamW) or not isinstance(opt_state, dict):
        return
    master = opt_state.get("master")
    views = model.parameters()
    if not isinstance(master, np.ndarray) or master.dtype != np.float32 or master.ndim != 1:
        return  # AdamW.load_state_dict refuses it, naming the problem
    dt = model.dtype.numpy
    for name, lo in flat_offsets(views).items():
        v = views[name]
        part = master[lo:lo + v.numel()]
        if part.size != v.numel():
            return
        rounded = part.astype(dt).reshape(v.shape)
        saved = np.asarray(state[name])
        if saved.dtype != dt or not np.array_equal(rounded.view(np.uint8), np.ascontiguousarray(saved).view(np.uint8)):
            raise CheckpointError(f"{path}: model.{name} and the optimizer's master copy disagree (the "
                                  "parameters must be the master rounded to the model's dtype): the file "
                                  "is inconsistent")


def flat_offsets(views: Mapping[str, Any]) -> dict[str, int]:
    """Where each parameter (``model.parameters()``: views of one flat buffer) starts in
    that buffer, in elements: its place in the optimizer's flat ``m``, ``v`` and master."""
    base = min(v.data_ptr() for v in views.values())
    return {name: (v.data_ptr() - base) // v.itemsize for name, v in views.items()}


def _strip_tensors(skeleton: Any) -> Any:
    if isinstance(skeleton, dict):
        return {k: _strip_tensors(v) for k, v in skeleton.items()
                if not (isinstance(v, dict) and "__tensor__" in v)}
    if isinstance(skeleton, list):
        return [v for v in (_strip_tensors(x) for x in skeleton)]
    return skeleton

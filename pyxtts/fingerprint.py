"""What fixes the sequence of batches a run trains on: its data fingerprint, saved with
every checkpoint, and the check a resume makes against it (a checkpoint's position in
the data means nothing on other data or batch settings)."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyxtts.checkpoint import CheckpointError, torch_file_hint
from pyxtts.config import XTTSConfig
from pyxtts.data import Sample

__all__ = ["check_fingerprint", "data_fingerprint", "saved_extra"]


def _digest(arrays: Any) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(np.array(a.shape, np.int64).tobytes())
        h.update(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    return h.hexdigest()


def data_fingerprint(samples: Sequence[Sample], config: XTTSConfig) -> dict:
    """What fixes a run's sequence of batches: the samples (a digest of every id and
    latent) and the batch settings; for samples with reference recordings also a digest
    of those (and whether each is the sample's own clip) and ``data.mask_reference_targets``,
    which decide the conditioning slices and the targets. Saved with each checkpoint;
    resuming needs the same."""
    d = config.data
    out = {"samples": len(samples),
           "digest": _digest(a for s in samples for a in (s.text, s.audio) + ((s.cond,) if s.cond is not None else ())),
           "effective_batch": config.effective_batch_size, "shuffle": d.shuffle, "shuffle_seed": d.shuffle_seed,
           "bucket_factor": d.bucket_size_multiplier if d.bucketing else 1}
    if any(s.ref_audio is not None for s in samples):  # (absent otherwise: such checkpoints stay as they were)
        out["references"] = _digest(a for s in samples for a in (
            (np.zeros(0, np.float32) if s.ref_audio is None else s.ref_audio), np.array([s.ref_is_clip], np.int8)))
        out["mask_reference_targets"] = d.mask_reference_targets
    return out


def saved_meta(path: Path) -> dict:
    """The metadata of a checkpoint (config, step, extra), read without its tensors."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = json.loads((f.metadata() or {})["pyxtts"])
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable pyxtts checkpoint: {type(exc).__name__}: {exc}"
                              f"{torch_file_hint(Path(path))}") from exc
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: not a readable pyxtts checkpoint: its metadata is not an object")
    return meta


def saved_extra(path: Path) -> dict:
    """The ``extra`` metadata of a checkpoint, read without its tensors."""
    extra = saved_meta(path).get("extra")
    return extra if isinstance(extra, dict) else {}


_FINGERPRINT_NAMES = {"samples": "number of training samples", "digest": "training samples' contents",
                      "effective_batch": "effective batch (data.batch_size x gradient_accumulation_steps)",
                      "shuffle": "data.shuffle", "shuffle_seed": "data.shuffle_seed",
                      "bucket_factor": "bucketing (data.bucketing, data.bucket_size_multiplier)",
                      "references": "the samples' reference recordings (ref_audio)",
                      "mask_reference_targets": "data.mask_reference_targets"}
# fields a checkpoint of an older pyxtts lacks: not checked when absent from it
_NEWER_FIELDS = ("references", "mask_reference_targets")


def check_fingerprint(path: Path, saved: Any, now: dict) -> None:
    """ValueError naming what changed since ``path`` was saved (a checkpoint of an older
    pyxtts, without a fingerprint or without its newer fields, is checked for what it has)."""
    if not isinstance(saved, dict):
        return
    keys = [k for k in _FINGERPRINT_NAMES if k != "digest" and (k in saved or k not in _NEWER_FIELDS)]
    # "references" is a digest: said in words, like the samples' own
    changed = [f"{_FINGERPRINT_NAMES[k]}: {saved.get(k)!r} then, {now.get(k)!r} now" for k in keys
               if k != "references" and saved.get(k) != now.get(k)]
    if saved.get("digest") != now["digest"] and saved.get("samples") == now["samples"]:
        changed.append("the training samples' contents differ (same number of samples)")
    if "references" in saved and saved["references"] != now.get("references"):
        changed.append("the samples' reference recordings (ref_audio) differ" if "references" in now else
                       "the samples carried reference recordings (ref_audio) then, none now")
    if changed:
        raise ValueError(
            f"resume: {path} was saved by a run on other data or batch settings, so its position in the data "
            f"means nothing here; changed: {'; '.join(changed)}. Resume with the same data and settings, or "
            f"start a new run from its weights (training.init_checkpoint: {path}, in another checkpoint_dir "
            "or overwriting this one)")

"""Data: pre-tokenised samples from `.npz` shards or a JSON-lines manifest, validation
against a ModelConfig, length-bucketed padded batches, and a learnable synthetic set.

Shard format: a folder of ``*.npz`` files read in sorted name order; a shard holding n
samples has, for i in 0..n-1, the integer arrays ``text_<i>`` (Lt,) and ``audio_<i>``
(La,) and optionally the float array ``cond_<i>`` (Nc, d_model) and the conditioning audio
``pyxtts prepare`` stores: ``ref_audio_<i>`` (N,) float32 at 22,050 Hz, the recording the
trainer draws each step's reference slice from, and ``ref_is_clip_<i>`` () bool, true when
that recording is the sample's own clip (so its slice's codes can be masked as targets).
``write_shards`` writes ``shard-00000.npz``, ``shard-00001.npz``, ... Beside the shards,
``pyxtts prepare`` writes ``mel_stats.npy`` (80,): the mel normalisation of the XTTS
checkpoint the data was prepared for, with which the trainer computes the reference
slices' mels (``TTSDataset.mel_stats``; ``pyxtts.references``).

Manifest format: a text file, one JSON object per line, ``{"text": ..., "audio": ...,
"cond": ...}`` (``cond`` optional); each value is either a list (of ids, or of rows for
``cond``) or the path of a ``.npy`` file, relative to the manifest's folder.

Framing. With a model config that sets the start/stop token ids (an XTTS config:
``ModelConfig.from_xtts_config`` or a shipped XTTS v2 config), the samples hold the
tokenizer's text ids and the DVAE's codes without start/stop tokens and ``collate``
frames them as Coqui does (``pyxtts.framing``): text ``[START, ids]`` with targets
``[ids, STOP]``, audio ``[START, codes, STOP x3]`` with targets ``[codes, STOP x4]``.

Without one, targets are the next-token shift: for ids ``x[0..n-1]`` the inputs are
``x`` and ``targets[t] = x[t+1]`` for ``t < n-1``; ``targets[n-1]`` is the stop token
when one is given (``text_stop_token`` / ``audio_stop_token``), else -1 (ignored); start
tokens are the ids' own business. Either way padding past a sample's length has input
id 0 and target -1.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from pyxtts._args import integer
from pyxtts._files import write_atomic
from pyxtts.framing import AUDIO_OVERHEAD, TEXT_OVERHEAD, frame_batch

__all__ = ["DataError", "Sample", "TTSDataset", "SyntheticDataset", "shard_arrays", "write_shards", "collate",
           "collate_references", "batch_groups", "bucketed_batches", "prepared_splits", "prepared_vocab"]


class DataError(ValueError):
    """A sample that does not fit the format or the model: names file, sample and position."""


@dataclass
class Sample:
    text: np.ndarray  # (Lt,) int64
    audio: np.ndarray  # (La,) int64
    cond: np.ndarray | None = None  # (Nc, d_model) float32
    source: str = ""  # file (and line) it came from, for error messages
    ref_audio: np.ndarray | None = None  # (N,) float32 at 22,050 Hz: reference slices are drawn from it
    ref_is_clip: bool = False  # ref_audio is the sample's own clip


def _ids(value: Any, where: str, what: str) -> np.ndarray:
    a = np.asarray(value)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise DataError(f"{where}: {what} must be a 1-d integer array, got dtype {a.dtype} shape {a.shape}")
    if a.size == 0:
        raise DataError(f"{where}: {what} is empty")
    return a.astype(np.int64, copy=False)


def _cond(value: Any, where: str) -> np.ndarray:
    a = np.asarray(value)
    if a.ndim != 2 or a.dtype.kind != "f":
        raise DataError(f"{where}: cond must be a 2-d float array (n_cond, d_model), got dtype "
                        f"{a.dtype} shape {a.shape}")
    return a.astype(np.float32, copy=False)


def _ref_audio(value: Any, where: str) -> np.ndarray:
    a = np.asarray(value)
    if a.ndim != 1 or a.dtype.kind != "f" or a.size == 0:
        raise DataError(f"{where}: ref_audio must be a non-empty 1-d float array (samples at 22,050 Hz), got "
                        f"dtype {a.dtype} shape {a.shape}")
    return a.astype(np.float32)


def shard_arrays(samples: Iterable, where: str = "sample", first: int = 0) -> dict[str, np.ndarray]:
    """The arrays of one shard holding ``samples`` (``Sample`` or (text, audio[, cond]) tuples
    or dicts with the keys ``text``, ``audio`` and optional ``cond``, ``ref_audio``,
    ``ref_is_clip``), named as the module docstring says. A bad sample is a DataError that
    calls it ``f"{where} {first + i}"``."""
    arrays: dict[str, np.ndarray] = {}
    for i, s in enumerate(samples):
        ref, ref_is_clip = None, False
        if isinstance(s, Sample):
            text, audio, cond, ref, ref_is_clip = s.text, s.audio, s.cond, s.ref_audio, s.ref_is_clip
        elif isinstance(s, dict):
            text, audio, cond = s["text"], s["audio"], s.get("cond")
            ref, ref_is_clip = s.get("ref_audio"), bool(s.get("ref_is_clip", False))
        else:
            text, audio, *rest = s
            cond = rest[0] if rest else None
        name = f"{where} {first + i}"
        arrays[f"text_{i}"] = _ids(text, name, "text")
        arrays[f"audio_{i}"] = _ids(audio, name, "audio")
        if cond is not None:
            arrays[f"cond_{i}"] = _cond(cond, name)
        if ref is not None:
            arrays[f"ref_audio_{i}"] = _ref_audio(ref, name)
            arrays[f"ref_is_clip_{i}"] = np.array(bool(ref_is_clip))
    return arrays


def write_shards(samples: Iterable, folder: str | os.PathLike, samples_per_shard: int = 1000) -> list[Path]:
    """Writes samples (``Sample`` or (text, audio[, cond]) tuples or dicts with those keys,
    as ``shard_arrays`` takes them) as ``shard-NNNNN.npz`` files into ``folder`` (created),
    each written atomically (``pyxtts._files.write_atomic``); returns the paths."""
    samples_per_shard = integer("samples_per_shard", samples_per_shard, minimum=1)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    pending: list = []

    def flush() -> None:
        path = folder / f"shard-{len(paths):05d}.npz"
        arrays = shard_arrays(pending, "write_shards: sample", len(paths) * samples_per_shard)

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez adds ".npz" to a name without it
                np.savez(f, **arrays)

        write_atomic(path, write)  # a shard is whole or absent; a failure names it
        paths.append(path)
        pending.clear()

    for s in samples:
        pending.append(s)
        if len(pending) == samples_per_shard:
            flush()
    if pending:
        flush()
    return paths


def json_lines(path: Path, error: type[ValueError] = DataError) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` for each non-blank line of a JSON-lines file, ``where`` being
    ``path:line``; a line that is not JSON raises ``error`` naming it."""
    with open(path, encoding="utf-8") as fh:
        yield from json_records(path, fh, error)


def json_records(path: Path, lines: Iterable[str], error: type[ValueError] = DataError) -> Iterator[tuple[str, Any]]:
    """``json_lines`` over the already read ``lines`` of ``path``."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}: not valid JSON: {exc}") from exc


def prepared_splits(folder: str | os.PathLike) -> tuple[Path, Path | None] | None:
    """``(folder/train, folder/eval or None)`` when ``folder`` is an output folder of
    ``pyxtts prepare``: no ``.npz`` shards of its own, a ``train/`` subfolder that has
    some. None for any other path (a folder of shards, a manifest, a missing path). The
    eval split is None when its shards hold no sample (every held-out clip dropped)."""
    folder = Path(folder)
    train, held = folder / "train", folder / "eval"
    if not folder.is_dir() or any(folder.glob("*.npz")) or not any(train.glob("*.npz")):
        return None
    return train, (held if any(_holds_samples(f) for f in held.glob("*.npz")) else None)


def _holds_samples(shard: Path) -> bool:
    """Whether a shard has a sample, read from its zip directory (an earlier prepare wrote
    a shard of 0 samples for a split whose every clip was dropped); an unreadable one
    counts as holding some, for the loader to name."""
    import zipfile

    try:
        with zipfile.ZipFile(shard) as zf:
            return any(n.startswith("text_") for n in zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return True


def prepared_vocab(data: str | os.PathLike) -> Path | None:
    """The extended ``vocab.json`` of a ``prepare --new-language`` output folder (given as
    the folder or as its ``train/``), or None."""
    folder = Path(data)
    for candidate in (folder / "vocab.json", folder.parent / "vocab.json"):
        if candidate.is_file() and (candidate.parent / "prepare.json").is_file():
            return candidate
    return None


def _prepared_hint(folder: Path) -> str:
    """For a folder without shards: where its shards are when it is a prepare output folder."""
    splits = prepared_splits(folder)
    if splits is None:
        return "; `pyxtts prepare` makes them from recordings and transcripts"
    train, held = splits
    also = f" and {str(held)!r} (the held-out samples)" if held is not None else ""
    return f", but it is an output folder of pyxtts prepare: load {str(train)!r} (the training samples){also}"


def _shard_samples(f: Path) -> list[Sample]:
    """The samples of the shard ``f``; a file cut short or damaged (a full disk, a copy
    that stopped) is a DataError naming it, never NumPy's or zipfile's own error."""
    import zipfile

    try:
        return _read_shard(f)
    except DataError:
        raise
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"{f}: cannot read this shard ({type(exc).__name__}: {exc}): the file is cut short or "
                        "damaged; remove it and run the pyxtts prepare command that made it again, which "
                        "writes the missing shard anew") from exc


def _read_shard(f: Path) -> list[Sample]:
    samples = []
    with np.load(f, allow_pickle=False) as z:
        keys = set(z.files)
        n = sum(1 for k in keys if k.startswith("text_"))
        for i in range(n):
            where = f"{f}: sample {i}"
            for k in (f"text_{i}", f"audio_{i}"):
                if k not in keys:
                    raise DataError(f"{where}: array {k!r} missing (a shard holds text_<i>, "
                                    "audio_<i> and optional cond_<i> for i = 0..n-1)")
            cond = _cond(z[f"cond_{i}"], where) if f"cond_{i}" in keys else None
            ref = _ref_audio(z[f"ref_audio_{i}"], where) if f"ref_audio_{i}" in keys else None
            ref_is_clip = f"ref_is_clip_{i}" in keys and bool(z[f"ref_is_clip_{i}"])
            samples.append(Sample(_ids(z[f"text_{i}"], where, "text"),
                                  _ids(z[f"audio_{i}"], where, "audio"), cond, where, ref, ref_is_clip))
        extra = keys - {f"{p}_{i}" for i in range(n)
                        for p in ("text", "audio", "cond", "ref_audio", "ref_is_clip")}
        if extra:
            raise DataError(f"{f}: unexpected arrays {sorted(extra)[:3]}")
    return samples


class TTSDataset(Sequence):
    """Pre-tokenised samples in memory. ``TTSDataset.from_shards(folder)``,
    ``TTSDataset.from_manifest(path)`` or ``TTSDataset.load(path)`` (either); with a
    ``config`` every sample is validated on load. ``mel_stats``: the (80,) mel normalisation
    for the reference slices (``from_shards`` reads the folder's ``mel_stats.npy``). The
    output folder of ``pyxtts prepare`` is not itself a folder of shards: load its
    ``train/`` (and ``eval/``); given the folder, the ``DataError`` says so."""

    def __init__(self, samples: Sequence[Sample], config=None, mel_stats: np.ndarray | None = None) -> None:
        try:
            samples = list(samples)
        except TypeError:
            raise TypeError(f"TTSDataset: samples: expected a sequence of pyxtts.Sample, got "
                            f"{type(samples).__name__}") from None
        self.samples = [_checked(s, i, "TTSDataset") for i, s in enumerate(samples)]
        self.mel_stats = None if mel_stats is None else np.asarray(mel_stats, dtype=np.float64)
        if config is not None:
            self.validate(config)

    # ---- loading --------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike, config=None) -> "TTSDataset":
        p = Path(path)
        return cls.from_shards(p, config) if p.is_dir() else cls.from_manifest(p, config)

    @classmethod
    def from_shards(cls, folder: str | os.PathLike, config=None) -> "TTSDataset":
        folder = Path(folder)
        files = sorted(folder.glob("*.npz"))
        if not files:
            raise DataError(f"{folder}: no .npz shards found{_prepared_hint(folder)}")
        samples: list[Sample] = []
        for f in files:
            samples += _shard_samples(f)
        stats = None
        if (folder / "mel_stats.npy").is_file():
            try:
                stats = np.load(folder / "mel_stats.npy", allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise DataError(f"{folder / 'mel_stats.npy'}: cannot read it: {exc}") from exc
            if stats.shape != (80,) or stats.dtype.kind != "f" or not np.isfinite(stats).all() or (stats == 0).any():
                raise DataError(f"{folder / 'mel_stats.npy'}: expected 80 finite non-zero floats, got dtype "
                                f"{stats.dtype} shape {stats.shape}")
        return cls(samples, config, stats)

    @classmethod
    def from_manifest(cls, path: str | os.PathLike, config=None) -> "TTSDataset":
        path = Path(path)
        base = path.parent
        samples: list[Sample] = []

        def value(v: Any, where: str, key: str) -> Any:
            if isinstance(v, str):
                p = Path(v) if Path(v).is_absolute() else base / v
                try:
                    return np.load(p, allow_pickle=False)
                except (OSError, ValueError) as exc:
                    raise DataError(f"{where}: cannot read {key} file {str(p)!r}: {exc}") from exc
            return v

        for where, rec in json_lines(path):
            if not isinstance(rec, dict) or "text" not in rec or "audio" not in rec:
                raise DataError(f"{where}: expected an object with 'text' and 'audio' (and optional 'cond')")
            cond = rec.get("cond")
            samples.append(Sample(_ids(value(rec["text"], where, "text"), where, "text"),
                                  _ids(value(rec["audio"], where, "audio"), where, "audio"),
                                  None if cond is None else _cond(value(cond, where, "cond"), where),
                                  where))
        if not samples:
            raise DataError(f"{path}: the manifest holds no samples")
        return cls(samples, config)

    # ---- access -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):  # type: ignore[override]
        return self.samples[i]

    def lengths(self) -> np.ndarray:
        """(n, 2) text and audio lengths."""
        return np.array([(len(s.text), len(s.audio)) for s in self.samples], dtype=np.int64).reshape(-1, 2)

    def validate(self, config, cap_names: Mapping[str, str] | None = None) -> None:
        """Every id within the vocabularies, lengths within the maxima (with a framing
        config, the framed lengths: ``len(text) + 1`` and ``len(audio) + 4``), conditioning
        latents of shape (n_cond_latents, d_model), all or none of the samples conditioned
        (latents, and reference recordings, each all or none);
        raises DataError naming the sample's file (and line). ``cap_names``: "text" and/or
        "audio" to the setting a maximum comes from when it is not the model's (e.g.
        ``data.max_audio_tokens``), which the refusal then names."""
        c = config
        framed = bool(getattr(c, "frames_data", False))
        extra_t, extra_a = (TEXT_OVERHEAD, AUDIO_OVERHEAD) if framed else (0, 0)
        has_cond = has_ref = None
        for j, s in enumerate(self.samples):
            where = s.source or f"sample {j}"
            for what, ids, vocab, cap in (("text", s.text, c.text_vocab_size, c.max_text_tokens - extra_t),
                                          ("audio", s.audio, c.audio_vocab_size, c.max_audio_tokens - extra_a)):
                bad = (ids < 0) | (ids >= vocab)
                if bad.any():
                    pos = int(np.argmax(bad))
                    raise DataError(f"{where}: {what}[{pos}] = {int(ids[pos])} is out of range [0, {vocab})")
                if len(ids) > cap:
                    named = (cap_names or {}).get(what)
                    limit = (f"the model's maximum of {cap}" if named is None
                             else f"the maximum of {cap} that {named} sets")
                    raise DataError(f"{where}: {len(ids)} {what} tokens exceed {limit} "
                                    + ("(its positions less the start/stop tokens the framing adds) " if framed
                                       else "") + "(pyxtts never truncates)"
                                    + (f"; raise {named} (the memory plan assumes it)" if named else ""))
            if has_cond is None:
                has_cond, has_ref = s.cond is not None, s.ref_audio is not None
            elif has_cond != (s.cond is not None):
                raise DataError(f"{where}: conditioning latents on some samples only (all or none)")
            elif has_ref != (s.ref_audio is not None):
                raise DataError(f"{where}: a reference recording (ref_audio) on some samples only (all or none)")
            nc = 0
            if s.cond is not None:
                nc = s.cond.shape[0]
                if s.cond.shape[1] != c.d_model:
                    raise DataError(f"{where}: cond has width {s.cond.shape[1]}, expected d_model={c.d_model}")
                if nc != c.n_cond_latents:  # the memory plan, and batching, count exactly that many
                    raise DataError(f"{where}: cond has {nc} conditioning latents, expected "
                                    f"n_cond_latents={c.n_cond_latents}")
                if not np.isfinite(s.cond).all():
                    pos = tuple(int(i) for i in np.argwhere(~np.isfinite(s.cond))[0])
                    raise DataError(f"{where}: cond{list(pos)} is NaN or infinite")
            seq = nc + len(s.text) + len(s.audio) + extra_t + extra_a
            if seq > c.max_attention_sequence_length:
                raise DataError(f"{where}: sequence of {seq} exceeds "
                                f"max_attention_sequence_length={c.max_attention_sequence_length}")

    def split(self, n_eval: int, seed: int = 0) -> tuple["TTSDataset", "TTSDataset"]:
        """``(train, eval)``: ``n_eval`` samples drawn at random (seeded) for evaluation,
        the rest for training; no sample is in both."""
        if len(self.samples) < 2:
            raise ValueError(f"n_eval: a split needs at least 2 samples, the dataset has {len(self.samples)}")
        n_eval = integer("n_eval", n_eval, minimum=1, maximum=len(self.samples) - 1)
        order = np.random.default_rng(seed).permutation(len(self.samples))
        held = set(order[:n_eval].tolist())
        train = [s for i, s in enumerate(self.samples) if i not in held]
        held_out = [self.samples[i] for i in sorted(held)]
        return TTSDataset(train, mel_stats=self.mel_stats), TTSDataset(held_out, mel_stats=self.mel_stats)

    def batches(self, batch_size: int, shuffle: bool = True, seed: int = 0, **kw) -> Iterator[dict]:
        """``bucketed_batches(self, batch_size, shuffle=shuffle, seed=seed, ...)``."""
        return bucketed_batches(self, batch_size, shuffle=shuffle, seed=seed, **kw)


def _shift(ids: np.ndarray, stop: int | None) -> np.ndarray:
    t = np.empty_like(ids)
    t[:-1] = ids[1:]
    t[-1] = -1 if stop is None else stop
    return t


def _checked(s: Any, i: int, caller: str = "collate") -> Sample:
    """A Sample as the loaders make it (non-empty 1-d int64 ids, float32 latents and
    reference), or DataError: a hand-made Sample's lists (or CPU tensors) become arrays, and
    empty, 2-d, float, uint8 or str ids are refused, never half-collated."""
    if not isinstance(s, Sample):
        raise TypeError(f"{caller}: sample {i}: expected a pyxtts.Sample, got {type(s).__name__}")
    where = f"{caller}: sample {i}" + (f" ({s.source})" if s.source else "")
    return dataclasses.replace(s, text=_ids(s.text, where, "text"), audio=_ids(s.audio, where, "audio"),
                               cond=None if s.cond is None else _cond(s.cond, where),
                               ref_audio=None if s.ref_audio is None else _ref_audio(s.ref_audio, where))


def collate(samples: Sequence[Sample], text_stop_token: int | None = None,
            audio_stop_token: int | None = None, *, config=None, ignore_code_ranges=None) -> dict:
    """A batch dict padded to its longest text and audio (no other padding). With a
    ``config`` that sets the start/stop ids, the samples are framed as Coqui does and
    ``ignore_code_ranges`` (per sample None or (start, end) code indices) masks the
    targets of those codes (``pyxtts.framing``); otherwise targets are the next-token
    shift with the optional stop tokens (module docstring)."""
    try:  # a list, a tuple, a dataset, an object array: not judged by truth value
        samples = list(samples)
    except TypeError:
        raise TypeError(f"collate: samples: expected a sequence of pyxtts.Sample, got "
                        f"{type(samples).__name__}") from None
    if not samples:
        raise ValueError("collate: no samples")
    samples = [_checked(s, i) for i, s in enumerate(samples)]
    for name, tok in (("text_stop_token", text_stop_token), ("audio_stop_token", audio_stop_token)):
        if tok is not None and (isinstance(tok, bool) or not isinstance(tok, (int, np.integer))):
            raise TypeError(f"collate: {name}: expected an int id or None, got {tok!r}")
        if tok is not None and not -1 <= tok < 2**31:  # ids are int32 in the engine; -1 is "ignored"
            raise ValueError(f"collate: {name}: expected an id in [0, 2**31) or -1, got {tok}")
    if config is not None and not hasattr(config, "frames_data"):  # an XTTSConfig is an easy slip
        hint = " (an XTTSConfig's .model)" if hasattr(config, "model") else ""
        raise TypeError(f"collate: config: expected a pyxtts.ModelConfig{hint} or None, got {type(config).__name__}")
    framed = config is not None and config.frames_data
    if framed and (text_stop_token is not None or audio_stop_token is not None):
        raise ValueError("collate: the config's start/stop ids frame the samples; pass no text_stop_token "
                         "or audio_stop_token with it")
    if not framed and ignore_code_ranges is not None:
        raise ValueError("collate: ignore_code_ranges needs a config with start/stop token ids (Coqui's framing)")
    if framed:
        out = frame_batch([s.text for s in samples], [s.audio for s in samples], config, ignore_code_ranges)
    else:
        B = len(samples)
        tl = np.array([len(s.text) for s in samples], dtype=np.int64)
        al = np.array([len(s.audio) for s in samples], dtype=np.int64)
        Lt, La = int(tl.max()), int(al.max())
        out = {"text_inputs": np.zeros((B, Lt), np.int64), "text_targets": np.full((B, Lt), -1, np.int64),
               "audio_inputs": np.zeros((B, La), np.int64), "audio_targets": np.full((B, La), -1, np.int64),
               "text_lengths": tl, "audio_lengths": al}
        for i, s in enumerate(samples):
            out["text_inputs"][i, :len(s.text)] = s.text
            out["text_targets"][i, :len(s.text)] = _shift(s.text, text_stop_token)
            out["audio_inputs"][i, :len(s.audio)] = s.audio
            out["audio_targets"][i, :len(s.audio)] = _shift(s.audio, audio_stop_token)
    conds = [s.cond for s in samples]
    if any(c is not None for c in conds):
        if any(c is None for c in conds) or len({c.shape for c in conds}) != 1:
            raise ValueError("collate: conditioning latents must be present on all samples, all of one shape")
        out["cond_latents"] = np.stack(conds).astype(np.float32)
    return out


def collate_references(samples: Sequence[Sample], indices: Sequence[int], config, references, epoch: int,
                       evaluation: bool = False) -> dict:
    """``collate(samples, config=config)`` with each sample's reference slice: ``cond_mels``
    (B, 80, S) drawn by ``references`` (a ``pyxtts.references.References``) for the dataset's
    ``indices`` at ``epoch``, and the targets its slice covers masked (``ignore_code_ranges``);
    fixed ``cond_latents`` the samples may also carry are left out (the two are exclusive)."""
    mels, ranges = references.batch(samples, indices, epoch, evaluation)
    out = collate(samples, config=config, ignore_code_ranges=ranges)
    out.pop("cond_latents", None)
    out["cond_mels"] = mels
    return out


def batch_groups(dataset: Sequence[Sample], batch_size: int, shuffle: bool = True, seed: int = 0,
                 bucket_factor: int = 8, drop_last: bool = False) -> list[np.ndarray]:
    """The sample indices of each batch ``bucketed_batches`` yields, in order, without
    collating anything (a trainer resuming mid-epoch skips batches with it)."""
    batch_size = integer("batch_size", batch_size, minimum=1)
    bucket_factor = integer("bucket_factor", bucket_factor, minimum=1)
    n = len(dataset)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n) if shuffle else np.arange(n)
    total = np.array([len(s.text) + len(s.audio) for s in (dataset[i] for i in range(n))])
    pool = batch_size * bucket_factor
    groups: list[np.ndarray] = []
    for lo in range(0, n, pool):
        chunk = order[lo:lo + pool]
        chunk = chunk[np.argsort(total[chunk], kind="stable")]
        groups += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    if drop_last:
        groups = [g for g in groups if len(g) == batch_size]
    if shuffle:
        groups = [groups[i] for i in rng.permutation(len(groups))]
    return groups


def bucketed_batches(dataset: Sequence[Sample], batch_size: int, shuffle: bool = True, seed: int = 0,
                     bucket_factor: int = 8, drop_last: bool = False, text_stop_token: int | None = None,
                     audio_stop_token: int | None = None, config=None) -> Iterator[dict]:
    """Length-bucketed batches: the (seeded) shuffled indices are cut into pools of
    ``batch_size * bucket_factor`` samples, each pool is sorted by total length and cut into
    batches, and the batches are shuffled; so a batch holds samples of similar length and
    pads little. The same seed gives the same batches in the same order. The last,
    smaller batch is kept unless ``drop_last``. ``config``: as for ``collate``."""
    for g in batch_groups(dataset, batch_size, shuffle, seed, bucket_factor, drop_last):
        yield collate([dataset[int(i)] for i in g], text_stop_token, audio_stop_token, config=config)


class SyntheticDataset(TTSDataset):
    """Samples whose audio codes are a learnable function of the text: a fixed random table
    (drawn from ``seed``) maps each text id to an audio code, and each text token's code is
    repeated ``repeat`` times (audio[j] = table[text[j // repeat]]), as speech holds each
    sound for several frames. Text ids come from the first ``alphabet`` ids of the vocabulary;
    lengths are uniform in [min_text, max_text] (default: up to max_text_tokens and to what
    the audio maximum allows, less the start/stop tokens of a framing config)."""

    def __init__(self, config, n_samples: int, seed: int = 0, repeat: int = 2, alphabet: int = 16,
                 min_text: int = 2, max_text: int | None = None, cond: bool = False) -> None:
        from pyxtts.model import ModelConfig

        if not isinstance(config, ModelConfig):
            hint = " (an XTTSConfig's .model)" if hasattr(config, "model") else ""
            raise TypeError(f"config: expected a pyxtts.ModelConfig{hint}, got {type(config).__name__}")
        n_samples = integer("n_samples", n_samples, minimum=1)
        seed = integer("seed", seed, minimum=0)
        repeat = integer("repeat", repeat, minimum=1)
        alphabet = integer("alphabet", alphabet, minimum=1)
        min_text = integer("min_text", min_text, minimum=1)
        if max_text is not None:
            max_text = integer("max_text", max_text, minimum=min_text)
        rng = np.random.default_rng(seed)
        c = config
        alphabet = min(alphabet, c.text_vocab_size)
        framed = bool(getattr(c, "frames_data", False))
        cap = (min(c.max_text_tokens - TEXT_OVERHEAD, (c.max_audio_tokens - AUDIO_OVERHEAD) // repeat) if framed
               else min(c.max_text_tokens, c.max_audio_tokens // repeat))
        max_text = cap if max_text is None else min(max_text, cap)
        if max_text < min_text:
            raise ValueError(f"SyntheticDataset: max_text={max_text} < min_text={min_text}")
        self.table = rng.integers(0, c.audio_vocab_size, alphabet)
        samples = []
        for i in range(n_samples):
            n = int(rng.integers(min_text, max_text + 1))
            text = rng.integers(0, alphabet, n)
            audio = np.repeat(self.table[text], repeat)
            cnd = rng.standard_normal((c.n_cond_latents, c.d_model)).astype(np.float32) \
                if cond and c.n_cond_latents else None
            samples.append(Sample(text, audio, cnd, f"synthetic sample {i}"))
        super().__init__(samples, config)

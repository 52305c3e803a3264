"""Coqui XTTS checkpoints in and out: ``import_xtts_checkpoint`` and
``export_xtts_checkpoint``.

Both read Coqui's ``model.pth`` with ``pyxtts.torchfile``: no torch needed, and nothing
in the file runs (its pickled ``XttsConfig`` becomes an inert record whose fields are
read as data). Two layouts are recognised: the released XTTS checkpoint (``"model"``
holds the ``Xtts`` state dict, GPT keys ``gpt.*``) and a ``GPTTrainer`` checkpoint
(``xtts.gpt.*``, beside ``dvae.*`` and the mel extractors).

The GPT's config is, in this order: the ``config`` argument; ``config.json`` beside the
``.pth`` (with ``vocab.json`` beside it, as Coqui's loader reads them); the config
pickled in the checkpoint. Only a checkpoint with none of these has its sizes inferred
from the shapes, ``n_heads`` then being a guess that the result says it is.

Import keeps every ``gpt.*`` tensor: those the pyxtts model has become its parameters,
the others (today the 54 tensors of the conditioning encoder and perceiver) are stored
in the pyxtts checkpoint as ``carried.<name>``, listed in its metadata, and loaded by
``load_checkpoint`` into a model that has them. Export writes the base ``model.pth``
with every GPT tensor the model has replaced (cast to the base's dtype) and every other
record copied byte for byte, and names the GPT tensors it carried from the base.

A new language (``prepare --new-language``): import with ``vocab=`` grows the text rows to
the extended vocabulary (``pyxtts.text_vocab``); export with ``vocab=`` writes them at
their new size, the pickle changed only in those tensors' shape and element count
(``torchfile.resized_pickle``), with that ``vocab.json`` and a ``config.json`` naming the
language.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from pyxtts._files import folder_in_use, lock_folder, missing_folders, remove_empty_folders, write_all_atomic
from pyxtts.checkpoint import (FORMAT, FORMAT_VERSION, MODEL_PREFIX, CheckpointError, read_checkpoint,
                               save_checkpoint)
from pyxtts.text_vocab import TEXT_ROWS
from pyxtts.torchfile import (PickledObject, TensorRef, TorchFile, TorchFileError, resized_pickle, rewrite_storages,
                              storages_with)

__all__ = ["COQUI_LOADER_FILES", "XTTSCheckpoint", "export_xtts_checkpoint", "import_xtts_checkpoint",
           "read_xtts_checkpoint"]

GPT_PREFIXES = ("gpt.", "xtts.gpt.")
# the checkpoints Coqui's trainer writes into a run's folder: checkpoint_<step>.pth every
# save_step, best_model_<step>.pth and its copy best_model.pth at a lower eval loss
COQUI_RUN_FILE = re.compile(r"(checkpoint|best_model)(?:_(\d+))?\.pth")
# what Xtts.load_checkpoint reads from a checkpoint folder besides model.pth
COQUI_LOADER_FILES = ("config.json", "vocab.json", "speakers_xtts.pth")
# the config fields that must agree between a model and the base it is exported into
EXPORT_FIELDS = ("n_layers", "d_model", "n_heads", "text_vocab_size", "audio_vocab_size", "max_text_tokens",
                 "max_audio_tokens", "start_text_token", "stop_text_token", "start_audio_token",
                 "stop_audio_token", "code_stride_len", "use_perceiver_resampler")
_BF16 = np.dtype(ml_dtypes.bfloat16)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16), _BF16, np.dtype(np.float64))


@dataclasses.dataclass
class XTTSCheckpoint:
    """The GPT of a Coqui XTTS checkpoint: ``tensors`` (GPT-relative name -> TensorRef
    into ``file``), the key ``prefix`` they carry there ("gpt." or "xtts.gpt."),
    ``config`` (a ModelConfig) and where it came from."""

    file: TorchFile
    prefix: str
    tensors: dict[str, TensorRef]
    config: Any
    config_source: str
    n_heads_guessed: bool = False


def plain(obj: Any) -> Any:
    """A pickled record as plain data: a record with a dict state becomes that dict
    (recursively), containers stay containers."""
    if isinstance(obj, PickledObject):
        return plain(obj.state) if isinstance(obj.state, Mapping) else obj
    if isinstance(obj, Mapping):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


def _gpt_tensors(path: Path, obj: Any) -> tuple[str, dict[str, TensorRef]]:
    sd = obj.get("model") if isinstance(obj, Mapping) and isinstance(obj.get("model"), Mapping) else obj
    if not isinstance(sd, Mapping):
        raise CheckpointError(f"{path}: expected a state dict (or one under 'model'), got {type(obj).__name__}")
    found = {p: {k[len(p):]: v for k, v in sd.items() if isinstance(k, str) and k.startswith(p)}
             for p in GPT_PREFIXES}
    if found["gpt."] and found["xtts.gpt."]:
        raise CheckpointError(f"{path}: holds both 'gpt.*' and 'xtts.gpt.*' keys; which GPT is meant is unclear")
    prefix = "xtts.gpt." if found["xtts.gpt."] else "gpt."
    tensors = found[prefix]
    if not tensors:
        raise CheckpointError(f"{path}: no 'gpt.*' or 'xtts.gpt.*' keys: not an XTTS checkpoint")
    bad = [k for k, v in tensors.items() if not isinstance(v, TensorRef)]
    if bad:
        raise CheckpointError(f"{path}: {prefix}{bad[0]} is not a tensor")
    return prefix, tensors


def _embedded_config(obj: Any) -> Mapping | None:
    cfg = plain(obj.get("config")) if isinstance(obj, Mapping) else None
    return cfg if isinstance(cfg, Mapping) and ("model_args" in cfg or any(str(k).startswith("gpt_") for k in cfg)) \
        else None


def _infer_config(path: Path, gpt: Mapping[str, TensorRef]) -> Any:
    """Sizes from the shapes; n_heads XTTS v2's 16 when it divides d_model (a guess)."""
    from pyxtts.model import ModelConfig

    def shape(name: str) -> tuple[int, ...]:
        if name not in gpt:
            raise CheckpointError(f"{path}: cannot infer the config: the checkpoint lacks {name!r}")
        return gpt[name].shape

    layers = {int(m.group(1)) for k in gpt if (m := re.match(r"gpt\.h\.(\d+)\.", k))}
    if not layers:
        raise CheckpointError(f"{path}: cannot infer the config: no 'gpt.h.<i>.' keys (is this an XTTS GPT?)")
    text_vocab, d = shape("text_embedding.weight")
    heads = max(h for h in (16, 8, 4, 2, 1) if d % h == 0)
    perceiver = any(k.startswith("conditioning_perceiver.") for k in gpt)
    return ModelConfig(n_layers=max(layers) + 1, d_model=d, n_heads=heads, text_vocab_size=text_vocab,
                       audio_vocab_size=shape("mel_embedding.weight")[0],
                       max_text_tokens=shape("text_pos_embedding.emb.weight")[0],
                       max_audio_tokens=shape("mel_pos_embedding.emb.weight")[0],
                       use_perceiver_resampler=perceiver, conditioning=perceiver,
                       n_cond_latents=shape("conditioning_perceiver.latents")[0] if perceiver else 32)


def _run_checkpoints(folder: Path) -> list[str]:
    """The checkpoints of a Coqui training run in ``folder``: ``checkpoint_<N>.pth`` newest
    first, then ``best_model.pth``, then ``best_model_<N>.pth`` newest first."""
    found = []
    for p in folder.iterdir():
        m = COQUI_RUN_FILE.fullmatch(p.name)
        if m and p.is_file():
            rank = 0 if m.group(1) == "checkpoint" else 1 if m.group(2) is None else 2
            found.append((rank, -int(m.group(2) or 0), p.name))
    return [name for _, _, name in sorted(found)]


def _folder_model(folder: Path) -> Path:
    """A checkpoint folder's ``model.pth``; a FileNotFoundError when it has none, naming the
    checkpoints of a Coqui training run it holds instead (that folder has no model.pth)."""
    path = folder / "model.pth"
    if path.is_file():
        return path
    names = _run_checkpoints(folder)
    if not names:
        raise FileNotFoundError(f"{path}: no such file")
    raise FileNotFoundError(f"{path}: no such file; {folder} holds the checkpoints of a Coqui training run "
                            f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): name one of them, e.g. "
                            f"{folder / names[0]}")


def read_xtts_checkpoint(path: str | os.PathLike, config: Any = None) -> XTTSCheckpoint:
    """Opens a Coqui XTTS checkpoint (a ``model.pth``, or the folder holding one) and
    finds its GPT and config (module docstring). Close ``.file`` when done."""
    from pyxtts.model import ModelConfig

    if config is not None and not isinstance(config, ModelConfig):
        raise TypeError(f"config: expected a ModelConfig or None, got {type(config).__name__}")
    path = Path(path)
    if path.is_dir():
        path = _folder_model(path)
    try:
        file = TorchFile(path)
    except TorchFileError as exc:
        raise CheckpointError(str(exc)) from exc
    try:
        prefix, tensors = _gpt_tensors(path, file.obj)
        guessed = False
        embedded = _embedded_config(file.obj)
        if config is not None:
            source = "the config argument"
        elif (path.parent / "config.json").is_file() or embedded is not None:
            cfg: Any = path.parent / "config.json"
            source = str(cfg)
            vocab = path.parent / "vocab.json"
            if not cfg.is_file():
                cfg, source = embedded, f"the config pickled in {path.name}"
            try:
                config = ModelConfig.from_xtts_config(cfg, vocab if vocab.is_file() else None)
            except (TypeError, ValueError) as exc:
                raise CheckpointError(f"{path}: {source}: {exc}") from exc
        else:
            config = _infer_config(path, tensors)
            source = "the tensor shapes"
            guessed = True
            warnings.warn(f"{path}: no config (argument, config.json beside it, or pickled in it): sizes "
                          f"inferred from the shapes and n_heads={config.n_heads} guessed; pass config= if "
                          "it differs", stacklevel=2)
    except BaseException:
        file.close()
        raise
    return XTTSCheckpoint(file, prefix, tensors, config, source, guessed)


def _float_array(ck: XTTSCheckpoint, name: str) -> np.ndarray:
    ref = ck.tensors[name]
    if ref.dtype not in _FLOATS:
        raise CheckpointError(f"{ck.file.path}: {ck.prefix}{name} has dtype {ref.dtype}, expected floating point")
    return ck.file.array(ref)


def import_xtts_checkpoint(pth_path: str | os.PathLike, out_path: str | os.PathLike,
                           config: Any = None, vocab: str | os.PathLike | None = None) -> dict:
    """Converts the GPT of a Coqui XTTS checkpoint (the released ``model.pth`` or a
    ``GPTTrainer`` checkpoint; a folder means its ``model.pth``) into a pyxtts
    checkpoint at ``out_path``, keeping every GPT tensor: the model's as parameters,
    the rest as ``carried.<name>`` (module docstring). No torch needed; nothing in the
    file is executed. Returns the metadata written: ``config`` (the ModelConfig's
    fields: ``ModelConfig(**meta["config"])`` builds the model) and ``extra``
    (``imported_from``, ``config_source``, ``n_heads_guessed``, ``carried``: the names
    kept aside). Nothing is written on a refusal (``CheckpointError``).

    ``vocab``: a ``vocab.json`` that extends the checkpoint's own (the one beside it), as
    ``prepare --new-language`` writes it: the text rows grow to it (``pyxtts.text_vocab``,
    old rows bit for bit, new ones from the mean of their pieces' rows) and ``extra`` gains
    ``vocab`` (its digest, language, sizes and how the rows started)."""
    from pyxtts.model import XTTSGPT

    ck = read_xtts_checkpoint(pth_path, config)
    try:
        cfg = ck.config
        try:
            model = XTTSGPT(cfg, device="cpu", precision="fp32", seed=0)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{ck.file.path}: its config ({ck.config_source}) builds no model: {exc}") from exc
        params = model.parameters()
        missing = [k for k in params if k not in ck.tensors]
        if missing:
            raise CheckpointError(f"{ck.file.path}: the GPT lacks {len(missing)} parameters of the config from "
                                  f"{ck.config_source} (e.g. {ck.prefix}{missing[0]})")
        for k in params:
            if ck.tensors[k].shape != params[k].shape:
                raise CheckpointError(f"{ck.file.path}: {ck.prefix}{k} has shape {ck.tensors[k].shape}, the config "
                                      f"from {ck.config_source} expects {params[k].shape}")
        state = {k: _float_array(ck, k) for k in params}
        carried = {k: _float_array(ck, k) for k in sorted(ck.tensors) if k not in params}
        grown = None
        if vocab is not None:
            state, cfg, grown = _grown(ck, state, cfg, Path(vocab))
            model = XTTSGPT(cfg, device="cpu", precision="fp32", seed=0)
        try:
            model.load_state_dict(state, strict=True)
        except (ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"{ck.file.path}: {exc}") from exc
        extra = {"imported_from": str(ck.file.path), "config_source": ck.config_source,
                 "n_heads_guessed": ck.n_heads_guessed, "carried": list(carried)}
        if grown is not None:
            extra["vocab"] = grown
        save_checkpoint(out_path, model, step=0, extra=extra, carried=carried)
    finally:
        ck.file.close()
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "config": dataclasses.asdict(cfg),
            "step": 0, "extra": extra}


def _grown(ck: XTTSCheckpoint, state: dict, cfg: Any, vocab: Path) -> tuple[dict, Any, dict]:
    """The state and config over the extended ``vocab`` (``import_xtts_checkpoint``)."""
    from pyxtts.prepare.vocab import read_vocab_doc, vocab_sha256
    from pyxtts.text_vocab import resize_text_rows

    base_vocab = ck.file.path.parent / "vocab.json"
    if not base_vocab.is_file():
        raise CheckpointError(f"{ck.file.path}: no vocab.json beside it, so the vocabulary {vocab} cannot be checked "
                              "against the one the checkpoint was trained with")
    try:
        base_doc, doc = read_vocab_doc(base_vocab), read_vocab_doc(vocab)
        state, cfg, report = resize_text_rows(state, cfg, base_doc, doc)
    except ValueError as exc:  # its own "vocab: " prefix names no file
        raise CheckpointError(f"vocab {vocab}: {str(exc).removeprefix('vocab: ')}") from exc
    return state, cfg, {**report, "file": str(vocab), "sha256": vocab_sha256(doc),
                        "base_sha256": vocab_sha256(base_doc)}


# ---- export ----------------------------------------------------------------------------

def _source(model_or_checkpoint: Any) -> tuple[Any, dict[str, np.ndarray], str, dict]:
    """(ModelConfig, name -> array, description, the checkpoint's metadata: {} for a model)
    of an XTTSGPT or a pyxtts checkpoint path, the file read once."""
    from pyxtts.model import XTTSGPT, ModelConfig

    if isinstance(model_or_checkpoint, XTTSGPT):
        return model_or_checkpoint.config, model_or_checkpoint.state_dict(), "the model", {}
    if not isinstance(model_or_checkpoint, (str, os.PathLike)):
        raise TypeError(f"model_or_checkpoint: expected an XTTSGPT or the path of a pyxtts checkpoint, "
                        f"got {type(model_or_checkpoint).__name__}")
    path = Path(model_or_checkpoint)
    meta, tensors = read_checkpoint(path)
    try:
        config = ModelConfig(**meta["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: its config is not a ModelConfig this pyxtts knows: {exc}") from exc
    state = {k[len(MODEL_PREFIX):]: v for k, v in tensors.items() if k.startswith(MODEL_PREFIX)}
    if not state:
        raise CheckpointError(f"{path}: holds no model tensors")
    return config, state, str(path), meta


def _cast(name: str, value: np.ndarray, ref: TensorRef, rows: int | None = None) -> np.ndarray:
    """value in the base tensor's dtype (round to nearest even), finite; ``rows``: the first
    dimension it has instead of the base's (text rows grown to a new vocabulary)."""
    if ref.dtype not in _FLOATS:
        raise CheckpointError(f"base tensor {name} has dtype {ref.dtype}, expected floating point")
    if tuple(value.shape) != (ref.shape if rows is None else (rows,) + ref.shape[1:]):
        raise CheckpointError(f"{name}: the model's shape {tuple(value.shape)} differs from the base's {ref.shape}")
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(np.asarray(value).astype(np.float32).astype(ref.dtype))
    if not np.isfinite(out.astype(np.float32)).all():
        raise CheckpointError(f"{name}: NaN or infinity (or beyond the base's {ref.dtype}) in the model's values")
    return out


def export_diffs(config: Any, base: Any) -> list[str]:
    """The ``EXPORT_FIELDS`` in which a model's config differs from a base's: those that
    stop its weights from going into the base (a model that leaves a start/stop id unset
    takes the base's)."""
    return [f for f in EXPORT_FIELDS if getattr(config, f) != getattr(base, f)
            and not (f.endswith("_token") and getattr(config, f) is None)]


def _compare(config: Any, base: Any, base_source: str, source: str) -> None:
    diffs = [f"{f}: {getattr(config, f)!r} in {source}, {getattr(base, f)!r} in the base"
             for f in export_diffs(config, base)]
    if diffs:
        raise CheckpointError(f"the model and the base ({base_source}) describe different GPTs: " + "; ".join(diffs))


@dataclasses.dataclass(frozen=True)
class _TrainedVocab:
    """The extended vocabulary a run's ``train --init`` grew the text rows to, as its import
    (``init_xtts.safetensors``) records it: ``sha256`` (``vocab_sha256``), the ``file`` it
    was given as, the XTTS checkpoint ``imported_from``, and ``where`` the record was read."""
    sha256: str
    file: str
    imported_from: str
    where: str

    def names(self) -> str:
        return f"{self.file} (sha256 {self.sha256[:12]}...), which {self.where} records"


def _trained_vocab(model_or_checkpoint: Any, meta: dict) -> _TrainedVocab | None:
    """The extended vocabulary the checkpoint's run trained with: from the checkpoint itself
    (``meta``, its metadata as the export read it) when it is an import, else from the
    import its config's ``training.init_checkpoint`` names (looked for beside the checkpoint
    first: the run's folder may have moved). None when nothing records one (XTTS v2's own
    vocabulary, a model object, a missing import)."""
    from pyxtts.fingerprint import saved_extra

    if not isinstance(model_or_checkpoint, (str, os.PathLike)):
        return None
    path = Path(model_or_checkpoint)
    extra, where = (meta["extra"] if isinstance(meta.get("extra"), dict) else {}), path
    if not isinstance(extra.get("vocab"), dict):
        training = ((extra.get("config") or {}).get("training") or {}) if isinstance(extra.get("config"), dict) else {}
        init = training.get("init_checkpoint") if isinstance(training, dict) else None
        if not isinstance(init, str) or not init:
            return None
        found = [p for p in ([Path(init)] if Path(init).is_absolute() else [path.parent / Path(init).name, Path(init)])
                 if p.is_file()]
        if not found:
            return None
        extra, where = saved_extra(found[0]), found[0]
    grown = extra.get("vocab")
    if not isinstance(grown, dict) or not isinstance(grown.get("sha256"), str):
        return None
    return _TrainedVocab(grown["sha256"], str(grown.get("file")), str(extra.get("imported_from")), str(where))


def _vocab_growth(config: Any, base_cfg: Any, base_dir: Path, vocab: str | os.PathLike | None,
                  trained: _TrainedVocab | None = None) -> tuple | None:
    """(extended vocabulary document, its VocabExtension) when the model's text rows outgrow
    the base's; None when they are the same size. CheckpointError for a vocabulary missing,
    not extending the base's, of another size than the model's rows, or not the one the run
    ``trained`` with; for a base whose rows are the model's but whose vocab.json is not."""
    from pyxtts.prepare.vocab import read_vocab_doc, vocab_extension, vocab_sha256

    if config.text_vocab_size == base_cfg.text_vocab_size:
        if vocab is not None:
            raise CheckpointError(f"vocab: not needed: the model has the base's {base_cfg.text_vocab_size} text rows, "
                                  f"so the base's own vocab.json goes with them; export without {vocab}")
        if trained is not None:  # a base that has the grown rows already (an earlier export)
            base_sha = _vocab_digest(base_dir / "vocab.json", "base")
            if base_sha != trained.sha256:
                raise CheckpointError(f"base: {base_dir / 'vocab.json'} (sha256 {base_sha[:12]}...) is not the "
                                      f"vocabulary the model was trained with, {trained.names()}; export into the "
                                      "XTTS folder the run started from: pass "
                                      f"base='{_checkpoint_folder(trained.imported_from)}' and vocab='{trained.file}'")
        return None
    if config.text_vocab_size < base_cfg.text_vocab_size:
        raise CheckpointError(f"base: the model has {config.text_vocab_size} text rows, fewer than the base's "
                              f"{base_cfg.text_vocab_size}, so the base is not the XTTS folder it started from")
    if vocab is None:
        which = (f"pass vocab='{trained.file}', the one {trained.where} records" if trained is not None
                 else "pass it (the vocab.json of prepare's output)")
        raise CheckpointError(f"vocab: missing: the model has {config.text_vocab_size} text rows and the base "
                              f"{base_cfg.text_vocab_size}, so it was trained with an extended vocabulary (prepare "
                              f"--new-language); {which} (or the base is not the XTTS folder it started from)")
    try:
        doc = read_vocab_doc(vocab)
        ext = vocab_extension(read_vocab_doc(base_dir / "vocab.json"), doc, f"vocab: {vocab}")
    except (OSError, ValueError) as exc:
        raise CheckpointError(str(exc)) from exc
    if trained is not None and vocab_sha256(doc) != trained.sha256:
        # a vocabulary of the same size can hold other tokens: the digest tells them apart
        raise CheckpointError(f"vocab: {vocab} (sha256 {vocab_sha256(doc)[:12]}...) is not the vocabulary the model "
                              f"was trained with, {trained.names()}: the same ids mean other text under it; "
                              f"pass vocab='{trained.file}'")
    if ext.size != config.text_vocab_size:
        raise CheckpointError(f"vocab: {vocab} has {ext.size} tokens, but the model has {config.text_vocab_size} "
                              "text rows (another vocabulary than the one it was trained with)")
    return doc, ext


def _vocab_digest(path: Path, argument: str) -> str:
    from pyxtts.prepare.vocab import read_vocab_doc, vocab_sha256

    try:
        return vocab_sha256(read_vocab_doc(path))
    except ValueError as exc:
        raise CheckpointError(f"{argument}: {str(exc).removeprefix('vocab: ')}") from exc


def _checkpoint_folder(path: str) -> str:
    """The folder of an XTTS ``model.pth`` (as ``--init`` and ``--base`` take it), else the path."""
    p = Path(path)
    return str(p.parent) if p.name == "model.pth" else str(p)


def _coqui_config_json(base_dir: Path, ext: Any) -> bytes:
    """The base's config.json with the new language in ``languages`` and the text token
    count of the extended vocabulary (Coqui reads the count from vocab.json anyway)."""
    import json

    try:
        cfg = json.loads((base_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{base_dir / 'config.json'}: not a readable JSON config ({exc})") from exc
    langs = cfg.get("languages") if isinstance(cfg.get("languages"), list) else []
    if ext.language is not None and ext.language not in langs:
        cfg["languages"] = langs + [ext.language]
    if isinstance(cfg.get("model_args"), dict):
        cfg["model_args"]["gpt_number_text_tokens"] = ext.size
    return (json.dumps(cfg, indent=4, ensure_ascii=False) + "\n").encode("utf-8")


def _write_export(out: Path, writers: Mapping[str, Callable[[Path], None]], overwrite: bool,
                  absent: list[str]) -> list[str]:
    """The export's files, all written before any is renamed into ``out``
    (``write_all_atomic``), with ``out`` held (``lock_folder``) from the check for an
    earlier export to the removal of its files the base lacks (``absent``), which are
    returned: a second export into it meanwhile is refused, naming the process. A full
    disk or a read-only folder leaves ``out`` as it was (an earlier export whole), and the
    folders made for it are removed again."""
    made = missing_folders(out)
    try:
        lock = lock_folder(out)
    except BlockingIOError:  # the folder is another export's: nothing of it is touched
        raise folder_in_use(out, "out", "wait for it to end, or export into another folder") from None
    try:
        held = [n for n in ("model.pth", *COQUI_LOADER_FILES) if (out / n).exists()]
        if held and not overwrite:
            raise FileExistsError(f"out: {str(out)!r} holds an export already ({', '.join(held)}); pass overwrite=True "
                                  "to replace it, or export into another folder")
        removed = [n for n in absent if (out / n).is_file()]  # an earlier export's, which the base lacks
        write_all_atomic(out, writers, remove=removed)
    except BaseException:
        remove_empty_folders(made)  # before the lock goes: no other export is in them
        raise
    finally:
        if lock is not None:
            os.close(lock)
    return removed


def export_xtts_checkpoint(model_or_checkpoint: Any, base: str | os.PathLike, out: str | os.PathLike,
                           vocab: str | os.PathLike | None = None, overwrite: bool = False) -> dict:
    """Writes a Coqui XTTS checkpoint folder ``out`` that ``Xtts.load_checkpoint(config,
    checkpoint_dir=out, strict=True)`` loads: the base's ``model.pth`` (``base``: a
    Coqui XTTS folder or its ``model.pth``) with every GPT tensor of the model (an
    ``XTTSGPT`` or the path of a pyxtts checkpoint) replaced, cast to the base tensor's
    dtype; every other record (the other modules, the GPT tensors the model lacks, the
    pickled config) is copied byte for byte. The base's ``config.json``, ``vocab.json`` and
    ``speakers_xtts.pth`` (those present) are copied beside it. Every file is written to a
    temporary name first and renamed once all are written, so a failure (a full disk, a
    read-only folder: an OSError naming the file and the cause) leaves ``out`` as it was,
    an earlier export in it whole, and removes the folders made for it. ``out`` is held
    (``pyxtts._files.lock_folder``) while it is written: another export into it meanwhile,
    in any process, is refused (BlockingIOError naming the process). The model and the
    base must describe the same GPT (sizes, heads, token ids). Returns ``{"model_pth", "step", "replaced",
    "carried_from_base", "copied", "not_in_base"}`` (lists of names; ``step``: the checkpoint's
    training step, read with its tensors, None for a model); the base is never modified.

    A model grown to an extended vocabulary (``prepare --new-language``) needs ``vocab``,
    that vocabulary: its text rows replace the base's at their new size, ``vocab.json`` is
    that file, ``config.json`` the base's with the new language in ``languages`` and the
    new ``gpt_number_text_tokens``; the report gains ``language``.

    A folder that holds an export already (``model.pth`` or one of the files copied beside
    it) is refused (FileExistsError) unless ``overwrite``; then its export files are
    replaced and those the base lacks removed (a stale ``speakers_xtts.pth`` fails Coqui's
    load), listed as the report's ``removed``; other files in it are left alone."""
    config, state, source, meta = _source(model_or_checkpoint)
    base = Path(base)
    base_dir = base if base.is_dir() else base.parent
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {str(out)!r} exists and is not a folder")
    if out.resolve() == base_dir.resolve():
        raise ValueError(f"out: {str(out)!r} is the base's own folder; export into another folder")
    names = _run_checkpoints(base) if base.is_dir() and not (base / "model.pth").exists() else []
    if names:
        raise FileNotFoundError(f"base: {base} holds the checkpoints of a Coqui training run ({', '.join(names[:4])}"
                                f"{', ...' if len(names) > 4 else ''}), no model.pth: pass the Coqui XTTS folder the "
                                "model was fine-tuned from (model.pth, config.json, vocab.json: e.g. XTTS-v2), whose "
                                "vocab.json and speakers_xtts.pth Coqui's loader reads beside the export")
    try:
        ck = read_xtts_checkpoint(base)
    except (OSError, CheckpointError) as exc:  # named by the argument, as the others are
        raise (CheckpointError(f"base: {exc}") if isinstance(exc, CheckpointError) else
               type(exc)(f"base: {exc.strerror or exc}" if exc.filename is None else
                         f"base: {exc.filename}: {exc.strerror or exc}")) from exc
    try:
        if ck.n_heads_guessed:
            raise CheckpointError(f"{ck.file.path}: the base has no config (config.json beside it or pickled "
                                  "in it), so its GPT cannot be checked against the model")
        growth = _vocab_growth(config, ck.config, base_dir, vocab, _trained_vocab(model_or_checkpoint, meta))
        base_cfg = ck.config if growth is None else dataclasses.replace(ck.config, text_vocab_size=growth[1].size)
        _compare(config, base_cfg, ck.config_source, source)
        unknown = [k for k in state if k not in ck.tensors]
        if unknown:
            raise CheckpointError(f"{len(unknown)} of the model's tensors are not in the base "
                                  f"{ck.file.path} (e.g. {ck.prefix}{unknown[0]})")
        grown = TEXT_ROWS if growth is not None else ()
        values = {ck.tensors[k]: _cast(ck.prefix + k, v, ck.tensors[k]) for k, v in state.items() if k not in grown}
        resized = {ck.tensors[k]: _cast(ck.prefix + k, state[k], ck.tensors[k], config.text_vocab_size)
                   for k in grown}
        try:
            storages = storages_with(ck.file, values)
            storages.update({ref.storage.key: v.tobytes() for ref, v in resized.items()})
            pickle_data = resized_pickle(ck.file, {ref: v.shape for ref, v in resized.items()}) if resized else None
        except TorchFileError as exc:
            raise CheckpointError(f"{ck.file.path}: {exc}") from exc
        writers: dict[str, Callable[[Path], None]] = {
            "model.pth": lambda tmp: rewrite_storages(ck.file, tmp, storages, pickle_data)}
        if growth is not None:  # the extended vocabulary and the config that names its language
            doc_bytes = Path(vocab).read_bytes()
            config_bytes = _coqui_config_json(base_dir, growth[1])
            writers["vocab.json"] = lambda tmp: Path(tmp).write_bytes(doc_bytes)
            writers["config.json"] = lambda tmp: Path(tmp).write_bytes(config_bytes)
        copied, absent = [], []
        for name in COQUI_LOADER_FILES:
            src = base_dir / name
            if growth is not None and name in ("vocab.json", "config.json"):
                continue
            if src.is_file():
                writers[name] = lambda tmp, src=src: shutil.copyfile(src, tmp)
                copied.append(name)
            else:
                absent.append(name)
        removed = _write_export(out, writers, overwrite, absent)
        report = {"model_pth": str(out / "model.pth"), "step": meta.get("step"),
                  "replaced": sorted(ck.prefix + k for k in state),
                  "carried_from_base": sorted(ck.prefix + k for k in ck.tensors if k not in state)}
    finally:
        ck.file.close()
    if growth is not None:
        report["language"] = growth[1].language
    report.update(copied=copied, not_in_base=absent, removed=removed)
    return report

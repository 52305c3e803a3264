"""``prepare``: transcripts and recordings in, ``.npz`` shards that ``TTSDataset.load`` reads out.

Each sample becomes the tokenizer's text ids, the DVAE's audio codes (no start or stop
token) and its conditioning recording (``ref_audio``, 22,050 Hz float32). A sample the model
cannot take is listed in ``report.tsv`` with the reason and left out; nothing is truncated.

Output folder::

    OUT/prepare.json          the inputs' and settings' fingerprint (a rerun must match it)
    OUT/train/shard-NNNNN.npz the training samples; shard-NNNNN.json lists its samples
    OUT/train/mel_stats.npy   the checkpoint's mel normalisation, for the reference slices' mels
    OUT/eval/shard-NNNNN.npz  the held-out samples (eval_fraction > 0)
                              (a shard that keeps no sample has its .json and no .npz)
    OUT/report.tsv            every sample: kept, or the reason it was dropped
    OUT/summary.json          counts, hours, tokens per second of speech, throughput
    OUT/vocab.json            with --new-language: XTTS v2's vocabulary extended by the
                              language's tokens (``pyxtts.prepare.vocab``); the ids are its;
                              with --vocab, a copy of that extended vocabulary

A split that loses samples is said in the summary (``summary["warnings"]``): an evaluation
split that lost any, and a split left empty.

Shard j of a split holds the kept samples among that split's items j*S .. (j+1)*S - 1 (S =
samples_per_shard) in transcript order, so the output depends only on the inputs and the
settings, never on the number of workers or on timing; files are written byte for byte the
same (fixed zip timestamps) and atomically. A run that stops part-way (Ctrl-C, a crash) is
resumed by running it again: finished shards whose items are unchanged are kept.
"""
from __future__ import annotations

import errno
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import re
import signal
import sys
import time
import zipfile
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pyxtts._args import flag, integer, path_arg, real
from pyxtts._files import lock_folder, lock_holder, remove_stale_temps, write_atomic
from pyxtts._words import counted, setting_changes
from pyxtts.data import shard_arrays
from pyxtts.prepare.assets import XTTSAssets
from pyxtts.prepare.audio import DVAE_MEL, SAMPLE_RATE, SILENCE_PEAK, AudioError, load_audio, mel_spectrogram
from pyxtts.prepare.cleaners import clean_new_language, clean_text, has_digits, num2words_knows
from pyxtts.prepare.sources import Item, audio_folder, read_metadata
from pyxtts.prepare.text import XTTSTokenizer
from pyxtts.prepare.vocab import (DEFAULT_NEW_TOKENS, MAX_NEW_TOKENS, check_new_language, extend_vocab,
                                  read_vocab_doc, vocab_extension, vocab_sha256)

__all__ = ["MAX_WAV_SAMPLES", "MIN_SECONDS", "REASONS", "PrepareResult", "prepare"]

FORMAT = 1
MAX_WAV_SAMPLES = 255995  # Coqui's GPTArgs.max_wav_length (~11.6 s)
MIN_SECONDS = 0.5  # Coqui's XTTSDataset drops shorter clips

REASONS = {
    "missing": "the audio file does not exist",
    "unreadable": "libsndfile cannot read the audio file",
    "silent": f"the clip's peak stays below {SILENCE_PEAK} (-60 dBFS)",
    "too_short": "shorter than the minimum duration",
    "too_long": "more samples at 22,050 Hz than the maximum (Coqui: 255,995)",
    "text_empty": "the transcript is empty",
    "text_error": "the transcript cannot be cleaned (e.g. a number num2words cannot spell in that language)",
    "unknown_token": "the cleaned transcript has characters the vocabulary lacks ([UNK]) or a [STOP] token",
    "text_too_long": "more text ids than the model's text positions",
    "codes_too_long": "more audio codes than the model's audio positions",
    "reference_missing": "the reference recording does not exist",
    "reference_unreadable": "libsndfile cannot read the reference recording",
    "reference_silent": "the reference recording is silent",
    "reference_too_short": "the reference recording is shorter than the minimum duration",
}


@dataclass(frozen=True)
class _Limits:
    min_samples: int
    max_samples: int
    max_text_tokens: int
    max_audio_codes: int
    code_stride: int


@dataclass
class _Record:
    key: str
    where: str
    status: str  # "kept" or a key of REASONS
    detail: str = ""
    seconds: float = 0.0  # of the clip, when it could be read
    text_tokens: int = 0
    audio_codes: int = 0
    digits: bool = False  # a new language's digits num2words cannot spell, kept as they are
    arrays: dict[str, Any] | None = field(default=None, repr=False)  # text, audio, ref_audio, ref_is_clip


@dataclass
class PrepareResult:
    """What ``prepare`` did; ``summary`` is also written to ``OUT/summary.json``."""
    out: Path
    train: Path
    eval: Path | None
    report: Path
    summary: dict[str, Any]
    audio_dir: Path | None = None  # the folder the transcript's relative audio paths start from
    missing_example: Path | None = None  # the first audio file (in transcript order) that does not exist

    def format_summary(self) -> str:
        s = self.summary
        lines = [f"prepared {s['kept']} of {s['samples']} samples ({s['hours_kept']:.3f} h of speech kept, "
                 f"{s['hours_read']:.3f} h read) into {self.out}"]
        for split in ("train", "eval"):
            if s["splits"].get(split):
                sp = s["splits"][split]
                lines.append(f"  {split}: {counted(sp['kept'], 'sample')} in "
                             f"{counted(sp['shards'], 'shard')} ({sp['hours']:.3f} h)")
        if s["dropped"]:
            lines.append("  dropped: " + ", ".join(f"{n} {r}" for r, n in sorted(s["dropped"].items()))
                         + f" (each listed in {self.report.name})")
        else:
            lines.append("  dropped: none")
        new = s.get("new_language")
        if new:
            lines.append(f"  new language [{new['language']}]: {new['added_tokens']} tokens added to XTTS v2's "
                         f"{new['base_size']} ({new['characters']} of them characters) in {self.out / 'vocab.json'}")
            if new.get("held_out_characters"):
                lines.append(f"  held-out text: {new['held_out_unk']} [UNK], {new['tokens_per_char']:.3f} tokens per "
                             f"character ({new['base_tokens_per_char']:.3f} with XTTS v2's vocabulary)")
            if new["digits"]:
                lines.append(f"  {len(new['digits'])} kept sample(s) still hold digits, which num2words cannot spell in "
                             f"{new['language']!r} (listed in {self.report.name}; write them out as words): "
                             + ", ".join(new["digits"][:5]) + (", ..." if len(new["digits"]) > 5 else ""))
        reused = s.get("vocab")
        if reused:
            lines.append(f"  vocabulary: {reused['from']} ({reused['size']} tokens, adding "
                         f"{', '.join('[' + c + ']' for c in reused['languages'])} to XTTS v2's), copied to "
                         f"{self.out / 'vocab.json'}")
            if reused["digits"]:
                lines.append(f"  {len(reused['digits'])} kept sample(s) still hold digits, which num2words cannot "
                             f"spell (listed in {self.report.name}; write them out as words): "
                             + ", ".join(reused["digits"][:5]) + (", ..." if len(reused["digits"]) > 5 else ""))
        lines += [f"  warning: {w}" for w in s.get("warnings", [])]
        if s["kept"]:
            lines.append(f"  {s['text_tokens_per_second']:.2f} text tokens and {s['audio_codes_per_second']:.2f} "
                         "audio codes per second of speech")
        lines.append(f"  {s['wall_seconds']:.1f} s wall time for {s['processed_seconds']:.1f} s of audio "
                     f"({s['audio_seconds_per_second']:.1f} s of audio per second; "
                     f"{counted(s['workers'], 'worker')}, "
                     f"{counted(s['shards_resumed'], 'shard')} kept from an earlier run)")
        return "\n".join(lines)


# ---- one sample ----------------------------------------------------------------------

_ASSETS: XTTSAssets | None = None
_LIMITS: _Limits | None = None


def _init_worker(xtts_dir: str, limits: _Limits, vocab: str | None = None) -> None:
    """Loads the checkpoint's assets; ``vocab``: an extended vocabulary to tokenize with.
    A worker process ignores Ctrl-C, which a terminal sends to the whole group: the main
    process stops, the workers finish the clips in flight (killed mid-reply, a worker left
    half a result in the pipe, and the pool's shutdown waited on it forever)."""
    global _ASSETS, _LIMITS
    if multiprocessing.parent_process() is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _ASSETS, _LIMITS = XTTSAssets.load(xtts_dir), limits
    if vocab is not None:
        _ASSETS.tokenizer = XTTSTokenizer(vocab)


def _read_clip(path: Path, limits: _Limits) -> tuple[np.ndarray | None, str, str]:
    """(wav, reason, detail): wav None when the clip cannot be used."""
    if not path.exists():
        return None, "missing", f"{path} does not exist"
    try:
        wav = load_audio(path)
    except AudioError as exc:
        return None, "unreadable", str(exc)
    if wav.shape[0] < limits.min_samples:
        return wav, "too_short", f"{wav.shape[0] / SAMPLE_RATE:.3f} s < {limits.min_samples / SAMPLE_RATE:.3f} s"
    if float(np.max(np.abs(wav))) < SILENCE_PEAK:
        return wav, "silent", f"peak {float(np.max(np.abs(wav))):.2e}"
    return wav, "", ""


_SPLIT_FILE = re.compile(r"(shard-\d{5}\.(npz|json)|mel_stats\.npy)(\.tmp-\d+)?")  # a crash leaves .tmp-<pid> (_files)
_TOP_FILES = ("prepare.json", "report.tsv", "summary.json")


def _foreign(out: Path, prepared: bool) -> list[Path]:
    """Files in ``out`` that an overwrite would remove but pyxtts prepare did not write:
    anything in ``train/`` or ``eval/`` but shards, listings and mel_stats.npy, and, in a
    folder that is not a prepare output, its top-level report/summary names."""
    found = [f for split in ("train", "eval") if (out / split).is_dir()
             for f in sorted((out / split).iterdir()) if not _SPLIT_FILE.fullmatch(f.name)]
    if not prepared:
        found += [out / n for n in _TOP_FILES if (out / n).exists()]
    return found


def _remove_split(folder: Path) -> None:
    """A split folder's shards, listings and mel_stats.npy; the folder when that empties it."""
    if not folder.is_dir():
        return
    for f in folder.iterdir():
        if _SPLIT_FILE.fullmatch(f.name):
            f.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()


def _remove_outputs(out: Path, prepared: bool) -> None:
    """What an earlier prepare wrote in ``out``, before it is prepared again (overwrite);
    FileExistsError, with nothing removed, when something else is there too."""
    foreign = _foreign(out, prepared)
    if foreign:
        raise FileExistsError(f"out: {str(out)!r} holds files pyxtts prepare did not write "
                              f"({', '.join(str(f.relative_to(out)) for f in foreign[:5])}"
                              + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
                              + "), which overwrite would delete; choose a new folder")
    for split in ("train", "eval"):
        _remove_split(out / split)
    for name in _TOP_FILES:
        (out / name).unlink(missing_ok=True)


def _in_order(pool: Any, items: list[Item], window: int) -> Iterator[_Record]:
    """``_process`` over ``items`` in the pool, in order, at most ``window`` clips in flight,
    so that a run that stops (Ctrl-C, an error) waits for those alone, not for every clip
    queued, and no worker has to be killed."""
    pending: deque = deque()
    ahead = iter(items)
    for item in itertools.islice(ahead, window):
        pending.append(pool.apply_async(_process, (item,)))
    while pending:
        record = pending.popleft().get()
        item = next(ahead, None)
        if item is not None:
            pending.append(pool.apply_async(_process, (item,)))
        yield record


def _process(item: Item) -> _Record:
    assets, limits = _ASSETS, _LIMITS
    assert assets is not None and limits is not None, "worker not initialised"
    rec = _Record(item.key, item.where, "kept")
    if not item.text.strip():
        rec.status = "text_empty"
        return rec
    tok = assets.tokenizer
    try:
        ids = tok.encode(item.text, item.language)
    except ImportError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the language's cleaning drops the sample
        rec.status, rec.detail = "text_error", f"{type(exc).__name__}: {exc}"
        return rec
    rec.text_tokens = len(ids)
    new_lang = item.language in tok.added_languages
    rec.digits = new_lang and not num2words_knows(item.language) and has_digits(tok.clean(item.text, item.language))
    bad = {t for t in ("[UNK]", "[STOP]") if tok.token_id(t) is not None and tok.token_id(t) in ids}
    wav, reason, detail = _read_clip(item.audio, limits)
    if wav is not None:
        rec.seconds = wav.shape[0] / SAMPLE_RATE
    if bad:
        rec.status, rec.detail = "unknown_token", _unknown_detail(tok, tok.clean(item.text, item.language), bad)
        return rec
    if len(ids) > limits.max_text_tokens:
        rec.status, rec.detail = "text_too_long", f"{len(ids)} ids > {limits.max_text_tokens} (--max-text-tokens)"
        return rec
    if reason:
        rec.status, rec.detail = reason, detail
        return rec
    assert wav is not None
    if wav.shape[0] > limits.max_samples:
        rec.status, rec.detail = "too_long", (f"{wav.shape[0] / SAMPLE_RATE:.2f} s ({wav.shape[0]} samples) > "
                                              f"{limits.max_samples / SAMPLE_RATE:.2f} s (--max-wav-samples "
                                              f"{limits.max_samples})")
        return rec
    n_codes = math.ceil(wav.shape[0] / limits.code_stride)  # what Coqui's GPT uses of the DVAE's codes
    if n_codes > limits.max_audio_codes:
        rec.status, rec.detail = "codes_too_long", f"{n_codes} codes > {limits.max_audio_codes}"
        return rec
    ref, ref_is_clip = wav, True
    if item.reference is not None:
        ref, reason, detail = _read_clip(item.reference, limits)
        if reason:  # missing, unreadable, too_short or silent
            rec.status, rec.detail = f"reference_{reason}", detail
            return rec
        ref_is_clip = False
    codes = assets.dvae.codes(mel_spectrogram(wav, assets.mel_stats, DVAE_MEL))
    if codes.shape[0] < n_codes:  # cannot happen with stride-2 convolutions over 1 + n // 256 frames
        raise RuntimeError(f"{item.where}: the DVAE gave {codes.shape[0]} codes for {wav.shape[0]} samples, "
                           f"fewer than the {n_codes} the GPT reads")
    rec.audio_codes = n_codes
    rec.arrays = {"text": np.asarray(ids, dtype=np.int64), "audio": codes[:n_codes], "ref_audio": ref,
                  "ref_is_clip": ref_is_clip}
    if rec.digits:
        rec.detail = f"kept with digits num2words cannot spell in {item.language!r}: {tok.clean(item.text, item.language)!r}"
    return rec


def _unknown_detail(tok: XTTSTokenizer, cleaned: str, bad: set[str]) -> str:
    """What makes a transcript's [UNK] (the characters the vocabulary lacks) or [STOP]."""
    parts = []
    if "[UNK]" in bad:
        missing = sorted({c for c in cleaned if c != " " and tok.token_id(c) is None})
        parts.append("[UNK]: the vocabulary lacks " + (" ".join(repr(c) for c in missing) if missing else
                                                      "a piece of it"))
    if "[STOP]" in bad:
        parts.append("[STOP]: the text holds the stop token")
    return f"{'; '.join(parts)} (in {cleaned!r})"


# ---- shards --------------------------------------------------------------------------

def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """An uncompressed .npz as np.savez writes it, with fixed timestamps (same bytes for
    the same arrays), written atomically (``pyxtts._files``: a failure names the file)."""
    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for key in sorted(arrays):
                info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                with zf.open(info, "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, np.asarray(arrays[key]), allow_pickle=False)

    write_atomic(path, write)


def _write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=1, ensure_ascii=False) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _write_npy(path: Path, array: np.ndarray) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.save adds ".npy" to a name without it
            np.save(f, array, allow_pickle=False)

    write_atomic(path, write)


def _item_fingerprint(item: Item) -> list:
    """What decides a sample's output: its transcript line and its audio files' size and time."""
    def stat(p: Path | None) -> list:
        if p is None:
            return []
        try:
            st = p.stat()
        except OSError:
            return [str(p)]
        return [str(p), st.st_size, st.st_mtime_ns]
    return [item.key, item.text, item.language, stat(item.audio), stat(item.reference)]


@dataclass
class _Shard:
    split: str
    index: int
    items: list[Item]
    folder: Path

    @property
    def npz(self) -> Path:
        return self.folder / f"shard-{self.index:05d}.npz"

    @property
    def listing(self) -> Path:
        return self.folder / f"shard-{self.index:05d}.json"

    def fingerprint(self) -> str:
        blob = json.dumps([_item_fingerprint(i) for i in self.items], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def finished(self) -> list[dict] | None:
        """The records of an earlier run of this very shard, or None."""
        if not self.listing.is_file():
            return None
        try:
            listing = json.loads(self.listing.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None
        if listing.get("items") != self.fingerprint():
            return None
        kept = any(r.get("status") == "kept" for r in listing["samples"])
        return listing["samples"] if kept == self.npz.is_file() else None

    def write(self, records: list[_Record]) -> list[dict]:
        kept = [r.arrays for r in records if r.status == "kept"]
        if kept:
            _write_npz(self.npz, shard_arrays(kept, f"{self.npz}: sample"))
        else:  # no file of 0 samples: a split whose every clip was dropped reads as having none
            self.npz.unlink(missing_ok=True)
        rows = [{k: v for k, v in asdict(r).items() if k != "arrays"} for r in records]
        _write_json(self.listing, {"format": FORMAT, "items": self.fingerprint(), "samples": rows})
        return rows


def _new_language_texts(items: list[Item], code: str) -> list[str]:
    """The cleaned transcripts of the new language (a manifest may mix in others)."""
    return [clean_new_language(it.text, code) for it in items if it.language == code]


def _held_out_figures(base: XTTSTokenizer, extended: XTTSTokenizer, texts: list[str]) -> dict[str, Any]:
    """[UNK] count and tokens per character of the held-out text under the extended and the
    base vocabulary (the language token and the text's own characters only, as encode sees them)."""
    unk = extended.token_id("[UNK]")
    n_ext = n_base = n_unk = chars = 0
    for t in texts:
        piece = t.replace(" ", "[SPACE]")
        ids = extended.tokenizer.encode(piece).ids
        n_ext += len(ids)
        n_unk += ids.count(unk) if unk is not None else 0
        n_base += len(base.tokenizer.encode(piece).ids)
        chars += len(t)
    return {"held_out_characters": chars, "held_out_unk": n_unk, "tokens_per_char": n_ext / chars if chars else 0.0,
            "base_tokens_per_char": n_base / chars if chars else 0.0}


def _check_enough_texts(texts: list[str], code: str) -> None:
    """A new language's tokens need at least two training transcripts (named by the
    metadata: ``extend_vocab`` would name its own argument)."""
    n = sum(1 for t in texts if t.strip())
    if n < 2:
        raise ValueError(f"metadata: a new language's tokens are learnt from its transcripts, and the training split "
                         f"has {n} non-empty one(s) in {code!r}; at least 2 are needed (thousands make good tokens)")


def _split(items: list[Item], eval_fraction: float, seed: int) -> tuple[list[Item], list[Item]]:
    if eval_fraction == 0:
        return items, []
    n_eval = max(1, round(eval_fraction * len(items)))
    if n_eval >= len(items):
        raise ValueError(f"eval_fraction: {eval_fraction} of {len(items)} samples leaves none for training")
    held = set(np.random.default_rng(seed).permutation(len(items))[:n_eval].tolist())
    return [it for i, it in enumerate(items) if i not in held], [it for i, it in enumerate(items) if i in held]


class _BlasThreads:
    """Splits the cores between worker processes: a spawned worker reads these variables
    when its BLAS loads (a user's own setting wins)."""
    NAMES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

    def __init__(self, workers: int) -> None:
        self.n = str(max(1, (os.cpu_count() or 1) // workers))
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for name in self.NAMES:
            self.saved[name] = os.environ.get(name)
            os.environ.setdefault(name, self.n)

    def __exit__(self, *exc: Any) -> None:
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _progress(enabled: bool, total: int, initial: int):
    from tqdm import tqdm

    live = enabled and (sys.stderr.isatty() or "ipykernel" in sys.modules)
    return tqdm(total=total, initial=initial, unit="clip", desc="prepare", dynamic_ncols=True, mininterval=0.5,
                file=sys.stderr, disable=not live)


def prepare(xtts_dir: str | os.PathLike, metadata: str | os.PathLike, out: str | os.PathLike,
            language: str = "en", audio_dir: str | os.PathLike | None = None, eval_fraction: float = 0.0,
            workers: int = 1, samples_per_shard: int = 256, seed: int = 0, overwrite: bool = False,
            max_wav_samples: int = MAX_WAV_SAMPLES, min_seconds: float = MIN_SECONDS,
            max_text_tokens: int | None = None, metadata_format: str | None = None,
            progress: bool = True, new_language: bool = False, new_tokens: int = DEFAULT_NEW_TOKENS,
            vocab: str | os.PathLike | None = None) -> PrepareResult:
    """Turns a transcript file and its recordings into training shards for XTTS v2.

    ``xtts_dir``: the XTTS v2 checkpoint folder (``config.json``, ``vocab.json``, ``dvae.pth``,
    ``mel_stats.pth``). ``metadata``: LJSpeech ``metadata.csv``, Coqui's ``audio_file|text|
    speaker_name`` CSV or a JSON-lines manifest (``pyxtts.prepare.sources``; detected, or
    ``metadata_format``). ``audio_dir``: where the audio paths point (defaults there).
    ``language``: the transcripts' language (a manifest line's ``language`` wins). ``out``: the
    output folder (see the module docstring); an existing one from the same inputs and
    settings is resumed, one from others is refused unless ``overwrite``.
    ``eval_fraction``: the share of samples held out (seeded by ``seed``) into ``OUT/eval``.
    ``workers``: processes (each gets its share of the cores). Limits, as Coqui's trainer:
    ``max_wav_samples`` at 22,050 Hz, ``min_seconds``, ``max_text_tokens`` (default: the
    model's ``gpt_max_text_tokens``); audio codes must fit the model's audio positions.
    ``new_language``: ``language`` is one XTTS v2 does not speak; ``new_tokens`` BPE tokens
    extend the vocabulary (``OUT/vocab.json``, ``pyxtts.prepare.vocab``): the characters of
    both splits' transcripts, then merges learnt from the training split's alone. The ids
    are that vocabulary's.
    ``vocab``: such an extended vocabulary (an earlier ``OUT/vocab.json``, or the
    ``vocab.json`` of an export that speaks the language), used as it is: more recordings of
    a language already taught get the ids the model learnt. Copied to ``OUT/vocab.json``.
    """
    # as plain ints and floats: they go into the output's settings file (JSON)
    eval_fraction = real("eval_fraction", eval_fraction, minimum=0.0, maximum=1.0, below=True)
    workers = integer("workers", workers, minimum=1)
    samples_per_shard = integer("samples_per_shard", samples_per_shard, minimum=1)
    seed = integer("seed", seed)
    max_wav_samples = integer("max_wav_samples", max_wav_samples, minimum=1)
    min_seconds = real("min_seconds", min_seconds, minimum=0.0, above=True)
    if max_text_tokens is not None:
        max_text_tokens = integer("max_text_tokens", max_text_tokens, minimum=1)
    overwrite = flag("overwrite", overwrite)
    new_language = flag("new_language", new_language)
    if new_language and vocab is not None:
        raise ValueError(f"vocab: {str(vocab)!r} is a vocabulary to reuse, and new_language=True learns a new one; "
                         "pass one of them (the vocabulary for more recordings of a language already taught, "
                         "new_language=True for a language not taught yet)")
    new_code = check_new_language(language) if new_language else None
    if new_language:
        new_tokens = integer("new_tokens", new_tokens, minimum=1, maximum=MAX_NEW_TOKENS)
    start = time.perf_counter()
    folder = XTTSAssets.check_folder(xtts_dir)
    assets = XTTSAssets.load(folder)
    reused = None if vocab is None else _reused_vocab(path_arg("vocab", vocab), folder)
    added = (new_code,) if new_code is not None else reused[2] if reused is not None else ()
    items = read_metadata(metadata, audio_dir, language, metadata_format, added)
    audio_base = audio_folder(metadata, audio_dir, metadata_format)
    for lang in sorted({it.language for it in items} - {new_code}):  # a missing package fails now, not per sample
        try:
            clean_text("1 a.", lang)
        except ImportError:
            raise
        except Exception:  # noqa: BLE001 - a num2words gap shows per sample as text_error
            pass
    lim = assets.limits
    limits = _Limits(min_samples=math.ceil(min_seconds * SAMPLE_RATE), max_samples=max_wav_samples,
                     max_text_tokens=max_text_tokens or lim.max_text_tokens,
                     max_audio_codes=lim.max_audio_codes, code_stride=lim.code_stride)
    settings = {"format": FORMAT, "xtts_files": XTTSAssets.fingerprint(folder), "limits": asdict(limits),
                "eval_fraction": eval_fraction, "seed": seed, "samples_per_shard": samples_per_shard,
                "language": language}
    train_items, eval_items = _split(items, eval_fraction, seed)
    vocab_doc = None
    if new_code is not None:  # before anything is written: a refusal leaves the folder as it was
        base_doc = read_vocab_doc(folder / "vocab.json")
        texts = _new_language_texts(train_items, new_code)
        _check_enough_texts(texts, new_code)
        vocab_doc, ext = extend_vocab(base_doc, texts, new_code, new_tokens,
                                      held_out=_new_language_texts(eval_items, new_code))
        settings["new_language"] = {"language": new_code, "new_tokens": new_tokens,
                                    "vocab_sha256": vocab_sha256(vocab_doc)}
    elif reused is not None:
        vocab_doc = reused[0]
        settings["vocab_sha256"] = vocab_sha256(vocab_doc)

    out = Path(out)
    manifest = out / "prepare.json"
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"out: {str(out)!r} is a file; the output is a folder (new, or an earlier "
                                 "prepare's)")
    lock = _hold_output(out)
    try:
        if out.exists() and any(out.iterdir()):
            previous = None
            if manifest.is_file():
                try:
                    previous = json.loads(manifest.read_text(encoding="utf-8")).get("settings")
                except (OSError, json.JSONDecodeError):
                    previous = None
            if previous != settings:
                if not overwrite:
                    what = "was prepared from other inputs or settings" if manifest.is_file() else \
                        "is not an output folder of pyxtts prepare"
                    changed = []
                    if isinstance(previous, dict):  # the XTTS folder's files in words, not digests
                        files = previous.get("xtts_files") != settings["xtts_files"]
                        changed = (["the XTTS folder's files differ"] if files else []) + setting_changes(
                            {k: v for k, v in previous.items() if k != "xtts_files"},
                            {k: v for k, v in settings.items() if k != "xtts_files"}, absent_too=True)
                    if changed:
                        what += f" ({'; '.join(changed)})"
                    raise FileExistsError(f"out: {str(out)!r} {what}; choose a new folder, or pass overwrite=True to "
                                          "replace its shards")
                _remove_outputs(out, prepared=manifest.is_file())
        out.mkdir(parents=True, exist_ok=True)
        for place in (out, out / "train", out / "eval"):  # what a run killed mid-write left
            remove_stale_temps(place)
        vocab_path = None
        if vocab_doc is not None:
            vocab_path = out / "vocab.json"
            _write_json(vocab_path, vocab_doc)
        elif (out / "vocab.json").exists():  # from an earlier --new-language run of this folder (overwritten)
            (out / "vocab.json").unlink()
        _write_json(manifest, {"settings": settings, "metadata": str(Path(metadata).resolve())})
        shards: list[_Shard] = []
        for split, split_items in (("train", train_items), ("eval", eval_items)):
            sub = out / split
            if not split_items:
                _remove_split(sub)
                continue
            sub.mkdir(exist_ok=True)
            # the trainer computes each step's reference-slice mels with the checkpoint's normalisation
            _write_npy(sub / "mel_stats.npy", np.asarray(assets.mel_stats, dtype=np.float64))
            n = math.ceil(len(split_items) / samples_per_shard)
            shards += [_Shard(split, j, split_items[j * samples_per_shard:(j + 1) * samples_per_shard], sub)
                       for j in range(n)]
            for stale in list(sub.glob("shard-*.npz")) + list(sub.glob("shard-*.json")):
                index = stale.stem.removeprefix("shard-")
                if index.isdigit() and int(index) >= n:  # from an earlier, longer transcript
                    stale.unlink()

        rows: dict[tuple[str, int], list[dict]] = {}
        todo: list[_Shard] = []
        for sh in shards:
            done = sh.finished()
            if done is None:
                todo.append(sh)
            else:
                rows[(sh.split, sh.index)] = done
        queue = [it for sh in todo for it in sh.items]
        bar = _progress(progress, len(items), len(items) - len(queue))
        try:
            if workers == 1 or len(queue) <= 1:
                _init_worker(str(folder), limits, None if vocab_path is None else str(vocab_path))
                results = map(_process, queue)
                pool = None
            else:
                with _BlasThreads(workers):
                    pool = multiprocessing.get_context("spawn").Pool(
                        min(workers, len(queue)), _init_worker,
                        (str(folder), limits, None if vocab_path is None else str(vocab_path)))
                results = _in_order(pool, queue, 2 * workers)
            try:
                for sh in todo:
                    records = []
                    for _ in sh.items:
                        records.append(next(results))
                        bar.update(1)
                    rows[(sh.split, sh.index)] = sh.write(records)
            finally:
                if pool is not None:  # after the clips in flight, at most 2 per worker
                    pool.close()
                    pool.join()
        finally:
            bar.close()

        now = {(sh.split, sh.index) for sh in todo}
        result = _finish(out, shards, rows, now, len(items), workers, time.perf_counter() - start, audio_base)
        if result.summary["dropped"].get("missing"):
            result.missing_example = next((it.audio for it in items if not it.audio.exists()), None)
        if reused is not None:
            result.summary["vocab"] = {"from": str(vocab), "vocab": str(vocab_path), "size": reused[1].size,
                                       "languages": list(reused[2]), "vocab_sha256": vocab_sha256(vocab_doc),
                                       "digits": _digit_keys(shards, rows)}
            _write_json(out / "summary.json", result.summary)
        if vocab_path is not None and new_code is not None:
            new = {"language": new_code, "base_size": ext.base_size, "size": ext.size,
                   "added_tokens": len(ext.added) - 1, "characters": ext.characters, "requested_tokens": new_tokens,
                   "vocab": str(vocab_path), "vocab_sha256": vocab_sha256(vocab_doc),
                   "digits": _digit_keys(shards, rows)}
            held = _new_language_texts(eval_items, new_code)
            if held:
                new.update(_held_out_figures(assets.tokenizer, XTTSTokenizer(vocab_path), held))
            result.summary["new_language"] = new
            _write_json(out / "summary.json", result.summary)
        return result
    finally:
        if lock is not None:
            os.close(lock)


def _hold_output(out: Path) -> int | None:
    """The lock on ``out`` (``pyxtts._files.lock_folder``; the folder is made) that makes this
    run its only writer until it ends, however it ends: a second prepare into it would
    remove (with overwrite) or interleave the shards of the first, which would still say
    it had finished."""
    try:
        return lock_folder(out)
    except BlockingIOError:
        pid = lock_holder(out)
        raise BlockingIOError(errno.EAGAIN, f"out: {str(out)!r} is in use by another pyxtts prepare"
                                            + (f" (process {pid})" if pid is not None else "")
                                            + ": wait for it to end, or prepare into another folder") from None


def _digit_keys(shards: list[_Shard], rows: dict[tuple[str, int], list[dict]]) -> list[str]:
    """The kept samples of an added language whose text still holds digits."""
    return [r["key"] for sh in shards for r in rows[(sh.split, sh.index)] if r["status"] == "kept" and r.get("digits")]


def _reused_vocab(path: Path, folder: Path) -> tuple[dict, Any, tuple[str, ...]]:
    """(document, its VocabExtension, the languages it adds) of ``prepare(vocab=)``: an
    extension of the XTTS folder's vocabulary that adds a language (ValueError otherwise)."""
    doc = read_vocab_doc(path)
    ext = vocab_extension(read_vocab_doc(folder / "vocab.json"), doc, where="vocab")
    languages = XTTSTokenizer(path).added_languages
    if not languages:
        raise ValueError(f"vocab: {str(path)!r} adds no language to {folder / 'vocab.json'} (its languages are XTTS "
                         "v2's own); prepare without it, with the XTTS folder's own vocabulary")
    return doc, ext, languages


def _finish(out: Path, shards: list[_Shard], rows: dict[tuple[str, int], list[dict]], now: set[tuple[str, int]],
            n_items: int, workers: int, wall: float, audio_dir: Path) -> PrepareResult:
    report = out / "report.tsv"
    lines = ["split\tshard\tkey\tstatus\tseconds\ttext_tokens\taudio_codes\tdetail\twhere"]
    dropped: Counter = Counter()
    splits: dict[str, dict[str, Any]] = {}
    kept = 0
    sec_read = sec_kept = processed = 0.0
    text_tok = codes = 0
    for sh in shards:
        sp = splits.setdefault(sh.split, {"samples": 0, "kept": 0, "shards": 0, "hours": 0.0, "dropped": {}})
        sp["samples"] += len(rows[(sh.split, sh.index)])
        sp["shards"] += any(r["status"] == "kept" for r in rows[(sh.split, sh.index)])  # the .npz files
        for r in rows[(sh.split, sh.index)]:
            clean = [str(r[k]).replace("\t", " ").replace("\n", " ") for k in ("key", "detail", "where")]
            lines.append(f"{sh.split}\t{sh.index}\t{clean[0]}\t{r['status']}\t{r['seconds']:.3f}\t"
                         f"{r['text_tokens']}\t{r['audio_codes']}\t{clean[1]}\t{clean[2]}")
            sec_read += r["seconds"]
            if (sh.split, sh.index) in now:
                processed += r["seconds"]
            if r["status"] == "kept":
                kept += 1
                sp["kept"] += 1
                sp["hours"] += r["seconds"] / 3600
                sec_kept += r["seconds"]
                text_tok += r["text_tokens"]
                codes += r["audio_codes"]
            else:
                dropped[r["status"]] += 1
                sp["dropped"][r["status"]] = sp["dropped"].get(r["status"], 0) + 1
    text = "\n".join(lines) + "\n"
    write_atomic(report, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    summary = {
        "samples": n_items, "kept": kept, "dropped": dict(sorted(dropped.items())),
        "hours_read": sec_read / 3600, "hours_kept": sec_kept / 3600, "splits": splits,
        "text_tokens_per_second": text_tok / sec_kept if sec_kept else 0.0,
        "audio_codes_per_second": codes / sec_kept if sec_kept else 0.0,
        "wall_seconds": wall, "workers": workers, "shards": len(shards),
        "shards_resumed": len(shards) - len(now),
        "processed_seconds": processed, "audio_seconds_per_second": processed / wall if wall else 0.0,
        "warnings": (_split_warnings(splits, report.name) + _duplicate_warnings(shards, rows)
                     + _sparse_text_warnings(shards, rows, report.name)),
    }
    _write_json(out / "summary.json", summary)
    held = out / "eval" if splits.get("eval", {}).get("kept") else None
    return PrepareResult(out, out / "train", held, report, summary, audio_dir)


def _duplicate_warnings(shards: list[_Shard], rows: dict[tuple[str, int], list[dict]]) -> list[str]:
    """A line when ids repeat: a repeated line of the metadata, kept each time, may land in
    both splits, and the evaluation then measures clips the model trained on."""
    splits: dict[str, set[str]] = {}
    for sh in shards:
        for r in rows[(sh.split, sh.index)]:
            splits.setdefault(r["key"], set()).add(sh.split)
    seen = Counter(r["key"] for sh in shards for r in rows[(sh.split, sh.index)])
    repeated = [(k, n) for k, n in seen.items() if n > 1]
    if not repeated:
        return []
    both = sum(1 for k, _ in repeated if len(splits[k]) > 1)
    shown = ", ".join(f"{k} x{n}" for k, n in repeated[:3]) + (" ..." if len(repeated) > 3 else "")
    verb = "appears" if len(repeated) == 1 else "appear"
    return [f"{counted(len(repeated), 'id')} {verb} more than once in the metadata ({shown}), each kept as a "
            f"sample" + (f"; {both} of them in both splits, so the evaluation measures clips the model trains on"
                         if both else "")]


# speech carries 10-15 XTTS text ids a second; a clip of seconds with fewer than this many
# a second likely has another column's words for its transcript (a speaker name, an id)
SPARSE_TEXT_PER_SECOND = 2.0
SPARSE_TEXT_MIN_SECONDS = 2.0


def _sparse_text_warnings(shards: list[_Shard], rows: dict[tuple[str, int], list[dict]], report: str) -> list[str]:
    """A line for kept clips whose transcripts are far too short for their audio: kept (it
    may be a long pause), but said, since a metadata column mix-up looks exactly so."""
    sparse = [r for sh in shards for r in rows[(sh.split, sh.index)]
              if r["status"] == "kept" and r["seconds"] >= SPARSE_TEXT_MIN_SECONDS
              and r["text_tokens"] < SPARSE_TEXT_PER_SECOND * r["seconds"]]
    if not sparse:
        return []
    shown = ", ".join(f"{r['key']} ({r['text_tokens']} ids for {r['seconds']:.1f} s)" for r in sparse[:3])
    return [f"{counted(len(sparse), 'kept clip')} {'has' if len(sparse) == 1 else 'have'} fewer than "
            f"{SPARSE_TEXT_PER_SECOND:g} text ids a second of audio ({shown}{', ...' if len(sparse) > 3 else ''}): "
            f"is the transcript another column (a speaker's name)? {report} lists every clip's ids and seconds"]


def _split_warnings(splits: dict[str, dict[str, Any]], report: str) -> list[str]:
    """A line for an evaluation split that lost samples and for a split left empty: the
    eval loss is then measured on fewer clips than asked for, or on none."""
    out = []
    for name, sp in splits.items():
        lost = sp["samples"] - sp["kept"]
        if lost == 0 or (name == "train" and sp["kept"]):
            continue
        why = ", ".join(f"{n} {r}" for r, n in sorted(sp["dropped"].items()))
        if sp["kept"] == 0:
            use = ("train has no evaluation from this folder (--eval-data gives it one)" if name == "eval"
                   else "there is nothing to train on")
            out.append(f"the {name} split is empty: all {counted(sp['samples'], 'sample')} were dropped ({why}); "
                       f"no {name} shard was written, so {use} (each reason in {report})")
        else:
            out.append(f"the eval split lost {lost} of its {counted(sp['samples'], 'sample')} ({why}); it holds "
                       f"{sp['kept']} (each reason in {report})")
    return out

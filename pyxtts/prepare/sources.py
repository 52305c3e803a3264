"""The three transcript formats ``pyxtts prepare`` reads, as one list of ``Item``s.

- LJSpeech: ``metadata.csv`` lines ``id|text|normalized text`` (no header); the audio is
  ``<audio_dir>/<id>.wav`` with ``audio_dir`` defaulting to ``wavs/`` beside the file; the
  third column is the text (as Coqui's ``ljspeech`` formatter takes it).
- Coqui's fine-tuning CSV: ``|``-separated with the header ``audio_file|text|speaker_name``
  (more columns allowed), read as Python's csv module reads it (Coqui's ``coqui`` formatter);
  ``audio_file`` is relative to ``audio_dir`` (default: the CSV's folder).
- JSON lines (a ``.jsonl`` or ``.json`` file): ``{"audio": ..., "text": ..., "language": ...,
  "reference": ...}``, the last two optional; paths relative to ``audio_dir`` (default: the
  manifest's folder). ``reference`` is a separate recording of the same voice to draw the
  conditioning slices from, instead of the clip itself.

Each is UTF-8 text; a byte-order mark at its start (as some editors write) is skipped. A
file in another encoding is a ``MetadataError`` naming its first line that is not UTF-8.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pyxtts.data import json_records
from pyxtts.prepare.text import normalize_language

__all__ = ["Item", "MetadataError", "audio_folder", "read_metadata", "detect_format"]


class MetadataError(ValueError):
    """A transcript file that cannot be read; names the file and line."""


@dataclass(frozen=True)
class Item:
    key: str  # the sample's name: LJSpeech id, or the audio path as written
    audio: Path
    text: str
    language: str  # normalised ("en", "zh", ...)
    reference: Path | None
    where: str  # file:line, for messages


def detect_format(path: Path) -> str:
    """"jsonl", "coqui" (a header line starting with audio_file) or "ljspeech"."""
    if path.suffix.lower() in (".jsonl", ".json"):
        return "jsonl"
    # only the header matters here: a byte that is not UTF-8 is reported by the reader, with its line
    with open(path, encoding="utf-8-sig", errors="replace") as fh:
        first = fh.readline()
    return "coqui" if first.split("|")[0].strip() == "audio_file" else "ljspeech"


def read_utf8(path: Path) -> str:
    """The text of a transcript file (a byte-order mark skipped); a MetadataError naming the
    file and the first line that is not UTF-8, with how to fix it."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise MetadataError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {column}); save "
                            "the file as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8, or your editor's encoding setting)"
                            ) from exc


def _resolve(base: Path, value: str) -> Path:
    p = Path(value)
    return p if p.is_absolute() else base / p


def _ljspeech(path: Path, audio_dir: Path, language: str) -> list[Item]:
    items = []
    with io.StringIO(read_utf8(path)) as fh:  # universal newlines, as open() reads them
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            cols = line.rstrip("\r\n").split("|")
            where = f"{path}:{lineno}"
            if len(cols) < 2:
                raise MetadataError(f"{where}: LJSpeech lines are id|text|normalized text (or id|text), got "
                                    f"{len(cols)} column: {line.strip()[:80]!r}")
            # the normalized text as Coqui's formatter reads it; id|text, which many corpora
            # write (and Coqui's formatter refuses), is read as its text
            text = cols[2] if len(cols) >= 3 else cols[1]
            items.append(Item(cols[0], audio_dir / f"{cols[0]}.wav", text, language, None, where))
    return items


def _coqui(path: Path, audio_dir: Path, language: str) -> list[Item]:
    items = []
    with io.StringIO(read_utf8(path), newline="") as fh:
        reader = csv.DictReader(fh, delimiter="|")
        if not reader.fieldnames or "audio_file" not in reader.fieldnames or "text" not in reader.fieldnames:
            raise MetadataError(f"{path}:1: expected the header audio_file|text|speaker_name, got "
                                f"{'|'.join(reader.fieldnames or [])!r}")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            audio, text = row.get("audio_file"), row.get("text")
            if audio is None or text is None:
                raise MetadataError(f"{where}: audio_file or text column missing")
            items.append(Item(audio, _resolve(audio_dir, audio), text, language, None, where))
    return items


def _jsonl(path: Path, audio_dir: Path, language: str, added: tuple[str, ...] = ()) -> list[Item]:
    items = []
    for where, rec in json_records(path, io.StringIO(read_utf8(path)), MetadataError):
        if not isinstance(rec, dict) or not isinstance(rec.get("audio"), str) \
                or not isinstance(rec.get("text"), str):
            raise MetadataError(f"{where}: expected an object with string 'audio' and 'text' (and optional "
                                f"'language', 'reference'), got {json.dumps(rec)[:80]}")
        ref = rec.get("reference")
        if ref is not None and not isinstance(ref, str):
            raise MetadataError(f"{where}: 'reference' must be a path (a string), got {ref!r}")
        try:
            lang = normalize_language(rec.get("language", language), added)
        except (TypeError, ValueError) as exc:
            raise MetadataError(f"{where}: {exc}") from exc
        items.append(Item(rec["audio"], _resolve(audio_dir, rec["audio"]), rec["text"], lang,
                          None if ref is None else _resolve(audio_dir, ref), where))
    return items


def audio_folder(metadata: str | os.PathLike, audio_dir: str | os.PathLike | None, fmt: str | None = None) -> Path:
    """The folder a transcript's relative audio paths start from: ``audio_dir`` when given,
    else ``wavs/`` beside an LJSpeech file, else the transcript's folder."""
    path = Path(metadata)
    if audio_dir is not None:
        return Path(audio_dir)
    return path.parent / "wavs" if (fmt or detect_format(path)) == "ljspeech" else path.parent


def read_metadata(metadata: str | os.PathLike, audio_dir: str | os.PathLike | None, language: str,
                  fmt: str | None = None, added: tuple[str, ...] = ()) -> list[Item]:
    """Every sample of a transcript file, in file order (format detected unless ``fmt``);
    ``added``: the languages XTTS v2 does not speak that the lines may name (a new language)."""
    path = Path(metadata)
    if not path.is_file():
        raise FileNotFoundError(f"metadata: {str(path)!r} is not a file")
    lang = normalize_language(language, added)
    fmt = fmt or detect_format(path)
    if fmt not in ("ljspeech", "coqui", "jsonl"):
        raise ValueError(f"fmt: expected 'ljspeech', 'coqui' or 'jsonl', got {fmt!r}")
    base = audio_folder(path, audio_dir, fmt)
    if audio_dir is not None and not base.is_dir():
        raise FileNotFoundError(f"audio_dir: {str(base)!r} is not a folder")
    reader = {"ljspeech": _ljspeech, "coqui": _coqui, "jsonl": _jsonl}[fmt]
    items = reader(path, base, lang, added) if fmt == "jsonl" else reader(path, base, lang)
    if not items:
        raise MetadataError(f"{path}: no samples in it")
    return items

"""XTTS v2's text tokenizer on the ``tokenizers`` library: the ids Coqui's
``VoiceBpeTokenizer(vocab.json).encode(text, lang)`` gives, from the same ``vocab.json``."""
from __future__ import annotations

import os
from pathlib import Path

from pyxtts.prepare._deps import require
from pyxtts.prepare.cleaners import LANGUAGES, clean_text

__all__ = ["XTTSTokenizer", "LANGUAGES", "normalize_language"]


def normalize_language(language: str) -> str:
    """"en-US" -> "en", "zh-cn" -> "zh"; ValueError naming ``language`` for one XTTS v2 lacks."""
    if not isinstance(language, str):
        raise TypeError(f"language: expected a str such as 'en', got {type(language).__name__}")
    lang = language.split("-")[0]
    if lang not in LANGUAGES:
        raise ValueError(f"language: expected one of {', '.join(LANGUAGES)} (a region suffix such as "
                         f"'-US' is ignored), got {language!r}")
    return lang


class XTTSTokenizer:
    """``XTTSTokenizer("XTTS_DIR/vocab.json").encode(text, "en")`` -> list of ids: the
    language's cleaning (``pyxtts.prepare.cleaners``), the ``[lang]`` prefix (``[zh-cn]`` for
    Chinese), every space written ``[SPACE]``, then the BPE model of ``vocab.json``."""

    def __init__(self, vocab_file: str | os.PathLike) -> None:
        tokenizers = require("tokenizers", "XTTS's text tokenizer")
        path = Path(vocab_file)
        try:
            self.tokenizer = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception subclass
            raise ValueError(f"vocab_file: {str(path)!r} is not a tokenizers JSON file ({exc})") from exc
        self.path = path

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        """Largest id + 1 (Coqui's ``get_number_tokens``)."""
        return max(self.tokenizer.get_vocab().values()) + 1

    def clean(self, text: str, language: str) -> str:
        return clean_text(text, normalize_language(language))

    def encode(self, text: str, language: str) -> list[int]:
        lang = normalize_language(language)
        cleaned = clean_text(text, lang)
        tag = "zh-cn" if lang == "zh" else lang
        return self.tokenizer.encode(f"[{tag}]{cleaned}".replace(" ", "[SPACE]")).ids

"""XTTS v2's text tokenizer on the ``tokenizers`` library: the ids Coqui's
``VoiceBpeTokenizer(vocab.json).encode(text, lang)`` gives, from the same ``vocab.json``."""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from pyxtts.prepare._deps import require
from pyxtts.prepare.cleaners import LANGUAGES, clean_new_language, clean_text

__all__ = ["XTTSTokenizer", "LANGUAGES", "normalize_language"]


def normalize_language(language: str, added: Iterable[str] = ()) -> str:
    """"en-US" -> "en", "zh-cn" -> "zh"; ValueError naming ``language`` for one XTTS v2 lacks
    and ``added`` (the languages an extended vocabulary adds) does not name."""
    if not isinstance(language, str):
        raise TypeError(f"language: expected a str such as 'en', got {type(language).__name__}")
    lang = language.split("-")[0]
    if lang not in LANGUAGES and lang not in added:
        known = ", ".join((*LANGUAGES, *added))
        raise ValueError(f"language: expected one of {known} (a region suffix such as '-US' is ignored; "
                         f"`pyxtts prepare --new-language` teaches XTTS v2 another, and `--vocab` reuses the vocabulary of "
                         f"one taught before), got {language!r}")
    return lang


_LANGUAGE_TOKEN_RE = re.compile(r"\[([a-z]{2,3})\]")


class XTTSTokenizer:
    """``XTTSTokenizer("XTTS_DIR/vocab.json").encode(text, "en")`` -> list of ids: the
    language's cleaning (``pyxtts.prepare.cleaners``), the ``[lang]`` prefix (``[zh-cn]`` for
    Chinese), every space written ``[SPACE]``, then the BPE model of ``vocab.json``. A
    vocabulary extended by ``prepare --new-language`` also speaks its added language, cleaned
    by ``cleaners.clean_new_language``."""

    def __init__(self, vocab_file: str | os.PathLike) -> None:
        tokenizers = require("tokenizers", "XTTS's text tokenizer")
        path = Path(vocab_file)
        try:
            self.tokenizer = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception subclass
            raise ValueError(f"vocab_file: {str(path)!r} is not a tokenizers JSON file ({exc})") from exc
        self.path = path
        # the codes of the [code] tokens of languages XTTS v2 does not speak (those a
        # ``prepare --new-language`` vocabulary added), in id order
        found = [(i, m.group(1)) for t, i in self.tokenizer.get_vocab().items()
                 if (m := _LANGUAGE_TOKEN_RE.fullmatch(t)) and m.group(1) not in (*LANGUAGES, "zh-cn")]
        self.added_languages: tuple[str, ...] = tuple(code for _, code in sorted(found))

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        """Largest id + 1 (Coqui's ``get_number_tokens``)."""
        return max(self.tokenizer.get_vocab().values()) + 1

    def clean(self, text: str, language: str) -> str:
        lang = normalize_language(language, self.added_languages)
        return clean_text(text, lang) if lang in LANGUAGES else clean_new_language(text, lang)

    def encode(self, text: str, language: str) -> list[int]:
        lang = normalize_language(language, self.added_languages)
        cleaned = self.clean(text, lang)
        tag = "zh-cn" if lang == "zh" else lang
        return self.tokenizer.encode(f"[{tag}]{cleaned}".replace(" ", "[SPACE]")).ids

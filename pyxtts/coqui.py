"""Helpers for a Coqui ``Xtts`` model that pyxtts trained (needs coqui-tts; nothing here
imports it).

``enable_language(model, "vi")``: Coqui's ``VoiceBpeTokenizer`` refuses a language it does
not know (``NotImplementedError: Language 'vi' is not supported``), and ``Xtts.synthesize``
checks ``config.languages``. This lets one loaded model speak a language that ``pyxtts
prepare --new-language`` added: the model's own tokenizer object cleans that language's
text with pyxtts's cleaner (``pyxtts.prepare.cleaners.clean_new_language``, the cleaning its
training text had) and hands every other language to Coqui's own code; the code joins
``config.languages`` and the tokenizer's character limits. No installed file is edited, no
class is patched: other models and tokenizers are untouched.
"""
from __future__ import annotations

from typing import Any

__all__ = ["enable_language"]

DEFAULT_CHAR_LIMIT = 250  # Coqui's limit for a language it has no figure for (its warning threshold)


def enable_language(model: Any, language: str, char_limit: int = DEFAULT_CHAR_LIMIT) -> None:
    """Lets ``model`` (a Coqui ``Xtts`` whose vocabulary has the ``[language]`` token) take
    ``language=...`` in ``inference``, ``synthesize`` and ``tokenizer.encode`` (module
    docstring). Idempotent. ``char_limit``: the text length past which Coqui warns and, with
    text splitting on, splits sentences."""
    from pyxtts.prepare.cleaners import LANGUAGES, check_language_code, clean_new_language

    code = check_language_code(language)
    if code in LANGUAGES:
        raise ValueError(f"language: XTTS v2 already speaks {code!r}; enable_language is for a language "
                         "`pyxtts prepare --new-language` added")
    if isinstance(char_limit, bool) or not isinstance(char_limit, int) or char_limit < 1:
        raise ValueError(f"char_limit: expected a positive int, got {char_limit!r}")
    tokenizer = getattr(model, "tokenizer", None)
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is None or not hasattr(tokenizer, "preprocess_text"):
        raise TypeError(f"model: expected a loaded Coqui Xtts (with .tokenizer, a VoiceBpeTokenizer), got "
                        f"{type(model).__name__}")
    if inner.token_to_id(f"[{code}]") is None:
        raise ValueError(f"language: the model's vocabulary has no [{code}] token; load the folder `pyxtts export "
                         "--vocab` wrote for this language")
    added = getattr(tokenizer, "_pyxtts_languages", None)
    if added is None:
        coqui_preprocess = tokenizer.preprocess_text  # the bound method of this one tokenizer
        added = set()

        def preprocess_text(txt: str, lang: str) -> str:
            return clean_new_language(txt, lang) if lang in added else coqui_preprocess(txt, lang)

        tokenizer.preprocess_text = preprocess_text
        tokenizer._pyxtts_languages = added
    added.add(code)
    tokenizer.char_limits.setdefault(code, char_limit)
    config = getattr(model, "config", None)
    languages = getattr(config, "languages", None)
    if isinstance(languages, list) and code not in languages:
        languages.append(code)

"""The GPT's text rows grown to a vocabulary that extends its own (``prepare --new-language``).

``resize_text_rows(state, config, base_doc, doc)`` returns the state and config of the same
model over the extended vocabulary: ``text_embedding.weight`` (V, d), ``text_head.weight``
(V, d) and ``text_head.bias`` (V,) gain the added rows; every old row keeps its bits.

How a new row starts (``init="mean"``, the default): the mean of the old rows of the
token's own text under the old vocabulary (``pyxtts.prepare.vocab.new_token_pieces``:
"ào" -> the rows of "a" and "o", a character the old vocabulary lacks through its NFD
decomposition), in float64, rounded once; the head's weight rows and bias the same way. A
language token starts from the mean of the old language tokens' rows ([en], [de], ...), a
token with no known piece from the mean of all old rows. So the model's first prediction
for a new piece is the average of its parts', not noise: ``tests/test_new_language.py``
compares it with ``init="random"`` (N(0, s²), s the old rows' standard deviation, drawn
from ``seed``) over the first steps.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["TEXT_ROWS", "resize_text_rows", "with_vocab", "vocab_rows_line"]

TEXT_ROWS = ("text_embedding.weight", "text_head.weight", "text_head.bias")
_OLD_LANGUAGE_RE = re.compile(r"\[([a-z]{2}|zh-cn)\]")


def resize_text_rows(state: Mapping[str, np.ndarray], config: Any, base_doc: Mapping, doc: Mapping,
                     init: str = "mean", seed: int = 0) -> tuple[dict[str, np.ndarray], Any, dict]:
    """(new state, new ModelConfig, report) for the vocabulary ``doc`` that extends
    ``base_doc``, the vocabulary ``state`` was trained with (module docstring). ``report``:
    ``language``, ``base_size``, ``size``, ``added``, ``init``, ``from_pieces`` (rows started
    from their own pieces) and ``from_mean`` (rows started from a mean over rows)."""
    from pyxtts.prepare.vocab import new_token_pieces, vocab_extension

    if init not in ("mean", "random"):
        raise ValueError(f"init: expected 'mean' or 'random', got {init!r}")
    ext = vocab_extension(base_doc, doc)
    if config.text_vocab_size != ext.base_size:
        raise ValueError(f"vocab: the model has {config.text_vocab_size} text rows but its base vocabulary "
                         f"{ext.base_size} tokens: the base vocab.json is not the one this model was trained with")
    missing = [k for k in TEXT_ROWS if k not in state]
    if missing:
        raise ValueError(f"state: lacks {missing[0]!r}")
    old_ids = {str(t["content"]): int(t["id"]) for t in base_doc.get("added_tokens", [])}
    old_ids.update({str(t): int(i) for t, i in base_doc["model"]["vocab"].items()})
    language_rows = sorted(i for t, i in old_ids.items() if _OLD_LANGUAGE_RE.fullmatch(t))
    pieces = new_token_pieces(base_doc, ext) if init == "mean" else {}
    rng = np.random.default_rng(seed)
    out = {k: np.asarray(v) for k, v in state.items()}
    from_pieces = from_mean = 0
    for name in TEXT_ROWS:
        old = np.asarray(state[name])
        if old.shape[0] != ext.base_size:
            raise ValueError(f"state: {name} has {old.shape[0]} rows, the model's config {ext.base_size}")
        old64 = old.astype(np.float64)
        every = old64.mean(axis=0)
        langs = old64[language_rows].mean(axis=0) if language_rows else every
        new = np.empty((ext.size,) + old.shape[1:], dtype=old.dtype)
        new[:ext.base_size] = old  # the old rows, bit for bit
        new[ext.base_size:] = every.astype(old.dtype)  # ids the vocabulary leaves unused, if any
        for token, i in ext.added.items():
            if init == "random":
                new[i] = (rng.standard_normal(old.shape[1:]) * old64.std()).astype(old.dtype)
                continue
            ids = pieces[token]
            if ids:
                new[i] = old64[ids].mean(axis=0).astype(old.dtype)
            else:
                new[i] = (langs if _OLD_LANGUAGE_RE.fullmatch(token) or token == f"[{ext.language}]"
                          else every).astype(old.dtype)
            if name == TEXT_ROWS[0]:
                from_pieces += bool(ids)
                from_mean += not ids
        out[name] = new
    new_config = dataclasses.replace(config, text_vocab_size=ext.size)
    report = {"language": ext.language, "base_size": ext.base_size, "size": ext.size, "added": len(ext.added),
              "init": init, "from_pieces": from_pieces, "from_mean": from_mean}
    return out, new_config, report


def with_vocab(config: Any, vocab: str | os.PathLike) -> Any:
    """An ``XTTSConfig`` whose model has the text rows of ``vocab`` (an extended
    ``vocab.json``) and whose ``training.vocab`` is that file: what ``memtest --vocab`` and
    ``optimize-config --vocab`` plan for. A vocabulary with fewer tokens than the model's
    text rows is refused: an extended one only adds rows, so it is the wrong file (XTTS v2's
    rows are 6,681)."""
    from pyxtts.coqui_config import read_vocab

    try:
        size = read_vocab(vocab)["number_text_tokens"]
    except OSError as exc:
        raise FileNotFoundError(f"vocab: cannot read {str(vocab)!r}: {exc.strerror or exc}") from exc
    rows = config.model.text_vocab_size
    if size < rows:
        raise ValueError(f"vocab: {str(vocab)!r} has {size} text tokens, fewer than the {rows} text rows of the "
                         "config's model; expected the vocabulary a new language extends the model's with "
                         "(prepare --new-language's OUT/vocab.json), which has at least as many")
    grown = config.with_model(dataclasses.replace(config.model, text_vocab_size=size))
    return dataclasses.replace(grown, training=dataclasses.replace(config.training, vocab=str(vocab)))


def vocab_rows_line(before: Any, after: Any, vocab: str | os.PathLike) -> str:
    """The line ``memtest --vocab`` and ``optimize-config --vocab`` print: the text rows the
    plan uses, and from which file."""
    old, new = before.model.text_vocab_size, after.model.text_vocab_size
    return f"text rows: {old} -> {new} ({vocab})" if new != old else f"text rows: {new} ({vocab}, as the config has)"

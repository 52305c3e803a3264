"""A new language in XTTS v2's text vocabulary (``pyxtts prepare --new-language``).

``extend_vocab(base, texts, "vi", 2000, held_out)`` trains a BPE model (the ``tokenizers``
library) on the cleaned training transcripts and appends what the base lacks to the base
``vocab.json``:

- the ``[vi]`` language token, at the first free id (the base's ``number_text_tokens``);
- every character of the transcripts the base lacks, those of the ``held_out`` (evaluation)
  transcripts included (so no transcript of the language has ``[UNK]``);
- then the new model's merges in the order it learnt them, each with the token it makes
  when that token is new, until ``new_tokens`` tokens are added (characters included). The
  merges are learnt from ``texts`` only: the held-out text stays unseen by them.

Every base token keeps its id and every base merge its rank: the new merges rank after the
old ones. Text of XTTS v2's own languages therefore encodes as before wherever an old merge
applies; only a pair that no old merge joins can now be joined by a new one.

``vocab_extension(base_doc, doc)`` checks that a vocabulary extends a base (no id moved) and
lists what it adds; ``new_token_pieces`` gives each added token's tokenization under the
base vocabulary (the rows its embedding starts from, ``pyxtts.text_vocab``).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyxtts.prepare._deps import require
from pyxtts.prepare.cleaners import LANGUAGES, check_language_code

__all__ = ["DEFAULT_NEW_TOKENS", "MAX_NEW_TOKENS", "VocabExtension", "check_new_language", "extend_vocab",
           "new_token_pieces", "read_vocab_doc", "vocab_extension", "vocab_sha256"]

# Users who taught XTTS v2 a language report ~2,000 added tokens working well and ~5,000
# worse: each added row starts untrained, and more of them spread the same hours of speech
# thinner. See docs/new-language.md for how to choose.
DEFAULT_NEW_TOKENS = 2000
MAX_NEW_TOKENS = 20000
MIN_PAIR_COUNT = 2  # a pair seen once in the transcripts is a name or a typo, not a piece of the language


def check_new_language(language: str) -> str:
    """The code of a language to add: well formed and not one XTTS v2 already speaks."""
    code = check_language_code(language, "language")
    if code in LANGUAGES or code == "zh-cn":
        raise ValueError(f"language: XTTS v2 already speaks {code!r}; drop new_language=True to fine-tune it with "
                         "the released vocabulary")
    return code


def read_vocab_doc(path: str | os.PathLike) -> dict:
    """A tokenizers JSON file in XTTS v2's layout (a BPE model, no subword prefix/suffix)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"vocab: {str(path)!r} is not a readable JSON file ({exc})") from exc
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE" or not isinstance(model.get("vocab"), dict) \
            or not isinstance(model.get("merges"), list) or not isinstance(doc.get("added_tokens", []), list):
        raise ValueError(f"vocab: {str(path)!r} is not a tokenizers BPE vocabulary (model.vocab, model.merges, "
                         "added_tokens), as XTTS v2's vocab.json is")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise ValueError(f"vocab: {str(path)!r} uses a subword prefix or suffix, which XTTS v2's vocabulary does not")
    return doc


def vocab_sha256(doc: Mapping) -> str:
    """A digest of a vocabulary's content (its tokens, ids and merges), independent of the
    JSON file's formatting."""
    model = doc["model"]
    merges = [_pair(m) for m in model["merges"]]
    added = sorted((int(t["id"]), str(t["content"])) for t in doc.get("added_tokens", []))
    blob = json.dumps([sorted(model["vocab"].items()), merges, added], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _ids(doc: Mapping) -> dict[str, int]:
    ids = {str(t): int(i) for t, i in doc["model"]["vocab"].items()}
    ids.update({str(t["content"]): int(t["id"]) for t in doc.get("added_tokens", [])})
    return ids


def _pair(merge: Any) -> tuple[str, str]:
    """A merge as written by either tokenizers layout: "a b" (older) or ["a", "b"]."""
    if isinstance(merge, str):
        a, _, b = merge.partition(" ")
        return a, b
    return str(merge[0]), str(merge[1])


@dataclass(frozen=True)
class VocabExtension:
    """What a vocabulary adds to its base: ``language`` (its code; None if it adds none),
    ``base_size`` and ``size`` (``number_text_tokens`` before and after), ``added``
    (token -> id, in id order, the language token first)."""
    language: str | None
    base_size: int
    size: int
    added: dict[str, int]

    @property
    def characters(self) -> int:
        return sum(1 for t in self.added if len(t) == 1)


def vocab_extension(base_doc: Mapping, doc: Mapping, where: str = "vocab") -> VocabExtension:
    """Checks that ``doc`` extends ``base_doc``: every base token at its id, every base merge
    at its rank, the added ids after the base's. ValueError naming the first difference."""
    base, new = _ids(base_doc), _ids(doc)
    base_size = max(base.values()) + 1
    for token, i in base.items():
        if new.get(token) != i:
            now = "is missing" if token not in new else f"has id {new[token]}"
            raise ValueError(f"{where}: does not extend the base vocabulary: its token {token!r} {now}, the base "
                             f"gives it id {i} (a vocabulary whose ids moved would scramble the model's rows)")
    base_merges = [_pair(m) for m in base_doc["model"]["merges"]]
    merges = [_pair(m) for m in doc["model"]["merges"]]
    if merges[:len(base_merges)] != base_merges:
        raise ValueError(f"{where}: does not extend the base vocabulary: its first {len(base_merges)} merges are not "
                         "the base's, in the base's order")
    added = {t: i for t, i in sorted(new.items(), key=lambda kv: kv[1]) if t not in base}
    low = [t for t, i in added.items() if i < base_size]
    if low:
        raise ValueError(f"{where}: its added token {low[0]!r} has id {added[low[0]]}, inside the base's range "
                         f"[0, {base_size})")
    langs = [m.group(1) for t in added if (m := re.fullmatch(r"\[([a-z]{2,3})\]", t))]
    return VocabExtension(langs[0] if langs else None, base_size, max(new.values()) + 1, added)


def extend_vocab(base_doc: Mapping, texts: Sequence[str], language: str,
                 new_tokens: int = DEFAULT_NEW_TOKENS, held_out: Sequence[str] = ()) -> tuple[dict, VocabExtension]:
    """(the extended vocabulary as a tokenizers JSON document, what it adds): see the module
    docstring. ``texts``: the training split's transcripts, already cleaned; ``held_out``: the
    evaluation split's, cleaned, whose characters are added too but whose pairs are never
    merged."""
    tokenizers = require("tokenizers", "training the new language's BPE tokens")
    code = check_new_language(language)
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int):
        raise TypeError(f"new_tokens: expected an int, got {type(new_tokens).__name__}")
    if not 1 <= new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"new_tokens: expected 1 to {MAX_NEW_TOKENS} (default {DEFAULT_NEW_TOKENS}), got {new_tokens}")
    words = [w for t in texts for w in t.split(" ") if w]
    if sum(1 for t in texts if t.strip()) < 2:
        raise ValueError(f"texts: a new language's tokens are learnt from its transcripts, and the training split has "
                         f"{sum(1 for t in texts if t.strip())} non-empty one(s); at least 2 are needed (thousands "
                         "make good tokens)")
    base = _ids(base_doc)
    if f"[{code}]" in base:
        raise ValueError(f"language: the base vocabulary already has the token [{code}] (is it a vocabulary "
                         "extended before?); start from the released vocab.json")

    # the new model learns from the chunks the tokenizer will see: words (spaces become
    # [SPACE] tokens), split by the base's pre-tokenizer
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    pre = base_doc.get("pre_tokenizer")
    if pre is not None:
        tok.pre_tokenizer = tokenizers.Tokenizer.from_str(json.dumps(
            {**_empty_doc(), "pre_tokenizer": pre})).pre_tokenizer
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=len(base) + new_tokens + 1000, min_frequency=MIN_PAIR_COUNT,
                                             show_progress=False, special_tokens=[])
    tok.train_from_iterator(words, trainer)
    trained = json.loads(tok.to_str())["model"]
    merged_results = {a + b for a, b in (_pair(m) for m in trained["merges"])}
    alphabet = [t for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]) if t not in merged_results]

    doc = copy.deepcopy(dict(base_doc))
    vocab: dict[str, int] = doc["model"]["vocab"]
    merges: list = doc["model"]["merges"]
    as_strings = bool(merges) and isinstance(merges[0], str)
    next_id = max(base.values()) + 1
    # in the model's vocabulary as well: tokenizers gives an added token that is not there
    # a fresh id of its own when it loads the file, whatever id the file says
    added: dict[str, int] = {f"[{code}]": next_id}
    vocab[f"[{code}]"] = next_id
    doc["added_tokens"] = list(doc.get("added_tokens", [])) + [
        {"id": next_id, "content": f"[{code}]", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}]
    next_id += 1
    # a held-out clip with a character training lacks would be dropped as [UNK]: its
    # characters join (after training's, in code point order), its pairs stay unlearnt
    seen = set(alphabet)
    alphabet += sorted({c for t in held_out for c in t if not c.isspace() and c not in seen})
    new_chars = [c for c in alphabet if c not in base]
    if len(new_chars) > new_tokens:
        raise ValueError(f"new_tokens: the transcripts have {len(new_chars)} characters the base vocabulary lacks "
                         f"(e.g. {''.join(new_chars[:8])!r}), each a token of its own; pass at least {len(new_chars)}")
    for c in new_chars:
        vocab[c] = added[c] = next_id
        next_id += 1
    have = set(base) | set(added)
    base_pairs = {_pair(m) for m in merges}
    count = len(new_chars)
    for m in trained["merges"]:
        if count >= new_tokens:
            break
        a, b = _pair(m)
        if (a, b) in base_pairs or a not in have or b not in have:
            continue
        merges.append(f"{a} {b}" if as_strings else [a, b])
        if a + b not in have:
            vocab[a + b] = added[a + b] = next_id
            have.add(a + b)
            next_id += 1
            count += 1
    ext = vocab_extension(base_doc, doc, "the extended vocabulary")  # the invariant, checked, not assumed
    loaded = tokenizers.Tokenizer.from_str(json.dumps(doc)).get_vocab()
    if loaded != _ids(doc):  # the ids the library gives are the ids the file says
        wrong = next(t for t, i in _ids(doc).items() if loaded.get(t) != i)
        raise RuntimeError(f"the extended vocabulary loads with {wrong!r} at id {loaded.get(wrong)}, not "
                           f"{_ids(doc)[wrong]}")
    return doc, ext


def _empty_doc() -> dict:
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "vocab": {}, "merges": []}}


def new_token_pieces(base_doc: Mapping, ext: VocabExtension) -> dict[str, list[int]]:
    """Each added token's ids under the base vocabulary, [UNK] left out: the token's text as
    the base tokenizes it; a character the base lacks is tried in its NFD decomposition
    ("ạ" -> "a" and a combining dot). Language tokens, and tokens whose every piece is
    unknown, get an empty list (their rows start from a mean over rows, ``pyxtts.text_vocab``)."""
    tokenizers = require("tokenizers", "starting the new tokens' rows")
    tok = tokenizers.Tokenizer.from_str(json.dumps(base_doc))
    unk = tok.token_to_id("[UNK]")

    def pieces(text: str) -> list[int]:
        return [t.id for t in tok.model.tokenize(text)]

    out: dict[str, list[int]] = {}
    for token in ext.added:
        if re.fullmatch(r"\[[a-z]{2,3}\]", token):
            out[token] = []
            continue
        ids = pieces(token)
        if unk in ids:  # a character the base lacks: its decomposition may be known
            ids = pieces(unicodedata.normalize("NFD", token))
        out[token] = [i for i in ids if i != unk]
    return out

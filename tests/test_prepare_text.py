"""XTTS's text ids: pyxtts's tokenizer against Coqui's VoiceBpeTokenizer on the same
vocab.json, over fixed sentences and fresh random ones in every
language whose cleaning needs no extra package (numbers, decimals, currencies, ordinals,
abbreviations, symbols, punctuation); and what it says for bad or unsupported input."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from fixtures_prepare import SENTENCES, SENTENCES_CJK, coqui_tokens, training_texts, write_vocab
from helpers import SEED, make_rng

pytest.importorskip("tokenizers", reason="the prepare extra (tokenizers) is not installed")
pytest.importorskip("num2words", reason="the prepare extra (num2words) is not installed")

from pyxtts.prepare import LANGUAGES, XTTSTokenizer, clean_text  # noqa: E402
from pyxtts.prepare.cleaners import _ABBREVIATIONS, _ORDINAL_SUFFIX, _SYMBOL_CHARS, _katsu  # noqa: E402

# languages whose cleaning runs on num2words alone (+ ko-speech-tools for Korean, in the test extra)
PLAIN = [lang for lang in LANGUAGES if lang not in ("zh", "ja")]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.json"
    write_vocab(path, training_texts())
    return path


def random_sentences(lang: str, rng: np.random.Generator, n: int) -> list[str]:
    """Sentences built from the language's words and everything its cleaning expands."""
    words = [w for s in SENTENCES[lang] for w in s.split()]
    suffixes = [x for x in _ORDINAL_SUFFIX[lang].strip("()").split("|") if "(" not in x and "\\" not in x] or [""]
    abbrevs = [a for a, _ in _ABBREVIATIONS[lang]]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(int(rng.integers(3, 9))):
            kind = int(rng.integers(0, 10))
            num = int(rng.integers(0, 10 ** int(rng.integers(1, 8))))
            if kind == 0:
                parts.append(str(num))
            elif kind == 1:  # thousands separators, either convention
                parts.append(f"{num:,}" if rng.random() < 0.5 else f"{num:,}".replace(",", "."))
            elif kind == 2:  # decimals with a point or a comma
                parts.append(f"{num}{'.,'[int(rng.integers(0, 2))]}{int(rng.integers(0, 100))}")
            elif kind == 3:  # money before or after, with or without cents
                sign = "$£€"[int(rng.integers(0, 3))]
                amount = f"{num % 10000}" + (f".{int(rng.integers(0, 100)):02d}" if rng.random() < 0.5 else "")
                parts.append(sign + amount if rng.random() < 0.5 else amount + sign)
            elif kind == 4:
                parts.append(f"{num % 200}{suffixes[int(rng.integers(0, len(suffixes)))]}")
            elif kind == 5:
                parts.append(_SYMBOL_CHARS[int(rng.integers(0, len(_SYMBOL_CHARS)))] + str(num % 100))
            elif kind == 6 and abbrevs:
                a = abbrevs[int(rng.integers(0, len(abbrevs)))]
                parts.append((a.capitalize() if rng.random() < 0.5 else a) + ".")
            else:
                parts.append(words[int(rng.integers(0, len(words)))])
        punct = [".", "!", "?", ",", ";", ":", " -", '"'][int(rng.integers(0, 8))]
        out.append(" ".join(parts) + punct)
    return out


@pytest.fixture(scope="module")
def coqui_ids(vocab):
    rng = make_rng("coqui_ids")
    pairs = [[s, lang] for lang in PLAIN for s in SENTENCES[lang] + random_sentences(lang, rng, 40)]
    pairs += [["Hello  World!", "en-US"], ["   ", "en"], ["", "de"], ["Ünïcödé ☃ text", "fr"]]
    return pairs, coqui_tokens(vocab, pairs)


def test_ids_equal_coqui(vocab, coqui_ids):
    pairs, ref = coqui_ids
    tok = XTTSTokenizer(vocab)
    mismatches = []
    errors = 0
    for (text, lang), want in zip(pairs, ref):
        try:
            got = tok.encode(text, lang)
        except Exception as exc:  # noqa: BLE001 - Coqui's failures must be failures here too
            got = {"error": f"{type(exc).__name__}: {exc}"}
        if isinstance(want, dict):
            errors += 1
            ok = isinstance(got, dict) and got["error"].split(":")[0] == want["error"].split(":")[0]
        else:
            ok = got == want
        if not ok:
            mismatches.append((lang, text, got, want))
    assert not mismatches, f"{len(mismatches)} of {len(pairs)} differ (seed {SEED}); first: {mismatches[:3]}"
    assert len(pairs) >= 40 * len(PLAIN) and errors < len(pairs) // 4


@pytest.mark.parametrize("lang", ["ja", "zh"])
def test_ids_equal_coqui_cjk(vocab, lang):
    """Chinese and Japanese, whose packages the test extra installs."""
    try:
        clean_text(SENTENCES_CJK[lang][0], lang)
    except ImportError as exc:
        pytest.skip(f"pyxtts cannot clean {lang} here: {exc}")
    pairs = [[t, lang] for t in SENTENCES_CJK[lang]]
    ref = coqui_tokens(vocab, pairs)
    if any(isinstance(r, dict) and "Error" in r["error"].split(":")[0] for r in ref):
        pytest.skip(f"Coqui cannot clean {lang} here: {ref[0]}")
    tok = XTTSTokenizer(vocab)
    assert [tok.encode(t, lang) for t, _ in pairs] == ref


def test_cleaning_by_hand():
    """Expectations worked out from the rules, not from either implementation."""
    assert clean_text('Mr. Smith paid $20 for "2" books.', "en") == "mister smith paid twenty dollars for two books."
    assert clean_text("It's 1,000.5  degrees & rising", "en") == "it's one thousand point five degrees and rising"
    assert clean_text("the 21st of 3", "en") == "the twenty-first of three"
    assert clean_text("Dr. Müller kam um 3 Uhr", "de") == "doktor müller kam um drei uhr"
    assert clean_text("İSTANBUL", "tr") == "istanbul"


def test_encode_frames_the_text(vocab):
    tok = XTTSTokenizer(vocab)
    ids = tok.encode("Hello world", "en-US")  # the region is dropped
    assert ids[0] == tok.token_id("[en]")
    assert tok.token_id("[SPACE]") in ids and tok.token_id("[UNK]") not in ids
    assert ids == tok.encode("HELLO   world", "en")
    assert tok.vocab_size == max(json.loads(vocab.read_text())["model"]["vocab"].values()) + 1


def test_bad_languages_and_files(vocab, tmp_path):
    tok = XTTSTokenizer(vocab)
    with pytest.raises(ValueError, match=r"language: expected one of en, es.*got 'xx'"):
        tok.encode("hello", "xx")
    with pytest.raises(TypeError, match="language: expected a str"):
        tok.encode("hello", None)
    with pytest.raises(TypeError, match="text: expected a str, got int"):
        tok.encode(5, "en")
    (tmp_path / "v.json").write_text("{}")
    with pytest.raises(ValueError, match="vocab_file: .* is not a tokenizers JSON file"):
        XTTSTokenizer(tmp_path / "v.json")


def test_japanese_names_its_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "cutlet", None)  # absent, whether installed here or not
    _katsu.cache_clear()  # a Cutlet made by an earlier test would hide the absence
    with pytest.raises(ImportError, match=r"Japanese \(ja\) text needs the Python package 'cutlet'.*pip install cut"):
        clean_text("こんにちは", "ja")


@pytest.mark.parametrize("absent", ["pypinyin", "TTS.tts.layers.xtts.zh_num2words"])
def test_chinese_names_its_packages(monkeypatch, absent):
    monkeypatch.setitem(sys.modules, absent, None)  # absent, whether installed here or not
    with pytest.raises(ImportError, match=r"Chinese \(zh\).*pip install (coqui-tts pypinyin|pypinyin)"):
        clean_text("有50名士兵", "zh")

"""A language XTTS v2 does not speak: the extended vocabulary (``pyxtts.prepare.vocab``),
its cleaning, the grown text rows (``pyxtts.text_vocab``), ``prepare --new-language`` and
the refusals. The whole path through Coqui is in ``test_new_language_coqui.py``.

The base vocabulary is the test's BPE trained on the other test languages' text
(``fixtures_prepare.write_vocab``, XTTS v2's layout); the new language is Vietnamese
(``fixtures_language``), whose letters with two diacritics that base lacks."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import pyxtts
import pyxtts.cli

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("num2words", reason="the prepare extra (num2words) is not installed")
fx = pytest.importorskip("fixtures_prepare")
from fixtures_language import HELD_OUT_VI, SENTENCES_SW, SENTENCES_VI, make_corpus  # noqa: E402
from pyxtts.prepare.cleaners import clean_new_language, has_digits  # noqa: E402
from pyxtts.prepare.text import XTTSTokenizer, normalize_language  # noqa: E402
from pyxtts.prepare.vocab import (DEFAULT_NEW_TOKENS, extend_vocab, new_token_pieces, read_vocab_doc,  # noqa: E402
                                  vocab_extension, vocab_sha256)
from pyxtts.text_vocab import TEXT_ROWS, resize_text_rows  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

CLEAN_VI = [clean_new_language(s, "vi") for s in SENTENCES_VI]
HELD = CLEAN_VI[HELD_OUT_VI]
TRAIN = CLEAN_VI[:HELD_OUT_VI.start] + CLEAN_VI[HELD_OUT_VI.stop:]


@pytest.fixture(scope="module")
def base_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vocab") / "vocab.json"
    fx.write_vocab(path, fx.training_texts())
    return path


@pytest.fixture(scope="module")
def base(base_file) -> dict:
    return read_vocab_doc(base_file)


@pytest.fixture(scope="module")
def extended(base, tmp_path_factory) -> tuple[dict, object, Path]:
    doc, ext = extend_vocab(base, TRAIN, "vi", DEFAULT_NEW_TOKENS)
    path = tmp_path_factory.mktemp("ext") / "vocab.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return doc, ext, path


def library_ids(doc: dict) -> dict[str, int]:
    """token -> id as the tokenizers library loads the document (not as the JSON says)."""
    return tokenizers.Tokenizer.from_str(json.dumps(doc)).get_vocab()


# ---- the extended vocabulary ---------------------------------------------------------------

def test_every_old_token_keeps_its_id_and_every_merge_its_rank(base, extended):
    doc, ext, _ = extended
    old, new = library_ids(base), library_ids(doc)
    assert all(new[t] == i for t, i in old.items())
    base_size = max(old.values()) + 1
    assert ext.base_size == base_size and ext.size == max(new.values()) + 1
    # the added ids are base_size, base_size + 1, ...: the language token first, then its characters
    assert sorted(new[t] for t in ext.added) == list(range(base_size, ext.size))
    assert new["[vi]"] == base_size and list(ext.added)[0] == "[vi]"
    n_base = len(base["model"]["merges"])
    assert [tuple(m) for m in doc["model"]["merges"][:n_base]] == [tuple(m) for m in base["model"]["merges"]]
    assert len(doc["model"]["merges"]) > n_base
    # every character of the training text is a token now
    assert {c for t in TRAIN for c in t if c != " "} <= set(new)


def test_held_out_text_round_trips_without_unk_and_in_fewer_tokens(base_file, extended):
    _, ext, path = extended
    tok, old = XTTSTokenizer(path), XTTSTokenizer(base_file)
    assert tok.added_languages == ("vi",)
    unk = tok.token_id("[UNK]")
    n_new = n_old = chars = 0
    for raw, clean in zip(SENTENCES_VI[HELD_OUT_VI], HELD):
        ids = tok.encode(raw, "vi")
        assert ids[0] == tok.token_id("[vi]") and unk not in ids, (clean, ids)
        decoded = "".join(tok.tokenizer.id_to_token(i) for i in ids[1:]).replace("[SPACE]", " ")
        assert decoded == clean  # nothing lost
        n_new += len(ids) - 1
        n_old += len(old.tokenizer.encode(clean.replace(" ", "[SPACE]")).ids)
        chars += len(clean)
    print(f"held-out Vietnamese: {n_new / chars:.3f} tokens per character extended, {n_old / chars:.3f} with the "
          f"base vocabulary; 0 [UNK] ({len(ext.added)} tokens added)")
    assert n_new / chars < 0.85 * (n_old / chars)


def test_new_tokens_counts_characters_and_stops_at_n(base):
    doc, ext = extend_vocab(base, TRAIN, "vi", 60)
    assert len(ext.added) == 1 + 60 and ext.characters < 60  # the language token is not counted
    chars = ext.characters
    with pytest.raises(ValueError, match=rf"at least {chars}"):
        extend_vocab(base, TRAIN, "vi", chars - 1)
    # the same inputs, the same vocabulary: prepare resumes on its digest
    assert vocab_sha256(extend_vocab(base, TRAIN, "vi", 60)[0]) == vocab_sha256(doc)


def rare_letters(base: dict, n: int) -> list[str]:
    """n Vietnamese letters that neither the base vocabulary nor the test sentences hold."""
    have = set(library_ids(base)) | {c for t in CLEAN_VI for c in t}
    letters = [c for c in "ỹỷỵẵẳẫẩỗổỡởựửữỳẽẻẹ" if c not in have]
    assert len(letters) >= n, letters
    return letters[:n]


def test_held_out_characters_join_the_vocabulary_but_teach_no_merge(base):
    """A held-out transcript with a letter training lacks used to be dropped as [UNK]: its
    letters are tokens now, and the merges are still training's alone."""
    letters = rare_letters(base, 2)
    held = [f"chữ {letters[0]}{letters[0]}a và {letters[1]}{letters[1]}a", f"lại {letters[0]}{letters[0]}a"]
    doc, ext = extend_vocab(base, TRAIN, "vi", DEFAULT_NEW_TOKENS, held_out=held)
    plain_doc, plain = extend_vocab(base, TRAIN, "vi", DEFAULT_NEW_TOKENS)
    assert doc["model"]["merges"] == plain_doc["model"]["merges"]  # a held-out pair seen twice is never merged
    assert list(ext.added) == (list(plain.added)[:1 + plain.characters] + sorted(letters)  # after training's letters
                               + list(plain.added)[1 + plain.characters:])
    assert ext.characters == plain.characters + 2
    tok = tokenizers.Tokenizer.from_str(json.dumps(doc))
    for t in held:
        assert tok.token_to_id("[UNK]") not in tok.encode(t.replace(" ", "[SPACE]")).ids, t


def test_old_language_text_mostly_keeps_its_ids(base, extended):
    """The new merges rank after the old ones: a text of the old languages changes only where
    a pair no old merge joins is joined by a new one. Measured here, not assumed zero."""
    doc, _, _ = extended
    old_tok, new_tok = (tokenizers.Tokenizer.from_str(json.dumps(d)) for d in (base, doc))
    texts = fx.training_texts()
    changed = [t for t in texts if old_tok.encode(t.replace(" ", "[SPACE]")).ids
               != new_tok.encode(t.replace(" ", "[SPACE]")).ids]
    print(f"old-language sentences whose ids change: {len(changed)} of {len(texts)}")
    assert len(changed) <= 0.05 * len(texts), changed
    for t in changed:  # they still decode to the same text
        ids = new_tok.encode(t.replace(" ", "[SPACE]")).ids
        assert "".join(new_tok.id_to_token(i) for i in ids).replace("[SPACE]", " ") == t


def test_pieces_of_new_tokens_are_their_text_under_the_old_vocabulary(base, extended):
    _, ext, _ = extended
    old_tok = tokenizers.Tokenizer.from_str(json.dumps(base))
    unk = old_tok.token_to_id("[UNK]")
    pieces = new_token_pieces(base, ext)
    assert pieces["[vi]"] == []
    for token, ids in pieces.items():
        if token == "[vi]":
            continue
        text = "".join(old_tok.id_to_token(i) for i in ids)
        # either the token itself or its decomposition with the unknown marks left out
        import unicodedata
        nfd = unicodedata.normalize("NFD", token)
        assert text in (token, "".join(c for c in nfd if old_tok.token_to_id(c) not in (None, unk))), token
    assert pieces["ô"] == [old_tok.token_to_id("o")]  # "ô" = "o" + a combining circumflex


def test_vocab_extension_refuses_moved_ids_and_reordered_merges(base, extended):
    doc, _, _ = extended
    moved = json.loads(json.dumps(doc))
    vocab = moved["model"]["vocab"]
    a, b = "[SPACE]", next(t for t in vocab if t not in ("[SPACE]", "[STOP]") and not t.startswith("["))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    with pytest.raises(ValueError, match=rf"does not extend the base vocabulary: its token {b!r} has id"):
        vocab_extension(base, moved)
    reordered = json.loads(json.dumps(doc))
    m = reordered["model"]["merges"]
    m[0], m[1] = m[1], m[0]
    with pytest.raises(ValueError, match="merges are not the base's"):
        vocab_extension(base, reordered)
    missing = json.loads(json.dumps(doc))
    del missing["model"]["vocab"]["[UNK]"]
    missing["added_tokens"] = [t for t in missing["added_tokens"] if t["content"] != "[UNK]"]
    with pytest.raises(ValueError, match=r"'\[UNK\]' is missing"):
        vocab_extension(base, missing)


@pytest.mark.parametrize("code, error, match", [
    ("VI", ValueError, "2 or 3 lowercase letters"), ("v", ValueError, "2 or 3 lowercase"),
    ("vietnamese", ValueError, "got 'vietnamese'"), ("vi_VN", ValueError, "got 'vi_VN'"),
    ("", ValueError, "got ''"), (3, TypeError, "expected a str"),
    ("en", ValueError, "already speaks 'en'; drop new_language=True"), ("zh-cn", ValueError, "already speaks"),
])
def test_language_code_of_the_wrong_form_or_known(base, code, error, match):
    with pytest.raises(error, match=match):
        extend_vocab(base, TRAIN, code, 100)


@pytest.mark.parametrize("n, error, match", [(0, ValueError, "1 to 20000"), (20001, ValueError, "1 to 20000"),
                                             (True, TypeError, "expected an int"), ("10", TypeError, "an int")])
def test_new_tokens_out_of_range(base, n, error, match):
    with pytest.raises(error, match=match):
        extend_vocab(base, TRAIN, "vi", n)


@pytest.mark.parametrize("texts", [[], [""], ["xin chào"], ["xin chào", "  "]])
def test_empty_or_one_transcript_is_refused(base, texts):
    with pytest.raises(ValueError, match="at least 2 are needed"):
        extend_vocab(base, texts, "vi", 100)


def test_a_base_that_already_has_the_language_is_refused(extended):
    doc, _, _ = extended
    with pytest.raises(ValueError, match=r"already has the token \[vi\]"):
        extend_vocab(doc, TRAIN, "vi", 100)


# ---- cleaning --------------------------------------------------------------------------

def test_cleaning_of_a_new_language():
    import unicodedata

    decomposed = unicodedata.normalize("NFD", "Tiếng Việt")
    assert decomposed != "Tiếng Việt"
    assert clean_new_language(decomposed, "vi") == "tiếng việt"  # NFC, lowercase
    assert clean_new_language("“Xin chào” — thế giới…  nhé", "vi") == "xin chào - thế giới... nhé"
    assert clean_new_language("Tôi có 3 con mèo.", "vi") == "tôi có ba con mèo."  # num2words knows Vietnamese
    sw = clean_new_language("Nina paka 3.", "sw")  # it does not know Swahili: the digit stays
    assert sw == "nina paka 3." and has_digits(sw)
    assert clean_new_language("ΑΒΓ", "el") == "αβγ" and clean_new_language("አማርኛ", "am") == "አማርኛ"  # no case
    with pytest.raises(TypeError, match="text: expected a str"):
        clean_new_language(None, "vi")


@pytest.mark.parametrize("lang, text, spoken", [
    # Vietnamese groups thousands with dots and writes decimals with a comma: "10.000 đồng"
    # was "mười đồng" (ten), "1.500.000" one and a half
    ("vi", "10.000 đồng", [10000, " đồng"]), ("vi", "1.500.000 người", [1500000, " người"]),
    ("vi", "123.456.789", [123456789]), ("vi", "giá 25.000.", ["giá ", 25000, "."]),
    ("vi", "1.500.000,5", [1500000.5]), ("vi", "3,5 mét", [3.5, " mét"]),
    ("vi", "3.14", [3.14]), ("vi", "năm 2024", ["năm ", 2024]),  # not three digits after the dot: a decimal
    ("id", "Rp 2.000", ["rp ", 2000]),
    # a language that groups with commas (Welsh) keeps the dot as its decimal mark
    ("cy", "1,000", [1000]), ("cy", "10.000", [10.0]), ("cy", "2.5", [2.5]),
])
def test_thousands_and_decimals_of_a_new_language(lang, text, spoken):
    from num2words import num2words

    want = "".join(p if isinstance(p, str) else num2words(p, lang=lang) for p in spoken)
    assert clean_new_language(text, lang) == want


def test_an_unknown_language_names_the_flag(base_file, extended):
    with pytest.raises(ValueError, match="--new-language"):
        normalize_language("vi")
    with pytest.raises(ValueError, match="--new-language"):
        XTTSTokenizer(base_file).encode("xin chào", "vi")
    _, _, path = extended
    assert XTTSTokenizer(path).encode("Xin chào", "vi-VN")[0] == XTTSTokenizer(path).token_id("[vi]")


# ---- the grown text rows ---------------------------------------------------------------------

def small_config(size: int) -> pyxtts.ModelConfig:
    return pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=size, audio_vocab_size=23,
                              max_text_tokens=64, max_audio_tokens=24, n_cond_latents=2, conditioning=False,
                              dropout=0.0)


def test_old_rows_keep_their_bits_and_new_rows_start_from_their_pieces(base, extended, rng):
    _, ext, _ = extended
    cfg = small_config(ext.base_size)
    model = pyxtts.XTTSGPT(cfg, seed=int(rng.integers(1 << 30)))
    state = model.state_dict()
    doc = extended[0]
    grown, gcfg, report = resize_text_rows(state, cfg, base, doc)
    assert gcfg.text_vocab_size == ext.size and report["size"] == ext.size and report["init"] == "mean"
    assert report["from_pieces"] + report["from_mean"] == len(ext.added)
    old_tok = tokenizers.Tokenizer.from_str(json.dumps(base))
    languages = [i for t, i in old_tok.get_vocab().items() if t in fx.SPECIAL_TOKENS and t not in
                 ("[STOP]", "[UNK]", "[SPACE]", "[START]")]
    pieces = new_token_pieces(base, ext)
    for name in TEXT_ROWS:
        old, new = state[name], grown[name]
        assert new.shape == (ext.size,) + old.shape[1:] and new.dtype == old.dtype
        assert np.array_equal(new[:ext.base_size].view(np.uint32), old.view(np.uint32)), name  # bit for bit
        o64 = old.astype(np.float64)
        for token, i in ext.added.items():
            ids = pieces[token]
            want = o64[ids].mean(axis=0) if ids else (o64[languages].mean(axis=0) if token == "[vi]"
                                                       else o64.mean(axis=0))
            # float64 mean rounded once to float32: within half an ulp
            np.testing.assert_allclose(new[i], want, rtol=6e-8, atol=1e-12, err_msg=f"{name} {token}")
    assert set(k for k in grown if k not in TEXT_ROWS) == set(k for k in state if k not in TEXT_ROWS)
    for k in state:
        if k not in TEXT_ROWS:
            assert grown[k] is state[k] or np.array_equal(grown[k], state[k])
    grown_model = pyxtts.XTTSGPT(gcfg)
    grown_model.load_state_dict(grown, strict=True)


def test_resize_refusals(base, extended, rng):
    doc, ext, _ = extended
    cfg = small_config(ext.base_size)
    state = pyxtts.XTTSGPT(cfg, seed=1).state_dict()
    with pytest.raises(ValueError, match="init: expected 'mean' or 'random'"):
        resize_text_rows(state, cfg, base, doc, init="zeros")
    with pytest.raises(ValueError, match=f"the model has {ext.base_size + 1} text rows"):
        resize_text_rows(state, small_config(ext.base_size + 1), base, doc)
    with pytest.raises(ValueError, match="does not extend"):
        resize_text_rows(state, cfg, doc, base)


def english_batch(rng, size: int) -> dict:
    """Text ids of the old vocabulary only, as English text has."""
    batch = {"text_inputs": rng.integers(0, size, (3, 12)), "text_targets": rng.integers(0, size, (3, 12)),
             "audio_inputs": rng.integers(0, 23, (3, 16)), "audio_targets": rng.integers(0, 23, (3, 16)),
             "text_lengths": np.array([12, 9, 7]), "audio_lengths": np.array([16, 11, 14])}
    batch["cond_latents"] = rng.standard_normal((3, 2, 32)).astype(np.float32)
    return batch


def test_an_english_batch_keeps_its_loss(base, extended, rng):
    """An English batch (old ids only) after the resize: the audio loss is bit for bit the
    same, and so is every old text logit; the text loss's softmax also spans the new rows
    now, so it rises by the log of 1 + the probability they take (on this random model, where
    every class is about equally likely, about log(V'/V)). Both losses, before and after,
    match the float64 PyTorch reference (tests/helpers/torch_ref.py) to fp32 rounding."""
    torch = pytest.importorskip("torch")
    from helpers.torch_ref import RefGPT

    doc, ext, _ = extended
    cfg = small_config(ext.base_size)
    model = pyxtts.XTTSGPT(cfg, seed=int(rng.integers(1 << 30)))
    batch = english_batch(rng, ext.base_size)
    before = model.forward(batch)
    grown, gcfg, _ = resize_text_rows(model.state_dict(), cfg, base, doc)
    big = pyxtts.XTTSGPT(gcfg)
    big.load_state_dict(grown)
    after = big.forward(batch)
    assert after["audio_loss"] == before["audio_loss"]
    refs = []
    for c, state in ((cfg, model.state_dict()), (gcfg, grown)):
        ref = RefGPT(c, dtype=torch.float64)
        ref.load(state)
        with torch.no_grad():
            refs.append([float(v) for v in ref(batch)[1:]])
    # fp32 forward against float64 over 2 layers: ~1e-6 relative; 1e-5
    for ours, (text, audio) in zip((before, after), refs):
        np.testing.assert_allclose([ours["text_loss"], ours["audio_loss"]], [text, audio], rtol=1e-5)
    rise, ref_rise = after["text_loss"] - before["text_loss"], refs[1][0] - refs[0][0]
    print(f"text loss {before['text_loss']:.6f} -> {after['text_loss']:.6f} ({len(ext.added)} rows added; "
          f"log(V'/V) = {np.log(ext.size / ext.base_size):.6f})")
    assert rise > 0 and abs(rise - ref_rise) < 1e-5 * refs[1][0]


# ---- prepare --new-language ------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    if fx.ESPEAK is None:
        pytest.skip("espeak-ng is not installed")
    root = tmp_path_factory.mktemp("vi")
    meta = make_corpus(root / "corpus", SENTENCES_VI, "vi")
    wavs = sorted((root / "corpus" / "wavs").glob("*.wav"))
    fx.write_assets(root / "xtts", wavs[:4], 7, fx.training_texts(), dvae=fx.TINY_DVAE)
    return root, meta


def prepare_cli(*argv: str) -> int:
    return pyxtts.cli.main(["prepare", *argv, "--no-progress"])


def test_prepare_new_language_writes_the_vocabulary_and_its_ids(corpus, capsys):
    root, meta = corpus
    out = root / "shards"
    assert prepare_cli("--xtts-dir", str(root / "xtts"), "--metadata", str(meta), "--language", "vi",
                       "--new-language", "--new-tokens", "150", "--eval-fraction", "0.2", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert "new language [vi]:" in printed and "held-out text:" in printed
    settings = json.loads((out / "prepare.json").read_text())["settings"]
    doc = read_vocab_doc(out / "vocab.json")
    assert settings["new_language"] == {"language": "vi", "new_tokens": 150, "vocab_sha256": vocab_sha256(doc)}
    summary = json.loads((out / "summary.json").read_text())
    new = summary["new_language"]
    ext = vocab_extension(read_vocab_doc(root / "xtts" / "vocab.json"), doc)
    assert new["added_tokens"] == len(ext.added) - 1 <= 150 and new["size"] == ext.size
    assert new["tokens_per_char"] < new["base_tokens_per_char"] and new["digits"] == []
    tok = XTTSTokenizer(out / "vocab.json")
    ds = pyxtts.TTSDataset.load(str(out / "train"))
    for s in ds:
        assert s.text[0] == tok.token_id("[vi]") and s.text.max() < ext.size
    assert any(int(s.text.max()) >= ext.base_size for s in ds)  # the new tokens are used
    # the eval split's text never trained the tokens: every BPE token is learnt from train/
    keys = {r.split("\t")[2] for r in (out / "report.tsv").read_text().splitlines()[1:] if r.startswith("eval")}
    held = [clean_new_language(s, "vi") for i, s in enumerate(SENTENCES_VI) if f"vi-{i + 1:04d}" in keys]
    trained = [clean_new_language(s, "vi") for i, s in enumerate(SENTENCES_VI) if f"vi-{i + 1:04d}" not in keys]
    again, _ = extend_vocab(read_vocab_doc(root / "xtts" / "vocab.json"), trained, "vi", 150, held_out=held)
    assert vocab_sha256(again) == vocab_sha256(doc) and held
    # the same command again resumes: nothing is redone
    assert prepare_cli("--xtts-dir", str(root / "xtts"), "--metadata", str(meta), "--language", "vi",
                       "--new-language", "--new-tokens", "150", "--eval-fraction", "0.2", "--out", str(out)) == 0
    assert "2 shards kept from an earlier run" in capsys.readouterr().out


def test_prepare_keeps_held_out_clips_whose_letters_training_lacks(corpus, tmp_path, capsys):
    """`prepare --new-language --eval-fraction` learnt the characters from the training split
    only: a held-out clip with a letter seen nowhere in training was dropped as [UNK], and
    the eval split could end up empty (with a shard of 0 samples) while prepare said nothing."""
    root, meta = corpus
    base = read_vocab_doc(root / "xtts" / "vocab.json")
    letters = rare_letters(base, 8)  # one of its own in each line: whichever two are held out lack theirs
    wavs = root / "corpus" / "wavs"
    lines = [f"vi-{i + 1:04d}|{SENTENCES_VI[i]} {c}a|{SENTENCES_VI[i]} {c}a" for i, c in enumerate(letters)]
    (tmp_path / "meta.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert prepare_cli("--xtts-dir", str(root / "xtts"), "--metadata", str(tmp_path / "meta.csv"), "--audio-dir",
                       str(wavs), "--language", "vi", "--new-language", "--new-tokens", "150", "--eval-fraction",
                       "0.25", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kept"] == 8 and summary["splits"]["eval"]["kept"] == 2, summary
    assert summary["warnings"] == [] and "warning" not in printed
    assert summary["new_language"]["held_out_unk"] == 0
    doc = read_vocab_doc(out / "vocab.json")
    assert set(letters) <= set(library_ids(doc))
    # the merges are the training transcripts' alone
    report = [r.split("\t") for r in (out / "report.tsv").read_text().splitlines()[1:]]
    by_key = {f"vi-{i + 1:04d}": clean_new_language(f"{SENTENCES_VI[i]} {c}a", "vi") for i, c in enumerate(letters)}
    trained = [by_key[r[2]] for r in report if r[0] == "train"]
    held = [by_key[r[2]] for r in report if r[0] == "eval"]
    again, _ = extend_vocab(base, trained, "vi", 150, held_out=held)
    assert vocab_sha256(again) == vocab_sha256(doc)


@pytest.mark.parametrize("argv, match", [
    (["--language", "en", "--new-language"], "already speaks 'en'; drop --new-language"),
    (["--language", "Vietnamese", "--new-language"], "2 or 3 lowercase letters"),
    (["--language", "vi", "--new-language", "--new-tokens", "0"], "--new-tokens: expected an int in [1, 20000], got 0"),
    (["--language", "vi", "--new-tokens", "50"], "only means something with --new-language"),
    (["--language", "vi"], "--new-language"),
])
def test_prepare_refusals_write_nothing(corpus, tmp_path, capsys, argv, match):
    root, meta = corpus
    out = tmp_path / "out"
    assert prepare_cli("--xtts-dir", str(root / "xtts"), "--metadata", str(meta), "--out", str(out), *argv) == 2
    err = capsys.readouterr().err
    assert match in err and "new_language=True" not in err  # the flag, not the Python argument
    assert not out.exists()


def test_prepare_reuses_a_taught_languages_vocabulary(corpus, tmp_path, capsys):
    """More recordings of a language already taught: `prepare --vocab` tokenizes with the
    vocabulary the model learnt (an earlier --new-language output's), so the same text gets
    the same ids, and the trainer sees the same vocabulary as the first run's."""
    root, meta = corpus
    first, more = tmp_path / "first", tmp_path / "more"
    common = ["--xtts-dir", str(root / "xtts"), "--metadata", str(meta), "--language", "vi"]
    assert prepare_cli(*common, "--new-language", "--new-tokens", "150", "--out", str(first)) == 0
    capsys.readouterr()
    argv = [*common, "--vocab", str(first / "vocab.json"), "--out", str(more)]
    assert prepare_cli(*argv) == 0
    printed = capsys.readouterr().out
    assert f"vocabulary: {first / 'vocab.json'} (" in printed and "adding [vi] to XTTS v2's" in printed
    doc = read_vocab_doc(first / "vocab.json")
    assert vocab_sha256(read_vocab_doc(more / "vocab.json")) == vocab_sha256(doc)
    assert json.loads((more / "prepare.json").read_text())["settings"]["vocab_sha256"] == vocab_sha256(doc)
    summary = json.loads((more / "summary.json").read_text())
    assert summary["vocab"]["languages"] == ["vi"] and summary["vocab"]["digits"] == []
    a, b = pyxtts.TTSDataset.load(str(first / "train")), pyxtts.TTSDataset.load(str(more / "train"))
    assert len(a) == len(b) == len(SENTENCES_VI)
    for x, y in zip(a, b):
        assert x.text.tobytes() == y.text.tobytes() and x.audio.tobytes() == y.audio.tobytes()
    assert pyxtts.cli._data_vocab(str(more))[0] == pyxtts.cli._data_vocab(str(first))[0]
    assert prepare_cli(*argv) == 0  # the same command resumes
    assert "kept from an earlier run" in capsys.readouterr().out


def test_prepare_vocab_refusals_write_nothing(corpus, tmp_path, capsys):
    root, meta = corpus
    other = tmp_path / "moved.json"
    doc = read_vocab_doc(root / "xtts" / "vocab.json")
    vocab = doc["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[100:102]  # past the special tokens (also in added_tokens)
    vocab[first], vocab[second] = vocab[second], vocab[first]
    other.write_text(json.dumps(doc), encoding="utf-8")
    common = ["--xtts-dir", str(root / "xtts"), "--metadata", str(meta), "--language", "vi"]
    out = tmp_path / "out"
    for argv, said in [
        (["--vocab", str(root / "xtts" / "vocab.json")], "--vocab: "),  # adds no language
        (["--vocab", str(other)], "--vocab: does not extend the base vocabulary"),
        (["--vocab", str(tmp_path / "nope.json")], "--vocab: "),
        (["--vocab", str(other), "--new-language"], "--vocab: "),
    ]:
        assert prepare_cli(*common, *argv, "--out", str(out)) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("pyxtts prepare: ") and said in err, (argv, err)
        # the API's argument name, unspelt ("drop vocab"), told nothing at the command line
        assert re.findall(r"(?<![-\w/.])vocab(?![.\w])", err) == [], err
        assert not out.exists()
    assert prepare_cli(*common, "--vocab", str(root / "xtts" / "vocab.json"), "--out", str(out)) == 2
    assert "adds no language" in capsys.readouterr().err
    assert prepare_cli(*common, "--vocab", str(other), "--new-language", "--out", str(out)) == 2
    assert "--new-language learns a new one" in capsys.readouterr().err


def test_prepare_refuses_one_clip(corpus, tmp_path, capsys):
    root, meta = corpus
    one = tmp_path / "one.csv"
    one.write_text(meta.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert prepare_cli("--xtts-dir", str(root / "xtts"), "--metadata", str(one), "--audio-dir",
                       str(root / "corpus" / "wavs"), "--language", "vi", "--new-language", "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert "pyxtts prepare: --metadata: a new language's tokens are learnt from its transcripts" in err  # was "texts:"
    assert "at least 2 are needed" in err and not out.exists()


def test_digits_num2words_cannot_spell_are_kept_and_reported(corpus, tmp_path, capsys):
    if fx.ESPEAK is None:
        pytest.skip("espeak-ng is not installed")
    root, _ = corpus
    meta = make_corpus(tmp_path / "sw", SENTENCES_SW, "sw")
    out = tmp_path / "out"
    assert prepare_cli("--xtts-dir", str(root / "xtts"), "--metadata", str(meta), "--language", "sw",
                       "--new-language", "--new-tokens", "80", "--out", str(out), "--workers", "2") == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kept"] == len(SENTENCES_SW)
    assert summary["new_language"]["digits"] == ["sw-0002"]  # "Nina paka 3 na mbwa 2 ..."
    assert "1 kept sample(s) still hold digits" in printed and "sw-0002" in printed
    row = next(r for r in (out / "report.tsv").read_text().splitlines() if "\tsw-0002\t" in r)
    assert "\tkept\t" in row and "digits num2words cannot spell in 'sw'" in row and "paka 3 na mbwa 2" in row


def _sentence_batches(tok, texts: list[str], lang_id: int, B: int = 4) -> list[dict]:
    """Batches of the sentences' text ids (language token first) with short audio codes that
    are a function of the text, and fixed conditioning latents: a text-loss task."""
    seqs = [np.array([lang_id] + tok.encode(t.replace(" ", "[SPACE]")).ids) for t in texts]
    out = []
    for k in range(0, len(seqs), B):
        group = seqs[k:k + B]
        lt = max(len(s) for s in group)
        ti = np.zeros((len(group), lt), np.int64)
        tt = np.full((len(group), lt), -1, np.int64)
        for r, s in enumerate(group):
            ti[r, :len(s)], tt[r, :len(s) - 1] = s, s[1:]
        ai = (ti[:, :8] * 7) % 23
        out.append({"text_inputs": ti, "text_targets": tt, "audio_inputs": ai, "audio_targets": ai.copy(),
                    "text_lengths": np.array([len(s) for s in group]), "audio_lengths": np.full(len(group), 8),
                    "cond_latents": np.zeros((len(group), 2, 32), np.float32)})
    return out


def test_rows_from_their_pieces_start_better_than_random_rows(base, extended, rng):
    """A model that knows the old vocabulary (trained 150 steps on the Vietnamese text as
    the old vocabulary spells it, letter by letter, as XTTS v2 knows Latin letters) grows to
    the new one twice: rows from their pieces' mean, and N(0, s²) rows. Over the first 200
    steps on the new tokens, the eval loss on the held-out Vietnamese is lower from the
    pieces (6 seeds: by 0.08 to 0.32 on average, by 0.5 to 0.7 at the start)."""
    doc, ext, _ = extended
    old_tok, new_tok = (tokenizers.Tokenizer.from_str(json.dumps(d)) for d in (base, doc))
    cfg = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=ext.base_size, audio_vocab_size=23,
                             max_text_tokens=96, max_audio_tokens=24, n_cond_latents=2, conditioning=False,
                             dropout=0.0)
    seed = int(rng.integers(1 << 30))
    model = pyxtts.XTTSGPT(cfg, seed=seed)
    opt = pyxtts.AdamW(model, lr=3e-3, weight_decay=0.0)
    known = _sentence_batches(old_tok, TRAIN, old_tok.token_to_id("[en]"))
    for step in range(150):
        model.zero_grad()
        model.forward_backward(known[step % len(known)])
        opt.step()
    train = _sentence_batches(new_tok, TRAIN, new_tok.token_to_id("[vi]"))
    held = _sentence_batches(new_tok, HELD, new_tok.token_to_id("[vi]"))
    curves = {}
    for init in ("mean", "random"):
        grown, gcfg, _ = resize_text_rows(model.state_dict(), cfg, base, doc, init=init, seed=seed + 1)
        m = pyxtts.XTTSGPT(gcfg)
        m.load_state_dict(grown)
        o = pyxtts.AdamW(m, lr=3e-3, weight_decay=0.0)
        curve = []
        for step in range(201):
            if step % 25 == 0:
                curve.append(float(np.mean([m.forward(b)["text_loss"] for b in held])))
            if step < 200:
                m.zero_grad()
                m.forward_backward(train[step % len(train)])
                o.step()
        curves[init] = np.array(curve)
    print("eval text loss every 25 steps: " + "; ".join(f"{k}: {np.round(v, 3).tolist()}" for k, v in curves.items()))
    assert curves["mean"][0] < curves["random"][0] - 0.2
    assert curves["mean"].mean() < curves["random"].mean()


# ---- memory: the larger vocabulary is planned ------------------------------------------------

TIERS = {"large_gpu": 80, "gpu_24gb": 24, "gpu_16gb": 16, "gpu_12gb": 12, "gpu_8gb": 8, "gpu_6gb": 6, "gpu_4gb": 4}
PLAN_DEVICES = ["cpu", "cuda:0"]


@pytest.mark.parametrize("plan_device", PLAN_DEVICES)
@pytest.mark.parametrize("name", list(TIERS))
def test_each_tier_still_fits_its_card_with_a_new_language(name, plan_device, tmp_path):
    """XTTS v2's 6,681 text rows + the default 2,000 tokens and the language token: the
    plan grows by the rows' parameters, gradients and optimizer state, and every tier still
    fits its card (the GPU plan within the 10% margin, the CPU backend's within the budget,
    as tests/test_config.py holds the tiers themselves)."""
    from pyxtts.config import XTTSConfig
    from pyxtts.text_vocab import with_vocab

    cfg = XTTSConfig.load(name)
    path = tmp_path / "vocab.json"  # 6,681 + 2,001 ids in XTTS v2's layout
    size = cfg.model.text_vocab_size + 1 + DEFAULT_NEW_TOKENS
    doc = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None, "post_processor": None,
           "decoder": None, "model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(size)}, "merges": []}}
    path.write_text(json.dumps(doc), encoding="utf-8")
    grown = with_vocab(cfg, path)
    assert grown.model.text_vocab_size == size
    before, after = cfg.memory_plan(plan_device), grown.memory_plan(plan_device)
    rows = 2001 * cfg.model.d_model * 2 + 2001  # embedding, head weight and bias
    assert after.parameter_count - before.parameter_count == rows
    limit = TIERS[name] * 2**30 * cfg.training.max_memory_fraction
    room = limit * 0.9 if plan_device != "cpu" else limit
    assert after.total <= room, f"{name}: {after.total / 2**30:.2f} GiB over {room / 2**30:.2f} GiB"


def test_memtest_and_optimize_config_plan_the_vocabulary(extended, tmp_path, capsys):
    _, ext, path = extended
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--no-step", "--vocab", str(path)]) in (0, 1)
    grown = capsys.readouterr().out
    assert grown.startswith(f"text rows: 256 -> {ext.size} ({path})\n")  # the rows used, said
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--no-step"]) in (0, 1)
    plain = capsys.readouterr().out
    assert grown.split("\n", 1)[1] != plain
    out = tmp_path / "opt.yaml"
    assert pyxtts.cli.main(["optimize-config", "--config", "cpu_demo", "--output", str(out), "--vocab",
                            str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"text rows: 256 -> {ext.size} ({path})\n")
    from pyxtts.config import XTTSConfig

    saved = XTTSConfig.load(str(out))
    # the rows and the file they are for: training.vocab was left null
    assert saved.model.text_vocab_size == ext.size and saved.training.vocab == str(path)
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--no-step", "--vocab", str(tmp_path / "no.json")]) == 2
    assert "vocab: cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["memtest", "optimize-config"])
def test_a_vocabulary_smaller_than_the_models_rows_is_refused(command, tmp_path, capsys):
    """XTTS's own 600-token test vocabulary against a 6,681-row config used to shrink the plan
    silently."""
    small = tmp_path / "vocab.json"
    small.write_text(json.dumps({"added_tokens": [], "model": {"type": "BPE", "vocab": {f"t{i}": i for i in
                                                                                      range(200)}, "merges": []}}))
    argv = {"memtest": ["memtest", "--config", "cpu_demo", "--no-step"],
            "optimize-config": ["optimize-config", "--config", "cpu_demo", "--output", str(tmp_path / "o.yaml")]}
    assert pyxtts.cli.main([*argv[command], "--vocab", str(small)]) == 2
    err = capsys.readouterr().err
    assert f"pyxtts {command}: --vocab: '{small}' has 200 text tokens, fewer than the 256 text rows of the config's " \
           "model" in err
    assert not (tmp_path / "o.yaml").exists()

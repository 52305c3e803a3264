"""The checks along the new-language path once a run exists, at the command line: a small
XTTS v2 folder written by Coqui's classes (``fixtures_speech``), two Vietnamese
vocabularies of the same size but other tokens (prepare --new-language with the same
``--new-tokens`` on two splits), and a two-step ``train --init`` run on the first.

What a new user met (each test says what was): an export or an eval set with the other
vocabulary accepted, a config's test sentences refused under ``--init``, messages that
named the wrong thing."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

sf = pytest.importorskip("soundfile", reason="the prepare extra (soundfile) is not installed")

import pyxtts.cli  # noqa: E402
from pyxtts.fingerprint import saved_extra  # noqa: E402
from pyxtts.prepare.vocab import read_vocab_doc, vocab_sha256  # noqa: E402

fx = pytest.importorskip("fixtures_prepare")
from fixtures_language import SENTENCES_VI, make_corpus  # noqa: E402
from fixtures_speech import finetune_yaml, write_xtts_folder  # noqa: E402

pytestmark = [pytest.mark.usefixtures("no_limit_no_fault"),
              pytest.mark.skipif(fx.ESPEAK is None, reason="espeak-ng is not installed")]


def cli(*argv: str | Path) -> int:
    return pyxtts.cli.main([str(a) for a in argv])


def digest(vocab: Path) -> str:
    return vocab_sha256(read_vocab_doc(vocab))


def files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    from coqui import require_coqui

    require_coqui()
    root = tmp_path_factory.mktemp("walk")
    meta = make_corpus(root / "corpus", SENTENCES_VI, "vi")
    wavs = sorted((root / "corpus" / "wavs").glob("*.wav"))
    xtts = write_xtts_folder(root / "XTTS-v2", wavs[:4])
    for name, seed in (("shards", "0"), ("other", "1")):  # other training text, the same cap
        assert cli("prepare", "--xtts-dir", xtts, "--metadata", meta, "--language", "vi", "--new-language",
                   "--new-tokens", "60", "--eval-fraction", "0.2", "--seed", seed, "--out", root / name,
                   "--no-progress") == 0
    shards, other = root / "shards", root / "other"
    size = json.loads((shards / "summary.json").read_text())["new_language"]["size"]
    assert json.loads((other / "summary.json").read_text())["new_language"]["size"] == size
    assert digest(shards / "vocab.json") != digest(other / "vocab.json")
    cfg = root / "finetune.yaml"
    cfg.write_text(finetune_yaml(2, 2), encoding="utf-8")
    run = root / "run"
    assert cli("train", "--config", cfg, "--init", xtts, "--data", shards, "--checkpoint-dir", run,
               "--no-progress") == 0
    voice = root / "voice"  # the run exported: a base that has the grown rows
    assert cli("export", "--checkpoint", run / "step_00000002.safetensors", "--base", xtts, "--out", voice,
               "--vocab", shards / "vocab.json") == 0
    return SimpleNamespace(root=root, xtts=xtts, shards=shards, other=other, size=size, cfg=cfg, run=run,
                           step=run / "step_00000002.safetensors", voice=voice, wavs=wavs)


def test_export_refuses_a_vocabulary_of_the_same_size_with_other_tokens(walk, tmp_path, capsys):
    """`export --vocab OTHER/vocab.json` was accepted when OTHER had as many tokens: the
    sizes were all it compared. The run's import records the vocabulary's digest."""
    capsys.readouterr()
    out = tmp_path / "voice"
    assert cli("export", "--checkpoint", walk.step, "--base", walk.xtts, "--out", out, "--vocab",
               walk.other / "vocab.json") == 2
    err = capsys.readouterr().err
    ours, theirs = digest(walk.shards / "vocab.json"), digest(walk.other / "vocab.json")
    assert (f"pyxtts export: --vocab: {walk.other / 'vocab.json'} (sha256 {theirs[:12]}...) is not the vocabulary "
            f"the model was trained with, {walk.shards / 'vocab.json'} (sha256 {ours[:12]}...), which "
            f"{walk.run / 'init_xtts.safetensors'} records: the same ids mean other text under it; pass --vocab "
            f"{walk.shards / 'vocab.json'}\n") == err
    assert not out.exists()
    # the import itself records it too; the right one goes through
    assert cli("export", "--checkpoint", walk.run / "init_xtts.safetensors", "--base", walk.xtts, "--out", out,
               "--vocab", walk.other / "vocab.json") == 2
    assert f"which {walk.run / 'init_xtts.safetensors'} records" in capsys.readouterr().err
    assert cli("export", "--checkpoint", walk.step, "--base", walk.xtts, "--out", out, "--vocab",
               walk.shards / "vocab.json") == 0


def test_export_refuses_a_base_whose_vocabulary_is_not_the_runs(walk, tmp_path, capsys):
    """A base that has the grown rows (an earlier export) but another vocab.json of that size
    was taken, and its vocab.json copied beside the new weights."""
    wrong = tmp_path / "wrong"
    shutil.copytree(walk.voice, wrong)
    shutil.copyfile(walk.other / "vocab.json", wrong / "vocab.json")
    capsys.readouterr()
    assert cli("export", "--checkpoint", walk.step, "--base", wrong, "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert (f"pyxtts export: --base: {wrong / 'vocab.json'} (sha256 {digest(wrong / 'vocab.json')[:12]}...) is not "
            f"the vocabulary the model was trained with, {walk.shards / 'vocab.json'}") in err
    assert f"export into the XTTS folder the run started from: pass --base {walk.xtts} and --vocab " \
           f"{walk.shards / 'vocab.json'}\n" in err
    assert not (tmp_path / "o").exists()
    # the base with the run's own vocabulary: its rows and vocab.json fit, --vocab is not needed
    assert cli("export", "--checkpoint", walk.step, "--base", walk.voice, "--out", tmp_path / "o") == 0
    assert cli("export", "--checkpoint", walk.step, "--base", walk.voice, "--out", tmp_path / "o2", "--vocab",
               walk.shards / "vocab.json") == 2
    err = capsys.readouterr().err
    # it read "export without vocab (--vocab)", as if asking for --vocab
    assert (f"pyxtts export: --vocab: not needed: the model has the base's {walk.size} text rows, so the base's own "
            f"vocab.json goes with them; export without {walk.shards / 'vocab.json'}\n") in err
    assert cli("export", "--checkpoint", walk.step, "--base", walk.xtts, "--out", tmp_path / "o3") == 2
    err = capsys.readouterr().err  # it read "pass it: vocab= (--vocab)"
    assert "pyxtts export: --vocab: missing: the model has" in err and "vocab=" not in err
    assert f"pass --vocab {walk.shards / 'vocab.json'}, the one {walk.run / 'init_xtts.safetensors'} records" in err


def test_eval_data_of_another_vocabulary_is_refused(walk, tmp_path, capsys):
    """`train --data shards-vi --eval-data shards-vi2/eval` with another vocabulary's eval
    shards was accepted: the ids of its text mean other text to the model."""
    run = tmp_path / "run"
    capsys.readouterr()
    assert cli("train", "--config", walk.cfg, "--init", walk.xtts, "--data", walk.shards, "--eval-data",
               walk.other / "eval", "--checkpoint-dir", run, "--no-progress") == 2
    err = capsys.readouterr().err
    assert (f"pyxtts train: --eval-data {walk.other / 'eval'}: its text ids come from {walk.other / 'vocab.json'} "
            f"(sha256 {digest(walk.other / 'vocab.json')[:12]}..., a new language's), and --data's from "
            f"{walk.shards / 'vocab.json'}") in err
    assert not run.exists()  # refused before the import
    assert cli("train", "--config", walk.cfg, "--init", walk.xtts, "--data", walk.shards, "--eval-data",
               walk.shards / "eval", "--checkpoint-dir", run, "--max-steps", "1", "--no-progress") == 0


def test_init_sets_xtts_dir_before_the_test_sentences_are_checked(walk, tmp_path, capsys):
    """A config with training.test_sentences and no xtts_dir, run with `train --init
    XTTS-v2`, stopped at "training.xtts_dir: must be the Coqui XTTS folder ... got None",
    though --init sets it (docs/monitoring.md)."""
    cfg = tmp_path / "ts.yaml"
    sentence = f"  test_sentences:\n    - {{text: 'Xin chào.', language: vi, reference: '{walk.wavs[0]}'}}\n"
    cfg.write_text(finetune_yaml(1, 1).replace("training:\n", "training:\n" + sentence, 1), encoding="utf-8")
    run = tmp_path / "run"
    # train/ alone: no evaluation, so nothing is spoken; the sentences are checked at the start
    assert cli("train", "--config", cfg, "--init", walk.xtts, "--data", walk.shards / "train", "--checkpoint-dir",
               run, "--no-progress") == 0, capsys.readouterr().err
    training = saved_extra(run / "step_00000001.safetensors")["config"]["training"]
    assert training["xtts_dir"] == str(walk.xtts) and training["test_sentences"][0]["text"] == "Xin chào."


def test_init_from_a_base_that_has_the_rows_says_so(walk, tmp_path, capsys):
    """`train --init voice-vi --data shards-vi` (a base exported with the new rows) printed
    "the text rows grow from 643 to 643 ... ([None]) ... 0 new ones"."""
    run = tmp_path / "run"
    capsys.readouterr()
    assert cli("train", "--config", walk.cfg, "--init", walk.voice, "--data", walk.shards / "train",
               "--checkpoint-dir", run, "--max-steps", "1", "--no-progress") == 0
    err = capsys.readouterr().err
    assert (f"pyxtts train: --init: {walk.voice} already has the {walk.size} text rows of the vocabulary "
            f"{walk.shards / 'vocab.json'} (its vocab.json has those tokens): nothing to grow") in err
    assert "grow from" not in err and "[None]" not in err
    # the run still records its vocabulary: exported into the released folder, it needs that one
    assert cli("export", "--checkpoint", run / "step_00000001.safetensors", "--base", walk.xtts, "--out",
               tmp_path / "o", "--vocab", walk.other / "vocab.json") == 2
    assert "is not the vocabulary the model was trained with" in capsys.readouterr().err
    assert cli("export", "--checkpoint", run / "step_00000001.safetensors", "--base", walk.xtts, "--out",
               tmp_path / "o", "--vocab", walk.shards / "vocab.json") == 0


def test_an_init_vocabulary_that_does_not_extend_the_base_is_named_once(walk, tmp_path, capsys):
    """It read "vocab shards-vi/vocab.json: vocab: does not extend ..."."""
    capsys.readouterr()
    assert cli("train", "--config", walk.cfg, "--init", walk.voice, "--data", walk.other, "--checkpoint-dir",
               tmp_path / "run", "--no-progress") == 2
    err = capsys.readouterr().err
    assert (f"pyxtts train: --init {walk.voice}: vocab {walk.other / 'vocab.json'}: does not extend the base "
            "vocabulary: ") in err and "vocab: does not extend" not in err


def test_resume_without_init_names_the_folder_the_run_started_from(walk, capsys):
    """A --resume without --init said "start from XTTS v2 with --init XTTS_DIR"."""
    before = files(walk.run)
    capsys.readouterr()
    assert cli("train", "--config", walk.cfg, "--data", walk.shards, "--checkpoint-dir", walk.run, "--resume",
               "--no-progress") == 2
    err = capsys.readouterr().err
    assert (f"pyxtts train: --data {walk.shards}: its text ids come from {walk.shards / 'vocab.json'} ({walk.size} "
            f"tokens, a new language's), but the model has 6681 text rows; the run in {walk.run} started from "
            f"{walk.xtts}: add --init {walk.xtts} to continue it\n") in err
    assert files(walk.run) == before


def test_more_recordings_of_the_taught_language_continue_from_its_export(walk, tmp_path, capsys):
    """More Vietnamese for a model already taught it could not be prepared: prepare refused
    'vi' without --new-language, and --new-language learnt another vocabulary. `prepare
    --vocab` takes the export's vocab.json; the export then trains on it with nothing to
    grow, and exports again with that vocabulary."""
    more = tmp_path / "more"
    meta = make_corpus(tmp_path / "corpus", SENTENCES_VI[:6], "vi")
    capsys.readouterr()
    assert cli("prepare", "--xtts-dir", walk.xtts, "--metadata", meta, "--language", "vi", "--vocab",
               walk.voice / "vocab.json", "--out", more, "--no-progress") == 0
    assert digest(more / "vocab.json") == digest(walk.shards / "vocab.json")
    run = tmp_path / "run"
    assert cli("train", "--config", walk.cfg, "--init", walk.voice, "--data", more, "--checkpoint-dir", run,
               "--max-steps", "1", "--no-progress") == 0
    assert "nothing to grow" in capsys.readouterr().err
    assert cli("export", "--checkpoint", run / "step_00000001.safetensors", "--base", walk.xtts, "--out",
               tmp_path / "o", "--vocab", more / "vocab.json") == 0
    ref = tmp_path / "ref.wav"
    sf.write(str(ref), sf.read(str(walk.wavs[0]))[0], sf.info(str(walk.wavs[0])).samplerate)
    assert cli("speak", "--xtts-dir", tmp_path / "o", "--language", "vi", "--text", SENTENCES_VI[0], "--reference",
               ref, "--out", tmp_path / "minh.wav") == 0, capsys.readouterr().err
    assert sf.info(str(tmp_path / "minh.wav")).frames > 0

"""`pyxtts speak` and `pyxtts.speak.synthesize`: text spoken by an XTTS folder, or by a
pyxtts checkpoint exported first into a scratch copy of its base, through Coqui's inference
in a child process; every refusal names its flag and leaves --out as it was."""
from __future__ import annotations

import os
import signal
import wave
from pathlib import Path

import numpy as np
import pytest

import pyxtts
import pyxtts.cli
import pyxtts.speak
from coqui import require_coqui
from conftest import SEED
from fixtures_xtts import write_xtts_folder
from pyxtts.speak import synthesize, write_wav

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    require_coqui()
    return write_xtts_folder(tmp_path_factory.mktemp("xtts") / "XTTS-v2", SEED % 2**31, decoder_input_dim=64)


@pytest.fixture
def voice(tmp_path):
    path = tmp_path / "me.wav"
    write_wav(path, 0.1 * np.random.default_rng(SEED).standard_normal(3 * 22050).astype(np.float32), 22050)
    return path


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in sorted(folder.rglob("*"))}


@pytest.mark.slow
def test_an_xtts_folder_speaks_into_a_wav_file(base, voice, tmp_path, capsys):
    out = tmp_path / "clips" / "hello.wav"  # its folder is made
    rc = pyxtts.cli.main(["speak", "--xtts-dir", str(base), "--text", "hello there", "--reference", str(voice),
                          "--out", str(out)])
    text = capsys.readouterr()
    assert rc == 0, text.err
    with wave.open(str(out)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        assert f"written: {out} ({w.getnframes() / 24000:.1f} s at 24000 Hz)" in text.out
    assert pcm.size > 0 and np.count_nonzero(pcm) > pcm.size // 2  # sound, not the silence NaN would give
    assert [p.name for p in out.parent.iterdir()] == ["hello.wav"]  # no scratch left


def test_a_checkpoint_is_exported_into_a_scratch_copy_of_its_base_and_spoken(base, voice, tmp_path, capsys,
                                                                               monkeypatch):
    """--checkpoint best of a run: the child is given an export of that checkpoint (its
    model.pth holds the checkpoint's GPT), the clips land in --out, and the scratch goes."""
    c = require_coqui()
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    best = pyxtts.XTTSGPT(cfg, seed=3)
    run = tmp_path / "run"
    pyxtts.save_checkpoint(run / "best.safetensors", best, step=4)
    pyxtts.save_checkpoint(run / "step_00000008.safetensors", pyxtts.XTTSGPT(cfg, seed=5), step=8)
    seen = {}

    def child(export_dir, sentences, out_dir, seed):
        state = c.torch.load(export_dir / "model.pth", map_location="cpu", weights_only=False)["model"]
        seen.update(head=state["gpt.mel_head.weight"].numpy().copy(), sentences=sentences, seed=seed)
        out_dir.mkdir(parents=True)
        for i, s in enumerate(sentences):
            write_wav(out_dir / f"{i}.wav", np.full(240, 0.01 * (i + 1), np.float32), 24000)
        return [out_dir / f"{i}.wav" for i in range(len(sentences))]

    monkeypatch.setattr(pyxtts.speak, "speak", child)
    out = tmp_path / "clips"
    rc = pyxtts.cli.main(["speak", "--checkpoint", "best", "--checkpoint-dir", str(run), "--base", str(base),
                          "--text", "hello there", "--text", "guten tag", "--language", "de", "--reference",
                          str(voice), "--out", str(out), "--seed", "7"])
    text = capsys.readouterr()
    assert rc == 0, text.err
    assert f"--checkpoint best: {run / 'best.safetensors'} of the run in {run}" in text.out
    assert f"with {run / 'best.safetensors'} (step 4) exported into a scratch copy of {base}" in text.out
    assert seen["head"].tobytes() == best.state_dict()["mel_head.weight"].tobytes()
    assert [s["text"] for s in seen["sentences"]] == ["hello there", "guten tag"] and seen["seed"] == 7
    assert {s["language"] for s in seen["sentences"]} == {"de"}
    assert sorted(p.name for p in out.iterdir()) == ["0.wav", "1.wav"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips", "me.wav", "run"]  # the export is gone


def test_latest_of_a_run_that_removes_it_meanwhile_speaks_the_newest(base, voice, tmp_path, capsys, monkeypatch):
    """`--checkpoint latest` of a run training with keep_checkpoints 1: the run saved step 20
    and removed step 10 between speak's choosing step 10 and exporting it, and speak failed
    on a file it had just found. It speaks the run's newest, step 20, as export does, and
    the step it names is the one exported."""
    c = require_coqui()
    from helpers.pruning import save_lands_before_the_read

    run = tmp_path / "run"
    newer = save_lands_before_the_read(monkeypatch, pyxtts.ModelConfig.from_xtts_config(base / "config.json"), run)
    seen = {}

    def child(export_dir, sentences, out_dir, seed):
        state = c.torch.load(export_dir / "model.pth", map_location="cpu", weights_only=False)["model"]
        seen.update(head=state["gpt.mel_head.weight"].numpy().copy())
        out_dir.mkdir(parents=True)
        write_wav(out_dir / "0.wav", np.full(240, 0.01, np.float32), 24000)
        return [out_dir / "0.wav"]

    monkeypatch.setattr(pyxtts.speak, "speak", child)
    out = tmp_path / "hi.wav"
    rc = pyxtts.cli.main(["speak", "--checkpoint", "latest", "--checkpoint-dir", str(run), "--base", str(base),
                          "--text", "hello there", "--reference", str(voice), "--out", str(out)])
    text = capsys.readouterr()
    assert rc == 0, text.err
    assert seen["head"].tobytes() == newer.state_dict()["mel_head.weight"].tobytes()
    assert f"with {run / 'step_00000020.safetensors'} (step 20) exported into a scratch copy" in text.out, text.out
    assert out.is_file()


def refusal_cases(tmp_path: Path, base: Path, voice: Path) -> list[tuple[list[str], str]]:
    xtts = ["--xtts-dir", str(base)]
    one = ["--text", "hello", "--reference", str(voice)]
    return [
        ([*xtts, *one, "--out", str(tmp_path / "old.wav")], "--out: "),  # exists: needs --overwrite
        ([*xtts, "--text", "a b", "--text", "c d", "--reference", str(voice), "--out", str(tmp_path / "n/two.wav")],
         "--out: expected a folder for 2 texts"),
        ([*xtts, "--text", "hello", "--reference", str(tmp_path / "nope.wav"), "--out", str(tmp_path / "n/a.wav")],
         "--reference: expected a recording of the voice to clone"),
        ([*xtts, *one, "--language", "EN", "--out", str(tmp_path / "n/a.wav")], "did you mean 'en'?"),
        ([*xtts, *one, "--language", "zh", "--out", str(tmp_path / "n/a.wav")], "did you mean 'zh-cn'?"),
        (["--xtts-dir", str(base) + "x", *one, "--out", str(tmp_path / "n/a.wav")],
         "--xtts-dir: expected a Coqui XTTS folder holding config.json"),
        ([*xtts, "--text", "hi", "--text", "hello " * 40, "--reference", str(voice), "--out", str(tmp_path / "n/d")],
         "--text #2: expected fewer than"),
        ([*xtts, "--base", str(base), *one, "--out", str(tmp_path / "n/a.wav")], "--base: only used with --checkpoint"),
        (["--checkpoint", str(tmp_path / "c.safetensors"), *one, "--out", str(tmp_path / "n/a.wav")],
         "--base: expected the Coqui XTTS folder"),
        ([*xtts, *one, "--seed", "-1", "--out", str(tmp_path / "n/a.wav")], "--seed: expected an int >= 0"),
        ([*xtts, *one, "--out", str(tmp_path / "old.wav" / "x")], "--out: the folder"),
        ([*xtts, "--text", "hello", "--reference", str(tmp_path / "old.wav"), "--out", str(tmp_path / "." / "old.wav"),
          "--overwrite"], f"--out: {str(tmp_path / 'old.wav')!r} is the recording the voice is cloned from"),
        (["--checkpoint", "best", "--checkpoint-dir", str(tmp_path / "norun"), "--base", str(base), *one,
          "--out", str(tmp_path / "n/a.wav")], "--checkpoint best: no run in"),
    ]


def test_refusals_name_the_flag_and_change_nothing(base, voice, tmp_path, capsys):
    (tmp_path / "old.wav").write_bytes(b"an earlier clip")
    before = listing(tmp_path)
    for argv, said in refusal_cases(tmp_path, base, voice):
        rc = pyxtts.cli.main(["speak", *argv])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("pyxtts speak: ") and said in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err
        assert listing(tmp_path) == before, argv  # no folder made, nothing replaced


def test_a_failing_child_leaves_out_as_it_was(base, voice, tmp_path, capsys, monkeypatch):
    """The child's last line is said; the folders made for the clips and the scratch go."""
    def child(export_dir, sentences, out_dir, seed):
        out_dir.mkdir(parents=True)
        write_wav(out_dir / "0.wav", np.zeros(10, np.float32), 24000)
        raise RuntimeError("speaking failed (exit 1): UserWarning: a warning of Coqui's\n"
                           "sentence 1: 9 of 9 samples for 1.wav are NaN or inf: ...")

    monkeypatch.setattr(pyxtts.speak, "speak", child)
    before = listing(tmp_path)
    rc = pyxtts.cli.main(["speak", "--xtts-dir", str(base), "--text", "a", "--text", "b", "--reference", str(voice),
                          "--out", str(tmp_path / "new" / "deeper")])
    err = capsys.readouterr().err
    assert rc == 2 and err == "pyxtts speak: speaking failed (exit 1): sentence 1: 9 of 9 samples for 1.wav are " \
                              "NaN or inf: ...\n"
    assert listing(tmp_path) == before


def clips_child(export_dir, sentences, out_dir, seed):
    """The child's clips, without Coqui: one constant clip per sentence, its level the seed's."""
    out_dir.mkdir(parents=True)
    for i in range(len(sentences)):
        write_wav(out_dir / f"{i}.wav", np.full(240, 0.01 * (seed + 1), np.float32), 24000)
    return [out_dir / f"{i}.wav" for i in range(len(sentences))]


def speak_argv(base, voice, out, *more):
    return ["speak", "--xtts-dir", str(base), "--text", "hello", "--reference", str(voice), "--out", str(out), *more]


def test_a_second_speak_into_a_folder_being_spoken_into_is_refused(base, voice, tmp_path, capsys, monkeypatch):
    """Two speaks into one --out folder at once: the second found no clip there yet (the
    first one's were still being spoken) and its clips then replaced the first one's,
    though neither had --overwrite (with it, the clips of the two were mixed). The second
    is refused while the first holds the folder; the first's clips land whole."""
    out = tmp_path / "clips"
    second: list[tuple[int, str]] = []

    def first_child(export_dir, sentences, out_dir, seed):
        monkeypatch.setattr(pyxtts.speak, "speak", clips_child)  # the second's child, had it one
        for more in ([], ["--overwrite"]):
            rc = pyxtts.cli.main(speak_argv(base, voice, out, "--seed", "5", *more))
            second.append((rc, capsys.readouterr().err))
        return clips_child(export_dir, sentences, out_dir, seed)

    monkeypatch.setattr(pyxtts.speak, "speak", first_child)
    assert pyxtts.cli.main(speak_argv(base, voice, out, "--text", "two")) == 0, capsys.readouterr().err
    refused = f"pyxtts speak: --out: {str(out)!r} is in use by another pyxtts command writing into it: wait for it " \
              "to end, or speak into another folder\n"
    assert second == [(2, refused), (2, refused)]
    assert listing(out) == {"0.wav": (out / "0.wav").read_bytes(), "1.wav": (out / "1.wav").read_bytes()}
    with wave.open(str(out / "0.wav")) as w:
        assert np.frombuffer(w.readframes(240), "<i2")[0] == int(0.01 * 32767)  # seed 0's: the first's


def test_a_wav_file_written_meanwhile_is_not_replaced(base, voice, tmp_path, capsys, monkeypatch):
    """Two speaks into one .wav file at once (without --overwrite): the one that ends last
    found no file when it started and replaced the other's clip. It now refuses, naming
    the file, which keeps the other's clip; other .wav files of the folder are spoken
    into meanwhile as before."""
    out = tmp_path / "hello.wav"
    seen: list[int] = []

    def first_child(export_dir, sentences, out_dir, seed):
        monkeypatch.setattr(pyxtts.speak, "speak", clips_child)  # the others' children
        seen.append(pyxtts.cli.main(speak_argv(base, voice, out, "--seed", "5")))
        seen.append(pyxtts.cli.main(speak_argv(base, voice, tmp_path / "other.wav", "--seed", "5")))
        return clips_child(export_dir, sentences, out_dir, seed)

    monkeypatch.setattr(pyxtts.speak, "speak", clips_child)
    pyxtts.cli.main(speak_argv(base, voice, tmp_path / "theirs.wav", "--seed", "5"))
    theirs = (tmp_path / "theirs.wav").read_bytes()
    monkeypatch.setattr(pyxtts.speak, "speak", first_child)
    capsys.readouterr()
    assert pyxtts.cli.main(speak_argv(base, voice, out)) == 2
    assert seen == [0, 0]
    assert capsys.readouterr().err.splitlines()[-1] == f"pyxtts speak: --out: {str(out)!r} was written by another " \
                                                       "process while this one spoke; --overwrite replaces it"
    assert out.read_bytes() == theirs and (tmp_path / "other.wav").read_bytes() == theirs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hello.wav", "me.wav", "other.wav", "theirs.wav"]


def test_ctrl_c_while_speaking_leaves_out_as_it_was_and_after_it_the_clips_whole(base, voice, tmp_path, capsys,
                                                                                  monkeypatch):
    """Ctrl-C while the child speaks: --out is as it was (the folders made for it and the
    scratch gone), and the last line says so. One that lands while the clips are moved into
    place (it stopped the moves half-way: the first text's clip new, the second's the
    earlier speak's) is taken once they all are, and the line says the clips are there."""
    out = tmp_path / "new" / "clips"

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(pyxtts.speak, "speak", interrupted)
    before = listing(tmp_path)
    assert pyxtts.cli.main(speak_argv(base, voice, out, "--text", "two")) == 130
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"pyxtts speak: interrupted; no clip was written ({out} is as it was)"
    assert listing(tmp_path) == before
    monkeypatch.setattr(pyxtts.speak, "speak", clips_child)
    real_link = os.link

    def link_then_ctrl_c(src, dst):
        real_link(src, dst)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "link", link_then_ctrl_c)
    assert pyxtts.cli.main(speak_argv(base, voice, out, "--text", "two")) == 130
    monkeypatch.undo()
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"pyxtts speak: interrupted once the clips were in place: {out / '0.wav'}, {out / '1.wav'}"
    assert sorted(p.name for p in out.iterdir()) == ["0.wav", "1.wav"]


def never_started(*args):
    raise AssertionError("the child was started")


@pytest.mark.parametrize("samples, rate, said", [
    (np.full(7000, 0.1, np.float32), 22050, "expected a recording of at least 0.33 s"),  # Coqui fails on it late
    (np.full(2000, 0.1, np.float32), 8000, "got 0.25 s"),
    (np.zeros(3 * 22050, np.float32), 22050, "which is silent"),
    (np.array([0.1, np.nan] * 22050, np.float32), 22050, "expected finite samples"),
])
def test_a_reference_that_clones_no_voice_is_refused_before_the_child(base, tmp_path, capsys, monkeypatch,
                                                                      samples, rate, said):
    soundfile = pytest.importorskip("soundfile")
    ref = tmp_path / "ref.wav"
    soundfile.write(str(ref), samples, rate, subtype="FLOAT")
    monkeypatch.setattr(pyxtts.speak, "speak", never_started)
    before = listing(tmp_path)
    rc = pyxtts.cli.main(["speak", "--xtts-dir", str(base), "--text", "hello", "--reference", str(ref),
                          "--out", str(tmp_path / "n" / "a.wav")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("pyxtts speak: --reference: ") and said in err, err
    assert listing(tmp_path) == before


def test_an_out_folder_that_cannot_be_written_is_named(base, voice, tmp_path, capsys, monkeypatch):
    """A read-only folder: the refusal names --out and its folder, not the scratch inside it."""
    def read_only(**kwargs):
        raise OSError(30, "Read-only file system", str(kwargs["dir"] / ".pyxtts-speak-x"))

    monkeypatch.setattr(pyxtts.speak.tempfile, "mkdtemp", read_only)
    monkeypatch.setattr(pyxtts.speak, "speak", never_started)
    before = listing(tmp_path)
    rc = pyxtts.cli.main(["speak", "--xtts-dir", str(base), "--text", "hello", "--reference", str(voice),
                          "--out", str(tmp_path / "a.wav")])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"pyxtts speak: --out: the folder {str(tmp_path)!r} cannot be written " \
                              "(Read-only file system)\n"
    assert listing(tmp_path) == before


def test_without_coqui_the_install_is_named(base, voice, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pyxtts.speak, "coqui_installed", lambda: False)
    rc = pyxtts.cli.main(["speak", "--xtts-dir", str(base), "--text", "a", "--reference", str(voice),
                          "--out", str(tmp_path / "a.wav")])
    err = capsys.readouterr().err
    assert rc == 2 and "pip install coqui-tts" in err and not (tmp_path / "a.wav").exists()


@pytest.mark.parametrize("kwargs, kind, said", [
    ({"texts": []}, TypeError, "texts: expected a non-empty str"),
    ({"texts": ["a", 3]}, TypeError, "texts: expected a non-empty str"),
    ({"texts": "  "}, TypeError, "texts: expected a non-empty str"),
    ({"language": None}, TypeError, "language: expected a language code"),
    ({"overwrite": "yes"}, TypeError, "overwrite: expected a bool"),
    ({"out": None}, TypeError, "out: "),
    ({"xtts_dir": None}, ValueError, "got neither"),
    ({"checkpoint": "c.safetensors", "base": "b"}, ValueError, "got both"),
])
def test_synthesize_checks_its_arguments(voice, tmp_path, kwargs, kind, said):
    args = {"texts": "hello", "out": tmp_path / "a.wav", "reference": voice, "xtts_dir": tmp_path / "x", **kwargs}
    with pytest.raises(kind, match=said):
        synthesize(**args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["me.wav"]


def test_write_wav_refuses_non_finite_samples(tmp_path):
    """A NaN cast to int16 is 0: a broken model's clip would be silence, said as nothing."""
    x = np.full(100, 0.5, np.float32)
    x[[3, 50]] = [np.nan, np.inf]
    with pytest.raises(ValueError, match="2 of 100 samples for a.wav are NaN or inf"):
        write_wav(tmp_path / "a.wav", x, 24000)
    assert not (tmp_path / "a.wav").exists()

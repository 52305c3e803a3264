"""training.test_sentences: spoken at each evaluation by Coqui's inference in a child
process, written as WAV files and into TensorBoard's audio tab; refused before any step
when they cannot be spoken; a note and no samples without coqui-tts (issue 25, part 3)."""
from __future__ import annotations

import dataclasses
import json
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

import pyxtts
from coqui import require_coqui
from conftest import SEED
from fixtures_xtts import SMALL_ARGS, write_vocab, write_xtts_folder
from pyxtts import SyntheticDataset, Trainer, XTTSConfig
from pyxtts.callbacks import samples_dir
from pyxtts.callbacks.samples import INSTALL_HINT, NO_EVALUATION
from pyxtts.speak import write_wav

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")


def reference_clip(path: Path, rng: np.random.Generator, seconds: float = 3.0, rate: int = 22050) -> Path:
    write_wav(path, 0.1 * rng.standard_normal(int(seconds * rate)).astype(np.float32), rate)
    return path


def fake_xtts_dir(folder: Path) -> Path:
    """What the checks before training read of an XTTS folder: config.json's languages,
    vocab.json's tokenizer and that model.pth is there (nothing loads it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"languages": ["en", "de", "zh-cn"]}))
    write_vocab(folder / "vocab.json", SMALL_ARGS["gpt_number_text_tokens"])
    (folder / "model.pth").write_bytes(b"")
    return folder


def make_config(tmp_path: Path, xtts_dir: Path | None, sentences: list[dict], model: dict | None = None,
                **training) -> XTTSConfig:
    t = {"learning_rate": 1e-3, "lr_schedule": "constant", "max_steps": 2, "epochs": None,
         "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_interval": 100, "eval_interval": 2,
         "device": "cpu", "enable_memory_cleanup": False, "max_memory_fraction": 1.0,
         "xtts_dir": None if xtts_dir is None else str(xtts_dir), "test_sentences": sentences, **training}
    m = model or {"n_layers": 1, "d_model": 32, "n_heads": 2, "text_vocab_size": 300, "audio_vocab_size": 1026,
                  "max_text_tokens": 20, "max_audio_tokens": 30, "n_cond_latents": 0, "conditioning": False}
    return XTTSConfig.from_dict({"model": m, "training": t, "data": {"batch_size": 2, "num_workers": 0}})


@pytest.mark.slow
def test_sentences_are_spoken_in_a_child_at_each_evaluation(tmp_path, rng, monkeypatch):
    """Neither torch nor Coqui can be imported by the trainer's process here, yet every
    evaluation's sentences are spoken: by the child. The files are WAV at Coqui's 24 kHz,
    and TensorBoard's audio tab holds their bytes."""
    require_coqui()
    base = write_xtts_folder(tmp_path / "XTTS-v2", SEED % 2**31, decoder_input_dim=64)
    model = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    ref = reference_clip(tmp_path / "speaker.wav", rng)
    other = reference_clip(tmp_path / "at_16k.wav", rng, rate=16000)  # resampled to Coqui's 22,050 Hz
    sentences = [{"text": "hello there", "language": "en", "reference": str(ref)},
                 {"text": "guten tag", "language": "de", "reference": str(other)}]
    cfg = make_config(tmp_path, base, sentences, model=dataclasses.asdict(model))
    train, held = SyntheticDataset(cfg.model, 6, seed=0).split(2)
    for name in ("torch", "TTS"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of either fails in this process
    r = Trainer(cfg, progress=False).fit(train, held)
    monkeypatch.undo()
    assert [e["step"] for e in r.evals] == [0, 2]
    folder = samples_dir(tmp_path / "ckpt")
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000000", "step_00000002"]  # no export left
    for step in ("step_00000000", "step_00000002"):
        assert sorted(p.name for p in (folder / step).iterdir()) == ["0.wav", "1.wav"]
        for clip in (folder / step).iterdir():
            with wave.open(str(clip)) as w:
                assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
                pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
                assert pcm.size > 0 and np.count_nonzero(pcm) > pcm.size // 2  # sound, not NaN's silence
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed: the WAV files are "
                                              "checked, TensorBoard's audio tab is not")
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    acc = ea.EventAccumulator(str(tmp_path / "ckpt"), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    for i, s in enumerate(sentences):
        events = acc.Tensors(f"samples/{i}")
        assert [e.step for e in events] == [0, 2]
        for e in events:
            (wav, label), = tensor_util.make_ndarray(e.tensor_proto)
            assert wav == (folder / f"step_{e.step:08d}" / f"{i}.wav").read_bytes()
            assert label.decode() == s["text"]


def test_without_coqui_one_line_says_so_and_training_goes_on(tmp_path, rng, monkeypatch, capsys):
    monkeypatch.setattr(pyxtts.speak, "coqui_installed", lambda: False)
    ref = reference_clip(tmp_path / "speaker.wav", rng)
    cfg = make_config(tmp_path, fake_xtts_dir(tmp_path / "xtts"),
                      [{"text": "hello", "language": "en", "reference": str(ref)}])
    train, held = SyntheticDataset(cfg.model, 6, seed=0).split(2)
    t = Trainer(cfg, progress=False)  # said without progress too
    r = t.fit(train, held)
    cfg.training.max_steps = 3
    t.fit(train, held)  # said once per trainer
    err = capsys.readouterr().err
    assert r.step == 2 and t.step == 3
    assert [line for line in err.splitlines() if "coqui-tts" in line] == [INSTALL_HINT]
    assert list(samples_dir(tmp_path / "ckpt").iterdir()) == []


def test_without_evaluation_data_one_line_says_none_are_spoken(tmp_path, rng, monkeypatch, capsys):
    """Coqui's trainer speaks its test sentences at each epoch's end whether it evaluates or
    not; pyxtts speaks them at each evaluation, so a run without evaluation data (prepare
    without --eval-fraction) spoke none, silently."""
    monkeypatch.setattr(pyxtts.speak, "coqui_installed", lambda: True)
    ref = reference_clip(tmp_path / "speaker.wav", rng)
    cfg = make_config(tmp_path, fake_xtts_dir(tmp_path / "xtts"),
                      [{"text": "hello", "language": "en", "reference": str(ref)}])
    r = Trainer(cfg, progress=False).fit(SyntheticDataset(cfg.model, 6, seed=0))  # said without progress too
    err = capsys.readouterr().err
    assert r.step == 2 and r.evals == []
    assert [line for line in err.splitlines() if "test_sentences" in line] == [NO_EVALUATION]
    assert list(samples_dir(tmp_path / "ckpt").iterdir()) == []


def test_a_failure_to_speak_is_said_and_training_goes_on(tmp_path, rng, monkeypatch, capsys):
    """An XTTS folder the checks accept but whose model.pth cannot be read: the export
    fails at each evaluation, which says so, and the run ends as it would have."""
    monkeypatch.setattr(pyxtts.speak, "coqui_installed", lambda: True)
    ref = reference_clip(tmp_path / "speaker.wav", rng)
    cfg = make_config(tmp_path, fake_xtts_dir(tmp_path / "xtts"),
                      [{"text": "hello", "language": "en", "reference": str(ref)}])
    train, held = SyntheticDataset(cfg.model, 6, seed=0).split(2)
    r = Trainer(cfg, progress=False).fit(train, held)
    err = capsys.readouterr().err
    assert (r.step, r.stopped, [e["step"] for e in r.evals]) == (2, "max_steps", [0, 2])
    said = [line for line in err.splitlines() if "the test sentences could not be spoken" in line]
    assert [line.split(":")[0] for line in said] == ["step 0", "step 2"]
    assert all("CheckpointError" in line for line in said), said
    assert list(samples_dir(tmp_path / "ckpt").iterdir()) == []  # no export left behind


@pytest.mark.parametrize("change, kind, said", [
    (lambda s, tmp: {**s, "reference": str(tmp / "missing.wav")}, FileNotFoundError,
     "training.test_sentences[1].reference: expected a recording of the voice to clone, got '{tmp}/missing.wav', "
     "which is not a file"),
    (lambda s, tmp: {**s, "language": "xx"}, ValueError,
     "training.test_sentences[1].language: expected one of the languages of xtts (en, de, zh-cn), got 'xx'"),
    (lambda s, tmp: {**s, "language": "EN"}, ValueError,
     "training.test_sentences[1].language: expected one of the languages of xtts (en, de, zh-cn), got 'EN'; "
     "did you mean 'en'?"),
    (lambda s, tmp: {**s, "text": "a much longer sentence than the model takes"}, ValueError,
     "training.test_sentences[1].text: expected fewer than 20 text tokens (the model's max_text_tokens), got "),
    (lambda s, tmp: {**s, "reference": str(tmp / "not_audio.wav")}, ValueError,
     "training.test_sentences[1].reference: '{tmp}/not_audio.wav' is not a readable audio file"),
])
def test_bad_sentences_are_refused_before_any_step(tmp_path, rng, change, kind, said):
    ref = reference_clip(tmp_path / "speaker.wav", rng)
    (tmp_path / "not_audio.wav").write_text("no audio here")
    good = {"text": "hi", "language": "en", "reference": str(ref)}
    cfg = make_config(tmp_path, fake_xtts_dir(tmp_path / "xtts"), [good, change(good, tmp_path)])
    train, held = SyntheticDataset(cfg.model, 6, seed=0).split(2)
    t = Trainer(cfg, progress=False)
    with pytest.raises(kind) as caught:
        t.fit(train, held)
    assert said.format(tmp=tmp_path) in str(caught.value)
    assert t.step == 0 and not (tmp_path / "ckpt" / "train_log.jsonl").exists()


def test_a_samples_folder_that_cannot_be_written_is_refused_before_any_step(tmp_path, rng):
    ref = reference_clip(tmp_path / "speaker.wav", rng)
    (tmp_path / "a_file").write_text("")
    cfg = make_config(tmp_path, fake_xtts_dir(tmp_path / "xtts"),
                      [{"text": "hi", "language": "en", "reference": str(ref)}],
                      checkpoint_dir=str(tmp_path / "a_file" / "ckpt"))
    train, held = SyntheticDataset(cfg.model, 6, seed=0).split(2)
    t = Trainer(cfg, progress=False)
    with pytest.raises(ValueError, match=r"training.test_sentences: the samples folder '.*a_file/ckpt/samples' "
                                         r"cannot be written \(Not a directory\)"):
        t.fit(train, held)
    assert t.step == 0


def test_the_config_checks_the_entries_and_needs_the_xtts_folder(tmp_path):
    s = {"text": "hi", "language": "en", "reference": "r.wav"}
    with pytest.raises(ValueError, match="training.xtts_dir: must be the Coqui XTTS folder the run fine-tunes "
                                         "when training.test_sentences is set"):
        make_config(tmp_path, None, [s])
    with pytest.raises(ValueError, match="training.test_sentences\\[0\\]: unknown key 'speaker'"):
        make_config(tmp_path, tmp_path, [{**s, "speaker": "x"}])
    # Coqui's GPTTrainerConfig entry, pasted from a recipe: its key named, and what pyxtts takes instead
    coquis = {"text": "hi", "speaker_wav": ["r.wav"], "language": "en"}
    with pytest.raises(ValueError, match=r"^training.test_sentences\[0\]: unknown key 'speaker_wav' \(Coqui's name\); "
                                         r"pyxtts takes one recording of the voice as 'reference', a path \(not a "
                                         r"list\), with 'text' and 'language'$"):
        make_config(tmp_path, tmp_path, [coquis])
    with pytest.raises(TypeError, match="training.test_sentences\\[0\\].text: expected a non-empty string, got 3"):
        make_config(tmp_path, tmp_path, [{**s, "text": 3}])
    with pytest.raises(ValueError, match="training.test_sentences\\[0\\].language: expected a non-empty string, "
                                         "got ''"):
        make_config(tmp_path, tmp_path, [{**s, "language": ""}])
    with pytest.raises(TypeError, match="training.test_sentences\\[0\\]: expected a mapping with keys text, "
                                        "language, reference, got 'hi'"):
        make_config(tmp_path, tmp_path, ["hi"])


def test_reference_clips_in_a_yaml_are_relative_to_its_folder(tmp_path):
    (tmp_path / "cfg").mkdir()
    path = tmp_path / "cfg" / "run.yaml"
    path.write_text("training:\n  xtts_dir: XTTS-v2\n  test_sentences:\n"
                    "    - {text: hi, language: en, reference: voices/a.wav}\n")
    t = XTTSConfig.load(path).training
    assert t.xtts_dir == str(tmp_path / "cfg" / "XTTS-v2")
    assert t.test_sentences == [{"text": "hi", "language": "en", "reference": str(tmp_path / "cfg" / "voices/a.wav")}]


def test_relative_references_reach_the_child_as_absolute_paths(tmp_path, monkeypatch):
    """`pyxtts train --config run.yaml` (a relative path) left the references relative to
    the working directory, and the child, which runs in the samples folder, could not
    read them: every evaluation said the file was unreadable."""
    import json
    import subprocess

    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "run.yaml").write_text("training:\n  xtts_dir: XTTS-v2\n  test_sentences:\n"
                                               "    - {text: hi, language: en, reference: voices/a.wav}\n")
    monkeypatch.chdir(tmp_path)
    t = XTTSConfig.load("cfg/run.yaml").training
    assert t.test_sentences[0]["reference"] == str(tmp_path / "cfg" / "voices" / "a.wav")

    seen = []

    def child(cmd, **kwargs):  # what the child would read
        seen.append(json.loads(Path(cmd[-2]).read_text(encoding="utf-8")))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", child)
    pyxtts.speak.speak(tmp_path / "export", [{"text": "hi", "language": "en", "reference": "voices/b.wav"}],
                       tmp_path / "samples" / "step_1", seed=0)
    assert seen[0]["sentences"][0]["reference"] == str(tmp_path / "voices" / "b.wav")


def test_the_trainers_memory_stays_flat_over_20_evaluations_with_samples(tmp_path, rng, monkeypatch):
    """Each evaluation exports the weights and hands the sentences to a child; the trainer
    keeps nothing of it. The child is replaced here by one that writes a short wave (its
    own memory is another process's); the trainer's allocator and RSS are read at each of
    21 evaluations: neither grows past what the first evaluations held."""
    require_coqui()
    from pyxtts.callbacks import Callback
    from pyxtts.monitor import _rss_bytes

    base = write_xtts_folder(tmp_path / "XTTS-v2", SEED % 2**31, decoder_input_dim=64)
    model = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    ref = reference_clip(tmp_path / "speaker.wav", rng)
    sentences = [{"text": "hello there", "language": "en", "reference": str(ref)}]
    cfg = make_config(tmp_path, base, sentences, model=dataclasses.asdict(model), max_steps=20, eval_interval=1)
    exported = []

    def fake_speak(export_dir: Path, entries: list, out_dir: Path, seed: int) -> list[Path]:
        exported.append((export_dir / "model.pth").stat().st_size)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_wav(out_dir / "0.wav", np.zeros(2400, np.float32), 24000)
        return [out_dir / "0.wav"]

    monkeypatch.setattr(pyxtts.speak, "coqui_installed", lambda: True)
    monkeypatch.setattr(pyxtts.speak, "speak", fake_speak)

    class Memory(Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[int, int]] = []

        def on_audio(self, run, step, clips) -> None:
            self.seen.append((pyxtts.memory_allocated("cpu"), _rss_bytes()))

    mem = Memory()
    train, held = SyntheticDataset(cfg.model, 6, seed=0).split(2)
    Trainer(cfg, progress=False, callbacks=[mem]).fit(train, held)
    assert len(mem.seen) == 21 and len(exported) == 21 and min(exported) > 0
    allocated = [a for a, _ in mem.seen]
    # the allocator's: what the last evaluations hold, the first ones held already (the step
    # arena follows the batches' shapes, so it is not the same at every evaluation)
    assert max(allocated[11:]) <= max(allocated[1:6]), allocated
    rss = np.array([r for _, r in mem.seen], dtype=np.float64)
    growth = rss[11:].max() - np.median(rss[2:7])  # after the first exports warmed the allocator
    # what a leak looks like: something kept per evaluation grows RSS at every one of them, so
    # the typical (median) growth between two evaluations is its size; glibc growing an arena
    # once under a loaded machine is one step, not a slope (a full run once saw 16 MiB at one)
    steady = float(np.median(np.diff(rss[5:])))
    print(f"RSS over 21 evaluations with samples: {rss[0] / 2**20:.1f} -> {rss[-1] / 2**20:.1f} MiB, "
          f"growth after the 5th {growth / 2**20:.2f} MiB, median per evaluation {steady / 2**20:.3f} MiB "
          f"(an export: {exported[0] / 2**20:.1f} MiB)")
    assert steady < 2**20, "RSS grows at every evaluation"
    assert growth < min(exported) / 2, "the trainer keeps half an export's size or more"


def test_a_model_that_is_not_the_xtts_folders_gpt_is_refused_before_any_step(tmp_path, rng):
    """The CPU demo's model with an XTTS folder's test sentences (or a config with no model
    section, XTTS v2's size, beside a smaller folder) trained, then failed to export at every
    evaluation, with an error about vocabularies."""
    base = write_xtts_folder(tmp_path / "XTTS-v2", SEED % 2**31, decoder_input_dim=64)
    ref = reference_clip(tmp_path / "speaker.wav", rng)
    cfg = make_config(tmp_path, base, [{"text": "hi", "language": "en", "reference": str(ref)}])
    train, held = SyntheticDataset(cfg.model, 6, seed=0).split(2)
    t = Trainer(cfg, progress=False)
    with pytest.raises(ValueError, match=r"^training.xtts_dir: the run trains another GPT than .*XTTS-v2'.* "
                                         r"\(n_layers \d+ there, 1 here"):
        t.fit(train, held)
    assert t.step == 0 and not (tmp_path / "ckpt" / "train_log.jsonl").exists()

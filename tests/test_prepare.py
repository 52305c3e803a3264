"""``pyxtts prepare`` end to end on espeak-ng speech: the shards hold the tokenizer's ids,
the DVAE's codes (Coqui's DiscreteVAE's, in float64 and, but for float32 ties, in float32,
also at XTTS v2's full size) and the conditioning recording; every kind of unusable sample is reported with its reason and never
truncated; the output is byte-identical across runs and worker counts; an interrupted run
resumes without redoing finished shards; the CLI and its errors."""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.disk import KILLED_BY_FILE_SIZE, file_size_limit
from fixtures_prepare import (ESPEAK, FULL_DVAE, SENTENCES_EN, TINY_DVAE, coqui_audio, espeak, make_ljspeech,
                              training_texts, write_assets)
from coqui import require_coqui
from conftest import run_python
from helpers import SEED, make_rng

sf = pytest.importorskip("soundfile", reason="the prepare extra (soundfile) is not installed")
pytest.importorskip("torch", reason="torch (the test extra) writes the .pth fixtures")

import pyxtts  # noqa: E402
import pyxtts.cli  # noqa: E402
from pyxtts.prepare import DVAE_MEL, DVAEEncoder, XTTSTokenizer, load_audio, mel_spectrogram, prepare  # noqa: E402
from pyxtts.prepare import pipeline  # noqa: E402
from pyxtts.torchfile import read_tensors  # noqa: E402

pytestmark = pytest.mark.skipif(ESPEAK is None, reason="espeak-ng is not installed")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """12 espeak clips in the LJSpeech layout and a folder of XTTS assets with a narrow DVAE."""
    root = tmp_path_factory.mktemp("small")
    meta = make_ljspeech(root / "corpus", SENTENCES_EN[:12])
    wavs = sorted((root / "corpus" / "wavs").glob("*.wav"))
    write_assets(root / "xtts", wavs[:4], SEED, training_texts(), dvae=TINY_DVAE)
    return {"root": root, "meta": meta, "wavs": wavs, "xtts": root / "xtts"}


def files(folder: Path) -> dict[str, str]:
    """sha256 of every shard, listing and the report, by relative path."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in ("summary.json", "prepare.json")}


def expected(xtts: Path, wav_path: Path, text: str, lang: str = "en") -> tuple[list[int], np.ndarray, np.ndarray]:
    """ids, codes and reference audio, from the building blocks (each tested on its own)."""
    wav = load_audio(wav_path)
    codes = DVAEEncoder.load(xtts / "dvae.pth").codes(mel_spectrogram(wav, read_tensors(xtts / "mel_stats.pth"), DVAE_MEL))
    return XTTSTokenizer(xtts / "vocab.json").encode(text, lang), codes[:math.ceil(wav.shape[0] / 1024)], wav


@pytest.fixture(scope="module")
def prepared(small, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "shards"
    result = prepare(small["xtts"], small["meta"], out, eval_fraction=0.25, samples_per_shard=4, seed=SEED,
                     progress=False)
    return out, result


def test_shards_hold_ids_codes_and_the_clip(small, prepared):
    out, result = prepared
    train, held = pyxtts.TTSDataset.load(out / "train"), pyxtts.TTSDataset.load(out / "eval")
    assert (len(train), len(held)) == (9, 3) and result.summary["kept"] == 12 and not result.summary["dropped"]
    lines = [ln.split("|") for ln in small["meta"].read_text().splitlines()]
    report = [r.split("\t") for r in result.report.read_text().splitlines()[1:]]
    assert [r[3] for r in report] == ["kept"] * 12
    order = [r[2] for r in report]  # train items, then eval items, each in transcript order
    samples = list(train) + list(held)
    seconds = 0.0
    for key, s in zip(order, samples):
        text = next(c[2] for c in lines if c[0] == key)
        ids, codes, wav = expected(small["xtts"], small["root"] / "corpus" / "wavs" / f"{key}.wav", text)
        assert s.text.tolist() == ids, key
        np.testing.assert_array_equal(s.audio, codes, err_msg=key)
        assert s.audio.max() < 64 and len(np.unique(s.audio)) > 5  # the tiny DVAE's 64 codes, not one
        np.testing.assert_array_equal(s.ref_audio, wav)
        assert s.ref_is_clip
        seconds += wav.shape[0] / 22050
    sm = result.summary
    assert sm["hours_kept"] == pytest.approx(seconds / 3600, rel=1e-6)
    assert sm["audio_codes_per_second"] == pytest.approx(sum(len(s.audio) for s in samples) / seconds, rel=1e-6)
    assert sm["text_tokens_per_second"] == pytest.approx(sum(len(s.text) for s in samples) / seconds, rel=1e-6)
    assert json.loads((out / "summary.json").read_text())["kept"] == 12
    # the normalisation the trainer computes the reference slices' mels with
    stats = read_tensors(small["xtts"] / "mel_stats.pth")
    for ds in (train, held):
        np.testing.assert_array_equal(ds.mel_stats, stats)
    assert "prepared 12 of 12 samples" in result.format_summary()


def assert_codes_are_coquis(xtts: Path, wavs: list[Path], codes: list[np.ndarray], float64: bool = True) -> None:
    """Every code equals Coqui's DiscreteVAE.get_codebook_indices run in float64 (when
    ``float64``: a run of Coqui's code in float64 costs several times its float32 one).
    Against Coqui in float32, as it trains, a code may differ only where two codebook
    entries are a tie to float32: Coqui's distance ||z||^2 - 2 z.e + ||e||^2 then cannot
    tell them apart, so the float64 gap between them must be within 4 roundings of those
    terms (4 eps32 (||z||^2 + ||e||^2)); and such ties stay rare (under 1% of the codes)."""
    if float64:
        for wav, c, (_, want) in zip(wavs, codes, coqui_audio(xtts, wavs, "float64")):
            np.testing.assert_array_equal(c, want[:len(c)], err_msg=f"{wav.name}, seed {SEED}")
    enc = DVAEEncoder.load(xtts / "dvae.pth")
    stats = read_tensors(xtts / "mel_stats.pth")
    eps32 = float(np.finfo(np.float32).eps)
    ties = 0
    for wav, c, (_, want32) in zip(wavs, codes, coqui_audio(xtts, wavs, "float32")):
        differ = np.nonzero(c != want32[:len(c)])[0]
        if differ.size:
            z = enc.encode(mel_spectrogram(load_audio(wav), stats, DVAE_MEL))  # (codes, codebook_dim) float64
        for i in differ:
            mine, theirs = enc.codebook[:, c[i]], enc.codebook[:, want32[i]]
            gap = ((z[i] - theirs) ** 2).sum() - ((z[i] - mine) ** 2).sum()
            bound = 4 * eps32 * ((z[i] ** 2).sum() + max((mine ** 2).sum(), (theirs ** 2).sum()))
            assert 0 <= gap <= bound, f"{wav.name} code {i}: {c[i]} vs Coqui's {want32[i]}, gap {gap:.3g} > " \
                                      f"{bound:.3g} (seed {SEED})"
            ties += 1
    total = sum(len(c) for c in codes)
    assert ties <= total // 100, f"{ties} float32 ties in {total} codes (seed {SEED})"


def test_codes_equal_coqui_tiny_dvae(small, prepared):
    out, result = prepared
    keys = [r.split("\t")[2] for r in result.report.read_text().splitlines()[1:]]
    samples = list(pyxtts.TTSDataset.load(out / "train")) + list(pyxtts.TTSDataset.load(out / "eval"))
    wavs = [small["root"] / "corpus" / "wavs" / f"{k}.wav" for k in keys]
    assert_codes_are_coquis(small["xtts"], wavs, [s.audio for s in samples])


def test_same_bytes_for_any_worker_count_and_run(small, prepared, tmp_path):
    out, _ = prepared
    again = prepare(small["xtts"], small["meta"], tmp_path / "w2", eval_fraction=0.25, samples_per_shard=4,
                    seed=SEED, workers=2, progress=False)
    assert again.summary["workers"] == 2 and again.summary["shards_resumed"] == 0
    assert files(tmp_path / "w2") == files(out)
    # 3 + 1 shards (9 + 3 samples by 4) with their listings, each split's mel_stats.npy, the report
    assert len(files(out)) == 2 * 4 + 2 + 1


def test_resume_keeps_finished_shards(small, prepared, tmp_path, monkeypatch):
    out, _ = prepared
    dest = tmp_path / "r"
    real_write = pipeline._Shard.write
    written = []

    def write_then_stop(self, records):
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(self.index)
        return real_write(self, records)

    monkeypatch.setattr(pipeline._Shard, "write", write_then_stop)
    with pytest.raises(KeyboardInterrupt):
        prepare(small["xtts"], small["meta"], dest, eval_fraction=0.25, samples_per_shard=4, seed=SEED,
                progress=False)
    monkeypatch.setattr(pipeline._Shard, "write", real_write)
    assert len(list(dest.rglob("shard-*.npz"))) == 2
    r = prepare(small["xtts"], small["meta"], dest, eval_fraction=0.25, samples_per_shard=4, seed=SEED,
                progress=False)
    assert r.summary["shards_resumed"] == 2 and r.summary["kept"] == 12
    assert files(dest) == files(out)
    # a changed transcript line redoes its shard only
    lines = small["meta"].read_text().splitlines()
    meta2 = tmp_path / "metadata.csv"
    key, text, _ = lines[0].split("|")
    meta2.write_text("\n".join([f"{key}|{text}|Something else entirely."] + lines[1:]) + "\n")
    r = prepare(small["xtts"], meta2, dest, audio_dir=small["root"] / "corpus" / "wavs", eval_fraction=0.25,
                samples_per_shard=4, seed=SEED, progress=False)
    assert (r.summary["shards"], r.summary["shards_resumed"]) == (4, 3)
    assert files(dest) != files(out)


def test_a_full_disk_names_the_shard_and_a_rerun_finishes_the_output(small, prepared, tmp_path):
    """The disk fills while the first shard is written (a file size limit: EFBIG where a full
    disk gives ENOSPC): the error names the shard and the cause, no temporary file is left,
    and the same command, run again with room, gives the output of an uninterrupted run."""
    out, _ = prepared
    dest = tmp_path / "full"
    with file_size_limit(256 << 10):  # a shard of 4 clips is over a megabyte
        with pytest.raises(OSError) as caught:
            prepare(small["xtts"], small["meta"], dest, eval_fraction=0.25, samples_per_shard=4, seed=SEED,
                    progress=False)
    assert str(caught.value) == (f"[Errno {errno.EFBIG}] cannot write {str(dest / 'train' / 'shard-00000.npz')!r}: "
                                 f"{os.strerror(errno.EFBIG)}")
    assert not [p for p in dest.rglob("*") if "tmp" in p.name]
    prepare(small["xtts"], small["meta"], dest, eval_fraction=0.25, samples_per_shard=4, seed=SEED, progress=False)
    assert files(dest) == files(out)


KILLED_PREPARE = KILLED_BY_FILE_SIZE + r"""
import sys
from pyxtts.prepare import prepare
die_past(256 << 10)
prepare(sys.argv[1], sys.argv[2], sys.argv[3], eval_fraction=0.25, samples_per_shard=4, seed=int(sys.argv[4]),
        progress=False)
"""


def test_a_prepare_killed_mid_shard_leaves_nothing_in_the_way(small, prepared, tmp_path):
    """A prepare killed while it writes a shard leaves that shard's temporary file: the
    same command resumes and removes it, and --overwrite with other settings (which
    refuses to delete files prepare did not write) takes it for prepare's own."""
    out, _ = prepared
    dest = tmp_path / "killed"

    def killed() -> None:
        r = run_python(KILLED_PREPARE, str(small["xtts"]), str(small["meta"]), str(dest), str(SEED))
        assert r.returncode == -signal.SIGXFSZ, r.stderr
        assert [p.name for p in (dest / "train").iterdir() if "tmp" in p.name], "killed before any shard"

    killed()
    prepare(small["xtts"], small["meta"], dest, eval_fraction=0.25, samples_per_shard=4, seed=SEED, progress=False)
    assert files(dest) == files(out)
    assert not [p for p in dest.rglob("*") if "tmp" in p.name]
    shutil.rmtree(dest)
    killed()
    again = prepare(small["xtts"], small["meta"], dest, eval_fraction=0.25, samples_per_shard=3, seed=SEED,
                    overwrite=True, progress=False)
    assert again.summary["kept"] == 12
    assert not [p for p in dest.rglob("*") if "tmp" in p.name]


def test_cli_names_what_stands_in_the_way_of_the_output_folder(small, tmp_path, capsys):
    """An --out under a file, or a symbolic link to nothing: the one line says so, where it
    said "Not a directory: '.../file/out'" or "File exists: '.../link'"."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    for out, said in ((tmp_path / "file" / "out", f"{str(tmp_path / 'file')!r} is a file, not a folder"),
                      (tmp_path / "link", f"{str(tmp_path / 'link')!r} is a symbolic link to "
                                          f"{str(tmp_path / 'gone')!r}, which does not exist")):
        rc = pyxtts.cli.main(["prepare", "--xtts-dir", str(small["xtts"]), "--metadata", str(small["meta"]),
                              "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and err.splitlines()[-1] == f"pyxtts prepare: {said}", err
    assert not (tmp_path / "gone").exists()


def test_a_second_prepare_into_a_folder_in_use_is_refused(small, prepared, tmp_path, monkeypatch):
    """A second prepare started into the folder a first one is writing (here: with other
    settings and overwrite, which removed the first one's shards while it went on, and it
    still said it had prepared them all) is refused, naming the folder; the first finishes
    to the output of a run on its own."""
    out, _ = prepared
    dest = tmp_path / "busy"
    real_write = pipeline._Shard.write
    refused: list[str] = []
    started: list[bool] = []

    def write_and_start_another(self, records):
        if not started:
            started.append(True)
            with pytest.raises(BlockingIOError) as caught:
                prepare(small["xtts"], small["meta"], dest, samples_per_shard=3, overwrite=True, progress=False)
            refused.append(str(caught.value))
        return real_write(self, records)

    monkeypatch.setattr(pipeline._Shard, "write", write_and_start_another)
    prepare(small["xtts"], small["meta"], dest, eval_fraction=0.25, samples_per_shard=4, seed=SEED, progress=False)
    assert refused == [f"[Errno {errno.EAGAIN}] out: {str(dest)!r} is in use by another pyxtts prepare (process "
                       f"{os.getpid()}): wait for it to end, or prepare into another folder"]
    assert files(dest) == files(out)


def test_other_settings_are_refused(small, prepared, tmp_path):
    out, _ = prepared
    # the refusal names what changed (the folder records its settings)
    with pytest.raises(FileExistsError, match=r"prepared from other inputs or settings \(eval_fraction: 0\.25 -> "
                                              r"0\.5\);.*pass overwrite=True"):
        prepare(small["xtts"], small["meta"], out, eval_fraction=0.5, samples_per_shard=4, seed=SEED, progress=False)
    with pytest.raises(NotADirectoryError, match=r"^out: '.*notes\.txt' is a file; the output is a folder"):
        (tmp_path / "notes.txt").write_text("a file")
        prepare(small["xtts"], small["meta"], tmp_path / "notes.txt", progress=False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not an output folder of pyxtts prepare"):
        prepare(small["xtts"], small["meta"], tmp_path / "mine", progress=False)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    r = prepare(small["xtts"], small["meta"], copy, samples_per_shard=4, seed=SEED, overwrite=True, progress=False)
    assert r.eval is None and not (copy / "eval").exists() and len(pyxtts.TTSDataset.load(copy / "train")) == 12
    # overwrite deleted whole train/ and eval/ folders: a dataset laid out as train/*.wav lost its recordings
    (tmp_path / "mine" / "train").mkdir()
    (tmp_path / "mine" / "train" / "a.wav").write_bytes(b"RIFF")
    with pytest.raises(FileExistsError, match=r"^out: '.*mine' holds files pyxtts prepare did not write "
                                              r"\(train/a\.wav\), which overwrite would delete"):
        prepare(small["xtts"], small["meta"], tmp_path / "mine", overwrite=True, progress=False)
    assert (tmp_path / "mine" / "train" / "a.wav").read_bytes() == b"RIFF"
    (copy / "train" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds files pyxtts prepare did not write \(train/notes\.txt\)"):
        prepare(small["xtts"], small["meta"], copy, samples_per_shard=4, seed=SEED, eval_fraction=0.5,
                overwrite=True, progress=False)
    assert len(pyxtts.TTSDataset.load(copy / "train")) == 12  # nothing removed


def _clip(path: Path, wav: np.ndarray, rate: int = 22050, **kw) -> str:
    sf.write(path, wav, rate, **kw)
    return path.name


def test_every_unusable_sample_is_reported(small, tmp_path):
    d = tmp_path / "audio"
    d.mkdir()
    speech = [load_audio(p) for p in small["wavs"]]
    good = small["wavs"][0].name
    shutil.copy(small["wavs"][0], d / good)
    rng = make_rng("unusable")
    long_wav = np.concatenate(speech * 4)[:255996]  # one sample over Coqui's maximum
    edge_wav = np.concatenate(speech * 4)[:255995]  # exactly the maximum: kept, 250 codes
    stereo = np.stack([speech[1], speech[1] * 0.5], 1)
    rows = [
        (good, "A good clip.", {}, "kept"),
        (_clip(d / "edge.wav", edge_wav), "The longest clip allowed.", {}, "kept"),
        (_clip(d / "stereo.flac", stereo, 44100, format="FLAC"), "Stereo at 44.1 kHz.", {}, "kept"),
        (good, "Ein guter Satz mit 3 Zahlen.", {"language": "de"}, "kept"),
        (good, "With its own reference.", {"reference": "ref.wav"}, "kept"),
        (_clip(d / "long.wav", long_wav), "Too long.", {}, "too_long"),
        (_clip(d / "short.wav", speech[0][:11024]), "Too short.", {}, "too_short"),
        (_clip(d / "silent.wav", np.zeros(30000, np.float32)), "Silence.", {}, "silent"),
        (_clip(d / "hiss.wav", (1e-5 * rng.standard_normal(30000)).astype(np.float32)), "Hiss.", {}, "silent"),
        ("garbage.wav", "Unreadable.", {}, "unreadable"),
        ("missing.wav", "Missing.", {}, "missing"),
        (good, "   ", {}, "text_empty"),
        (good, "A snowman ☃ here.", {}, "unknown_token"),
        (good, "word " * 400, {}, "text_too_long"),
        (good, "यह 3 किताबें हैं।", {"language": "hi"}, "text_error"),  # num2words cannot spell Hindi numbers
        (good, "Reference missing.", {"reference": "nowhere.wav"}, "reference_missing"),
        (good, "Reference silent.", {"reference": "silent.wav"}, "reference_silent"),
        (good, "Reference short.", {"reference": "short.wav"}, "reference_too_short"),
    ]
    (d / "garbage.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot audio at all")
    _clip(d / "ref.wav", speech[2])
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"audio": a, "text": t, **extra}, ensure_ascii=False) + "\n"
                                for a, t, extra, _ in rows), encoding="utf-8")
    r = prepare(small["xtts"], manifest, tmp_path / "out", audio_dir=d, samples_per_shard=5, progress=False)
    report = [line.split("\t") for line in r.report.read_text().splitlines()[1:]]
    assert [x[3] for x in report] == [want for *_, want in rows]
    assert all(x[7] for x in report if x[3] not in ("kept", "text_empty")), "every drop says why"
    details = {x[3]: x[7] for x in report}
    assert details["missing"] == f"{d / 'missing.wav'} does not exist"  # was libsndfile's "System error"
    # it read "[UNK] in '...'", leaving the reader to find the character
    assert details["unknown_token"] == "[UNK]: the vocabulary lacks '☃' (in 'a snowman ☃ here.')"
    assert details["reference_missing"] == f"{d / 'nowhere.wav'} does not exist"
    # in seconds and with the setting that decides it (they read '882000 samples > 255995')
    assert re.fullmatch(r"\d+\.\d\d s \(\d+ samples\) > 11\.61 s \(--max-wav-samples 255995\)",
                        details["too_long"]), details["too_long"]
    assert re.fullmatch(r"\d+ ids > \d+ \(--max-text-tokens\)", details["text_too_long"]), details["text_too_long"]
    assert r.summary["dropped"] == {k: sum(1 for *_, w in rows if w == k) for k in {w for *_, w in rows} - {"kept"}}
    kept = list(pyxtts.TTSDataset.load(tmp_path / "out" / "train"))
    assert len(kept) == 5
    lengths = {x[2]: int(x[6]) for x in report if x[3] == "kept"}
    assert lengths["edge.wav"] == 250 == len(kept[1].audio)  # ceil(255995 / 1024): whole, never cut
    np.testing.assert_array_equal(kept[2].ref_audio, load_audio(d / "stereo.flac"))
    assert kept[3].text[0] == XTTSTokenizer(small["xtts"] / "vocab.json").token_id("[de]")
    assert not kept[4].ref_is_clip and kept[0].ref_is_clip
    np.testing.assert_array_equal(kept[4].ref_audio, load_audio(d / "ref.wav"))
    assert "1 too_long" in r.format_summary() and "report.tsv" in r.format_summary()


def _eval_keys_missing(small, prepared, tmp_path: Path, n: int) -> Path:
    """A manifest of the same clips in the same order (so the same split) whose first ``n``
    held-out clips' audio files are missing."""
    out, _ = prepared
    held = [r.split("\t")[2] for r in (out / "report.tsv").read_text().splitlines()[1:] if r.startswith("eval")]
    wavs = small["root"] / "corpus" / "wavs"
    lines = [ln.split("|") for ln in small["meta"].read_text().splitlines()]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"audio": str(wavs / f"{k}.wav") if k not in held[:n] else f"gone/{k}.wav",
                                            "text": t}) + "\n" for k, _, t in lines), encoding="utf-8")
    return manifest


def test_an_eval_split_left_empty_is_said_and_has_no_shard(small, prepared, tmp_path, capsys):
    """Every held-out clip dropped used to leave eval/shard-00000.npz of 0 samples, which train
    then loaded as the eval set, and prepare said nothing of it."""
    from pyxtts.data import prepared_splits

    manifest = _eval_keys_missing(small, prepared, tmp_path, 3)
    out = tmp_path / "out"
    argv = ["prepare", "--xtts-dir", str(small["xtts"]), "--metadata", str(manifest), "--out", str(out),
            "--eval-fraction", "0.25", "--seed", str(SEED), "--samples-per-shard", "4", "--no-progress"]
    assert pyxtts.cli.main(argv) == 0
    printed = capsys.readouterr().out
    warning = ("the eval split is empty: all 3 samples were dropped (3 missing); no eval shard was written, so "
               "train has no evaluation from this folder (--eval-data gives it one) (each reason in report.tsv)")
    assert f"  warning: {warning}\n" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["warnings"] == [warning] and summary["splits"]["eval"]["dropped"] == {"missing": 3}
    assert not list((out / "eval").glob("*.npz")) and prepared_splits(out) == (out / "train", None)
    assert pyxtts.cli.main(argv) == 0  # the shard without samples is finished too: nothing is redone
    assert "1 worker, 4 shards kept from an earlier run)" in capsys.readouterr().out


def test_an_eval_split_that_loses_clips_says_how_many_and_why(small, prepared, tmp_path):
    r = prepare(small["xtts"], _eval_keys_missing(small, prepared, tmp_path, 1), tmp_path / "out",
                eval_fraction=0.25, samples_per_shard=4, seed=SEED, progress=False)
    warning = "the eval split lost 1 of its 3 samples (1 missing); it holds 2 (each reason in report.tsv)"
    assert r.summary["warnings"] == [warning] and f"  warning: {warning}" in r.format_summary()
    assert r.eval == tmp_path / "out" / "eval" and len(pyxtts.TTSDataset.load(r.eval)) == 2


def test_codes_over_the_models_audio_positions(small, tmp_path):
    xtts = tmp_path / "xtts"
    shutil.copytree(small["xtts"], xtts)
    cfg = json.loads((xtts / "config.json").read_text())
    cfg["model_args"]["gpt_max_audio_tokens"] = 100  # Coqui's GPT then takes 98 codes (4.55 s)
    (xtts / "config.json").write_text(json.dumps(cfg))
    r = prepare(xtts, small["meta"], tmp_path / "out", progress=False)
    report = [line.split("\t") for line in r.report.read_text().splitlines()[1:]]
    statuses = []
    for x in report:
        n_codes = math.ceil(load_audio(small["root"] / "corpus" / "wavs" / f"{x[2]}.wav").shape[0] / 1024)
        statuses.append(x[3])
        assert x[3] == ("kept" if n_codes <= 98 else "codes_too_long"), (x, n_codes)
    assert "kept" in statuses and "codes_too_long" in statuses


def test_coqui_csv_gives_the_same_samples(small, prepared, tmp_path):
    out, _ = prepared
    rows = [ln.split("|") for ln in small["meta"].read_text().splitlines()]
    csv = tmp_path / "metadata_train.csv"
    csv.write_text("audio_file|text|speaker_name\n" + "".join(f"wavs/{k}.wav|{t}|speaker\n" for k, _, t in rows))
    r = prepare(small["xtts"], csv, tmp_path / "o", audio_dir=small["root"] / "corpus", eval_fraction=0.25,
                samples_per_shard=4, seed=SEED, progress=False)
    for split in ("train", "eval"):
        a, b = pyxtts.TTSDataset.load(out / split), pyxtts.TTSDataset.load(r.out / split)
        assert [s.text.tolist() for s in a] == [s.text.tolist() for s in b]
        assert all(np.array_equal(x.audio, y.audio) for x, y in zip(a, b))


def test_cli(small, tmp_path, capsys):
    argv = ["prepare", "--xtts-dir", str(small["xtts"]), "--metadata", str(small["meta"]), "--language", "en",
            "--out", str(tmp_path / "o"), "--eval-fraction", "0.2", "--workers", "2", "--no-progress"]
    assert pyxtts.cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "prepared 12 of 12 samples" in out and "text tokens and" in out and "s of audio per second" in out
    assert pyxtts.cli.main(argv) == 0  # again: everything resumed
    assert "2 shards kept from an earlier run" in capsys.readouterr().out
    # each refusal names the flag as typed (the API's errors name the argument)
    bad = [(["--workers", "0"], "pyxtts prepare: --workers: expected an int >= 1, got 0"),
           (["--eval-fraction", "1"], "pyxtts prepare: --eval-fraction: expected a finite number in [0, 1)"),
           (["--language", "xx"], "pyxtts prepare: --language: expected one of"),
           (["--max-text-tokens", "0"], "pyxtts prepare: --max-text-tokens: expected an int >= 1, got 0"),
           (["--min-seconds", "-1"], "pyxtts prepare: --min-seconds: expected a finite number > 0, got -1.0"),
           (["--eval-fraction", "0.5"], "--overwrite")]
    for extra, msg in bad:
        assert pyxtts.cli.main(argv + extra) == 2
        err = capsys.readouterr().err
        assert msg in err and "=True" not in err  # it read "pass --overwrite (overwrite=True)"
    limited = ["prepare", "--xtts-dir", str(small["xtts"]), "--metadata", str(small["meta"]), "--out",
               str(tmp_path / "lim"), "--max-wav-samples", "80000", "--max-text-tokens", "30", "--no-progress"]
    assert pyxtts.cli.main(limited) == 0
    capsys.readouterr()
    report = [x.split("\t") for x in (tmp_path / "lim" / "report.tsv").read_text().splitlines()[1:]]
    for x in report:
        n = load_audio(small["root"] / "corpus" / "wavs" / f"{x[2]}.wav").shape[0]
        want = "text_too_long" if int(x[5]) > 30 else "too_long" if n > 80000 else "kept"
        assert x[3] == want, x
    assert {x[3] for x in report} == {"kept", "too_long", "text_too_long"}
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "vocab.json").write_text("{}")
    assert pyxtts.cli.main(["prepare", "--xtts-dir", str(empty), "--metadata", str(small["meta"]),
                            "--out", str(tmp_path / "x")]) == 2
    assert "lacks config.json, dvae.pth, mel_stats.pth" in capsys.readouterr().err
    assert pyxtts.cli.main(["prepare", "--xtts-dir", str(small["xtts"]), "--metadata", str(tmp_path / "none.csv"),
                            "--out", str(tmp_path / "x")]) == 2
    assert "metadata: " in capsys.readouterr().err


def test_cli_fails_when_no_sample_is_prepared_and_says_why(small, tmp_path, capsys):
    """With the audio not where the transcript says, prepare used to print "prepared 0 of 3
    samples ... dropped: 3 unreadable" and exit 0, each reason libsndfile's "System error"."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "metadata.csv").write_text("".join(small["meta"].read_text().splitlines(keepends=True)[:3]))
    def argv(out: str) -> list[str]:
        return ["prepare", "--xtts-dir", str(small["xtts"]), "--metadata", str(corpus / "metadata.csv"),
                "--out", str(tmp_path / out), "--no-progress"]

    assert pyxtts.cli.main(argv("o")) == 2
    out, err = capsys.readouterr()
    assert "prepared 0 of 3 samples" in out and "dropped: 3 missing" in out
    first = corpus / "wavs" / "LJ001-0001.wav"
    assert err == (f"pyxtts prepare: no sample could be prepared: 3 audio files are missing under "
                   f"{corpus / 'wavs'} (e.g. {first}); is --audio-dir right? (each sample's reason is in "
                   f"{tmp_path / 'o' / 'report.tsv'})\n")
    report = [x.split("\t") for x in (tmp_path / "o" / "report.tsv").read_text().splitlines()[1:]]
    assert [(x[3], x[7]) for x in report] == [("missing", f"{corpus / 'wavs' / x[2]}.wav does not exist")
                                              for x in report]
    # Coqui's dataset `path` (the folder above LJSpeech's wavs/) given as --audio-dir: the folder to pass is named
    above = small["wavs"][0].parent.parent
    assert pyxtts.cli.main(argv("a") + ["--audio-dir", str(above)]) == 2
    assert (f"3 audio files are missing under {above} (e.g. {above / 'LJ001-0001.wav'}), and "
            f"{above / 'wavs' / 'LJ001-0001.wav'} exists: pass --audio-dir {above / 'wavs'} (each sample's") \
        in capsys.readouterr().err
    assert pyxtts.cli.main(argv("o") + ["--audio-dir", str(small["wavs"][0].parent)]) == 0  # the right folder: done
    assert "prepared 3 of 3 samples" in capsys.readouterr().out
    # nothing missing: the most frequent reason
    (corpus / "metadata.csv").write_text("a| | \nb| | \n")
    assert pyxtts.cli.main(argv("e")) == 2
    assert ("pyxtts prepare: no sample could be prepared: 2 of 2 samples were dropped as text_empty (the "
            "transcript is empty)") in capsys.readouterr().err


def test_missing_extra_is_named(small, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "soundfile", None)  # as if not installed
    with pytest.raises(ImportError, match=r"reading audio needs the Python package 'soundfile'.*pyxtts\[prepare\]"):
        load_audio(small["wavs"][0])


@pytest.mark.slow
def test_full_size_codes_equal_coqui(tmp_path_factory):
    """XTTS v2's DVAE size (512-wide, 1024 codes) on 20 sentences (about 70 s of speech):
    prepare's codes are Coqui's DiscreteVAE.get_codebook_indices, every one of them."""
    require_coqui()  # before the minute of work it would compare
    root = tmp_path_factory.mktemp("full")
    meta = make_ljspeech(root / "corpus", SENTENCES_EN[:20])
    wavs = sorted((root / "corpus" / "wavs").glob("*.wav"))
    write_assets(root / "xtts", wavs[::4], SEED, training_texts(), dvae=FULL_DVAE)
    r = prepare(root / "xtts", meta, root / "out", workers=2, samples_per_shard=8, progress=False)
    assert r.summary["kept"] == 20
    codes = [s.audio for s in pyxtts.TTSDataset.load(root / "out" / "train")]
    assert_codes_are_coquis(root / "xtts", wavs, codes, float64=False)  # float64: the tiny DVAE's test
    total = sum(len(c) for c in codes)
    assert total > 1200 and len(np.unique(np.concatenate(codes))) > 150, (total, SEED)


def test_two_column_ljspeech_lines_are_read_as_id_and_text(tmp_path):
    """Many corpora write LJSpeech's metadata.csv as id|text; prepare stopped at the first
    such line (as Coqui's formatter does). It reads the second column as the text; a line
    of one column is still refused, naming the line and both forms."""
    from pyxtts.prepare.sources import MetadataError, read_metadata

    three = tmp_path / "three" / "metadata.csv"
    two = tmp_path / "two" / "metadata.csv"
    for p in (three, two):
        p.parent.mkdir()
    three.write_text("a|Dr. Smith|Doctor Smith\nb|x|Hello there.\n")
    two.write_text("a|Doctor Smith\nb|Hello there.\n")
    got3, got2 = read_metadata(three, None, "en"), read_metadata(two, None, "en")
    assert [(i.key, i.text) for i in got2] == [(i.key, i.text) for i in got3] == [("a", "Doctor Smith"),
                                                                                ("b", "Hello there.")]
    assert [i.audio for i in got2] == [tmp_path / "two" / "wavs" / f"{k}.wav" for k in "ab"]
    two.write_text("a|Doctor Smith\nlonely\n")
    with pytest.raises(MetadataError, match=r"metadata\.csv:2: LJSpeech lines are id\|text\|normalized text "
                                            r"\(or id\|text\), got 1 column: 'lonely'"):
        read_metadata(two, None, "en")


@pytest.mark.parametrize("fmt, body", [
    ("metadata.csv", "a|Xin chào|Xin chào\nb|Tạm biệt|Tạm biệt\n"),
    ("train.csv", "audio_file|text|speaker_name\nwavs/a.wav|Xin chào|s\nwavs/b.wav|Tạm biệt|s\n"),
    ("m.jsonl", '{"audio": "wavs/a.wav", "text": "Xin chào"}\n{"audio": "wavs/b.wav", "text": "Tạm biệt"}\n'),
])
def test_a_byte_order_mark_is_skipped(tmp_path, fmt, body):
    """A BOM before metadata.csv's first line made its clip `missing  wavs/\\ufeffa.wav`."""
    from pyxtts.prepare.sources import read_metadata

    path = tmp_path / fmt
    path.write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))
    items = read_metadata(path, None, "en")
    assert [i.text for i in items] == ["Xin chào", "Tạm biệt"]
    assert [i.audio.name for i in items] == ["a.wav", "b.wav"]


def test_a_transcript_that_is_not_utf8_names_the_file_and_line(small, tmp_path, capsys):
    """A Latin-1 file stopped prepare with "'utf-8' codec can't decode byte 0xf4 in position
    10", naming neither the file nor the line."""
    from pyxtts.prepare.sources import MetadataError, read_metadata

    for name, body in (("metadata.csv", "a|Hello|Hello\nb|Allez|Allez\nc|C'est bientôt|C'est bientôt\n"),
                       ("train.csv", "audio_file|text|speaker_name\na.wav|Hello|s\nc.wav|C'est bientôt|s\n"),
                       ("m.jsonl", '{"audio": "a.wav", "text": "Hello"}\n{"audio": "c.wav", "text": "bientôt"}\n')):
        path = tmp_path / name
        path.write_bytes(body.encode("latin-1"))
        line = next(i for i, ln in enumerate(body.splitlines(), 1) if "ô" in ln)
        column = body.splitlines()[line - 1].index("ô") + 1
        with pytest.raises(MetadataError, match=rf"^{path}:{line}: not UTF-8 text \(byte 0xf4 at column {column}\); "
                                                "save the file as UTF-8"):
            read_metadata(path, None, "fr")
    assert pyxtts.cli.main(["prepare", "--xtts-dir", str(small["xtts"]), "--metadata", str(tmp_path / "metadata.csv"),
                            "--out", str(tmp_path / "out")]) == 2
    assert "metadata.csv:3: not UTF-8 text" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_to_the_process_group_of_a_two_worker_prepare_ends_it(small, tmp_path):
    """A terminal's Ctrl-C reaches the workers too. They died with it, one sometimes
    half-way through sending its result, and the pool's shutdown then waited on that result
    forever (3 hangs in 8 tries, with a worker traceback each time). The workers now ignore
    it and finish the few clips in flight; the run ends with 130 and the same command
    resumes to the output of an uninterrupted one."""
    import multiprocessing
    import os
    import signal
    import subprocess

    limits = pipeline._Limits(min_samples=11025, max_samples=255995, max_text_tokens=200, max_audio_codes=250,
                              code_stride=1024)
    with multiprocessing.get_context("spawn").Pool(1, pipeline._init_worker, (str(small["xtts"]), limits)) as pool:
        assert pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the main process keeps it

    corpus = tmp_path / "corpus"
    (corpus / "wavs").mkdir(parents=True)
    lines = small["meta"].read_text().splitlines()
    rows = []
    for i in range(40):  # 480 clips: hard links to the 12 recordings, under their own ids
        for line in lines:
            key, text, norm = line.split("|")
            os.link(small["root"] / "corpus" / "wavs" / f"{key}.wav", corpus / "wavs" / f"{key}-{i}.wav")
            rows.append(f"{key}-{i}|{text}|{norm}")
    (corpus / "metadata.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    root = str(Path(pyxtts.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    cmd = [sys.executable, "-m", "pyxtts", "prepare", "--xtts-dir", str(small["xtts"]), "--metadata",
           str(corpus / "metadata.csv"), "--out", str(out), "--samples-per-shard", "16", "--workers", "2",
           "--no-progress"]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             cwd=str(tmp_path), start_new_session=True)
    try:
        for _ in range(600):  # a few shards written: the workers are busy
            if len(list(out.rglob("shard-*.npz"))) >= 3 or child.poll() is not None:
                break
            time.sleep(0.1)
        assert child.poll() is None, "prepare ended before the Ctrl-C"
        os.killpg(child.pid, signal.SIGINT)
        output, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 130, output[-3000:]
    assert "finished shards are kept" in output and "Traceback" not in output, output[-3000:]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    once = tmp_path / "once"
    r = subprocess.run([*cmd[:cmd.index("--out") + 1], str(once), *cmd[cmd.index("--out") + 2:]],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert files(out) == files(once)


def test_repeated_ids_are_said_with_the_splits_they_reach(small, tmp_path):
    """150 lines of one clip were kept as 150 samples in both splits without a word: the
    evaluation then measured clips the model trained on."""
    lines = small["meta"].read_text().splitlines()
    meta = tmp_path / "metadata.csv"
    meta.write_text("\n".join(lines + [lines[0]] * 5) + "\n")
    r = prepare(small["xtts"], meta, tmp_path / "out", audio_dir=small["root"] / "corpus" / "wavs",
                eval_fraction=0.5, samples_per_shard=4, seed=SEED, progress=False)
    key = lines[0].split("|")[0]
    said = [w for w in r.summary["warnings"] if "more than once" in w]
    assert said and said[0].startswith(f"1 id appears more than once in the metadata ({key} x6)"), said
    assert "in both splits" in said[0], said
    assert "warning: " + said[0] in r.format_summary()


def test_a_transcript_far_too_short_for_its_clip_is_said(small, tmp_path):
    """`alice|The quick brown fox ...|alice` (a speaker's name in the text column) was kept
    with the 4-id transcript 'alice' for a 4 s clip, and nothing said so."""
    lines = small["meta"].read_text().splitlines()
    key, text, _ = lines[0].split("|")
    meta = tmp_path / "metadata.csv"
    meta.write_text("\n".join([f"{key}|{text}|alice"] + lines[1:]) + "\n")
    r = prepare(small["xtts"], meta, tmp_path / "out", audio_dir=small["root"] / "corpus" / "wavs",
                samples_per_shard=4, seed=SEED, progress=False)
    said = [w for w in r.summary["warnings"] if "text ids a second" in w]
    assert len(said) == 1 and said[0].startswith(f"1 kept clip has fewer than 2 text ids a second of audio ({key} ("), \
        r.summary["warnings"]
    assert r.summary["kept"] == 12  # said, not dropped
    clean = prepare(small["xtts"], small["meta"], tmp_path / "clean", samples_per_shard=4, seed=SEED, progress=False)
    assert not [w for w in clean.summary["warnings"] if "text ids a second" in w], clean.summary["warnings"]

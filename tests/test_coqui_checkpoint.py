"""Coqui XTTS checkpoints in and out, against Coqui itself (coqui-tts 0.28.0): import of
a released-style model.pth and of a GPTTrainer checkpoint (all 90 GPT tensors kept),
export loaded back by Coqui's Xtts with strict=True and weights bit-equal, the round
trip, and the refusals that leave everything as it was."""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import signal
import warnings

import numpy as np
import pytest

import pyxtts
import pyxtts.cli
import pyxtts.coqui_checkpoint
from conftest import SEED
from coqui import require_coqui
from fixtures_xtts import SMALL_ARGS, write_gpt_trainer_checkpoint, write_xtts_folder
from conftest import run_python
from helpers.disk import file_size_limit
from helpers.processes import Paused, reaped

CONDITIONING = ("conditioning_encoder.", "conditioning_perceiver.")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    require_coqui()
    return write_xtts_folder(tmp_path_factory.mktemp("xtts") / "XTTS-v2", SEED % 2**31)


@pytest.fixture(scope="module")
def trainer_checkpoint(tmp_path_factory):
    require_coqui()
    return write_gpt_trainer_checkpoint(tmp_path_factory.mktemp("run"), SEED % 2**31 + 1)


def torch_state(path, prefix="") -> dict[str, np.ndarray]:
    """The checkpoint's "model" tensors as torch reads them, with the globals Coqui allows
    for its legacy files (Coqui's own _load_checkpoint would rewrite the file)."""
    c = require_coqui()
    with warnings.catch_warnings(), c.xtts_module._legacy_safe_globals():
        warnings.simplefilter("ignore")
        sd = c.torch.load(path, map_location="cpu", weights_only=True)["model"]
    return {k[len(prefix):]: v.numpy() for k, v in sd.items() if k.startswith(prefix)}


def file_hash(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def coqui_load(folder):
    """Xtts built from folder/config.json, loaded with Coqui's loader, strict=True."""
    c = require_coqui()
    config = c.XttsConfig()
    config.load_json(str(folder / "config.json"))
    with warnings.catch_warnings():  # Coqui deprecates its own documented entry point
        warnings.filterwarnings("ignore", message=r"Xtts.init_from_config")
        model = c.Xtts.init_from_config(config)
    model.load_checkpoint(config, checkpoint_dir=str(folder), strict=True, eval=False)
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def test_import_released_style(base, tmp_path):
    gpt = torch_state(base / "model.pth", "gpt.")  # read before Coqui rewrites anything
    assert len(gpt) == 90
    before = file_hash(base / "model.pth")
    out = tmp_path / "imported.safetensors"
    meta = pyxtts.import_xtts_checkpoint(base, out)
    assert file_hash(base / "model.pth") == before, "import reads, never writes"
    cfg = pyxtts.ModelConfig(**meta["config"])
    assert cfg.n_heads == SMALL_ARGS["gpt_n_heads"] == 4, "from the config, not guessed (the shapes allow 16)"
    assert meta["extra"]["n_heads_guessed"] is False
    # all 90: the conditioning encoder and perceiver are the model's parameters too
    assert meta["extra"]["carried"] == [] and cfg.conditioning
    model = pyxtts.XTTSGPT(cfg, seed=1)
    loaded = pyxtts.load_checkpoint(out, model)
    assert loaded["carried"] == []
    own = model.state_dict()
    assert len(own) == 90 and sum(k.startswith(CONDITIONING) for k in own) == 54
    for k, v in own.items():
        assert v.tobytes() == gpt[k].tobytes(), k


def test_import_takes_the_pickled_config_without_config_json(base, tmp_path):
    folder = tmp_path / "no-config-json"
    folder.mkdir()
    shutil.copyfile(base / "model.pth", folder / "model.pth")
    # the pickled config, like the released config.json, leaves the text ids to vocab.json
    with pytest.raises(pyxtts.CheckpointError, match="gpt_number_text_tokens|gpt_start_text_token"):
        pyxtts.import_xtts_checkpoint(folder / "model.pth", tmp_path / "a.safetensors")
    assert not (tmp_path / "a.safetensors").exists()
    shutil.copyfile(base / "vocab.json", folder / "vocab.json")
    meta = pyxtts.import_xtts_checkpoint(folder / "model.pth", tmp_path / "a.safetensors")
    assert meta["extra"]["config_source"] == "the config pickled in model.pth"
    want = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    assert pyxtts.ModelConfig(**meta["config"]) == want and want.start_text_token == 261


def test_import_gpt_trainer_checkpoint(trainer_checkpoint, tmp_path):
    gpt = torch_state(trainer_checkpoint, "xtts.gpt.")
    assert len(gpt) == 90
    meta = pyxtts.import_xtts_checkpoint(trainer_checkpoint, tmp_path / "t.safetensors")
    cfg = pyxtts.ModelConfig(**meta["config"])
    assert cfg == pyxtts.ModelConfig.from_xtts_config(trainer_checkpoint.parent / "config.json")
    model = pyxtts.XTTSGPT(cfg)
    pyxtts.load_checkpoint(tmp_path / "t.safetensors", model)
    for k, v in model.state_dict().items():
        assert v.tobytes() == gpt[k].tobytes(), k
    assert meta["extra"]["carried"] == [] and len(model.state_dict()) == 90


def fine_tune(model, rng, steps=3):
    """A few real AdamW steps on random framed batches: weights that differ from the base."""
    opt = pyxtts.AdamW(model, lr=1e-3, weight_decay=0.01)
    c = model.config
    for _ in range(steps):
        samples = [pyxtts.Sample(rng.integers(3, c.text_vocab_size, int(rng.integers(2, 15))),
                                 rng.integers(0, 1024, int(rng.integers(2, 25)))) for _ in range(3)]
        batch = pyxtts.collate(samples, config=c)
        # reference mels: the conditioning path trains too, so every one of the 90 tensors moves
        batch["cond_mels"] = rng.standard_normal((3, 80, int(rng.integers(20, 60)))).astype(np.float32)
        opt.zero_grad()
        model.forward_backward(batch)
        opt.step()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_export_loads_in_coqui_strict_bit_equal(base, tmp_path, rng, precision):
    pyxtts.import_xtts_checkpoint(base, tmp_path / "imported.safetensors")
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    model = pyxtts.XTTSGPT(cfg, precision=precision)
    pyxtts.load_checkpoint(tmp_path / "imported.safetensors", model)
    fine_tune(model, rng)
    pyxtts.save_checkpoint(tmp_path / "step_3.safetensors", model)
    base_state = torch_state(base / "model.pth")
    before = {p.name: file_hash(p) for p in base.iterdir()}
    out = tmp_path / "finetuned"
    report = pyxtts.export_xtts_checkpoint(tmp_path / "step_3.safetensors", base, out)
    assert {p.name: file_hash(p) for p in base.iterdir()} == before, "the base is never modified"
    assert sorted(report["copied"]) == ["config.json", "vocab.json"] and report["not_in_base"] == ["speakers_xtts.pth"]
    assert len(report["replaced"]) == len(model.parameters()) == 90 and report["carried_from_base"] == []
    assert {p.name for p in out.iterdir()} == {"model.pth", "config.json", "vocab.json"}
    loaded = coqui_load(out)  # Coqui's own loader, strict=True
    assert set(loaded) == set(base_state)
    own = model.state_dict()
    for k, v in loaded.items():
        if k.startswith("gpt.") and k[4:] in own:  # ours, cast to the base's float32
            assert v.dtype == base_state[k].dtype
            assert v.tobytes() == own[k[4:]].astype(np.float32).tobytes(), k
        else:  # HiFi-GAN, mel stats, ...: the base's
            assert v.tobytes() == base_state[k].tobytes(), k
    changed = sum(not np.array_equal(loaded["gpt." + k], base_state["gpt." + k]) for k in own)
    assert changed == len(own), "fine-tuning changed every tensor, so the comparison means something"


def test_round_trip_import_export_import(base, tmp_path, rng):
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    model = pyxtts.XTTSGPT(cfg, seed=int(rng.integers(1 << 30)))
    pyxtts.export_xtts_checkpoint(model, base, tmp_path / "out")
    meta = pyxtts.import_xtts_checkpoint(tmp_path / "out", tmp_path / "again.safetensors")
    again = pyxtts.XTTSGPT(pyxtts.ModelConfig(**meta["config"]))
    pyxtts.load_checkpoint(tmp_path / "again.safetensors", again)
    for k, v in model.state_dict().items():
        assert again.state_dict()[k].tobytes() == v.tobytes(), k
    pyxtts.import_xtts_checkpoint(base, tmp_path / "first.safetensors")
    _, first = pyxtts.checkpoint.read_checkpoint(tmp_path / "first.safetensors")
    _, second = pyxtts.checkpoint.read_checkpoint(tmp_path / "again.safetensors")
    assert not [k for k in first if k.startswith("carried.")] and not [k for k in second if k.startswith("carried.")]


def test_export_refusals_change_nothing(base, tmp_path, rng):
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    model = pyxtts.XTTSGPT(cfg, seed=3)
    out = tmp_path / "out"
    pyxtts.export_xtts_checkpoint(model, base, out)
    done = {p.name: file_hash(p) for p in out.iterdir()}
    other_heads = pyxtts.XTTSGPT(dataclasses.replace(cfg, n_heads=8), seed=4)  # same shapes, another GPT
    with pytest.raises(pyxtts.CheckpointError, match="n_heads: 8 in the model, 4 in the base"):
        pyxtts.export_xtts_checkpoint(other_heads, base, out)
    other_ids = pyxtts.XTTSGPT(dataclasses.replace(cfg, start_text_token=5), seed=4)
    with pytest.raises(pyxtts.CheckpointError, match="start_text_token"):
        pyxtts.export_xtts_checkpoint(other_ids, base, out)
    bigger = pyxtts.XTTSGPT(dataclasses.replace(cfg, n_layers=3), seed=4)
    with pytest.raises(pyxtts.CheckpointError, match="n_layers"):
        pyxtts.export_xtts_checkpoint(bigger, base, out)
    with pytest.raises(ValueError, match="the base's own folder"):
        pyxtts.export_xtts_checkpoint(model, base, base)
    with pytest.raises(TypeError, match="model_or_checkpoint"):
        pyxtts.export_xtts_checkpoint({"a": 1}, base, out)
    nan = pyxtts.XTTSGPT(cfg, seed=5)
    nan.parameters()["mel_head.bias"].copy_(np.full(nan.parameters()["mel_head.bias"].shape, np.nan, np.float32))
    with pytest.raises(pyxtts.CheckpointError, match="NaN"):
        pyxtts.export_xtts_checkpoint(nan, base, out)
    assert {p.name: file_hash(p) for p in out.iterdir()} == done, "a refused export leaves the folder as it was"


def test_export_is_atomic(base, tmp_path, monkeypatch):
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    out = tmp_path / "out"
    pyxtts.export_xtts_checkpoint(pyxtts.XTTSGPT(cfg, seed=1), base, out)
    done = file_hash(out / "model.pth")

    def dies_half_way(src, dst, storages, pickle_data=None):
        dst.write_bytes(b"PK\x03\x04 half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(pyxtts.coqui_checkpoint, "rewrite_storages", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        pyxtts.export_xtts_checkpoint(pyxtts.XTTSGPT(cfg, seed=2), base, out, overwrite=True)
    assert file_hash(out / "model.pth") == done and sorted(p.name for p in out.iterdir()) == \
        ["config.json", "model.pth", "vocab.json"], "the old file stays, no temporary is left"


def test_a_train_that_fails_after_init_takes_its_import_back(base, tmp_path, capsys):
    """`train --init XTTS-v2` imports into <checkpoint_dir>/init_xtts.safetensors first; a
    typo in --data (or a refused --resume) then failed the command and left the new folder
    with that file (1.8 GB at XTTS v2's size). A run's own import stays."""
    def train(run, *more):
        rc = pyxtts.cli.main(["train", "--init", str(base), "--data", str(tmp_path / "shardz"), "--checkpoint-dir",
                              str(run), "--no-progress", *more])
        assert rc == 2 and "--data: cannot read" in capsys.readouterr().err
    train(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    train(tmp_path / "mine")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]
    # a run that started from --init keeps its import when a later command fails
    pyxtts.import_xtts_checkpoint(base, tmp_path / "mine" / "init_xtts.safetensors")
    train(tmp_path / "mine", "--resume")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["init_xtts.safetensors", "notes.txt"]


def test_an_export_that_cannot_be_written_leaves_the_folder_as_it_was(base, tmp_path, monkeypatch):
    """A full disk during an export (a file size limit under model.pth's size: EFBIG where a
    full disk gives ENOSPC) is an OSError naming the file and the cause, and the folders
    the export made (its parents too) are gone again. Over an earlier export, a failure after model.pth is written
    (here: copying config.json) leaves every file of the earlier export as it was: model.pth
    was renamed into place before the files beside it were written, a mix of two exports."""
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    model = pyxtts.XTTSGPT(cfg, seed=1)
    out = tmp_path / "new" / "er"
    with file_size_limit((base / "model.pth").stat().st_size // 2):
        with pytest.raises(OSError) as caught:
            pyxtts.export_xtts_checkpoint(model, base, out)
    assert str(caught.value) == f"[Errno {errno.EFBIG}] cannot write {str(out / 'model.pth')!r}: File too large"
    assert not (tmp_path / "new").exists()
    out = tmp_path / "earlier"
    pyxtts.export_xtts_checkpoint(model, base, out)
    done = {p.name: file_hash(p) for p in out.iterdir()}

    def no_space(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", no_space)
    with pytest.raises(OSError) as caught:
        pyxtts.export_xtts_checkpoint(pyxtts.XTTSGPT(cfg, seed=2), base, out, overwrite=True)
    assert str(caught.value) == f"[Errno {errno.ENOSPC}] cannot write {str(out / 'config.json')!r}: No space left on device"
    assert {p.name: file_hash(p) for p in out.iterdir()} == done


def test_cli_export(base, tmp_path, capsys):
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    model = pyxtts.XTTSGPT(cfg, seed=9)
    ckpt = tmp_path / "run" / "step_00000010.safetensors"
    pyxtts.save_checkpoint(ckpt, model, step=10)
    rc = pyxtts.cli.main(["export", "--checkpoint", str(ckpt), "--base", str(base), "--out", str(tmp_path / "o")])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "90 GPT tensors from" in text and "carried unchanged" not in text
    assert "not in the base, so not copied: speakers_xtts.pth" in text
    loaded = coqui_load(tmp_path / "o")
    assert loaded["gpt.mel_head.weight"].tobytes() == model.state_dict()["mel_head.weight"].tobytes()
    rc = pyxtts.cli.main(["export", "--checkpoint", str(tmp_path / "nope.safetensors"), "--base", str(base),
                          "--out", str(tmp_path / "o2")])
    assert rc == 2 and "pyxtts export:" in capsys.readouterr().err


def test_cli_export_best_and_latest_of_a_run(base, tmp_path, capsys):
    """`--checkpoint best` is the run's best.safetensors, `latest` its newest step
    checkpoint, found in --checkpoint-dir or in --config's training.checkpoint_dir."""
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    run = tmp_path / "run"
    best, newest = pyxtts.XTTSGPT(cfg, seed=3), pyxtts.XTTSGPT(cfg, seed=4)
    pyxtts.save_checkpoint(run / "best.safetensors", best, step=4)
    pyxtts.save_checkpoint(run / "step_00000002.safetensors", pyxtts.XTTSGPT(cfg, seed=5), step=2)
    pyxtts.save_checkpoint(run / "step_00000010.safetensors", newest, step=10)
    rc = pyxtts.cli.main(["export", "--checkpoint", "best", "--checkpoint-dir", str(run), "--base", str(base),
                          "--out", str(tmp_path / "b")])
    assert rc == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"90 GPT tensors from {run / 'best.safetensors'}" in out
    # which run's best it took, with its step: another folder's best passed unseen
    assert f"--checkpoint best: {run / 'best.safetensors'}, step 4 of the run in {run}" in out, out
    assert coqui_load(tmp_path / "b")["gpt.mel_head.weight"].tobytes() == \
        best.state_dict()["mel_head.weight"].tobytes()
    yaml = tmp_path / "run.yaml"
    yaml.write_text("training:\n  checkpoint_dir: run\n")  # relative to the file's folder
    rc = pyxtts.cli.main(["export", "--checkpoint", "latest", "--config", str(yaml), "--base", str(base),
                          "--out", str(tmp_path / "l")])
    assert rc == 0, capsys.readouterr().err
    assert coqui_load(tmp_path / "l")["gpt.mel_head.weight"].tobytes() == \
        newest.state_dict()["mel_head.weight"].tobytes()
    (run / "best.safetensors").unlink()
    rc = pyxtts.cli.main(["export", "--checkpoint", "best", "--checkpoint-dir", str(run), "--base", str(base),
                          "--out", str(tmp_path / "n")])
    err = capsys.readouterr().err
    assert rc == 2 and f"pyxtts export: --checkpoint best: no best checkpoint in {run}" in err
    assert not (tmp_path / "n").exists()
    rc = pyxtts.cli.main(["export", "--checkpoint", "best", "--checkpoint-dir", str(tmp_path / "rnu"),
                          "--base", str(base), "--out", str(tmp_path / "n")])
    err = capsys.readouterr().err  # a typo in the folder is named as such, not as a run without a best
    assert rc == 2 and f"--checkpoint best: no run in '{tmp_path / 'rnu'}': it is not a folder" in err, err


def test_export_latest_of_a_run_that_removes_it_meanwhile_takes_the_newest(base, tmp_path, capsys, monkeypatch):
    """`--checkpoint latest` of a run training with keep_checkpoints 1: the run saved step 20
    and removed step 10 between the export's choosing step 10 and reading it, and the
    export failed on a file it had just found. It takes the run's newest, step 20, and says
    so. A checkpoint named by its path that is missing is still refused."""
    from helpers.pruning import save_lands_before_the_read

    run = tmp_path / "run"
    newer = save_lands_before_the_read(monkeypatch, pyxtts.ModelConfig.from_xtts_config(base / "config.json"), run)
    out = tmp_path / "o"
    rc = pyxtts.cli.main(["export", "--checkpoint", "latest", "--checkpoint-dir", str(run), "--base", str(base),
                          "--out", str(out)])
    said = capsys.readouterr()
    assert rc == 0, said.err
    assert f"--checkpoint latest: {run / 'step_00000020.safetensors'}, step 20 of the run in {run}" in said.out
    assert coqui_load(out)["gpt.mel_head.weight"].tobytes() == newer.state_dict()["mel_head.weight"].tobytes()
    rc = pyxtts.cli.main(["export", "--checkpoint", str(run / "step_00000010.safetensors"), "--base", str(base),
                          "--out", str(tmp_path / "p")])
    assert rc == 2 and "step_00000010.safetensors: no such checkpoint file" in capsys.readouterr().err


def test_export_best_says_the_step_of_the_weights_it_exported(base, tmp_path, capsys, monkeypatch):
    """`--checkpoint best` said "step N" read from best.safetensors before the export read it
    again: a run's evaluation that replaced best.safetensors in between made it name step 4
    for step 8's weights. The step said is the one read with the weights exported."""
    import pyxtts.coqui_checkpoint

    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    run = tmp_path / "run"
    pyxtts.save_checkpoint(run / "best.safetensors", pyxtts.XTTSGPT(cfg, seed=4), step=4)
    better = pyxtts.XTTSGPT(cfg, seed=8)
    real = pyxtts.coqui_checkpoint.read_checkpoint
    replaced = []

    def an_evaluation_lands_first(path):
        if not replaced:  # the run's new best, saved (renamed over the old) as the export starts to read
            pyxtts.save_checkpoint(run / "best.safetensors", better, step=8)
            replaced.append(path)
        return real(path)

    monkeypatch.setattr(pyxtts.coqui_checkpoint, "read_checkpoint", an_evaluation_lands_first)
    out = tmp_path / "o"
    rc = pyxtts.cli.main(["export", "--checkpoint", "best", "--checkpoint-dir", str(run), "--base", str(base),
                          "--out", str(out)])
    said = capsys.readouterr()
    assert rc == 0 and replaced, said.err
    assert coqui_load(out)["gpt.mel_head.weight"].tobytes() == better.state_dict()["mel_head.weight"].tobytes()
    assert f"--checkpoint best: {run / 'best.safetensors'}, step 8 of the run in {run}" in said.out, said.out
    assert "step 4" not in said.out


def test_export_into_an_earlier_export_needs_overwrite(base, tmp_path, capsys):
    """A second export into the same folder overwrote it silently and left files the base
    lacks (a speakers_xtts.pth there then failed Coqui's strict load): it is refused, and
    --overwrite replaces the export and removes those files, leaving others alone."""
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    ckpt = tmp_path / "run" / "step_00000010.safetensors"
    pyxtts.save_checkpoint(ckpt, pyxtts.XTTSGPT(cfg, seed=9), step=10)
    argv = ["export", "--checkpoint", str(ckpt), "--base", str(base), "--out", str(tmp_path / "o")]
    assert pyxtts.cli.main(argv) == 0
    (tmp_path / "o" / "speakers_xtts.pth").write_bytes(b"not the base's")
    (tmp_path / "o" / "notes.txt").write_text("mine")
    before = {p.name: file_hash(p) for p in (tmp_path / "o").iterdir()}
    capsys.readouterr()
    assert pyxtts.cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"pyxtts export: --out: '{tmp_path / 'o'}' holds an export already (model.pth, config.json, " in err, err
    assert {p.name: file_hash(p) for p in (tmp_path / "o").iterdir()} == before
    assert pyxtts.cli.main([*argv, "--overwrite"]) == 0
    assert "removed, an earlier export's that the base lacks: speakers_xtts.pth" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["config.json", "model.pth", "notes.txt", "vocab.json"]
    coqui_load(tmp_path / "o")
    assert pyxtts.cli.main(["export", "--checkpoint", str(ckpt), "--base", str(tmp_path / "run"), "--out",
                            str(tmp_path / "p")]) == 2
    assert f"pyxtts export: --base: {tmp_path / 'run' / 'model.pth'}: " in capsys.readouterr().err


def test_ctrl_c_while_an_export_goes_into_place_comes_after_it(base, tmp_path, capsys, monkeypatch):
    """A Ctrl-C that lands while an export's files are renamed into place (over an earlier
    export holding a speakers_xtts.pth the base lacks) stopped it half-way: the new
    model.pth beside the earlier export's stale file, which fails Coqui's strict load. The
    renames and the removal finish first; the command then says the export is whole. A
    Ctrl-C while the files are written says the folder is as it was, and it is."""
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    ckpt = tmp_path / "step_00000002.safetensors"
    pyxtts.save_checkpoint(ckpt, pyxtts.XTTSGPT(cfg, seed=2), step=2)
    pyxtts.export_xtts_checkpoint(ckpt, base, tmp_path / "clean")
    out = tmp_path / "o"
    pyxtts.export_xtts_checkpoint(pyxtts.XTTSGPT(cfg, seed=1), base, out)
    (out / "speakers_xtts.pth").write_bytes(b"an earlier base's")
    before = {p.name: file_hash(p) for p in out.iterdir()}
    argv = ["export", "--checkpoint", str(ckpt), "--base", str(base), "--out", str(out), "--overwrite"]

    def written_then_ctrl_c(src, dst, storages, pickle_data=None):
        real_rewrite(src, dst, storages, pickle_data)
        raise KeyboardInterrupt

    real_rewrite = pyxtts.coqui_checkpoint.rewrite_storages
    monkeypatch.setattr(pyxtts.coqui_checkpoint, "rewrite_storages", written_then_ctrl_c)
    assert pyxtts.cli.main(argv) == 130
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"pyxtts export: interrupted; nothing of this export was written ({out} is as it was)"
    assert {p.name: file_hash(p) for p in out.iterdir()} == before
    monkeypatch.setattr(pyxtts.coqui_checkpoint, "rewrite_storages", real_rewrite)
    real_replace = os.replace

    def replace_then_ctrl_c(src, dst):
        real_replace(src, dst)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "replace", replace_then_ctrl_c)
    assert pyxtts.cli.main(argv) == 130
    monkeypatch.undo()
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"pyxtts export: interrupted once the export was in place: {out} holds it whole"
    clean = {p.name: file_hash(p) for p in (tmp_path / "clean").iterdir()}
    assert {p.name: file_hash(p) for p in out.iterdir()} == clean
    coqui_load(out)


CLI = "import sys, pyxtts.cli; sys.exit(pyxtts.cli.main(sys.argv[1:]))"


def test_a_second_export_into_a_folder_being_written_is_refused(base, tmp_path):
    """Two `pyxtts export` into one --out at once: the second, which found no export there
    yet, wrote its own and said so, and the first then renamed its files over it (or, with
    both mid-write, a model.pth of one beside a vocab.json of the other). The second is
    refused, with --overwrite too, naming the first one's process; the first writes its
    export whole."""
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    mine, theirs = pyxtts.XTTSGPT(cfg, seed=11), pyxtts.XTTSGPT(cfg, seed=12)
    pyxtts.save_checkpoint(tmp_path / "mine.safetensors", mine, step=1)
    pyxtts.save_checkpoint(tmp_path / "theirs.safetensors", theirs, step=1)
    out = tmp_path / "new" / "o"

    def argv(name, *more):
        return ["export", "--checkpoint", str(tmp_path / name), "--base", str(base), "--out", str(out), *more]

    first = Paused("pyxtts.coqui_checkpoint", "rewrite_storages", argv("mine.safetensors"), tmp_path / "first")
    with reaped(first.child):
        first.wait_until_paused()
        for more in ([], ["--overwrite"]):
            second = run_python(CLI, *argv("theirs.safetensors", *more))
            assert second.returncode == 2, second.stdout
            assert second.stderr.splitlines()[-1] == (
                f"pyxtts export: --out: {str(out)!r} is in use by another pyxtts command (process {first.child.pid}) "
                "writing into it: wait for it to end, or export into another folder"), second.stderr
        rc, said, err = first.go()
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.pth", "vocab.json"]
    assert coqui_load(out)["gpt.mel_head.weight"].tobytes() == mine.state_dict()["mel_head.weight"].tobytes()


def test_config_json_of_the_export_is_the_bases(base, tmp_path):
    cfg = pyxtts.ModelConfig.from_xtts_config(base / "config.json")
    pyxtts.export_xtts_checkpoint(pyxtts.XTTSGPT(cfg), base, tmp_path / "o")
    assert json.loads((tmp_path / "o" / "config.json").read_text()) == json.loads((base / "config.json").read_text())

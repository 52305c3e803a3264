"""A user of Coqui's XTTS v2 recipe moving to pyxtts with what that recipe left them: a
training run's folder (``checkpoint_<N>.pth``, ``best_model.pth``, no ``model.pth``) and its
PyTorch checkpoints, given where pyxtts wants an XTTS folder or one of its own checkpoints."""
from __future__ import annotations

import pickle
import re
import zipfile

import pytest

import pyxtts
import pyxtts.cli

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

TINY = pyxtts.ModelConfig(n_layers=1, d_model=32, n_heads=2, text_vocab_size=40, audio_vocab_size=30,
                          max_text_tokens=12, max_audio_tokens=20, n_cond_latents=0, conditioning=False)


def coqui_run_folder(folder):
    """The files Coqui's trainer leaves in a run's folder (their contents do not matter here)."""
    folder.mkdir(parents=True)
    for name in ("checkpoint_900.pth", "checkpoint_10000.pth", "best_model.pth", "best_model_9000.pth",
                 "config.json", "trainer_0_log.txt", "dvae.pth"):
        (folder / name).write_bytes(b"PK\x03\x04")
    return folder


def test_a_coqui_run_folder_names_its_checkpoints(tmp_path, capsys):
    """`--init RUN_FOLDER` said only "RUN_FOLDER/model.pth: no such file"; the folder of a
    Coqui run holds checkpoint_<N>.pth and best_model.pth instead, and one of those is meant."""
    run = coqui_run_folder(tmp_path / "GPT_XTTS_FT-run")
    rc = pyxtts.cli.main(["train", "--init", str(run), "--synthetic", "8", "--checkpoint-dir",
                          str(tmp_path / "ck"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert (f"pyxtts train: --init {run}: {run / 'model.pth'}: no such file; {run} holds the checkpoints of a "
            "Coqui training run (checkpoint_10000.pth, checkpoint_900.pth, best_model.pth, best_model_9000.pth): "
            f"name one of them, e.g. {run / 'checkpoint_10000.pth'}\n") in err
    assert not (tmp_path / "ck").exists()
    # as the base of an export it is not what Coqui's loader wants beside the result: the XTTS folder is
    ckpt = tmp_path / "step_00000001.safetensors"
    pyxtts.save_checkpoint(ckpt, pyxtts.XTTSGPT(TINY), step=1)
    rc = pyxtts.cli.main(["export", "--checkpoint", str(ckpt), "--base", str(run), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and not (tmp_path / "o").exists()
    assert (f"pyxtts export: --base: {run} holds the checkpoints of a Coqui training run (checkpoint_10000.pth, "
            "checkpoint_900.pth, best_model.pth, best_model_9000.pth), no model.pth: pass the Coqui XTTS folder the "
            "model was fine-tuned from") in err
    # a folder with neither says what it said
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"model.pth: no such file$"):
        pyxtts.import_xtts_checkpoint(tmp_path / "empty", tmp_path / "x.safetensors")


@pytest.mark.parametrize("kind", ["zip", "pickle"])
def test_a_pytorch_file_given_for_a_pyxtts_checkpoint_says_where_it_goes(tmp_path, capsys, kind):
    """`--resume checkpoint_8.pth` (Coqui's --continue_path, as a user would try it) and
    `export --checkpoint best_model.pth` said only "SafetensorError: header too large"."""
    pth = tmp_path / "checkpoint_8.pth"
    if kind == "zip":  # what torch.save writes
        with zipfile.ZipFile(pth, "w") as z:
            z.writestr("archive/data.pkl", pickle.dumps({"model": {}}))
    else:  # torch.save(..., _use_new_zipfile_serialization=False): a bare pickle
        pth.write_bytes(pickle.dumps({"model": {}}, protocol=2))
    advice = "; it is a PyTorch file, as Coqui's model.pth and its trainer's checkpoint_<N>.pth"
    rc = pyxtts.cli.main(["train", "--synthetic", "8", "--resume", str(pth), "--checkpoint-dir",
                          str(tmp_path / "ck"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and advice in err and "`pyxtts train --init PATH`" in err, err
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())
    rc = pyxtts.cli.main(["export", "--checkpoint", str(pth), "--base", str(tmp_path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and advice in err and not (tmp_path / "o").exists(), err


def test_a_binary_file_given_for_a_json_one_is_named(tmp_path, capsys):
    """A checkpoint given where a config.json or vocab.json belongs raised a bare
    "'utf-8' codec can't decode byte 0x80 in position 4", naming neither file nor flag."""
    pth = tmp_path / "best_model.pth"
    pth.write_bytes(b"PK\x03\x04\x80\x02}q\x00")
    with pytest.raises(ValueError, match=rf"^config '{re.escape(str(pth))}': not a JSON text file \(byte 0x80 at "
                                         r"offset 4 is not UTF-8\)$"):
        pyxtts.ModelConfig.from_xtts_config(pth)
    rc = pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--vocab", str(pth), "--no-step"])
    assert rc == 2
    assert f"pyxtts memtest: vocab '{pth}': not a JSON text file" in capsys.readouterr().err

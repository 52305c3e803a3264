"""A user of Coqui's XTTS v2 recipe moving to pyxtts with what that recipe left them: a
training run's folder (``checkpoint_<N>.pth``, ``best_model.pth``, no ``model.pth``) and its
PyTorch checkpoints, given where pyxtts wants an XTTS folder or one of its own checkpoints;
and docs/coqui.md's table from the recipe's settings to pyxtts's, checked on both sides."""
from __future__ import annotations

import dataclasses
import pickle
import re
import zipfile
from pathlib import Path

import pytest
import yaml

import pyxtts
import pyxtts.cli
from coqui import require_coqui
from pyxtts import XTTSConfig

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


# ---- docs/coqui.md's table from the recipe's settings to pyxtts's ------------------------

REPO = Path(__file__).resolve().parent.parent
RECIPE_CONSTANTS = {"BATCH_SIZE", "GRAD_ACUMM_STEPS", "OPTIMIZER_WD_ONLY_ON_WEIGHTS", "START_WITH_EVAL"}


def recipe_table() -> list[list[str]]:
    """The rows of docs/coqui.md's table (recipe, its value, pyxtts, note), as cells."""
    text = (REPO / "docs" / "coqui.md").read_text(encoding="utf-8")
    section = text.split("\n## From Coqui's recipe\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    cells = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in rows]
    assert len(cells) > 30 and all(len(c) == 4 for c in cells), [c for c in cells if len(c) != 4]
    return cells


def test_the_recipe_tables_pyxtts_names_are_real(capsys):
    """Every config key the table names is a field (and with a value, the shipped recipe's
    value), and every command-line flag one that command has."""
    with pytest.raises(SystemExit):
        pyxtts.cli.main(["--version"])  # builds the parsers, then prints the version
    capsys.readouterr()
    flags = {cmd: set(by_dest.values()) for cmd, by_dest in pyxtts.cli.CLI_FLAGS.items()}
    recipe = XTTSConfig.load("xtts_v2_finetune")
    sections = {"training": recipe.training, "data": recipe.data, "model": recipe.model}
    seen = 0
    for row in recipe_table():
        for name in re.findall(r"`([^`]+)`", row[2]):
            key = re.fullmatch(r"(training|data|model)\.(\w+)(?:: (.+))?", name)
            cmd = re.fullmatch(r"(?:pyxtts )?(prepare|train) (--[a-z-]+)", name)
            if key:
                section, field, value = key.groups()
                assert hasattr(sections[section], field), (row[0], name)
                if value is not None:
                    assert getattr(sections[section], field) == yaml.safe_load(value), (row[0], name)
                seen += 1
            elif cmd:
                assert cmd.group(2) in flags[cmd.group(1)], (row[0], name)
                seen += 1
    assert seen > 35, seen


def test_the_recipe_tables_coqui_names_are_coquis():
    """Every name of the table's first column is one of the recipe's constants or a field
    of the configs it builds (GPTTrainerConfig, GPTArgs, TrainerArgs, BaseDatasetConfig)."""
    require_coqui()
    from TTS.config.shared_configs import BaseDatasetConfig
    from TTS.tts.layers.xtts.trainer.gpt_trainer import GPTArgs, GPTTrainerConfig
    from trainer import TrainerArgs

    known = set().union(*({f.name for f in dataclasses.fields(c)}
                          for c in (GPTTrainerConfig, GPTArgs, TrainerArgs, BaseDatasetConfig)))
    names = [n for row in recipe_table() for n in re.findall(r"`(\w+)`", row[0])]
    assert len(names) > 40
    unknown = [n for n in names if n not in known and n not in RECIPE_CONSTANTS]
    assert not unknown, unknown


def test_the_docs_count_xtts_v2s_gpt_tensors():
    """docs/coqui.md said XTTS v2's GPT has 90 tensors, the count of the tests' 2-layer
    models; at XTTS v2's 30 layers it has 426 (the count does not depend on the width)."""
    model = dataclasses.replace(XTTSConfig.load("xtts_v2_finetune").model, d_model=64, n_heads=4)
    assert model.n_layers == 30 and model.conditioning
    assert len(pyxtts.XTTSGPT(model).parameters()) == 426
    text = (REPO / "docs" / "coqui.md").read_text(encoding="utf-8")
    assert "the GPT's 426 tensors" in text and "for XTTS v2 all 426" in text and "90 tensors" not in text

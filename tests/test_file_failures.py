"""What a machine that misbehaves leaves of a run: a full disk under the checkpoints, the
log or the TensorBoard files, a name too long for the file system, two runs started on
one folder. Each failure is one line naming the file and the cause (no traceback from
the command line), and what existed before is there, whole, afterwards.

A full disk is made with a file size limit (``helpers.disk``: EFBIG where a full disk
gives ENOSPC, in every writer, no mount needed)."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

import pyxtts
import pyxtts.cli
from helpers.disk import file_size_limit
from pyxtts import SyntheticDataset, Trainer, XTTSConfig

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

MODEL = {"n_layers": 2, "d_model": 64, "n_heads": 4, "text_vocab_size": 64, "audio_vocab_size": 97,
         "max_text_tokens": 24, "max_audio_tokens": 48, "n_cond_latents": 0, "conditioning": False}
TOO_LARGE = os.strerror(errno.EFBIG)


def make_config(folder: Path, **training) -> XTTSConfig:
    t = {"learning_rate": 3e-3, "lr_schedule": "constant", "max_steps": 6, "epochs": None,
         "checkpoint_dir": str(folder / "ckpt"), "checkpoint_interval": 3, "eval_interval": 3,
         "device": "cpu", "enable_memory_cleanup": False, "max_memory_fraction": 1.0}
    t.update(training)
    return XTTSConfig.from_dict({"model": MODEL, "training": t, "data": {"batch_size": 4}})


def datasets(config: XTTSConfig, n: int = 16):
    return SyntheticDataset(config.model, n + 8, seed=0).split(8)


def steps_logged(path: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "train"]


# ---- a full disk -------------------------------------------------------------------

def test_a_full_disk_stops_train_in_one_line_naming_the_checkpoint(tmp_path, capsys):
    """`pyxtts train` on a disk that fills at its first checkpoint (the best one, after the
    evaluation before the first step): one line names the file and the cause, exit status
    2, no traceback, and the folder holds no part of a checkpoint."""
    cfg = make_config(tmp_path)
    cfg.save(tmp_path / "c.yaml")
    ck = tmp_path / "ckpt"
    with file_size_limit(64 << 10):  # the log fits; a checkpoint of this model (~0.5 MB) does not
        rc = pyxtts.cli.main(["train", "--config", str(tmp_path / "c.yaml"), "--synthetic", "24",
                              "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.splitlines()[-1] == f"pyxtts train: cannot write {str(ck / 'best.safetensors')!r}: {TOO_LARGE}", err
    assert "Traceback" not in err
    assert not [p.name for p in ck.iterdir() if ".safetensors" in p.name]


def test_a_full_disk_under_the_log_names_the_log(tmp_path):
    """The JSONL log cannot be written: the error names it, and closing the log at the end
    of fit (which fails the same way) does not hide that error behind a bare "File too
    large"."""
    cfg = make_config(tmp_path)
    train, held = datasets(cfg)
    trainer = Trainer(cfg, progress=False)
    log = trainer.log_path
    with file_size_limit(100):  # no log record fits
        with pytest.raises(OSError) as caught:
            trainer.fit(train, held)
    assert caught.value.errno == errno.EFBIG
    assert str(caught.value) == f"[Errno {errno.EFBIG}] cannot write the training log {str(log)!r}: {TOO_LARGE}"

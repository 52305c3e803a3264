"""A run that removes its older checkpoints as it saves (``training.keep_checkpoints``
1), caught between a command's choosing its newest checkpoint and reading it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyxtts
import pyxtts.coqui_checkpoint


def save_lands_before_the_read(monkeypatch: Any, cfg: Any, run: Path) -> Any:
    """``run`` holds step 10 of a model of ``cfg``; the first checkpoint read after this
    (``pyxtts.coqui_checkpoint.read_checkpoint``, what export reads with) finds that the
    run has saved step 20 and removed step 10, as ``Trainer.save`` does. Returns step 20's
    model, whose weights the command must end up with."""
    pyxtts.save_checkpoint(run / "step_00000010.safetensors", pyxtts.XTTSGPT(cfg, seed=10), step=10)
    newer = pyxtts.XTTSGPT(cfg, seed=20)
    real = pyxtts.coqui_checkpoint.read_checkpoint

    def a_save_lands_first(path):
        if not (run / "step_00000020.safetensors").exists():
            pyxtts.save_checkpoint(run / "step_00000020.safetensors", newer, step=20)
            (run / "step_00000010.safetensors").unlink()
        return real(path)

    monkeypatch.setattr(pyxtts.coqui_checkpoint, "read_checkpoint", a_save_lands_first)
    return newer

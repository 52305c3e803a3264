"""Hearing the model: ``training.test_sentences`` spoken at each evaluation.

The current weights are exported into a Coqui XTTS folder (``training.xtts_dir`` with
the GPT replaced), which a child process speaks (``pyxtts.speak``) into
``<checkpoint_dir>/samples/step_<N>/<i>.wav``; every callback then gets ``on_audio``
(TensorBoard's audio tab). Without coqui-tts one line says so and the run goes on; so
does a failure to export or speak, said at the evaluation it happened in."""
from __future__ import annotations

import shutil
from pathlib import Path

from pyxtts.callbacks.base import Callback, Run

__all__ = ["SpokenSamples", "samples_dir"]

INSTALL_HINT = ("note: training.test_sentences are not spoken because coqui-tts is not installed; "
                "pip install coqui-tts (and torch) to hear them at each evaluation")

NO_EVALUATION = ("note: training.test_sentences are spoken at each evaluation, and this run has no evaluation "
                 "data, so none will be spoken; hold clips out with pyxtts prepare --eval-fraction, or pass "
                 "evaluation data (--eval-data, fit(train, eval_dataset))")


def samples_dir(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / "samples"


class SpokenSamples(Callback):
    def __init__(self) -> None:
        self.active = False
        self.told = False  # the missing package is said once per trainer

    def on_fit_start(self, run: Run) -> None:
        from pyxtts.speak import coqui_installed

        self.active = bool(run.config.training.test_sentences) and coqui_installed()
        if run.config.training.test_sentences and not self.active and not self.told:
            run.warn(INSTALL_HINT)  # seen with --no-progress too
            self.told = True
        if self.active and run.eval_dataset is None:  # Coqui's trainer speaks them each epoch, evaluated or not
            run.warn(NO_EVALUATION)

    def on_evaluation(self, run: Run, record: dict) -> None:
        if not self.active:
            return
        from pyxtts.coqui_checkpoint import export_xtts_checkpoint
        from pyxtts.speak import speak

        t = run.config.training
        step = int(record["step"])
        out = samples_dir(run.checkpoint_dir) / f"step_{step:08d}"
        export = samples_dir(run.checkpoint_dir) / f".export_step_{step:08d}"
        try:  # the export is the child's input only: gone once it has spoken
            # a leftover of a crashed run at this step is this run's scratch too
            export_xtts_checkpoint(run.model, t.xtts_dir, export, vocab=t.vocab, overwrite=True)
            files = speak(export, list(t.test_sentences), out, seed=t.seed)
        except (OSError, RuntimeError, ValueError) as exc:
            # samples are for watching: a failure to make them is said, and training goes on
            run.warn(f"step {step}: the test sentences could not be spoken: {type(exc).__name__}: "
                     f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}")
            return
        finally:
            shutil.rmtree(export, ignore_errors=True)
        run.audio(step, [(p, s["text"]) for p, s in zip(files, t.test_sentences)])

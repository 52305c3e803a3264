"""The Coqui reference of the comparison tests (coqui-tts 0.28.0).

Tests import Coqui only through ``require_coqui()``: it skips the test, with the reason,
when coqui-tts is not installed (``sh tests/install_coqui.sh`` installs it), and lets a
coqui-tts that is installed but fails to import fail the test, so a broken reference
never passes for an absent one.
"""
from __future__ import annotations

import importlib.util
import warnings
from types import SimpleNamespace

import pytest

ABSENT = "coqui-tts is not installed here; `sh tests/install_coqui.sh` installs the reference"


def coqui_installed() -> bool:
    return importlib.util.find_spec("TTS") is not None


def require_coqui() -> SimpleNamespace:
    """Coqui's classes the tests use (and torch); skips when coqui-tts is absent."""
    if not coqui_installed():
        pytest.skip(ABSENT)
    with warnings.catch_warnings():  # transformers and torchaudio warn about their own deprecations
        warnings.simplefilter("ignore")
        import torch
        from TTS.tts.configs.xtts_config import XttsArgs, XttsAudioConfig, XttsConfig
        from TTS.tts.layers.tortoise.arch_utils import TorchMelSpectrogram
        from TTS.tts.layers.xtts.dvae import DiscreteVAE
        from TTS.tts.layers.xtts.gpt import GPT
        from TTS.tts.layers.xtts.trainer import dataset as xtts_dataset
        from TTS.tts.layers.xtts.trainer.gpt_trainer import GPTArgs, GPTTrainer, GPTTrainerConfig
        from TTS.tts.layers.xtts.tokenizer import VoiceBpeTokenizer
        from TTS.tts.models import xtts as xtts_module
        from TTS.tts.models.xtts import Xtts
        from trainer.io import save_checkpoint as trainer_save_checkpoint
    return SimpleNamespace(torch=torch, GPT=GPT, Xtts=Xtts, XttsConfig=XttsConfig, XttsArgs=XttsArgs,
                           XttsAudioConfig=XttsAudioConfig, GPTArgs=GPTArgs, GPTTrainer=GPTTrainer,
                           GPTTrainerConfig=GPTTrainerConfig, VoiceBpeTokenizer=VoiceBpeTokenizer,
                           xtts_module=xtts_module, trainer_save_checkpoint=trainer_save_checkpoint,
                           TorchMelSpectrogram=TorchMelSpectrogram, DiscreteVAE=DiscreteVAE,
                           xtts_dataset=xtts_dataset)

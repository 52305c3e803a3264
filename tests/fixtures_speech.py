"""A small XTTS v2 folder for speech made by espeak-ng (``fixtures_prepare``), in the
released layout: ``model.pth`` (Coqui's ``Xtts``, randomly initialised, its ``XttsConfig``
pickled) and ``config.json`` written by Coqui's own classes, then ``vocab.json`` (a BPE
trained on the test text), ``dvae.pth`` (the tiny DVAE) and ``mel_stats.pth``. Call after
``coqui.require_coqui()``."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import fixtures_prepare as fx
from conftest import SEED

# the GPT of the test's XTTS folder: XTTS v2's layout, narrow; the text ids of the trained
# vocabulary (600 ids, [START] = 20, [STOP] = 0), the tiny DVAE's 64 codes + start/stop
GPT_ARGS = {"gpt_layers": 2, "gpt_n_model_channels": 64, "gpt_n_heads": 4, "gpt_number_text_tokens": 600,
            "gpt_start_text_token": None, "gpt_stop_text_token": None, "gpt_num_audio_tokens": 66,
            "gpt_start_audio_token": 64, "gpt_stop_audio_token": 65, "gpt_max_text_tokens": 80,
            "gpt_max_audio_tokens": 200, "gpt_max_prompt_tokens": 70,
            # the HiFi-GAN decoder reads the GPT's latents: as wide as the GPT, so Coqui can speak
            "decoder_input_dim": 64}


def write_xtts_folder(folder: Path, wavs: list[Path]) -> Path:
    """The released layout: model.pth (Coqui's Xtts, pickled XttsConfig) and config.json
    from Coqui's classes, then vocab.json, dvae.pth and mel_stats.pth."""
    from coqui import require_coqui
    from fixtures_xtts import _legacy_class_paths, randomize, xtts_config

    c = require_coqui()
    folder.mkdir(parents=True)
    config = xtts_config(**GPT_ARGS)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Xtts.init_from_config")
        model = c.Xtts.init_from_config(config)
    randomize(model, SEED % 2**31)
    with _legacy_class_paths():
        c.torch.save({"config": config, "model": model.state_dict()}, folder / "model.pth")
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2), encoding="utf-8")
    fx.write_assets(folder, wavs, SEED, fx.training_texts(), dvae=fx.TINY_DVAE)  # keeps config.json
    return folder


def finetune_yaml(max_steps: int, interval: int) -> str:
    """The end-to-end tests' training config: Coqui-free plain settings on the CPU, fp32,
    checkpoint every ``max_steps``, evaluation and logging every ``interval`` steps."""
    return f"""\
training:
  learning_rate: 1.0e-3
  lr_schedule: constant
  weight_decay: 0.0
  max_steps: {max_steps}
  epochs: null
  checkpoint_interval: {max_steps}
  eval_interval: {interval}
  log_interval: {interval}
  device: cpu
  precision: fp32
  checkpointing: none
  enable_memory_cleanup: false
data:
  batch_size: 4
  num_workers: 1
"""


def coqui_model(folder: Path):
    """(coqui namespace, Coqui's ``Xtts`` loaded from an exported folder, strict, eval)."""
    from coqui import require_coqui

    c = require_coqui()
    config = c.XttsConfig()
    config.load_json(str(folder / "config.json"))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Xtts.init_from_config")
        model = c.Xtts.init_from_config(config)
    model.load_checkpoint(config, checkpoint_dir=str(folder), strict=True, eval=True)
    return c, model

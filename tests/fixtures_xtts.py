"""Small randomly initialised Coqui XTTS v2 checkpoints in Coqui's exact formats, built
with Coqui's own classes (call after ``coqui.require_coqui()``).

- ``write_xtts_folder(folder, seed)``: what the released XTTS v2 folder holds, small:
  ``model.pth`` = ``{"config": <XttsConfig object>, "model": <Xtts state dict>}`` written
  by ``torch.save``, with ``XttsArgs`` and ``XttsAudioConfig`` pickled under
  ``TTS.tts.models.xtts`` as in the released file (Coqui's ``_legacy_safe_globals``
  reads them from there); ``config.json`` (the config's ``to_dict()``), whose text
  start/stop ids are null as in the released one; ``vocab.json``, where they are.
- ``write_gpt_trainer_checkpoint(folder, seed)``: a checkpoint of Coqui's
  ``GPTTrainer`` (keys ``xtts.*``, ``dvae.*``, the mel extractors; config as a dict;
  AdamW state after one step) written by the trainer's own ``save_checkpoint``.
- ``write_vocab(path, size)``: a tokenizer ``vocab.json`` of ``size`` ids with XTTS v2's
  ``[STOP]`` = 0, ``[UNK]`` = 1, ``[SPACE]`` = 2 and ``[START]`` = 261.

Every floating-point tensor is drawn afresh from the seed (Coqui initialises some to
zero), so no comparison passes on zeros.
"""
from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from coqui import require_coqui

# a 2-layer XTTS v2 (perceiver resampler, XTTS v2's token ids)
SMALL_ARGS = {
    "gpt_layers": 2, "gpt_n_model_channels": 64, "gpt_n_heads": 4, "gpt_number_text_tokens": 300,
    "gpt_start_text_token": 261, "gpt_stop_text_token": 0, "gpt_num_audio_tokens": 1026,
    "gpt_start_audio_token": 1024, "gpt_stop_audio_token": 1025, "gpt_max_text_tokens": 20,
    "gpt_max_audio_tokens": 30, "gpt_max_prompt_tokens": 70, "gpt_code_stride_len": 1024,
    "gpt_use_perceiver_resampler": True, "gpt_use_masking_gt_prompt_approach": True,
}
SPECIAL_TOKENS = {0: "[STOP]", 1: "[UNK]", 2: "[SPACE]", 261: "[START]"}


def write_vocab(path: Path, size: int) -> Path:
    vocab = {f"tok{i}": i for i in range(size) if i not in SPECIAL_TOKENS}
    vocab.update({name: i for i, name in SPECIAL_TOKENS.items() if i < size})
    doc = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": i, "content": n, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, n in sorted(SPECIAL_TOKENS.items())
                            if i < size],
           "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
           "model": {"type": "BPE", "dropout": None, "unk_token": "[UNK]", "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "vocab": vocab, "merges": []}}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def randomize(module: Any, seed: int) -> None:
    """Every floating-point parameter and buffer of ``module`` from N(0, 0.05²) (mel
    statistics and variances positive), drawn in state-dict order from ``seed``; the
    speaker encoder's spectrogram (its window, filterbank and pre-emphasis) is kept as
    built: a random filterbank gives negative energies, whose log is NaN, and a NaN voice."""
    c = require_coqui()
    rng = np.random.default_rng(seed)
    with c.torch.no_grad():
        for name, t in module.state_dict(keep_vars=True).items():
            if t.dtype.is_floating_point:
                v = rng.standard_normal(tuple(t.shape)) * 0.05  # drawn even where kept: the rest as before
                if ".torch_spec." in name:
                    continue
                if name.endswith(("mel_stats", "running_var")) or "mel_norms" in name:
                    v = np.abs(v) + 0.5  # statistics that are divided by or square-rooted
                t.copy_(c.torch.from_numpy(v.astype(np.float32)))


def xtts_config(**overrides: Any) -> Any:
    c = require_coqui()
    config = c.XttsConfig()
    for k, v in {**SMALL_ARGS, **overrides}.items():
        setattr(config.model_args, k, v)
    return config


@contextlib.contextmanager
def _legacy_class_paths():
    """XttsArgs and XttsAudioConfig pickled under TTS.tts.models.xtts, as in the
    released model.pth (Coqui moved them since and reads them back from there)."""
    c = require_coqui()
    old = c.XttsArgs.__module__, c.XttsAudioConfig.__module__
    c.XttsArgs.__module__ = c.XttsAudioConfig.__module__ = c.xtts_module.__name__
    try:
        yield
    finally:
        c.XttsArgs.__module__, c.XttsAudioConfig.__module__ = old


# the released config.json leaves the text start/stop ids null: Coqui reads them from vocab.json
RELEASED_NULLS = {"gpt_start_text_token": None, "gpt_stop_text_token": None}


def write_xtts_folder(folder: Path, seed: int, **overrides: Any) -> Path:
    """A released-style XTTS folder (model.pth, config.json, vocab.json); returns folder."""
    c = require_coqui()
    folder.mkdir(parents=True, exist_ok=True)
    config = xtts_config(**{**RELEASED_NULLS, **overrides})
    write_vocab(folder / "vocab.json", config.model_args.gpt_number_text_tokens)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Xtts.init_from_config")  # Coqui deprecates its own API
        model = c.Xtts.init_from_config(config)
    randomize(model, seed)
    with _legacy_class_paths():
        c.torch.save({"config": config, "model": model.state_dict()}, folder / "model.pth")
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2), encoding="utf-8")
    return folder


def write_gpt_trainer_checkpoint(folder: Path, seed: int, **overrides: Any) -> Path:
    """A GPTTrainer checkpoint (checkpoint_1.pth) with its config.json; returns its path."""
    c = require_coqui()
    torch = c.torch
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_vocab(folder / "vocab.json", SMALL_ARGS["gpt_number_text_tokens"])
    mel_norms = folder / "mel_stats.pth"
    torch.save(torch.ones(80), mel_norms)
    dvae = folder / "dvae.pth"
    args = c.GPTArgs(**{**SMALL_ARGS, **overrides}, tokenizer_file=str(vocab), mel_norm_file=str(mel_norms),
                     dvae_checkpoint=str(dvae))
    config = c.GPTTrainerConfig(model_args=args, optimizer="AdamW", optimizer_wd_only_on_weights=True,
                                optimizer_params={"betas": [0.9, 0.96], "eps": 1e-8, "weight_decay": 1e-2},
                                lr=5e-6, output_path=str(folder))
    torch.save({}, dvae)  # GPTTrainer loads the DVAE with strict=False
    model = c.GPTTrainer(config)
    randomize(model, seed)
    opt = model.get_optimizer()
    gen = torch.Generator().manual_seed(seed % 2**31)
    for p in model.xtts.gpt.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()
    c.trainer_save_checkpoint(config, model, str(folder), current_step=1, epoch=0, optimizer=[opt])
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2), encoding="utf-8")
    return folder / "checkpoint_1.pth"

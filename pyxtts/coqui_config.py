"""Coqui's XTTS configuration and fine-tuning recipe in pyxtts's terms.

- ``model_config_from_xtts(cfg, vocab)`` (``ModelConfig.from_xtts_config``): the sizes
  and token ids of the GPT that Coqui's ``Xtts`` builds from an XTTS config.
- ``read_vocab(path)``: the text vocabulary size and the ``[START]``/``[STOP]`` ids of a
  tokenizer ``vocab.json``, read as Coqui's ``VoiceBpeTokenizer`` reads them.
- ``coqui_decay(names)``: the parameters Coqui's recipe decays.

Facts from coqui-tts 0.28.0: ``TTS/tts/configs/xtts_config.py`` (``XttsArgs``),
``TTS/tts/models/xtts.py`` (``Xtts.init_models``), ``TTS/tts/layers/xtts/gpt.py``
(``GPT.__init__``) and ``TTS/tts/layers/xtts/trainer/gpt_trainer.py``
(``GPTTrainer.get_optimizer``).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pyxtts.model import ModelConfig

__all__ = ["XTTS_ARGS_DEFAULTS", "coqui_decay", "model_config_from_xtts", "read_vocab", "xtts_model_args"]

# XttsArgs's defaults for the fields that size the GPT: Coqui fills a field a config
# leaves out with these. The text vocabulary and its start/stop ids have none: Coqui
# takes them from the tokenizer's vocab.json.
XTTS_ARGS_DEFAULTS: dict[str, Any] = {
    "gpt_layers": 30,
    "gpt_n_model_channels": 1024,
    "gpt_n_heads": 16,
    "gpt_number_text_tokens": None,
    "gpt_start_text_token": None,
    "gpt_stop_text_token": None,
    "gpt_num_audio_tokens": 8194,
    "gpt_start_audio_token": 8192,
    "gpt_stop_audio_token": 8193,
    "gpt_max_text_tokens": 402,
    "gpt_max_audio_tokens": 605,
    "gpt_max_prompt_tokens": 70,
    "gpt_code_stride_len": 1024,
    "gpt_use_perceiver_resampler": False,
}
# GPTArgs (the trainer's config) adds the loss weights; XTTS inference configs lack them.
LOSS_WEIGHT_DEFAULTS = {"gpt_loss_text_ce_weight": 0.01, "gpt_loss_mel_ce_weight": 1.0}

PERCEIVER_LATENTS = 32  # PerceiverResampler(num_latents=32) in GPT.__init__
TEXT_EXTRA_POSITIONS = 2  # GPT: max_text_tokens + 2 (start and stop)
AUDIO_EXTRA_POSITIONS = 3  # GPT: max_mel_tokens + 2 + max_conditioning_inputs (1)


# ---- config.json and vocab.json -----------------------------------------------------

def _read_json(path: Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {str(path)!r}: not valid JSON: {exc}") from exc
    except UnicodeDecodeError as exc:  # e.g. a .pth given for a .json
        raise ValueError(f"{what} {str(path)!r}: not a JSON text file (byte 0x{exc.object[exc.start]:02x} at "
                         f"offset {exc.start} is not UTF-8)") from exc


def read_vocab(path: str | os.PathLike) -> dict[str, int | None]:
    """``{"number_text_tokens", "start_text_token", "stop_text_token"}`` of a tokenizer
    ``vocab.json``: the largest id (added tokens included) plus one, and the ids of
    ``[START]`` and ``[STOP]`` (None when absent), as ``VoiceBpeTokenizer`` gives them."""
    path = Path(path)
    doc = _read_json(path, "vocab")
    model = doc.get("model") if isinstance(doc, Mapping) else None
    vocab = model.get("vocab") if isinstance(model, Mapping) else None
    added = doc.get("added_tokens", []) if isinstance(doc, Mapping) else None
    if not isinstance(vocab, Mapping) or not isinstance(added, list):
        raise ValueError(f"vocab {str(path)!r}: expected a tokenizers JSON with model.vocab and added_tokens")
    ids: dict[str, int] = {}
    for token, i in vocab.items():
        ids[str(token)] = int(i)
    for entry in added:  # added tokens win over the model's vocabulary, as in tokenizers
        if isinstance(entry, Mapping) and "content" in entry and "id" in entry:
            ids[str(entry["content"])] = int(entry["id"])
    if not ids:
        raise ValueError(f"vocab {str(path)!r}: holds no tokens")
    return {"number_text_tokens": max(ids.values()) + 1, "start_text_token": ids.get("[START]"),
            "stop_text_token": ids.get("[STOP]")}


def xtts_model_args(cfg: Any) -> tuple[dict[str, Any], str]:
    """(model_args, description) of a config.json path, a whole config dict or a
    model_args dict."""
    where = "cfg"
    if isinstance(cfg, (str, os.PathLike)):
        path = Path(cfg)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"cfg: no XTTS config file {str(path)!r}")
        cfg = _read_json(path, "config")
        where = str(path)
    if not isinstance(cfg, Mapping):
        raise TypeError(f"cfg: expected a config.json path or a dict, got {type(cfg).__name__}")
    if "model_args" in cfg:
        args = cfg["model_args"]
        where += ": model_args"
        if not isinstance(args, Mapping):
            raise TypeError(f"{where}: expected a dict, got {type(args).__name__}")
    elif any(k.startswith("gpt_") for k in cfg):
        args = cfg
    else:
        raise ValueError(f"{where}: neither an XTTS config (no 'model_args') nor its model_args "
                         f"(no 'gpt_*' keys); keys: {sorted(cfg)[:8]}")
    return dict(args), where


# ---- the mapping ---------------------------------------------------------------------

def _int(args: Mapping[str, Any], key: str, where: str) -> int:
    v = args.get(key, XTTS_ARGS_DEFAULTS.get(key))
    if v is None:
        raise ValueError(f"{where}.{key}: not set; Coqui takes it from the tokenizer's vocab.json, so pass "
                         "vocab= (or a config.json path with vocab.json beside it)")
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{where}.{key}: expected an int, got {v!r}")
    return v


def model_config_from_xtts(cfg: Any, vocab: str | os.PathLike | None = None) -> ModelConfig:
    """``ModelConfig.from_xtts_config``: see there."""
    args, where = xtts_model_args(cfg)
    if vocab is None and isinstance(cfg, (str, os.PathLike)):
        beside = (Path(cfg) if Path(cfg).is_dir() else Path(cfg).parent) / "vocab.json"
        vocab = beside if beside.is_file() else None
    if vocab is not None:  # Xtts.init_models: the tokenizer overrides the config
        tok = read_vocab(vocab)
        args["gpt_number_text_tokens"] = tok["number_text_tokens"]
        args["gpt_start_text_token"] = tok["start_text_token"]
        args["gpt_stop_text_token"] = tok["stop_text_token"]
        where += f" (text tokens from {str(vocab)!r})"
    perceiver = args.get("gpt_use_perceiver_resampler", XTTS_ARGS_DEFAULTS["gpt_use_perceiver_resampler"])
    if not isinstance(perceiver, bool):
        raise TypeError(f"{where}.gpt_use_perceiver_resampler: expected a bool, got {perceiver!r}")
    max_text = _int(args, "gpt_max_text_tokens", where)
    max_audio = _int(args, "gpt_max_audio_tokens", where)
    for key, v in (("gpt_max_text_tokens", max_text), ("gpt_max_audio_tokens", max_audio)):
        if v < 1:  # Coqui's -1 drops the positional embeddings, which pyxtts always has
            raise ValueError(f"{where}.{key}: must be >= 1 (pyxtts has learned positions), got {v}")
    weights = {}
    for key, default in LOSS_WEIGHT_DEFAULTS.items():
        w = args.get(key, default)
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise TypeError(f"{where}.{key}: expected a number, got {w!r}")
        weights[key] = float(w)
    return ModelConfig(
        n_layers=_int(args, "gpt_layers", where),
        d_model=_int(args, "gpt_n_model_channels", where),
        n_heads=_int(args, "gpt_n_heads", where),
        text_vocab_size=_int(args, "gpt_number_text_tokens", where),
        audio_vocab_size=_int(args, "gpt_num_audio_tokens", where),
        max_text_tokens=max_text + TEXT_EXTRA_POSITIONS,
        max_audio_tokens=max_audio + AUDIO_EXTRA_POSITIONS,
        n_cond_latents=PERCEIVER_LATENTS if perceiver else _int(args, "gpt_max_prompt_tokens", where),
        text_loss_weight=weights["gpt_loss_text_ce_weight"],
        audio_loss_weight=weights["gpt_loss_mel_ce_weight"],
        start_text_token=_int(args, "gpt_start_text_token", where),
        stop_text_token=_int(args, "gpt_stop_text_token", where),
        start_audio_token=_int(args, "gpt_start_audio_token", where),
        stop_audio_token=_int(args, "gpt_stop_audio_token", where),
        code_stride_len=_int(args, "gpt_code_stride_len", where),
        use_perceiver_resampler=perceiver,
        # the conditioning path pyxtts trains is XTTS v2's; XTTS v1's is not there
        conditioning=perceiver,
    )


# ---- the optimizer recipe ------------------------------------------------------------

# GPTTrainer.get_optimizer with optimizer_wd_only_on_weights (the recipe's setting) keeps
# out of weight decay every bias and every parameter of an nn.LayerNorm/GroupNorm (and
# batch/instance norms) or nn.Embedding module, and decays the rest. In the XTTS GPT the
# undecayed modules are these; HF GPT-2's Conv1D weights, the perceiver's latents and its
# RMSNorm gamma (a custom module, not an nn norm) are decayed.
_UNDECAYED_MODULE = re.compile(
    r"(gpt\.h\.\d+\.ln_[12]|gpt\.ln_f|final_norm|conditioning_encoder\.attn\.\d+\.norm"
    r"|text_embedding|mel_embedding|prompt_embedding|(text|mel|prompt)_pos_embedding\.emb)")


def coqui_decay(names: Iterable[str]) -> list[str]:
    """The names (GPT parameter names, as ``XTTSGPT.parameters()`` has them) that Coqui's
    XTTS recipe applies weight decay to, in the given order."""
    out = []
    for name in names:
        module, _, leaf = name.rpartition(".")
        if leaf == "bias" or _UNDECAYED_MODULE.fullmatch(module):
            continue
        out.append(name)
    return out

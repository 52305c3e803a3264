"""What ``prepare`` reads from an XTTS v2 checkpoint folder: ``config.json`` (the model's
limits), ``vocab.json`` (the tokenizer), ``dvae.pth`` (the audio-code encoder) and
``mel_stats.pth`` (the per-band mel normalisation). Nothing is downloaded."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyxtts.prepare.audio import SAMPLE_RATE
from pyxtts.prepare.dvae import DVAEEncoder
from pyxtts.prepare.text import XTTSTokenizer
from pyxtts.torchfile import read_tensors

__all__ = ["ModelLimits", "XTTSAssets", "ASSET_FILES"]

ASSET_FILES = ("config.json", "vocab.json", "dvae.pth", "mel_stats.pth")


@dataclass(frozen=True)
class ModelLimits:
    """The model_args of config.json that decide what a sample may be (XttsArgs defaults)."""
    max_text_tokens: int = 402  # gpt_max_text_tokens: text ids per sample, start/stop not counted
    max_audio_tokens: int = 605  # gpt_max_audio_tokens
    code_stride: int = 1024  # gpt_code_stride_len: audio samples per code
    num_audio_tokens: int = 1026  # gpt_num_audio_tokens: the DVAE's codes + start + stop
    perceiver: bool = False  # gpt_use_perceiver_resampler: which conditioning mel

    @property
    def max_audio_codes(self) -> int:
        """Codes per sample Coqui's GPT takes: its audio positions (max_audio_tokens + 3) hold
        the start token, the codes and four stop tokens."""
        return self.max_audio_tokens - 2

    @classmethod
    def from_config(cls, path: Path) -> "ModelLimits":
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a readable JSON config ({exc})") from exc
        args = cfg.get("model_args", cfg) if isinstance(cfg, dict) else None
        if not isinstance(args, dict):
            raise ValueError(f"{path}: expected an XTTS config with a model_args object")
        audio = cfg.get("audio", {}) if isinstance(cfg.get("audio", {}), dict) else {}
        for key in ("sample_rate", "dvae_sample_rate"):
            if audio.get(key, SAMPLE_RATE) != SAMPLE_RATE:
                raise ValueError(f"{path}: audio.{key} is {audio[key]}; pyxtts prepares audio for XTTS v2's "
                                 f"{SAMPLE_RATE} Hz only")
        d = cls()
        values = {"max_text_tokens": args.get("gpt_max_text_tokens", d.max_text_tokens),
                  "max_audio_tokens": args.get("gpt_max_audio_tokens", d.max_audio_tokens),
                  "code_stride": args.get("gpt_code_stride_len", d.code_stride),
                  "num_audio_tokens": args.get("gpt_num_audio_tokens", d.num_audio_tokens)}
        for name, v in values.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{path}: model_args for {name} must be a positive int, got {v!r}")
        perceiver = args.get("gpt_use_perceiver_resampler", d.perceiver)
        if not isinstance(perceiver, bool):
            raise ValueError(f"{path}: model_args.gpt_use_perceiver_resampler must be true or false, got {perceiver!r}")
        return cls(perceiver=perceiver, **values)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class XTTSAssets:
    folder: Path
    limits: ModelLimits
    tokenizer: XTTSTokenizer
    dvae: DVAEEncoder
    mel_stats: np.ndarray  # (80,) float64

    @staticmethod
    def check_folder(xtts_dir: str | os.PathLike) -> Path:
        folder = Path(xtts_dir)
        if not folder.is_dir():
            raise FileNotFoundError(f"xtts_dir: {str(folder)!r} is not a folder (the XTTS v2 checkpoint folder "
                                    f"holding {', '.join(ASSET_FILES)})")
        missing = [f for f in ASSET_FILES if not (folder / f).is_file()]
        if missing:
            raise FileNotFoundError(f"xtts_dir: {str(folder)!r} lacks {', '.join(missing)} (an XTTS v2 checkpoint "
                                    f"folder holds {', '.join(ASSET_FILES)}; pyxtts never downloads them)")
        return folder

    @classmethod
    def load(cls, xtts_dir: str | os.PathLike) -> "XTTSAssets":
        folder = cls.check_folder(xtts_dir)
        limits = ModelLimits.from_config(folder / "config.json")
        tokenizer = XTTSTokenizer(folder / "vocab.json")
        dvae = DVAEEncoder.load(folder / "dvae.pth")
        if dvae.num_tokens != limits.num_audio_tokens - 2:
            raise ValueError(f"{folder / 'dvae.pth'}: a codebook of {dvae.num_tokens} codes, but config.json's "
                             f"gpt_num_audio_tokens = {limits.num_audio_tokens} means {limits.num_audio_tokens - 2}")
        stats = read_tensors(folder / "mel_stats.pth")
        if not isinstance(stats, np.ndarray) or stats.shape != (dvae.mel_channels,) \
                or not np.all(np.isfinite(stats)) or np.any(stats == 0):
            raise ValueError(f"{folder / 'mel_stats.pth'}: expected a tensor of {dvae.mel_channels} finite, non-zero "
                             f"values, got {getattr(stats, 'shape', type(stats).__name__)}")
        return cls(folder, limits, tokenizer, dvae, stats.astype(np.float64))

    @staticmethod
    def fingerprint(xtts_dir: str | os.PathLike) -> dict[str, str]:
        """sha256 of each file that decides the output."""
        folder = Path(xtts_dir)
        return {name: _sha256(folder / name) for name in ASSET_FILES}

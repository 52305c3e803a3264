"""Conditioning: the reference slice Coqui's trainer draws for every sample at every step,
and its mel spectrogram with the style encoder's settings.

Coqui (``TTS/tts/layers/xtts/trainer/dataset.py`` ``get_prompt_slice``): a length uniform in
[66,150, 132,300] samples (3-6 s), or half the recording when that is longer than the
recording; a uniformly random start; the slice zero-padded to the maximum length; evaluation
takes the middle length from the start. The slice comes from the sample's own clip (the XTTS
v2 recipe, ``gpt_use_masking_gt_prompt_approach``) or from a separate reference recording.
Its mel (``gpt_trainer.py``, ``torch_mel_spectrogram_style_encoder``) is the normalised
log-mel of ``pyxtts.prepare.audio.STYLE_MEL`` (n_fft 2048, hop 256, window 1024) with the
perceiver resampler, ``STYLE_MEL_NO_PERCEIVER`` (4096, 1024, 4096) without.
"""
from __future__ import annotations

import numpy as np

from pyxtts._args import integer
from pyxtts.prepare.audio import STYLE_MEL, STYLE_MEL_NO_PERCEIVER, mel_spectrogram

__all__ = ["MIN_REFERENCE_SAMPLES", "MAX_REFERENCE_SAMPLES", "reference_slice", "conditioning_mel"]

MIN_REFERENCE_SAMPLES = 66150  # 3 s at 22,050 Hz (GPTArgs.min_conditioning_length)
MAX_REFERENCE_SAMPLES = 132300  # 6 s (GPTArgs.max_conditioning_length)


def reference_slice(ref_audio: np.ndarray, rng: np.random.Generator, min_samples: int = MIN_REFERENCE_SAMPLES,
                    max_samples: int = MAX_REFERENCE_SAMPLES,
                    evaluation: bool = False) -> tuple[np.ndarray, int, int]:
    """``(slice, start, end)``: ``ref_audio[start:end]`` zero-padded to ``max_samples``
    (float32), drawn as Coqui draws it (module docstring) with ``rng``."""
    ref = np.asarray(ref_audio)
    if ref.ndim != 1 or ref.dtype.kind != "f" or ref.size == 0:
        raise ValueError(f"ref_audio: expected a non-empty 1-d float array, got dtype {ref.dtype} shape {ref.shape}")
    min_samples = integer("min_samples", min_samples, minimum=1)
    max_samples = integer("max_samples", max_samples, minimum=min_samples)
    n = ref.shape[0]
    length = (min_samples + max_samples) // 2 if evaluation else int(rng.integers(min_samples, max_samples + 1))
    if length > n:
        length = n // 2
    start = 0 if evaluation else int(rng.integers(0, n - length + 1))
    out = np.zeros(max_samples, dtype=np.float32)
    out[:length] = ref[start:start + length]
    return out, start, start + length


def conditioning_mel(wav: np.ndarray, mel_stats: np.ndarray, perceiver: bool = True) -> np.ndarray:
    """(80, 1 + len(wav) // hop) float32: the conditioning encoder's input (``cond_mels``) for
    a (padded) reference slice; ``perceiver`` as the model's ``gpt_use_perceiver_resampler``."""
    settings = STYLE_MEL if perceiver else STYLE_MEL_NO_PERCEIVER
    return mel_spectrogram(wav, mel_stats, settings).astype(np.float32)

"""Each step's reference slices: the conditioning input drawn from the samples' recordings.

Coqui's XTTS trainer (coqui-tts 0.28.0, ``TTS/tts/layers/xtts/trainer/dataset.py``,
``get_prompt_slice``) draws, for every sample at every step, a 3-6 s slice of the sample's
reference recording (its own clip in the XTTS v2 recipe), zero-pads it to 6 s and feeds its
mel to the conditioning encoder. ``References`` does the same for a batch of pyxtts samples
(``Sample.ref_audio``), with ``pyxtts.prepare.conditioning``'s slice and mel:

- the draw is a pure function of ``(seed, epoch, sample index)``: the same run gives the
  same slices, a resumed run the slices the straight one would have drawn, and a sample's
  slice does not depend on the batch it lands in or on the number of collating threads;
- evaluation takes the middle length from the start, as Coqui does;
- target masking (Coqui's ``gpt_use_masking_gt_prompt_approach``): when the slice is cut
  from the sample's own clip, the codes it covers are not predicted. Coqui masks the
  targets of the batch's last sample only (its ``GPT.forward`` applies the mask after a
  loop, with that loop's last index) and converts the slice's sample range to code
  positions by the mel hop (``// perceiver_cond_length_compression``, 256) where a code
  spans ``code_stride_len`` (1024) samples, so it masks positions about 4 times too far
  along. pyxtts masks every sample, each code that overlaps the slice (code k covers
  samples ``[k * stride, (k + 1) * stride)``); evaluation masks nothing, as in Coqui.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pyxtts._args import integer
from pyxtts.prepare.audio import STYLE_MEL
from pyxtts.prepare.conditioning import MAX_REFERENCE_SAMPLES, MIN_REFERENCE_SAMPLES, conditioning_mel, \
    reference_slice

__all__ = ["References", "masked_codes", "slice_samples_for"]


def masked_codes(start: int, end: int, code_stride_len: int, n_codes: int) -> tuple[int, int]:
    """The codes ``[first, last)`` of a clip of ``n_codes`` codes that overlap its samples
    ``[start, end)``: code k covers samples ``[k * code_stride_len, (k + 1) * code_stride_len)``."""
    if not 0 <= start <= end or code_stride_len < 1 or n_codes < 0:
        raise ValueError(f"masked_codes: expected 0 <= start <= end, code_stride_len >= 1, n_codes >= 0, got "
                         f"{start}, {end}, {code_stride_len}, {n_codes}")
    if start == end:
        return 0, 0
    first = min(start // code_stride_len, n_codes)
    last = min(-(-end // code_stride_len), n_codes)
    return first, last


def slice_samples_for(max_cond_frames: int) -> int:
    """The padded slice length (waveform samples) whose mel has at most ``max_cond_frames``
    frames: Coqui's 132,300 (6 s, 517 frames at hop 256) unless the model allows fewer."""
    hop = STYLE_MEL.hop_length
    longest = min(MAX_REFERENCE_SAMPLES, max_cond_frames * hop - 1)
    if longest <= STYLE_MEL.n_fft // 2:  # the centred STFT needs more than n_fft / 2 samples
        raise ValueError(f"max_cond_frames: a model that trains from reference slices needs >= "
                         f"{STYLE_MEL.n_fft // 2 // hop + 1} frames, got {max_cond_frames}")
    return longest


@dataclass(frozen=True)
class References:
    """How a batch's reference slices are drawn (module docstring).

    ``mel_stats``: the (80,) normalisation of ``mel_stats.pth`` (``pyxtts prepare`` stores it
    beside its shards); ``seed``: the run's; ``max_samples``/``min_samples``: the padded
    slice length and the shortest slice (Coqui: 132,300 and 66,150 samples at 22,050 Hz);
    ``code_stride_len``: waveform samples per code; ``mask_targets``: mask the codes a slice
    of the sample's own clip covers."""

    mel_stats: np.ndarray
    seed: int = 0
    max_samples: int = MAX_REFERENCE_SAMPLES
    min_samples: int = MIN_REFERENCE_SAMPLES
    code_stride_len: int = 1024
    mask_targets: bool = True

    def __post_init__(self) -> None:
        stats = np.asarray(self.mel_stats, dtype=np.float64)
        if stats.shape != (STYLE_MEL.n_mels,) or not np.isfinite(stats).all() or (stats == 0).any():
            raise ValueError(f"mel_stats: expected {STYLE_MEL.n_mels} finite non-zero values (mel_stats.pth), got "
                             f"shape {stats.shape}")
        for name in ("seed", "max_samples", "min_samples", "code_stride_len"):
            object.__setattr__(self, name, integer(name, getattr(self, name), minimum=0 if name == "seed" else 1))
        if self.min_samples > self.max_samples:
            raise ValueError(f"min_samples: expected <= max_samples={self.max_samples}, got {self.min_samples}")

    @classmethod
    def for_model(cls, model_config, mel_stats: np.ndarray, seed: int = 0, mask_targets: bool = True) -> "References":
        """Slices as long as ``model_config.max_cond_frames`` allows (Coqui's 6 s for XTTS v2),
        the shortest half as long as Coqui's ratio (3 s of 6 s), its code stride."""
        longest = slice_samples_for(model_config.max_cond_frames)
        shortest = max(1, longest * MIN_REFERENCE_SAMPLES // MAX_REFERENCE_SAMPLES)
        return cls(mel_stats, seed, longest, shortest, model_config.code_stride_len, mask_targets)

    def frames(self) -> int:
        """Mel frames of every slice (``cond_mels``' last axis)."""
        return 1 + self.max_samples // STYLE_MEL.hop_length

    def draw(self, ref_audio: np.ndarray, index: int, epoch: int, evaluation: bool = False) -> tuple[np.ndarray, int, int]:
        """``(padded slice, start, end)`` of sample ``index``'s recording at ``epoch``."""
        rng = np.random.default_rng([int(self.seed), int(epoch), int(index)])
        return reference_slice(ref_audio, rng, self.min_samples, self.max_samples, evaluation)

    def batch(self, samples: Sequence, indices: Sequence[int], epoch: int,
              evaluation: bool = False) -> tuple[np.ndarray, list[tuple[int, int] | None]]:
        """``(cond_mels (B, 80, frames()) float32, ignore_code_ranges)`` for ``samples``,
        which are the dataset's ``indices``; a sample without ``ref_audio`` is a ValueError."""
        if len(samples) != len(indices):
            raise ValueError(f"indices: expected {len(samples)} (one per sample), got {len(indices)}")
        mels = np.empty((len(samples), STYLE_MEL.n_mels, self.frames()), np.float32)
        ranges: list[tuple[int, int] | None] = []
        for b, (s, i) in enumerate(zip(samples, indices)):
            if s.ref_audio is None:
                raise ValueError(f"{s.source or f'sample {int(i)}'}: no reference recording (ref_audio) to draw "
                                 "the conditioning slice from; prepare the data with pyxtts prepare")
            wav, start, end = self.draw(s.ref_audio, int(i), epoch, evaluation)
            mels[b] = conditioning_mel(wav, self.mel_stats)
            mask = self.mask_targets and s.ref_is_clip and not evaluation
            ranges.append(masked_codes(start, end, self.code_stride_len, len(s.audio)) if mask else None)
        return mels, ranges

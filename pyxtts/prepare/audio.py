"""Audio for XTTS v2: reading any file libsndfile reads as mono 22,050 Hz, and the two
mel spectrograms Coqui's GPT trainer computes (``TTS/tts/layers/tortoise/arch_utils.py``
``TorchMelSpectrogram`` on torchaudio's ``MelSpectrogram``), in float64 NumPy.

A mel spectrogram here is: a periodic Hann window of ``win_length`` centred in ``n_fft``;
the signal reflect-padded by ``n_fft // 2`` on both sides; one frame every ``hop_length``
samples; the power spectrum |STFT|^2; an 80-band HTK-scale triangular filterbank with
Slaney area normalisation from 0 to 8 kHz; ``log(max(mel, 1e-5))``; each band divided
by its entry of ``mel_stats.pth``. Coqui computes the same in float32; float64 here
keeps the result at the exact value, which the float32 one approaches to ~1e-6.

The filterbank is applied band by band, over each triangle's own bins (1,459 of the dense
matrix's 82,000 entries at n_fft 2048), as NumPy sums, not as a BLAS product. The trainer
computes a reference slice's mel for every sample of every step in its collating threads.
There, a BLAS product starts NumPy's own BLAS threads from each of them. On a 16-core GPU
host that made 8 collating threads slower than one (tests/bench/results/run_gpu_h200_run3.json).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pyxtts.prepare._deps import require

__all__ = ["SAMPLE_RATE", "SILENCE_PEAK", "AudioError", "MelSettings", "DVAE_MEL", "STYLE_MEL",
           "STYLE_MEL_NO_PERCEIVER", "load_audio", "mel_spectrogram", "mel_frames"]

SAMPLE_RATE = 22050  # XTTS v2's GPT and DVAE rate
SILENCE_PEAK = 1e-3  # a clip whose peak stays below -60 dBFS is reported as silent


class AudioError(ValueError):
    """A file that cannot be read as audio."""


@dataclass(frozen=True)
class MelSettings:
    n_fft: int
    hop_length: int
    win_length: int
    n_mels: int = 80
    f_min: float = 0.0
    f_max: float = 8000.0


# the DVAE's input (TorchMelSpectrogram's defaults, as gpt_trainer builds it for the DVAE)
DVAE_MEL = MelSettings(n_fft=1024, hop_length=256, win_length=1024)
# the conditioning encoder's input with the perceiver resampler (XTTS v2)
STYLE_MEL = MelSettings(n_fft=2048, hop_length=256, win_length=1024)
# ... and without it (gpt_use_perceiver_resampler = false)
STYLE_MEL_NO_PERCEIVER = MelSettings(n_fft=4096, hop_length=1024, win_length=4096)


def load_audio(path: str | os.PathLike, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """The file as float32 mono at ``sample_rate``: channels averaged, resampled with soxr
    (its default high quality) when the file's rate differs, clipped to [-1, 1] as Coqui's
    ``load_audio`` does. Raises ``AudioError`` when libsndfile cannot read it or it is empty."""
    sf = require("soundfile", "reading audio")
    try:
        data, rate = sf.read(os.fspath(path), dtype="float32", always_2d=True)
    except (RuntimeError, OSError, TypeError, ValueError) as exc:  # sf.LibsndfileError is a RuntimeError
        raise AudioError(f"{path}: cannot read audio: {exc}") from exc
    if data.shape[0] == 0:
        raise AudioError(f"{path}: the file holds no samples")
    wav = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)
    if rate != sample_rate:
        soxr = require("soxr", "resampling audio")
        wav = soxr.resample(wav, rate, sample_rate).astype(np.float32, copy=False)
    wav = np.clip(wav, -1.0, 1.0)
    return np.ascontiguousarray(wav, dtype=np.float32)


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + f / 700.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


@lru_cache(maxsize=8)
def _filterbank(s: MelSettings, sample_rate: int) -> np.ndarray:
    """(n_fft // 2 + 1, n_mels): triangles between mel-spaced corner frequencies, each
    scaled by 2 / (its width in Hz) so that every band sums the same energy (Slaney)."""
    bins = np.linspace(0.0, float(sample_rate // 2), s.n_fft // 2 + 1)
    corners = _mel_to_hz(np.linspace(_hz_to_mel(np.float64(s.f_min)), _hz_to_mel(np.float64(s.f_max)),
                                     s.n_mels + 2))
    width = np.diff(corners)  # (n_mels + 1,)
    dist = corners[None, :] - bins[:, None]  # (n_freqs, n_mels + 2)
    rising = -dist[:, :-2] / width[:-1]
    falling = dist[:, 2:] / width[1:]
    fb = np.maximum(0.0, np.minimum(rising, falling))
    fb *= 2.0 / (corners[2:] - corners[:-2])
    fb.flags.writeable = False
    return fb


@lru_cache(maxsize=8)
def _bands(s: MelSettings, sample_rate: int) -> tuple[int, tuple[tuple[int, int, np.ndarray], ...]]:
    """The filterbank by band: ``(bins, ((lo, hi, weights), ...))``, band m being
    ``weights`` (hi - lo, 1) on the bins [lo, hi); ``bins`` is one past the last bin
    any band uses. A triangle's nonzero bins are contiguous; a band with none has
    lo == hi."""
    fb = _filterbank(s, sample_rate)
    rows = []
    for m in range(fb.shape[1]):
        k = np.flatnonzero(fb[:, m])
        lo, hi = (int(k[0]), int(k[-1]) + 1) if k.size else (0, 0)
        if hi - lo != k.size:  # cannot happen for triangles; a wrong sum if it did
            raise AssertionError(f"mel band {m}: nonzero bins not contiguous")
        w = np.ascontiguousarray(fb[lo:hi, m, None])
        w.flags.writeable = False
        rows.append((lo, hi, w))
    return max([hi for _, hi, _ in rows] + [1]), tuple(rows)


@lru_cache(maxsize=8)
def _window(s: MelSettings) -> np.ndarray:
    """The periodic Hann window of win_length, zero-padded on both sides to n_fft."""
    n = np.arange(s.win_length, dtype=np.float64)
    hann = 0.5 - 0.5 * np.cos(2.0 * np.pi * n / s.win_length)
    left = (s.n_fft - s.win_length) // 2
    w = np.zeros(s.n_fft)
    w[left:left + s.win_length] = hann
    w.flags.writeable = False
    return w


def mel_frames(n_samples: int, settings: MelSettings) -> int:
    """Frames of the centred STFT of n_samples: 1 + n_samples // hop_length."""
    return 1 + n_samples // settings.hop_length


def mel_spectrogram(wav: np.ndarray, mel_stats: np.ndarray, settings: MelSettings,
                    sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """(n_mels, frames) float64 normalised log-mel of a 1-d waveform (see the module
    docstring); ``mel_stats`` is the (n_mels,) array of ``mel_stats.pth``."""
    wav = np.asarray(wav)
    if wav.ndim != 1 or wav.dtype.kind != "f":
        raise ValueError(f"wav: expected a 1-d float array, got dtype {wav.dtype} shape {wav.shape}")
    pad = settings.n_fft // 2
    if wav.shape[0] <= pad:
        raise ValueError(f"wav: {wav.shape[0]} samples is too short for a centred STFT of n_fft="
                         f"{settings.n_fft} (more than {pad} needed)")
    stats = np.asarray(mel_stats, dtype=np.float64)
    if stats.shape != (settings.n_mels,):
        raise ValueError(f"mel_stats: expected shape ({settings.n_mels},), got {stats.shape}")
    x = np.pad(wav.astype(np.float64), pad, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(x, settings.n_fft)[::settings.hop_length]  # (F, n_fft)
    spec = np.fft.rfft(frames * _window(settings), axis=1)  # (F, n_fft // 2 + 1)
    bins, bands = _bands(settings, sample_rate)
    spec_t = np.ascontiguousarray(spec[:, :bins].T)  # (bins, F): a band's rows are contiguous
    power = spec_t.real ** 2 + spec_t.imag ** 2
    mel = np.zeros((settings.n_mels, power.shape[1]))  # (n_mels, F)
    for m, (lo, hi, w) in enumerate(bands):
        if hi > lo:
            np.sum(w * power[lo:hi], axis=0, out=mel[m])
    return np.log(np.maximum(mel, 1e-5)) / stats[:, None]

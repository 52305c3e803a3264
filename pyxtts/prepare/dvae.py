"""The encoder half of XTTS v2's discrete VAE (``dvae.pth``), in float64 NumPy: a mel
spectrogram in, one audio code per 4 mel frames out, as Coqui's
``DiscreteVAE.get_codebook_indices`` computes them (``TTS/tts/layers/xtts/dvae.py``, built by
``gpt_trainer.py`` with 80 channels, two stride-2 kernel-3 convolutions, 3 residual
blocks, a 1x1 convolution to the codebook's width and nearest-codebook-entry quantisation).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np

from pyxtts.torchfile import read_tensors

__all__ = ["DVAEEncoder"]

_STRIDE = 2  # gpt_trainer's DiscreteVAE: stride 2, padding (kernel_size - 1) // 2


def _conv1d(x: np.ndarray, conv: "_Conv", stride: int = 1) -> np.ndarray:
    """x (C_in, T), zero padding (K - 1) // 2 -> (C_out, T_out): one product of the
    (C_out, K * C_in) weights with the K shifted copies of x stacked (im2col)."""
    k = conv.kernel
    pad = (k - 1) // 2
    xp = np.pad(x, ((0, 0), (pad, pad))) if pad else x
    t_out = (x.shape[1] + 2 * pad - k) // stride + 1
    cols = xp if k == 1 and stride == 1 else \
        np.concatenate([xp[:, j:j + stride * (t_out - 1) + 1:stride] for j in range(k)])  # (K * C_in, T_out)
    out = conv.matrix @ cols  # (C_out, T_out)
    out += conv.bias[:, None]
    return out


@dataclass
class _Conv:
    matrix: np.ndarray  # (C_out, K * C_in) float64, tap-major as _conv1d stacks its input
    bias: np.ndarray  # (C_out,) float64
    kernel: int

    @classmethod
    def of(cls, weight: np.ndarray, bias: np.ndarray) -> "_Conv":
        """From a Conv1d's (C_out, C_in, K) weight and (C_out,) bias."""
        c_out, _, k = weight.shape
        matrix = np.ascontiguousarray(weight.transpose(0, 2, 1).reshape(c_out, -1), dtype=np.float64)
        return cls(matrix, bias.astype(np.float64), int(k))

    @property
    def c_out(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def c_in(self) -> int:
        return int(self.matrix.shape[1]) // self.kernel


class DVAEEncoder:
    """``DVAEEncoder.load("dvae.pth")``; ``codes(mel)`` gives the codebook indices of a
    (80, frames) normalised mel (``pyxtts.prepare.audio.DVAE_MEL``). Only the encoder and
    ``codebook.embed`` are read; the decoder's tensors are ignored."""

    def __init__(self, downsample: list[_Conv], resblocks: list[tuple[_Conv, _Conv, _Conv]], project: _Conv,
                 codebook: np.ndarray) -> None:
        self.downsample = downsample
        self.resblocks = resblocks
        self.project = project
        self.codebook = codebook  # (codebook_dim, num_tokens) float64
        self.codebook_sq = (codebook ** 2).sum(axis=0)  # (num_tokens,)

    @property
    def num_tokens(self) -> int:
        return int(self.codebook.shape[1])

    @property
    def downsampling(self) -> int:
        """Mel frames per code."""
        return _STRIDE ** len(self.downsample)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DVAEEncoder":
        state = read_tensors(path)
        where = str(path)
        if not isinstance(state, dict):
            raise ValueError(f"{where}: expected a state dict of the DVAE, got {type(state).__name__}")

        def conv(prefix: str, c_in: int | None = None, k: int | None = None) -> _Conv:
            w, b = state.get(prefix + ".weight"), state.get(prefix + ".bias")
            if w is None or b is None:
                raise ValueError(f"{where}: {prefix}.weight or {prefix}.bias missing: not a DVAE of "
                                 "Coqui's DiscreteVAE layout")
            if w.ndim != 3 or b.shape != (w.shape[0],) or (c_in is not None and w.shape[1] != c_in) \
                    or (k is not None and w.shape[2] != k) or w.shape[2] % 2 == 0:
                raise ValueError(f"{where}: {prefix}.weight has shape {w.shape} (bias {b.shape}), which does "
                                 f"not chain (input channels {c_in}, kernel {k or 'odd'})")
            return _Conv.of(w, b)

        idx = sorted({int(m.group(1)) for k in state if (m := re.match(r"encoder\.(\d+)\.", k))})
        if idx != list(range(len(idx))) or not idx:
            raise ValueError(f"{where}: no encoder.<i> layers numbered from 0")
        downsample, resblocks = [], []
        channels: int | None = None
        for i in idx[:-1]:
            if f"encoder.{i}.0.weight" in state:  # Sequential(strided conv, ReLU)
                if resblocks:
                    raise ValueError(f"{where}: encoder.{i} is a strided convolution after a residual block")
                c = conv(f"encoder.{i}.0", channels)
                downsample.append(c)
            else:  # ResBlock: conv k, ReLU, conv k, ReLU, conv 1x1, + input
                c0 = conv(f"encoder.{i}.net.0", channels)
                c1 = conv(f"encoder.{i}.net.2", c0.c_out)
                c2 = conv(f"encoder.{i}.net.4", c1.c_out, 1)
                if c2.c_out != c0.c_in:
                    raise ValueError(f"{where}: residual block encoder.{i} does not return its input's width")
                resblocks.append((c0, c1, c2))
                c = c2
            channels = c.c_out
        project = conv(f"encoder.{idx[-1]}", channels, 1)
        embed = state.get("codebook.embed")
        if embed is None or embed.ndim != 2 or embed.shape[0] != project.c_out:
            raise ValueError(f"{where}: codebook.embed missing or not (codebook_dim={project.c_out}, "
                             f"num_tokens); got {None if embed is None else embed.shape}")
        if not downsample:
            raise ValueError(f"{where}: the encoder has no strided convolution")
        return cls(downsample, resblocks, project, embed.astype(np.float64))

    @property
    def mel_channels(self) -> int:
        return self.downsample[0].c_in

    def encode(self, mel: np.ndarray) -> np.ndarray:
        """(ceil(frames / 4), codebook_dim) float64: the encoder's output for a (80, frames) mel."""
        mel = np.asarray(mel, dtype=np.float64)
        if mel.ndim != 2 or mel.shape[0] != self.mel_channels or mel.shape[1] < 1:
            raise ValueError(f"mel: expected shape ({self.mel_channels}, frames >= 1), got {mel.shape}")
        h = mel  # (80, F)
        for c in self.downsample:  # (C, F) -> (C', ceil(F / 2)), ReLU
            h = np.maximum(_conv1d(h, c, _STRIDE), 0.0)
        for c0, c1, c2 in self.resblocks:  # (C, F/4) -> same
            r = np.maximum(_conv1d(h, c0), 0.0)
            r = np.maximum(_conv1d(r, c1), 0.0)
            h = _conv1d(r, c2) + h
        return _conv1d(h, self.project).T  # (F/4, codebook_dim)

    def codes(self, mel: np.ndarray) -> np.ndarray:
        """The (ceil(frames / 4),) int64 codebook indices of a (80, frames) mel: the entry
        nearest to each encoder output."""
        z = self.encode(mel)  # (N, codebook_dim)
        # squared distance to every entry, as Quantize.forward writes it
        dist = (z ** 2).sum(axis=1, keepdims=True) - 2.0 * (z @ self.codebook) + self.codebook_sq[None, :]
        return np.argmin(dist, axis=1).astype(np.int64)

    def n_codes(self, mel_frames: int) -> int:
        """Codes the encoder gives for mel_frames frames."""
        n = mel_frames
        for _ in self.downsample:
            n = math.ceil(n / _STRIDE)
        return n

"""Coqui's framing of XTTS training samples: start and stop tokens, targets, lengths.

A sample holds the tokenizer's text ids ``t1..tl`` and the DVAE's audio codes
``c1..cn``, with no start or stop tokens. For a model config that sets the start/stop
ids (``ModelConfig.frames_data``), ``collate`` builds what Coqui's ``GPT.forward``
builds from them (coqui-tts 0.28.0, ``TTS/tts/layers/xtts/gpt.py``)::

    text inputs    [START, t1, ..., tl]                     l + 1 positions
    text targets   [t1, ..., tl, STOP]
    audio inputs   [START, c1, ..., cn, STOP, STOP, STOP]   n + 4 positions
    audio targets  [c1, ..., cn, STOP, STOP, STOP, STOP]

Coqui's arrays hold one more text and one more audio position per sample (a STOP
input) that it masks as a key and whose target it ignores; pyxtts leaves them out,
which changes nothing: a masked key never influences a valid position.

The number of codes: Coqui runs the DVAE over the padded batch and keeps, per sample,
the first ``ceil(wav_len / code_stride_len)`` codes (its ``code_lengths - 3``). A
dataset stores exactly those codes (``code_count`` gives their number for a waveform
length), so the framing takes n = ``len(codes)``.

Targets to ignore: ``ignore_code_ranges`` gives, per sample, ``None`` or a range
``(start, end)`` of code indices (0-based, ``0 <= start <= end <= n``) whose codes are
not predicted: the targets ``c[start:end]`` become -1. This is where the reference
slice of Coqui's ``gpt_use_masking_gt_prompt_approach`` is masked, for every sample.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pyxtts._args import integer

__all__ = ["AUDIO_OVERHEAD", "TEXT_OVERHEAD", "code_count", "frame_batch", "framed_lengths"]

TEXT_OVERHEAD = 1  # START
AUDIO_OVERHEAD = 4  # START and 3 STOP inputs


def code_count(num_samples: int, code_stride_len: int) -> int:
    """Codes Coqui keeps for a waveform of ``num_samples`` samples:
    ``ceil(num_samples / code_stride_len)``."""
    n = integer("num_samples", num_samples)
    return -(-n // integer("code_stride_len", code_stride_len, minimum=1))


def framed_lengths(text_len: int, audio_len: int) -> tuple[int, int]:
    """Sequence positions of a sample of ``text_len`` ids and ``audio_len`` codes."""
    return text_len + TEXT_OVERHEAD, audio_len + AUDIO_OVERHEAD


def _ranges(ignore_code_ranges: Any, lengths: np.ndarray) -> list[tuple[int, int] | None]:
    B = len(lengths)
    if ignore_code_ranges is None:
        return [None] * B
    if isinstance(ignore_code_ranges, (str, bytes)) or not isinstance(ignore_code_ranges, Sequence) \
            or len(ignore_code_ranges) != B:
        raise TypeError(f"ignore_code_ranges: expected None or a sequence of {B} entries (one per sample, "
                        f"each None or (start, end)), got {ignore_code_ranges!r}")
    out: list[tuple[int, int] | None] = []
    for i, r in enumerate(ignore_code_ranges):
        if r is None:
            out.append(None)
            continue
        ok = (isinstance(r, (tuple, list)) and len(r) == 2
              and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in r))
        if not ok:
            raise TypeError(f"ignore_code_ranges[{i}]: expected None or (start, end) ints, got {r!r}")
        start, end = int(r[0]), int(r[1])
        if not 0 <= start <= end <= lengths[i]:
            raise ValueError(f"ignore_code_ranges[{i}]: ({start}, {end}) must satisfy "
                             f"0 <= start <= end <= {int(lengths[i])} (the sample's codes)")
        out.append((start, end))
    return out


def frame_batch(texts: Sequence[np.ndarray], audios: Sequence[np.ndarray], config: Any,
                ignore_code_ranges: Any = None) -> dict[str, np.ndarray]:
    """The batch arrays (``text_inputs``, ``text_targets``, ``audio_inputs``,
    ``audio_targets``, ``text_lengths``, ``audio_lengths``) of samples framed as above,
    padded to the longest framed text and audio (padding: id 0, target -1)."""
    if not config.frames_data:
        raise ValueError("config: sets no start/stop token ids (start_text_token, stop_text_token, "
                         "start_audio_token, stop_audio_token), so there is no framing to apply")
    B = len(texts)
    if B == 0 or len(audios) != B:
        raise ValueError(f"frame_batch: expected as many texts as audios, at least one, got {B} and {len(audios)}")
    n_text = np.array([len(t) for t in texts], dtype=np.int64)
    n_code = np.array([len(a) for a in audios], dtype=np.int64)
    masks = _ranges(ignore_code_ranges, n_code)
    tl, al = n_text + TEXT_OVERHEAD, n_code + AUDIO_OVERHEAD
    Lt, La = int(tl.max()), int(al.max())
    out = {"text_inputs": np.zeros((B, Lt), np.int64), "text_targets": np.full((B, Lt), -1, np.int64),
           "audio_inputs": np.zeros((B, La), np.int64), "audio_targets": np.full((B, La), -1, np.int64),
           "text_lengths": tl, "audio_lengths": al}
    c = config
    stops = np.full(AUDIO_OVERHEAD - 1, c.stop_audio_token, np.int64)
    for i, (t, a) in enumerate(zip(texts, audios)):
        l, n = len(t), len(a)
        out["text_inputs"][i, 0] = c.start_text_token
        out["text_inputs"][i, 1:l + 1] = t
        out["text_targets"][i, :l] = t
        out["text_targets"][i, l] = c.stop_text_token
        out["audio_inputs"][i, 0] = c.start_audio_token
        out["audio_inputs"][i, 1:n + 1] = a
        out["audio_inputs"][i, n + 1:n + AUDIO_OVERHEAD] = stops
        out["audio_targets"][i, :n] = a
        out["audio_targets"][i, n:n + AUDIO_OVERHEAD] = c.stop_audio_token
        if masks[i] is not None:
            out["audio_targets"][i, masks[i][0]:masks[i][1]] = -1
    return out

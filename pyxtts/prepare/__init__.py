"""From recordings and transcripts to training shards for XTTS v2 (``pyxtts prepare``).

Needs the ``prepare`` extra (``pip install 'pyxtts[prepare]'``: soundfile, soxr, tokenizers,
num2words); no torch. Everything is computed from the XTTS v2 checkpoint folder the user
gives; nothing is downloaded.

- ``prepare(xtts_dir, metadata, out, ...)``: the whole pipeline (``pipeline``).
- ``XTTSTokenizer``: Coqui's XTTS text ids (``text``, ``cleaners``).
- ``load_audio``, ``mel_spectrogram``, ``DVAE_MEL``, ``STYLE_MEL``: audio (``audio``).
- ``DVAEEncoder``: the audio codes of ``dvae.pth`` (``dvae``).
- ``reference_slice``, ``conditioning_mel``: the per-step conditioning (``conditioning``).
"""
from __future__ import annotations

from pyxtts.prepare.assets import ModelLimits, XTTSAssets
from pyxtts.prepare.audio import DVAE_MEL, SAMPLE_RATE, STYLE_MEL, AudioError, load_audio, mel_spectrogram
from pyxtts.prepare.cleaners import LANGUAGES, clean_text
from pyxtts.prepare.conditioning import conditioning_mel, reference_slice
from pyxtts.prepare.dvae import DVAEEncoder
from pyxtts.prepare.pipeline import REASONS, PrepareResult, prepare
from pyxtts.prepare.sources import Item, MetadataError, read_metadata
from pyxtts.prepare.text import XTTSTokenizer

__all__ = ["DVAE_MEL", "LANGUAGES", "REASONS", "SAMPLE_RATE", "STYLE_MEL", "AudioError", "DVAEEncoder", "Item",
           "MetadataError", "ModelLimits", "PrepareResult", "XTTSAssets", "XTTSTokenizer",
           "clean_text", "conditioning_mel", "load_audio", "mel_spectrogram", "prepare", "read_metadata",
           "reference_slice"]

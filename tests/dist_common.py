"""What the distributed tests and their processes (``dist_child.py``) share: a small
model with dropout (its masks must be keyed by each row's place in the global batch) and
a global batch per step, drawn from the step number alone."""
from __future__ import annotations

import numpy as np

import pyxtts

SEED = 20261128
STEPS = 10
ACCUMULATION = 2  # micro-batches per process and step
GLOBAL_ROWS = 12  # 2 processes x 2 micro-batches x 3, or 3 x 2 x 2

CFG = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=41, audio_vocab_size=23,
                         max_text_tokens=16, max_audio_tokens=24, n_cond_latents=2, conditioning=False,
                         dropout=0.1)


def global_batch(step: int) -> dict[str, np.ndarray]:
    """The step's whole batch: varied lengths, some ignored targets, fixed latents."""
    rng = np.random.default_rng([SEED, step])
    b, lt, la = GLOBAL_ROWS, 12, 18
    tl = rng.integers(lt // 2, lt + 1, b)
    al = rng.integers(la // 2, la + 1, b)
    tl[0], al[0] = lt, la
    batch = {"text_inputs": rng.integers(0, CFG.text_vocab_size, (b, lt)),
             "text_targets": rng.integers(0, CFG.text_vocab_size, (b, lt)),
             "audio_inputs": rng.integers(0, CFG.audio_vocab_size, (b, la)),
             "audio_targets": rng.integers(0, CFG.audio_vocab_size, (b, la)),
             "text_lengths": tl, "audio_lengths": al,
             "cond_latents": rng.standard_normal((b, CFG.n_cond_latents, CFG.d_model)).astype(np.float32)}
    batch["audio_targets"][rng.random((b, la)) < 0.1] = -1
    return batch


def rows(batch: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, np.ndarray]:
    """Rows [lo, hi) of a batch, cut to their own longest text and audio (as a process
    that collates only its rows pads them)."""
    out = {k: v[lo:hi] for k, v in batch.items()}
    lt, la = int(out["text_lengths"].max()), int(out["audio_lengths"].max())
    for k in ("text_inputs", "text_targets"):
        out[k] = out[k][:, :lt]
    for k in ("audio_inputs", "audio_targets"):
        out[k] = out[k][:, :la]
    return out

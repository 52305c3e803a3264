"""Random XTTS batches for tests and benchmarks (NumPy only: no torch import)."""
from __future__ import annotations

import numpy as np


def random_batch(rng, cfg, B, Lt, La, n_cond=None, full=False):
    """A batch with varied lengths (padding in the middle), some ignored targets."""
    tl = np.full(B, Lt) if full else rng.integers(max(1, Lt // 2), Lt + 1, B)
    al = np.full(B, La) if full else rng.integers(max(1, La // 2), La + 1, B)
    tl[0], al[0] = Lt, La  # the longest sample sets the padded width
    batch = {
        "text_inputs": rng.integers(0, cfg.text_vocab_size, (B, Lt)),
        "text_targets": rng.integers(0, cfg.text_vocab_size, (B, Lt)),
        "audio_inputs": rng.integers(0, cfg.audio_vocab_size, (B, La)),
        "audio_targets": rng.integers(0, cfg.audio_vocab_size, (B, La)),
        "text_lengths": tl, "audio_lengths": al,
    }
    batch["audio_targets"][rng.random((B, La)) < 0.1] = -1
    nc = cfg.n_cond_latents if n_cond is None else n_cond
    if nc:
        batch["cond_latents"] = rng.standard_normal((B, nc, cfg.d_model)).astype(np.float32)
    return batch

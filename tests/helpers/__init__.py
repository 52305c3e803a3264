"""What the tests share: the run's seed, seeded generators, model configs and batches.

NumPy and pyxtts only, never torch: the CPU benchmark imports this into the process whose
memory it measures. The PyTorch references are in ``helpers.torch_ref``.

- ``SEED``: one random seed per run (``PYXTTS_TEST_SEED=N`` repeats a run). It is put in
  the environment, so child processes started by the tests draw from the same run.
- ``make_rng(*salt)``: a NumPy generator of ``SEED`` and a salt naming its use (ints or
  strings), so that two uses never share a stream and every run can be repeated.
- ``TINY``, ``SMALL``, ``MEDIUM``: the model configs of the step, optimizer, precision and
  checkpoint tests; ``random_batch``: a batch with padding and ignored targets;
  ``trained``: a model and optimizer with non-zero moments and gradients.
- ``helpers.arrays``: ``rand`` (normal values of a dtype) and ``f64``; ``helpers.state``:
  the snapshot a failure must leave alone and its bit-exact comparison.
"""
from __future__ import annotations

import os
import secrets
import zlib

import numpy as np

import pyxtts

SEED = int(os.environ.get("PYXTTS_TEST_SEED", "") or secrets.randbits(32))
os.environ["PYXTTS_TEST_SEED"] = str(SEED)


def make_rng(*salt: int | str) -> np.random.Generator:
    """default_rng([SEED, *salt]), string salts as their CRC-32."""
    words = [s if isinstance(s, int) else zlib.crc32(s.encode()) for s in salt]
    return np.random.default_rng([SEED, *words])


# ---- model configs --------------------------------------------------------------

# Dropout 0 in all three: the references are deterministic (test_dropout.py has dropout's
# own tests). The conditioning path's tensors are there (XTTS v2's default) but a batch of
# cond_latents leaves them alone; test_conditioning.py drives them from cond_mels.
# 2 layers of d=32: the cheapest model that still has every part (cond latents, both
# heads, several heads of attention)
TINY = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=37, audio_vocab_size=29,
                          max_text_tokens=24, max_audio_tokens=40, n_cond_latents=3, dropout=0.0)
# 3 layers of d=64: a middle block whose input and output are both other blocks
SMALL = pyxtts.ModelConfig(n_layers=3, d_model=64, n_heads=4, text_vocab_size=101, audio_vocab_size=67,
                           max_text_tokens=48, max_audio_tokens=96, n_cond_latents=4, dropout=0.0)
# 4 layers of d=128 at batch 4 x (8 + 40 + 100): parameters, activations and workspace
# each large enough (MiB) for the memory plan's 1% to be a real check
MEDIUM = pyxtts.ModelConfig(n_layers=4, d_model=128, n_heads=4, text_vocab_size=300, audio_vocab_size=200,
                            max_text_tokens=64, max_audio_tokens=128, n_cond_latents=8, dropout=0.0)


# ---- batches --------------------------------------------------------------------

def allowed_mask(B, Tq, Tk, causal, q_lengths, k_lengths, key_mask) -> np.ndarray:
    """(B, Tq, Tk) bool: query i of sample b may attend to key j (the attention tests' and
    the fuzz's float64 references)."""
    allowed = np.ones((B, Tq, Tk), bool)
    if causal:  # top-left aligned, like torch's is_causal
        allowed &= np.tril(np.ones((Tq, Tk), bool))[None]
    if q_lengths is not None:
        allowed &= (np.arange(Tq)[None, :] < np.asarray(q_lengths)[:, None])[:, :, None]
    if k_lengths is not None:
        allowed &= (np.arange(Tk)[None, :] < np.asarray(k_lengths)[:, None])[:, None, :]
    if key_mask is not None:
        allowed &= np.asarray(key_mask, bool)[:, None, :]
    return allowed


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


# ---- trained state ----------------------------------------------------------------

def trained(cfg, precision="fp32", seed=0, steps=1, shape=(3, 10, 16), salt="trained"):
    """(model, optimizer, batch): `steps` AdamW steps on one random batch of `shape`
    (B, Lt, La), then that batch's gradients left in place, so the moments, the master copy
    and the gradients all hold values a failure could disturb. Seeded by the run's seed,
    `salt` and `seed`."""
    m = pyxtts.XTTSGPT(cfg, precision=precision, seed=seed)
    opt = pyxtts.AdamW(m, loss_scale=2.0**10 if precision == "fp16" else None)
    batch = random_batch(make_rng(salt, seed), cfg, *shape)
    for _ in range(steps):
        opt.zero_grad()
        m.forward_backward(batch, loss_scale=opt.loss_scale)
        opt.step()
    m.forward_backward(batch, loss_scale=opt.loss_scale)  # gradients left in place
    return m, opt, batch


# ---- checkpoints ------------------------------------------------------------------

def edit_checkpoint(src, dst, edit_meta=None, edit_tensors=None, seal=True) -> None:
    """Copies a pyxtts checkpoint with its metadata (the "pyxtts" JSON) and/or tensors
    edited in place by the callbacks. seal: with checksums that match again (a file whose
    content is wrong but whose bytes are as written, so what is tested is the check after
    the checksums); else the old checksums stay (a corrupt file)."""
    import json

    from safetensors import safe_open
    from safetensors.numpy import save_file

    import pyxtts.checkpoint

    with safe_open(str(src), framework="numpy") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    m = json.loads(meta["pyxtts"])
    if edit_meta:
        edit_meta(m)
    if edit_tensors:
        edit_tensors(tensors)
    if seal:
        m.pop("checksums", None)
        pyxtts.checkpoint.write_file(dst, m, tensors)
    else:
        meta["pyxtts"] = json.dumps(m)
        save_file(tensors, str(dst), metadata=meta)


class Interrupting(pyxtts.TTSDataset):
    """A dataset that raises KeyboardInterrupt when its sample reads reach ``after`` (as
    Ctrl-C would, in the middle of a run)."""

    def __init__(self, base: pyxtts.TTSDataset, after: int) -> None:
        super().__init__(base.samples)
        self.reads, self.after = 0, after

    def __getitem__(self, i):
        self.reads += 1
        if self.reads == self.after:
            raise KeyboardInterrupt
        return super().__getitem__(i)

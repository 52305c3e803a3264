"""Coqui's framing in collate and the Trainer (pyxtts.framing), without Coqui itself:
a hand-written example, the layout of random batches, the checks, and the Trainer's
use of it. test_coqui_gpt.py compares the framed batch's loss with Coqui's GPT."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import pyxtts
from pyxtts.data import DataError, Sample, TTSDataset, batch_groups, collate
from pyxtts.framing import code_count, frame_batch, framed_lengths

FRAMED = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=300, audio_vocab_size=1026,
                            max_text_tokens=24, max_audio_tokens=40, n_cond_latents=0, conditioning=False,
                            start_text_token=261, stop_text_token=0, start_audio_token=1024,
                            stop_audio_token=1025)
PLAIN = dataclasses.replace(FRAMED, start_text_token=None, stop_text_token=None, start_audio_token=None,
                            stop_audio_token=None)


def test_hand_written_example():
    samples = [Sample(np.array([5, 6, 7]), np.array([10, 11])), Sample(np.array([8]), np.array([12, 13, 14]))]
    b = collate(samples, config=FRAMED)
    S, E, A, Z = 261, 0, 1024, 1025
    assert b["text_lengths"].tolist() == [4, 2] and b["audio_lengths"].tolist() == [6, 7]
    assert b["text_inputs"].tolist() == [[S, 5, 6, 7], [S, 8, 0, 0]]
    assert b["text_targets"].tolist() == [[5, 6, 7, E], [8, E, -1, -1]]
    assert b["audio_inputs"].tolist() == [[A, 10, 11, Z, Z, Z, 0], [A, 12, 13, 14, Z, Z, Z]]
    assert b["audio_targets"].tolist() == [[10, 11, Z, Z, Z, Z, -1], [12, 13, 14, Z, Z, Z, Z]]
    masked = collate(samples, config=FRAMED, ignore_code_ranges=[(1, 2), None])
    assert masked["audio_targets"].tolist() == [[10, -1, Z, Z, Z, Z, -1], [12, 13, 14, Z, Z, Z, Z]]
    for k in ("text_inputs", "text_targets", "audio_inputs", "text_lengths", "audio_lengths"):
        assert np.array_equal(masked[k], b[k]), k


def test_random_batches_every_position(rng, seed):
    c = FRAMED
    for _ in range(20):
        B = int(rng.integers(1, 7))
        texts = [rng.integers(0, c.text_vocab_size, int(rng.integers(1, 20))) for _ in range(B)]
        codes = [rng.integers(0, 1024, int(rng.integers(1, 33))) for _ in range(B)]
        ranges = [None if rng.random() < 0.5 else tuple(sorted(rng.integers(0, len(a) + 1, 2).tolist()))
                  for a in codes]
        b = collate([Sample(t, a) for t, a in zip(texts, codes)], config=c, ignore_code_ranges=ranges)
        Lt = max(len(t) for t in texts) + 1
        La = max(len(a) for a in codes) + 4
        assert b["text_inputs"].shape == (B, Lt) and b["audio_inputs"].shape == (B, La), seed
        for i, (t, a, r) in enumerate(zip(texts, codes, ranges)):
            l, n = len(t), len(a)
            assert (b["text_lengths"][i], b["audio_lengths"][i]) == framed_lengths(l, n)
            want_ti = np.concatenate([[c.start_text_token], t, np.zeros(Lt - l - 1, int)])
            want_tt = np.concatenate([t, [c.stop_text_token], np.full(Lt - l - 1, -1)])
            want_ai = np.concatenate([[c.start_audio_token], a, [c.stop_audio_token] * 3, np.zeros(La - n - 4, int)])
            want_at = np.concatenate([a, [c.stop_audio_token] * 4, np.full(La - n - 4, -1)])
            if r is not None:
                want_at[r[0]:r[1]] = -1
            for key, want in (("text_inputs", want_ti), ("text_targets", want_tt), ("audio_inputs", want_ai),
                              ("audio_targets", want_at)):
                assert np.array_equal(b[key][i], want), (key, i, seed)


def test_plain_config_keeps_the_shift_and_stop_tokens_clash():
    s = [Sample(np.array([1, 2, 3]), np.array([4, 5]))]
    assert all(np.array_equal(collate(s, config=PLAIN)[k], collate(s)[k]) for k in collate(s))
    with pytest.raises(ValueError, match="pass no text_stop_token"):
        collate(s, 9, None, config=FRAMED)
    with pytest.raises(ValueError, match="ignore_code_ranges needs a config"):
        collate(s, ignore_code_ranges=[(0, 1)])
    with pytest.raises(ValueError, match="no start/stop token ids"):
        frame_batch([s[0].text], [s[0].audio], PLAIN)


@pytest.mark.parametrize("ranges, exc, match", [
    ([(0, 3)], ValueError, r"0 <= start <= end <= 2"), ([(2, 1)], ValueError, "start <= end"),
    ([(-1, 1)], ValueError, "0 <= start"), ([(0, 1), None], TypeError, "sequence of 1"),
    ([(0, 1.5)], TypeError, r"\(start, end\) ints"), ("x", TypeError, "sequence of 1"),
    ([(True, 1)], TypeError, "ints"),
])
def test_ignore_code_ranges_are_checked(ranges, exc, match):
    with pytest.raises(exc, match=match):
        collate([Sample(np.array([1]), np.array([4, 5]))], config=FRAMED, ignore_code_ranges=ranges)


def test_code_count_is_coquis_ceil():
    assert [code_count(n, 1024) for n in (0, 1, 1023, 1024, 1025, 255995)] == [0, 1, 1, 1, 2, 250]
    with pytest.raises(ValueError, match="code_stride_len: expected an int >= 1, got 0"):
        code_count(10, 0)
    with pytest.raises(TypeError, match="num_samples: expected an int"):
        code_count(1.5, 1024)


def test_validation_counts_the_framing_positions():
    c = FRAMED  # 24 text positions: 23 ids; 40 audio positions: 36 codes
    ok = TTSDataset([Sample(np.zeros(23, int), np.zeros(36, int))], c)
    assert len(ok) == 1
    with pytest.raises(DataError, match="24 text tokens exceed the model's maximum of 23"):
        TTSDataset([Sample(np.zeros(24, int), np.zeros(3, int))], c)
    with pytest.raises(DataError, match="37 audio tokens exceed the model's maximum of 36"):
        TTSDataset([Sample(np.zeros(3, int), np.zeros(37, int))], c)
    TTSDataset([Sample(np.zeros(24, int), np.zeros(40, int))], PLAIN)  # unframed: the positions themselves
    short = dataclasses.replace(c, max_attention_sequence_length=30)
    with pytest.raises(DataError, match="sequence of 31 exceeds max_attention_sequence_length=30"):
        TTSDataset([Sample(np.zeros(10, int), np.zeros(16, int))], short)


def test_synthetic_dataset_leaves_room_for_the_framing():
    ds = pyxtts.SyntheticDataset(FRAMED, 200, seed=1)
    lengths = ds.lengths()
    assert lengths[:, 0].max() + 1 <= FRAMED.max_text_tokens
    assert lengths[:, 1].max() + 4 <= FRAMED.max_audio_tokens


def test_trainer_feeds_the_model_framed_batches(tmp_path, monkeypatch):
    cfg = pyxtts.XTTSConfig.from_dict({
        "model": dataclasses.asdict(FRAMED),
        "training": {"learning_rate": 1e-3, "lr_schedule": "constant", "max_steps": 3, "epochs": None,
                     "checkpoint_dir": str(tmp_path / "ckpt"), "device": "cpu", "eval_interval": 2,
                     "enable_memory_cleanup": False, "max_memory_fraction": 1.0},
        "data": {"batch_size": 3, "num_workers": 0, "shuffle": False, "bucketing": False}})
    train = pyxtts.SyntheticDataset(cfg.model, 9, seed=2)
    tr = pyxtts.Trainer(cfg, progress=False)
    seen = []
    for name in ("forward_backward", "forward"):
        real = getattr(tr.model, name)

        def spy(batch, *args, _name=name, _real=real, **kw):
            seen.append((_name, batch))
            return _real(batch, *args, **kw)
        monkeypatch.setattr(tr.model, name, spy)
    tr.fit(train, train)
    groups = batch_groups(train, 3, shuffle=False, seed=0, bucket_factor=1)
    want = [collate([train[int(i)] for i in g], config=cfg.model) for g in groups]
    # evaluations (3 batches each) before step 1, after step 2 and at the end; steps 1, 2, 3
    assert [n for n, _ in seen] == ["forward"] * 3 + ["forward_backward"] * 2 + ["forward"] * 3 \
        + ["forward_backward"] + ["forward"] * 3
    steps = [b for n, b in seen if n == "forward_backward"]
    evals = [b for n, b in seen if n == "forward"]
    for got, w in zip(steps + evals, want + want * 3):
        for k in w:
            assert np.array_equal(np.asarray(got[k]), w[k]), k

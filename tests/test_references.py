"""Each step's reference slices (pyxtts.references): the draw, its mel, the masked targets
of every sample, and the Trainer on pyxtts prepare's shards (conditioning path trained,
exact resume)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import pyxtts
import pyxtts.trainer
from conftest import SEED
from pyxtts import DataError, Trainer, XTTSConfig
from pyxtts.data import Sample, TTSDataset, collate, collate_references
from pyxtts.framing import code_count
from pyxtts.prepare.conditioning import conditioning_mel, reference_slice
from pyxtts.references import References, masked_codes, slice_samples_for

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

# the test model: a framing config, the conditioning path on, short references (64 mel frames)
MODEL = pyxtts.ModelConfig(n_layers=1, d_model=64, n_heads=4, text_vocab_size=600, audio_vocab_size=66,
                           max_text_tokens=64, max_audio_tokens=128, n_cond_latents=32, max_cond_frames=64,
                           start_text_token=20, stop_text_token=0, start_audio_token=64, stop_audio_token=65,
                           dropout=0.1)


def mel_stats(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(1.0, 5.0, 80) * rng.choice([-1.0, 1.0], 80)


def samples(rng: np.random.Generator, n: int, clip: bool = True) -> list[Sample]:
    """Samples whose reference is (like) their own clip: as many codes as the clip has strides."""
    out = []
    for i in range(n):
        wav = (rng.standard_normal(int(rng.integers(3000, 40000))) * 0.1).astype(np.float32)
        codes = code_count(wav.shape[0], MODEL.code_stride_len)
        out.append(Sample(rng.integers(0, 600, int(rng.integers(3, 30))), rng.integers(0, 64, codes),
                          source=f"sample {i}", ref_audio=wav, ref_is_clip=clip))
    return out


def test_masked_codes_are_the_codes_overlapping_the_slice(rng):
    for _ in range(2000):
        stride = int(rng.choice([1, 3, 256, 1024]))
        n = int(rng.integers(0, 40))
        total = n * stride
        start = int(rng.integers(0, total + 2))
        end = int(rng.integers(start, total + 3))
        want = [k for k in range(n) if start < end and k * stride < end and (k + 1) * stride > start]
        first, last = masked_codes(start, end, stride, n)
        assert list(range(first, last)) == want, (start, end, stride, n)
    # the whole clip masks every code the DVAE gave it (ceil(samples / stride) codes)
    for length in (1, 1023, 1024, 1025, 87219, 255995):
        assert masked_codes(0, length, 1024, code_count(length, 1024)) == (0, code_count(length, 1024))
    with pytest.raises(ValueError):
        masked_codes(5, 4, 1024, 3)


def test_slice_length_follows_the_models_frames():
    hop = 256
    assert slice_samples_for(517) == 132300  # Coqui's 6 s: 1 + 132300 // 256 = 517 frames
    for frames in (5, 64, 516, 517, 1000):
        longest = slice_samples_for(frames)
        assert 1 + longest // hop <= frames and longest <= 132300
        assert longest == 132300 or 1 + (longest + 1) // hop > frames  # the longest that fits
    with pytest.raises(ValueError, match="max_cond_frames"):
        slice_samples_for(4)  # too short for the STFT's n_fft / 2 reflection
    r = References.for_model(MODEL, np.ones(80))
    assert (r.max_samples, r.min_samples, r.frames()) == (16383, 8191, 64)
    full = References.for_model(pyxtts.ModelConfig(), np.ones(80))
    assert (full.max_samples, full.min_samples, full.frames()) == (132300, 66150, 517)


def test_the_draw_is_a_function_of_seed_epoch_and_index(rng):
    stats = mel_stats(rng)
    data = samples(rng, 6)
    refs = References.for_model(MODEL, stats, seed=SEED)
    mels, ranges = refs.batch(data, list(range(6)), epoch=2)
    # the same samples in other batches, in another order, drawn again: the same slices
    again, ranges2 = refs.batch([data[4], data[1]], [4, 1], epoch=2)
    np.testing.assert_array_equal(again[0], mels[4])
    np.testing.assert_array_equal(again[1], mels[1])
    assert ranges2 == [ranges[4], ranges[1]]
    for i, s in enumerate(data):
        wav, start, end = refs.draw(s.ref_audio, i, 2)
        n = s.ref_audio.shape[0]
        length = end - start
        assert refs.min_samples <= length <= refs.max_samples or length == n // 2
        assert 0 <= start and end <= n
        np.testing.assert_array_equal(wav[:length], s.ref_audio[start:end])
        assert not wav[length:].any()
        np.testing.assert_array_equal(mels[i], conditioning_mel(wav, stats))  # the prepared mel, exactly
        assert ranges[i] == masked_codes(start, end, 1024, len(s.audio))
        # the draw is the one reference_slice makes with that sample's own generator
        own = reference_slice(s.ref_audio, np.random.default_rng([SEED, 2, i]), refs.min_samples, refs.max_samples)
        np.testing.assert_array_equal(own[0], wav)
    # another epoch (or seed) draws other slices
    other, _ = refs.batch(data, list(range(6)), epoch=3)
    assert not np.array_equal(other, mels)
    reseeded, _ = dataclasses.replace(refs, seed=SEED + 1).batch(data, list(range(6)), epoch=2)
    assert not np.array_equal(reseeded, mels)


def test_evaluation_slices_are_fixed_and_mask_nothing(rng):
    data = samples(rng, 4)
    refs = References.for_model(MODEL, mel_stats(rng), seed=SEED)
    a, ra = refs.batch(data, [0, 1, 2, 3], epoch=0, evaluation=True)
    b, rb = refs.batch(data, [0, 1, 2, 3], epoch=7, evaluation=True)
    np.testing.assert_array_equal(a, b)
    assert ra == rb == [None] * 4
    for i, s in enumerate(data):
        n = s.ref_audio.shape[0]
        length = (refs.min_samples + refs.max_samples) // 2
        length = length if length <= n else n // 2
        _, start, end = refs.draw(s.ref_audio, i, 0, evaluation=True)
        assert (start, end) == (0, length)


def test_every_sample_has_its_slice_masked(rng):
    data = samples(rng, 5) + samples(rng, 2, clip=False)
    for s in data:
        s.cond = rng.standard_normal((MODEL.n_cond_latents, MODEL.d_model)).astype(np.float32)
    refs = References.for_model(MODEL, mel_stats(rng), seed=SEED)
    idx = list(range(len(data)))
    batch = collate_references(data, idx, MODEL, refs, epoch=1)
    plain = collate(data, config=MODEL)
    assert "cond_latents" not in batch and batch["cond_mels"].shape == (7, 80, 64)
    _, ranges = refs.batch(data, idx, epoch=1)
    for k in ("text_inputs", "text_targets", "audio_inputs", "text_lengths", "audio_lengths"):
        np.testing.assert_array_equal(batch[k], plain[k])
    for i, r in enumerate(ranges):
        got, want = batch["audio_targets"][i], plain["audio_targets"][i].copy()
        if i < 5:
            assert r is not None and r[1] > r[0], (i, r)  # every own-clip sample, not only the last
            want[r[0]:r[1]] = -1
        else:
            assert r is None  # a separate reference recording: nothing to hide
        np.testing.assert_array_equal(got, want, err_msg=f"sample {i}")
    # the switch
    off = dataclasses.replace(refs, mask_targets=False)
    np.testing.assert_array_equal(collate_references(data, idx, MODEL, off, epoch=1)["audio_targets"],
                                  plain["audio_targets"])


def test_bad_data_is_named(rng):
    data = samples(rng, 3)
    data[1].ref_audio = None
    with pytest.raises(DataError, match="sample 1: a reference recording"):
        TTSDataset(data, MODEL)
    refs = References.for_model(MODEL, np.ones(80))
    with pytest.raises(ValueError, match="sample 1: no reference recording"):
        refs.batch(data, [0, 1, 2], epoch=0)
    with pytest.raises(ValueError, match="mel_stats"):
        References(np.ones(79))
    with pytest.raises(ValueError, match="mel_stats"):
        References(np.zeros(80))
    with pytest.raises(ValueError, match="min_samples"):
        References(np.ones(80), max_samples=10, min_samples=11)


# ---- the Trainer on pyxtts prepare's shards -------------------------------------------------

def trainer_config(tmp_path, max_steps: int) -> XTTSConfig:
    m = {f.name: getattr(MODEL, f.name) for f in dataclasses.fields(MODEL)}
    return XTTSConfig.from_dict({
        "model": m,
        "training": {"learning_rate": 1e-3, "lr_schedule": "constant", "max_steps": max_steps, "epochs": None,
                     "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_interval": 4, "eval_interval": 4,
                     "log_interval": 1, "device": "cpu", "enable_memory_cleanup": False,
                     "max_memory_fraction": 1.0, "weight_decay": 0.0, "warmup_steps": 0},
        "data": {"batch_size": 2, "bucketing": False, "num_workers": 1, "shuffle_seed": SEED % 1000}})


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """pyxtts prepare's output for 10 espeak sentences and a tiny DVAE (test_prepare's fixtures)."""
    fx = pytest.importorskip("fixtures_prepare")
    if fx.ESPEAK is None:
        pytest.skip("espeak-ng is not installed")
    pytest.importorskip("torch", reason="torch (the test extra) writes the .pth fixtures")
    from pyxtts.prepare import prepare

    root = tmp_path_factory.mktemp("refs")
    meta = fx.make_ljspeech(root / "corpus", fx.SENTENCES_EN[:10])
    wavs = sorted((root / "corpus" / "wavs").glob("*.wav"))
    fx.write_assets(root / "xtts", wavs[:4], SEED, fx.training_texts(), dvae=fx.TINY_DVAE)
    prepare(root / "xtts", meta, root / "out", eval_fraction=0.2, seed=SEED, progress=False)
    vocab = json.loads((root / "xtts" / "vocab.json").read_text())["model"]["vocab"]
    assert (vocab["[START]"], vocab["[STOP]"], len(vocab)) == (20, 0, 600)  # MODEL's text ids
    return root / "out"


def conditioning_params(trainer: Trainer) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in trainer.model.state_dict().items() if k.startswith("conditioning_")}


def test_trainer_draws_slices_and_trains_the_conditioning_path(shards, tmp_path):
    train, held = TTSDataset.load(shards / "train"), TTSDataset.load(shards / "eval")
    np.testing.assert_array_equal(train.mel_stats, held.mel_stats)
    assert all(s.ref_audio is not None and s.ref_is_clip for s in train)
    cfg = trainer_config(tmp_path, 12)
    t = Trainer(cfg, progress=False)
    before = conditioning_params(t)
    seen = []
    real = pyxtts.trainer.train_step_with_accumulation

    def spy(model, opt, batch, steps, **kwargs):
        seen.append(batch)
        return real(model, opt, batch, steps, **kwargs)

    pyxtts.trainer.train_step_with_accumulation = spy
    try:
        r = t.fit(train, held)
    finally:
        pyxtts.trainer.train_step_with_accumulation = real
    assert r.step == 12 and len(seen) == 12
    for b in seen:
        assert b["cond_mels"].shape == (len(b["text_lengths"]), 80, 64) and np.isfinite(b["cond_mels"]).all()
        assert "cond_latents" not in b
        # every sample's slice is masked: some of its codes are not targets
        for i, n in enumerate(b["audio_lengths"]):
            assert (b["audio_targets"][i, :n - 4] == -1).any(), i
    after = conditioning_params(t)
    moved = [k for k in before if not np.array_equal(before[k], after[k])]
    assert len(moved) == len(before) > 40, moved  # all 54 of the path's tensors, trained
    assert r.evals[-1]["loss"] < r.evals[0]["loss"], [e["loss"] for e in r.evals]


def test_resume_draws_the_slices_of_the_straight_run(shards, tmp_path):
    train = TTSDataset.load(shards / "train")
    a = Trainer(trainer_config(tmp_path / "a", 10), progress=False)
    a.fit(train)  # 8 samples, batch 2: 4 steps an epoch, so the run crosses two epochs
    b = Trainer(trainer_config(tmp_path / "b", 6), progress=False)
    b.fit(train)
    cfg = trainer_config(tmp_path / "b", 10)
    b2 = Trainer(cfg, progress=False)
    b2.fit(train, resume=True)
    pa, pb = a.model.state_dict(), b2.model.state_dict()
    for k, v in pa.items():
        assert np.array_equal(v, pb[k]), k


def test_shards_without_mel_stats_are_refused(shards, tmp_path):
    train = TTSDataset.load(shards / "train")
    bare = TTSDataset(train.samples)  # the recordings without the normalisation
    with pytest.raises(DataError, match="mel_stats"):
        Trainer(trainer_config(tmp_path, 2), progress=False).fit(bare)
    # a model without the conditioning path trains the GPT alone from the same data
    cfg = trainer_config(tmp_path / "core", 2)
    cfg.model = dataclasses.replace(cfg.model, conditioning=False)
    assert Trainer(cfg, progress=False).fit(bare).step == 2

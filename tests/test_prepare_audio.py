"""pyxtts.prepare's audio side against references nobody here wrote: soundfile + soxr
loading, the mel spectrograms and the conditioning slice against Coqui's own
TorchMelSpectrogram and get_prompt_slice, and the DVAE encoder against torch's float64
convolutions and Coqui's DiscreteVAE. (The .pth reading is pyxtts.torchfile's, tested in
test_torchfile.py.)"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fixtures_prepare import (ESPEAK, TINY_DVAE, coqui_mels, coqui_prompt_slice, dvae_state, espeak,
                              torch_dvae_encode, torch_save)
from helpers import SEED, make_rng

sf = pytest.importorskip("soundfile", reason="the prepare extra (soundfile) is not installed")
soxr = pytest.importorskip("soxr", reason="the prepare extra (soxr) is not installed")
torch = pytest.importorskip("torch", reason="torch (the test extra) writes the .pth files")

from pyxtts.prepare import (DVAE_MEL, STYLE_MEL, AudioError, DVAEEncoder, conditioning_mel,  # noqa: E402
                            load_audio, mel_spectrogram, reference_slice)
from pyxtts.prepare.audio import STYLE_MEL_NO_PERCEIVER, MelSettings  # noqa: E402



@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> list[Path]:
    """Four espeak-ng clips of different voices and lengths (22,050 Hz, 16-bit)."""
    if ESPEAK is None:
        pytest.skip("espeak-ng is not installed")
    d = tmp_path_factory.mktemp("speech")
    texts = ["Hello, this is a short test.", "The quick brown fox jumps over the lazy dog, twice.",
             "Numbers such as 1984 and 3.14 are spoken too.", "Goodbye!"]
    paths = []
    for i, (t, v) in enumerate(zip(texts, ["en-us", "en-gb", "en-gb-scotland", "en-029"])):
        paths.append(d / f"s{i}.wav")
        espeak(t, paths[-1], v, 140 + 20 * i, 40 + 10 * i)
    return paths


# ---- loading audio ------------------------------------------------------------------

def test_load_audio_pcm16_is_exact(tmp_path, rng):
    pcm = rng.integers(-32768, 32768, 22050, dtype=np.int16)
    sf.write(tmp_path / "a.wav", pcm, 22050, subtype="PCM_16")
    wav = load_audio(tmp_path / "a.wav")
    assert wav.dtype == np.float32
    np.testing.assert_array_equal(wav, pcm.astype(np.float32) / 32768)


@pytest.mark.parametrize("fmt,subtype,rate", [("WAV", "FLOAT", 44100), ("FLAC", "PCM_24", 48000),
                                              ("OGG", "VORBIS", 16000), ("WAV", "PCM_16", 22050)])
def test_load_audio_stereo_any_rate(tmp_path, rng, fmt, subtype, rate):
    n = rate * 2
    t = np.arange(n) / rate
    stereo = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 220 * t + 1)], 1)
    stereo += 0.01 * rng.standard_normal(stereo.shape)
    path = tmp_path / f"a.{fmt.lower()}"
    sf.write(path, stereo.astype(np.float32), rate, format=fmt, subtype=subtype)
    data, r = sf.read(path, dtype="float32", always_2d=True)
    mono = data.mean(axis=1, dtype=np.float32)
    want = mono if r == 22050 else soxr.resample(mono, r, 22050)
    wav = load_audio(path)
    np.testing.assert_array_equal(wav, np.clip(want, -1, 1))
    assert abs(wav.shape[0] - round(n * 22050 / rate)) <= 1
    # a 440 Hz tone stays a 440 Hz tone (a resampler, not a reinterpretation of the samples)
    spec = np.abs(np.fft.rfft(wav))
    assert abs(np.argmax(spec) * 22050 / wav.shape[0] - 440) < 2


def test_load_audio_clips_like_coqui(tmp_path):
    x = np.array([0.5, 1.5, -2.0, 0.25], np.float32)
    sf.write(tmp_path / "a.wav", x, 22050, subtype="FLOAT")
    np.testing.assert_array_equal(load_audio(tmp_path / "a.wav"), [0.5, 1.0, -1.0, 0.25])


def test_load_audio_errors(tmp_path):
    (tmp_path / "bad.wav").write_bytes(b"RIFF....WAVEgarbage")
    with pytest.raises(AudioError, match="bad.wav: cannot read audio"):
        load_audio(tmp_path / "bad.wav")
    with pytest.raises(AudioError, match="missing.wav: cannot read audio"):
        load_audio(tmp_path / "missing.wav")
    sf.write(tmp_path / "empty.wav", np.zeros(0, np.float32), 22050)
    with pytest.raises(AudioError, match="holds no samples"):
        load_audio(tmp_path / "empty.wav")


# ---- mel spectrograms -------------------------------------------------------------------

def _signals(speech: list[Path], rng) -> dict[str, np.ndarray]:
    sig = {f"speech_{i}": load_audio(p) for i, p in enumerate(speech)}
    sig["noise"] = (0.1 * rng.standard_normal(int(rng.integers(20000, 60000)))).astype(np.float32)
    t = np.arange(30011) / 22050
    sig["chirp"] = (0.7 * np.sin(2 * np.pi * (100 + 3000 * t) * t)).astype(np.float32)
    sig["padded_slice"] = reference_slice(sig["speech_1"], rng)[0]  # zeros at the end, as Coqui pads
    return sig


MEL_SETTINGS = {"dvae": DVAE_MEL, "style": STYLE_MEL, "style-np": STYLE_MEL_NO_PERCEIVER}


@pytest.fixture(scope="module")
def coqui_ref(tmp_path_factory, speech):
    """Everything this module compares with Coqui, computed by Coqui's own code."""
    d = tmp_path_factory.mktemp("coqui")
    rng = make_rng("coqui_ref")
    stats = rng.uniform(-6, -2, 80).astype(np.float32)
    torch_save(stats, d / "stats.pth")
    sig = _signals(speech, rng)
    slices = {f"s{i}": reference_slice(load_audio(p), rng)[0] for i, p in enumerate(speech)}
    long_clip = d / "long.wav"  # longer than the 99,225-sample evaluation slice
    sf.write(long_clip, np.concatenate([sf.read(p, dtype="int16")[0] for p in speech] * 3), 22050, subtype="PCM_16")
    mels = {(name, dtype): coqui_mels(d / "stats.pth", st.n_fft, st.hop_length, st.win_length, dtype, sig)
            for name, st in MEL_SETTINGS.items() for dtype in ("float64", "float32")}
    return {"stats": stats, "signals": sig, "slices": slices, "mels": mels,
            "cond": coqui_mels(d / "stats.pth", 2048, 256, 1024, "float32", slices),
            "slice": {"long": (long_clip, coqui_prompt_slice(long_clip)),
                      "short": (speech[3], coqui_prompt_slice(speech[3]))}}


@pytest.mark.parametrize("name", list(MEL_SETTINGS))
def test_mel_equals_coqui(coqui_ref, name):
    """Coqui's TorchMelSpectrogram run in float64 gives the same mel to ~1e-12 (both exact);
    run in float32, as Coqui trains, it is within its own rounding of it."""
    settings = MEL_SETTINGS[name]
    ref64, ref32 = coqui_ref["mels"][name, "float64"], coqui_ref["mels"][name, "float32"]
    for k, wav in coqui_ref["signals"].items():
        mine = mel_spectrogram(wav, coqui_ref["stats"], settings)
        assert mine.shape == (80, 1 + wav.shape[0] // settings.hop_length) == ref64[k].shape, k
        # float64 on both sides: only the order of sums differs
        np.testing.assert_allclose(mine, ref64[k], rtol=0, atol=1e-10, err_msg=f"{k}, seed {SEED}")
        # float32 Coqui: a band's log-power carries relative error ~1e-7 x (frame's peak power / band's
        # power); quiet bands (60 dB down) reach ~1e-4 in the log, normalised by |stats| >= 2
        np.testing.assert_allclose(mine, ref32[k], rtol=0, atol=2e-3, err_msg=f"{k}, seed {SEED}")
        assert np.median(np.abs(mine - ref32[k])) < 1e-5


@pytest.mark.parametrize("settings", [DVAE_MEL, STYLE_MEL, STYLE_MEL_NO_PERCEIVER,
                                      MelSettings(n_fft=256, hop_length=64, win_length=256)],
                         ids=["dvae", "style", "style_no_perceiver", "bands_without_bins"])
def test_mel_by_band_equals_the_dense_product(settings, rng, seed):
    """The filterbank applied band by band (no BLAS call: the collating threads must not
    start BLAS's own) equals the dense (n_mels x bins) product of the same filterbank and
    power spectrum in float64, every element, to rounding. n_fft 256 has low bands that
    no bin falls in: their mel is 0, so log(1e-5), as the dense product gives."""
    from pyxtts.prepare.audio import _bands, _filterbank, _window

    wav = (rng.standard_normal(40_000) * rng.uniform(0.01, 0.5)).astype(np.float32)
    stats = rng.uniform(-6.0, -2.0, settings.n_mels)
    got = mel_spectrogram(wav, stats, settings)
    pad = settings.n_fft // 2
    x = np.pad(wav.astype(np.float64), pad, mode="reflect")
    frames = np.stack([x[i:i + settings.n_fft] for i in range(0, x.size - settings.n_fft + 1, settings.hop_length)])
    spec = np.fft.rfft(frames * _window(settings), axis=1)
    dense = _filterbank(settings, 22050).T @ (np.abs(spec) ** 2).T
    want = np.log(np.maximum(dense, 1e-5)) / stats[:, None]
    assert got.shape == want.shape == (settings.n_mels, 1 + wav.size // settings.hop_length)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=f"seed={seed}")
    empty = [m for m, (lo, hi, _) in enumerate(_bands(settings, 22050)[1]) if hi == lo]
    assert (len(empty) > 0) == (settings.n_fft == 256), empty
    assert np.all(got[empty] == np.log(1e-5) / stats[empty, None])


def test_mel_rejects_bad_input():
    stats = np.full(80, -4.0)
    with pytest.raises(ValueError, match=r"wav: expected a 1-d float array.*int"):
        mel_spectrogram(np.zeros(5000, np.int16), stats, DVAE_MEL)
    with pytest.raises(ValueError, match=r"wav: expected a 1-d float array.*\(2, 5000\)"):
        mel_spectrogram(np.zeros((2, 5000), np.float32), stats, DVAE_MEL)
    with pytest.raises(ValueError, match="wav: 512 samples is too short"):
        mel_spectrogram(np.zeros(512, np.float32), stats, DVAE_MEL)
    with pytest.raises(ValueError, match=r"mel_stats: expected shape \(80,\), got \(79,\)"):
        mel_spectrogram(np.zeros(5000, np.float32), stats[:79], DVAE_MEL)


# ---- conditioning -------------------------------------------------------------------------

def test_reference_slice_in_evaluation_equals_coqui(coqui_ref, rng):
    for name in ("long", "short"):  # short: half the clip
        path, (ref_slice, ref_idxs) = coqui_ref["slice"][name]
        out, start, end = reference_slice(load_audio(path), rng, evaluation=True)  # draws nothing
        np.testing.assert_array_equal(out, ref_slice)
        assert [start, end] == ref_idxs, name


def test_reference_slice_draws(rng, seed):
    ref = rng.standard_normal(200000).astype(np.float32)
    lengths = []
    for _ in range(2000):
        out, s, e = reference_slice(ref, rng)
        assert out.shape == (132300,) and out.dtype == np.float32
        assert 66150 <= e - s <= 132300 and 0 <= s and e <= ref.shape[0], (s, e, seed)
        np.testing.assert_array_equal(out[:e - s], ref[s:e])
        assert not out[e - s:].any()
        lengths.append(e - s)
    # uniform over [66150, 132300]: mean 99225, sd 19096 -> the mean of 2000 within 5 sd of it
    assert abs(np.mean(lengths) - 99225) < 5 * 19096 / np.sqrt(2000), seed
    short = rng.standard_normal(50000).astype(np.float32)  # shorter than any slice: half of it
    out, s, e = reference_slice(short, rng)
    assert e - s == 25000 and 0 <= s <= 25000
    with pytest.raises(ValueError, match="ref_audio: expected a non-empty 1-d float array"):
        reference_slice(np.zeros((2, 3), np.float32), rng)


def test_conditioning_mel_equals_coqui(coqui_ref):
    ref = coqui_ref["cond"]
    stats = coqui_ref["stats"]
    for k, wav in coqui_ref["slices"].items():
        mine = conditioning_mel(wav, stats)
        assert mine.dtype == np.float32 and mine.shape == (80, 517) == ref[k].shape  # 132,300 samples -> 517 frames
        np.testing.assert_allclose(mine, ref[k], rtol=0, atol=2e-3, err_msg=f"{k}, seed {SEED}")
        assert np.median(np.abs(mine - ref[k])) < 1e-5
    wav = coqui_ref["slices"]["s0"]
    np.testing.assert_array_equal(conditioning_mel(wav, stats, perceiver=False),
                                  mel_spectrogram(wav, stats, STYLE_MEL_NO_PERCEIVER).astype(np.float32))


# ---- the DVAE encoder ---------------------------------------------------------------------

@pytest.mark.parametrize("size", ["tiny", "full"])
def test_dvae_encoder_equals_torch_float64(tmp_path, rng, seed, size):
    dims = TINY_DVAE if size == "tiny" else {"hidden": 512, "codebook_dim": 512, "num_tokens": 1024}
    state = dvae_state(rng, **dims)
    torch_save(state, tmp_path / "dvae.pth")
    enc = DVAEEncoder.load(tmp_path / "dvae.pth")
    assert enc.num_tokens == dims["num_tokens"] and enc.downsampling == 4
    for frames in (1, 2, 5, 8, 333 if size == "full" else 1001):
        mel = rng.standard_normal((80, frames))
        z = enc.encode(mel)
        ref = torch_dvae_encode(state, torch.from_numpy(mel)[None]).numpy()  # float64
        assert z.shape == ref.shape == (enc.n_codes(frames), dims["codebook_dim"])
        np.testing.assert_allclose(z, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max(), err_msg=f"seed {seed}")
        codes = enc.codes(mel)
        embed = state["codebook.embed"].astype(np.float64)
        want = np.argmin(((ref[:, :, None] - embed[None]) ** 2).sum(1), axis=1)  # nearest entry, directly
        np.testing.assert_array_equal(codes, want)


def test_dvae_load_errors(tmp_path, rng):
    state = dvae_state(rng, **TINY_DVAE)
    for drop, msg in (("encoder.3.net.2.bias", r"encoder\.3\.net\.2\.weight or .*bias missing"),
                      ("codebook.embed", "codebook.embed missing")):
        torch_save({k: v for k, v in state.items() if k != drop}, tmp_path / "d.pth")
        with pytest.raises(ValueError, match=msg):
            DVAEEncoder.load(tmp_path / "d.pth")
    torch_save({**state, "encoder.1.0.weight": state["encoder.1.0.weight"][:, :5]}, tmp_path / "d.pth")
    with pytest.raises(ValueError, match=r"encoder\.1\.0\.weight has shape .* does not chain"):
        DVAEEncoder.load(tmp_path / "d.pth")
    torch_save(state["codebook.embed"], tmp_path / "d.pth")
    with pytest.raises(ValueError, match="expected a state dict of the DVAE"):
        DVAEEncoder.load(tmp_path / "d.pth")
    torch_save(state, tmp_path / "d.pth")
    with pytest.raises(ValueError, match=r"mel: expected shape \(80, frames >= 1\)"):
        DVAEEncoder.load(tmp_path / "d.pth").codes(np.zeros((40, 10)))

"""Runs Coqui's own XTTS code (coqui-tts 0.28.0) on the tests' inputs, in the Python that has
it installed (``PYXTTS_COQUI_PYTHON``, or this interpreter when it can import TTS), and writes
what it computed; the tests compare pyxtts with it. Not a test module: a script.

    python coqui_reference.py tokens VOCAB IN.json OUT.json
        IN: [[text, lang], ...] -> OUT: [ids or {"error": "..."}, ...]
    python coqui_reference.py audio XTTS_DIR OUT.npz WAV...
        for each WAV (read with soundfile, as 16-bit PCM it equals torchaudio.load):
        mel_i (the DVAE's normalised mel) and codes_i (DiscreteVAE.get_codebook_indices), each
        clip alone (a batch of one), with the DVAE gpt_trainer.py builds
    python coqui_reference.py mel MEL_STATS N_FFT HOP WIN DTYPE IN.npz OUT.npz
        for each array of IN (a waveform): TorchMelSpectrogram with those settings (the DVAE's:
        1024 256 1024; the conditioning encoder's: 2048 256 1024, or 4096 1024 4096 without the
        perceiver) computed in DTYPE (float32 as Coqui trains, or float64)
    python coqui_reference.py slice WAV OUT.npz
        get_prompt_slice in evaluation mode: the slice and its (start, end)
    python coqui_reference.py batch JOBS.json
        JOBS: [[command, arg, ...], ...], run in this one process (importing TTS takes seconds)
"""
from __future__ import annotations

import json
import sys

import numpy as np


def _wav(path: str):
    import soundfile as sf
    import torch

    data, rate = sf.read(path, dtype="float32", always_2d=True)
    assert rate == 22050, f"{path}: the reference script takes 22,050 Hz files, got {rate}"
    return torch.from_numpy(data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0].copy())


def tokens(vocab: str, inp: str, out: str) -> None:
    from TTS.tts.layers.xtts.tokenizer import VoiceBpeTokenizer

    tok = VoiceBpeTokenizer(vocab)
    res = []
    for text, lang in json.load(open(inp, encoding="utf-8")):
        try:
            res.append(tok.encode(text, lang))
        except Exception as exc:  # noqa: BLE001 - the error is the result
            res.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(res, open(out, "w", encoding="utf-8"))


def audio(xtts_dir: str, out: str, *wavs: str) -> None:
    import torch
    from TTS.tts.layers.tortoise.arch_utils import TorchMelSpectrogram
    from TTS.tts.layers.xtts.dvae import DiscreteVAE

    cfg = json.load(open(f"{xtts_dir}/config.json"))["model_args"]
    mel = TorchMelSpectrogram(mel_norm_file=f"{xtts_dir}/mel_stats.pth", sampling_rate=22050)
    state = torch.load(f"{xtts_dir}/dvae.pth", map_location="cpu", weights_only=True)
    # gpt_trainer.py's DiscreteVAE has hidden_dim = codebook_dim = 512; the tests also use narrower ones
    dvae = DiscreteVAE(channels=80, normalization=None, positional_dims=1,
                       num_tokens=cfg["gpt_num_audio_tokens"] - 2, codebook_dim=state["codebook.embed"].shape[0],
                       hidden_dim=state["encoder.0.0.weight"].shape[0], num_resnet_blocks=3, kernel_size=3,
                       num_layers=2, use_transposed_convs=False)
    dvae.eval()
    missing, unexpected = dvae.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if k.startswith(("encoder", "codebook"))], (missing, unexpected)
    res = {}
    with torch.no_grad():
        for i, w in enumerate(wavs):
            m = mel(_wav(w)[None, None, :])  # (1, 80, frames)
            res[f"mel_{i}"] = m[0].numpy()
            res[f"codes_{i}"] = dvae.get_codebook_indices(m)[0].numpy()
    np.savez(out, **res)


def mel(mel_stats: str, n_fft: str, hop: str, win: str, dtype: str, inp: str, out: str) -> None:
    import torch

    from TTS.tts.layers.tortoise.arch_utils import TorchMelSpectrogram

    # in float64, every buffer (window, filterbank) is built in float64 too
    torch.set_default_dtype(torch.float64 if dtype == "float64" else torch.float32)
    try:
        m = TorchMelSpectrogram(filter_length=int(n_fft), hop_length=int(hop), win_length=int(win),
                                normalize=False, sampling_rate=22050, mel_fmin=0, mel_fmax=8000, n_mel_channels=80,
                                mel_norm_file=mel_stats)
    finally:
        torch.set_default_dtype(torch.float32)
    z = np.load(inp)
    res = {}
    with torch.no_grad():
        for k in z.files:
            res[k] = m(torch.from_numpy(z[k].astype(dtype))[None, None, :])[0].numpy()
    np.savez(out, **res)


def prompt_slice(wav: str, out: str) -> None:
    import TTS.tts.layers.xtts.trainer.dataset as ds

    ds.load_audio = lambda path, sr: _wav(path)[None, :]  # torchaudio's file loading is not needed here
    clip, length, idxs = ds.get_prompt_slice(wav, 132300, 66150, 22050, is_eval=True)
    np.savez(out, slice=clip[0].numpy(), idxs=np.array(idxs), length=np.array(length))


COMMANDS = {"tokens": tokens, "audio": audio, "mel": mel, "slice": prompt_slice}


def batch(jobs: str) -> None:
    for cmd, *args in json.load(open(jobs, encoding="utf-8")):
        COMMANDS[cmd](*args)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {**COMMANDS, "batch": batch}[cmd](*args)

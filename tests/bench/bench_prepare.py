"""Throughput of ``pyxtts prepare`` on the espeak-ng test corpus, at XTTS v2's DVAE size.

    python tests/bench/bench_prepare.py [--sentences 40] [--workers 1,2] [--repeats 2] [--json out.json]

Builds the test corpus (tests/fixtures_prepare.py: espeak-ng speech in the LJSpeech layout,
a vocab.json, a randomly initialised dvae.pth of XTTS v2's shapes, mel_stats.pth), then:

1. runs ``pyxtts prepare`` as a user does (a fresh process per run, start-up and loading
   the DVAE included) with each worker count, into an empty folder, and reports seconds of
   audio per second of wall time (the best of --repeats runs), with the CPU seconds the run
   and its workers used and the machine's load average (the machine may be shared);
2. times the audio codes alone (mel + DVAE encoder, one clip at a time) in pyxtts's float64
   NumPy and in PyTorch float32 written the way Coqui computes them (torch.stft, the same
   filterbank, F.conv1d), both on all cores, and checks that both give the same codes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import fixtures_prepare as fp  # noqa: E402

from pyxtts.prepare import DVAE_MEL, DVAEEncoder, load_audio, mel_spectrogram  # noqa: E402
from pyxtts.prepare.audio import _filterbank, _window  # noqa: E402
from pyxtts.torchfile import read_tensors  # noqa: E402


def torch_codes(state: dict, stats: np.ndarray, wav: np.ndarray):
    """Coqui's computation in torch float32: TorchMelSpectrogram then DiscreteVAE's encoder
    and nearest-codebook-entry quantisation."""
    import torch

    x = torch.from_numpy(wav)
    spec = torch.stft(x, 1024, 256, 1024, torch.from_numpy(_window(DVAE_MEL).astype(np.float32)), center=True,
                      pad_mode="reflect", return_complex=True).abs().pow(2)
    mel = torch.from_numpy(_filterbank(DVAE_MEL, 22050).astype(np.float32)).T @ spec
    h = (torch.log(torch.clamp(mel, min=1e-5)) / torch.from_numpy(stats)[:, None])[None]
    z = fp.torch_dvae_encode(state, h)
    e = state["codebook.embed"]
    dist = z.pow(2).sum(1, keepdim=True) - 2 * z @ e + e.pow(2).sum(0, keepdim=True)
    return dist.argmin(1).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=40)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    try:
        sentences = (fp.SENTENCES_EN * math.ceil(args.sentences / len(fp.SENTENCES_EN)))[:args.sentences]
        meta = fp.make_ljspeech(work / "corpus", sentences)
        wavs = sorted((work / "corpus" / "wavs").glob("*.wav"))
        fp.write_assets(work / "xtts", wavs[::8], 0, fp.training_texts(), dvae=fp.FULL_DVAE)
        audio_s = sum(load_audio(w).shape[0] for w in wavs) / 22050
        print(f"corpus: {len(wavs)} clips, {audio_s:.1f} s of speech; {os.cpu_count()} cores")
        res: dict = {"clips": len(wavs), "audio_seconds": audio_s, "cores": os.cpu_count(),
                     "machine": platform.processor() or platform.machine(), "prepare": {}}
        base = [sys.executable, "-m", "pyxtts"]  # run in the work folder: the installed pyxtts
        for w in [int(x) for x in args.workers.split(",")]:
            best, cpu = math.inf, math.inf
            for _ in range(args.repeats):
                out = work / f"out-{w}"
                shutil.rmtree(out, ignore_errors=True)
                cmd = base + ["prepare", "--xtts-dir", str(work / "xtts"), "--metadata", str(meta), "--out", str(out),
                              "--workers", str(w), "--no-progress"]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                r = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
                wall = time.perf_counter() - t0
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if r.returncode != 0:
                    raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr}")
                if wall < best:
                    best = wall
                    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            load = os.getloadavg()[0]
            res["prepare"][w] = {"wall_s": best, "audio_s_per_s": audio_s / best, "cpu_s": cpu, "load_1min": load}
            print(f"pyxtts prepare --workers {w}: {best:.1f} s wall, {audio_s / best:.2f} s of audio per second "
                  f"({cpu:.1f} CPU s; load average {load:.1f})")

        import torch
        enc = DVAEEncoder.load(work / "xtts" / "dvae.pth")
        stats = read_tensors(work / "xtts" / "mel_stats.pth")
        state = {k: torch.from_numpy(v.copy()) for k, v in read_tensors(work / "xtts" / "dvae.pth").items()
                 if k.startswith(("encoder", "codebook.embed"))}
        clips = [load_audio(w) for w in wavs]
        t0 = time.perf_counter()
        ours = [enc.codes(mel_spectrogram(c, stats, DVAE_MEL)) for c in clips]
        t_np = time.perf_counter() - t0
        with torch.no_grad():
            t0 = time.perf_counter()
            theirs = [torch_codes(state, stats.astype(np.float32), c) for c in clips]
            t_torch = time.perf_counter() - t0
        same = sum(int(np.array_equal(a, b)) for a, b in zip(ours, theirs))
        res["codes_only"] = {"pyxtts_numpy_float64_s": t_np, "torch_float32_s": t_torch,
                             "torch_threads": torch.get_num_threads(), "clips_with_equal_codes": same}
        print(f"codes only (mel + DVAE), {len(clips)} clips: pyxtts NumPy float64 {t_np:.1f} s "
              f"({audio_s / t_np:.2f} s/s), torch float32 {t_torch:.1f} s ({audio_s / t_torch:.2f} s/s, "
              f"{torch.get_num_threads()} threads); ratio pyxtts/torch {t_np / t_torch:.2f}; "
              f"equal codes on {same} of {len(clips)} clips")
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""One XTTS v2 GPT training step with the conditioning path on the CPU: pyxtts against
Coqui's own GPT (coqui-tts 0.28.0) in torch eager, the same weights and the same batch.

    python tests/bench/bench_xtts_cond_cpu.py [--json out.json] [--only NAME] [--steps N]
                                              [--layers L] [--batch B]

The model is all of Coqui's `xtts.gpt` at XTTS v2 size (30 layers, d = 1024, 16 heads,
the conditioning encoder and the perceiver resampler: 441 M parameters, every one
trained), or with --layers L fewer GPT-2 blocks (every other size XTTS v2's) where a
machine's memory cannot hold Coqui's step at full depth; the parameter counts at full
depth are reported either way (Coqui's GPT built, pyxtts's plan). The batch: B samples
(default 2) of up to 150 text tokens and 300 audio codes (Coqui's framing adds the
start/stop tokens: 32 + 152 + 304 positions), with reference mels of 517 frames (Coqui's
max_conditioning_length of 132,300 samples at hop 256), dropout 0.1 (Coqui's GPT in
train mode). One step = forward, backward, gradient clipping to 1.0 and
an AdamW update (torch.optim.AdamW for Coqui, pyxtts.AdamW for pyxtts). Each
configuration runs in its own process, steps times, the first one (allocations, lazy
initialisation) reported apart; peak RSS is the process's (getrusage), so it includes
the interpreter and the libraries (torch, transformers and Coqui's imports in both).

Configurations:
  coqui_fp32       Coqui's GPT, fp32, torch eager
  pyxtts_fp32      pyxtts fp32, no checkpointing
  pyxtts_bf16_full pyxtts bf16 (fp32 master copy), full recomputation
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_TEXT, MAX_CODES, FRAMES = 150, 300, 517
RUNS = {
    "coqui_fp32": ("coqui", "fp32", "none"),
    "pyxtts_fp32": ("pyxtts", "fp32", "none"),
    "pyxtts_bf16_full": ("pyxtts", "bf16", "full"),
}


def samples(cfg, rng, B):
    """Texts, codes and mels of the batch (the same in every process: seeded); the first
    sample has the longest text, the last the longest codes."""
    import numpy as np

    texts = [rng.integers(0, cfg.text_vocab_size, MAX_TEXT - (37 if i else 0)) for i in range(B)]
    codes = [rng.integers(0, cfg.audio_vocab_size - 2, MAX_CODES - (0 if i == B - 1 else 61)) for i in range(B)]
    mels = rng.standard_normal((B, 80, FRAMES)).astype(np.float32)
    return texts, codes, mels


def coqui_gpt(cfg):
    from TTS.tts.layers.xtts.gpt import GPT

    return GPT(layers=cfg.n_layers, model_dim=cfg.d_model, heads=cfg.n_heads,
               max_text_tokens=cfg.max_text_tokens - 2, max_mel_tokens=cfg.max_audio_tokens - 3,
               max_prompt_tokens=70, number_text_tokens=cfg.text_vocab_size,
               num_audio_tokens=cfg.audio_vocab_size, start_audio_token=cfg.audio_vocab_size - 2,
               stop_audio_token=cfg.audio_vocab_size - 1, start_text_token=261, stop_text_token=0,
               use_perceiver_resampler=True, code_stride_len=1024)


def count_parameters() -> dict:
    """Parameters trained at full XTTS v2 size: Coqui's GPT built (nothing run), pyxtts's plan."""
    import pyxtts

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gpt = coqui_gpt(pyxtts.ModelConfig())
    cond = ("conditioning_encoder.", "conditioning_perceiver.")
    return {"coqui": sum(p.numel() for p in gpt.parameters() if p.requires_grad),
            "coqui_conditioning": sum(p.numel() for n, p in gpt.named_parameters() if n.startswith(cond)),
            "pyxtts": pyxtts.estimate_memory(pyxtts.ModelConfig(), 1, 1, 1).parameter_count}


def worker(name: str, steps: int, layers: int, B: int) -> dict:
    import numpy as np

    sys.path.insert(0, str(HERE.parent))
    import pyxtts
    from test_conditioning import framed

    impl, precision, policy = RUNS[name]
    # XTTS v2 as Coqui trains it (conditioning path, dropout 0.1), with `layers` blocks
    cfg = pyxtts.ModelConfig(n_layers=layers)
    rng = np.random.default_rng(0)
    texts, codes, mels = samples(cfg, rng, B)
    # the weights: pyxtts's initialisation at seed 0, for both (Coqui's loads them strictly)
    init = pyxtts.XTTSGPT(cfg, seed=0)
    state = init.state_dict()
    del init
    pyxtts.empty_cache("cpu")  # its buffers are not part of either step
    with warnings.catch_warnings():  # both processes import the same libraries
        warnings.simplefilter("ignore")
        import torch
        import TTS.tts.layers.xtts.gpt  # noqa: F401
    out: dict = {"name": name, "impl": impl, "precision": precision, "checkpointing": policy,
                 "layers": layers, "batch": B,
                 "text_lengths": [len(t) for t in texts], "code_lengths": [len(c) for c in codes],
                 "mel_frames": FRAMES, "threads": torch.get_num_threads()}
    times, losses = [], []
    if impl == "coqui":
        gpt = coqui_gpt(cfg)
        with torch.no_grad():
            gpt.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
        del state
        out["parameters_trained"] = sum(p.numel() for p in gpt.parameters() if p.requires_grad)
        gpt.train()  # dropout 0.1, as GPTTrainer trains
        opt = torch.optim.AdamW(gpt.parameters(), lr=5e-6, betas=(0.9, 0.96), eps=1e-8, weight_decay=1e-2)
        text = np.zeros((B, MAX_TEXT), np.int64)
        audio = np.zeros((B, MAX_CODES + 2), np.int64)
        for i, (t, a) in enumerate(zip(texts, codes)):
            text[i, :len(t)], audio[i, :len(a)] = t, a
        wav = torch.tensor([len(a) * 1024 for a in codes])
        args = (torch.from_numpy(text), torch.tensor([len(t) for t in texts]), torch.from_numpy(audio), wav)
        cond = torch.from_numpy(mels)[:, None]
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            lt, lm, _ = gpt(*args, cond_mels=cond)
            loss = cfg.text_loss_weight * lt + cfg.audio_loss_weight * lm
            loss.backward()
            torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
            opt.step()
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach()))
    else:
        model = pyxtts.XTTSGPT(cfg, precision=precision, checkpointing=policy, seed=0)
        model.load_state_dict(state)
        del state
        out["parameters_trained"] = model.num_parameters
        opt = pyxtts.AdamW(model, lr=5e-6, betas=(0.9, 0.96), eps=1e-8, weight_decay=1e-2, grad_clip=1.0)
        batch = framed(cfg, texts, codes, mels, four_d=True)
        Lt, La = batch["text_inputs"].shape[1], batch["audio_inputs"].shape[1]
        out["plan_total"] = model.estimate_memory(B, Lt, La, cond_frames=FRAMES, optimizer=True).total
        pyxtts.reset_peak_memory_stats("cpu")
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            r = model.forward_backward(batch)
            opt.step()
            times.append(time.perf_counter() - t0)
            losses.append(r["loss"])
        out["allocator_peak"] = pyxtts.max_memory_allocated("cpu")
    out["step_s"] = times
    out["loss"] = losses
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--only", choices=list(RUNS), action="append")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        res = count_parameters() if args.worker == "count" else worker(args.worker, args.steps, args.layers,
                                                                        args.batch)
        print(json.dumps(res))
        return
    results = []
    for name in ["count"] + (args.only or list(RUNS)):
        res = subprocess.run([sys.executable, __file__, "--worker", name, "--steps", str(args.steps),
                              "--layers", str(args.layers), "--batch", str(args.batch)],
                             capture_output=True, text=True)
        if res.returncode:
            print(f"{name}: failed\n{res.stderr[-3000:]}")
            continue
        results.append(json.loads(res.stdout.strip().splitlines()[-1]))
    counts = results.pop(0) if results and "coqui_conditioning" in results[0] else None
    gib = 2**30
    base = next((r for r in results if r["impl"] == "coqui"), None)

    def later(r):  # the steps after the first
        rest = r["step_s"][1:] or r["step_s"]
        return sorted(rest)[len(rest) // 2]

    if counts:
        print(f"# parameters trained at XTTS v2 size: Coqui's GPT {counts['coqui']:,} (conditioning "
              f"{counts['coqui_conditioning']:,}), pyxtts {counts['pyxtts']:,}")
    print(f"# XTTS v2 GPT ({args.layers} layers) + conditioning path, one training step "
          f"(fwd+bwd+clip+AdamW), batch {args.batch}, mels {FRAMES} frames, dropout 0.1, CPU; "
          f"median of steps 2..{args.steps}")
    for r in results:
        rss = f"{r['peak_rss'] / gib:6.2f} GiB"
        ratio = (f" ({r['peak_rss'] / base['peak_rss']:.2f}x RSS, {later(r) / later(base):.2f}x time of Coqui)"
                 if base else "")
        extra = (f", allocator peak {r['allocator_peak'] / gib:.2f} GiB, plan {r['plan_total'] / gib:.2f} GiB"
                 if "allocator_peak" in r else "")
        print(f"{r['name']:17} {r['parameters_trained']:,} params trained, step {later(r):.1f} s "
              f"(first {r['step_s'][0]:.1f} s), peak RSS {rss}{ratio}{extra}")
    if args.json:
        Path(args.json).write_text(json.dumps({"parameters": counts, "runs": results}, indent=2))


if __name__ == "__main__":
    main()

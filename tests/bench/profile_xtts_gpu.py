"""Where the XTTS v2 step's GPU time goes: pyxtts's kernels under torch.profiler.

    python tests/bench/profile_xtts_gpu.py [--batch 8] [--policy none] [--recipe]
        [--steps 2] [--top 30] [--json tests/bench/results/profile_xtts_gpu.json]

torch.profiler (CUPTI) records every kernel the process launches, pyxtts's and cuBLAS's
included, so it splits pyxtts's step by kernel without Nsight. Printed: the step's wall
time (median of --steps, unprofiled), the GPU's busy time per step (the sum of kernel and
copy times in the profiled steps; wall minus busy is where the GPU waited for the host),
and the kernels by total time, grouped by name.

--recipe trains as Coqui fine-tunes XTTS v2: dropout 0.1 and the conditioning encoder and
perceiver on reference mels of 517 frames (the longest slice), instead of the GPT core on
fixed latents. Both also report the allocator's peak against the plan
(`XTTSGPT.estimate_memory`), which should agree to the byte.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
LT, LA, MEL_FRAMES = 150, 308, 517


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--policy", default="none", choices=["none", "selective", "full"])
    ap.add_argument("--recipe", action="store_true", help="dropout 0.1 and the conditioning path")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()

    sys.path.insert(0, str(HERE.parent))
    import torch
    from torch.profiler import ProfilerActivity, profile

    import pyxtts
    from helpers import random_batch

    cfg = pyxtts.ModelConfig() if args.recipe else pyxtts.ModelConfig(dropout=0.0, conditioning=False)
    if args.device == "cpu":  # a check of the script itself: a tiny model
        cfg = pyxtts.ModelConfig(n_layers=2, d_model=64, n_heads=4, dropout=cfg.dropout, conditioning=cfg.conditioning,
                                 max_cond_frames=MEL_FRAMES)
    rng = np.random.default_rng(0)
    if args.recipe:
        batch = random_batch(rng, cfg, args.batch, LT, LA, n_cond=0, full=True)
        batch["cond_mels"] = rng.standard_normal((args.batch, 80, MEL_FRAMES)).astype(np.float32)
    else:
        batch = random_batch(rng, cfg, args.batch, LT, LA, full=True)
    model = pyxtts.XTTSGPT(cfg, device=args.device, precision="bf16", checkpointing=args.policy, seed=0)
    opt = pyxtts.AdamW(model, lr=1e-4, betas=(0.9, 0.96), weight_decay=0.01, grad_clip=1.0)

    def step() -> float:
        opt.zero_grad()
        r = model.forward_backward(batch)
        opt.step()
        pyxtts.synchronize(args.device)
        return r["loss"]

    pyxtts.reset_peak_memory_stats(args.device)
    losses = [step(), step()]  # warm-up: the step arena, cuBLAS's heuristics
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    wall = statistics.median(times)
    peak = pyxtts.max_memory_allocated(args.device)
    plan = model.estimate_memory(args.batch, LT, LA, cond_frames=MEL_FRAMES if args.recipe else 0).total

    on_gpu = args.device.startswith("cuda")
    with profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            step()
    # (on the CPU torch sees none of pyxtts's work: the run only checks this script)
    events = [e for e in prof.events() if e.device_type.name == ("CUDA" if on_gpu else "CPU")]
    busy_us = max(sum(e.time_range.elapsed_us() for e in events) / 2, 1e-3)  # per step (one stream)
    groups: dict[str, list[float]] = {}
    for e in events:
        groups.setdefault(e.name, []).append(e.time_range.elapsed_us() / 2)
    rows = sorted(((sum(v), len(v), k) for k, v in groups.items()), reverse=True)

    T = cfg.n_cond_latents + LT + LA  # the perceiver's latents or the fixed ones, then text, audio
    print(f"# {' '.join(sys.argv)}")
    print(f"# {pyxtts.device_info(args.device)['name']}, torch {torch.__version__}, "
          f"{'recipe (dropout 0.1, conditioning on 517-frame mels)' if args.recipe else 'GPT core'}, "
          f"bf16, checkpointing {args.policy}, batch {args.batch} x {T} positions")
    print(f"step {wall * 1e3:.1f} ms wall (median of {args.steps}), {args.batch * T / wall:,.0f} tok/s; "
          f"GPU busy {busy_us / 1e3:.1f} ms per step ({busy_us / 1e6 / wall:.0%}); "
          f"losses {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"allocator peak {peak / 2**30:.3f} GiB, plan {plan / 2**30:.3f} GiB "
          f"(peak - plan = {peak - plan:+,} bytes)")
    print(f"{'kernel (per step)':<90} {'calls':>6} {'ms':>8} {'share':>6}")
    for total, n, name in rows[: args.top]:
        print(f"{name[:90]:<90} {n // 2:>6} {total / 1e3:>8.3f} {total / busy_us:>6.1%}")
    if args.json:
        out = {"command": "python " + " ".join(sys.argv), "recipe": args.recipe, "policy": args.policy,
               "batch": args.batch, "positions": T, "step_s": wall, "gpu_busy_s": busy_us / 1e6,
               "allocator_peak": peak, "plan": plan, "losses": losses,
               "kernels": [{"name": k, "calls": n // 2, "ms_per_step": t / 1e3} for t, n, k in rows[:100]]}
        path = Path(args.json)
        data = json.loads(path.read_text()) if path.exists() else {}
        data["recipe" if args.recipe else "gpt_core"] = out
        path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()

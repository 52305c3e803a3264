"""CPU training-step benchmark: pyxtts vs the same model in PyTorch (SDPA attention).

    python tests/bench/bench_model_cpu.py [--steps 5] [--json out.json]

Each configuration runs in its own process (peak RSS is per process), with the same
thread count. A step is forward + backward of the XTTS GPT on one batch of full-length
samples (no padding, so PyTorch's SDPA may use its fused causal kernel). Reported: median
step time of `--steps` steps after one warm-up step (wall clock, and the process's CPU time,
which a busy machine disturbs less), peak RSS of the process, and for pyxtts the
allocator's peak and the plan's total.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = {
    # name: (ModelConfig kwargs, batch, text_len, audio_len)
    "tiny": (dict(n_layers=2, d_model=64, n_heads=4, text_vocab_size=256, audio_vocab_size=256,
                  max_text_tokens=64, max_audio_tokens=128, n_cond_latents=8), 8, 48, 96),
    "small": (dict(n_layers=4, d_model=256, n_heads=4, text_vocab_size=6681, audio_vocab_size=1026,
                   max_text_tokens=404, max_audio_tokens=608, n_cond_latents=32), 8, 130, 270),
}


def worker(impl: str, name: str, policy: str, steps: int) -> dict:
    import numpy as np

    sys.path.insert(0, str(HERE.parent))
    import pyxtts
    from helpers import random_batch  # NumPy only: torch stays out of pyxtts's RSS

    kwargs, B, Lt, La = CONFIGS[name]
    cfg = pyxtts.ModelConfig(**kwargs)
    rng = np.random.default_rng(0)
    batch = random_batch(rng, cfg, B, Lt, La, full=True)
    times, cpu_times = [], []
    out: dict = {"impl": impl, "config": name, "policy": policy, "batch": B,
                 "tokens_per_sample": cfg.n_cond_latents + Lt + La, "threads": os.cpu_count()}
    if impl == "pyxtts":
        model = pyxtts.XTTSGPT(cfg, checkpointing=policy)
        out["plan_total"] = model.estimate_memory(B, Lt, La).total
        pyxtts.reset_peak_memory_stats("cpu")
        for i in range(steps + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            res = model.forward_backward(batch)
            if i:
                times.append(time.perf_counter() - t0)
                cpu_times.append(time.process_time() - c0)
        out["allocator_peak"] = pyxtts.max_memory_allocated("cpu")
    else:
        import torch

        from helpers.torch_ref import RefGPT

        torch.set_num_threads(os.cpu_count())
        ref = RefGPT(cfg, dtype=torch.float32, sdpa=True)
        ref.load(pyxtts.XTTSGPT(cfg).state_dict())
        for i in range(steps + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            ref.zero_grad(set_to_none=False)
            loss, _, _ = ref(batch)
            loss.backward()
            if i:
                times.append(time.perf_counter() - t0)
                cpu_times.append(time.process_time() - c0)
        res = {"loss": float(loss.detach())}
    out["loss"] = res["loss"]
    out["step_s"] = statistics.median(times)
    out["step_cpu_s"] = statistics.median(cpu_times)
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=3, metavar=("IMPL", "CONFIG", "POLICY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.steps)))
        return
    runs = []
    for name in CONFIGS:
        for impl, policy in (("torch", "-"), ("pyxtts", "none"), ("pyxtts", "selective"), ("pyxtts", "full")):
            cmd = [sys.executable, __file__, "--steps", str(args.steps), "--worker", impl, name, policy]
            runs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    print(f"# CPU forward+backward, {os.cpu_count()} threads, median of {args.steps} steps; "
          f"command: python tests/bench/bench_model_cpu.py --steps {args.steps}")
    print(f"{'config':7} {'impl':7} {'ckpt':10} {'step':>9} {'vs torch':>9} {'CPU time':>9} {'peak RSS':>10} "
          f"{'vs torch':>9} {'alloc peak':>11} {'plan':>10}")
    for name in CONFIGS:
        base = next(r for r in runs if r["config"] == name and r["impl"] == "torch")
        for r in (r for r in runs if r["config"] == name):
            mib = lambda v: f"{v / 2**20:.1f}M" if v is not None else "-"  # noqa: E731
            print(f"{name:7} {r['impl']:7} {r['policy']:10} {r['step_s'] * 1e3:>7.1f}ms "
                  f"{r['step_s'] / base['step_s']:>8.2f}x {r['step_cpu_s'] * 1e3:>7.1f}ms {mib(r['peak_rss']):>10} "
                  f"{r['peak_rss'] / base['peak_rss']:>8.2f}x {mib(r.get('allocator_peak')):>11} "
                  f"{mib(r.get('plan_total')):>10}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()

"""Peak memory of one real training step of the full XTTS v2 GPT on the CPU.

    python tests/bench/bench_xtts_step_memory.py [--json out.json] [--only NAME]

One step = forward, backward and an AdamW update, batch 2 x 490 tokens (32 conditioning
+ 150 text + 308 audio), each configuration in its own process:
  (a) PyTorch fp32 eager, ordinary attention (explicit softmax), torch.optim.AdamW
  (b) pyxtts fp32, no checkpointing, pyxtts.AdamW
  (c) pyxtts bf16, full checkpointing, pyxtts.AdamW
Reported: peak RSS of the process (getrusage), and for pyxtts the allocator's peak and
the plan's total (which the allocator peak must match), plus the step time.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
B, LT, LA = 2, 150, 308
RUNS = {
    "a_torch_fp32_eager": ("torch", "fp32", "none"),
    "b_pyxtts_fp32_none": ("pyxtts", "fp32", "none"),
    "c_pyxtts_bf16_full": ("pyxtts", "bf16", "full"),
}


def worker(name: str) -> dict:
    import numpy as np

    sys.path.insert(0, str(HERE.parent))
    import pyxtts
    from helpers import random_batch

    impl, precision, policy = RUNS[name]
    cfg = pyxtts.ModelConfig()  # XTTS v2 sizes
    batch = random_batch(np.random.default_rng(0), cfg, B, LT, LA, full=True)
    out: dict = {"name": name, "impl": impl, "precision": precision, "checkpointing": policy,
                 "batch": B, "tokens_per_sample": cfg.n_cond_latents + LT + LA}
    t0 = time.perf_counter()
    if impl == "torch":
        import torch

        from helpers.torch_ref import RefGPT

        ref = RefGPT(cfg, dtype=torch.float32)
        with torch.no_grad():
            for p in ref.parameters():
                p.normal_(0.0, 0.02)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-4, betas=(0.9, 0.96), weight_decay=0.01)
        t0 = time.perf_counter()
        loss, _, _ = ref(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        out["loss"] = float(loss.detach())
    else:
        model = pyxtts.XTTSGPT(cfg, precision=precision, checkpointing=policy)
        opt = pyxtts.AdamW(model, lr=1e-4)
        out["plan_total"] = model.estimate_memory(B, LT, LA).total
        pyxtts.reset_peak_memory_stats("cpu")
        t0 = time.perf_counter()
        out["loss"] = model.forward_backward(batch)["loss"]
        opt.step()
        out["allocator_peak"] = pyxtts.max_memory_allocated("cpu")
    out["step_s"] = time.perf_counter() - t0
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--only", choices=list(RUNS))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return
    results = []
    for name in ([args.only] if args.only else RUNS):
        res = subprocess.run([sys.executable, __file__, "--worker", name], capture_output=True, text=True)
        if res.returncode:
            print(f"{name}: failed\n{res.stderr[-2000:]}")
            continue
        results.append(json.loads(res.stdout))
    gib = 2**30
    base = next((r for r in results if r["impl"] == "torch"), None)
    print("# one XTTS v2 GPT training step (fwd+bwd+AdamW), batch 2 x 490 tokens, CPU; "
          "command: python tests/bench/bench_xtts_step_memory.py")
    for r in results:
        ratio = f"{r['peak_rss'] / base['peak_rss']:.2f}x" if base else "-"
        extra = (f", allocator peak {r['allocator_peak'] / gib:.2f} GiB, plan {r['plan_total'] / gib:.2f} GiB"
                 if "allocator_peak" in r else "")
        print(f"{r['name']:22} peak RSS {r['peak_rss'] / gib:6.2f} GiB ({ratio} of torch){extra}, "
              f"step {r['step_s']:.1f} s, loss {r['loss']:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

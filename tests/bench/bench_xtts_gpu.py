"""The XTTS v2 GPT training step on a GPU: pyxtts vs PyTorch eager and torch.compile.

    python tests/bench/bench_xtts_gpu.py [--device cuda:0] [--config xtts_v2] [--batch 8]
        [--steps 10] [--no-search | --search NAME ...] [--only NAME ...]
        [--json tests/bench/results/xtts_gpu.json]

One step = forward, backward and an AdamW update of the XTTS v2 GPT (30 layers x 1024,
16 heads) on full-length samples of 490 tokens (32 conditioning latents + 150 text + 308
audio), bf16. Each configuration runs in its own process, the same batch and the same
initial weights:

  torch_eager     torch.autocast(bf16) + F.scaled_dot_product_attention + fused AdamW
  torch_compile   the same module through torch.compile: by default each block, the
                  embedding and the loss ("regional compilation", compiled once for the 30
                  identical blocks); --compile whole compiles the module as one graph
  pyxtts_none     pyxtts bf16, no checkpointing, pyxtts.AdamW
  pyxtts_full     pyxtts bf16, full checkpointing

Reported per configuration: median step time after 2 warm-up steps (the first step's time,
compilation included, as first_step_s), tokens/s, MFU
(model FLOPs 6N + 6·L·d·T per token, causal attention counted once, against the device's
dense bf16 peak), the allocator's peak (torch.cuda.max_memory_allocated /
pyxtts.max_memory_allocated), the process peak RSS, and (unless --no-search) the largest
batch whose step fits, found by real steps (doubling, then bisection; OOM caught).
Ratios are against torch_eager; `speedup_vs_torch` in the JSON is the tokens/s ratio.
The search runs for the configurations `--search` names (default all but torch_compile,
which would recompile for every batch size it tries): torch's by real steps, pyxtts's by
`find_optimal_batch_size` (its memory plan solved for the batch, then one real step at
that size; 2% of the device's memory left as margin).

An existing --json file is merged into, run by run (a configuration run again replaces
its entry), and the ratios are recomputed: configurations can run as separate commands,
each under its own time limit, into one result.

`--device cpu --config tiny --steps 2 --no-search` runs the same code on the CPU, to check the
script itself where no GPU is at hand (torch_compile needs a C++ compiler then).
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
    # name: (ModelConfig kwargs, text_len, audio_len)
    # dropout 0 and no conditioning path: the torch model beside it (torch_xtts.py) has
    # neither (Coqui's recipe, with both, is timed by profile_xtts_gpu.py --recipe,
    # bench_offload_gpu.py and bench_graphs_gpu.py --recipe)
    "xtts_v2": (dict(dropout=0.0, conditioning=False), 150, 308),
    "tiny": (dict(n_layers=2, d_model=128, n_heads=2, text_vocab_size=256, audio_vocab_size=1026,
                  max_text_tokens=48, max_audio_tokens=96, n_cond_latents=8, dropout=0.0,
                  conditioning=False), 40, 80),
}
RUNS = ("torch_eager", "torch_compile", "pyxtts_none", "pyxtts_full")
# dense bf16 tensor-core peak (TFLOP/s) by device name, for MFU
PEAK_TFLOPS = {"H100 SXM": 989.0, "H100 80GB HBM3": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0,
               "H200": 989.0, "A100": 312.0, "L4": 121.0, "RTX 4090": 165.0}


def peak_tflops(name: str) -> float | None:
    for key, v in PEAK_TFLOPS.items():
        if key in name:
            return v
    return None


def model_flops_per_token(cfg, T: int, n_params: int) -> float:
    """6N (matmuls, forward + backward) + causal attention 6·L·d·T (QK^T and PV, halved)."""
    emb = (cfg.text_vocab_size + cfg.audio_vocab_size + cfg.max_text_tokens + cfg.max_audio_tokens) * cfg.d_model
    return 6.0 * (n_params - emb) + 6.0 * cfg.n_layers * cfg.d_model * T


# ---- one configuration, in its own process ------------------------------------------------

def make_batch(cfg, B: int, Lt: int, La: int, seed: int = 0) -> dict:
    import numpy as np

    sys.path.insert(0, str(HERE.parent))
    from helpers import random_batch

    return random_batch(np.random.default_rng(seed), cfg, B, Lt, La, full=True)


def torch_runner(cfg, device: str, compiled: str | None):
    """compiled: None (eager), "regions" (each block, the embedding and the loss) or "whole"."""
    import torch

    sys.path.insert(0, str(HERE))
    import pyxtts
    from torch_xtts import TorchXTTSGPT

    model = TorchXTTSGPT(cfg)
    model.load_pyxtts(pyxtts.XTTSGPT(cfg, seed=0).state_dict())  # the same start as pyxtts
    model = model.to(device)
    fused = device.startswith("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.96), weight_decay=0.01, fused=fused)
    fwd = model
    if compiled == "regions":
        model.compile_regions()
    elif compiled == "whole":
        fwd = torch.compile(model)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"

    def step(batch: dict) -> float:
        t = {k: torch.as_tensor(batch[k]).to(device, non_blocking=True)
             for k in ("text_inputs", "text_targets", "audio_inputs", "audio_targets")}
        cond = torch.as_tensor(batch["cond_latents"]).to(device) if "cond_latents" in batch else None
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev_type, dtype=torch.bfloat16):
            loss = fwd(t["text_inputs"], t["text_targets"], t["audio_inputs"], t["audio_targets"], cond)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss)  # synchronises

    def oom_types():
        return (torch.OutOfMemoryError,) if hasattr(torch, "OutOfMemoryError") else (RuntimeError,)

    def reset():
        if dev_type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    def peak() -> int | None:
        return torch.cuda.max_memory_allocated(device) if dev_type == "cuda" else None

    n_params = sum(p.numel() for p in model.parameters())
    return step, reset, peak, oom_types(), n_params, None  # no plan: the search runs real steps


def pyxtts_runner(cfg, device: str, policy: str):
    import pyxtts

    model = pyxtts.XTTSGPT(cfg, device=device, precision="bf16", checkpointing=policy, seed=0)
    opt = pyxtts.AdamW(model, lr=1e-4, betas=(0.9, 0.96), weight_decay=0.01, grad_clip=1.0)

    def step(batch: dict) -> float:
        opt.zero_grad()
        r = model.forward_backward(batch)
        opt.step()
        pyxtts.synchronize(device)
        return r["loss"]

    def reset():
        model.release_memory()
        pyxtts.empty_cache(device)
        pyxtts.reset_peak_memory_stats(device)

    def peak() -> int:
        return pyxtts.max_memory_allocated(device)

    def largest(Lt: int, La: int) -> int:
        """The product's own answer: the plan solved for the batch (nothing allocated), then
        one real step at that size (find_optimal_batch_size's verify); the margin is 2% of
        the device's memory where torch's search takes it to the last byte."""
        reset()
        cap = None if device.startswith("cuda") else 64  # the CPU's "device" is this machine's RAM
        b = pyxtts.find_optimal_batch_size(model, opt, text_len=Lt, audio_len=La, safety_margin=0.02,
                                           max_batch_size=cap)
        reset()
        return b

    return step, reset, peak, (pyxtts.OutOfMemoryError,), model.num_parameters, largest


def largest_batch(step, reset, ooms, cfg, Lt: int, La: int, start: int, cap: int = 4096) -> int:
    """Largest batch whose real step runs: doubling from `start`, then bisection."""
    def fits(b: int) -> bool:
        reset()
        try:
            step(make_batch(cfg, b, Lt, La, seed=1))
            return True
        except ooms:
            return False
        finally:
            reset()

    if not fits(1):
        return 0
    lo, hi = 1, max(2, start)
    while hi <= cap and fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def worker(name: str, args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(HERE.parent))
    import pyxtts

    kwargs, Lt, La = CONFIGS[args.config]
    cfg = pyxtts.ModelConfig(**kwargs)
    if name.startswith("torch"):
        step, reset, peak, ooms, n_params, largest = torch_runner(
            cfg, args.device, args.compile if name == "torch_compile" else None)
    else:
        step, reset, peak, ooms, n_params, largest = pyxtts_runner(cfg, args.device, name.split("_")[1])
    batch = make_batch(cfg, args.batch, Lt, La)
    T = cfg.n_cond_latents + Lt + La
    reset()
    losses, times = [], []
    for i in range(args.steps + 2):  # 2 warm-up steps (compilation, cuBLAS heuristics, caches)
        t0 = time.perf_counter()
        losses.append(step(batch))
        times.append(time.perf_counter() - t0)
    first_s, times = times[0], times[2:]
    step_s = statistics.median(times)
    tokens = args.batch * T
    out = {"name": name, "config": args.config, "batch": args.batch, "tokens_per_sample": T,
           "parameters": n_params, "first_loss": losses[0], "last_loss": losses[-1],
           "step_s": step_s, "first_step_s": first_s, "step_times_s": times, "tokens_per_s": tokens / step_s,
           "allocator_peak": peak(),
           "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if name == "torch_compile":
        from torch._dynamo.utils import counters

        out["compile"] = args.compile
        out["compile_s"] = first_s - step_s  # what the first step spent compiling
        # graphs, graph breaks and recompiles: two H200 runs of one tree took 60 and 96 ms a
        # step; a recompile or a fallback to eager inside the timed steps would show here
        out["dynamo"] = {k: dict(counters[k]) for k in ("stats", "graph_break", "recompiles") if k in counters}
    flops = model_flops_per_token(cfg, T, n_params) * tokens / step_s
    info = pyxtts.device_info(args.device)
    tf = peak_tflops(info["name"]) if args.device.startswith("cuda") else None
    out["achieved_tflops"] = flops / 1e12
    out["mfu"] = flops / (tf * 1e12) if tf else None
    if not args.no_search and name in args.search:
        out["largest_batch"] = (largest(Lt, La) if largest
                                else largest_batch(step, reset, ooms, cfg, Lt, La, start=args.batch))
    return out


# ---- the driver -----------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--config", default="xtts_v2", choices=tuple(CONFIGS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--no-search", action="store_true", help="skip the largest-batch search")
    ap.add_argument("--search", nargs="+", choices=RUNS, default=[r for r in RUNS if r != "torch_compile"],
                    help="the configurations whose largest batch is searched")
    ap.add_argument("--only", nargs="+", choices=RUNS, help="run only these configurations")
    ap.add_argument("--compile", choices=("regions", "whole"), default="regions",
                    help="torch_compile: each block, the embedding and the loss (default), or the "
                         "whole module")
    ap.add_argument("--json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    command = "python tests/bench/bench_xtts_gpu.py " + " ".join(sys.argv[1:])
    runs = []
    for name in args.only or RUNS:
        cmd = [sys.executable, __file__, "--worker", name, "--device", args.device, "--config", args.config,
               "--batch", str(args.batch), "--steps", str(args.steps), "--compile", args.compile,
               "--search", *args.search]
        cmd += ["--no-search"] if args.no_search else []
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            runs.append({"name": name, "error": res.stderr.strip().splitlines()[-1:] or ["failed"]})
            print(f"{name}: failed: {res.stderr[-2000:]}", file=sys.stderr)
            continue
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    if args.json and Path(args.json).exists():  # merge: earlier runs of other configurations stay
        done = {r["name"] for r in runs}
        old = json.loads(Path(args.json).read_text()).get("runs", [])
        runs = [r for r in old if r["name"] not in done] + runs
        runs.sort(key=lambda r: RUNS.index(r["name"]) if r["name"] in RUNS else len(RUNS))
    base = next((r for r in runs if r["name"] == "torch_eager" and "error" not in r), None)
    for r in runs:
        if base is not None and "error" not in r:
            r["speedup_vs_torch"] = r["tokens_per_s"] / base["tokens_per_s"]
            if r.get("allocator_peak") and base.get("allocator_peak"):
                r["peak_vs_torch"] = r["allocator_peak"] / base["allocator_peak"]
            if r.get("largest_batch") is not None and base.get("largest_batch"):
                r["largest_batch_vs_torch"] = r["largest_batch"] / base["largest_batch"]
    sys.path.insert(0, str(HERE))
    from bench_env import environment

    env = environment(args.device)
    print(f"# {command}\n# {env['device']['name']}, driver {env.get('driver')}, torch {env.get('torch')}, "
          f"pyxtts {env['pyxtts']}")
    print(f"{'run':14} {'step':>9} {'tok/s':>10} {'vs eager':>9} {'MFU':>6} {'alloc peak':>11} {'vs eager':>9} "
          f"{'peak RSS':>9} {'max batch':>9}")
    gib = 2**30
    for r in runs:
        if "error" in r:
            print(f"{r['name']:14} failed: {r['error'][0]}")
            continue
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
        ap_ = f"{r['allocator_peak'] / gib:.2f}G" if r.get("allocator_peak") else "-"
        print(f"{r['name']:14} {r['step_s'] * 1e3:>7.1f}ms {r['tokens_per_s']:>10,.0f} "
              f"{r.get('speedup_vs_torch', float('nan')):>8.2f}x {mfu:>6} {ap_:>11} "
              f"{r.get('peak_vs_torch', float('nan')):>8.2f}x {r['peak_rss'] / gib:>8.2f}G "
              f"{r.get('largest_batch', '-')!s:>9}")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "environment": env, "runs": runs,
                                               "date": time.strftime("%Y-%m-%d")}, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

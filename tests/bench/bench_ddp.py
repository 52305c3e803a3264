"""Data-parallel scaling of the XTTS v2 step (``pyxtts.distributed.DataParallel``):
tokens/s on N processes against N x one process's, the all-reduce's time against the step,
and world size 1 over NCCL against the single-process step, bit for bit.

    python tests/bench/bench_ddp.py [--gpus 1,2,4,8] [--device cuda] [--config xtts_v2]
        [--batch 8] [--steps 5] [--json tests/bench/results/ddp_gpu.json]

For each N in --gpus it starts ``torchrun --standalone --nproc_per_node=N`` on this file
(child mode) and collects rank 0's line:

  step_s        median seconds of one optimizer step (N x --batch rows, one micro-batch per
                process), after a warm-up step
  tokens_per_s  the global batch's valid targets per second
  step_s_no_overlap  the same with one all-reduce after the backward (bucket_bytes=0)
                instead of buckets launched during it
  allreduce_s   median seconds of the flat fp32 gradients' all-reduce alone
  efficiency    tokens_per_s(N) / (N x tokens_per_s(1)); the goal on one node is >= 0.90
  same_bits     (N = 1 only) the DataParallel step's parameters equal the SingleProcess
                step's, bit for bit (the NCCL path and its DLPack hand-off change nothing)
  comm_estimate_bytes   the plan's communication line for this world (pyxtts.comm_memory:
                NCCL's upper bound, gloo's scratch; 0 for one process), and by part
  comm_measured_bytes   per rank, on a GPU: the device memory the first gradient all-reduce
                took (torch.cuda.mem_get_info before the process group's first collective,
                less after it, less what pyxtts's own allocator reserved in between):
                NCCL's communicator, channels and buffers, and torch's small-pool segment
  comm_after_step_bytes per rank, the same after the warm-up step (its scalar collectives
                may connect NCCL's tree as well); the estimate must not be below either

The model is the XTTS v2 GPT with its conditioning path, bf16, checkpointing "full", at
32 + 200 + 252 positions with 517-frame reference mels (Coqui's max_text_length 200).
``--device cpu --config tiny --gpus 1,2`` runs the same code with gloo on the CPU to check
the script itself (tests/test_distributed.py does).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {"xtts_v2": ({}, 200, 252, 517),
           "tiny": (dict(n_layers=2, d_model=64, n_heads=4, text_vocab_size=120, audio_vocab_size=66,
                         max_text_tokens=32, max_audio_tokens=48, n_cond_latents=4, max_cond_frames=40), 20, 30, 40)}


def child(a: argparse.Namespace) -> None:
    import numpy as np

    import pyxtts
    from pyxtts.batch import _synthetic_batch, train_step_with_accumulation
    from pyxtts.distributed import DEFAULT_BUCKET_BYTES, DataParallel

    kwargs, lt, la, frames = CONFIGS[a.config]
    cfg = pyxtts.ModelConfig(**kwargs)
    local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{local_rank}" if a.device == "cuda" else "cpu"
    dp = DataParallel(device, timeout_s=300)
    precision = "bf16" if device != "cpu" else "fp32"
    model = pyxtts.XTTSGPT(cfg, device=device, precision=precision, checkpointing="full", seed=0)
    opt = pyxtts.AdamW(model, lr=1e-5)
    batch = _synthetic_batch(cfg, a.batch, lt, la, cfg.n_cond_latents, frames)
    lo = dp.rank * a.batch
    comm = dp.communication()  # None for one process: the product runs no NCCL then
    if comm is None and device != "cpu":  # this bench does: what one process alone takes
        from pyxtts.comm_memory import nccl_plan
        comm = nccl_plan(1, 1)
    memory = _CommMemory(device)  # before the process group's first collective
    dp.all_reduce_grads(model)  # the first collective: the fresh model's zero gradients, still zero
    pyxtts.synchronize(device)
    memory.mark("after_allreduce")

    def sync() -> None:
        pyxtts.synchronize(device)

    def one_step():
        return train_step_with_accumulation(model, opt, batch, 1, strategy=dp, first_row=lo)

    first = model.state_dict() if dp.world_size == 1 else None
    r = one_step()  # warm-up: the arena and the optimizer's first step
    pyxtts.synchronize(device)
    memory.mark("after_step")
    same = None
    if first is not None:  # world size 1: the same step without the strategy, from the same start
        after = model.state_dict()
        ref = pyxtts.XTTSGPT(cfg, device=device, precision=precision, checkpointing="full", seed=0)
        ref_opt = pyxtts.AdamW(ref, lr=1e-5)
        train_step_with_accumulation(ref, ref_opt, batch, 1)
        same = all(np.array_equal(after[k].view(np.uint8), v.view(np.uint8)) for k, v in ref.state_dict().items())
        del ref, ref_opt
    def timed_steps() -> list[float]:
        nonlocal r
        times = []
        for _ in range(a.steps):
            sync()
            t0 = time.perf_counter()
            r = one_step()
            sync()
            times.append(time.perf_counter() - t0)
        return times

    times = timed_steps()  # the all-reduce in buckets, overlapping the backward
    dp.bucket_bytes = 0
    serial = timed_steps()  # one all-reduce after the backward
    dp.bucket_bytes = DEFAULT_BUCKET_BYTES
    reduce_times = []
    for _ in range(a.steps):
        sync()
        t0 = time.perf_counter()
        dp.all_reduce_grads(model)
        sync()
        reduce_times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    out = {"world_size": dp.world_size, "device": pyxtts.device_info(device)["name"], "config": a.config,
           "rows_per_process": a.batch, "step_s": step_s, "tokens_per_s": (r.text_tokens + r.audio_tokens) / step_s,
           "step_s_no_overlap": statistics.median(serial),
           "allreduce_s": statistics.median(reduce_times), "gradient_bytes": int(model.flat_gradients().nbytes),
           "same_bits": same, "comm_backend": "gloo" if device == "cpu" else "nccl",
           "comm_estimate_bytes": 0 if comm is None else comm.total,
           "comm_estimate_parts": {} if comm is None else dict(comm.parts)}
    every = dp.gather(memory.figures())  # every rank's own device
    if device != "cpu":
        out["comm_measured_bytes"] = [m["after_allreduce"] for m in every]
        out["comm_after_step_bytes"] = [m["after_step"] for m in every]
        out["comm_memory_raw"] = every
    else:  # host memory is not measured: gloo's 2 MiB scratch lives and dies inside each call
        out["comm_measured_bytes"] = out["comm_after_step_bytes"] = None
    if dp.is_main:
        print("BENCH_DDP " + json.dumps(out), flush=True)
    dp.close()


class _CommMemory:
    """Device memory taken outside pyxtts's allocator since construction, at marked points:
    the free memory's drop (torch.cuda.mem_get_info) less the growth of what pyxtts's
    allocator reserved. On the CPU nothing is measured."""

    def __init__(self, device: str) -> None:
        self.device, self.marks = device, {}
        self.start = self._now() if device != "cpu" else None

    def _now(self) -> tuple[int, int]:
        import torch

        import pyxtts

        free, _ = torch.cuda.mem_get_info(torch.device(self.device))
        return int(free), int(pyxtts.memory_stats(self.device)["reserved_bytes"])

    def mark(self, name: str) -> None:
        if self.start is None:
            return
        free, reserved = self._now()
        self.marks[name] = {"free": free, "pyxtts_reserved": reserved}

    def figures(self) -> dict:
        if self.start is None:
            return {}
        free0, reserved0 = self.start
        out: dict = {"free_before": free0, "pyxtts_reserved_before": reserved0}
        for name, m in self.marks.items():
            out[name] = (free0 - m["free"]) - (m["pyxtts_reserved"] - reserved0)
            out[f"{name}_raw"] = m
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="1,2", help="world sizes to run, comma-separated")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--config", choices=CONFIGS, default="xtts_v2")
    ap.add_argument("--batch", type=int, default=8, help="rows per process and step")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per world size")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return 0
    runs = []
    for n in [int(v) for v in a.gpus.split(",")]:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", __file__,
               "--child", "--device", a.device, "--config", a.config, "--batch", str(a.batch), "--steps",
               str(a.steps)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("BENCH_DDP ")), None)
        if p.returncode != 0 or line is None:
            print(f"world size {n}: exit {p.returncode}\n{p.stderr[-3000:]}", file=sys.stderr)
            runs.append({"world_size": n, "error": p.stderr[-1000:]})
            continue
        runs.append(json.loads(line[len("BENCH_DDP "):]))
    one = next((r for r in runs if r.get("world_size") == 1 and "error" not in r), None)
    for r in runs:
        if "error" in r:
            continue
        if one is not None:
            r["efficiency"] = r["tokens_per_s"] / (r["world_size"] * one["tokens_per_s"])
        eff = f"{r['efficiency']:.3f}" if "efficiency" in r else "n/a"
        print(f"N={r['world_size']}: step {r['step_s'] * 1e3:.1f} ms, {r['tokens_per_s']:.0f} tokens/s, "
              f"all-reduce {r['allreduce_s'] * 1e3:.1f} ms of {r['gradient_bytes'] / 2**20:.0f} MiB "
              f"({r['allreduce_s'] / r['step_s']:.1%} of the step), {r['step_s_no_overlap'] * 1e3:.1f} ms without "
              f"overlap, efficiency {eff}"
              + ("" if r["same_bits"] is None else f", same bits as one process: {r['same_bits']}")
              + _comm_summary(r))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "runs": runs}, indent=1) + "\n")
    return 0 if all("error" not in r for r in runs) else 1


def _comm_summary(r: dict) -> str:
    """", NCCL memory: measured X after the all-reduce (Y after a step), estimated Z"."""
    est = r.get("comm_estimate_bytes", 0) / 2**20
    if r.get("comm_measured_bytes") is None:
        return f", {r.get('comm_backend', 'gloo')} memory estimated {est:.0f} MiB (not measured on the CPU)"
    got, step = max(r["comm_measured_bytes"]) / 2**20, max(r["comm_after_step_bytes"]) / 2**20
    verdict = "within" if max(got, step) <= est else "OVER"
    return (f", NCCL memory measured {got:.0f} MiB after the first all-reduce ({step:.0f} MiB after a step; the "
            f"most of any rank), estimated {est:.0f} MiB: {verdict} the estimate")


if __name__ == "__main__":
    sys.exit(main())

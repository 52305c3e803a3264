"""The optimizer step with its state in host memory, measured on this machine: pyxtts's
host AdamW over XTTS v2's 441 M parameters against torch's CPU AdamW (fused, and
foreach), with the machine's copy bandwidth as the limit.

    python tests/bench/bench_offload.py [--json out.json] [--repeat R] [--only NAME ...]
                                        [--layers L]

Every run has its own process (its peak RSS is its own), the same tensors (XTTS v2's
layout: 30 GPT-2 blocks of d = 1024, the heads, the conditioning encoder and perceiver;
--layers L fewer blocks where memory is short) and gradients of N(0, 1) noise. A step's
time is the median of R (default 5) after one warm-up step.

Runs:
  copy            the machine's copy bandwidth: numpy copies of 1 GiB, on 1 thread and on
                  every core at once; bytes read + written per second
  pyxtts_offload  AdamW(state_device="cpu") over a bf16 model on the CPU: the whole
                  offloaded step as a CPU-only build runs it (the gradients' norm, the
                  gradients copied into staging, the update of the fp32 master and both
                  moments, the bf16 parameters written back through staging), where a GPU
                  run's copy engine does the copies
  pyxtts_update   AdamW over a bf16 model on the CPU, its state beside it: the host's share
                  of an offloaded step in a GPU run (the update, reading the gradients and
                  writing the bf16 parameters) plus the norm's pass the GPU would do there
  pyxtts_plain    AdamW over an fp32 model on the CPU: the CPU backend's update in place
                  (the parameters are the master), no staging
  torch_fused     torch.optim.AdamW(fused=True) over fp32 parameters
  torch_foreach   torch.optim.AdamW(foreach=True)

Bytes per parameter the update must move (the GB/s figures): gradients read (4), moments
and master read and written (24), and the parameters written: 2 (bf16, offload) or, in
place in fp32, counted in the master's 8. torch's fp32 AdamW moves 28 (parameters,
gradients, moments). Staging copies and the norm's pass over the gradients are work on
top, in the time but not in the bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = ("copy", "pyxtts_offload", "pyxtts_update", "pyxtts_plain", "torch_fused", "torch_foreach")
BYTES_PER_PARAM = {"pyxtts_offload": 30, "pyxtts_update": 30, "pyxtts_plain": 28, "torch_fused": 28,
                   "torch_foreach": 28}
HYPER = dict(lr=5e-6, betas=(0.9, 0.96), eps=1e-8, weight_decay=1e-2)


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed(step, repeat: int) -> tuple[float, list[float]]:
    step()  # warm-up: first touches, thread pools
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def model_config(layers: int):
    import pyxtts

    return pyxtts.ModelConfig(n_layers=layers)


def run_copy(repeat: int) -> dict:
    import concurrent.futures

    import numpy as np

    n = 1 << 28  # 1 GiB of float32
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)
    one, _ = timed(lambda: np.copyto(dst, src), repeat)
    cores = os.cpu_count() or 1
    parts = [(i * n // cores, (i + 1) * n // cores) for i in range(cores)]
    with concurrent.futures.ThreadPoolExecutor(cores) as pool:  # numpy releases the GIL to copy
        def all_cores() -> None:
            list(pool.map(lambda p: np.copyto(dst[p[0]:p[1]], src[p[0]:p[1]]), parts))
        every, _ = timed(all_cores, repeat)
    moved = 2 * src.nbytes
    return {"bytes": moved, "one_thread_GBps": moved / one / 1e9, "all_cores_GBps": moved / every / 1e9,
            "threads": cores, "GBps": max(moved / one, moved / every) / 1e9}


def run_pyxtts(kind: str, layers: int, repeat: int) -> dict:
    import numpy as np

    import pyxtts

    precision = "fp32" if kind == "pyxtts_plain" else "bf16"
    model = pyxtts.XTTSGPT(model_config(layers), precision=precision, seed=0)
    opt = pyxtts.AdamW(model, grad_clip=1.0, **HYPER,
                       state_device="cpu" if kind == "pyxtts_offload" else None)
    rng = np.random.default_rng(0)
    for g in model.gradients().values():
        g.copy_(rng.standard_normal(g.shape, dtype=np.float32))
    median, times = timed(opt.step, repeat)
    return {"params": model.num_parameters, "step_s": median, "times": times,
            "host_state_bytes": opt.host_state_bytes, "state_bytes": opt.state_bytes,
            "threads": int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))}


def run_torch(kind: str, layers: int, repeat: int) -> dict:
    import numpy as np
    import torch

    import pyxtts

    torch.set_num_threads(os.cpu_count() or 1)
    # the same tensors: the shapes of the pyxtts model's layout, without building it
    shapes = [tuple(t.shape) for t in pyxtts.XTTSGPT(model_config(layers), seed=0).parameters().values()]
    rng = np.random.default_rng(0)
    params = [torch.nn.Parameter(torch.from_numpy(rng.standard_normal(s, dtype=np.float32) * 0.02))
              for s in shapes]
    for p in params:
        p.grad = torch.from_numpy(rng.standard_normal(p.shape, dtype=np.float32))
    opt = torch.optim.AdamW(params, **HYPER, **({"fused": True} if kind == "torch_fused" else {"foreach": True}))

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)  # as pyxtts's: norm, clip
        opt.step()

    median, times = timed(step, repeat)
    return {"params": sum(p.numel() for p in params), "step_s": median, "times": times,
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def child(name: str, layers: int, repeat: int) -> dict:
    if name == "copy":
        out = run_copy(repeat)
    elif name.startswith("pyxtts"):
        out = run_pyxtts(name, layers, repeat)
    else:
        out = run_torch(name, layers, repeat)
    out["peak_rss_bytes"] = peak_rss()
    if "params" in out:
        out["params_per_s"] = out["params"] / out["step_s"]
        out["GBps"] = out["params"] * BYTES_PER_PARAM[name] / out["step_s"] / 1e9
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=30, help="GPT-2 blocks (XTTS v2: 30)")
    ap.add_argument("--only", nargs="*", choices=RUNS, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.layers, a.repeat)))
        return 0
    results = {}
    for name in a.only or RUNS:
        r = subprocess.run([sys.executable, __file__, "--child", name, "--layers", str(a.layers),
                            "--repeat", str(a.repeat)], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{name}: failed\n{r.stderr}", file=sys.stderr)
            return 1
        results[name] = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'times'})}", flush=True)
    limit = results.get("copy", {}).get("GBps")
    lines = [f"{'run':16}{'step s':>10}{'M params/s':>12}{'GB/s':>8}{'of copy':>9}{'peak RSS GiB':>14}"]
    for name, r in results.items():
        if name == "copy":
            continue
        share = f"{r['GBps'] / limit:.0%}" if limit else "-"
        lines.append(f"{name:16}{r['step_s']:10.3f}{r['params_per_s'] / 1e6:12.1f}{r['GBps']:8.2f}{share:>9}"
                     f"{r['peak_rss_bytes'] / 2**30:14.2f}")
    if limit:
        c = results["copy"]
        lines.append(f"copy bandwidth: {c['one_thread_GBps']:.2f} GB/s on 1 thread, {c['all_cores_GBps']:.2f} GB/s "
                     f"on {c['threads']} (read + written)")
    for mine in ("pyxtts_offload", "pyxtts_update"):
        for base in ("torch_fused", "torch_foreach"):
            if base in results and mine in results:
                lines.append(f"{mine} / {base}: {results[base]['step_s'] / results[mine]['step_s']:.2f}x the speed")
    print("\n".join(lines))
    if a.json:
        import pyxtts

        meta = {"machine": pyxtts.device_info("cpu")["name"], "cores": os.cpu_count(),
                "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
                "command": " ".join([Path(sys.executable).name, *sys.argv])}
        Path(a.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

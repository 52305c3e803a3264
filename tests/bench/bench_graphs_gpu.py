"""CUDA graphs of the XTTS v2 step (`XTTSGPT.cuda_graphs`) against the step as it comes,
at the small batches 4-12 GB cards run.

    python tests/bench/bench_graphs_gpu.py [--device cuda:0] [--config xtts_v2] [--recipe]
        [--batches 1 3 8] [--steps 8] [--json tests/bench/results/graphs_gpu.json]

One process, one model (the XTTS v2 GPT, bf16, no recomputation; 490 positions a sample:
32 conditioning latents + 150 text + 308 audio). `--recipe`: Coqui's recipe instead,
dropout 0.1 and the conditioning path from 517-frame mels (32 + 200 + 252 positions).
Per batch size, forward + backward (no optimizer: the step's launches are what graphs
change), the gradients zeroed before each:

  eager_s     median step time without graphs, after 2 warm-up steps
  record_s    the first step with graphs (it records the forward and the backward)
  graphs_s    median step time replaying them
  speedup     eager_s / graphs_s
  bits_equal  the losses of the two runs, step by step with the same dropout steps, equal
              bit for bit (a replay launches the same kernels with the same arguments)
  graph_bytes device memory the recorded graphs hold (torch.cuda.mem_get_info before and
              after recording; not part of pyxtts's plan), or null without torch
  stats       XTTSGPT.graph_stats after the run

`--device cpu --config tiny` checks the script where no GPU is at hand: the CPU backend
has no graphs, so it reports the error the switch raises and times the eager step only.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# the step's model and batch as bench_xtts_gpu.py times it, and Coqui's recipe as
# bench_offload_gpu.py does: (ModelConfig kwargs, text_len, audio_len[, mel frames])
from bench_offload_gpu import CONFIGS as RECIPE  # noqa: E402
from bench_xtts_gpu import CONFIGS  # noqa: E402


def free_bytes(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    try:
        import torch
    except ImportError:
        return None
    return int(torch.cuda.mem_get_info(int(device.split(":")[1]))[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--config", choices=CONFIGS, default="xtts_v2")
    ap.add_argument("--recipe", action="store_true", help="dropout 0.1 and the conditioning path")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 3, 8])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import pyxtts
    from bench_env import environment
    from pyxtts.batch import _synthetic_batch

    kwargs, Lt, La, S = RECIPE[a.config] if a.recipe else (*CONFIGS[a.config], 0)
    cfg = pyxtts.ModelConfig(**kwargs)
    dev = a.device
    model = pyxtts.XTTSGPT(cfg, device=dev, precision="bf16", checkpointing="none", seed=0,
                           cuda_graphs=False)
    positions = cfg.n_cond_latents + Lt + La
    out: dict = {"command": " ".join(sys.argv), "environment": environment(dev), "config": a.config,
                 "recipe": a.recipe, "positions": positions, "cond_frames": S, "runs": []}

    def step(batch: dict, k: int) -> float:
        model.zero_grad()
        return model.forward_backward(batch, dropout_step=k, keep_larger_arena=True)["loss"]

    def timed(batch: dict, first: int) -> tuple[list[float], list[float]]:
        times, losses = [], []
        for k in range(a.steps):
            t0 = time.perf_counter()
            losses.append(step(batch, first + k))
            pyxtts.synchronize(dev)
            times.append(time.perf_counter() - t0)
        return times, losses

    for B in sorted(a.batches, reverse=True):  # the largest first: one arena serves all
        batch = _synthetic_batch(cfg, B, Lt, La, 0 if S else cfg.n_cond_latents, S)
        model.cuda_graphs = False
        for k in range(2):
            step(batch, 1000 + k)
        eager, eager_losses = timed(batch, 0)
        run: dict = {"batch": B, "eager_s": statistics.median(eager)}
        try:
            model.cuda_graphs = True
        except ValueError as e:  # the CPU backend: no graphs
            run["error"] = str(e)
            out["runs"].append(run)
            print(f"B={B}: eager {run['eager_s'] * 1e3:.2f} ms; graphs: {e}", flush=True)
            continue
        free0 = free_bytes(dev)
        t0 = time.perf_counter()
        step(batch, 2000)
        pyxtts.synchronize(dev)
        run["record_s"] = time.perf_counter() - t0
        free1 = free_bytes(dev)
        graphs, graph_losses = timed(batch, 0)
        run["graphs_s"] = statistics.median(graphs)
        run["speedup"] = run["eager_s"] / run["graphs_s"]
        run["tokens_per_s_eager"] = B * positions / run["eager_s"]
        run["tokens_per_s_graphs"] = B * positions / run["graphs_s"]
        run["bits_equal"] = graph_losses == eager_losses
        run["graph_bytes"] = None if free0 is None or free1 is None else free0 - free1
        run["stats"] = model.graph_stats
        out["runs"].append(run)
        print(f"B={B}: eager {run['eager_s'] * 1e3:.2f} ms, graphs {run['graphs_s'] * 1e3:.2f} ms "
              f"({run['speedup']:.3f}x), first {run['record_s'] * 1e3:.1f} ms, losses equal "
              f"{run['bits_equal']}, graphs hold {run['graph_bytes']} B, {run['stats']}", flush=True)
    if a.json:
        p = Path(a.json)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(out, indent=1) + "\n")
    ok = all(r.get("bits_equal", True) and not r.get("stats", {}).get("failed") for r in out["runs"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

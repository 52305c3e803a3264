"""Every memory plan against the allocator's count, over random model shapes.

    python tests/bench/bench_plan_exact.py --cases 300 --seed 1 [--d-max 1024] [--json OUT]

Each case runs in a fresh process (empty allocators, as a training run starts): a random
XTTS-shaped GPT (1-4 layers, d_model a multiple of 64 up to --d-max, random vocabularies
and sequence limits, with and without the conditioning path, fp32/bf16/fp16), an AdamW on
the CPU allocator or offloaded to the host pool (with and without an EMA, several
offload_chunk values), then one forward and backward. It compares, to the byte:

  state_bytes         AdamW's device state against what the CPU allocator grew by
  host_state_bytes    its host-pool state against what the host pool grew by
  estimate total      model.estimate_memory(...).total against the step's peak
  estimate host       its host_total against the host pool
  config total/host   pyxtts.estimate_memory(config, optimizer=True) (made before the
                      model exists; default AdamW cases only) against the same

and prints, per comparison, how many cases differ and by how much, either way. The
shapes are drawn from --seed, so a run can be repeated. tests/test_memory_plan.py keeps a
fixed set of such cases in the suite.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys

COMPARISONS = ("state_bytes", "host_state_bytes", "estimate total", "estimate host", "config total", "config host")


def draw(rng: random.Random, d_max: int) -> dict:
    """One random case."""
    d = 64 * rng.randint(1, d_max // 64)
    heads = rng.choice([h for h in (1, 2, 4, 8, 16) if d % h == 0 and d // h >= 16])
    model = dict(n_layers=rng.randint(1, 4), d_model=d, n_heads=heads,
                 text_vocab_size=rng.choice([64, 300, 6681, rng.randint(10, 8000)]),
                 audio_vocab_size=rng.choice([200, 1026, rng.randint(10, 2000)]),
                 max_text_tokens=rng.choice([32, 64, 404]), max_audio_tokens=rng.choice([64, 128, 608]),
                 n_cond_latents=rng.choice([0, 8, 32]), dropout=0.0, conditioning=rng.random() < 0.3)
    if model["conditioning"] and not model["n_cond_latents"]:
        model["n_cond_latents"] = 8
    return dict(model=model, precision=rng.choice(["fp32", "bf16", "fp16"]), offload=rng.random() < 0.5,
                ema=rng.choice([None, 0.99]), chunk=rng.choice([None, 1000, 1 << 16, 1 << 20, 3 << 20]))


def child(case: dict) -> dict:
    """Runs one case in this (fresh) process: (planned, counted) per comparison."""
    import numpy as np

    import pyxtts

    cfg = pyxtts.ModelConfig(**case["model"])
    prec, offload = case["precision"], case["offload"]
    B, Lt, La = 2, min(16, cfg.max_text_tokens), min(24, cfg.max_audio_tokens)
    default = case["ema"] is None and case["chunk"] is None
    pre = pyxtts.estimate_memory(cfg, B, Lt, La, optimizer=True, precision=prec, offload=offload)
    d0, h0 = pyxtts.memory_allocated("cpu"), pyxtts.memory_allocated("host")
    model = pyxtts.XTTSGPT(cfg, device="cpu", precision=prec, seed=0)
    d1 = pyxtts.memory_allocated("cpu")
    kw: dict = dict(lr=1e-4, ema_decay=case["ema"])
    if offload:
        kw.update(state_device="cpu", offload_chunk=case["chunk"])
    if prec == "fp16":
        kw["loss_scale"] = 1024.0
    opt = pyxtts.AdamW(model, **kw)
    out = {"state_bytes": (opt.state_bytes, pyxtts.memory_allocated("cpu") - d1),
           "host_state_bytes": (opt.host_state_bytes, pyxtts.memory_allocated("host") - h0)}
    plan = model.estimate_memory(B, Lt, La)
    rng = np.random.default_rng(case["seed"])
    batch = {"text_inputs": rng.integers(0, cfg.text_vocab_size, (B, Lt)),
             "text_targets": rng.integers(0, cfg.text_vocab_size, (B, Lt)),
             "audio_inputs": rng.integers(0, cfg.audio_vocab_size, (B, La)),
             "audio_targets": rng.integers(0, cfg.audio_vocab_size, (B, La)),
             "text_lengths": np.full(B, Lt), "audio_lengths": np.full(B, La)}
    if cfg.n_cond_latents:
        batch["cond_latents"] = rng.standard_normal((B, cfg.n_cond_latents, cfg.d_model)).astype(np.float32)
    pyxtts.reset_peak_memory_stats("cpu")
    model.forward_backward(batch)
    peak, host = pyxtts.max_memory_allocated("cpu") - d0, pyxtts.memory_allocated("host") - h0
    out["estimate total"] = (plan.total, peak)
    out["estimate host"] = (plan.host_total, host)
    if default:
        out["config total"] = (pre.total, peak)
        out["config host"] = (pre.host_total, host)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--d-max", type=int, default=1024)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    rng = random.Random(a.seed)
    rows = []
    for i in range(a.cases):
        case = {**draw(rng, a.d_max), "seed": rng.randrange(2**32)}
        r = subprocess.run([sys.executable, __file__, "--child", json.dumps(case)], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"case {i} failed: {case}\n{r.stderr[-2000:]}", file=sys.stderr)
            return 1
        rows.append({"case": case, **json.loads(r.stdout.strip().splitlines()[-1])})
    summary = {}
    for what in COMPARISONS:
        diffs = [r[what][0] - r[what][1] for r in rows if what in r]
        over, under = [x for x in diffs if x > 0], [-x for x in diffs if x < 0]
        summary[what] = dict(cases=len(diffs), differ=len(over) + len(under), plan_above=len(over),
                             max_above=max(over, default=0), plan_below=len(under), max_below=max(under, default=0))
        s = summary[what]
        print(f"{what:18s} {s['cases']:4d} cases, {s['differ']:3d} differ: plan above {s['plan_above']} "
              f"(up to {s['max_above']:,} B), below {s['plan_below']} (up to {s['max_below']:,} B)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "summary": summary, "cases": rows}, f, indent=1)
    return 0 if all(s["differ"] == 0 for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

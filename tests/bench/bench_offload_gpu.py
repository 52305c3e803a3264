"""What offloading the optimizer's state costs on a GPU, at XTTS v2 size: the extra time
of an optimizer step, its share of a whole optimizer cycle at Coqui's accumulation (84
micro-batches of 3) and at accumulation 1, the device's peak, and the offloaded step's
bits against the on-device step's.

    python tests/bench/bench_offload_gpu.py [--device cuda:0] [--config xtts_v2] [--steps 5]
        [--json tests/bench/results/offload_gpu.json]

One process, one model (the XTTS v2 GPT with its conditioning path and dropout 0.1, bf16,
full recomputation: the 4 GB tier's settings) and two AdamW over it in turn, on the device
(`state_device=None`) and offloaded (`state_device="cpu"`), each from the same weights and
gradients:
  micro_s        one micro-batch of 3 samples (forward + backward) at 32 + 200 + 252
                 positions with 517-frame reference mels (Coqui's max_text_length 200)
  step_s         the optimizer step alone, each placement, median of --steps (after a warm-up)
  cycle          84 micro-batches and one step: (step_off - step_dev) / (84 micro + step_dev)
                 and the same at accumulation 1
  bits           3 optimizer steps (2 accumulated micro-batches each) with each placement
                 from the same weights: parameters, gradients, moments, master by their bits
  peak           the allocator's peak of a micro-batch + step with each placement
  host_update_s  the same AdamW step on a model of the same size in host memory (the CPU
                 backend's kernel on all cores, no copy): the offloaded step's floor.
                 copies_exposed_s = offload step_s - host_update_s is the copies' time that
                 the update does not hide (docs/offload.md: why the copies do not overlap
                 the backward)

`--device cpu --config tiny` runs the same code on the CPU to check the script itself.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

CONFIGS = {"xtts_v2": ({}, 200, 252, 517),
           "tiny": (dict(n_layers=2, d_model=64, n_heads=4, text_vocab_size=120, audio_vocab_size=66,
                         max_text_tokens=32, max_audio_tokens=48, n_cond_latents=4, max_cond_frames=40), 20, 30, 40)}
MICRO, ACCUM = 3, 84


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--config", choices=CONFIGS, default="xtts_v2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import pyxtts
    from pyxtts.batch import _synthetic_batch

    kwargs, Lt, La, S = CONFIGS[a.config]
    cfg = pyxtts.ModelConfig(**kwargs)
    dev = a.device
    model = pyxtts.XTTSGPT(cfg, device=dev, precision="bf16", checkpointing="full", seed=0)
    start = model.state_dict()
    batch = _synthetic_batch(cfg, MICRO, Lt, La, cfg.n_cond_latents, S)

    def sync() -> None:
        pyxtts.synchronize(dev)

    def timed(fn, n: int) -> float:
        fn()
        sync()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    micro_s = timed(lambda: model.forward_backward(batch), a.steps)
    out: dict = {"device": pyxtts.device_info(dev)["name"], "config": a.config, "micro_batch": MICRO,
                 "positions": cfg.n_cond_latents + Lt + La, "cond_frames": S, "micro_s": micro_s,
                 "parameters": model.num_parameters}
    runs = {}
    for name, place in (("device", None), ("offload", "cpu")):
        model.load_state_dict(start)
        model.zero_grad()
        pyxtts.reset_peak_memory_stats(dev)
        opt = pyxtts.AdamW(model, lr=5e-6, betas=(0.9, 0.96), eps=1e-8, weight_decay=1e-2, grad_clip=None,
                           state_device=place)
        model.forward_backward(batch)
        step_s = timed(opt.step, a.steps)
        runs[name] = {"step_s": step_s, "peak_bytes": pyxtts.max_memory_allocated(dev),
                      "state_bytes": opt.state_bytes, "host_state_bytes": opt.host_state_bytes}
        del opt
    extra = runs["offload"]["step_s"] - runs["device"]["step_s"]
    if dev != "cpu":  # the host's update alone, on a twin in host memory (no copies)
        twin = pyxtts.XTTSGPT(cfg, device="cpu", precision="bf16", checkpointing="full", seed=0)
        opt = pyxtts.AdamW(twin, lr=5e-6, betas=(0.9, 0.96), eps=1e-8, weight_decay=1e-2, grad_clip=None)
        host_update_s = timed(opt.step, a.steps)
        del opt, twin
        out.update(host_update_s=host_update_s, copies_exposed_s=runs["offload"]["step_s"] - host_update_s)
    out.update(runs=runs, extra_step_s=extra,
               overhead_accum_84=extra / (ACCUM * micro_s + runs["device"]["step_s"]),
               overhead_accum_1=extra / (micro_s + runs["device"]["step_s"]))

    # the bits: 3 steps of 2 accumulated micro-batches from the same weights, each placement
    rng = np.random.default_rng(0)
    batches = [_synthetic_batch(cfg, 2, Lt, La, cfg.n_cond_latents, S) for _ in range(3)]
    for b in batches:  # distinct batches: the synthetic one's ids reshuffled
        for k in ("text_inputs", "audio_inputs"):
            b[k] = rng.permutation(b[k], axis=1)
    states = []
    for place in (None, "cpu"):
        model.load_state_dict(start)
        model.dropout_step = 0
        opt = pyxtts.AdamW(model, lr=1e-4, weight_decay=1e-2, grad_clip=1.0, state_device=place)
        for b in batches:
            pyxtts.train_step_with_accumulation(model, opt, b, 2)
        s = {f"p.{k}": v for k, v in model.state_dict().items()}
        s.update({f"o.{k}": v for k, v in opt.state_dict().items() if isinstance(v, np.ndarray)})
        states.append(s)
        del opt
    differ = [k for k in states[0] if states[0][k].tobytes() != states[1][k].tobytes()]
    out["bits_equal"] = not differ
    out["bits_differ"] = differ[:10]
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())

"""GPU attention benchmark: pyxtts's exact attention against torch's SDPA flash backend,
forward + backward, causal, 16-bit.

    python tests/bench/bench_attention_gpu.py [--device cuda:0] [--dtype bfloat16]
        [--T 512 1024 2048 4096] [--D 64 128] [--tokens 16384] [--H 16] [--repeats 20]
        [--json tests/bench/results/attention_gpu.json]

For each (T, D): B = tokens // T samples of H heads (the same work per row of the
table), q, k, v, dout drawn once (normal, 16-bit). A step is forward + backward; the
time is the median of `repeats` steps after 3 warm-up steps, each step synchronised
(pyxtts queues on the legacy default stream, torch on its current one). Throughput
counts causal attention's FLOPs: forward 2·B·H·T²·D (half of the full 4·B·H·T²·D),
backward 2.5x the forward. The issue's goal: pyxtts >= 0.8x torch's flash throughput at
D = 64, T = 512..4096. Also checked per case: the outputs and gradients agree with
torch's (max abs difference reported), so a fast wrong kernel cannot pass unnoticed.

`--device cpu --dtype float32 --T 128 --D 64 --tokens 512 --repeats 2` runs the same code
on the CPU (torch's math backend), to check the script where no GPU is at hand.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def run_case(device: str, dtype_name: str, T: int, D: int, H: int, tokens: int, repeats: int) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    import pyxtts

    B = max(1, tokens // T)
    tdt = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(T * 1000 + D)
    host = [torch.randn(B, H, T, D, generator=gen).to(tdt) for _ in range(4)]  # q, k, v, dout
    cuda = device.startswith("cuda")
    q, k, v, dout = (h.to(device).clone() for h in host)
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    sync_t = torch.cuda.synchronize if cuda else (lambda: None)

    def torch_step():
        q.grad = k.grad = v.grad = None
        if cuda:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(dout)
        return o

    np_dt = {"float32": np.float32, "float16": np.float16}.get(dtype_name)
    if np_dt is None:
        import ml_dtypes

        np_dt = ml_dtypes.bfloat16
    pq, pk, pv, pd = (pyxtts.tensor(h.float().numpy().astype(np_dt), device=device) for h in host)

    def pyxtts_step():
        out, lse = pyxtts.attention_forward(pq, pk, pv, causal=True)
        grads = pyxtts.attention_backward(pd, pq, pk, pv, out, lse, causal=True)
        return out, grads

    def timed(step, sync) -> float:
        for _ in range(3):
            step()
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    t_torch = timed(torch_step, sync_t)
    t_pxt = timed(pyxtts_step, lambda: pyxtts.synchronize(device))
    # agreement with torch, every element
    o_t = torch_step()
    sync_t()
    out, (dq, dk, dv) = pyxtts_step()
    diffs = {name: float(np.max(np.abs(a.numpy().astype(np.float32) - b.detach().float().cpu().numpy())))
             for name, a, b in (("out", out, o_t), ("dq", dq, q.grad), ("dk", dk, k.grad), ("dv", dv, v.grad))}
    fwd = 2.0 * B * H * T * T * D
    flops = 3.5 * fwd
    return {"T": T, "D": D, "B": B, "H": H, "dtype": dtype_name, "torch_s": t_torch, "pyxtts_s": t_pxt,
            "torch_tflops": flops / t_torch / 1e12, "pyxtts_tflops": flops / t_pxt / 1e12,
            "ratio_vs_torch": t_torch / t_pxt, "max_abs_diff": diffs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--T", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--D", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import pyxtts

    rows = [run_case(args.device, args.dtype, T, D, args.H, args.tokens, args.repeats)
            for D in args.D for T in args.T]
    name = pyxtts.device_info(args.device)["name"]
    print(f"# {name}, {args.dtype}, causal, forward+backward, {args.tokens} tokens x {args.H} heads per case")
    print(f"{'D':>4} {'T':>5} {'B':>4} {'torch':>9} {'pyxtts':>9} {'torch TF/s':>10} {'pyxtts TF/s':>11} "
          f"{'ratio':>6}  max |diff| out/dq/dk/dv")
    for r in rows:
        d = r["max_abs_diff"]
        print(f"{r['D']:>4} {r['T']:>5} {r['B']:>4} {r['torch_s'] * 1e3:>7.2f}ms {r['pyxtts_s'] * 1e3:>7.2f}ms "
              f"{r['torch_tflops']:>10.1f} {r['pyxtts_tflops']:>11.1f} {r['ratio_vs_torch']:>5.2f}x  "
              f"{d['out']:.2g}/{d['dq']:.2g}/{d['dk']:.2g}/{d['dv']:.2g}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "args": vars(args), "rows": rows,
                                               "date": time.strftime("%Y-%m-%d")}, indent=2))


if __name__ == "__main__":
    main()

"""GPU attention benchmark: pyxtts's tensor-core path (cuda/attention_tc.cu), its
fallback (cuda/attention.cu) and torch's scaled_dot_product_attention (flash
backend where torch has it), forward + backward, 16-bit, dense (B, H, T, D).

    python tests/bench/bench_attention_gpu.py [--device cuda:0] [--T 490 1024 2048 4096] [--tokens 16384]
        [--H 16] [--D 64] [--dtype bfloat16] [--no-causal] [--repeats 20]
        [--paths tc tc-one-pass simple torch] [--dropout P] [--json out.json]

B = tokens // T, so every T does about the same work per key. Each path runs in
its own subprocess: PYXTTS_CUDA_ATTENTION (read once per process) is "tc" or
"simple" there; with "tc" a call the tensor-core path cannot take fails instead
of silently timing the fallback. Path "tc-one-pass" is "tc" with the backward's
one-pass schedule (PYXTTS_CUDA_ATTENTION_BWD=one-pass; "tc" is the two-kernel one). Times are the median (and best) of `repeats`
forward+backward steps after two warm-up steps, each step ended by a device
synchronize, and of `repeats` forwards alone (printed first, "forward_median_s" in the
JSON: the backward's time is the difference). TFLOP/s counts 4 B H Tq Tk D for the forward (half of it when
causal) and 2.5x that for the backward; the last column is the step time of
torch over that of pyxtts's path (1.0 = as fast as torch). --dropout P drops the
attention probabilities with probability P in every path (torch: SDPA's dropout_p).
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child(path: str, args) -> dict:
    import numpy as np

    out = {}
    tdev = "cuda" if args.device.startswith("cuda") else "cpu"
    if path == "torch":
        import torch
        import torch.nn.functional as F

        if tdev == "cuda" and not torch.cuda.is_available():
            return {"error": "torch has no CUDA here"}
        dt = getattr(torch, args.dtype)
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            def ctx():
                return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        except ImportError:
            ctx = contextlib.nullcontext
    else:
        import ml_dtypes

        import pyxtts

        npdt = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}[args.dtype]
    rng = np.random.default_rng(0)
    for T in args.T:
        B = max(1, args.tokens // T)
        shape = (B, args.H, T, args.D)
        x = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
        if path == "torch":
            q, k, v = (torch.tensor(a, dtype=dt, device=tdev, requires_grad=True) for a in x[:3])
            d = torch.tensor(x[3], dtype=dt, device=tdev)

            def step(q=q, k=k, v=v, d=d):
                with ctx() if tdev == "cuda" else contextlib.nullcontext():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal,
                                                       dropout_p=args.dropout)
                o.backward(d)
                if tdev == "cuda":
                    torch.cuda.synchronize()

            def fwd(q=q, k=k, v=v):
                with torch.no_grad(), ctx() if tdev == "cuda" else contextlib.nullcontext():
                    F.scaled_dot_product_attention(q, k, v, is_causal=args.causal, dropout_p=args.dropout)
                if tdev == "cuda":
                    torch.cuda.synchronize()
        else:
            q, k, v, d = (pyxtts.tensor(a.astype(npdt), device=args.device) for a in x)

            kw = {"causal": args.causal, "dropout_p": args.dropout, "dropout_key": 20261127}

            def step(q=q, k=k, v=v, d=d):
                o, lse = pyxtts.attention_forward(q, k, v, **kw)
                g = pyxtts.attention_backward(d, q, k, v, o, lse, **kw)
                pyxtts.synchronize(args.device)
                del o, lse, g

            def fwd(q=q, k=k, v=v):
                o, lse = pyxtts.attention_forward(q, k, v, **kw)
                pyxtts.synchronize(args.device)
                del o, lse
        try:
            step()
            step()
        except Exception as exc:  # noqa: BLE001 - reported, the other sizes still run
            out[T] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        times, ftimes = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        fwd()
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fwd()
            ftimes.append(time.perf_counter() - t0)
        out[T] = {"B": B, "median_s": statistics.median(times), "best_s": min(times),
                  "forward_median_s": statistics.median(ftimes)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0", help="cpu: the same code on the CPU (checks the script)")
    ap.add_argument("--T", type=int, nargs="+", default=[490, 1024, 2048, 4096])  # 490: XTTS v2
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--no-causal", dest="causal", action="store_false")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--paths", nargs="+", default=["tc", "simple", "torch"])
    ap.add_argument("--dropout", type=float, default=0.0, help="dropout of the probabilities")
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    results = {}
    for path in args.paths:
        env = dict(os.environ)
        if glob.glob(os.path.join(ROOT, "pyxtts", "_C*.so")):  # an in-place build: the children use it
            env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        if path != "torch":
            env["PYXTTS_CUDA_ATTENTION"] = "tc" if path.startswith("tc") else path
            env["PYXTTS_CUDA_ATTENTION_BWD"] = "one-pass" if path == "tc-one-pass" else "two-kernel"
        cmd = [sys.executable, os.path.abspath(__file__), "--child", path] + sys.argv[1:]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if p.returncode != 0:
            results[path] = {"error": p.stderr[-2000:]}
            print(f"{path}: failed\n{p.stderr[-2000:]}", file=sys.stderr)
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        results[path] = r if "error" in r else {int(t): v for t, v in r.items()}
        for t, v in results[path].items():
            if isinstance(v, dict) and "error" in v:
                print(f"{path} T={t}: {v['error']}", file=sys.stderr)
    print(f"{args.dtype} D={args.D} H={args.H} causal={args.causal} tokens={args.tokens} dropout={args.dropout}")
    print("forward alone (ms): " + "; ".join(
        f"T={T} " + ", ".join(f"{p} {results[p][T]['forward_median_s'] * 1e3:.3f}" for p in args.paths
                              if isinstance(results.get(p), dict) and "forward_median_s" in results[p].get(T, {}))
        for T in args.T))
    print(f"{'T':>6} {'B':>4} " + " ".join(f"{p + ' ms':>12} {'TFLOP/s':>8}" for p in args.paths)
          + "".join(f" {'torch/' + p:>12}" for p in args.paths if p != "torch"))
    for T in args.T:
        B = max(1, args.tokens // T)
        flops = 4.0 * B * args.H * T * T * args.D * (0.5 if args.causal else 1.0) * 3.5
        row = f"{T:>6} {B:>4} "
        for p in args.paths:
            r = results.get(p, {}).get(T, {}) if isinstance(results.get(p), dict) else {}
            if "median_s" in r:
                row += f"{r['median_s'] * 1e3:>12.3f} {flops / r['median_s'] / 1e12:>8.1f} "
            else:
                row += f"{'-':>12} {'-':>8} "
        tt = results.get("torch", {}).get(T, {}) if isinstance(results.get("torch"), dict) else {}
        for p in args.paths:
            if p == "torch":
                continue
            r = results.get(p, {}).get(T, {}) if isinstance(results.get(p), dict) else {}
            ratio = tt["median_s"] / r["median_s"] if "median_s" in tt and "median_s" in r else float("nan")
            row += f" {ratio:>12.2f}"
        print(row)
    if args.json:
        # speedup_vs_torch: torch's step time over each pyxtts path's, per T
        for p in args.paths:
            if p == "torch" or not isinstance(results.get(p), dict) or "error" in results[p]:
                continue
            for T, r in results[p].items():
                tt = results.get("torch", {}).get(T, {}) if isinstance(results.get("torch"), dict) else {}
                if "median_s" in r and "median_s" in tt:
                    r["speedup_vs_torch"] = tt["median_s"] / r["median_s"]
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_env import environment

        command = "python tests/bench/bench_attention_gpu.py " + " ".join(sys.argv[1:])
        with open(args.json, "w") as f:
            json.dump({"command": command, "environment": environment(args.device), "args": vars(args),
                       "results": results, "date": time.strftime("%Y-%m-%d")}, f, indent=1)


if __name__ == "__main__":
    main()

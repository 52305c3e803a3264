"""Per-op timings at XTTS v2 sizes: pyxtts's kernels against PyTorch's, op by op.

    python tests/bench/bench_ops_gpu.py [--device cuda:0] [--rows 3920] [--repeats 50]
        [--only NAME ...] [--cold] [--json tests/bench/results/ops_gpu.json]

Sizes are one XTTS v2 step's (batch 8 x 490 tokens = 3920 rows, d = 1024, bf16): the
four GEMMs of a block forward and their backward products, plain and fused with their
epilogues (bias, bias + GELU, GELU' + bias gradient, weight + bias gradients), the bias
gradient, layernorm forward and backward, GELU, the conditioning path's GroupNorm, RMS norm
and GEGLU (forward and backward), the embedding scatter of one sample, the audio head's
cross-entropy, AdamW over the 441 M parameters' flat buffers. The torch side
is what a PyTorch step runs for the same work (F.linear, addmm, F.gelu, sum(0),
F.layer_norm, F.group_norm, F.normalize, F.gelu and autograd, index_add_, F.cross_entropy,
the fused AdamW).

Timing: each op runs `repeats` times back to back and the device is synchronised once,
in 5 windows; the median window over `repeats` is the op's time (launch overhead
included, as in a training step). `speedup_vs_torch` is torch's time over pyxtts's.
Back to back, an op whose buffers fit the L2 cache (50 MB on an H100) reads them from
there; in a step they come from memory. `--cold` also times each op after a copy of
`--cold-mib` MiB on the same stream (which evicts the cache), less the copy alone:
`pyxtts_cold_s` and `torch_cold_s`.
Inputs are random normal data (never zeros). `--device cpu --rows 64 --d 64` runs the
same code on the CPU to check the script where no GPU is at hand.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def timed(fn, sync, repeats: int, windows: int = 5) -> float:
    fn()
    fn()
    sync()
    ts = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync()
        ts.append((time.perf_counter() - t0) / repeats)
    return statistics.median(ts)


def ops(args):
    """name -> (pyxtts closure, torch closure, bytes moved at least, flops)."""
    import ml_dtypes
    import torch
    import torch.nn.functional as F

    import pyxtts
    from pyxtts import _C

    dev = args.device
    tdev = "cuda" if dev.startswith("cuda") else "cpu"
    rng = np.random.default_rng(0)
    M, C, V = args.rows, args.d, 1026
    bf = np.dtype(ml_dtypes.bfloat16)

    def both(shape, scale=1.0, dtype="bfloat16"):
        a = (scale * rng.standard_normal(shape)).astype(np.float32)
        p = pyxtts.tensor(a.astype(bf) if dtype == "bfloat16" else a, device=dev)
        t = torch.tensor(a, device=tdev, dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32)
        return p, t

    out = {}
    es = 2  # bytes per bf16 element
    for n_out, k_in, name in [(3 * C, C, "qkv"), (C, C, "proj"), (4 * C, C, "fc"), (C, 4 * C, "fc_proj")]:
        x, xt = both((M, k_in))
        w, wt = both((k_in, n_out), 0.02)
        b, bt = both(n_out)
        r, rt = both((M, n_out))
        wtt = wt.t().contiguous()  # torch's Linear keeps (out, in)
        flops = 2.0 * M * n_out * k_in
        io = es * (M * k_in + k_in * n_out + M * n_out)
        out[f"gemm {name} ({M}x{k_in} @ {k_in}x{n_out})"] = (
            lambda x=x, w=w: _C._op_gemm(x, w), lambda xt=xt, wtt=wtt: xt @ wtt.t(), io, flops)
        if name == "fc":
            out[f"gemm+bias+gelu {name}"] = (
                lambda x=x, w=w, b=b: _C._op_gemm_fused(x, w, epilogue="bias_gelu", bias=b),
                lambda xt=xt, wtt=wtt, bt=bt: F.gelu(F.linear(xt, wtt, bt), approximate="tanh"),
                io + es * M * n_out, flops)
        else:
            out[f"gemm+bias{'+residual' if name != 'qkv' else ''} {name}"] = (
                (lambda x=x, w=w, b=b, r=r: _C._op_gemm_fused(x, w, epilogue="bias", bias=b, beta=1.0, C=r))
                if name != "qkv" else (lambda x=x, w=w, b=b: _C._op_gemm_fused(x, w, epilogue="bias", bias=b)),
                (lambda xt=xt, wtt=wtt, bt=bt, rt=rt: rt + F.linear(xt, wtt, bt))
                if name != "qkv" else (lambda xt=xt, wtt=wtt, bt=bt: F.linear(xt, wtt, bt)),
                io + (es * M * n_out if name != "qkv" else 0), flops)
        # backward: dW (fp32, +=) with the bias gradient of dy, as the engine's
        dW = pyxtts.tensor(np.zeros((k_in, n_out), np.float32), device=dev)
        db = pyxtts.tensor(np.zeros(n_out, np.float32), device=dev)
        out[f"dW+db {name} (x^T dy, sum dy)"] = (
            lambda x=x, r=r, dW=dW, db=db: _C._op_gemm_fused(x, r, epilogue="bgrad_b", trans_a=True, beta=1.0,
                                                               D=dW, dbias=db, out_dtype=pyxtts.float32),
            lambda xt=xt, rt=rt: ((xt.t() @ rt).float(), rt.float().sum(0)),
            es * (M * k_in + M * n_out) + 4 * 2 * k_in * n_out, flops)
    # the MLP's backward: dfc = (dy W^T) * gelu'(fc) with the fc bias gradient
    dy, dyt = both((M, C))
    w, wt = both((4 * C, C), 0.02)
    fc, fct = both((M, 4 * C))
    out["dgelu+db (dy W^T * gelu'(fc))"] = (
        lambda: _C._op_gemm_fused(dy, w, epilogue="dgelu_bgrad", trans_b=True, pre=fc),
        lambda: torch.ops.aten.gelu_backward(dyt @ wt.t(), fct, approximate="tanh").float().sum(0),
        es * (M * C + 4 * C * C + 3 * M * 4 * C), 2.0 * M * C * 4 * C)
    g, gt = both((M, 4 * C))
    out[f"bias_backward ({M}x{4 * C})"] = (lambda: _C._op_bias_backward(g), lambda: gt.float().sum(0),
                                        es * M * 4 * C, 0.0)
    x, xt = both((M, C))
    lw, lwt = both(C)
    lb, lbt = both(C)
    out["layernorm forward"] = (lambda: _C._op_layernorm_forward(x, lw, lb),
                                lambda: F.layer_norm(xt, (C,), lwt, lbt), es * 2 * M * C, 0.0)
    y, mean, rstd = _C._op_layernorm_forward(x, lw, lb)
    xg = xt.clone().requires_grad_()
    lwg, lbg = lwt.clone().requires_grad_(), lbt.clone().requires_grad_()
    yt = F.layer_norm(xg, (C,), lwg, lbg)
    out["layernorm backward"] = (
        lambda: _C._op_layernorm_backward(dy, x, lw, mean, rstd),
        lambda: torch.autograd.grad(yt, (xg, lwg, lbg), dyt, retain_graph=True), es * 3 * M * C, 0.0)
    out[f"gelu forward ({M}x{4 * C})"] = (lambda: _C._op_gelu_forward(g),
                                       lambda: F.gelu(gt, approximate="tanh"), es * 2 * M * 4 * C, 0.0)
    out["gelu backward"] = (lambda: _C._op_gelu_backward(g, fc),
                            lambda: torch.ops.aten.gelu_backward(fct, gt, approximate="tanh"),
                            es * 3 * M * 4 * C, 0.0)
    # the conditioning path: GroupNorm over 8 mels of 517 frames (torch on Coqui's
    # (B, C, S) layout), the perceiver's RMS norm and GEGLU over 8 x 32 latents
    Bc, S, G, F_ = 8, min(517, M), 32 if C % 32 == 0 else 1, int(C * 4 * 2 / 3)
    a = rng.standard_normal((Bc, S, C)).astype(np.float32)
    xc = pyxtts.tensor(a.astype(bf), device=dev)  # (B, S, C)
    xct = torch.tensor(a.transpose(0, 2, 1).copy(), device=tdev, dtype=torch.bfloat16)  # (B, C, S)
    gw, gwt = both(C)
    gb, gbt = both(C)
    out[f"groupnorm forward ({Bc}x{S}x{C}, {G} groups)"] = (
        lambda: _C._op_groupnorm_forward(xc, gw, gb, G), lambda: F.group_norm(xct, G, gwt, gbt),
        es * 2 * Bc * S * C, 0.0)
    _, gm, gr = _C._op_groupnorm_forward(xc, gw, gb, G)
    dyc, dyct = both((Bc, C, S))
    xcg, gwg, gbg = xct.clone().requires_grad_(), gwt.clone().requires_grad_(), gbt.clone().requires_grad_()
    ygt = F.group_norm(xcg, G, gwg, gbg)
    out["groupnorm backward"] = (
        lambda: _C._op_groupnorm_backward(xc, xc, gw, gm, gr, G),
        lambda: torch.autograd.grad(ygt, (xcg, gwg, gbg), dyct, retain_graph=True), es * 3 * Bc * S * C, 0.0)
    Nl = 8 * 32
    xr, xrt = both((Nl, C))
    gam, gamt = both(C)
    out[f"rmsnorm forward ({Nl}x{C})"] = (
        lambda: _C._op_rmsnorm_forward(xr, gam, C**0.5),
        lambda: F.normalize(xrt, dim=-1) * C**0.5 * gamt, es * 2 * Nl * C, 0.0)
    _, rn = _C._op_rmsnorm_forward(xr, gam, C**0.5)
    xrg, gamg = xrt.clone().requires_grad_(), gamt.clone().requires_grad_()
    yrt = F.normalize(xrg, dim=-1) * C**0.5 * gamg
    out["rmsnorm backward"] = (
        lambda: _C._op_rmsnorm_backward(xr, xr, gam, rn, C**0.5),
        lambda: torch.autograd.grad(yrt, (xrg, gamg), xrt, retain_graph=True), es * 3 * Nl * C, 0.0)
    u, ut = both((Nl, 2 * F_))
    gg, ggt = both((Nl, F_))
    out[f"geglu forward ({Nl}x{2 * F_})"] = (
        lambda: _C._op_geglu_forward(u), lambda: ut[:, :F_] * F.gelu(ut[:, F_:]), es * 3 * Nl * F_, 0.0)
    ug = ut.clone().requires_grad_()
    ygg = ug[:, :F_] * F.gelu(ug[:, F_:])
    out["geglu backward"] = (
        lambda: _C._op_geglu_backward(u, gg),
        lambda: torch.autograd.grad(ygg, ug, ggt, retain_graph=True), es * 5 * Nl * F_, 0.0)
    La = min(308, M)
    ids = rng.integers(0, V, La).astype(np.int32)
    idp = pyxtts.tensor(ids, device=dev)
    idt = torch.tensor(ids, device=tdev, dtype=torch.long)
    de, det = both((La, C))
    table = torch.zeros((V, C), device=tdev)
    out[f"embedding backward ({La} ids, V={V})"] = (
        lambda: _C._op_embedding_backward(idp, de, V), lambda: table.index_add_(0, idt, det.float()),
        es * La * C + 4 * 2 * La * C, 0.0)
    R = min(256, M)
    lg, lgt = both((R, V), 4.0, "float32")
    tg = rng.integers(0, V, R).astype(np.int32)
    tgp = pyxtts.tensor(tg, device=dev)
    tgt = torch.tensor(tg, device=tdev, dtype=torch.long)
    lgg = lgt.clone().requires_grad_()
    out[f"softmax cross-entropy fwd+bwd ({R}x{V})"] = (
        lambda: _C._op_softmax_xent(lg, tgp, scale=1.0 / R),
        lambda: torch.autograd.grad(F.cross_entropy(lgg, tgt), lgg), 4 * 2 * R * V, 0.0)
    return out


def adamw_case(args):
    """AdamW over a flat buffer of the model's size: pyxtts's (a model's optimizer) vs torch's fused."""
    import torch

    import pyxtts

    cfg = pyxtts.ModelConfig(n_layers=args.layers, d_model=args.d, n_heads=max(1, args.d // 64))
    model = pyxtts.XTTSGPT(cfg, device=args.device, precision="bf16", seed=0)
    opt = pyxtts.AdamW(model, lr=1e-4, betas=(0.9, 0.96), weight_decay=0.01, grad_clip=1.0)
    n = model.num_parameters
    tdev = "cuda" if args.device.startswith("cuda") else "cpu"
    ps = [torch.zeros(n, device=tdev, requires_grad=True)]
    ps[0].grad = torch.randn(n, device=tdev) * 1e-3
    topt = torch.optim.AdamW(ps, lr=1e-4, betas=(0.9, 0.96), weight_decay=0.01, fused=tdev == "cuda")

    def tstep():
        torch.nn.utils.clip_grad_norm_(ps, 1.0)
        topt.step()

    # fp32 master, m, v, grads read/written; bf16 params written
    return f"adamw + clip ({n / 1e6:.0f}M params)", (opt.step, tstep, n * (4 * 7 + 2), 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--rows", type=int, default=8 * 490)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=30, help="model size of the AdamW case")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--only", nargs="+", help="substrings of the op names to run")
    ap.add_argument("--cold", action="store_true",
                    help="also time each op with the L2 cache evicted before it (pyxtts_cold_s, torch_cold_s)")
    ap.add_argument("--cold-mib", type=int, default=256, help="MiB copied to evict the cache (--cold)")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    import pyxtts

    cases = ops(args)
    name, case = adamw_case(args)
    cases[name] = case
    if args.only:
        cases = {k: v for k, v in cases.items() if any(s in k for s in args.only)}

    def sync_p():
        pyxtts.synchronize(args.device)

    def sync_t():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    if args.cold:  # a copy of cold_mib on each side's own stream evicts the L2 cache
        n = args.cold_mib << 18  # float32 elements
        src_p, dst_p = pyxtts.zeros((n,), device=args.device), pyxtts.zeros((n,), device=args.device)
        src_t = torch.zeros(n, device=args.device)
        dst_t = torch.empty_like(src_t)

        def flush_p():
            dst_p.copy_(src_p)

        def flush_t():
            dst_t.copy_(src_t)

        def cold(fn, flush, sync) -> float:
            def both():
                flush()
                fn()
            return timed(both, sync, args.repeats) - timed(flush, sync, args.repeats)

    rows = []
    for name, (pf, tf, nbytes, flops) in cases.items():
        tp = timed(pf, sync_p, args.repeats)
        tt = timed(tf, sync_t, args.repeats)
        rows.append({"op": name, "pyxtts_s": tp, "torch_s": tt, "speedup_vs_torch": tt / tp,
                     "pyxtts_GBps": nbytes / tp / 1e9, "pyxtts_TFLOPs": flops / tp / 1e12 if flops else None})
        if args.cold:
            rows[-1]["pyxtts_cold_s"] = cold(pf, flush_p, sync_p)
            rows[-1]["torch_cold_s"] = cold(tf, flush_t, sync_t)
    command = "python tests/bench/bench_ops_gpu.py " + " ".join(sys.argv[1:])
    sys.path.insert(0, str(HERE))
    from bench_env import environment

    env = environment(args.device)
    print(f"# {command}\n# {env['device']['name']}, driver {env['driver']}, torch {env['torch']}")
    print(f"{'op':52} {'pyxtts':>10} {'torch':>10} {'vs torch':>9} {'GB/s':>7} {'TFLOP/s':>8}"
          + (f" {'cold pyxtts':>12} {'cold torch':>11}" if args.cold else ""))
    for r in rows:
        tfl = f"{r['pyxtts_TFLOPs']:.0f}" if r["pyxtts_TFLOPs"] else "-"
        cold_cols = (f" {r['pyxtts_cold_s'] * 1e6:>10.1f}us {r['torch_cold_s'] * 1e6:>9.1f}us"
                     if args.cold else "")
        print(f"{r['op']:52} {r['pyxtts_s'] * 1e6:>8.1f}us {r['torch_s'] * 1e6:>8.1f}us "
              f"{r['speedup_vs_torch']:>8.2f}x {r['pyxtts_GBps']:>7.0f} {tfl:>8}{cold_cols}")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "environment": env, "ops": rows,
                                               "date": time.strftime("%Y-%m-%d")}, indent=2))


if __name__ == "__main__":
    main()

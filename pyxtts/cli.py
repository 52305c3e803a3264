"""The pyxtts command line."""
from __future__ import annotations

import argparse
import json
import sys

import pyxtts
from pyxtts.memory import format_bytes


def _gpu_info(args: argparse.Namespace) -> int:
    info = pyxtts.build_info()
    devices = ["cpu"] + [f"cuda:{i}" for i in range(pyxtts.device_count())]
    if args.json:
        print(json.dumps({"build": info, "devices": [pyxtts.device_info(d) for d in devices]}, indent=2))
        return 0
    print(f"pyxtts {info['version']}  (compiled by {info['compiler']}, {info['c_standard']})")
    print(f"  BLAS:  {info['blas']}")
    if info["cuda"]:
        print(f"  CUDA:  runtime {info['cuda_version']}, cuBLAS {info['cublas_version']}, "
              f"driver {info['cuda_driver_version'] or 'not found'}, kernels for {' '.join(info['cuda_archs'])}")
    else:
        print("  CUDA:  not built (CPU-only module)")
    print("devices:")
    for d in devices:
        p = pyxtts.device_info(d)
        cap = f", compute capability {p['capability'][0]}.{p['capability'][1]}" if p["type"] == "cuda" else ""
        unit = "SMs" if p["type"] == "cuda" else "cores"
        print(f"  {d:8s} {p['name']}: {format_bytes(p['total_memory'])} total, "
              f"{format_bytes(p['free_memory'])} free, {p['multiprocessors']} {unit}{cap}")
    if info["cuda"] and pyxtts.device_count() == 0:
        print("  (the CUDA backend is built, but no GPU is visible: no driver or no device)")
    return 0


def _optimize_config(args: argparse.Namespace) -> int:
    from pyxtts.config import XTTSConfig, optimize_config

    try:
        config = XTTSConfig.load(args.config)
        new, explanation = optimize_config(config, args.memory, device=args.device)
    except (OSError, TypeError, ValueError) as exc:
        print(f"pyxtts optimize-config: {exc}", file=sys.stderr)
        return 2
    new.save(args.output)
    print(explanation)
    print(f"written: {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyxtts", description=pyxtts.__doc__)
    sub = parser.add_subparsers(dest="command")
    gi = sub.add_parser("gpu-info", help="build, devices and memory (the default command)")
    gi.add_argument("--json", action="store_true", help="machine-readable output")
    gi.set_defaults(func=_gpu_info)
    oc = sub.add_parser("optimize-config", help="fit a training config's memory plan to a device")
    oc.add_argument("--config", required=True, help="YAML config to start from (or a shipped one's name)")
    oc.add_argument("--output", required=True, help="where to write the optimized YAML")
    oc.add_argument("--memory", default=None,
                    help="device memory, e.g. 12GiB, 12G, 12GB (10^9) or bytes; default: the device's total")
    oc.add_argument("--device", default=None, help="device to plan for (default: the config's training.device)")
    oc.set_defaults(func=_optimize_config)
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["gpu-info", *(argv or [])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

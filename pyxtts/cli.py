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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyxtts", description=pyxtts.__doc__)
    sub = parser.add_subparsers(dest="command")
    gi = sub.add_parser("gpu-info", help="build, devices and memory (the default command)")
    gi.add_argument("--json", action="store_true", help="machine-readable output")
    gi.set_defaults(func=_gpu_info)
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["gpu-info", *(argv or [])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

"""CPU step time when other work shares the cores: OpenMP spin settings, pyxtts vs PyTorch.

    python tests/bench/bench_cpu_contention.py [--config tiny] [--steps 30] [--json out.json]

Each run is a process of tests/bench/bench_model_cpu.py's worker (forward + backward of
the same model in pyxtts and in PyTorch, all cores), timed twice: on idle cores, and
beside busy-looping processes (a compiler, a data loader, another job). libgomp spins
GOMP_SPINCOUNT times at a barrier before it sleeps (300000 by default); pyxtts sets 1000
unless the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY. Each setting is run for both
libraries (PyTorch's bundled libgomp reads the same variable). Reported: median step time
with 0, 1 and as many busy-looping processes as there are cores beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = {"libgomp default (300000)": "300000", "10000": "10000", "pyxtts default (1000)": "1000"}


def run(impl: str, config: str, steps: int, spin: str, busy: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env["GOMP_SPINCOUNT"] = spin
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        cmd = [sys.executable, str(HERE / "bench_model_cpu.py"), "--steps", str(steps), "--worker", impl, config,
               "none" if impl == "pyxtts" else "-"]
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    out.update(spin=spin, busy=busy)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny", choices=("tiny", "small"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    loads = (0, 1, os.cpu_count())
    runs = [run(impl, args.config, args.steps, spin, busy)
            for impl in ("pyxtts", "torch") for spin in SETTINGS.values() for busy in loads]
    print(f"# {args.config} model, forward+backward, {os.cpu_count()} threads, median of {args.steps} steps; "
          f"command: python tests/bench/bench_cpu_contention.py --config {args.config} --steps {args.steps}")
    print(f"{'impl':7} {'GOMP_SPINCOUNT':26} " + " ".join(f"{f'{n} busy':>10}" for n in loads)
          + "   (step time with n busy-looping processes beside it)")
    for impl in ("pyxtts", "torch"):
        for label, spin in SETTINGS.items():
            cells = [next(r for r in runs if r["impl"] == impl and r["spin"] == spin and r["busy"] == n)
                     for n in loads]
            print(f"{impl:7} {label:26} " + " ".join(f"{c['step_s'] * 1e3:>8.1f}ms" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()

"""Two profiles of the XTTS v2 step side by side, kernel family by kernel family.

    python tests/bench/profile_diff.py OLD.json NEW.json [--part gpt_core|recipe] [--top 40]

OLD and NEW are `profile_xtts_gpu.py --json` files (a run's, e.g.
tests/bench/results/profile_xtts_gpu_h200_run3.json, and the next one's). A kernel's family
is its name without its parameters and the project's `pxt_` prefix, so a kernel that was
renamed into the prefix (`adamw_kernel<pxt_bf16, false>`, now
`pxt_adamw_kernel<pxt_bf16, false>`) is compared with itself; template arguments stay (a
kernel with and without dropout are two families), and cuBLAS's and cuBLASLt's kernels keep
their whole name (their tile shapes are the point). Printed: the step's wall
and busy time, then each family's ms per step and calls in both, largest change first,
and families only one of them has. What a change means (a prediction met or missed) is
for tests/bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def family(name: str) -> str:
    """`void pxt_adamw_kernel<pxt_bf16, false>(...)` -> `adamw_kernel<pxt_bf16, false>`."""
    if name.startswith(("nvjet", "cutlass", "Memset", "Memcpy")) or "cublas" in name:
        return name
    base = re.sub(r"^void ", "", name)
    depth, end = 0, len(base)  # the parameters: the first "(" outside template brackets
    for i, ch in enumerate(base):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0:
            end = i
            break
    return re.sub(r"^pxt_", "", base[:end].strip())


def families(part: dict) -> dict[str, tuple[float, int]]:
    """{family: (ms per step, calls per step)} of one profile part."""
    out: dict[str, tuple[float, int]] = {}
    for k in part["kernels"]:
        ms, calls = out.get(family(k["name"]), (0.0, 0))
        out[family(k["name"])] = (ms + k["ms_per_step"], calls + k["calls"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--part", default="recipe", choices=["gpt_core", "recipe"])
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    parts = []
    for path in (args.old, args.new):
        data = json.loads(path.read_text())
        if args.part not in data:
            raise SystemExit(f"{path}: no {args.part!r} profile in it (it has {', '.join(data) or 'none'})")
        parts.append(data[args.part])
    old, new = parts
    for what in ("step_s", "gpu_busy_s"):
        a, b = old[what] * 1e3, new[what] * 1e3
        print(f"{what[:-2]:<10} {a:8.2f} ms -> {b:8.2f} ms ({b - a:+.2f})")
    fo, fn = families(old), families(new)
    rows = []
    for name in set(fo) | set(fn):
        (a, ca), (b, cb) = fo.get(name, (0.0, 0)), fn.get(name, (0.0, 0))
        rows.append((b - a, a, b, ca, cb, name))
    rows.sort(key=lambda r: -abs(r[0]))
    print(f"{'change':>8} {'old ms':>8} {'new ms':>8} {'calls':>11}  family")
    for delta, a, b, ca, cb, name in rows[:args.top]:
        calls = f"{ca}->{cb}" if ca != cb else str(ca)
        print(f"{delta:+8.3f} {a:8.3f} {b:8.3f} {calls:>11}  {name[:100]}")
    rest = rows[args.top:]
    if rest:
        print(f"... {len(rest)} more families, {sum(r[0] for r in rest):+.3f} ms together")


if __name__ == "__main__":
    main()

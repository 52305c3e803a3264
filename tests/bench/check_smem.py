"""Shared memory of every CUDA kernel against the per-block limits of the cards a build
targets, from the compiler itself: no GPU needed.

    python tests/bench/check_smem.py [--archs "75 86"] [--jobs 2] [--table] [SOURCE.cu ...]

For each source (default: every .cu of cuda/ and cuda/attention/) and each sm_XX, nvcc
--resource-usage (ptxas -v) reports every kernel's static shared memory. What a launch
asks for dynamically is 0 for every launch but the tensor-core attention's: a scan of
the sources checks that every <<<...>>> passes 0 there, and that only attention_tc.cuh
opts in to more than 48 KiB. The tensor-core kernels' sizes, and the decision whether
a card runs them, come from cuda/attention_tc_plan.h itself (a small g++ driver prints
them, given the card's numbers and the static shared memory the compiler reported).

A kernel fits a card when static + dynamic <= the card's per-block opt-in limit; a
tensor-core kernel on a card where the decision takes the general kernels counts only
its static part (the host never launches it there). Exits 1 when a kernel does not fit,
or when the decision loses the tensor-core path on an sm_80+ card. The full sweep, 27
sources for sm_75 and sm_86, took 7 min of CPU (9.8 min wall on a shared 2-core machine,
tests/bench/RESULTS.md); the suite compiles one tensor-core instance for sm_86 only
(tests/test_cuda_smem.py).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes, of each architecture's cards (the CUDA
# programming guide's table of compute capabilities; only sm_90's was read from a card)
LIMITS = {"75": 64 << 10, "80": 163 << 10, "86": 99 << 10, "87": 163 << 10, "89": 99 << 10,
          "90": 227 << 10, "100": 227 << 10, "120": 99 << 10}
CARDS = {"75": "RTX 20xx, T4", "80": "A100", "86": "RTX 30xx, A10, A40", "87": "Jetson Orin",
         "89": "RTX 40xx, L4, L40", "90": "H100, H200", "100": "B200", "120": "RTX 50xx"}
STATIC_LIMIT = 48 << 10  # static shared memory per block: every GPU, no opt-in
TC_KINDS = {"attn_tc_fwd_kernel": "fwd", "attn_tc_bwd_kv_kernel": "kv", "attn_tc_bwd_q_kernel": "q",
            "attn_tc_bwd_kernel": "bwd"}

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "attention_tc_plan.h"
/* argv: sm80 optin static -> per D: the four kernels' dynamic bytes, then "tc" or why
 * not, with every kernel counted (the one-pass backward's too) */
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    pxt_tc_device dev = {atoi(argv[1]), (size_t)atoll(argv[2]), (size_t)atoll(argv[3]), 1};
    for (int D = 64; D <= 128; D *= 2) {
        pxt_attn_args a = {};
        a.B = a.H = a.Tq = a.Tk = 1, a.D = D, a.scale = 0.125f, a.dt = PXT_BFLOAT16;
        a.q = a.k = a.v = a.o = pxt_strides{8 * D, 8 * D, 8 * D};
        char buf[160];
        const char *why = pxt_tc_why_not(&a, NULL, 0, &dev, buf, sizeof buf);
        pxt_tc_smem s = pxt_tc_smem_of(D);
        printf("%d %d %d %d %d %s\n", D, s.fwd, s.kv, s.q, s.bwd, why ? why : "tc");
    }
    return 0;
}
"""


def _cudafind():
    spec = importlib.util.spec_from_file_location("cudafind", ROOT / "build_support" / "cudafind.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cudafind", mod)
    spec.loader.exec_module(mod)
    return mod


def toolkit() -> tuple[Path, Path] | None:
    """(nvcc, the cuBLAS include folder) as the build finds them, or None."""
    cf = _cudafind()
    nvcc = cf.find_nvcc()
    if nvcc is None:
        return None
    inc, _, _ = cf._find_cublas(nvcc.parent.parent, cf.nvcc_version(nvcc)[0])
    return (nvcc, inc) if inc is not None else None


def sources() -> list[Path]:
    return sorted((ROOT / "cuda").glob("*.cu")) + sorted((ROOT / "cuda" / "attention").glob("*.cu"))


# ---- the sources: what each launch asks for --------------------------------------------

def _split_top(args: str) -> list[str]:
    """args split at the commas outside parentheses and angle brackets."""
    out, depth, cur = [], 0, ""
    for ch in args:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()]


def launch_problems() -> list[str]:
    """Launches that ask for dynamic shared memory outside attention_tc.cuh's helper,
    and opt-ins above 48 KiB outside it: each would need the per-card check that
    attention_tc_plan.h makes for the tensor-core kernels."""
    bad = []
    for f in sorted((ROOT / "cuda").rglob("*.cu*")):
        text = f.read_text()
        rel = f.relative_to(ROOT)
        for m in re.finditer(r"<<<(.*?)>>>", text, re.S):
            args = _split_top(m.group(1))
            smem = args[2] if len(args) > 2 else "0"
            if smem != "0" and not (rel.name == "attention_tc.cuh" and smem == "smem"):
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{rel}:{line}: a launch asks for {smem} bytes of dynamic shared memory")
        if "cudaFuncAttributeMaxDynamicSharedMemorySize" in text and rel.name != "attention_tc.cuh":
            bad.append(f"{rel}: opts in to more than 48 KiB of shared memory outside attention_tc.cuh")
    return bad


# ---- the compiler: each kernel's static shared memory -------------------------------------

@dataclass
class Kernel:
    arch: str
    source: str
    name: str  # demangled
    static: int
    registers: int


def nvcc_flags(include: Path) -> list[str]:
    """setup.py's flags for a CUDA unit (warnings as errors), less the gencode."""
    host = "-fPIC,-Wall,-Wextra,-Werror,-fvisibility=hidden,-Wno-missing-field-initializers"
    return ["-std=c++20", "-O3", "-lineinfo", "-fmad=false", "-Werror", "all-warnings", "-Xcompiler", host,
            "-DPXT_WITH_CUDA=1", f"-I{ROOT / 'csrc'}", f"-I{include}"]


def compile_one(nvcc: Path, include: Path, src: Path, arch: str, out: Path) -> list[Kernel]:
    obj = out / f"{src.stem}.sm_{arch}.o"
    cmd = [str(nvcc), *nvcc_flags(include), "-gencode", f"arch=compute_{arch},code=sm_{arch}",
           "--resource-usage", "-c", str(src), "-o", str(obj)]
    # nvcc's own tools crash with a sanitizer runtime preloaded (the suite's sanitized pass
    # preloads one for the extension): the compiler is not the code under test
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{p.stdout}{p.stderr}")
    kernels, current = [], None
    for line in (p.stdout + p.stderr).splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for 'sm_(\d+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            s = re.search(r"(\d+) bytes smem", line)
            kernels.append(Kernel(arch, str(src.relative_to(ROOT)), current, int(s.group(1)) if s else 0,
                                  int(m.group(1))))
            current = None
    names = subprocess.run(["c++filt"], input="\n".join(k.name for k in kernels), capture_output=True,
                           text=True).stdout.splitlines()
    for k, n in zip(kernels, names):
        k.name = n.split("(")[0].replace("void ", "").strip()
    return kernels


def plan(out: Path, arch: str, static: int) -> dict[int, tuple[dict[str, int], str]]:
    """attention_tc_plan.h's answer for a card of sm_arch: per D, the dynamic bytes of
    each tensor-core kernel and "tc" or why not."""
    exe = out / "plan"
    if not exe.exists():
        (out / "plan.cpp").write_text(DRIVER)
        subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{ROOT / 'cuda'}",
                        f"-I{ROOT / 'csrc'}", str(out / "plan.cpp"), "-o", str(exe)], check=True)
    res = subprocess.run([str(exe), str(int(int(arch) >= 80)), str(LIMITS[arch]), str(static)],
                         capture_output=True, text=True, check=True).stdout
    result = {}
    for line in res.splitlines():
        d, fwd, kv, q, bwd, why = line.split(" ", 5)
        result[int(d)] = ({"fwd": int(fwd), "kv": int(kv), "q": int(q), "bwd": int(bwd)}, why)
    return result


@dataclass
class Row:
    kernel: Kernel
    dynamic: int
    limit: int
    note: str

    @property
    def fits(self) -> bool:
        return self.kernel.static <= STATIC_LIMIT and self.kernel.static + self.dynamic <= self.limit


def check(archs: list[str], srcs: list[Path], jobs: int = 2, workdir: Path | None = None
          ) -> tuple[list[Row], list[str]]:
    """Every kernel of srcs on a card of each arch: the rows, and the problems found."""
    found = toolkit()
    if found is None:
        raise RuntimeError("nvcc or the cuBLAS headers not found (see docs/install.md)")
    nvcc, include = found
    problems = launch_problems()
    with tempfile.TemporaryDirectory(prefix="pyxtts-smem-", dir=workdir) as tmp:
        out = Path(tmp)
        with ThreadPoolExecutor(jobs) as pool:
            done = list(pool.map(lambda job: compile_one(nvcc, include, job[0], job[1], out),
                                 [(s, a) for a in archs for s in srcs]))
        rows = []
        for arch in archs:
            kernels = [k for ks in done for k in ks if k.arch == arch]
            tc = [k for k in kernels if k.name.split("<")[0] in TC_KINDS]
            answer = plan(out, arch, max((k.static for k in tc), default=0))
            for d, (_, why) in answer.items():
                if int(arch) >= 80 and why != "tc":
                    problems.append(f"sm_{arch} ({CARDS[arch]}): the tensor-core attention for D={d} "
                                    f"would not run: {why}")
            for k in kernels:
                base = k.name.split("<")[0]
                dynamic, note = 0, ""
                if base in TC_KINDS:
                    d = int(re.search(r"<[^,]+, (\d+),", k.name).group(1))
                    sizes, why = answer[d]
                    dynamic, note = (sizes[TC_KINDS[base]], "") if why == "tc" else (0, "never launched here")
                row = Row(k, dynamic, LIMITS[arch], note)
                rows.append(row)
                if not row.fits:
                    problems.append(f"sm_{arch}: {k.name} ({k.source}): {k.static} static + {dynamic} "
                                    f"dynamic bytes of shared memory, over {LIMITS[arch]}")
    return rows, problems


def family(name: str) -> str:
    """A kernel's template without its storage type and dropout flag (the attention
    kernels keep their head dim): its instances share their shared memory."""
    m = re.match(r"([^<]*)<[^,<>]+, (\d+), (?:true|false)>", name)
    return f"{m.group(1)} D{m.group(2)}" if m else name.split("<")[0]


def table(rows: list[Row]) -> str:
    """One line per kernel family and arch: the most any of its instances asks for."""
    most: dict[tuple[str, str], Row] = {}
    for r in rows:
        key = (r.kernel.arch, family(r.kernel.name))
        if key not in most or r.kernel.static + r.dynamic > most[key].kernel.static + most[key].dynamic:
            most[key] = r
    lines = [f"{'arch':6} {'kernel':34} {'static':>7} {'dynamic':>8} {'limit':>7}  fits"]
    for (arch, name), r in sorted(most.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
        lines.append(f"sm_{arch:3} {name:34} {r.kernel.static:7} {r.dynamic:8} {r.limit:7}  "
                     f"{'yes' if r.fits else 'NO'}{' (' + r.note + ')' if r.note else ''}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archs", default="75 86", help='e.g. "75 86 89" (default: 75 86)')
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("PYXTTS_BUILD_JOBS", 2)))
    ap.add_argument("--table", action="store_true", help="print a line per kernel")
    ap.add_argument("sources", nargs="*", type=Path)
    args = ap.parse_args()
    archs = args.archs.replace(",", " ").split()
    unknown = [a for a in archs if a not in LIMITS]
    if unknown:
        ap.error(f"--archs: no limit known for {unknown}; known: {' '.join(LIMITS)}")
    srcs = [s.resolve() for s in args.sources] or sources()
    rows, problems = check(archs, srcs, args.jobs)
    if args.table:
        print(table(rows))
    print(f"{len(rows)} kernels x archs checked ({len(srcs)} sources, sm_{' sm_'.join(archs)}); "
          f"{len(problems)} problem(s)")
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

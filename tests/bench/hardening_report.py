"""Issue 11's hardening figures, counted: fault-injection trials, corrupt checkpoints, fuzz.

    python tests/bench/hardening_report.py [--fuzz-cases 10000] [--seed N] [--json PATH]

Prints and writes (default tests/bench/results/hardening_cpu.json), with the machine,
date and command:

- the out-of-memory sweep (tests/test_oom_sweep.py): per stateful call, the allocator
  requests of its clean run, the trials (every index 0..n+1), how many faults fired and
  raised, and the trials that broke the contract (state changed or another result; must
  be 0);
- the corrupt checkpoints of tests/test_checkpoint_corruption.py at full size
  (PYXTTS_FULL_FUZZ=1: every header byte), run by pytest in this process with every
  refusal counted (a load that does not raise CheckpointError is an accepted case; the
  test stops at the first of each test function, so a non-zero count is a lower bound);
- the fuzz (tests/fuzz_child.py COUNT SEED as a child process): cases run, time, findings,
  and whether the child died (then the case it died in).

- the thread trials of test_failure_state.py (item 14), run by pytest in this process:
  the writes tried while a step ran in another thread, and how many were accepted while
  it ran (must be 0).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import secrets
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
sys.path[:0] = [str(ROOT), str(TESTS)]  # the in-place build, and the tests' helpers


def machine() -> dict:
    import pyxtts

    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(), "pyxtts": pyxtts.build_info()}


def oom_sweep() -> dict:
    import test_oom_sweep

    rows = []
    t0 = time.perf_counter()
    for case in test_oom_sweep.CASES:
        r = test_oom_sweep.sweep(case)
        rows.append({"call": r.name, "raw": case.raw, "allocations": r.allocations, "trials": r.trials,
                     "fired": r.fired, "raised": r.raised,
                     "state_changed": len(r.failures), "failures": r.failures})
        print(f"  {r.name:62s} {r.trials:4d} trials, {r.fired:3d} fired, {r.raised:3d} raised, "
              f"{len(r.failures)} changed", flush=True)
    return {"calls": len(rows), "trials": sum(r["trials"] for r in rows),
            "fired": sum(r["fired"] for r in rows), "raised": sum(r["raised"] for r in rows),
            "state_changed": sum(r["state_changed"] for r in rows),
            "seconds": round(time.perf_counter() - t0, 2), "rows": rows}


class _CountRefusals:
    """A pytest plugin: wraps the corruption tests' Target.refuse to count each case."""

    def __init__(self) -> None:
        self.tried = 0
        self.accepted = 0

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        module = items[0].module
        original = module.Target.refuse

        def refuse(target, path, what, match=None):
            self.tried += 1
            try:
                return original(target, path, what, match)
            except BaseException as exc:
                if "DID NOT RAISE" in str(exc):
                    self.accepted += 1
                raise

        module.Target.refuse = refuse


def corruption() -> dict:
    import pytest

    os.environ["PYXTTS_FULL_FUZZ"] = "1"
    counter = _CountRefusals()
    t0 = time.perf_counter()
    os.chdir(ROOT)
    rc = pytest.main(["-q", "-p", "no:cacheprovider", str(TESTS / "test_checkpoint_corruption.py")],
                     plugins=[counter])
    return {"cases": counter.tried, "accepted": counter.accepted, "pytest_exit": int(rc),
            "seconds": round(time.perf_counter() - t0, 2), "full": True}


class _ThreadTrials:
    """A pytest plugin: keeps the module of test_failure_state.py to read its THREAD_TRIALS."""

    module = None

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        self.module = items[0].module if items else None


def threads() -> dict:
    """test_failure_state.py's item-14 tests (writes refused while a step runs in another
    thread), run by pytest here, with what they tried."""
    import pytest

    plugin = _ThreadTrials()
    t0 = time.perf_counter()
    os.chdir(ROOT)
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "-k", "another_thread",
                      str(TESTS / "test_failure_state.py")], plugins=[plugin])
    trials = dict(plugin.module.THREAD_TRIALS) if plugin.module is not None else {}
    return {"pytest_exit": int(rc), "seconds": round(time.perf_counter() - t0, 2), "tests": trials,
            "writes_tried": sum(t["writes_tried"] for t in trials.values()),
            "accepted_during_step": sum(t["accepted_during_step"] for t in trials.values())}


def fuzz(count: int, seed: int) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(TESTS / "fuzz_child.py"), str(count), str(seed)], cwd=ROOT,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - t0
    started, done, last = 0, None, None
    for line in p.stdout.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "start" in rec:
            started += 1
            last = rec["start"]
        if "done" in rec:
            done = rec
    out = {"requested": count, "seed": seed, "seconds": round(seconds, 2), "exit": p.returncode,
           "cases": done["done"] if done else started, "findings": len(done["findings"]) if done else None,
           "finding_list": done["findings"] if done else None}
    if done is None:
        out["died_in"] = last
        out["stderr_tail"] = p.stderr[-2000:]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fuzz-cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=None, help="the fuzz's seed (default: a random one)")
    ap.add_argument("--json", default=str(HERE / "results" / "hardening_cpu.json"))
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine()}
    print("out-of-memory sweep (tests/test_oom_sweep.py):", flush=True)
    report["oom_sweep"] = oom_sweep()
    s = report["oom_sweep"]
    print(f"  {s['calls']} calls, {s['trials']} trials, {s['state_changed']} with state changed, "
          f"{s['seconds']} s")
    print("corrupt checkpoints (tests/test_checkpoint_corruption.py, PYXTTS_FULL_FUZZ=1):", flush=True)
    report["corruption"] = c = corruption()
    print(f"  {c['cases']} cases, {c['accepted']} accepted, pytest exit {c['pytest_exit']}, {c['seconds']} s")
    print(f"fuzz (tests/fuzz_child.py {args.fuzz_cases} {seed}):", flush=True)
    report["fuzz"] = f = fuzz(args.fuzz_cases, seed)
    print(f"  {f['cases']} cases, {f['findings']} findings, exit {f['exit']}, {f['seconds']} s"
          + (f", died in {f['died_in']}" if "died_in" in f else ""))
    print("threads (test_failure_state.py, item 14):", flush=True)
    report["threads"] = th = threads()
    print(f"  {th['writes_tried']} writes tried during a step in another thread, {th['accepted_during_step']} "
          f"accepted while it ran, pytest exit {th['pytest_exit']}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""Compile units run in a job pool sized to the machine, through the object
cache (objcache.py) or ccache, with one progress line per unit.

pip shows a build's output only with `pip install -v` (and on failure); without
it, each line still advances pip's spinner.
"""
from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from setuptools.errors import CompileError

from objcache import ObjectCache, UnitKey, parse_depfile

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
# environment variables that change what a compiler does
_STEERING = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CPATH", "C_INCLUDE_PATH",
             "CPLUS_INCLUDE_PATH")


@dataclass
class Unit:
    """One compiler command that turns one source into one object:
    compiler + flags + -I include_dirs + -c source -o obj."""

    label: str  # "cc" or "nvcc": the progress line's verb
    compiler: list[str]  # the program and the flags it always takes
    flags: list[str]
    include_dirs: list[str]
    source: Path  # absolute
    obj: Path  # absolute
    identity: str  # the compiler's version text (part of the cache key)

    def command(self) -> list[str]:
        return [*self.compiler, *self.flags, *(f"-I{d}" for d in self.include_dirs),
                "-c", str(self.source), "-o", str(self.obj)]


def jobs() -> int:
    """PYXTTS_BUILD_JOBS, else the cores this process may run on."""
    value = os.environ.get("PYXTTS_BUILD_JOBS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"PYXTTS_BUILD_JOBS must be a positive integer, got {value!r}")
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def ccache() -> str | None:
    """ccache when it is on PATH and PYXTTS_CCACHE is not 0."""
    if os.environ.get("PYXTTS_CCACHE", "").strip() == "0":
        return None
    return shutil.which("ccache")


def compiler_identity(*programs: str) -> str:
    """The version texts of the compilers a unit runs (nvcc and its host compiler)."""
    return "".join(subprocess.run([p, "--version"], capture_output=True, text=True, check=True).stdout
                   for p in programs)


def weight(source: Path, include_dirs: list[str], seen: set[Path] | None = None) -> int:
    """Bytes of the source and the project headers it includes ("..."): an
    estimate of its compile time, so that the heaviest units start first."""
    seen = set() if seen is None else seen
    if source in seen or not source.is_file():
        return 0
    seen.add(source)
    text = source.read_text(errors="replace")
    total = len(text)
    names = _INCLUDE.findall(text)
    for name in dict.fromkeys(names):
        for base in [source.parent, *map(Path, include_dirs)]:
            if (base / name).is_file():  # a template header included n times is compiled n times
                total += names.count(name) * weight((base / name).resolve(), include_dirs, seen)
                break
    return total


class Pool:
    """Runs units, heaviest first, `njobs` at a time; a failure stops the rest."""

    def __init__(self, root: Path, njobs: int, cache: ObjectCache | None, launcher: str | None):
        self.root = root
        self.njobs = njobs
        self.cache = None if launcher else cache  # ccache, when used, caches instead
        self.launcher = launcher
        self._done = 0
        self._total = 0
        self._lock = threading.Lock()

    def _say(self, text: str) -> None:
        """One whole line at a time: the workers' lines never interleave."""
        with self._lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def _unit_key(self, unit: Unit) -> UnitKey:
        extra = {v: os.environ[v] for v in _STEERING if v in os.environ}
        return UnitKey(unit.identity, [*unit.compiler[1:], *unit.flags], unit.include_dirs,
                       str(self.root), str(unit.source), extra)

    def _compile(self, unit: Unit, command: list[str]) -> None:
        proc = subprocess.run(command, cwd=self.root, capture_output=True, text=True)
        output = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise CompileError(f"{unit.label} failed on {os.path.relpath(unit.source, self.root)} "
                               f"(exit {proc.returncode}):\n{' '.join(command)}\n{output}")
        if output:
            self._say(output)

    def _run(self, unit: Unit) -> None:
        t0 = time.monotonic()
        unit.obj.parent.mkdir(parents=True, exist_ok=True)
        how = unit.label
        if self.cache is None:
            self._compile(unit, [self.launcher, *unit.command()] if self.launcher else unit.command())
        else:
            k = self._unit_key(unit)
            key = self.cache.unit_key(k)
            if self.cache.lookup(k, key, unit.obj):
                how = "cached"
            else:
                depfile = unit.obj.with_suffix(".d")
                self._compile(unit, [*unit.command(), "-MD", "-MF", str(depfile)])
                try:
                    self.cache.store(k, key, unit.obj, parse_depfile(depfile.read_text()))
                except OSError as e:  # a full or read-only cache costs later hits, not this build
                    self._say(f"pyxtts: not cached ({e})")
        with self._lock:
            self._done += 1
            n = self._done
        rel = os.path.relpath(unit.source, self.root)
        w = len(str(self._total))
        self._say(f"pyxtts: [{n:>{w}}/{self._total}] {how:<6} {rel}  {time.monotonic() - t0:.1f} s")

    def run(self, units: list[Unit]) -> None:
        if not units:
            return
        self._total, self._done = len(units), 0
        order = sorted(units, key=lambda u: (u.label != "nvcc", -weight(u.source, u.include_dirs)))
        t0 = time.monotonic()
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with ThreadPoolExecutor(max_workers=self.njobs) as ex:
            futures = [ex.submit(self._run, u) for u in order]
            _, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for f in pending:
                f.cancel()  # those not started; the running ones finish
        failed = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
        if failed:
            raise failed[0]
        if self.cache is not None:
            self.cache.prune()
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
        self._say(f"pyxtts: {len(units)} units in {time.monotonic() - t0:.1f} s ({cpu:.1f} s of CPU in the "
                  f"compilers), {self.njobs} at a time")

"""Child processes of the tests that train: waiting until one is inside its loop, and
never leaving one running when a test fails."""
from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def wait_until_training(child: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    """Returns once the JSONL ``log`` holds a step record (``child`` is then inside its
    training loop); fails with the child's output when it ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not (log.exists() and '"type": "train"' in log.read_text()):
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.05)


@contextlib.contextmanager
def reaped(child: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``child``, killed and waited for on leaving the block if it still runs (an assertion
    that failed inside must not leave a training process behind)."""
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# a pyxtts command (argv[4:]) whose function module.name (argv[1], argv[2]) waits, once
# called, for the file argv[3] + ".go" to exist, having made argv[3] + ".started"
_PAUSED = """
import importlib, pathlib, sys, time
import pyxtts.cli
module = importlib.import_module(sys.argv[1])
real, mark = getattr(module, sys.argv[2]), pathlib.Path(sys.argv[3])
def paused(*args, **kwargs):
    mark.with_suffix(".started").touch()
    while not mark.with_suffix(".go").exists():
        time.sleep(0.02)
    return real(*args, **kwargs)
setattr(module, sys.argv[2], paused)
sys.exit(pyxtts.cli.main(sys.argv[4:]))
"""


class Paused:
    """A ``pyxtts`` command in a child process that stops when it first calls
    ``module.name`` (a file it writes with, say) until ``go()``: another command can be
    run while it holds what it holds there."""

    def __init__(self, module: str, name: str, argv: list[str], mark: Path) -> None:
        import os
        import sys

        import pyxtts

        root = str(Path(pyxtts.__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
        self.mark = mark
        self.child = subprocess.Popen([sys.executable, "-c", _PAUSED, module, name, str(mark), *argv], cwd="/",
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_until_paused(self, timeout: float = 120.0) -> None:
        """Returns once the child has stopped in ``module.name``; fails with its output when
        it ends first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not self.mark.with_suffix(".started").exists():
            assert self.child.poll() is None and time.monotonic() < deadline, self.child.communicate()
            time.sleep(0.02)

    def go(self, timeout: float = 120.0) -> tuple[int, str, str]:
        """Lets it go on; its (exit status, stdout, stderr) once it has ended."""
        self.mark.with_suffix(".go").touch()
        out, err = self.child.communicate(timeout=timeout)
        return self.child.returncode, out, err

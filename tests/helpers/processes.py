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

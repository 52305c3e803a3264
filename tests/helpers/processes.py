"""Child processes of the tests that train: waiting until one is inside its loop."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_until_training(child: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    """Returns once the JSONL ``log`` holds a step record (``child`` is then inside its
    training loop); fails with the child's output when it ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not (log.exists() and '"type": "train"' in log.read_text()):
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.05)

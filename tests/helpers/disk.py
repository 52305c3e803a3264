"""Write failures of the operating system, made for real in any test, without a mount.

``file_size_limit(n)`` lowers this process's RLIMIT_FSIZE: a write that would make any
file longer than ``n`` bytes fails with EFBIG ("File too large") in whichever writer makes
it (Python's, NumPy's, safetensors' Rust code), as a full disk fails it with ENOSPC.
SIGXFSZ, which the kernel sends with the error, is ignored meanwhile. The test must print
nothing inside (pytest's capture file is a file too).

``KILLED_BY_FILE_SIZE``: Python for a child process, defining ``die_past(n)``: from its
call on, the kernel kills the child (SIGXFSZ, its default action) in the middle of the
first write past ``n`` bytes, a crash at a moment no signal from outside hits reliably."""
from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)


KILLED_BY_FILE_SIZE = """
import resource, signal


def die_past(nbytes):
    # from here on, the first write that makes a file longer than nbytes kills this process
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # and leaves no core file
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
"""

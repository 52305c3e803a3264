"""``python record_exit.py LOG ARGS...``: runs ``python ARGS...``, appends "RANK STATUS"
to LOG when it ends and exits with its status (a negative status: killed by that signal).

torchrun says nothing of its workers' exit statuses when a signal stopped it, so the
distributed tests start each worker through this. torchrun signals a worker's process
group, which holds the child too; this process ignores SIGINT and SIGTERM so that what it
records is the child's own answer to them (SIGKILL, torchrun's last resort, ends both and
leaves no line)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys


def main() -> int:
    log, args = sys.argv[1], sys.argv[2:]
    child = subprocess.Popen([sys.executable, "-u", *args])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    status = child.wait()
    with open(log, "a", encoding="utf-8") as f:  # one short append: the ranks' lines do not mix
        f.write(f"{os.environ['RANK']} {status}\n")
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())

"""The JSONL log: one object per optimizer step (``"type": "train"``) and per evaluation
(``"type": "eval"``), flushed as written, so a run's numbers survive a crash."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from pyxtts._files import folder_problem
from pyxtts.callbacks.base import Callback, Run

__all__ = ["JSONLLog"]


def trim_log(path: Path, step: int) -> None:
    """Keeps the records of ``path`` up to ``step`` (atomically): a resumed run takes the
    steps after its checkpoint again, and each step is to be logged once. A line cut short
    by a crash is dropped."""
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and int(rec.get("step", 0)) <= step:
            kept.append(line)
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:  # a full disk: the log as it was, and no half-written copy beside it
        tmp.unlink(missing_ok=True)
        raise


class JSONLLog(Callback):
    """Writes ``run.log_path``: a fresh run starts it anew, a continuing one keeps what the
    checkpoint covers and appends."""

    def __init__(self) -> None:
        self.file: IO[str] | None = None
        self.path: Path | None = None

    def on_fit_start(self, run: Run) -> None:
        path = self.path = run.log_path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if run.continuing and path.exists():
                trim_log(path, run.state.step)
                self.file = open(path, "a", encoding="utf-8")
            else:
                self.file = open(path, "w", encoding="utf-8")
        except OSError as exc:  # before the first step: the log's path named, nothing trained
            # the default path is the checkpoint folder's: then that folder is what to fix
            default = path == Path(run.config.training.checkpoint_dir) / "train_log.jsonl"
            what = ("training.checkpoint_dir (pyxtts train --checkpoint-dir), where the log goes by default"
                    if default else "log_path (pyxtts train --log)")
            why = folder_problem(path.parent) or exc.strerror or exc
            raise type(exc)(exc.errno, f"{what}: cannot write {str(path)!r}: {why}") from exc

    def _error(self, exc: OSError) -> OSError:
        """A failed write of the log (a full disk, its folder removed) in one line naming it."""
        return type(exc)(exc.errno, f"cannot write the training log {str(self.path)!r}: {exc.strerror or exc}")

    def _write(self, run: Run, record: dict) -> None:
        if self.file is None:
            return
        try:
            if os.fstat(self.file.fileno()).st_nlink == 0:
                self._reopen(run, record)
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        except OSError as exc:
            raise self._error(exc) from exc

    def _reopen(self, run: Run, record: dict) -> None:
        """The log was removed while the run wrote it (its folder with it, say): what follows
        goes to a new file at its path, said once, rather than into a file no one can read."""
        assert self.file is not None and self.path is not None
        self.file.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "w", encoding="utf-8")
        run.warn(f"the training log {str(self.path)!r} was removed while the run wrote it; a new one there holds "
                 f"the records from step {record['step']} on")

    def on_step_end(self, run: Run, record: dict) -> None:
        self._write(run, record)

    def on_evaluation(self, run: Run, record: dict) -> None:
        self._write(run, record)

    def on_fit_end(self, run: Run, error: BaseException | None) -> None:
        file, self.file = self.file, None
        if file is None:
            return
        try:
            file.close()  # closed even when the flush before fails
        except OSError as exc:
            if error is None:  # else the error that ended the run is the one to say (a full disk, once)
                raise self._error(exc) from exc

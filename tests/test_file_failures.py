"""What a machine that misbehaves leaves of a run: a full disk under the checkpoints, the
log or the TensorBoard files, a name too long for the file system, two runs started on
one folder. Each failure is one line naming the file and the cause (no traceback from
the command line), and what existed before is there, whole, afterwards.

A full disk is made with a file size limit (``helpers.disk``: EFBIG where a full disk
gives ENOSPC, in every writer, no mount needed)."""
from __future__ import annotations

import errno
import gc
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

import pyxtts
import pyxtts.cli
from conftest import run_python
from helpers.disk import file_size_limit
from helpers.processes import reaped, wait_until_training
from pyxtts import SyntheticDataset, Trainer, XTTSConfig
from pyxtts._files import lock_folder
from pyxtts.callbacks import event_files
from pyxtts.checkpoint import read_checkpoint
from pyxtts.trainer import RunInUseError

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

MODEL = {"n_layers": 2, "d_model": 64, "n_heads": 4, "text_vocab_size": 64, "audio_vocab_size": 97,
         "max_text_tokens": 24, "max_audio_tokens": 48, "n_cond_latents": 0, "conditioning": False}
TOO_LARGE = os.strerror(errno.EFBIG)
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
NO_TENSORBOARD = "the tensorboard package is not installed"


def make_config(folder: Path, **training) -> XTTSConfig:
    t = {"learning_rate": 3e-3, "lr_schedule": "constant", "max_steps": 6, "epochs": None,
         "checkpoint_dir": str(folder / "ckpt"), "checkpoint_interval": 3, "eval_interval": 3,
         "device": "cpu", "enable_memory_cleanup": False, "max_memory_fraction": 1.0}
    t.update(training)
    return XTTSConfig.from_dict({"model": MODEL, "training": t, "data": {"batch_size": 4}})


def datasets(config: XTTSConfig, n: int = 16):
    return SyntheticDataset(config.model, n + 8, seed=0).split(8)


def steps_logged(path: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "train"]


# ---- a full disk -------------------------------------------------------------------

def test_a_full_disk_stops_train_in_one_line_naming_the_checkpoint(tmp_path, capsys):
    """`pyxtts train` on a disk that fills at its first checkpoint (the best one, after the
    evaluation before the first step): one line names the file and the cause, exit status
    2, no traceback, and the folder holds no part of a checkpoint."""
    cfg = make_config(tmp_path)
    cfg.save(tmp_path / "c.yaml")
    ck = tmp_path / "ckpt"
    with file_size_limit(64 << 10):  # the log fits; a checkpoint of this model (~0.5 MB) does not
        rc = pyxtts.cli.main(["train", "--config", str(tmp_path / "c.yaml"), "--synthetic", "24",
                              "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.splitlines()[-1] == f"pyxtts train: cannot write {str(ck / 'best.safetensors')!r}: {TOO_LARGE}", err
    assert "Traceback" not in err
    assert not [p.name for p in ck.iterdir() if ".safetensors" in p.name]


def test_a_full_disk_under_the_log_names_the_log(tmp_path, capsys):
    """The JSONL log cannot be written: the error names it, and closing the log at the end
    of fit (which fails the same way) does not hide that error behind a bare "File too
    large"; TensorBoard, which failed first, said so in a line and let the run go on."""
    cfg = make_config(tmp_path)
    train, held = datasets(cfg)
    trainer = Trainer(cfg, progress=False)
    log = trainer.log_path
    said = f"[Errno {errno.EFBIG}] cannot write the training log {str(log)!r}: {TOO_LARGE}"
    with file_size_limit(100):  # no log record fits
        with pytest.raises(OSError, match=f"^{re.escape(said)}$"):
            trainer.fit(train, held)
    if HAS_TENSORBOARD:
        assert "TensorBoard: cannot write" in capsys.readouterr().err


def test_a_checkpoint_folder_under_a_file_is_named_by_what_is_in_the_way(tmp_path, capsys):
    """`--checkpoint-dir` below a file (the log elsewhere, so the checkpoint is the first
    thing written there): the line names the checkpoint and the file in the way."""
    cfg = make_config(tmp_path, checkpoint_dir=str(tmp_path / "file" / "ckpt"))
    cfg.save(tmp_path / "c.yaml")
    (tmp_path / "file").write_text("x")
    rc = pyxtts.cli.main(["train", "--config", str(tmp_path / "c.yaml"), "--synthetic", "24", "--no-progress",
                          "--log", str(tmp_path / "log.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines()[-1] == (
        f"pyxtts train: cannot write {str(tmp_path / 'file' / 'ckpt' / 'best.safetensors')!r}: "
        f"{str(tmp_path / 'file')!r} is a file, not a folder"), err


class _RemovesTheFolder(pyxtts.callbacks.Callback):
    """Removes the run's folder, its log and checkpoints in it, after step 2."""

    def on_step_end(self, run, record):
        if record["step"] == 2:
            shutil.rmtree(run.checkpoint_dir)


def test_a_folder_removed_mid_run_gets_the_rest_of_the_run(tmp_path, capsys):
    """The run's folder is removed while it trains (an rm -rf of the wrong folder): the
    run goes on, its next checkpoints are written into the folder made anew, and the log,
    which went on into the removed file, is opened anew there, said in one line."""
    cfg = make_config(tmp_path)
    train, held = datasets(cfg)
    result = Trainer(cfg, progress=False, callbacks=[_RemovesTheFolder()]).fit(train, held)
    ck = tmp_path / "ckpt"
    assert result.step == 6 and result.checkpoint == ck / "step_00000006.safetensors"
    assert sorted(p.name for p in ck.glob("step_*")) == ["step_00000003.safetensors", "step_00000006.safetensors"]
    assert steps_logged(ck / "train_log.jsonl") == [3, 4, 5, 6]
    said = [x for x in capsys.readouterr().err.splitlines() if "was removed while the run wrote it" in x]
    assert said == [f"the training log {str(ck / 'train_log.jsonl')!r} was removed while the run wrote it; a new "
                    "one there holds the records from step 3 on"]


class _RemovesTheFolderAtTheEnd(pyxtts.callbacks.Callback):
    def on_fit_end(self, run, error):
        shutil.rmtree(run.checkpoint_dir)


def test_a_folder_removed_as_the_run_ends_is_no_error(tmp_path):
    """fit tidies a folder it made and left empty; one removed by then is nothing to tidy,
    not a FileNotFoundError raised over the finished run's result."""
    cfg = make_config(tmp_path)
    train, held = datasets(cfg)
    assert Trainer(cfg, progress=False, callbacks=[_RemovesTheFolderAtTheEnd()]).fit(train, held).step == 6
    assert not (tmp_path / "ckpt").exists()


class _CtrlC(pyxtts.callbacks.Callback):
    def on_step_end(self, run, record):
        if record["step"] == 2:
            raise KeyboardInterrupt


def test_a_fit_a_full_disk_ends_leaves_no_cycle_holding_the_trainer(tmp_path):
    """The error of a checkpoint that could not be written is raised with its cause: no
    frame on its way holds it, so the trainer (and its model's memory) goes as soon as the
    caller lets go of it, without waiting for a garbage collection; so do a trainer whose
    Ctrl-C save found the disk full and one refused a folder in use."""
    cfg = make_config(tmp_path, checkpoint_interval=100, eval_interval=100)
    train, held = datasets(cfg)
    for make_it_fail in ("disk", "ctrl-c save", "in use"):
        t = Trainer(cfg, progress=False, callbacks=[_CtrlC()] if make_it_fail == "ctrl-c save" else [])
        gone = weakref.ref(t)
        gc.disable()
        try:
            try:
                if make_it_fail != "in use":
                    with file_size_limit(64 << 10):
                        t.fit(train, held if make_it_fail == "disk" else None, overwrite=True)
                else:
                    lock = lock_folder(tmp_path / "ckpt")
                    try:
                        t.fit(train, held, resume=True)
                    finally:
                        os.close(lock)
            except OSError:
                pass
            del t
            assert gone() is None, make_it_fail
        finally:
            gc.enable()


# ---- TensorBoard -----------------------------------------------------------------------

@pytest.mark.skipif(not HAS_TENSORBOARD, reason=NO_TENSORBOARD)
def test_tensorboard_that_cannot_write_is_said_and_the_run_goes_on(tmp_path, capsys):
    """A log name whose event file's name is too long for the file system (the event file
    adds ~50 characters to it): one line names the event file and the cause, and the run
    trains to its end with its JSONL log whole."""
    cfg = make_config(tmp_path)
    train, held = datasets(cfg)
    log = tmp_path / "ckpt" / ("y" * 230 + ".jsonl")
    result = Trainer(cfg, progress=False, log_path=log).fit(train, held)
    err = capsys.readouterr().err
    assert result.step == 6 and steps_logged(log) == list(range(1, 7))
    line = next(x for x in err.splitlines() if x.startswith("TensorBoard: "))
    assert "events.out.tfevents." in line and os.strerror(errno.ENAMETOOLONG) in line
    assert "TensorBoard logging is off for the rest of this run" in line
    assert "Traceback" not in err and not event_files(log)


def failing_records(monkeypatch, after: int) -> list[int]:
    """TensorBoard's record writer fails (a full disk) from its ``after``-th record on;
    returns the count of records written, for the test to read."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    real = RecordWriter.write
    count = [0]

    def write(self, data):
        count[0] += 1
        if count[0] > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(self, data)

    monkeypatch.setattr(RecordWriter, "write", write)
    return count


@pytest.mark.skipif(not HAS_TENSORBOARD, reason=NO_TENSORBOARD)
def test_tensorboard_failing_mid_run_is_said_once_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    """The event file stops being writable after a few events: one line, no traceback of a
    writer thread, the run ends normally, every step in the JSONL log."""
    cfg = make_config(tmp_path)
    train, held = datasets(cfg)
    count = failing_records(monkeypatch, after=4)
    trainer = Trainer(cfg, progress=False)
    result = trainer.fit(train, held)
    err = capsys.readouterr().err
    assert result.step == 6 and steps_logged(trainer.log_path) == list(range(1, 7))
    said = [x for x in err.splitlines() if x.startswith("TensorBoard: ")]
    assert len(said) == 1 and os.strerror(errno.ENOSPC) in said[0], err
    assert str(event_files(trainer.log_path)[0]) in said[0]
    assert "Traceback" not in err and "Exception in thread" not in err
    assert count[0] == 5  # nothing tried after the failure


@pytest.mark.skipif(not HAS_TENSORBOARD, reason=NO_TENSORBOARD)
def test_a_resume_whose_event_file_cannot_be_written_keeps_the_earlier_one(tmp_path, capsys, monkeypatch):
    """A resumed run copies the events up to its checkpoint into a new event file, then
    removes the old one: when the copy fails, the old one stays as it was, and the new,
    partial one goes."""
    cfg = make_config(tmp_path)
    train, held = datasets(cfg)
    Trainer(cfg, progress=False).fit(train, held)
    log = Path(cfg.training.checkpoint_dir) / "train_log.jsonl"
    (before,) = event_files(log)
    kept = before.read_bytes()
    import pyxtts.callbacks.tensorboard_log as tb

    real = tb._copied

    def copied(sources, until):  # the disk fills after the copy's first record
        records = real(sources, until)
        yield next(records)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tb, "_copied", copied)
    cfg.training.max_steps = 9
    result = Trainer(cfg, progress=False).fit(train, held, resume=True)
    assert result.step == 9 and steps_logged(log) == list(range(1, 10))
    assert event_files(log) == [before] and before.read_bytes() == kept
    assert not [p.name for p in log.parent.iterdir() if ".tmp-" in p.name]  # the partial copy is gone
    assert "TensorBoard: cannot write" in capsys.readouterr().err


# ---- two runs in one folder ---------------------------------------------------------------

class _StartsAnother(pyxtts.callbacks.Callback):
    """At the first step, tries a second run into the same folder (as a second `pyxtts
    train` started by mistake would) and keeps what its error says (not the error, whose
    traceback holds this callback's frame: a cycle that would keep the trainer alive)."""

    def __init__(self, make) -> None:
        self.make = make
        self.error: tuple | None = None

    def on_step_end(self, run, record):
        if record["step"] == 1:
            trainer, train, held = self.make()
            try:
                trainer.fit(train, held, resume=True)
            except RunInUseError as exc:
                self.error = (isinstance(exc, OSError), exc.checkpoint_dir, str(exc))


def test_a_second_run_into_a_folder_in_use_is_refused_and_touches_nothing(tmp_path):
    """Two runs started on one folder would each write their checkpoints, best checkpoint
    and log there (each saying it finished, the folder a mix of both): the second is
    refused while the first holds the folder, naming it and how to go on; the first is
    unharmed, and once it ends the folder is free again."""
    cfg = make_config(tmp_path)
    train, held = datasets(cfg)

    def second():
        other = make_config(tmp_path, learning_rate=1e-3)
        return Trainer(other, progress=False), *datasets(other, n=24)

    watcher = _StartsAnother(second)
    result = Trainer(cfg, progress=False, callbacks=[watcher]).fit(train, held)
    assert result.step == 6
    assert watcher.error is not None
    is_os_error, folder, said = watcher.error
    assert is_os_error and folder == tmp_path / "ckpt"
    assert str(tmp_path / "ckpt") in said and "--checkpoint-dir" in said
    ck = tmp_path / "ckpt"
    assert steps_logged(ck / "train_log.jsonl") == list(range(1, 7))
    for p in ck.glob("*.safetensors"):  # every checkpoint the first run's
        assert read_checkpoint(p)[0]["extra"]["config"]["training"]["learning_rate"] == 3e-3, p.name
    cfg.training.max_steps = 9  # the folder is free again: the run resumes
    assert Trainer(cfg, progress=False).fit(train, held, resume=True).step == 9


def test_fit_takes_over_the_hold_of_its_folder_and_no_other(tmp_path):
    """`pyxtts train` holds the run's folder before --init writes there and hands the hold to
    the trainer (folder_hold): fit trains under it and lets go of it at its end; a hold of
    another folder is refused, let go of, and nothing is trained."""
    from pyxtts.trainer import hold_run_folder

    cfg = make_config(tmp_path)
    train, held = datasets(cfg)
    trainer = Trainer(cfg, progress=False)
    other = hold_run_folder(tmp_path / "other")
    trainer.folder_hold = other
    with pytest.raises(ValueError, match=r"folder_hold: holds '.*other', not this run's checkpoint_dir '.*ckpt'"):
        trainer.fit(train, held)
    assert trainer.step == 0 and trainer.folder_hold is None and not (tmp_path / "ckpt").exists()
    assert not (tmp_path / "other").exists()  # let go of: made for the hold, and empty
    hold = hold_run_folder(tmp_path / "ckpt")
    with pytest.raises(RunInUseError):  # held: no other run gets it meanwhile
        hold_run_folder(tmp_path / "ckpt")
    trainer.folder_hold = hold
    assert trainer.fit(train, held).step == 6
    hold_run_folder(tmp_path / "ckpt").release()  # fit let go of it


def test_a_run_that_cannot_start_leaves_no_folder_it_made(tmp_path):
    """The folder a refused fit made for its lock is removed: a mistyped folder name leaves
    nothing behind."""
    cfg = make_config(tmp_path)
    train, held = datasets(cfg)
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        Trainer(cfg, progress=False).fit(train, held, resume=str(tmp_path / "nope.safetensors"))
    assert not (tmp_path / "ckpt").exists()


def test_a_run_removes_what_saves_killed_mid_write_left_in_its_folder(tmp_path):
    """A save killed mid-write leaves its temporary file (and safetensors' scratch folder);
    the next save of that name removes them, but a run that resumes elsewhere never saves
    that name again: the run removes every one a dead process left when it takes the
    folder, and no file of a live process."""
    cfg = make_config(tmp_path)
    train, held = datasets(cfg)
    Trainer(cfg, progress=False).fit(train, held)
    pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                             text=True, check=True).stdout)  # a process that has ended
    ck = tmp_path / "ckpt"
    left = [ck / f"step_00000005.safetensors.tmp-{pid}", ck / f"best.safetensors.tmp-{pid}"]
    for p in left:
        p.write_bytes(b"half a checkpoint")
    scratch = ck / f"step_00000004.safetensors.tmp-{pid}.d"
    scratch.mkdir()
    (scratch / ".tmpXyZ123").write_bytes(b"half a checkpoint")
    alive = ck / f"notes.txt.tmp-{os.getpid()}"
    alive.write_bytes(b"a live process's")
    cfg.training.max_steps = 7
    assert Trainer(cfg, progress=False).fit(train, held, resume=True).step == 7
    assert [p.name for p in left + [scratch] if p.exists()] == []
    assert alive.read_bytes() == b"a live process's"


CLI = "import sys, pyxtts.cli; sys.exit(pyxtts.cli.main(sys.argv[1:]))"


def test_a_second_pyxtts_train_on_a_folder_in_use_names_the_process_that_holds_it(tmp_path):
    """Two `pyxtts train` started on one folder: the second exits 2 with one line naming the
    folder and the first one's process, which trains on; after it has ended (SIGTERM: it
    saves), `--resume` continues its run."""
    cfg = make_config(tmp_path, max_steps=100_000, checkpoint_interval=100_000, eval_interval=100_000)
    cfg.save(tmp_path / "c.yaml")
    args = ["train", "--config", str(tmp_path / "c.yaml"), "--synthetic", "24", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(pyxtts.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.Popen([sys.executable, "-c", CLI, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    ck = tmp_path / "ckpt"
    with reaped(first):
        wait_until_training(first, ck / "train_log.jsonl")
        second = run_python(CLI, *args, "--resume", cwd=str(tmp_path))
        assert first.poll() is None
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert second.returncode == 2, second.stderr
    assert second.stderr.splitlines()[-1].startswith(
        f"pyxtts train: {str(ck)!r} is in use by another training run (process {first.pid}): "), second.stderr
    assert "Traceback" not in second.stderr
    assert first.returncode == 128 + signal.SIGTERM, err[-2000:]
    last = steps_logged(ck / "train_log.jsonl")[-1]
    r = run_python(CLI, *args, "--resume", "--max-steps", str(last + 1), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert steps_logged(ck / "train_log.jsonl") == list(range(1, last + 2))


def test_a_run_whose_output_pipe_closes_trains_to_its_end(tmp_path):
    """`pyxtts train 2>&1 | head -1`: once the reader has gone, every progress line raised
    BrokenPipeError, so the run died at the next one, with no checkpoint. The lines are now
    dropped and the run trains to its end; the summary it cannot print makes the exit
    status a shell's for a command SIGPIPE ended (141)."""
    cfg = make_config(tmp_path, max_steps=12, log_interval=1)
    cfg.save(tmp_path / "c.yaml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(pyxtts.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CLI, "train", "--config", str(tmp_path / "c.yaml"),
                              "--synthetic", "24"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        line = child.stdout.readline()
        while line and not line.startswith("pyxtts train: "):  # a warning of Python's before it
            line = child.stdout.readline()
        assert line.startswith("pyxtts train: on a synthetic set"), line
        child.stdout.close()  # head has read its line
        assert child.wait(timeout=120) == 141
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    ck = tmp_path / "ckpt"
    assert steps_logged(ck / "train_log.jsonl") == list(range(1, 13))
    assert (ck / "step_00000012.safetensors").is_file()

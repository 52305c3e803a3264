"""TensorBoard event files of a run, beside its JSONL log in the run's folder
(``events.out.tfevents.<time>.<host>.<pid>.<n>.<log name>``; ``tensorboard --logdir`` the
folder): the numbers of the log's records as scalars, the run's config as text, and the
test sentences spoken at each evaluation (``training.test_sentences``) as audio.

Written with the ``tensorboard`` package's own record writer and protocol buffers (no
TensorFlow, no torch), imported when the run starts: without the package (``pip install
'pyxtts[tensorboard]'``) one line says so and the run goes on. The events are written in the
training thread and flushed as they come, as the JSONL log's records are: a file that cannot
be written (a full disk, a name too long for the file system) is said in one line, naming
it, and the run goes on without TensorBoard (the JSONL log holds the same numbers); event
files of earlier runs are then left as they were. The folder holds one event file: a resumed run copies the events up to its checkpoint's step into a new one and
removes the old, as the JSONL log is trimmed, so each step shows once (event files of one
process in one second do not sort in the order they were written, so TensorBoard's own
restart markers cannot be relied on).

The copy is made under a temporary name and renamed into place once complete, so a resume
stopped during it (Ctrl-C, a kill) leaves the old file as it was: the next resume copies
from it again. Before that, such a stop left the copy's first part beside the old file, and
every later resume copied both, each step shown twice and more. The records are copied as
they are on disk (their checksums with them), not decoded and encoded again: the tensorboard
package computes the checksums in Python, which made a resume at step 50,000 take 15-26 s."""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from pyxtts._files import remove_stale_temps
from pyxtts.callbacks.base import Callback, Run

__all__ = ["EVAL_SCALARS", "TRAIN_SCALARS", "TensorBoardLog", "event_files", "tensorboard_dir"]

# tag -> key of the JSONL record it is taken from
TRAIN_SCALARS = {
    "train/loss": "loss", "train/text_loss": "text_loss", "train/audio_loss": "audio_loss",
    "train/learning_rate": "lr", "train/grad_norm": "grad_norm", "train/skipped_step": "skipped",
    "train/loss_scale": "loss_scale", "train/tokens_per_s": "tokens_per_s",
    "train/tokens_per_s_avg": "tokens_per_s_avg", "train/micro_batch_size": "micro_batch_size",
    "train/accumulation_steps": "accumulation_steps", "train/oom_splits": "oom_splits",
    "train/data_wait_s": "data_wait_s",
    "memory/peak_allocated_bytes": "peak_allocated_bytes", "memory/rss_bytes": "rss_bytes",
    "memory/optimizer_host_bytes": "optimizer_host_bytes",
}
EVAL_SCALARS = {"eval/loss": "loss", "eval/text_loss": "text_loss", "eval/audio_loss": "audio_loss"}
INSTALL_HINT = ("note: TensorBoard logging is off because the tensorboard package is not installed; "
                "pip install 'pyxtts[tensorboard]' turns it on")


def tensorboard_dir(log_path: Path) -> Path:
    """The event files' folder of the JSONL log ``log_path``: its own."""
    return log_path.parent


def event_files(log_path: Path) -> list[Path]:
    """The event files of the JSONL log ``log_path`` (named after it, so that a folder
    holding other runs' logs keeps theirs)."""
    return sorted(tensorboard_dir(log_path).glob(f"events.out.tfevents.*.{log_path.stem}"))


_numbers = itertools.count()  # the <n> of this process's event file names


def _new_name(log_path: Path) -> str:
    """A new event file's name, as the tensorboard package names them."""
    return (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
            f"{next(_numbers)}.{log_path.stem}")


def _scratch_name(log_path: Path) -> str:
    """The name (less ``.tmp-<pid>``) a resume's copy is made under: no ``tfevents`` in it,
    so that a TensorBoard watching the folder does not read it."""
    return f".{log_path.stem}.tensorboard"


def _records(path: Path) -> Iterator[bytes]:
    """The records of the event file ``path`` in order, each as it is on disk: its length,
    the length's checksum, the event, the event's checksum. The length's checksum is checked,
    so that a damaged length ends the reading instead of misframing what follows; the
    event's is not (in Python it took most of a resume's time). A record cut short by a
    crash ends the reading, as it ends TensorBoard's."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    with open(path, "rb") as f:
        while True:
            head = f.read(12)
            if len(head) < 12 or struct.unpack("<I", head[8:])[0] != masked_crc32c(head[:8]):
                return
            size = struct.unpack("<Q", head[:8])[0]
            rest = f.read(size + 4)
            if len(rest) < size + 4:
                return
            yield head + rest


class _Writer:
    """The tensorboard package's pieces this module uses, imported together, and the event
    file ``path`` they append to."""

    def __init__(self, path: Path) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
        from tensorboard.plugins.audio import metadata as audio_metadata
        from tensorboard.plugins.scalar import metadata as scalar_metadata
        from tensorboard.plugins.text import metadata as text_metadata
        from tensorboard.summary.writer.record_writer import RecordWriter

        self.event_pb2, self.summary_pb2, self.tensor_pb2 = event_pb2, summary_pb2, tensor_pb2
        self.shape_pb2 = tensor_shape_pb2
        self.audio_meta = audio_metadata.create_summary_metadata(
            display_name=None, description=None, encoding=audio_metadata.Encoding.Value("WAV"))
        self.scalar_meta = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=scalar_metadata.PLUGIN_NAME),
            data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR)
        self.text_meta = text_metadata.create_summary_metadata(display_name=None, description=None)
        self.path = path
        self.file: IO[bytes] = open(path, "ab")
        self.records = RecordWriter(self.file)

    def _event(self, step: int, wall_time: float) -> Any:
        return self.event_pb2.Event(wall_time=wall_time, step=step)

    def _add(self, event: Any) -> None:
        """Appends ``event``, flushed at once, as the JSONL log's records are: a crash loses none."""
        self.records.write(event.SerializeToString())
        self.file.flush()

    def scalars(self, step: int, values: dict[str, float], wall_time: float) -> None:
        event = self._event(step, wall_time)
        for tag, v in values.items():
            # float64, so that the numbers are the log's to the last bit
            tensor = self.tensor_pb2.TensorProto(dtype="DT_DOUBLE", double_val=[float(v)])
            event.summary.value.add(tag=tag, tensor=tensor, metadata=self.scalar_meta)
        self._add(event)

    def text(self, step: int, tag: str, text: str) -> None:
        event = self._event(step, time.time())
        tensor = self.tensor_pb2.TensorProto(dtype="DT_STRING", string_val=[text.encode("utf-8")])
        event.summary.value.add(tag=tag, tensor=tensor, metadata=self.text_meta)
        self._add(event)

    def audio(self, step: int, tag: str, wav: bytes, label: str) -> None:
        """One encoded WAV clip and its label, as TensorBoard's audio plugin reads them: a
        (clips, 2) string tensor of [audio, label] rows."""
        event = self._event(step, time.time())
        dims = [self.shape_pb2.TensorShapeProto.Dim(size=1), self.shape_pb2.TensorShapeProto.Dim(size=2)]
        tensor = self.tensor_pb2.TensorProto(dtype="DT_STRING", string_val=[wav, label.encode("utf-8")],
                                             tensor_shape=self.shape_pb2.TensorShapeProto(dim=dims))
        event.summary.value.add(tag=tag, tensor=tensor, metadata=self.audio_meta)
        self._add(event)

    def close(self) -> None:
        self.file.close()


def _copied(sources: list[Path], until: int) -> Iterator[bytes]:
    """The summary records of the event files ``sources`` up to step ``until``, in order, but
    the config at ``until``, which the resumed run writes again (each resume at the same step
    once added one more). A record met twice is copied once: two files are there only when
    a resume stopped between renaming its copy into place and removing the old file, and
    then the copy's records are the old file's, byte for byte."""
    from tensorboard.compat.proto import event_pb2

    seen: set[bytes] = set()
    for path in sources:
        for record in _records(path):
            event = event_pb2.Event.FromString(record[12:-4])
            if not event.HasField("summary") or event.step > until:
                continue
            if event.step == until and all(v.tag == "config" for v in event.summary.value):
                continue
            if len(sources) > 1:
                digest = hashlib.blake2b(record, digest_size=16).digest()
                if digest in seen:
                    continue
                seen.add(digest)
            yield record


def _write_file(path: Path, scratch: Path, sources: list[Path], until: int) -> None:
    """Writes the event file ``path``: a file-version event, then the records of ``sources``
    up to ``until`` (``_copied``). Made as ``scratch``, fsynced and renamed into place, so
    that ``path`` appears complete or not at all."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    try:
        with open(scratch, "wb") as f:
            head = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
            RecordWriter(f).write(head.SerializeToString())
            for record in _copied(sources, until):
                f.write(record)
            f.flush()
            os.fsync(f.fileno())
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)


class TensorBoardLog(Callback):
    def __init__(self) -> None:
        self.writer: _Writer | None = None
        self.told = False  # the missing package is said once per trainer

    def _failed(self, run: Run, exc: OSError, path: Path) -> None:
        """A write failed: said once, and the run goes on without TensorBoard."""
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass
        run.warn(f"TensorBoard: cannot write {str(path)!r}: {exc.strerror or exc}; TensorBoard logging is off "
                 f"for the rest of this run (the JSONL log {str(run.log_path)!r} has the same numbers)")

    def _written(self, run: Run, write: Any) -> None:
        """``write(writer)`` when there is a writer; a failure turns TensorBoard off."""
        writer = self.writer
        if writer is None:
            return
        try:
            write(writer)
        except OSError as exc:
            self._failed(run, exc, writer.path)

    def on_fit_start(self, run: Run) -> None:
        try:
            import tensorboard  # noqa: F401 - only whether it is there
        except ImportError:
            if not self.told:
                run.warn(INSTALL_HINT)  # seen with --no-progress too
                self.told = True
            return
        folder = tensorboard_dir(run.log_path)
        path = folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
            scratch = _scratch_name(run.log_path)
            remove_stale_temps(folder, scratch)  # the copy of a resume that was killed
            earlier = event_files(run.log_path)
            if not run.continuing:  # a fresh run starts anew
                for old in earlier:
                    old.unlink()
                earlier = []
            path = folder / _new_name(run.log_path)
            while path.exists():  # (a name taken in the same second by this process)
                path = folder / _new_name(run.log_path)
            # what the checkpoint covers goes on, complete in the new file before the old ones go;
            # a failure leaves them as they were
            _write_file(path, folder / f"{scratch}.tmp-{os.getpid()}", earlier, run.state.step)
            for old in earlier:
                old.unlink()
            self.writer = _Writer(path)
        except OSError as exc:
            self._failed(run, exc, path)
            return
        config = json.dumps(run.config.to_dict(), indent=2)
        # TensorBoard's text tab renders Markdown: four spaces make it a code block
        text = "\n".join("    " + line for line in config.splitlines())
        self._written(run, lambda w: w.text(run.state.step, "config", text))

    def on_step_end(self, run: Run, record: dict) -> None:
        values = {t: record[k] for t, k in TRAIN_SCALARS.items() if record.get(k) is not None}
        self._written(run, lambda w: w.scalars(record["step"], values, record["time"]))

    def on_evaluation(self, run: Run, record: dict) -> None:
        values = {t: record[k] for t, k in EVAL_SCALARS.items()}
        self._written(run, lambda w: w.scalars(record["step"], values, time.time()))

    def on_audio(self, run: Run, step: int, clips: list[tuple[Path, str]]) -> None:
        for i, (path, text) in enumerate(clips):
            if self.writer is not None:
                wav = path.read_bytes()
                self._written(run, lambda w, i=i, wav=wav, text=text: w.audio(step, f"samples/{i}", wav, text))

    def on_fit_end(self, run: Run, error: BaseException | None) -> None:
        self._written(run, lambda w: w.close())
        self.writer = None

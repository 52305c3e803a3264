"""Watching a run: the Trainer's callbacks (events, order, state), TensorBoard event files
against the JSONL log, the best checkpoint, early stopping, and the loop's clean-up on
every way out (issue 25)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

import pyxtts
from pyxtts import SyntheticDataset, Trainer, XTTSConfig
from pyxtts.callbacks import BEST_NAME, Callback, event_files, tensorboard_dir
from pyxtts.callbacks.tensorboard_log import EVAL_SCALARS, INSTALL_HINT, TRAIN_SCALARS
from pyxtts.checkpoint import read_checkpoint
from pyxtts.data import Sample
from helpers import Interrupting
from pyxtts.fingerprint import check_fingerprint, data_fingerprint
from pyxtts.trainer import run_checkpoint

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

MODEL = {"n_layers": 2, "d_model": 64, "n_heads": 4, "text_vocab_size": 64, "audio_vocab_size": 97,
         "max_text_tokens": 24, "max_audio_tokens": 48, "n_cond_latents": 0, "conditioning": False}


def make_config(folder: Path, num_workers: int = 0, **training) -> XTTSConfig:
    # a learning rate high enough that the eval loss goes up and down: the best is not the last
    t = {"learning_rate": 3e-2, "lr_schedule": "constant", "max_steps": 30, "epochs": None,
         "checkpoint_dir": str(folder / "ckpt"), "checkpoint_interval": 5, "eval_interval": 3,
         "log_interval": 1, "device": "cpu", "enable_memory_cleanup": False, "max_memory_fraction": 1.0}
    t.update(training)
    return XTTSConfig.from_dict({"model": MODEL, "training": t,
                                 "data": {"batch_size": 4, "bucketing": True, "bucket_size_multiplier": 2,
                                          "num_workers": num_workers}})


def datasets(config: XTTSConfig, n: int = 16):
    return SyntheticDataset(config.model, n + 8, seed=0).split(8)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def saved_meta(path: Path) -> dict:
    return read_checkpoint(path)[0]


class Recorder(Callback):
    """Writes down every event it gets."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_fit_start(self, run):
        self.events.append(("fit_start", run.state.step))

    def on_resume(self, run, path):
        self.events.append(("resume", Path(path).name))

    def on_train_start(self, run):
        self.events.append(("train_start", run.state.step))

    def on_step_end(self, run, record):
        self.events.append(("step", record["step"]))

    def on_evaluation(self, run, record):
        self.events.append(("eval", record["step"]))

    def on_checkpoint(self, run, path):
        self.events.append(("checkpoint", Path(path).name))

    def on_train_end(self, run):
        self.events.append(("train_end", run.state.step))

    def on_fit_end(self, run, error):
        self.events.append(("fit_end", type(error).__name__ if error is not None else None))


# ---- events -------------------------------------------------------------------------

def test_events_come_in_the_order_of_the_run(tmp_path):
    cfg = make_config(tmp_path, max_steps=5, eval_interval=2, checkpoint_interval=4, learning_rate=3e-3)
    train, held = datasets(cfg)
    rec = Recorder()
    r = Trainer(cfg, progress=False, callbacks=[rec]).fit(train, held)
    assert r.stopped == "max_steps"
    assert rec.events == [
        ("fit_start", 0), ("train_start", 0), ("eval", 0), ("checkpoint", BEST_NAME),
        ("step", 1), ("step", 2), ("eval", 2), ("checkpoint", BEST_NAME),
        ("step", 3), ("step", 4), ("eval", 4), ("checkpoint", BEST_NAME), ("checkpoint", "step_00000004.safetensors"),
        ("step", 5), ("eval", 5), ("checkpoint", BEST_NAME), ("checkpoint", "step_00000005.safetensors"),
        ("train_end", 5), ("fit_end", None)]


def test_ctrl_c_ends_with_fit_end_the_checkpoint_and_the_threads(tmp_path):
    """Ctrl-C mid-epoch (in a collating thread's read): every callback's on_fit_end gets
    the KeyboardInterrupt, the checkpoint is saved, and no collating thread outlives fit,
    even while the exception (and its traceback) is still held."""
    cfg = make_config(tmp_path, num_workers=2, max_steps=20, eval_interval=100, checkpoint_interval=100)
    train, _ = datasets(cfg)
    rec = Recorder()
    t = Trainer(cfg, progress=False, callbacks=[rec])
    with pytest.raises(KeyboardInterrupt) as caught:
        t.fit(Interrupting(train, after=16 + 4 * 2 + 3))  # lengths, then 2 batches, then mid-batch
    alive = [th.name for th in threading.enumerate() if th.name.startswith("pyxtts-collate")]
    assert caught.value.__traceback__ is not None and alive == [], alive
    del caught  # its traceback holds this frame: a cycle that would keep the trainer until a collection
    assert rec.events[-2:] == [("checkpoint", f"step_{t.step:08d}.safetensors"), ("fit_end", "KeyboardInterrupt")]
    assert 0 < t.step < 20 and t.checkpoints()[-1].name == f"step_{t.step:08d}.safetensors"


def test_an_error_ends_with_fit_end_and_no_thread(tmp_path, monkeypatch):
    cfg = make_config(tmp_path, num_workers=2, max_steps=20)
    train, _ = datasets(cfg)
    rec = Recorder()

    def failing(*args, **kwargs):
        raise RuntimeError("the step failed")

    monkeypatch.setattr(pyxtts.trainer, "train_step_with_accumulation", failing)
    with pytest.raises(RuntimeError, match="the step failed"):
        Trainer(cfg, progress=False, callbacks=[rec]).fit(train)
    assert [th.name for th in threading.enumerate() if th.name.startswith("pyxtts-collate")] == []
    assert rec.events[-1] == ("fit_end", "RuntimeError") and ("train_end", 0) not in rec.events
    assert not list((tmp_path / "ckpt").glob("step_*"))  # an error is no Ctrl-C: nothing saved


def test_callbacks_must_be_callbacks(tmp_path):
    cfg = make_config(tmp_path)
    with pytest.raises(TypeError, match=r"callbacks\[1\]: expected a pyxtts.callbacks.Callback, got dict"):
        Trainer(cfg, progress=False, callbacks=[Recorder(), {}])
    with pytest.raises(TypeError, match="callbacks: expected a sequence"):
        Trainer(cfg, progress=False, callbacks=Recorder())


def test_the_position_follows_from_the_step(tmp_path):
    """(epoch, batch_in_epoch) = divmod(step, steps an epoch), also after a load; a
    checkpoint whose position contradicts its step is refused, nothing loaded."""
    cfg = make_config(tmp_path, max_steps=7, checkpoint_interval=100)
    train, _ = datasets(cfg, 10)  # 3 steps an epoch
    t = Trainer(cfg, progress=False)
    r = t.fit(train)
    assert (t.step, t.epoch, t.batch_in_epoch, r.epoch) == (7, 2, 1, 2)
    other = Trainer(cfg, progress=False)
    other.load(r.checkpoint)
    assert (other.step, other.epoch, other.batch_in_epoch) == (7, 2, 1)
    bad = tmp_path / "bad.safetensors"
    pyxtts.save_checkpoint(bad, t.model, t.optimizer, step=7, extra={"epoch": 0, "batch_in_epoch": 1})
    fresh = Trainer(cfg, progress=False)
    before = fresh.model.state_dict()
    with pytest.raises(pyxtts.CheckpointError, match=r"epoch 0, batch 1\) does not follow from its step 7"):
        fresh.load(bad)
    assert fresh.step == 0
    for k, v in before.items():
        assert np.array_equal(v, fresh.model.state_dict()[k]), k


# ---- TensorBoard ------------------------------------------------------------------------

def read_events(folder: Path) -> dict[str, list[tuple[int, object]]]:
    """tag -> [(step, value)] as TensorBoard's own reader gives them."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    return {tag: [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def assert_events_match_log(folder: Path, log: list[dict]) -> None:
    """Every number of the event files is the log's, every one of the log's is there."""
    events = read_events(folder)
    train = [x for x in log if x["type"] == "train"]
    evals = [x for x in log if x["type"] == "eval"]
    for tag, key in TRAIN_SCALARS.items():
        want = [(x["step"], float(x[key])) for x in train if x.get(key) is not None]
        assert [(s, float(v)) for s, v in events.get(tag, [])] == want, tag
    for tag, key in EVAL_SCALARS.items():
        assert [(s, float(v)) for s, v in events[tag]] == [(x["step"], float(x[key])) for x in evals], tag
    assert set(events) <= set(TRAIN_SCALARS) | set(EVAL_SCALARS) | {"config"}


def test_tensorboard_events_are_the_jsonl_numbers(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra (pip install 'pyxtts[tensorboard]') "
                                              "is not installed")
    cfg = make_config(tmp_path, max_steps=8, eval_interval=3)
    train, held = datasets(cfg)
    r = Trainer(cfg, progress=False).fit(train, held)
    folder = tensorboard_dir(r.log_path)
    assert folder == tmp_path / "ckpt" and [p.name.endswith(".train_log") for p in event_files(r.log_path)] == [True]
    log = read_log(r.log_path)
    assert_events_match_log(folder, log)
    events = read_events(folder)
    # the scalars the issue names are all there
    for tag in ("train/loss", "train/text_loss", "train/audio_loss", "eval/loss", "eval/text_loss",
                "eval/audio_loss", "train/learning_rate", "train/grad_norm", "train/skipped_step",
                "train/tokens_per_s", "train/micro_batch_size", "train/accumulation_steps",
                "memory/peak_allocated_bytes", "memory/rss_bytes", "memory/optimizer_host_bytes"):
        assert len(events[tag]) == (8 if tag.startswith(("train", "memory")) else 4), tag
    assert [x["accumulation_steps"] for x in log if x["type"] == "train"] == [1] * 8
    (step, text), = events["config"]
    assert step == 0 and json.loads(text.item().decode()) == cfg.to_dict()


def test_tensorboard_after_a_resume_shows_each_step_once(tmp_path):
    """Interrupted and resumed: TensorBoard's reader gives what the trimmed JSONL log
    holds (the steps taken again replace the first file's), and those are the numbers of
    a run that never stopped."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra (pip install 'pyxtts[tensorboard]') "
                                              "is not installed")
    cfg_a = make_config(tmp_path / "a", max_steps=12, eval_interval=3, checkpoint_interval=4)
    train, held = datasets(cfg_a)
    ra = Trainer(cfg_a, progress=False).fit(train, held)
    cfg_b = make_config(tmp_path / "b", max_steps=12, eval_interval=3, checkpoint_interval=4)
    b = Trainer(cfg_b, progress=False)
    with pytest.raises(KeyboardInterrupt):  # after 6 steps (4 an epoch), in the 7th
        b.fit(Interrupting(train, after=16 + 16 + 16 + 4 * 2 + 2), held)
    assert b.step == 6
    # resumed from step 4, the newest checkpoint but the one Ctrl-C wrote: steps 5, 6 again
    (tmp_path / "b" / "ckpt" / "step_00000006.safetensors").unlink()
    rb = Trainer(cfg_b, progress=False).fit(train, held, resume=True)
    folder = tensorboard_dir(rb.log_path)
    assert len(event_files(rb.log_path)) == 1  # the steps before the checkpoint copied, the first file gone
    log_b = read_log(rb.log_path)
    assert [x["step"] for x in log_b if x["type"] == "train"] == list(range(1, 13))
    assert_events_match_log(folder, log_b)
    la = read_log(ra.log_path)
    assert [x["loss"] for x in la] == [x["loss"] for x in log_b]


def logged_steps(log_path: Path, tag: str = "train/loss") -> list[int]:
    """The step of every ``tag`` event in the log's event files, read record by record (the
    accumulator of ``read_events`` drops the older of two events of a step)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return [e.step for f in event_files(log_path) for e in EventFileLoader(str(f)).Load()
            for v in e.summary.value if v.tag == tag]


def test_a_resume_stopped_while_it_copies_the_events_leaves_them_whole(tmp_path, monkeypatch):
    """Ctrl-C while a resume copied the events to its new file left the copy's first part
    beside the old file; every later resume copied both, so TensorBoard got those steps
    twice, then more (after 20 resumes stopped at random, 11,000 of 11,750 steps were there
    two to five times). The old file stays whole until the copy is complete."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra (pip install 'pyxtts[tensorboard]') "
                                              "is not installed")
    import io

    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    cfg = make_config(tmp_path, max_steps=8, eval_interval=4, checkpoint_interval=4)
    train, held = datasets(cfg)
    r = Trainer(cfg, progress=False).fit(train, held)
    folder = tensorboard_dir(r.log_path)
    (events,) = event_files(r.log_path)
    # the steps of a run killed long after its checkpoint: the copy reads them and leaves them out
    later = io.BytesIO()
    RecordWriter(later).write(event_pb2.Event(step=10**6, wall_time=1.0, summary={"value": [
        {"tag": "train/loss", "tensor": {"dtype": "DT_DOUBLE", "double_val": [1.0]}}]}).SerializeToString())
    with open(events, "ab") as f:
        f.write(later.getvalue() * 100)
    parse, read = event_pb2.Event.FromString, [0]

    def ctrl_c_among_the_later_ones(data: bytes):  # once the run's own events are copied
        read[0] += 1
        if read[0] == 40:
            raise KeyboardInterrupt
        return parse(data)

    monkeypatch.setattr(event_pb2.Event, "FromString", staticmethod(ctrl_c_among_the_later_ones))
    cfg.training.max_steps = 12
    with pytest.raises(KeyboardInterrupt):
        Trainer(cfg, progress=False).fit(train, held, resume=True)
    assert read[0] == 40
    monkeypatch.setattr(event_pb2.Event, "FromString", parse)
    r = Trainer(cfg, progress=False).fit(train, held, resume=True)
    assert logged_steps(r.log_path) == list(range(1, 13))
    assert_events_match_log(folder, read_log(r.log_path))
    assert len(event_files(r.log_path)) == 1
    assert not [p.name for p in folder.iterdir() if ".tmp" in p.name]


def test_a_resume_stopped_before_it_removed_the_old_events_shows_each_step_once(tmp_path, monkeypatch):
    """Stopped between the copy's completion and the old file's removal, a resume left two
    whole event files; the next one copied both, each step twice."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra (pip install 'pyxtts[tensorboard]') "
                                              "is not installed")
    cfg = make_config(tmp_path, max_steps=8, eval_interval=4, checkpoint_interval=4)
    train, held = datasets(cfg)
    Trainer(cfg, progress=False).fit(train, held)
    unlink = Path.unlink

    def stopped(path: Path, missing_ok: bool = False) -> None:
        if path.name.startswith("events.out.tfevents."):
            monkeypatch.setattr(Path, "unlink", unlink)
            raise KeyboardInterrupt
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", stopped)
    cfg.training.max_steps = 12
    with pytest.raises(KeyboardInterrupt):
        Trainer(cfg, progress=False).fit(train, held, resume=True)
    r = Trainer(cfg, progress=False).fit(train, held, resume=True)
    assert logged_steps(r.log_path) == list(range(1, 13))
    assert_events_match_log(tensorboard_dir(r.log_path), read_log(r.log_path))
    assert len(event_files(r.log_path)) == 1


def test_without_tensorboard_one_line_says_how_and_training_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "tensorboard", None)  # import tensorboard fails
    cfg = make_config(tmp_path, max_steps=3)
    train, held = datasets(cfg)
    t = Trainer(cfg, progress=False)  # said without progress too
    r = t.fit(train, held)
    cfg.training.max_steps = 4
    t.fit(train, held)  # a second fit says it no more
    err = capsys.readouterr().err
    assert r.step == 3 and t.step == 4
    assert [line for line in err.splitlines() if "pyxtts[tensorboard]" in line] == [INSTALL_HINT]
    assert "pip install 'pyxtts[tensorboard]'" in INSTALL_HINT
    assert event_files(r.log_path) == []


# ---- the best checkpoint and early stopping ------------------------------------------

def test_best_checkpoint_follows_the_lowest_eval_loss(tmp_path):
    cfg = make_config(tmp_path, keep_checkpoints=1)
    train, held = datasets(cfg)
    t = Trainer(cfg, progress=False)
    r = t.fit(train, held)
    losses = [e["loss"] for e in r.evals]
    best = int(np.argmin(losses))
    assert 0 < best < len(losses) - 1, losses  # the best is neither the first nor the last
    assert r.best_checkpoint == tmp_path / "ckpt" / BEST_NAME == t.best_checkpoint
    meta = saved_meta(r.best_checkpoint)
    assert meta["step"] == r.evals[best]["step"]
    assert meta["extra"]["callbacks"]["best"] == {"loss": losses[best], "step": r.evals[best]["step"],
                                                   "evaluations_since": 0}
    # its weights are the ones that scored that loss; the optimizer's state is not there
    other = Trainer(cfg, progress=False)
    pyxtts.load_checkpoint(r.best_checkpoint, other.model)
    assert other.evaluate(held)["loss"] == losses[best]
    assert not [k for k in read_checkpoint(r.best_checkpoint)[1] if k.startswith("optimizer.")]
    assert r.best_checkpoint.stat().st_size < 0.5 * r.checkpoint.stat().st_size
    # never pruned: keep_checkpoints 1 keeps one step checkpoint and the best
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.safetensors")) == [BEST_NAME, "step_00000030.safetensors"]
    assert run_checkpoint(tmp_path / "ckpt", "best") == r.best_checkpoint
    assert run_checkpoint(tmp_path / "ckpt", "latest") == r.checkpoint


def stop_step(evals: list[dict], patience: int) -> int | None:
    """Where early stopping with `patience` ends a run whose evaluations are `evals`."""
    best, since = None, 0
    for e in evals:
        if best is None or e["loss"] < best:
            best, since = e["loss"], 0
        else:
            since += 1
            if since >= patience:
                return e["step"]
    return None


def test_early_stopping_stops_at_the_stated_evaluation(tmp_path, capsys):
    cfg_a = make_config(tmp_path / "a")
    train, held = datasets(cfg_a)
    full = Trainer(cfg_a, progress=False).fit(train, held)
    want = stop_step(full.evals, 1)
    assert want is not None and want < 30
    cfg = make_config(tmp_path / "b", early_stopping_patience=1)
    t = Trainer(cfg, progress=False)
    r = t.fit(train, held)
    assert (r.stopped, r.step) == ("early_stopping", want)
    assert [e["loss"] for e in r.evals] == [e["loss"] for e in full.evals if e["step"] <= want]
    assert r.checkpoint.name == f"step_{want:08d}.safetensors"  # the end is saved, as at any end
    err = capsys.readouterr().err
    assert f"early stopping at step {want}: the eval loss has not improved for 1 evaluations" in err
    # the run stays stopped: resumed, it takes no step
    again = Trainer(cfg, progress=False).fit(train, held, resume=True)
    assert (again.stopped, again.step, again.history) == ("early_stopping", want, [])


def test_resume_keeps_the_best_so_far(tmp_path):
    """Interrupted after the best evaluation and resumed: the evaluations after the resume
    do not beat it, so only a best-so-far carried through the checkpoint keeps it (a
    resumed run that forgot it would take its first evaluation as the best)."""
    cfg_a = make_config(tmp_path / "a", max_steps=19, early_stopping_patience=5)
    train, held = datasets(cfg_a)
    ra = Trainer(cfg_a, progress=False).fit(train, held)
    best_a = saved_meta(ra.best_checkpoint)
    assert best_a["step"] <= 16 < ra.evals[-1]["step"], [(e["step"], e["loss"]) for e in ra.evals]
    cfg_b = make_config(tmp_path / "b", max_steps=19, early_stopping_patience=5)
    b = Trainer(cfg_b, progress=False)
    with pytest.raises(KeyboardInterrupt):  # 16 steps are 4 epochs; then in the 17th step
        b.fit(Interrupting(train, after=4 * (16 + 16) + 16 + 2), held)
    assert b.step == 16
    saved = saved_meta(b.checkpoints()[-1])["extra"]["callbacks"]["best"]
    assert saved == b.callbacks.state_dict()["best"] and saved["step"] == best_a["step"]
    rb = Trainer(cfg_b, progress=False).fit(train, held, resume=True)
    assert (rb.stopped, rb.step) == (ra.stopped, ra.step) == ("max_steps", 19)
    assert [e["loss"] for e in rb.evals] == [e["loss"] for e in ra.evals if e["step"] > 16]
    best_b = saved_meta(rb.best_checkpoint)
    assert best_b["step"] == best_a["step"] and best_b["extra"]["callbacks"] == best_a["extra"]["callbacks"]
    ta, tb = read_checkpoint(ra.best_checkpoint)[1], read_checkpoint(rb.best_checkpoint)[1]
    assert set(ta) == set(tb) and all(np.array_equal(ta[k], tb[k]) for k in ta)
    final = saved_meta(rb.checkpoint)["extra"]["callbacks"]["best"]
    assert final["step"] == best_a["step"] and final["evaluations_since"] == len(rb.evals)


@pytest.mark.parametrize("value, kind, said", [
    (0, ValueError, "training.early_stopping_patience: must be an int >= 1 (evaluations without improvement) "
                    "or null (no early stopping), got 0"),
    (-2, ValueError, "got -2"),
    ("3", TypeError, "training.early_stopping_patience: expected int, got '3' (str)"),
    (2.5, TypeError, "training.early_stopping_patience: expected int, got 2.5 (float)"),
    (True, TypeError, "training.early_stopping_patience: expected int, got True (bool)"),
])
def test_bad_patience_is_refused_by_its_name(tmp_path, value, kind, said):
    with pytest.raises(kind) as caught:
        make_config(tmp_path, early_stopping_patience=value)
    assert said in str(caught.value)


def test_patience_without_evaluation_data_is_refused_before_any_step(tmp_path):
    cfg = make_config(tmp_path, early_stopping_patience=2)
    train, _ = datasets(cfg)
    t = Trainer(cfg, progress=False)
    with pytest.raises(ValueError, match="eval_dataset: expected evaluation samples, since "
                                         "training.early_stopping_patience is 2"):
        t.fit(train)
    assert t.step == 0 and not (tmp_path / "ckpt").exists()


# ---- what a resume compares ---------------------------------------------------------------

def test_fingerprint_covers_reference_recordings_and_their_masking(tmp_path, rng):
    cfg = make_config(tmp_path)
    base = SyntheticDataset(cfg.model, 4, seed=0)
    clips = [rng.standard_normal(2000).astype(np.float32) for _ in range(4)]
    with_refs = [Sample(s.text, s.audio, ref_audio=c) for s, c in zip(base, clips)]
    plain = data_fingerprint(list(base), cfg)
    assert "references" not in plain and "mask_reference_targets" not in plain  # as before for such data
    fp = data_fingerprint(with_refs, cfg)
    other_clip = [Sample(s.text, s.audio, ref_audio=c) for s, c in zip(base, clips[:3] + [clips[3] * 0.5])]
    as_own_clip = [Sample(s.text, s.audio, ref_audio=c, ref_is_clip=True) for s, c in zip(base, clips)]
    assert data_fingerprint(other_clip, cfg)["references"] != fp["references"]
    assert data_fingerprint(as_own_clip, cfg)["references"] != fp["references"]
    assert fp["digest"] == plain["digest"]
    with pytest.raises(ValueError, match="the samples' reference recordings \\(ref_audio\\) differ"):
        check_fingerprint(Path("c.safetensors"), fp, data_fingerprint(other_clip, cfg))
    cfg.data.mask_reference_targets = False
    with pytest.raises(ValueError, match="data.mask_reference_targets: True then, False now"):
        check_fingerprint(Path("c.safetensors"), fp, data_fingerprint(with_refs, cfg))
    with pytest.raises(ValueError, match="carried reference recordings \\(ref_audio\\) then, none now"):
        check_fingerprint(Path("c.safetensors"), fp, plain)
    # a checkpoint of an older pyxtts, without these fields, resumes
    older = {k: v for k, v in fp.items() if k not in ("references", "mask_reference_targets")}
    check_fingerprint(Path("c.safetensors"), older, data_fingerprint(with_refs, cfg))


def test_a_failed_fit_leaves_no_cycle_holding_the_trainer(tmp_path):
    """After Ctrl-C in a collating thread the trainer (and its model's memory) goes as soon
    as the caller lets go of it, without waiting for a garbage collection: neither the
    error's traceback nor a collation's future ties it into a cycle."""
    import gc
    import weakref

    cfg = make_config(tmp_path, num_workers=2, max_steps=20, eval_interval=100, checkpoint_interval=100)
    train, _ = datasets(cfg)
    t = Trainer(cfg, progress=False)
    gone = weakref.ref(t)
    gc.disable()
    try:
        try:
            t.fit(Interrupting(train, after=16 + 4 * 2 + 3))
        except KeyboardInterrupt:
            pass
        del t
        assert gone() is None
    finally:
        gc.enable()


def test_a_log_that_cannot_be_written_is_refused_before_any_step(tmp_path, capsys):
    import pyxtts.cli

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    rc = pyxtts.cli.main(["train", "--synthetic", "8", "--max-steps", "2", "--log", str(blocker / "log.jsonl"),
                          "--checkpoint-dir", str(tmp_path / "run"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    # what is wrong, without the OS's "[Errno 17] ... File exists"
    assert f"log_path (pyxtts train --log): cannot write '{blocker}/log.jsonl': '{blocker}' is a file, not a " \
           "folder" in err and "Errno" not in err, err
    assert not any((tmp_path / "run").glob("step_*.safetensors"))  # nothing trained


def test_a_checkpoint_dir_that_cannot_be_written_is_named_as_such(tmp_path, capsys):
    # the log's default place is the checkpoint folder: the error names --checkpoint-dir, not --log
    import pyxtts.cli

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    rc = pyxtts.cli.main(["train", "--synthetic", "8", "--max-steps", "2", "--checkpoint-dir", str(blocker / "run"),
                          "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "training.checkpoint_dir (pyxtts train --checkpoint-dir)" in err and "--log)" not in err, err


# ---- progress lines -------------------------------------------------------------------

@pytest.mark.parametrize("seconds, shown", [(0, "0s"), (0.4, "0s"), (44.6, "45s"), (59.4, "59s"),
                                            (60, "1m00s"), (725, "12m05s"), (3599, "59m59s"),
                                            (3600, "1h00m"), (11220, "3h07m"), (86399, "23h59m"),
                                            (86400, "1d00h"), (187200, "2d04h"), (-3, "0s")])
def test_durations_read_in_their_two_largest_units(seconds, shown):
    from pyxtts.callbacks.progress import format_duration

    assert format_duration(seconds) == shown


def test_progress_lines_say_the_time_taken_and_left(tmp_path, capsys):
    """A run in the background (a log file, no terminal) had only its step count: each line
    now says how long the run has taken and, from this process's wall time per step so far,
    how long it has left; the last step's line has nothing left to say. Resumed, the rate
    counts this process's steps only."""
    from pyxtts.callbacks.progress import Progress

    class Clock:  # 7 s a step, whatever the step does
        def __init__(self) -> None:
            self.now = 1000.0

        def __call__(self) -> float:
            return self.now

    class Ticking(Callback):
        def __init__(self, clock: Clock) -> None:
            self.clock = clock

        def on_step_end(self, run, record):
            self.clock.now += 7.0

    def lines(err: str) -> list[str]:
        return [ln for ln in err.splitlines() if ln.startswith("step ") and "tok/s" in ln]

    cfg = make_config(tmp_path / "a", max_steps=12, log_interval=4, eval_interval=1000)
    train, held = datasets(cfg)
    clock = Clock()
    t = Trainer(cfg, progress=True, callbacks=[Ticking(clock)])
    t.callbacks.callbacks = [Progress(True, clock) if isinstance(c, Progress) else c for c in t.callbacks.callbacks]
    # the ticking callback runs after Progress's line: step k's line sees k - 1 steps of 7 s
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        t.fit(Interrupting(train, after=2 * (16 + 16) + 16 + 2), held)  # in the 9th step
    shown = lines(capsys.readouterr().err)
    assert [ln.split(":")[0] for ln in shown] == ["step 4/12", "step 8/12"], shown
    assert shown[0].endswith(", 21s elapsed, ~42s left"), shown[0]  # 3 steps of 7 s; 8 left at 21/4
    assert shown[1].endswith(", 49s elapsed, ~24s left"), shown[1]  # 49 s for 8 steps, 4 left
    clock2 = Clock()
    cfg.training.log_interval = 2
    t2 = Trainer(cfg, progress=True, callbacks=[Ticking(clock2)])
    t2.callbacks.callbacks = [Progress(True, clock2) if isinstance(c, Progress) else c
                              for c in t2.callbacks.callbacks]
    t2.fit(train, held, resume=True)
    shown = lines(capsys.readouterr().err)
    assert [ln.split(":")[0] for ln in shown] == ["step 10/12", "step 12/12"], shown
    assert shown[0].endswith(", 7s elapsed, ~7s left"), shown[0]  # step 9 ticked: 3.5 s for each of 2
    assert shown[1].endswith(", 21s elapsed"), shown[1]  # steps 9-11 ticked; nothing left


def test_the_time_left_does_not_count_the_resumes_setup(tmp_path, capsys):
    """Resumed at step 50,000 of a small model, the first line said "11s elapsed, ~36m41s
    left" and the run ended 13 s later: the 11 s were the setup (the logs' copies), counted
    as the time of the first 50 steps. The clock starts with the training."""
    from pyxtts.callbacks.progress import Progress

    class Clock:
        now = 1000.0

        def __call__(self) -> float:
            return self.now

    class Slow(Callback):  # a setup of 10 minutes, then 2 s a step
        def __init__(self, clock: Clock) -> None:
            self.clock = clock

        def on_fit_start(self, run):
            self.clock.now += 600.0

        def on_step_end(self, run, record):
            self.clock.now += 2.0

    cfg = make_config(tmp_path, max_steps=4, log_interval=4, eval_interval=1000)
    train, held = datasets(cfg)
    Trainer(cfg, progress=False).fit(train, held)
    cfg.training.max_steps = 12
    clock = Clock()
    t = Trainer(cfg, progress=True, callbacks=[Slow(clock)])
    t.callbacks.callbacks = [Progress(True, clock) if isinstance(c, Progress) else c for c in t.callbacks.callbacks]
    capsys.readouterr()
    t.fit(train, held, resume=True)
    shown = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("step 8/12:")]
    assert shown and shown[0].endswith(", 6s elapsed, ~6s left"), shown  # steps 5-7 ticked: 1.5 s each


def test_resume_into_another_model_stops_at_the_newest_checkpoint(tmp_path, capsys):
    """The run's older checkpoints hold the same model: an architecture refusal is raised at
    once, naming how to continue, not once per checkpoint after trying each."""
    from pyxtts.checkpoint import ArchitectureError

    cfg = make_config(tmp_path, max_steps=10)
    train, held = datasets(cfg)
    Trainer(cfg, progress=False).fit(train, held)
    assert len(Trainer(cfg, progress=False).checkpoints()) >= 2
    wider = XTTSConfig.from_dict({**cfg.to_dict(), "model": {**MODEL, "n_layers": 3}})
    capsys.readouterr()
    with pytest.raises(ArchitectureError, match=r"^resume: .*step_00000010\.safetensors: another architecture.*"
                                                r"n_layers: checkpoint 2, model 3.*started with"):
        Trainer(wider, progress=False).fit(train, held, resume=True)
    assert "cannot be used" not in capsys.readouterr().err


def test_a_sample_over_the_datas_maximum_names_that_setting(tmp_path):
    """A data maximum below the model's (the CPU demo's 96 audio positions against XTTS v2's
    605, say) refused clips prepare had accepted as "the model's maximum"; the refusal
    names data.max_audio_tokens and says to raise it."""
    from pyxtts.data import DataError

    cfg = make_config(tmp_path)
    cfg.data.max_audio_tokens = 20
    train, held = datasets(cfg)
    long = max(len(s.audio) for s in train)
    assert long > 20 - 4
    with pytest.raises(DataError, match=r"32 audio tokens exceed the maximum of 20 that data\.max_audio_tokens sets .*"
                                        r"raise data\.max_audio_tokens \(the memory plan assumes it\)"):
        Trainer(cfg, progress=False).fit(train, held)


def test_a_batch_larger_than_the_training_set_is_said(tmp_path, capsys):
    """Coqui's recipe (252 samples an optimizer step) on a few dozen clips trained a handful
    of whole-set steps without a word: it is said, with the fix, even without progress."""
    cfg = make_config(tmp_path, max_steps=2, gradient_accumulation_steps=8)  # 32 samples a step
    train, held = datasets(cfg)
    Trainer(cfg, progress=False).fit(train, held)
    err = capsys.readouterr().err
    assert ("the effective batch (32 samples an optimizer step) is larger than the 16 training samples: each step "
            "takes the whole set, so a run takes 2 optimizer steps; lower gradient_accumulation_steps") in err, err
    Trainer(make_config(tmp_path / "b", max_steps=2), progress=False).fit(train, held)
    assert "effective batch" not in capsys.readouterr().err


def test_a_resume_with_other_settings_says_which(tmp_path, capsys):
    """A resume with a lower learning rate is allowed (the data and batch settings are what
    the fingerprint refuses), but it was silent: the changed settings are said."""
    cfg = make_config(tmp_path, max_steps=4)
    train, held = datasets(cfg)
    Trainer(cfg, progress=False).fit(train, held)
    later = make_config(tmp_path, max_steps=6, learning_rate=1e-2)
    capsys.readouterr()
    Trainer(later, progress=False).fit(train, held, resume=True)
    err = capsys.readouterr().err
    assert ("resume: the config differs from the one step_00000004.safetensors was saved with: "
            "training.learning_rate: 0.03 -> 0.01; training.max_steps: 4 -> 6") in err, err
    Trainer(later, progress=False).fit(train, held, resume=True)  # nothing changed: nothing said
    assert "differs" not in capsys.readouterr().err


def test_a_resume_says_the_changed_settings_as_the_yaml_file_spells_them(tmp_path, capsys):
    """A resume that turned training.optimizer_offload off said "True -> False" (and None,
    'constant', (0.9, 0.999)): Python's spelling, where the YAML file the user edits says
    true, false, null, constant and [0.9, 0.999]. The note says them as the file does."""
    cfg = make_config(tmp_path, max_steps=4, optimizer_offload=True)
    train, held = datasets(cfg)
    Trainer(cfg, progress=False).fit(train, held)
    later = make_config(tmp_path, max_steps=6, optimizer_offload=False, epochs=100, betas=[0.9, 0.98],
                        lr_schedule="warmup_cosine", warmup_steps=1)
    assert (tuple(cfg.training.betas), cfg.training.warmup_steps) == ((0.9, 0.96), 0)
    capsys.readouterr()
    Trainer(later, progress=False).fit(train, held, resume=True)
    err = capsys.readouterr().err
    assert ("resume: the config differs from the one step_00000004.safetensors was saved with: "
            "training.betas: [0.9, 0.96] -> [0.9, 0.98]; training.lr_schedule: constant -> warmup_cosine; "
            "training.warmup_steps: 0 -> 1; training.max_steps: 4 -> 6; training.epochs: null -> 100; "
            "training.optimizer_offload: true -> false\n") in err, err


def test_a_resume_that_changes_the_learning_rate_says_so(tmp_path, capsys):
    """A warmup_cosine run extended past its end (a larger --max-steps) goes on from a rate
    the stretched curve gives, not from min_lr: 2.3 times min_lr at step 50,000 of a run
    extended from 50,000 to 60,000 steps. Only "training.max_steps: 50000 -> 60000" was said."""
    cfg = make_config(tmp_path, max_steps=8, lr_schedule="warmup_cosine", warmup_steps=2, min_lr=1e-3)
    train, held = datasets(cfg)
    Trainer(cfg, progress=False).fit(train, held)
    longer = make_config(tmp_path, max_steps=16, lr_schedule="warmup_cosine", warmup_steps=2, min_lr=1e-3)
    capsys.readouterr()
    r = Trainer(longer, progress=False).fit(train, held, resume=True)
    want = pyxtts.WarmupCosineLR(3e-2, 2, 16, 1e-3)(8)
    assert r.history[0]["lr"] == want and want > 10 * 1e-3
    assert (f"resume: with these settings the learning rate of step 9 is {want:.3g}, where the schedule the run "
            "was saved with gave 0.001 (warmup_cosine)") in capsys.readouterr().err
    # a change that leaves the rate as it was: nothing more said
    Trainer(make_config(tmp_path, max_steps=16, lr_schedule="warmup_cosine", warmup_steps=2, min_lr=1e-3,
                        log_interval=2), progress=False).fit(train, held, resume=True)
    err = capsys.readouterr().err
    assert "log_interval: 1 -> 2" in err and "learning rate of step" not in err, err


def test_setting_changes_name_nested_settings_and_skip_what_a_file_predates():
    from pyxtts._words import counted, setting_changes

    before = {"training": {"lr": 0.1, "old_only": 1}, "seed": 0}
    after = {"training": {"lr": 0.2, "new_only": 2}, "seed": 0, "extra": {"a": 1}}
    assert setting_changes(before, after) == ["training.lr: 0.1 -> 0.2"]
    assert setting_changes(before, after, absent_too=True) == [
        "training.lr: 0.1 -> 0.2", "training.new_only: None -> 2", "training.old_only: 1 -> None",
        "extra: None -> {'a': 1}"]
    assert setting_changes(None, after) == [] and setting_changes(before, before) == []
    assert [counted(n, "shard") for n in (0, 1, 2)] == ["0 shards", "1 shard", "2 shards"]


def test_the_config_event_is_written_once_per_step_over_repeated_resumes(tmp_path):
    """Each resume at the same step (a second Ctrl-C before any step, a resume with
    nothing left to train) copied the config event of that step and wrote one more."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra (pip install 'pyxtts[tensorboard]') "
                                              "is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = make_config(tmp_path, max_steps=4, eval_interval=100, checkpoint_interval=4)
    train, held = datasets(cfg)
    r = Trainer(cfg, progress=False).fit(train, held)
    for _ in range(2):
        r = Trainer(cfg, progress=False).fit(train, held, resume=True)
    cfg.training.max_steps = 6
    r = Trainer(cfg, progress=False).fit(train, held, resume=True)
    acc = EventAccumulator(str(tensorboard_dir(r.log_path)), size_guidance={"tensors": 0})
    acc.Reload()
    assert [e.step for e in acc.Tensors("config")] == [0, 4]

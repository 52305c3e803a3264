"""Trainer.fit: learning, the JSONL log, checkpoints and an exact resume (also after
Ctrl-C), OOM recovery inside a run, cleanup, evaluation, divergence and bad input."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

import pyxtts
import pyxtts.trainer
from conftest import DEVICES
from pyxtts import DataError, SyntheticDataset, Trainer, XTTSConfig
from pyxtts.data import Sample, TTSDataset, collate
from helpers import Interrupting

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")


@pytest.fixture(params=DEVICES)
def device(request):
    """cpu, and cuda:0 where a GPU is present; no limit left behind on it either."""
    yield request.param
    pyxtts.set_memory_limit(None, request.param)

MODEL = {"n_layers": 2, "d_model": 64, "n_heads": 4, "text_vocab_size": 64, "audio_vocab_size": 97,
         "max_text_tokens": 24, "max_audio_tokens": 48, "n_cond_latents": 0, "conditioning": False}


def make_config(tmp_path: Path, num_workers: int = 0, device: str = "cpu", **training) -> XTTSConfig:
    t = {"learning_rate": 3e-3, "lr_schedule": "constant", "max_steps": 12, "epochs": None,
         "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_interval": 5, "eval_interval": 4,
         "log_interval": 1, "device": device, "enable_memory_cleanup": False, "max_memory_fraction": 1.0}
    t.update(training)
    return XTTSConfig.from_dict({"model": MODEL, "training": t,
                                 "data": {"batch_size": 4, "bucketing": True, "bucket_size_multiplier": 2,
                                          "num_workers": num_workers}})


def datasets(config: XTTSConfig, n: int = 22, seed: int = 0):
    return SyntheticDataset(config.model, n + 8, seed=seed).split(8)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def params(trainer: Trainer) -> dict[str, np.ndarray]:
    return trainer.model.state_dict()


def test_fit_learns_logs_and_checkpoints(tmp_path, device):
    cfg = make_config(tmp_path, device=device, max_steps=40, eval_interval=20, checkpoint_interval=10, keep_checkpoints=2)
    train, held = datasets(cfg, 60)
    tr = Trainer(cfg, progress=False)
    r = tr.fit(train, held)
    assert r.step == 40 and r.stopped == "max_steps"
    assert [e["step"] for e in r.evals] == [0, 20, 40]
    assert r.evals[-1]["loss"] < 0.6 * r.evals[0]["loss"], [e["loss"] for e in r.evals]
    log = read_log(r.log_path)
    steps = [x for x in log if x["type"] == "train"]
    assert [x["step"] for x in steps] == list(range(1, 41))
    need = {"loss", "text_loss", "audio_loss", "grad_norm", "lr", "skipped", "micro_batch_size", "oom_splits",
            "tokens_per_s", "peak_allocated_bytes", "rss_bytes", "text_tokens", "audio_tokens", "samples"}
    assert need <= set(steps[0]), need - set(steps[0])
    assert all(np.isfinite(x["loss"]) and x["peak_allocated_bytes"] > 0 for x in steps)
    assert sum(x["samples"] for x in steps[:15]) == 60  # an epoch: 60 samples in 15 batches
    # the newest two of the checkpoints at 10, 20, 30, 40; the last one is loadable
    assert [p.name for p in tr.checkpoints()] == ["step_00000030.safetensors", "step_00000040.safetensors"]
    assert r.checkpoint == tr.checkpoints()[-1]
    other = Trainer(cfg, progress=False)
    other.load(r.checkpoint)
    for k, v in params(tr).items():
        assert np.array_equal(v, params(other)[k]), k
    assert (other.step, other.epoch, other.batch_in_epoch) == (40, 2, 10)


def test_epochs_end_the_run(tmp_path):
    cfg = make_config(tmp_path, max_steps=None, epochs=2)
    train, _ = datasets(cfg, 10)  # 10 samples in batches of 4: 3 steps an epoch
    r = Trainer(cfg, progress=False).fit(train)
    assert (r.step, r.epoch, r.stopped) == (6, 2, "epochs")
    assert r.eval_loss is None and r.evals == []


def test_resume_after_ctrl_c_takes_the_same_steps(tmp_path, device):
    """A run interrupted mid-epoch and resumed ends with the parameters, optimizer state
    and log of a run that never stopped, bit for bit: the kernels are deterministic (on
    the GPU too: fixed-order reductions, no float atomics) and the data order is a
    function of (seed, epoch)."""
    cfg_a = make_config(tmp_path / "a", device=device, max_steps=14)
    train, held = datasets(cfg_a, 24)  # 6 steps an epoch: the run crosses two epochs
    a = Trainer(cfg_a, progress=False)
    ra = a.fit(train, held)

    cfg_b = make_config(tmp_path / "b", device=device, max_steps=14)
    b = Trainer(cfg_b, progress=False)
    # an epoch reads every sample's length (24 reads), then 4 samples a batch: this stops
    # while the 3rd batch of the 2nd epoch is collated, after 8 steps
    with pytest.raises(KeyboardInterrupt):
        b.fit(Interrupting(train, after=24 + 4 * 6 + 24 + 4 * 2 + 3), held)
    assert [p.name for p in b.checkpoints()][-1] == "step_00000008.safetensors"  # saved on Ctrl-C
    assert (b.step, b.epoch, b.batch_in_epoch) == (8, 1, 2)
    b2 = Trainer(cfg_b, progress=False)
    rb = b2.fit(train, held, resume=True)
    assert rb.step == 14
    for k, v in params(a).items():
        assert np.array_equal(v, params(b2)[k]), k
    sa, sb = a.optimizer.state_dict(), b2.optimizer.state_dict()
    for k, v in sa.items():
        assert np.array_equal(v, sb[k]) if isinstance(v, np.ndarray) else v == sb[k], k
    la = [x for x in read_log(ra.log_path) if x["type"] == "train"]
    lb = [x for x in read_log(rb.log_path) if x["type"] == "train"]
    assert [x["step"] for x in lb] == list(range(1, 15))  # each step logged once
    assert [x["loss"] for x in la] == [x["loss"] for x in lb]


def test_fit_again_goes_on(tmp_path):
    """A second fit of the same trainer continues its run (a notebook's "train more")."""
    cfg = make_config(tmp_path, max_steps=3)
    train, _ = datasets(cfg, 12)
    t = Trainer(cfg, progress=False)
    t.fit(train)
    cfg.training.max_steps = 5
    r = t.fit(train)
    assert r.step == 5 and [x["step"] for x in r.history] == [4, 5]
    assert [x["step"] for x in read_log(r.log_path) if x["type"] == "train"] == [1, 2, 3, 4, 5]


def test_collating_threads_change_nothing(tmp_path):
    """data.num_workers threads collate ahead; the steps are those of collating inline."""
    runs = []
    for workers in (0, 3):
        cfg = make_config(tmp_path / str(workers), num_workers=workers, max_steps=9)
        train, _ = datasets(cfg, 14)  # 4 steps an epoch: prefetching meets the epoch ends
        t = Trainer(cfg, progress=False)
        r = t.fit(train)
        runs.append(([x["loss"] for x in r.history], params(t)))
    assert runs[0][0] == runs[1][0]
    for k, v in runs[0][1].items():
        assert np.array_equal(v, runs[1][1][k]), k


@pytest.mark.parametrize("workers", [0, 1])
def test_the_wait_for_data_is_recorded_apart_from_the_step(tmp_path, monkeypatch, workers):
    """data_wait_s: how long the loop waited for each batch, not counted in step_time_s. A
    collation slower than the step (here: 0.15 s a batch) shows there, inline (0 workers)
    and with a collating thread that cannot keep up (1)."""
    slow, real = 0.15, pyxtts.trainer.collate

    def late(*args, **kwargs):
        time.sleep(slow)
        return real(*args, **kwargs)

    monkeypatch.setattr(pyxtts.trainer, "collate", late)
    cfg = make_config(tmp_path, num_workers=workers, max_steps=4, checkpoint_interval=100)
    train, _ = datasets(cfg, 16)
    r = Trainer(cfg, progress=False).fit(train)
    waits = [x["data_wait_s"] for x in r.history]
    # inline, every wait holds a whole collation; with a thread, the first does (the thread
    # starts with the loop) and the others what the step and the logging between did not
    # hide: a 2-layer model's step at batch 4 is far shorter than the collation
    assert waits[0] >= slow and all(w >= (slow if workers == 0 else slow / 3) for w in waits), waits
    assert all(x["step_time_s"] < slow for x in r.history), [x["step_time_s"] for x in r.history]
    assert [x["data_wait_s"] for x in read_log(r.log_path) if x["type"] == "train"] == waits


def test_resume_variants_and_refusals(tmp_path):
    cfg = make_config(tmp_path, max_steps=5)
    train, _ = datasets(cfg, 12)
    t = Trainer(cfg, progress=False)
    assert t.fit(train, resume=True).step == 5  # nothing to resume: from step 0
    with pytest.raises(FileExistsError, match="resume=True"):
        Trainer(cfg, progress=False).fit(train)
    again = Trainer(cfg, progress=False).fit(train, overwrite=True)
    assert again.step == 5 and [p.name for p in Trainer(cfg).checkpoints()] == ["step_00000005.safetensors"]
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        Trainer(cfg, progress=False).fit(train, resume=tmp_path / "missing.safetensors")
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(again.checkpoint.read_bytes()[:100])
    fresh = Trainer(cfg, progress=False)
    before = params(fresh)
    with pytest.raises(pyxtts.CheckpointError):
        fresh.fit(train, resume=bad)
    for k, v in before.items():
        assert np.array_equal(v, params(fresh)[k]), k
    # a checkpoint of another model shape is refused too
    other = make_config(tmp_path / "o", max_steps=1)
    other.model.d_model = 32
    with pytest.raises(pyxtts.CheckpointError):
        Trainer(other, progress=False).fit(train, resume=again.checkpoint)  # same data: the model differs


def test_data_is_validated_before_any_step(tmp_path):
    cfg = make_config(tmp_path, max_steps=3)
    cfg.data.max_text_tokens = 10  # tighter than the model's 24: the plan assumed 10
    train, _ = datasets(make_config(tmp_path, max_steps=3), 12)
    long = next(i for i, s in enumerate(train.samples) if len(s.text) > 10)
    t = Trainer(cfg, progress=False)
    before = params(t)
    with pytest.raises(DataError, match="exceed"):
        t.fit(train)
    assert t.step == 0 and t.checkpoints() == []
    for k, v in before.items():
        assert np.array_equal(v, params(t)[k])
    bad = TTSDataset([Sample(np.array([1, 2, 99]), np.array([3, 4]), None, "bad")])
    with pytest.raises(DataError, match=r"text\[2\] = 99"):
        t.fit(bad)
    with pytest.raises(ValueError, match="non-empty"):
        t.fit(TTSDataset([]))
    assert long >= 0


def test_oom_mid_run_halves_the_micro_batch_and_goes_on(tmp_path, device):
    """A limit a micro-batch of 4 does not fit (but 2 does): every step still runs."""
    cfg = make_config(tmp_path, device=device, max_steps=4)
    train = SyntheticDataset(cfg.model, 16, min_text=24)  # every batch at the longest lengths
    t = Trainer(cfg, progress=False)
    d = cfg.data
    p4 = t.model.estimate_memory(4, d.max_text_tokens, d.max_audio_tokens, 0, optimizer=True).total
    p2 = t.model.estimate_memory(2, d.max_text_tokens, d.max_audio_tokens, 0, optimizer=True).total
    pyxtts.empty_cache(device)  # the limit caps new segments: drop what earlier tests cached
    pyxtts.set_memory_limit((p2 + p4) // 2, device)
    r = t.fit(train)
    assert r.step == 4
    # the optimizer's state is allocated at step 1, so the first micro-batches of 4 may
    # still fit; once one does not, the smaller micro-batch is kept for the later steps
    first = next(i for i, x in enumerate(r.history) if x["oom_splits"])
    assert r.history[first]["oom_splits"] == 1
    assert all(x["micro_batch_size"] == 2 and x["oom_splits"] == 0 for x in r.history[first + 1:])
    assert first < 2


def test_cleanup_interval(tmp_path):
    cfg = make_config(tmp_path, max_steps=6, enable_memory_cleanup=True, cleanup_interval=3)
    train, _ = datasets(cfg, 16)
    r = Trainer(cfg, progress=False).fit(train)
    assert [x["step"] for x in r.history if "cleanup_released_bytes" in x] == [3, 6]


def test_accumulation_in_the_loop(tmp_path, device):
    cfg = make_config(tmp_path, device=device, max_steps=2, gradient_accumulation_steps=3)
    cfg.data.batch_size = 2
    train, _ = datasets(cfg, 12)
    r = Trainer(cfg, progress=False).fit(train)
    assert [(x["samples"], x["micro_batch_size"]) for x in r.history] == [(6, 2), (6, 2)]


def test_evaluate_is_the_token_weighted_mean(tmp_path, device):
    cfg = make_config(tmp_path, device=device)
    _, held = datasets(cfg, 4)
    t = Trainer(cfg, progress=False)
    got = t.evaluate(held)
    whole = t.model.forward(collate(held.samples))  # one batch: the same weighted means
    for k in ("loss", "text_loss", "audio_loss"):
        assert got[k] == pytest.approx(whole[k], rel=1e-6), k


def test_find_optimal_batch_size_method_keeps_the_effective_batch(tmp_path):
    cfg = make_config(tmp_path, gradient_accumulation_steps=2)
    cfg.data.batch_size = 6  # effective 12
    t = Trainer(cfg, progress=False)
    d = cfg.data
    p5 = t.model.estimate_memory(5, d.max_text_tokens, d.max_audio_tokens, 0, optimizer=True).total
    p6 = t.model.estimate_memory(6, d.max_text_tokens, d.max_audio_tokens, 0, optimizer=True).total
    pyxtts.empty_cache("cpu")
    pyxtts.set_memory_limit(int((p5 + p6) / 2 / 0.95), "cpu")
    before = params(t)
    size = t.find_optimal_batch_size(apply=True)
    assert size == 5
    assert (cfg.data.batch_size, cfg.training.gradient_accumulation_steps) == (4, 3)  # 12 = 4 x 3
    for k, v in before.items():
        assert np.array_equal(v, params(t)[k]), k


def test_divergence_is_an_error(tmp_path, monkeypatch):
    cfg = make_config(tmp_path, max_steps=30)
    train, _ = datasets(cfg, 12)
    real = pyxtts.trainer.train_step_with_accumulation

    def skipping(*args, **kwargs):
        r = real(*args, **kwargs)
        r.skipped = True
        return r

    monkeypatch.setattr(pyxtts.trainer, "train_step_with_accumulation", skipping)
    with pytest.raises(FloatingPointError, match="10 optimizer steps in a row"):
        Trainer(cfg, progress=False).fit(train)


@pytest.mark.parametrize("lr", [1e38, 1e6])
def test_a_learning_rate_whose_step_could_overflow_is_refused_by_its_config_name(tmp_path, lr):
    """Issue 11, item 12: learning_rate=1e38 once trained to non-finite parameters and
    pruned the good checkpoints; AdamW now refuses it, and the Trainer says which setting."""
    with pytest.raises(ValueError, match=re.escape(f"training: AdamW refuses learning_rate={lr!r}")):
        Trainer(make_config(tmp_path, learning_rate=lr), progress=False)
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="XTTSConfig"):
        Trainer({"model": MODEL})
    with pytest.raises(ValueError, match="warmup_steps"):
        make_config(tmp_path, warmup_steps=5)  # a constant schedule does not warm up
    with pytest.raises(ValueError, match="keep_checkpoints"):
        make_config(tmp_path, keep_checkpoints=0)


def test_fit_takes_samples_of_lists_and_names_what_is_not_a_sample(tmp_path):
    """Samples holding lists train as arrays would (they failed inside validation); a list
    of batch dicts, a string or an empty set is refused by the argument's name."""
    cfg = make_config(tmp_path, max_steps=2, eval_interval=100)
    train, held = datasets(cfg, 8)
    as_lists = [Sample(s.text.tolist(), s.audio.tolist()) for s in train]
    r = Trainer(cfg, progress=False).fit(as_lists)
    r_arrays = Trainer(make_config(tmp_path / "b", max_steps=2, eval_interval=100), progress=False).fit(train)
    assert r.history[-1]["loss"] == r_arrays.history[-1]["loss"]
    tr = Trainer(cfg, progress=False)
    with pytest.raises(TypeError, match=r"^dataset: sample 0: expected a pyxtts.Sample, got dict"):
        tr.fit([collate(train.samples[:2])])
    with pytest.raises(TypeError, match=r"^eval_dataset: expected a sequence of samples .*got str"):
        tr.fit(train, "shards/eval")
    with pytest.raises(ValueError, match=r"^eval_dataset: expected a non-empty .*got an empty TTSDataset"):
        tr.fit(train, TTSDataset([]))


def _same_run(a: Trainer, b: Trainer, ra, rb) -> None:
    for k, v in params(a).items():
        assert np.array_equal(v, params(b)[k]), k
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    for k, v in sa.items():
        assert np.array_equal(v, sb[k]) if isinstance(v, np.ndarray) else v == sb[k], k


def test_ctrl_c_right_after_the_update_is_held_until_the_step_is_counted(tmp_path, monkeypatch):
    """A real SIGINT just after the optimizer's update, before the trainer counted the step:
    it once raised there, and the Ctrl-C checkpoint held step 6's weights as step 5, so the
    resumed run trained that batch twice. It is now raised once the step is counted."""
    import os
    import signal

    import pyxtts.batch

    cfg_a = make_config(tmp_path / "a", max_steps=10)
    train, held = datasets(cfg_a, 24)
    a = Trainer(cfg_a, progress=False)
    ra = a.fit(train, held)

    real = pyxtts.batch.StepResult
    calls = []

    def interrupted_after_update(*args, **kwargs):  # built right after optimizer.step()
        calls.append(1)
        if len(calls) == 6:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    cfg_b = make_config(tmp_path / "b", max_steps=10)
    b = Trainer(cfg_b, progress=False)
    monkeypatch.setattr(pyxtts.batch, "StepResult", interrupted_after_update)
    with pytest.raises(KeyboardInterrupt):
        b.fit(train, held)
    monkeypatch.setattr(pyxtts.batch, "StepResult", real)
    assert b.step == 6 and b.optimizer.step_count == 6
    assert [p.name for p in b.checkpoints()][-1] == "step_00000006.safetensors"
    assert [x["step"] for x in read_log(b.log_path)
            if x["type"] == "train"][-1] == 6, "the step's record is written before the stop"
    b2 = Trainer(cfg_b, progress=False)
    rb = b2.fit(train, held, resume=True)
    assert rb.step == 10
    _same_run(a, b2, ra, rb)
    assert [x["step"] for x in read_log(rb.log_path) if x["type"] == "train"] == list(range(1, 11))


def test_an_evaluation_interrupted_by_ctrl_c_is_made_when_the_run_resumes(tmp_path):
    """Ctrl-C during step 8's evaluation saved step 8, and the resumed run never evaluated
    it: the evaluation, its best checkpoint (and spoken samples) were lost for good."""
    from pyxtts.callbacks import Callback

    class CtrlCInEvaluation(Callback):
        def on_evaluation(self, run, record) -> None:
            if record["step"] == 8:
                raise KeyboardInterrupt

    cfg = make_config(tmp_path, max_steps=12, eval_interval=4, checkpoint_interval=100)
    train, held = datasets(cfg, 24)
    with pytest.raises(KeyboardInterrupt):
        Trainer(cfg, progress=False, callbacks=[CtrlCInEvaluation()]).fit(train, held)
    r = Trainer(cfg, progress=False).fit(train, held, resume=True)
    evals = [x["step"] for x in read_log(r.log_path) if x["type"] == "eval"]
    # step 8's record was written before the interruption, and again by the resumed run
    assert evals == [0, 4, 8, 8, 12], evals
    assert [x["step"] for x in r.evals] == [8, 12]
    # a run resumed from a checkpoint whose evaluation finished does not evaluate again
    cfg.training.max_steps = 16
    r2 = Trainer(cfg, progress=False).fit(train, held, resume=True)
    assert [x["step"] for x in r2.evals] == [16]


def test_a_resume_from_an_older_checkpoint_sets_the_newer_ones_aside(tmp_path):
    """Resuming from step 4 of a run that reached 12: steps 8 and 12 and the best (at 12)
    were the abandoned branch's. Left in place, pruning deleted step 4, the branch's worse
    evaluations overwrote the best, and the next resume jumped back to step 12."""
    cfg = make_config(tmp_path, max_steps=12, eval_interval=4, checkpoint_interval=4, keep_checkpoints=3)
    train, held = datasets(cfg, 24)
    Trainer(cfg, progress=False).fit(train, held)
    folder = Path(cfg.training.checkpoint_dir)
    assert pyxtts.trainer._saved_meta(folder / "best.safetensors")["step"] == 12
    old = folder / "step_00000004.safetensors"
    for step in (4, 8):  # spoken samples, as the SpokenSamples callback writes them
        (folder / "samples" / f"step_{step:08d}").mkdir(parents=True)
    cfg.training.max_steps = 6
    t = Trainer(cfg, progress=False)
    t.fit(train, held, resume=old)
    aside = folder / "superseded_from_step_00000004"
    assert sorted(p.name for p in aside.iterdir()) == ["best.safetensors", "samples", "step_00000008.safetensors",
                                                       "step_00000012.safetensors", "train_log.jsonl"]
    assert [p.name for p in (aside / "samples").iterdir()] == ["step_00000008"]
    assert [p.name for p in (folder / "samples").iterdir()] == ["step_00000004"]
    assert [p.name for p in t.checkpoints()] == ["step_00000004.safetensors", "step_00000006.safetensors"]
    steps = [x["step"] for x in read_log(aside / "train_log.jsonl") if x["type"] == "train"]
    assert steps == list(range(1, 13))  # the branch's log as it was
    cfg.training.max_steps = 7
    r = Trainer(cfg, progress=False).fit(train, held, resume=True)
    assert [x["step"] for x in r.history] == [7]


def test_a_run_resumed_after_a_crash_is_no_branch(tmp_path):
    """A crash (a kill, the OOM killer, a power cut) after an evaluation had improved the
    best checkpoint and before the next step checkpoint: resumed from its newest checkpoint,
    the run was taken for a branch of an older one. It said "step_00000004.safetensors is
    older than the run's newest checkpoint", moved best.safetensors (as large as the weights:
    1.7 GB for XTTS v2) and a copy of the log (34 MB at step 50,000) into a
    superseded_from_step folder, one more at each such crash. The steps after the checkpoint
    are taken again, and their evaluations remake the best checkpoint as it was."""
    from pyxtts.callbacks import Callback
    from pyxtts.checkpoint import read_checkpoint

    class Crash(Callback):
        def on_step_end(self, run, record) -> None:
            if record["step"] == 7:
                raise RuntimeError("killed")

    def config(folder: Path) -> XTTSConfig:
        return make_config(folder, max_steps=8, eval_interval=3, checkpoint_interval=4)

    cfg = config(tmp_path / "a")
    train, held = datasets(cfg, 24)
    with pytest.raises(RuntimeError, match="killed"):
        Trainer(cfg, progress=False, callbacks=[Crash()]).fit(train, held)
    folder = Path(cfg.training.checkpoint_dir)
    assert [p.name for p in Trainer(cfg, progress=False).checkpoints()] == ["step_00000004.safetensors"]
    assert pyxtts.trainer._saved_meta(folder / "best.safetensors")["step"] == 6  # the evaluation at 6 improved
    r = Trainer(cfg, progress=False).fit(train, held, resume=True)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == []  # nothing set aside
    straight = Trainer(config(tmp_path / "b"), progress=False).fit(train, held)
    assert pyxtts.trainer._saved_meta(r.best_checkpoint)["step"] == pyxtts.trainer._saved_meta(
        straight.best_checkpoint)["step"]
    got = read_checkpoint(r.best_checkpoint)[1]
    for name, want in read_checkpoint(straight.best_checkpoint)[1].items():
        assert np.array_equal(got[name], want), name
    assert [x["step"] for x in read_log(r.log_path) if x["type"] == "train"] == list(range(1, 9))


def test_a_long_run_holds_no_more_memory_step_after_step(tmp_path, monkeypatch, capsys):
    """Every step's record stayed in memory for FitResult.history: 1.4 KB a step, so a
    process grew by 140 MB over 100,000 steps. The newest HISTORY_LIMIT are kept (the JSONL
    log has every one), and past that many steps the run's Python objects stop growing."""
    import gc
    import tracemalloc

    from pyxtts.callbacks import Callback

    monkeypatch.setattr(pyxtts.callbacks.base, "HISTORY_LIMIT", 20, raising=False)
    held_at: dict[int, int] = {}

    class Held(Callback):
        def on_step_end(self, run, record) -> None:
            if record["step"] == 60:  # the kept records are the run's newest by then
                tracemalloc.start()
            if record["step"] in (100, 300):
                gc.collect()
                held_at[record["step"]] = tracemalloc.get_traced_memory()[0]

    cfg = make_config(tmp_path, max_steps=300, checkpoint_interval=10**6, eval_interval=10**6, log_interval=10**6)
    train, _ = datasets(cfg)
    try:
        r = Trainer(cfg, callbacks=[Held()]).fit(train)
    finally:
        tracemalloc.stop()
    # 1,400 bytes when every record was kept; what is left are Python's bounded caches filling
    per_step = (held_at[300] - held_at[100]) / 200
    assert per_step < 300, f"{per_step:.0f} bytes more held per step"
    assert r.steps_taken == 300 and [x["step"] for x in r.history] == list(range(281, 301))
    log = [x for x in read_log(r.log_path) if x["type"] == "train"]
    assert len(log) == 300
    # the closing line sums every step, not the kept ones
    done = [line for line in capsys.readouterr().err.splitlines() if line.startswith("done:")]
    assert done and f"loss {log[0]['loss']:.4f} -> {log[-1]['loss']:.4f}" in done[0], done


def dead_pid() -> int:
    """The id of a process that has ended."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_a_run_removes_what_killed_saves_left(tmp_path):
    """A save killed midway (SIGKILL when a scheduler's grace period ends during the
    checkpoint SIGTERM asked for) left its temporary file, as large as a checkpoint. It was
    removed only by a later save to the same name, which never comes when the run resumes
    from an earlier step: the run removes every dead process's temporaries when it starts."""
    cfg = make_config(tmp_path, max_steps=4, checkpoint_interval=2, eval_interval=100)
    train, _ = datasets(cfg, 8)
    folder = Path(cfg.training.checkpoint_dir)
    folder.mkdir(parents=True)
    gone, alive = dead_pid(), os.getppid()
    left = [folder / f"step_00000003.safetensors.tmp-{gone}",  # an older pyxtts's temporary file
            folder / f"best.safetensors.tmp-{gone}"]  # a temporary folder, safetensors' file inside
    left[0].write_bytes(b"x" * 1000)
    left[1].mkdir()
    (left[1] / ".tmpAbC123").write_bytes(b"x" * 1000)
    kept = [folder / f"step_00000005.safetensors.tmp-{alive}"]  # a live process's save
    for p in kept:
        p.write_bytes(b"x")
    Trainer(cfg, progress=False).fit(train)
    assert not any(p.exists() for p in left)
    assert all(p.exists() for p in kept)


def test_a_fresh_run_removes_an_earlier_runs_spoken_samples(tmp_path):
    """overwrite=True deleted the checkpoints and the log, and left the earlier run's
    samples/step_* folders beside the new run's."""
    cfg = make_config(tmp_path, max_steps=2, eval_interval=100)
    train, _ = datasets(cfg, 8)
    Trainer(cfg, progress=False).fit(train)
    old = Path(cfg.training.checkpoint_dir) / "samples" / "step_00000006"
    old.mkdir(parents=True)
    Trainer(cfg, progress=False).fit(train, overwrite=True)
    assert not old.exists()


def test_an_interrupted_first_evaluation_is_made_when_the_run_resumes(tmp_path):
    """Ctrl-C during the evaluation before the first step saved step 0 with no evaluation
    finished, which read as a checkpoint from before evaluations were kept: the resumed
    run never made it (5 of 38 random Ctrl-Cs lost it)."""
    from pyxtts.callbacks import Callback

    class CtrlCInFirstEvaluation(Callback):
        def on_evaluation(self, run, record) -> None:
            raise KeyboardInterrupt

    cfg = make_config(tmp_path, max_steps=4, eval_interval=4, checkpoint_interval=100)
    train, held = datasets(cfg, 24)
    t = Trainer(cfg, progress=False, callbacks=[CtrlCInFirstEvaluation()])
    with pytest.raises(KeyboardInterrupt):
        t.fit(train, held)
    assert t.step == 0
    r = Trainer(cfg, progress=False).fit(train, held, resume=True)
    assert [x["step"] for x in r.evals] == [0, 4]

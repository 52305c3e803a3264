"""Checkpoints: safetensors round trip, refusals that change nothing, crash safety,
exact resume in a fresh process, and the XTTS v2 .pth importer."""
from __future__ import annotations

import errno
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from conftest import assert_bits_equal, run_python
from safetensors import safe_open
from safetensors.numpy import save_file

import pyxtts
from helpers import TINY, edit_checkpoint
from helpers.disk import KILLED_BY_FILE_SIZE, file_size_limit
from helpers.state import assert_same, full_state
from pyxtts.checkpoint import _flatten_optimizer as flatten_optimizer

BF16 = np.dtype(ml_dtypes.bfloat16)
HAS_ADAMW = hasattr(pyxtts, "AdamW")
NO_ADAMW = "pyxtts.AdamW is not built yet (in progress); optimizer checkpoints are tested with a stand-in"


class FakeOptimizer:
    """Stands for pyxtts.AdamW's interface: state_dict() of arrays (fp32 moments, bf16
    master copies, nested dicts) and Python scalars; load_state_dict(d); lr."""

    def __init__(self, model, rng, lr=1e-3):
        self.lr = lr
        self.loads = 0
        self.refuse = False
        p = model.state_dict()
        self.state = {
            "lr": lr, "step": int(rng.integers(1, 1000)), "loss_scale": 2.0 ** 15, "betas": [0.9, 0.999],
            "amsgrad": False, "name": "adamw", "ema": None, "count": np.int64(rng.integers(1, 99)),
            "exp_avg": {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in p.items()},
            "master": {k: rng.standard_normal(v.shape).astype(BF16) for k, v in list(p.items())[:3]},
        }

    def state_dict(self):
        return self.state

    def load_state_dict(self, d):
        if self.refuse:
            raise ValueError("refused by the optimizer")
        self.loads += 1
        self.state = d
        self.lr = d["lr"]


def flat_state(opt):
    """An optimizer's state as (JSON skeleton, name -> array copies), to compare exactly."""
    skeleton, tensors, _ = flatten_optimizer(opt.state_dict())
    return json.dumps(skeleton, sort_keys=True), {k: np.array(v, copy=True) for k, v in tensors.items()}


def assert_same_state(got, want, msg=""):
    assert got[0] == want[0], f"optimizer scalars/structure differ {msg}"
    assert set(got[1]) == set(want[1])
    for k, v in want[1].items():
        assert_bits_equal(got[1][k], v, f"{k} {msg}")


def rewrite(src: Path, dst: Path, edit_meta=None, edit_tensors=None) -> None:
    """Copies a checkpoint with its metadata/tensors edited, its checksums made to match
    again (so what is tested is the check after them)."""
    edit_checkpoint(src, dst, edit_meta, edit_tensors)


@pytest.fixture
def saved(tmp_path, seed):
    """A checkpoint of a random TINY model and its fake optimizer."""
    rng = np.random.default_rng(seed)
    model = pyxtts.XTTSGPT(TINY, seed=int(rng.integers(1 << 30)))
    opt = FakeOptimizer(model, rng)
    path = tmp_path / "ckpt.safetensors"
    pyxtts.save_checkpoint(path, model, opt, step=123, extra={"epoch": 4, "note": "x"})
    return path, model, opt


def fresh(seed, rng=None):
    model = pyxtts.XTTSGPT(TINY, seed=seed + 1)
    return model, FakeOptimizer(model, rng or np.random.default_rng(seed + 2))


# ---- round trip -----------------------------------------------------------------

def test_round_trip_model_optimizer_metadata(saved, seed):
    path, model, opt = saved
    m2, o2 = fresh(seed)
    meta = pyxtts.load_checkpoint(path, m2, o2)
    for k, v in model.state_dict().items():
        assert_bits_equal(m2.state_dict()[k], v, k)
    assert o2.loads == 1 and o2.lr == opt.lr
    for group in ("exp_avg", "master"):
        for k, v in opt.state[group].items():
            assert_bits_equal(o2.state[group][k], v, f"{group}.{k}")
    assert o2.state["master"][next(iter(opt.state["master"]))].dtype == BF16
    assert type(o2.state["count"]) is np.int64 and o2.state["count"] == opt.state["count"]
    for k in ("lr", "step", "loss_scale", "betas", "amsgrad", "name", "ema"):
        assert o2.state[k] == opt.state[k], k
    assert meta["step"] == 123 and meta["extra"] == {"epoch": 4, "note": "x"}
    assert meta["config"] == asdict(TINY) and meta["precision"] == "fp32"
    assert meta["format"] == "pyxtts.checkpoint" and meta["format_version"] == 2
    assert meta["pyxtts_version"] == pyxtts.__version__
    assert meta["optimizer"]["state"]["loss_scale"] == 2.0 ** 15
    with safe_open(str(path), framework="numpy") as f:  # the layout other tools see
        keys = set(f.keys())
    assert {"model." + k for k in model.parameters()} <= keys
    assert "optimizer.exp_avg.gpt.h.0.ln_1.weight" in keys and "optimizer.count" in keys
    assert all(k.startswith(("model.", "optimizer.")) for k in keys)


def test_model_only_and_rng_state_in_extra(tmp_path, seed):
    rng = np.random.default_rng(seed)
    rng.random(5)
    model = pyxtts.XTTSGPT(TINY, seed=seed % 1000)
    pyxtts.save_checkpoint(tmp_path / "m.safetensors", model, extra={"rng": rng.bit_generator.state})
    m2 = pyxtts.XTTSGPT(TINY, seed=seed % 1000 + 1)
    meta = pyxtts.load_checkpoint(tmp_path / "m.safetensors", m2)
    assert meta["step"] == 0 and meta["optimizer"] is None
    r2 = np.random.default_rng(seed + 1)  # a different stream until the saved state is put in
    r2.bit_generator.state = meta["extra"]["rng"]
    assert (r2.random(8) == rng.random(8)).all()
    with pytest.raises(pyxtts.CheckpointError, match="no optimizer state"):
        pyxtts.load_checkpoint(tmp_path / "m.safetensors", m2, FakeOptimizer(m2, rng))


def test_extra_must_be_json(tmp_path):
    model = pyxtts.XTTSGPT(TINY)
    for bad in ({"a": object()}, {"arr": np.zeros(2)}, {1j}):
        with pytest.raises(TypeError, match="extra"):
            pyxtts.save_checkpoint(tmp_path / "x.safetensors", model, extra=bad)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="step"):
        pyxtts.save_checkpoint(tmp_path / "x.safetensors", model, step=-1)
    # a 0-d float array has __index__ (which raises) and int() of it truncates: once saved as 2
    for bad in (1.5, np.array(2.5, np.float16), np.float64(2.0), True):
        with pytest.raises(TypeError, match=r"^step: expected an int, got"):
            pyxtts.save_checkpoint(tmp_path / "x.safetensors", model, step=bad)
    assert list(tmp_path.iterdir()) == []
    for ok in (np.int16(7), np.array(7, np.uint8)):  # integers NumPy hands out are ints
        pyxtts.save_checkpoint(tmp_path / "x.safetensors", model, step=ok)
        meta = pyxtts.load_checkpoint(tmp_path / "x.safetensors", pyxtts.XTTSGPT(TINY))
        assert meta["step"] == 7 and type(meta["step"]) is int


# ---- refusals: CheckpointError, nothing changed -------------------------------------

def refuse(path, model, opt, match):
    before = full_state(model, opt, gradients=False)
    with pytest.raises(pyxtts.CheckpointError, match=match):
        pyxtts.load_checkpoint(path, model, opt)
    assert_same(full_state(model, opt, gradients=False), before, "a refused load")


def test_truncated_files_are_refused(saved, tmp_path, seed):
    path, _, _ = saved
    data = path.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    rng = np.random.default_rng(seed)
    cuts = {0, 4, 8, 9, header // 2, header - 1, header, header + 1, len(data) - 1,
            *map(int, rng.integers(header, len(data), 4))}
    model, opt = fresh(seed)
    for cut in sorted(cuts):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        refuse(bad, model, opt, "not a readable safetensors")
    assert opt.loads == 0


def test_foreign_and_non_safetensors_files_are_refused(tmp_path, seed):
    model, opt = fresh(seed)
    rng = np.random.default_rng(seed)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"weight": rng.standard_normal((3, 4)).astype(np.float32)}, str(foreign), metadata={"format": "pt"})
    refuse(foreign, model, opt, "not a pyxtts checkpoint")
    junk = tmp_path / "random.safetensors"
    junk.write_bytes(b"\x01" + rng.bytes(4095))  # neither a zip's nor a pickle's first byte
    refuse(junk, model, opt, "not a readable safetensors")
    with pytest.raises(pyxtts.CheckpointError) as info:
        pyxtts.load_checkpoint(junk, model, opt)
    assert "PyTorch" not in str(info.value), "only a PyTorch file gets the advice for one"
    # a pickle (what a .pth is) is never unpickled: its payload would create a file
    marker = tmp_path / "unpickled"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    evil = tmp_path / "model.pth"
    evil.write_bytes(pickle.dumps({"model": Evil()}))
    refuse(evil, model, opt, "nothing is unpickled.*; it is a PyTorch file")
    assert not marker.exists()
    import torch

    pth = tmp_path / "real.pth"
    torch.save({"model": {"gpt.x": torch.zeros(3)}}, pth)
    # what torch.save writes, as Coqui's checkpoints are: the message says where such a file goes
    refuse(pth, model, opt, "not a readable safetensors .*; it is a PyTorch file, as Coqui's model.pth and its "
                            "trainer's checkpoint_<N>.pth and best_model.pth are: pyxtts starts a run from those "
                            r"with `pyxtts train --init PATH` \(pyxtts.import_xtts_checkpoint\), and loads, resumes "
                            r"and exports only its own .safetensors checkpoints$")
    with pytest.raises(FileNotFoundError):
        pyxtts.load_checkpoint(tmp_path / "absent.safetensors", model)


def test_other_architecture_names_the_fields(saved, seed):
    path, _, _ = saved
    cfg = pyxtts.ModelConfig(**{**asdict(TINY), "n_layers": 3, "text_vocab_size": 40,
                                "max_attention_sequence_length": None})
    model = pyxtts.XTTSGPT(cfg, seed=seed % 1000)
    opt = FakeOptimizer(model, np.random.default_rng(seed))
    before = full_state(model, opt, gradients=False)
    with pytest.raises(pyxtts.CheckpointError, match="another architecture") as e:
        pyxtts.load_checkpoint(path, model, opt)
    msg = str(e.value)
    assert "n_layers: checkpoint 2, model 3" in msg and "text_vocab_size: checkpoint 37, model 40" in msg
    assert "n_heads" not in msg
    assert_same(full_state(model, opt, gradients=False), before, "a refused load")


def test_wrong_shape_version_and_content_are_refused(saved, tmp_path, seed):
    path, _, _ = saved
    model, opt = fresh(seed)
    name = "model.gpt.h.1.mlp.c_fc.weight"
    cases = [
        ("shape", lambda m: None, lambda t: t.__setitem__(name, t[name][:, :-1].copy()), "shape"),
        ("version", lambda m: m.__setitem__("format_version", 99), None, "unknown checkpoint format version 99"),
        ("marker", lambda m: m.__setitem__("format", "other"), None, "not a pyxtts checkpoint"),
        ("missing", None, lambda t: t.pop(name), "parameter names differ"),
        ("stray", None, lambda t: t.__setitem__("other.w", np.zeros(2, np.float32)), "unexpected tensors"),
        ("nan", None, lambda t: t[name].__setitem__((0, 0), np.nan), "NaN"),
        ("optshape", None, lambda t: t.__setitem__("optimizer.exp_avg.gpt.ln_f.bias",
                                                   np.zeros(5, np.float32)), "optimizer state"),
        ("optkeys", lambda m: m["optimizer"]["state"].pop("loss_scale"), None, "keys differ"),
        ("opttype", lambda m: m["optimizer"].__setitem__("type", "SGD"), None, "'SGD'"),
    ]
    for tag, em, et, match in cases:
        bad = tmp_path / f"{tag}.safetensors"
        rewrite(path, bad, em, et)
        refuse(bad, model, opt, match)
    bad = tmp_path / "badjson.safetensors"
    with safe_open(str(path), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    save_file(tensors, str(bad), metadata={"pyxtts": "{not json"})
    refuse(bad, model, opt, "not valid JSON")
    assert opt.loads == 0


def test_optimizer_refusal_rolls_the_model_back(saved, seed):
    path, _, _ = saved
    model, opt = fresh(seed)
    opt.refuse = True
    refuse(path, model, opt, "optimizer refused")


def test_temp_file_is_never_taken_for_a_checkpoint(saved, seed):
    path, _, _ = saved
    tmp = path.with_name(path.name + ".tmp-12345")
    tmp.write_bytes(path.read_bytes())  # even a complete one
    model, opt = fresh(seed)
    refuse(tmp, model, opt, "unfinished save")


# ---- crash safety --------------------------------------------------------------

KILL_CHILD = r"""
import os, sys, time
import pyxtts
path, slow = sys.argv[1], sys.argv[2] == "1"
if slow:  # a slow disk: the data is written, the rename has not happened yet
    real = os.fsync
    def fsync(fd):
        print("fsync", flush=True)
        time.sleep(60)
        real(fd)
    os.fsync = fsync
model = pyxtts.XTTSGPT(pyxtts.ModelConfig(n_layers=8, d_model=512, n_heads=8), seed=7)
print("saving", flush=True)
pyxtts.save_checkpoint(path, model, step=99)
print("done", flush=True)
"""


def popen_python(code, *args):
    root = str(Path(pyxtts.__file__).resolve().parent.parent)
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, here, env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd="/")


def writing(path):
    """Whether a file other than ``path`` holds bytes in its folder (hidden files, and
    files in subfolders, included): the save under way has started writing."""
    return any(p != path and p.is_file() and p.stat().st_size > 0 for p in path.parent.rglob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("slow", [True, False], ids=["killed-before-rename", "killed-while-writing"])
def test_killed_save_leaves_previous_checkpoint(saved, seed, slow):
    path, model, opt = saved
    original = path.read_bytes()
    child = popen_python(KILL_CHILD, str(path), "1" if slow else "0")
    tmp = path.with_name(f"{path.name}.tmp-{child.pid}")
    try:
        if slow:
            assert child.stdout.readline() == "saving\n", child.stderr.read()
            assert child.stdout.readline() == "fsync\n", child.stderr.read()
        else:  # killed while bytes are being written, wherever the writer writes them
            deadline = time.monotonic() + 60
            while not writing(path):
                assert child.poll() is None, child.stderr.read()
                assert time.monotonic() < deadline, "the child never started writing"
                time.sleep(0.001)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    m2, o2 = fresh(seed)
    if path.read_bytes() != original:
        # the kill came after the rename: then the new checkpoint is complete
        assert not slow
        assert pyxtts.load_checkpoint(path, pyxtts.XTTSGPT(pyxtts.ModelConfig(
            n_layers=8, d_model=512, n_heads=8)))["step"] == 99
        return
    pyxtts.load_checkpoint(path, m2, o2)
    for k, v in model.state_dict().items():
        assert_bits_equal(m2.state_dict()[k], v, k)
    if slow:
        assert tmp.exists()
    if tmp.exists():
        with pytest.raises(pyxtts.CheckpointError, match="unfinished save"):
            pyxtts.load_checkpoint(tmp, m2)
    # the next save cleans up what the dead process left: its folder, and in it the hidden
    # file safetensors was writing (as large as the checkpoint)
    pyxtts.save_checkpoint(path, model, opt, step=124)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_a_save_that_fails_names_the_file_and_leaves_the_folder_as_it_was(saved):
    """A full disk fails a save inside safetensors' own writer (here a file size limit:
    EFBIG where a full disk gives ENOSPC): the error is an OSError of that errno whose one
    line names the checkpoint and the cause, not safetensors' SafetensorError, and the
    folder holds the previous checkpoint, unchanged, and nothing else."""
    path, model, opt = saved
    original = path.read_bytes()
    with file_size_limit(len(original) // 2):
        with pytest.raises(OSError) as caught:
            pyxtts.save_checkpoint(path, model, opt, step=124)
    assert caught.value.errno == errno.EFBIG
    assert str(caught.value) == f"[Errno {errno.EFBIG}] cannot write {str(path)!r}: {os.strerror(errno.EFBIG)}"
    assert path.read_bytes() == original
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


KILLED_SAVE = KILLED_BY_FILE_SIZE + r"""
import sys
import pyxtts
model = pyxtts.XTTSGPT(pyxtts.ModelConfig(**__import__("json").loads(sys.argv[2])), seed=7)
die_past(int(sys.argv[3]))
pyxtts.save_checkpoint(sys.argv[1], model, step=99)
"""


def test_a_save_killed_inside_the_writer_leaves_nothing_after_the_next_save(saved, seed):
    """The kernel kills the saving process in the middle of safetensors' write (of the
    file safetensors makes beside the name it is given, before its rename): the previous
    checkpoint loads, unchanged, and the next save removes every file the dead one left."""
    path, model, opt = saved
    original = path.read_bytes()
    cfg = json.dumps({k: v for k, v in asdict(TINY).items() if k != "max_attention_sequence_length"})
    r = run_python(KILLED_SAVE, str(path), cfg, str(len(original) // 4))
    assert r.returncode == -signal.SIGXFSZ, r.stderr
    assert path.read_bytes() == original
    assert [p for p in path.parent.iterdir() if p != path], "the killed save left nothing: it was not mid-write"
    m2, o2 = fresh(seed)
    assert pyxtts.load_checkpoint(path, m2, o2)["step"] == 123
    pyxtts.save_checkpoint(path, model, opt, step=124)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


# ---- exact resume in a fresh process --------------------------------------------

TRAIN_CHILD = r"""
import json, sys
import numpy as np
import pyxtts
from helpers import random_batch
src, dst, steps, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cfg = pyxtts.ModelConfig(**json.loads(sys.argv[5]))
model = pyxtts.XTTSGPT(cfg, seed=seed if src == "-" else seed + 1)
opt = pyxtts.AdamW(model, lr=1e-3) if hasattr(pyxtts, "AdamW") else None
sched = pyxtts.WarmupCosineLR(2e-2, 2, 12, min_lr=1e-3)
rng = np.random.default_rng(seed)
start = 0
if src != "-":
    meta = pyxtts.load_checkpoint(src, model, opt)
    start = meta["step"]
    rng.bit_generator.state = meta["extra"]["rng"]
for step in range(start, start + steps):
    batch = random_batch(rng, cfg, 2, 7, 11)
    model.zero_grad()
    model.forward_backward(batch)
    lr = sched(step)
    if opt is not None:
        sched.apply(opt, step)
        opt.step()
    else:  # plain SGD through the parameter views
        grads = model.gradients()
        for name, p in model.parameters().items():
            p.copy_(p.numpy() - np.float32(lr) * grads[name].numpy())
pyxtts.save_checkpoint(dst, model, opt, step=start + steps, extra={"rng": rng.bit_generator.state})
print("optimizer", "AdamW" if opt is not None else "SGD")
"""


@pytest.mark.slow
def test_resume_in_fresh_process_is_bit_exact(tmp_path, seed):
    cfg = json.dumps({k: v for k, v in asdict(TINY).items() if k != "max_attention_sequence_length"})
    s = str(seed % (1 << 30))
    n, m = 3, 4

    def run(src, dst, steps):
        r = run_python(TRAIN_CHILD, src, str(dst), str(steps), s, cfg)
        assert r.returncode == 0, r.stderr
        return r.stdout

    out = run("-", tmp_path / "a.safetensors", n)
    assert ("AdamW" if HAS_ADAMW else "SGD") in out
    run("-", tmp_path / "straight.safetensors", n + m)
    run(str(tmp_path / "a.safetensors"), tmp_path / "resumed.safetensors", m)
    meta_s, t_s = pyxtts.checkpoint.read_checkpoint(tmp_path / "straight.safetensors")
    meta_r, t_r = pyxtts.checkpoint.read_checkpoint(tmp_path / "resumed.safetensors")
    _, t_a = pyxtts.checkpoint.read_checkpoint(tmp_path / "a.safetensors")
    assert meta_s["step"] == meta_r["step"] == n + m and meta_s["extra"] == meta_r["extra"]
    assert set(t_s) == set(t_r)
    for k in t_s:
        assert_bits_equal(t_r[k], t_s[k], f"{k} (seed {seed})")
    assert any(not np.array_equal(t_a[k], t_s[k]) for k in t_a), "training did not move the parameters"


@pytest.mark.skipif(not HAS_ADAMW, reason=NO_ADAMW)
def test_adamw_state_round_trip(tmp_path, seed):
    from helpers import random_batch

    rng = np.random.default_rng(seed)
    model = pyxtts.XTTSGPT(TINY, seed=seed % 1000)
    opt = pyxtts.AdamW(model, lr=3e-3)
    for _ in range(2):
        model.zero_grad()
        model.forward_backward(random_batch(rng, TINY, 2, 5, 8))
        opt.step()
    pyxtts.save_checkpoint(tmp_path / "a.safetensors", model, opt, step=2)
    m2 = pyxtts.XTTSGPT(TINY, seed=seed % 1000 + 1)
    o2 = pyxtts.AdamW(m2, lr=1.0)
    before = full_state(m2, o2, gradients=False)
    bad = tmp_path / "bad.safetensors"
    rewrite(tmp_path / "a.safetensors", bad, lambda m: m.__setitem__("format_version", 7))
    with pytest.raises(pyxtts.CheckpointError):
        pyxtts.load_checkpoint(bad, m2, o2)
    assert_same(full_state(m2, o2, gradients=False), before, "a refused load")
    pyxtts.load_checkpoint(tmp_path / "a.safetensors", m2, o2)
    assert o2.lr == opt.lr
    assert_same_state(flat_state(o2), flat_state(opt))


# ---- XTTS v2 .pth import -----------------------------------------------------------

def synthetic_pth(path, model, rng):
    import torch

    sd = {"gpt." + k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()}
    randn = lambda *shape: torch.from_numpy(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    sd["gpt.prompt_embedding.weight"] = randn(4, 4)  # XTTS v1's, not this model's
    sd["hifigan_decoder.waveform_decoder.conv_pre.weight"] = randn(8, 3)
    sd["mel_stats"] = torch.from_numpy(rng.standard_normal(80).astype(np.float32))
    torch.save({"config": {"model": "xtts"}, "model": sd}, path)


def test_import_xtts_pth(tmp_path, seed):
    rng = np.random.default_rng(seed)
    model = pyxtts.XTTSGPT(TINY, seed=seed % 1000)
    pth = tmp_path / "model.pth"
    synthetic_pth(pth, model, rng)
    out = tmp_path / "imported.safetensors"
    meta = pyxtts.import_xtts_checkpoint(pth, out, config=TINY)
    # a GPT tensor the model lacks is kept aside in the file, not dropped; the conditioning
    # path's are the model's own
    assert meta["extra"]["carried"] == ["prompt_embedding.weight"]
    m2 = pyxtts.XTTSGPT(TINY, seed=seed % 1000 + 1)
    assert pyxtts.load_checkpoint(out, m2)["carried"] == ["prompt_embedding.weight"]
    for k, v in model.state_dict().items():
        assert_bits_equal(m2.state_dict()[k], v, k)
    _, tensors = pyxtts.checkpoint.read_checkpoint(out)
    import torch
    kept = torch.load(pth, weights_only=True)["model"]["gpt.prompt_embedding.weight"].numpy()
    assert_bits_equal(tensors["carried.prompt_embedding.weight"], kept)
    # without a config the sizes come from the shapes, and n_heads is a guess it says it is
    out2 = tmp_path / "inferred.safetensors"
    with pytest.warns(UserWarning, match="n_heads=16 guessed"):
        meta2 = pyxtts.import_xtts_checkpoint(pth, out2)
    assert meta2["extra"]["n_heads_guessed"] is True
    cfg = pyxtts.ModelConfig(**meta2["config"])
    for f in ("n_layers", "d_model", "text_vocab_size", "audio_vocab_size", "max_text_tokens", "max_audio_tokens",
              "conditioning", "n_cond_latents"):
        assert getattr(cfg, f) == getattr(TINY, f), f
    m3 = pyxtts.XTTSGPT(cfg)
    pyxtts.load_checkpoint(out2, m3)
    assert_bits_equal(m3.state_dict()["mel_head.weight"], model.state_dict()["mel_head.weight"])
    # the wrong config is refused and nothing is written
    other = pyxtts.ModelConfig(**{**asdict(TINY), "d_model": 64, "max_attention_sequence_length": None})
    with pytest.raises(pyxtts.CheckpointError, match="shape"):
        pyxtts.import_xtts_checkpoint(pth, tmp_path / "no.safetensors", config=other)
    assert not (tmp_path / "no.safetensors").exists()
    with pytest.raises(pyxtts.CheckpointError):
        pyxtts.import_xtts_checkpoint(out, tmp_path / "no.safetensors")  # not a .pth


def test_import_needs_no_torch(tmp_path, seed):
    model = pyxtts.XTTSGPT(TINY, seed=seed % 1000)
    pth = tmp_path / "model.pth"
    synthetic_pth(pth, model, np.random.default_rng(seed))
    r = run_python("import sys; sys.modules['torch'] = None\n"
                   "import pyxtts\n"
                   f"cfg = pyxtts.ModelConfig(**{asdict(TINY)!r})\n"
                   f"pyxtts.import_xtts_checkpoint({str(pth)!r}, {str(tmp_path / 'y.safetensors')!r}, config=cfg)\n"
                   f"m = pyxtts.XTTSGPT(cfg)\n"
                   f"pyxtts.load_checkpoint({str(tmp_path / 'y.safetensors')!r}, m)\n"
                   "print(m.state_dict()['mel_head.weight'].tobytes().hex())\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == model.state_dict()["mel_head.weight"].tobytes().hex()

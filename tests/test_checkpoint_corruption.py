"""Corrupt checkpoints are refused (issue 11, items 9 and 10): single-byte changes of the
header and of tensor data, truncations, missing, swapped and inconsistent fields, each
refused with a CheckpointError naming the problem, model and optimizer unchanged.

The header is checked at every byte when PYXTTS_FULL_FUZZ=1 (the sanitizer run of CI);
otherwise at a seeded sample of its bytes."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from safetensors import safe_open

import pyxtts
import pyxtts.checkpoint
from helpers import edit_checkpoint, make_rng, trained
from helpers.state import full_state

CFG = pyxtts.ModelConfig(n_layers=1, d_model=16, n_heads=2, text_vocab_size=11, audio_vocab_size=9,
                         max_text_tokens=6, max_audio_tokens=8, n_cond_latents=0)
FULL = os.environ.get("PYXTTS_FULL_FUZZ") == "1"

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")  # the Trainers here set a memory limit


@pytest.fixture(autouse=True)
def release_cache():
    """The models made here go, and so do the segments they leave cached in the CPU
    allocator, so that tests after these start from the allocator they would otherwise."""
    yield
    import gc

    gc.collect()
    pyxtts.empty_cache("cpu")


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (np.array_equal(np.asarray(a[k]).view(np.uint8), np.asarray(b[k]).view(np.uint8))
         if isinstance(a[k], np.ndarray) else a[k] == b[k]) for k in a)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    d = tmp_path_factory.mktemp("corruption")
    m, opt, _ = trained(CFG, steps=2, shape=(2, 5, 7), salt="corruption")
    path = d / "good.safetensors"
    pyxtts.save_checkpoint(path, m, opt, step=2, extra={"epoch": 1, "batch_in_epoch": 3})
    return path, path.read_bytes()


class Target:
    """A model and optimizer that must stay exactly as they are through every refusal."""

    def __init__(self):
        self.m, self.opt, _ = trained(CFG, seed=1, steps=2, shape=(2, 5, 7), salt="corruption")
        self.before = full_state(self.m, self.opt, gradients=False)

    def refuse(self, path, what: str, match: str | None = None) -> str:
        with pytest.raises(pyxtts.CheckpointError) as e:
            pyxtts.load_checkpoint(path, self.m, self.opt)
        assert str(path) in str(e.value), (what, str(e.value))
        if match is not None:
            assert match in str(e.value), (what, str(e.value))
        assert same(full_state(self.m, self.opt, gradients=False), self.before), f"{what}: state changed"
        return str(e.value)


def test_the_good_file_loads_and_is_safetensors_readable(good, tmp_path):
    path, _ = good
    with safe_open(str(path), framework="numpy") as f:  # plain safetensors tools read it
        meta = f.metadata()
        assert json.loads(meta["pyxtts"])["format_version"] == 2
        assert len(meta["pyxtts.crc32"]) == 8
        assert "model.mel_head.weight" in list(f.keys())
    t = Target()
    out = pyxtts.load_checkpoint(path, t.m, t.opt)
    assert out["step"] == 2 and out["extra"] == {"epoch": 1, "batch_in_epoch": 3}
    assert "checksums" not in out


def test_every_byte_change_of_the_header_is_refused(good, tmp_path, seed):
    path, raw = good
    n = struct.unpack("<Q", raw[:8])[0]
    positions = list(range(8 + n))
    if not FULL:
        positions = sorted(make_rng("corruption.header").choice(positions, 300, replace=False).tolist()
                           + list(range(8)))
    t = Target()
    bad = tmp_path / "bad.safetensors"
    tried = 0
    for i in positions:
        for mask in (0x01, 0x80):
            b = bytearray(raw)
            b[i] ^= mask
            bad.write_bytes(bytes(b))
            t.refuse(bad, f"header byte {i} ^ {mask:#x} (seed {seed})")
            tried += 1
    print(f"header byte changes refused: {tried} of {tried}")


def test_data_byte_changes_are_refused(good, tmp_path, seed):
    path, raw = good
    n = struct.unpack("<Q", raw[:8])[0]
    rng = make_rng("corruption.data")
    positions = rng.choice(np.arange(8 + n, len(raw)), 2000 if FULL else 200, replace=False)
    t = Target()
    bad = tmp_path / "bad.safetensors"
    for i in positions.tolist():
        b = bytearray(raw)
        b[i] ^= 1 << int(rng.integers(8))
        bad.write_bytes(bytes(b))
        t.refuse(bad, f"data byte {i} (seed {seed})", "does not match its checksum")


def test_truncations_are_refused(good, tmp_path):
    path, raw = good
    n = struct.unpack("<Q", raw[:8])[0]
    t = Target()
    bad = tmp_path / "bad.safetensors"
    for length in sorted({0, 1, 7, 8, 9, 8 + n // 2, 8 + n - 1, 8 + n, 8 + n + 1, len(raw) // 2, len(raw) - 1}):
        bad.write_bytes(raw[:length])
        t.refuse(bad, f"truncated to {length} bytes")


edited = edit_checkpoint


def swap_mv(t):
    t["optimizer.m"], t["optimizer.v"] = t["optimizer.v"].copy(), t["optimizer.m"].copy()


def neg_v(t):
    v = t["optimizer.v"].copy()
    v[np.argmax(v)] = -v.max()
    t["optimizer.v"] = v


def master_differs(t):
    a = t["optimizer.master"].copy()
    a[0] += 1.0
    t["optimizer.master"] = a


def model_differs(t):
    a = t["model.mel_head.weight"].copy()
    a.flat[3] = np.nextafter(a.flat[3], np.float32(np.inf))
    t["model.mel_head.weight"] = a


FIELD_CASES = [
    # (name, edit_meta, edit_tensors, seal, fragment of the message)
    ("step -1", lambda m: m.__setitem__("step", -1), None, True, "'step' must be >= 0"),
    ("step bool", lambda m: m.__setitem__("step", True), None, True, "'step'"),
    ("no extra", lambda m: m.pop("extra"), None, True, "fields missing: extra"),
    ("no config", lambda m: m.pop("config"), None, True, "fields missing: config"),
    ("no optimizer", lambda m: m.pop("optimizer"), None, True, "fields missing: optimizer"),
    ("misspelled extra", lambda m: m.__setitem__("extrq", m.pop("extra")), None, True, "extra"),
    ("unknown field", lambda m: m.__setitem__("surplus", 1), None, True, "unknown metadata fields"),
    ("no checksum of a tensor", lambda m: None, lambda t: t.__setitem__("optimizer.extra_t", np.zeros(2, np.float32)),
     False, "checksum"),
    ("edited metadata, unsealed", lambda m: m.__setitem__("step", 3), None, False, "checksum"),
    ("edited tensor, unsealed", None, lambda t: t["model.mel_head.bias"].__setitem__(0, 1.0), False, "checksum"),
    ("m and v swapped", None, swap_mv, True, "m and v swapped"),
    ("negative v", None, neg_v, True, "must be >= 0"),
    ("master differs from model", None, master_differs, True, "disagree"),
    ("model differs from master", None, model_differs, True, "disagree"),
    ("nan in m", None, lambda t: t["optimizer.m"].__setitem__(0, np.nan), True, "NaN"),
]


@pytest.mark.parametrize("case", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_missing_swapped_and_inconsistent_fields_are_refused(good, tmp_path, case):
    name, em, et, seal, fragment = case
    path, _ = good
    bad = tmp_path / "bad.safetensors"
    edited(path, bad, em, et, seal)
    Target().refuse(bad, name, fragment)


def test_metadata_checksum_entry_is_required(good, tmp_path):
    path, _ = good
    from safetensors.numpy import save_file

    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    del meta["pyxtts.crc32"]
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata=meta)
    Target().refuse(bad, "no metadata checksum", "pyxtts.crc32")


def test_trainer_load_refuses_a_file_without_its_position(tmp_path):
    """A file whose extra lacks the position in the data was once read as epoch 0,
    batch 0: now refused, nothing loaded."""
    cfg = pyxtts.XTTSConfig()
    cfg.model = CFG
    cfg.training.device = "cpu"
    cfg.training.checkpoint_dir = str(tmp_path / "run")
    trainer = pyxtts.Trainer(cfg, progress=False)
    good = trainer.save()
    bad = tmp_path / "noposition.safetensors"
    for extra in ({"epoch": 1}, None, {"epoch": 1, "batch_in_epoch": -2}):
        edited(good, bad, lambda m: m.__setitem__("extra", extra))
        other = pyxtts.Trainer(cfg, progress=False)
        before = {k: v.copy() for k, v in other.model.state_dict().items()}
        with pytest.raises(pyxtts.CheckpointError, match="not a checkpoint of Trainer.save"):
            other.load(bad)
        assert all(np.array_equal(v, before[k]) for k, v in other.model.state_dict().items())
        assert other.step == 0
    assert pyxtts.Trainer(cfg, progress=False).load(good)["step"] == 0


def test_version_1_files_load_with_a_warning(good, tmp_path):
    """Written before checksums: accepted (every other check still runs), with a warning
    that says the bytes could not be verified."""
    path, _ = good
    old = tmp_path / "v1.safetensors"
    edited(path, old, lambda m: (m.__setitem__("format_version", 1), m.pop("checksums")), seal=False)
    with safe_open(str(old), framework="numpy") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    from safetensors.numpy import save_file

    del meta["pyxtts.crc32"]
    save_file(tensors, str(old), metadata=meta)
    t = Target()
    with pytest.warns(pyxtts.checkpoint.CheckpointWarning, match="cannot be verified"):
        pyxtts.load_checkpoint(old, t.m, t.opt)

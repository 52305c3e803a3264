"""pyxtts.torchfile: PyTorch checkpoints read without torch and without running anything
they hold, and rewritten with some storages replaced. torch writes the files and is the
reference for their contents."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest

import pyxtts
from pyxtts.torchfile import (PickledObject, TensorRef, TorchFile, TorchFileError, read_tensors, rewrite_storages,
                              storages_with)

torch = pytest.importorskip("torch", reason="torch writes the reference files (pip install torch)")


class RunsACommand:
    """Unpickling this runs a shell command (what a malicious checkpoint does)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class RunsPython:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):
        import builtins
        return builtins.exec, (self.code,)


def test_a_pickle_that_runs_code_runs_nothing(tmp_path, rng):
    marker1, marker2 = tmp_path / "ran-system", tmp_path / "ran-exec"
    path = tmp_path / "model.pth"
    weights = {"gpt.text_embedding.weight": torch.from_numpy(rng.standard_normal((5, 4)))}
    torch.save({"config": RunsACommand(f"touch {marker1}"), "model": weights,
                "extra": [RunsPython(f"open({str(marker2)!r}, 'w').write('x')")]}, path)
    # the file is live: PyTorch's unrestricted loader runs both (in a child process)
    load = f"import torch; torch.load({str(path)!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", load], check=True, capture_output=True)
    assert marker1.exists() and marker2.exists(), "the control: loading it normally runs its code"
    marker1.unlink()
    marker2.unlink()
    with TorchFile(path) as f:
        cfg, extra = f.obj["config"], f.obj["extra"][0]
        assert isinstance(cfg, PickledObject) and (cfg.module, cfg.name) in (("posix", "system"), ("os", "system"))
        assert cfg.args == (f"touch {marker1}",)
        assert isinstance(extra, PickledObject) and (extra.module, extra.name) == ("builtins", "exec")
        assert np.array_equal(f.array(f.obj["model"]["gpt.text_embedding.weight"]),
                              weights["gpt.text_embedding.weight"].numpy())
    with pytest.raises(pyxtts.CheckpointError, match="cannot infer the config"):  # and no config to read
        pyxtts.import_xtts_checkpoint(path, tmp_path / "out.safetensors")
    assert not marker1.exists() and not marker2.exists(), "nothing in the file ran"


def reference_tensors(rng) -> dict:
    base = torch.from_numpy(rng.standard_normal((6, 7)).astype(np.float32))
    return {
        "f32": base.clone(),
        "f16": torch.from_numpy(rng.standard_normal((3, 5)).astype(np.float16)),
        "bf16": torch.from_numpy(rng.standard_normal((4, 3)).astype(np.float32)).to(torch.bfloat16),
        "i64": torch.from_numpy(rng.integers(-10**12, 10**12, (9,))),
        "bool": torch.from_numpy(rng.random(8) < 0.5),
        "transposed": base.t(),  # a view of base's storage (f32 is a copy)
        "view": base[2:5, 1::2],
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "param": torch.nn.Parameter(torch.from_numpy(rng.standard_normal(5).astype(np.float32))),
    }


def as_numpy(t) -> np.ndarray:
    t = t.detach()
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()


def test_tensors_read_as_torch_has_them(tmp_path, rng, seed):
    ref = reference_tensors(rng)
    path = tmp_path / "t.pth"
    torch.save({"model": ref, "step": 7, "names": ("a", "b"), "nested": [{"x": {1, 2}}]}, path)
    with TorchFile(path) as f:
        assert f.obj["step"] == 7 and f.obj["names"] == ("a", "b") and f.obj["nested"] == [{"x": {1, 2}}]
        for k, t in ref.items():
            r = f.obj["model"][k]
            assert isinstance(r, TensorRef)
            got, want = f.array(r), as_numpy(t)
            assert got.dtype == want.dtype and got.shape == want.shape, (k, seed)
            assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (k, seed)  # every bit


def test_rewrite_replaces_only_the_named_storages(tmp_path, rng, seed):
    a = torch.from_numpy(rng.standard_normal((6, 7)).astype(np.float32))
    state = {"a": a, "a_t": a.t(), "b": torch.from_numpy(rng.standard_normal(5).astype(np.float32)).to(torch.bfloat16),
             "c": torch.from_numpy(rng.standard_normal((2, 3)).astype(np.float32)),
             "i": torch.arange(4)}
    src_path, dst = tmp_path / "src.pth", tmp_path / "dst.pth"
    torch.save({"config": {"k": 1}, "model": state}, src_path)
    new_a = rng.standard_normal((6, 7)).astype(np.float32)
    new_b = rng.standard_normal(5).astype(np.float32).astype(ml_dtypes.bfloat16)
    with TorchFile(src_path) as src:
        m = src.obj["model"]
        storages = storages_with(src, {m["a"]: new_a, m["a_t"]: np.ascontiguousarray(new_a.T), m["b"]: new_b})
        rewrite_storages(src, dst, storages)
        replaced = {f"{src.prefix}data/{k}" for k in storages}
        assert len(replaced) == 2  # a and a_t share one
        with pytest.raises(TorchFileError, match="shared by tensors given different values"):
            storages_with(src, {m["a"]: new_a, m["a_t"]: np.zeros((7, 6), np.float32)})
    for mmap in (False, True):  # mmap needs the 64-byte alignment torch.save keeps
        out = torch.load(dst, weights_only=True, mmap=mmap)
        assert out["config"] == {"k": 1}
        o = out["model"]
        assert np.array_equal(o["a"].numpy(), new_a) and np.array_equal(o["a_t"].numpy(), new_a.T), seed
        assert np.array_equal(as_numpy(o["b"]).view(np.uint16), new_b.view(np.uint16))
        assert o["a"].untyped_storage().data_ptr() == o["a_t"].untyped_storage().data_ptr(), "still one storage"
        assert torch.equal(o["c"], state["c"]) and torch.equal(o["i"], state["i"])
    with zipfile.ZipFile(src_path) as zs, zipfile.ZipFile(dst) as zd:
        assert zs.namelist() == zd.namelist()
        for name in zs.namelist():  # every record but the replaced storages is the same bytes
            if name not in replaced:
                assert zs.read(name) == zd.read(name), name


@pytest.mark.parametrize("content, match", [
    (b"not a zip at all", "not a PyTorch zip checkpoint"),
    (None, "no single <name>/data.pkl"),
])
def test_foreign_files_are_refused(tmp_path, content, match):
    path = tmp_path / "x.pth"
    if content is None:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("a/b.txt", "hello")
    else:
        path.write_bytes(content)
    with pytest.raises(TorchFileError, match=match):
        TorchFile(path)


def test_broken_archives_are_refused(tmp_path):
    good = tmp_path / "good.pth"
    torch.save({"w": torch.ones(3)}, good)
    with zipfile.ZipFile(good) as z:
        records = {n: z.read(n) for n in z.namelist()}
    data = next(n for n in records if n.endswith("/data/0"))
    pkl = next(n for n in records if n.endswith("data.pkl"))
    for what, change, match in (("missing storage", lambda r: r.pop(data), "no data record"),
                                ("short storage", lambda r: r.__setitem__(data, r[data][:4]), "elements but 4 bytes"),
                                ("bad pickle", lambda r: r.__setitem__(pkl, r[pkl][:20]), "does not unpickle")):
        broken = dict(records)
        change(broken)
        path = tmp_path / f"{what}.pth"
        with zipfile.ZipFile(path, "w") as z:
            for n, b in broken.items():
                z.writestr(n, b)
        with pytest.raises(TorchFileError, match=match):
            TorchFile(path)


def _data_start(raw: bytes, info: zipfile.ZipInfo) -> int:
    """Where a member's data starts: after its local header (30 bytes, name, extra field)."""
    n, extra = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    return info.header_offset + 30 + n + extra


def test_damaged_members_are_refused(tmp_path):
    """A byte flipped inside a stored member fails zipfile's CRC check, one inside a deflated
    member its decompression: a TorchFileError either way (found by the fuzz: zipfile's
    BadZipFile came through, which no caller catches as a refusal)."""
    good = tmp_path / "good.pth"
    torch.save({"w": torch.ones(3)}, good)
    raw = good.read_bytes()
    with zipfile.ZipFile(good) as z:
        read = [i for i in z.infolist() if i.filename.endswith(("data.pkl", "byteorder", "data/0"))]
    assert len(read) == 3
    for info in read:  # the first byte of each member the reader reads
        bad = bytearray(raw)
        bad[_data_start(raw, info)] ^= 0xFF
        path = tmp_path / "bad.pth"
        path.write_bytes(bytes(bad))
        with pytest.raises(TorchFileError, match="damaged"):
            read_tensors(path)
    deflated = tmp_path / "deflated.pth"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst:
        for n in src.namelist():
            dst.writestr(n, src.read(n))
    raw = bytearray(deflated.read_bytes())
    with zipfile.ZipFile(deflated) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("data.pkl"))
    raw[_data_start(bytes(raw), info)] ^= 0xFF  # a deflate block header: bad data, not just a CRC
    deflated.write_bytes(bytes(raw))
    with pytest.raises(TorchFileError, match="damaged"):
        TorchFile(deflated)


def test_every_flipped_byte_is_read_or_refused(tmp_path):
    """Bit 7 of each byte of a small checkpoint flipped (bits 0 and 0-7 too with
    PYXTTS_FULL_FUZZ=1): read_tensors returns or raises TorchFileError,
    never zipfile's or the codec's errors (found by the fuzz: BadZipFile "spans multiple
    disks", RuntimeError "encrypted", OSError from a seek, UnicodeDecodeError of a name)."""
    good = tmp_path / "good.pth"
    torch.save({"w": torch.ones(3)}, good)
    raw = good.read_bytes()
    path = tmp_path / "flipped.pth"
    bits = (0x01, 0x80, 0xFF) if os.environ.get("PYXTTS_FULL_FUZZ") == "1" else (0x80,)
    for i in range(len(raw)):
        for bit in bits:
            bad = bytearray(raw)
            bad[i] ^= bit
            path.write_bytes(bytes(bad))
            try:
                read_tensors(path)
            except TorchFileError:
                pass


def test_read_tensors_equals_torch_load(tmp_path, seed):
    """Every dtype torch.save writes for plain tensors, views into shared storages, a
    parameter, a scalar and an empty tensor, in a state dict and bare (as mel_stats.pth is)."""
    g = torch.Generator().manual_seed(seed % 2**31)
    big = torch.randn(7, 9, generator=g)
    obj = {
        "f32": torch.randn(3, 4, 5, generator=g),
        "f64": torch.randn(6, generator=g, dtype=torch.float64),
        "f16": torch.randn(2, 3, generator=g).half(),
        "bf16": torch.randn(4, 2, generator=g).bfloat16(),
        "i64": torch.randint(-2**40, 2**40, (5,), generator=g),
        "i32": torch.randint(-2**30, 2**30, (2, 2), generator=g, dtype=torch.int32),
        "i16": torch.randint(-2**15, 2**15, (3,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-128, 128, (4,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 256, (4,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(5, generator=g) < 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "transposed": big.t(),  # non-contiguous view
        "sliced": big[2:5, 1::3],  # offset and strides into the same storage as "transposed"
        "param": torch.nn.Parameter(torch.randn(2, 2, generator=g)),
    }
    path = tmp_path / "t.pth"
    torch.save({"state": obj, "list": [obj["f32"], (obj["i8"], 3)], "step": 4}, path)
    got = read_tensors(path)
    assert got["step"] == 4 and isinstance(got["list"][1], tuple) and got["list"][1][1] == 3
    assert list(got["state"]) == list(obj)
    for k, t in [*obj.items(), ("list0", obj["f32"]), ("list1", obj["i8"])]:
        mine = got["state"].get(k) if k in obj else got["list"][0] if k == "list0" else got["list"][1][0]
        want = as_numpy(t)
        assert mine.dtype == want.dtype and mine.shape == want.shape, (k, seed)
        assert mine.tobytes() == np.ascontiguousarray(want).tobytes(), (k, seed)  # every bit
        assert mine.flags.writeable and mine.flags.c_contiguous, k  # a copy, not a view of the file
    torch.save(obj["f32"], path)
    np.testing.assert_array_equal(read_tensors(path), obj["f32"].numpy())


def test_read_tensors_refuses_anything_but_tensors(tmp_path, rng):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pth"
    torch.save({"w": torch.from_numpy(rng.standard_normal(3)), "x": RunsACommand(f"touch {marker}")}, path)
    with pytest.raises(TorchFileError, match=r"holds a pickled (posix|os)\.system, not only tensors"):
        read_tensors(path)
    assert not marker.exists(), "nothing in the file ran"
    torch.save({"model": torch.nn.Linear(2, 2)}, path)  # a whole module, not its state dict
    with pytest.raises(TorchFileError, match=r"holds a pickled torch\.nn\.modules\.linear\.Linear"):
        read_tensors(path)

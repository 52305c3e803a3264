"""Carried tensors in pyxtts checkpoints: GPT tensors of an imported XTTS checkpoint that
the model does not have are kept in the file (``carried.<name>``), reported by
``load_checkpoint``, and loaded into a model that has a parameter of that name."""
from __future__ import annotations

import dataclasses
from dataclasses import asdict

import numpy as np
import pytest

import pyxtts
from pyxtts.checkpoint import read_checkpoint

# the GPT without its conditioning path: the path's tensors are ones it does not have
CFG = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=37, audio_vocab_size=29,
                         max_text_tokens=8, max_audio_tokens=8, n_cond_latents=4, conditioning=False)
WITH_PATH = dataclasses.replace(CFG, conditioning=True)
LATENTS = "conditioning_perceiver.latents"
PATH_PREFIXES = ("conditioning_encoder.", "conditioning_perceiver.")


def carried_arrays(rng) -> dict[str, np.ndarray]:
    return {LATENTS: rng.standard_normal((4, 32)).astype(np.float32),
            "conditioning_encoder.init.weight": rng.standard_normal((32, 80, 1)).astype(np.float32)}


def strip_config_fields(src, dst, names) -> None:
    """dst: src as a pyxtts of before these ModelConfig fields existed wrote it (before
    checksums too: format version 1)."""
    import json

    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(src), framework="numpy") as f:
        meta = json.loads(f.metadata()["pyxtts"])
    for k in names:
        del meta["config"][k]
    meta["format_version"] = 1
    del meta["checksums"]
    save_file(load_file(str(src)), str(dst), metadata={"pyxtts": json.dumps(meta)})


def test_carried_tensors_round_trip_and_are_reported(tmp_path, rng, seed):
    model = pyxtts.XTTSGPT(CFG, seed=seed % 1000)
    carried = carried_arrays(rng)
    pyxtts.save_checkpoint(tmp_path / "c.safetensors", model, carried=carried)
    _, tensors = read_checkpoint(tmp_path / "c.safetensors")
    for k, v in carried.items():
        assert tensors["carried." + k].tobytes() == v.tobytes(), k
    other = pyxtts.XTTSGPT(CFG, seed=seed % 1000 + 1)
    meta = pyxtts.load_checkpoint(tmp_path / "c.safetensors", other)
    assert meta["carried"] == sorted(carried)
    for k, v in model.state_dict().items():
        assert other.state_dict()[k].tobytes() == v.tobytes(), k


def test_a_model_with_the_conditioning_path_takes_its_carried_tensors(tmp_path, rng, seed):
    """An import written before the model had the conditioning path carried its 54
    tensors (and its config had no `conditioning` field): a model with the path takes
    them all as its parameters; one that says it has no path refuses the file."""
    source = pyxtts.XTTSGPT(WITH_PATH, seed=seed % 1000)
    state = {k: (rng.standard_normal(v.shape) * 0.05).astype(np.float32) for k, v in source.state_dict().items()}
    source.load_state_dict(state)
    core = pyxtts.XTTSGPT(CFG)
    core.load_state_dict({k: v for k, v in state.items() if not k.startswith(PATH_PREFIXES)})
    path_tensors = {k: v for k, v in state.items() if k.startswith(PATH_PREFIXES)}
    assert len(path_tensors) == 54
    pyxtts.save_checkpoint(tmp_path / "new.safetensors", core, carried=path_tensors)
    strip_config_fields(tmp_path / "new.safetensors", tmp_path / "old.safetensors",
                        ("dropout", "conditioning", "max_cond_frames"))
    gained = pyxtts.XTTSGPT(WITH_PATH, seed=seed % 1000 + 2)
    with pytest.warns(pyxtts.checkpoint.CheckpointWarning, match="format version 1"):
        meta = pyxtts.load_checkpoint(tmp_path / "old.safetensors", gained)
    assert meta["carried"] == [], "every carried tensor is the model's now"
    for k, v in state.items():
        assert gained.state_dict()[k].tobytes() == v.tobytes(), k
    # the file written with the field says the model has no path: another architecture
    with pytest.raises(pyxtts.CheckpointError, match="conditioning: checkpoint False, model True"):
        pyxtts.load_checkpoint(tmp_path / "new.safetensors", pyxtts.XTTSGPT(WITH_PATH))


def test_save_refuses_a_carried_name_the_model_has(tmp_path):
    model = pyxtts.XTTSGPT(CFG)
    with pytest.raises(ValueError, match="'mel_head.weight' is a parameter of the model"):
        pyxtts.save_checkpoint(tmp_path / "x.safetensors", model, carried={"mel_head.weight": np.zeros((29, 32))})
    with pytest.raises(TypeError, match="carried: expected a mapping"):
        pyxtts.save_checkpoint(tmp_path / "x.safetensors", model, carried=[1, 2])
    assert not (tmp_path / "x.safetensors").exists()


def test_files_without_the_new_config_fields_still_load(tmp_path):
    """A checkpoint written before ModelConfig had the framing, dropout and conditioning
    fields: they take their defaults (the conditioning path: there when the file has its
    tensors), so it loads into a model of the same sizes with the defaults."""
    model = pyxtts.XTTSGPT(CFG, seed=5)
    pyxtts.save_checkpoint(tmp_path / "new.safetensors", model)
    strip_config_fields(tmp_path / "new.safetensors", tmp_path / "old.safetensors",
                        ("start_text_token", "stop_text_token", "start_audio_token", "stop_audio_token",
                         "code_stride_len", "use_perceiver_resampler", "dropout", "conditioning",
                         "max_cond_frames"))
    other = pyxtts.XTTSGPT(CFG, seed=6)
    with pytest.warns(pyxtts.checkpoint.CheckpointWarning, match="format version 1"):
        pyxtts.load_checkpoint(tmp_path / "old.safetensors", other)
    assert other.state_dict()["mel_head.weight"].tobytes() == model.state_dict()["mel_head.weight"].tobytes()
    framed = pyxtts.XTTSGPT(pyxtts.ModelConfig(**{**asdict(CFG), "max_attention_sequence_length": None,
                                                  "start_text_token": 1, "stop_text_token": 0,
                                                  "start_audio_token": 1, "stop_audio_token": 0}))
    with pytest.raises(pyxtts.CheckpointError, match="start_text_token: checkpoint None, model 1"), \
            pytest.warns(pyxtts.checkpoint.CheckpointWarning):
        pyxtts.load_checkpoint(tmp_path / "old.safetensors", framed)

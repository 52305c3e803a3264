"""Carried tensors in pyxtts checkpoints: GPT tensors of an imported XTTS checkpoint that
the model does not have are kept in the file (``carried.<name>``), reported by
``load_checkpoint``, and loaded into a model that has a parameter of that name."""
from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

import pyxtts
from pyxtts.checkpoint import read_checkpoint

CFG = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=37, audio_vocab_size=29,
                         max_text_tokens=8, max_audio_tokens=8, n_cond_latents=4)
LATENTS = "conditioning_perceiver.latents"


class ModelWithLatents(pyxtts.XTTSGPT):
    """An XTTSGPT with one more parameter, as the model will have once it computes its
    conditioning: stands for that model in the test of the hand-over."""

    def __init__(self, config, seed=0):
        super().__init__(config, seed=seed)
        self.latents = pyxtts.zeros((config.n_cond_latents, config.d_model))

    def parameters(self):
        return {**super().parameters(), LATENTS: self.latents}

    def state_dict(self):
        return {**super().state_dict(), LATENTS: self.latents.numpy()}

    def load_state_dict(self, state, strict=True):
        state = dict(state)
        value = state.pop(LATENTS)
        out = super().load_state_dict(state, strict=strict)
        self.latents.copy_(np.ascontiguousarray(value, dtype=np.float32))
        return out


def carried_arrays(rng) -> dict[str, np.ndarray]:
    return {LATENTS: rng.standard_normal((4, 32)).astype(np.float32),
            "conditioning_encoder.init.weight": rng.standard_normal((32, 80, 1)).astype(np.float32)}


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


def test_a_model_that_has_the_tensor_gets_it(tmp_path, rng, seed):
    source = pyxtts.XTTSGPT(CFG, seed=seed % 1000)
    carried = carried_arrays(rng)
    pyxtts.save_checkpoint(tmp_path / "c.safetensors", source, carried=carried)
    gained = ModelWithLatents(CFG, seed=seed % 1000 + 2)
    meta = pyxtts.load_checkpoint(tmp_path / "c.safetensors", gained)
    assert meta["carried"] == ["conditioning_encoder.init.weight"], "the one it has is not reported as carried"
    assert gained.latents.numpy().tobytes() == carried[LATENTS].tobytes()
    assert gained.state_dict()["mel_head.weight"].tobytes() == source.state_dict()["mel_head.weight"].tobytes()


def test_save_refuses_a_carried_name_the_model_has(tmp_path):
    model = pyxtts.XTTSGPT(CFG)
    with pytest.raises(ValueError, match="'mel_head.weight' is a parameter of the model"):
        pyxtts.save_checkpoint(tmp_path / "x.safetensors", model, carried={"mel_head.weight": np.zeros((29, 32))})
    with pytest.raises(TypeError, match="carried: expected a mapping"):
        pyxtts.save_checkpoint(tmp_path / "x.safetensors", model, carried=[1, 2])
    assert not (tmp_path / "x.safetensors").exists()


def test_files_without_the_new_config_fields_still_load(tmp_path):
    """A checkpoint written before ModelConfig had the framing fields: they take their
    defaults, so it loads into a model of the same sizes with the defaults."""
    import json

    from safetensors.numpy import load_file, save_file

    model = pyxtts.XTTSGPT(CFG, seed=5)
    pyxtts.save_checkpoint(tmp_path / "new.safetensors", model)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "new.safetensors"), framework="numpy") as f:
        meta = json.loads(f.metadata()["pyxtts"])
    for k in ("start_text_token", "stop_text_token", "start_audio_token", "stop_audio_token", "code_stride_len",
              "use_perceiver_resampler"):
        del meta["config"][k]
    meta["format_version"] = 1  # such files were written before checksums
    del meta["checksums"]
    save_file(load_file(str(tmp_path / "new.safetensors")), str(tmp_path / "old.safetensors"),
              metadata={"pyxtts": json.dumps(meta)})
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

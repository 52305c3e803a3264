"""Consumer cards without bfloat16 (Turing: RTX 20xx, T4, compute capability 7.5).

No such card is in CI: the device is faked at the one place pyxtts asks about it
(``_C.device_info``), and each test checks what a user of that card meets: a model in
bf16 is refused before anything is allocated, with a message that names the precision,
the card and fp16; ``optimize_config`` offers fp16 in bf16's place; ``gpu-info`` says so.
An Ampere or newer card (8.0+) and the CPU are left alone. The CUDA side of the same
rule (``cuda/backend_cuda.cu``'s bf16 check before a bf16 product) needs a Turing GPU.
"""
from __future__ import annotations

import argparse

import pytest

import pyxtts
import pyxtts.cli
from pyxtts import _C
from pyxtts.config import (DEFAULT_MARGIN, DataConfig, TrainingConfig, XTTSConfig, optimize_config,
                           plan_for)
from pyxtts.model import ModelConfig, precision_problem

PLAN_DEVICE = "cuda:0"  # optimize_config plans for a card in every build (cuda/sizes.c)
# long sequences for its size: activations, which half precision halves, outweigh the
# fp32 master copy it adds, so a 16-bit plan can fit where no fp32 one does
TINY = ModelConfig(n_layers=2, d_model=64, n_heads=4, text_vocab_size=50, audio_vocab_size=40,
                   max_text_tokens=128, max_audio_tokens=256, n_cond_latents=4, conditioning=False)


def card(capability: tuple[int, int], name: str):
    """A device_info that reports every device as this GPU."""
    def info(device="cuda:0"):
        return {"device": str(device), "type": "cuda", "name": name, "total_memory": 11 << 30,
                "free_memory": 10 << 30, "capability": capability, "multiprocessors": 68}
    return info


TURING = card((7, 5), "NVIDIA GeForce RTX 2080 Ti")
AMPERE = card((8, 6), "NVIDIA GeForce RTX 3090")


def test_bf16_is_refused_on_turing_with_the_way_out(monkeypatch):
    monkeypatch.setattr(_C, "device_info", TURING)
    why = precision_problem("bf16", "cuda:0")
    for part in ("precision='bf16'", "cuda:0", "RTX 2080 Ti", "7.5", "8.0", "precision='fp16'"):
        assert part in why, why
    assert precision_problem("fp16", "cuda:0") is None
    assert precision_problem("fp32", "cuda:0") is None


def test_bf16_runs_on_ampere_and_on_the_cpu(monkeypatch):
    assert precision_problem("bf16", "cpu") is None  # the real device_info: the CPU
    assert precision_problem("bf16", "cuda:7") is None  # not in this machine: the engine decides
    monkeypatch.setattr(_C, "device_info", AMPERE)
    assert precision_problem("bf16", "cuda:0") is None


def test_a_bf16_model_on_turing_is_refused_before_it_is_built(monkeypatch):
    monkeypatch.setattr(_C, "device_info", TURING)
    built = []
    monkeypatch.setattr(_C, "GPT", lambda *a, **k: built.append(1))
    with pytest.raises(ValueError, match=r"precision='bf16'.*7\.5.*precision='fp16'"):
        pyxtts.XTTSGPT(TINY, device="cuda:0", precision="bf16")
    assert not built


def config(precision: str) -> XTTSConfig:
    return XTTSConfig(model=TINY, training=TrainingConfig(precision=precision, device=PLAN_DEVICE),
                      data=DataConfig(batch_size=8, max_text_tokens=128, max_audio_tokens=256))


def test_optimize_config_offers_fp16_in_bf16s_place_on_turing(monkeypatch):
    monkeypatch.setattr(_C, "device_info", TURING)
    new, why = optimize_config(config("bf16"), "2GiB", device=PLAN_DEVICE)
    assert new.training.precision in ("fp16", "fp32"), why
    assert "no bfloat16" in why, why
    # from fp32, with too little memory for any fp32 plan: the half precision is fp16
    fp32 = config("fp32")
    smallest = {p: plan_for(fp32, PLAN_DEVICE, micro_batch=1, checkpointing="full", precision=p,
                            offload=False).total for p in ("fp32", "fp16")}
    assert smallest["fp16"] < smallest["fp32"]
    # the plan limit is total x max_memory_fraction x (1 - margin): just under fp32's smallest
    total = int((smallest["fp32"] - 1) / (fp32.training.max_memory_fraction * (1 - DEFAULT_MARGIN)))
    new, why = optimize_config(fp32, total, device=PLAN_DEVICE)
    assert new.training.precision == "fp16", why
    with pytest.raises(ValueError, match=r"keep_precision=True, but precision='bf16'"):
        optimize_config(config("bf16"), "2GiB", device=PLAN_DEVICE, keep_precision=True)


def test_optimize_config_keeps_bf16_on_ampere(monkeypatch):
    monkeypatch.setattr(_C, "device_info", AMPERE)
    new, why = optimize_config(config("bf16"), "2GiB", device=PLAN_DEVICE)
    assert new.training.precision == "bf16", why


def test_gpu_info_says_a_turing_card_has_no_bf16(monkeypatch, capsys):
    monkeypatch.setattr(_C, "device_info", TURING)
    monkeypatch.setattr(pyxtts, "device_info", lambda d: TURING(d) if d != "cpu" else _cpu_info())
    monkeypatch.setattr(pyxtts, "device_count", lambda: 1)
    assert pyxtts.cli._gpu_info(argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    assert "compute capability 7.5 (no bfloat16: train with precision fp16)" in out, out


_REAL_DEVICE_INFO = _C.device_info


def _cpu_info():
    return _REAL_DEVICE_INFO("cpu")

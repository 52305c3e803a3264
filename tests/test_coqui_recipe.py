"""Coqui's XTTS fine-tuning recipe as pyxtts's default: the weight-decay set against the
param groups Coqui's GPTTrainer builds, AdamW's per-tensor decay against
torch.optim.AdamW, the recipe's numbers, and a Trainer that starts from imported weights."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import pyxtts
from coqui import require_coqui
from fixtures_xtts import SMALL_ARGS
from pyxtts.config import TrainingConfig, XTTSConfig
from pyxtts.coqui_config import coqui_decay
from pyxtts.trainer import optimizer_from_config

torch = pytest.importorskip("torch", reason="torch.optim.AdamW is the reference (pip install torch)")


def coqui_decayed(gpt) -> list[str]:
    """The names GPTTrainer.get_optimizer puts in its weight-decay group (Coqui's code,
    run on this GPT with the recipe's optimizer settings)."""
    c = require_coqui()
    config = SimpleNamespace(optimizer_wd_only_on_weights=True, optimizer="AdamW", lr=5e-6,
                             optimizer_params={"betas": [0.9, 0.96], "eps": 1e-8, "weight_decay": 1e-2})
    opt = c.GPTTrainer.get_optimizer(SimpleNamespace(xtts=SimpleNamespace(gpt=gpt), config=config))
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-2, 0]
    return list(opt._group_names[0])


@pytest.mark.parametrize("perceiver", [True, False])
def test_decay_set_is_coquis(perceiver):
    from test_coqui_gpt import coqui_gpt

    gpt = coqui_gpt({**SMALL_ARGS, "gpt_use_perceiver_resampler": perceiver}, device="meta")
    names = [k for k, _ in gpt.named_parameters()]
    want = coqui_decayed(gpt)
    assert sorted(coqui_decay(names)) == sorted(want)
    # what that means, spelled out: no embeddings, norms or biases; the GPT-2 Conv1D
    # weights, the heads, the conditioning convs and the perceiver's latents and gamma are in
    assert not any("embedding" in k or ".ln_" in k or "norm.weight" in k or k.endswith(".bias") for k in want)
    assert "gpt.h.0.attn.c_attn.weight" in want and "mel_head.weight" in want
    if perceiver:
        assert {"conditioning_perceiver.latents", "conditioning_perceiver.norm.gamma"} <= set(want)
    # the pyxtts model's share of it is what its optimizer decays by default
    cfg = pyxtts.ModelConfig.from_xtts_config({"model_args": {**SMALL_ARGS, "gpt_use_perceiver_resampler": perceiver}})
    model = pyxtts.XTTSGPT(cfg)
    opt = optimizer_from_config(model, TrainingConfig())
    assert sorted(opt.decay) == sorted(k for k in want if k in model.parameters())
    # c_attn, c_proj, c_fc, mlp c_proj per layer; 2 heads; with the conditioning path its 25: the
    # init conv, 6 x (qkv, proj_out), the latents, 2 x (to_q, to_kv, to_out, 2 linears), gamma
    assert len(opt.decay) == 4 * cfg.n_layers + 2 + (25 if cfg.conditioning else 0)
    matrices = optimizer_from_config(model, TrainingConfig(weight_decay_on="matrices"))
    assert sorted(matrices.decay) == sorted(k for k, v in model.parameters().items() if len(v.shape) >= 2)


def test_adamw_decays_only_the_named_tensors_as_torch_does(rng, seed):
    """pyxtts.AdamW(decay=names) against torch.optim.AdamW with a decay and a no-decay
    group, 6 steps of random gradients; decay and learning rate large, so a tensor decayed
    by mistake moves far from torch's (fp32 both sides: 1e-6 relative)."""
    cfg = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=37, audio_vocab_size=29,
                             max_text_tokens=8, max_audio_tokens=8, n_cond_latents=0, conditioning=False)
    model = pyxtts.XTTSGPT(cfg, seed=seed % 1000)
    decay = coqui_decay(model.parameters())
    lr, wd = 1e-2, 0.5
    opt = pyxtts.AdamW(model, lr=lr, betas=(0.9, 0.96), eps=1e-8, weight_decay=wd, grad_clip=None, decay=decay)
    ref = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in model.state_dict().items()}
    groups = [{"params": [ref[k] for k in decay], "weight_decay": wd},
              {"params": [p for k, p in ref.items() if k not in decay], "weight_decay": 0.0}]
    topt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.96), eps=1e-8)
    every = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone()) for p in ref.values()], lr=lr,
                              betas=(0.9, 0.96), eps=1e-8, weight_decay=wd)
    for _ in range(6):
        grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in ref.items()}
        for k, g in model.gradients().items():
            g.copy_(grads[k])
        opt.step()
        for k, p in ref.items():
            p.grad = torch.from_numpy(grads[k])
        for p, k in zip(every.param_groups[0]["params"], ref):
            p.grad = torch.from_numpy(grads[k])
        topt.step()
        every.step()
    got = model.state_dict()
    for k, p in ref.items():
        np.testing.assert_allclose(got[k], p.detach().numpy(), rtol=1e-6, atol=1e-6, err_msg=f"{k} (seed {seed})")
    wrong = dict(zip(ref, every.param_groups[0]["params"]))
    assert not np.allclose(got["text_embedding.weight"], wrong["text_embedding.weight"].detach().numpy(),
                           rtol=1e-4, atol=1e-4), "the control: decaying the embeddings would show"


def test_defaults_are_the_recipe():
    # recipes/ljspeech/xtts_v2/train_gpt_xtts.py (coqui-tts): AdamW, betas [0.9, 0.96], eps 1e-8,
    # weight_decay 1e-2, optimizer_wd_only_on_weights=True, lr 5e-06, MultiStepLR milestones
    # [50000 * 18, 150000 * 18, 300000 * 18], gamma 0.5; no grad_clip (the trainer's default, 0)
    t = TrainingConfig()
    assert (t.learning_rate, t.betas, t.eps, t.weight_decay, t.weight_decay_on, t.grad_clip) == \
        (5e-6, (0.9, 0.96), 1e-8, 1e-2, "weights", None)
    assert (t.lr_schedule, t.lr_milestones, t.lr_gamma) == ("multistep", [900_000, 2_700_000, 5_400_000], 0.5)
    for tier in ("standard", "memory_optimized", "extreme_memory_optimized"):
        tt = XTTSConfig.load(tier).training
        assert (tt.learning_rate, tt.betas, tt.eps, tt.weight_decay, tt.weight_decay_on, tt.grad_clip) == \
            (5e-6, (0.9, 0.96), 1e-8, 1e-2, "weights", None), tier
    with pytest.raises(ValueError, match=r"training.weight_decay_on: must be one of weights, matrices, got 'all'"):
        TrainingConfig(weight_decay_on="all")


def test_the_recipes_intervals_are_counted_in_optimizer_steps():
    """The recipe's save_step=10000 and print_step=50 count the steps of Coqui's trainer,
    which are batches (trainer.Trainer.train_step counts each; GRAD_ACUMM_STEPS=84 of them
    make an optimizer step); pyxtts's intervals count optimizer steps. xtts_v2_finetune.yaml
    used to take 10000 as is: a checkpoint every 2.5 million samples instead of 30,000, none
    at all in a fine-tune of an hour of speech over the recipe's 1000 epochs."""
    t = XTTSConfig.load("xtts_v2_finetune").training
    save_step, print_step, grad_accum = 10_000, 50, 84
    assert t.checkpoint_interval == round(save_step / grad_accum) == 119
    assert t.log_interval == max(1, round(print_step / grad_accum)) == 1
    assert t.eval_interval == t.checkpoint_interval  # Coqui evaluates each epoch, which no step count is
    for tier in ("gpu_4gb", "gpu_12gb", "large_gpu"):  # the tiers change the micro-batch, not what a step is
        tt = XTTSConfig.load(tier).training
        assert (tt.checkpoint_interval, tt.eval_interval, tt.log_interval) == (119, 119, 1), tier


def test_coquis_trainer_clips_nothing_by_default():
    c = require_coqui()
    assert c.GPTTrainerConfig().grad_clip == 0.0  # and the recipe sets none


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trainer_starts_from_init_checkpoint(tmp_path, rng, precision):
    cfg = pyxtts.ModelConfig(n_layers=2, d_model=32, n_heads=4, text_vocab_size=300, audio_vocab_size=1026,
                             max_text_tokens=24, max_audio_tokens=40, n_cond_latents=0, conditioning=False, start_text_token=261,
                             stop_text_token=0, start_audio_token=1024, stop_audio_token=1025)
    source = pyxtts.XTTSGPT(cfg, seed=int(rng.integers(1 << 30)))
    pyxtts.save_checkpoint(tmp_path / "init.safetensors", source)
    config = XTTSConfig.from_dict({
        "model": dataclasses.asdict(cfg),
        "training": {"learning_rate": 1e-12, "lr_schedule": "constant", "max_steps": 1, "epochs": None,
                     "precision": precision, "checkpoint_dir": str(tmp_path / "ckpt"), "device": "cpu",
                     "enable_memory_cleanup": False, "max_memory_fraction": 1.0,
                     "init_checkpoint": str(tmp_path / "init.safetensors")},
        "data": {"batch_size": 2, "num_workers": 0}})
    tr = pyxtts.Trainer(config, progress=False)
    want = {k: v.astype(tr.model.dtype.numpy) for k, v in source.state_dict().items()}
    for k, v in tr.model.state_dict().items():
        assert v.tobytes() == want[k].tobytes(), k
    tr.fit(pyxtts.SyntheticDataset(cfg, 4, seed=1))
    # a 1e-12 step moves nothing at this precision: the optimizer started from these weights
    # (a master copy taken before loading would have put the random initialisation back)
    for k, v in tr.model.state_dict().items():
        np.testing.assert_allclose(v.astype(np.float32), want[k].astype(np.float32), rtol=1e-6, atol=1e-9,
                                   err_msg=k)

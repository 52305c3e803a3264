"""Continuing a run of Coqui's GPTTrainer (``pyxtts train --init RUN/checkpoint_N.pth
--continue``, ``pyxtts.continue_xtts_run``), against Coqui itself: its own ``Trainer`` fits
``GPTTrainer`` (the recipe's AdamW and param groups) for a few accumulated steps on
espeak-ng speech and a small XTTS v2 folder, and writes ``checkpoint_N.pth``. The continued
pyxtts run holds Coqui's moments element for element, its step and rate, and takes the
next update torch's AdamW takes from the same gradients; what cannot map exactly is
refused with nothing written."""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import random
import warnings
from pathlib import Path

import numpy as np
import pytest

import pyxtts
import pyxtts.cli
from pyxtts.checkpoint import CheckpointError, flat_offsets, load_checkpoint
from pyxtts.coqui_checkpoint import read_xtts_checkpoint
from pyxtts.trainer import model_from_config, optimizer_from_config

fx = pytest.importorskip("fixtures_prepare")
from helpers import SEED, random_batch  # noqa: E402

pytestmark = [pytest.mark.usefixtures("no_limit_no_fault"),
              pytest.mark.skipif(fx.ESPEAK is None, reason="espeak-ng is not installed")]

# the run's GPT: XTTS v2's layout (perceiver, masking), narrow; the tiny data's text ids
GPT = {"gpt_layers": 2, "gpt_n_model_channels": 64, "gpt_n_heads": 4, "gpt_number_text_tokens": 600,
       "gpt_num_audio_tokens": 66, "gpt_start_audio_token": 64, "gpt_stop_audio_token": 65,
       "gpt_max_text_tokens": 80, "gpt_max_audio_tokens": 200, "gpt_max_prompt_tokens": 70,
       "gpt_code_stride_len": 1024, "gpt_use_perceiver_resampler": True,
       "gpt_use_masking_gt_prompt_approach": True, "decoder_input_dim": 64}
BATCHES = 6  # 2 epochs of 3 batches of 2 samples, accumulated 2 by 2 (an epoch's last batch steps alone)
CHECKPOINT = 4  # save_step: Coqui's checkpoint_4.pth, saved after its 5th batch


@dataclasses.dataclass
class CoquiRun:
    folder: Path  # the run's folder: checkpoint_4.pth, best_model.pth, config.json
    xtts_dir: Path  # the XTTS folder it fine-tuned
    trainer: object  # Coqui's Trainer, after fit


@pytest.fixture(scope="module")
def coqui_run(tmp_path_factory) -> CoquiRun:
    """Coqui's own Trainer fits GPTTrainer as the recipe sets it up (AdamW, betas (0.9, 0.96),
    eps 1e-8, weight decay 1e-2 on the weights only, MultiStepLR), with gradient accumulation."""
    from coqui import require_coqui
    from fixtures_xtts import _legacy_class_paths, randomize, xtts_config

    c = require_coqui()
    from trainer import Trainer, TrainerArgs
    from TTS.tts.models.xtts import XttsAudioConfig

    root = tmp_path_factory.mktemp("coqui-run")
    fx.make_ljspeech(root / "lj", fx.SENTENCES_EN[:6])
    wavs = sorted((root / "lj" / "wavs").glob("*.wav"))
    xtts_dir = root / "XTTS"
    xtts_dir.mkdir()
    cfg = xtts_config(**GPT, gpt_start_text_token=None, gpt_stop_text_token=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = c.Xtts.init_from_config(cfg)
    randomize(model, 11)
    with _legacy_class_paths():
        c.torch.save({"config": cfg, "model": model.state_dict()}, xtts_dir / "model.pth")
    (xtts_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2), encoding="utf-8")
    # GPTTrainer builds its DVAE at XTTS v2's width: 64 codes, 512 channels
    fx.write_assets(xtts_dir, wavs, 11, fx.training_texts(),
                    dvae={"hidden": 512, "codebook_dim": 512, "num_tokens": 64})
    args = c.GPTArgs(**GPT, mel_norm_file=str(xtts_dir / "mel_stats.pth"), dvae_checkpoint=str(xtts_dir / "dvae.pth"),
                     xtts_checkpoint=str(xtts_dir / "model.pth"), tokenizer_file=str(xtts_dir / "vocab.json"))
    config = c.GPTTrainerConfig(
        output_path=str(root / "run"), model_args=args, run_name="GPT_XTTS", project_name="p",
        dashboard_logger="tensorboard", audio=XttsAudioConfig(sample_rate=22050, dvae_sample_rate=22050,
                                                              output_sample_rate=24000),
        batch_size=2, eval_batch_size=2, num_loader_workers=0, print_step=100, plot_step=100, log_model_step=100,
        save_step=CHECKPOINT, save_n_checkpoints=1, print_eval=False, run_eval=False, test_sentences=[], epochs=2,
        optimizer="AdamW", optimizer_wd_only_on_weights=True,
        optimizer_params={"betas": [0.9, 0.96], "eps": 1e-8, "weight_decay": 1e-2}, lr=5e-6,
        lr_scheduler="MultiStepLR", lr_scheduler_params={"milestones": [900000, 2700000, 5400000], "gamma": 0.5,
                                                         "last_epoch": -1})
    samples = [{"text": line.split("|")[2], "audio_file": str(root / "lj" / "wavs" / f"{line.split('|')[0]}.wav"),
                "speaker_name": "lj", "root_path": str(root / "lj"), "language": "en",
                "audio_unique_name": line.split("|")[0]}
               for line in (root / "lj" / "metadata.csv").read_text(encoding="utf-8").splitlines()]
    load = c.xtts_dataset.load_audio
    c.xtts_dataset.load_audio = lambda path, sr: fx._coqui_wav(c, path)[None, :]  # torchaudio's loading is not needed
    # what Coqui's Trainer sets for the whole process (seeds, environment, its log file), put back after
    env = {k: os.environ.get(k) for k in ("CUDA_DEVICE_ORDER", "PYTHONHASHSEED")}
    rngs = random.getstate(), np.random.get_state(), c.torch.get_rng_state()
    handlers = list(logging.getLogger("trainer").handlers)
    try:
        gpt_trainer = c.GPTTrainer(config)
        trainer = Trainer(TrainerArgs(grad_accum_steps=2), config, output_path=str(root / "run"), model=gpt_trainer,
                          train_samples=samples, eval_samples=samples[:2])
        trainer.fit()
    finally:
        c.xtts_dataset.load_audio = load
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        random.setstate(rngs[0])
        np.random.set_state(rngs[1])
        c.torch.set_rng_state(rngs[2])
        for handler in [h for h in logging.getLogger("trainer").handlers if h not in handlers]:
            logging.getLogger("trainer").removeHandler(handler)
            handler.close()
    (folder,) = (root / "run").glob("GPT_XTTS-*")
    return CoquiRun(folder, xtts_dir, trainer)


def continue_config(run: CoquiRun, checkpoint_dir: Path) -> pyxtts.XTTSConfig:
    """The recipe's config on the run's GPT (as `train --init` makes it)."""
    ck = read_xtts_checkpoint(run.folder / f"checkpoint_{CHECKPOINT}.pth")
    ck.file.close()
    config = pyxtts.XTTSConfig.load("xtts_v2_finetune").with_model(ck.config)
    config.training.checkpoint_dir = str(checkpoint_dir)
    config.training.device = "cpu"
    return config


def coqui_file(run: CoquiRun, name: str = f"checkpoint_{CHECKPOINT}.pth") -> dict:
    from coqui import require_coqui

    return require_coqui().torch.load(run.folder / name, map_location="cpu", weights_only=False)


def group_names(run: CoquiRun) -> list[str]:
    """The GPT's names in the order of the param groups' indices, as Coqui's own optimizer
    records them (GPTTrainer.get_optimizer's ``_group_names``)."""
    opt = run.trainer.optimizer[0]
    return [n for names in opt._group_names for n in names]


def test_the_continued_state_is_coquis_element_for_element(coqui_run, tmp_path):
    """Coqui's checkpoint_4.pth: 5 batches, 3 optimizer updates (an epoch's last batch steps
    alone). The continued checkpoint is step 3 with every tensor's exp_avg and exp_avg_sq in
    the flat m and v, bit for bit, the master Coqui's float32 weights, the rate 5e-6."""
    config = continue_config(coqui_run, tmp_path / "ck")
    info = pyxtts.continue_xtts_run(coqui_run.folder / f"checkpoint_{CHECKPOINT}.pth", config)
    ck = coqui_file(coqui_run)
    state = ck["optimizer"][0]["state"]
    assert ck["step"] == CHECKPOINT and ck["epoch"] == 1
    # the recipe's MultiStepLR (scheduler_after_epoch) never steps: after two epochs it is where it began
    assert ck["scheduler"][0]["last_epoch"] == 0 and coqui_run.trainer.scheduler[0].last_epoch == 0
    assert coqui_run.trainer.total_steps_done == BATCHES  # both epochs ran
    assert {float(s["step"]) for s in state.values()} == {3.0}
    assert info == {"path": str(tmp_path / "ck" / "step_00000003.safetensors"), "step": 3, "lr": 5e-6,
                    "coqui_step": CHECKPOINT, "coqui_epoch": 1}
    model = model_from_config(config, "cpu")
    opt = optimizer_from_config(model, config.training)
    meta = load_checkpoint(info["path"], model, opt)
    assert meta["step"] == 3 and meta["extra"]["coqui"]["step"] == CHECKPOINT
    sd = opt.state_dict()
    assert sd["step"] == 3 and sd["lr"] == 5e-6 and sd["betas"] == (0.9, 0.96) and sd["eps"] == 1e-8
    params = model.parameters()
    offsets = flat_offsets(params)
    names = group_names(coqui_run)
    assert sorted(names) == sorted(params) and len(names) == len(state) == 90
    for i, name in enumerate(names):
        lo, n = offsets[name], params[name].numel()
        for ours, theirs in (("m", "exp_avg"), ("v", "exp_avg_sq")):
            want = state[i][theirs].numpy().reshape(-1)
            assert np.array_equal(sd[ours][lo:lo + n], want), (name, theirs)
        weights = ck["model"]["xtts.gpt." + name].numpy().reshape(-1)
        assert np.array_equal(sd["master"][lo:lo + n], weights), name
        assert np.abs(state[i]["exp_avg"].numpy()).max() > 0, name  # every tensor had gradients
    assert not np.any(sd["m"][np.setdiff1d(np.arange(sd["m"].size), np.concatenate(
        [np.arange(offsets[k], offsets[k] + params[k].numel()) for k in params]))])  # the padding stays zero


def test_the_next_update_is_torchs(coqui_run, tmp_path, rng):
    """From the continued state and the gradients of one pyxtts batch (conditioning mels
    included, so all 90 tensors have one), pyxtts's step and torch's AdamW restored from the
    same checkpoint (as Coqui's --continue_path restores it) give the same weights and
    moments to 1e-6 of each tensor's largest value. The operations are the same, in the
    same order, in float32; torch's vectorised CPU kernels fuse lerp's and addcmul's
    multiply-adds (one rounding where pyxtts rounds the product and the sum), which leaves
    the moments a few ulp apart (1.2e-7 relative at most here). The weights move by about
    lr = 5e-6 against values near 0.05, so 1e-6 of their largest value is 1% of the update:
    a wrong step count or moment shows."""
    from coqui import require_coqui

    torch = require_coqui().torch
    config = continue_config(coqui_run, tmp_path / "ck")
    info = pyxtts.continue_xtts_run(coqui_run.folder / f"checkpoint_{CHECKPOINT}.pth", config)
    model = model_from_config(config, "cpu")
    opt = optimizer_from_config(model, config.training)
    load_checkpoint(info["path"], model, opt)
    batch = random_batch(rng, config.model, 2, 8, 12, n_cond=0)
    batch["cond_mels"] = rng.standard_normal((2, 80, 64)).astype(np.float32)
    model.zero_grad()
    model.forward_backward(batch)
    grads = {k: g.numpy().copy() for k, g in model.gradients().items()}
    # Coqui's side: its model and optimizer as restore_model leaves them for --continue_path
    ck = coqui_file(coqui_run)
    trainer = coqui_run.trainer
    trainer.model.load_state_dict(ck["model"])
    topt = trainer.optimizer[0]
    topt.load_state_dict(ck["optimizer"][0])
    gpt = dict(trainer.model.xtts.gpt.named_parameters())
    for name, p in gpt.items():
        p.grad = torch.from_numpy(grads[name].reshape(tuple(p.shape)))
    topt.step()
    r = opt.step()
    assert r["skipped"] is False and r["lr"] == 5e-6 and opt.state_dict()["step"] == 4
    sd = opt.state_dict()
    params = model.parameters()
    offsets = flat_offsets(params)
    for name, p in gpt.items():
        lo, n = offsets[name], p.numel()
        ts = topt.state[p]
        assert float(ts["step"]) == 4.0
        for got, want in ((params[name].numpy().reshape(-1), p.detach().numpy().reshape(-1)),
                          (sd["m"][lo:lo + n], ts["exp_avg"].numpy().reshape(-1)),
                          (sd["v"][lo:lo + n], ts["exp_avg_sq"].numpy().reshape(-1))):
            assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max(), name
        moved = np.abs(p.detach().numpy().reshape(-1) - ck["model"]["xtts.gpt." + name].numpy().reshape(-1))
        assert moved.max() > 0, name  # the update is there to compare


def test_the_cli_continues_the_coqui_run(coqui_run, tmp_path, capsys):
    """`pyxtts train --init RUN/checkpoint_4.pth --continue` goes on at Coqui's optimizer
    step 3: its first step is step 4 at the run's rate, and --resume then goes on from
    pyxtts's own checkpoints."""
    yaml_path = tmp_path / "cont.yaml"
    yaml_path.write_text("base: xtts_v2_finetune\ntraining:\n  gradient_accumulation_steps: 1\n  max_steps: 5\n"
                         "  epochs: null\n  device: cpu\n  checkpoint_interval: 5\n  eval_interval: 1000\n"
                         "  enable_memory_cleanup: false\ndata:\n  batch_size: 2\n  num_workers: 1\n",
                         encoding="utf-8")
    ck_dir = tmp_path / "ck"
    argv = ["train", "--config", str(yaml_path), "--init", str(coqui_run.folder / f"checkpoint_{CHECKPOINT}.pth"),
            "--synthetic", "8", "--checkpoint-dir", str(ck_dir), "--no-progress"]
    assert pyxtts.cli.main([*argv, "--continue"]) == 0
    out, err = capsys.readouterr()
    assert ("--continue: the Coqui run goes on at its optimizer step 3 (Coqui's step 4 counts batches; epoch 1) "
            "with its AdamW moments and lr 5e-06") in err
    assert "trained 2 steps, 4-5, after resuming at step 3 (max_steps)" in out
    records = [json.loads(line) for line in (ck_dir / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("type") == "train"]
    assert [r["step"] for r in steps] == [4, 5] and all(r["lr"] == 5e-6 for r in steps)
    assert sorted(p.name for p in ck_dir.glob("step_*")) == ["step_00000003.safetensors", "step_00000005.safetensors"]
    # a second --continue into the same folder is refused: --resume goes on from here
    assert pyxtts.cli.main([*argv, "--continue"]) == 2
    assert "--resume continues that run" in capsys.readouterr().err


def test_a_bf16_run_keeps_coquis_float32_weights_as_its_master(coqui_run, tmp_path):
    """A run continued in bf16 has bf16 parameters, and Coqui's float32 weights, not their
    rounding, as the master its updates apply to."""
    config = continue_config(coqui_run, tmp_path / "ck")
    config.training.precision = "bf16"
    info = pyxtts.continue_xtts_run(coqui_run.folder / f"checkpoint_{CHECKPOINT}.pth", config)
    model = model_from_config(config, "cpu")
    opt = optimizer_from_config(model, config.training)
    load_checkpoint(info["path"], model, opt)
    ck = coqui_file(coqui_run)
    sd = opt.state_dict()
    params = model.parameters()
    for name, lo in flat_offsets(params).items():
        weights = ck["model"]["xtts.gpt." + name].numpy()
        assert np.array_equal(sd["master"][lo:lo + weights.size], weights.reshape(-1)), name
        assert params[name].dtype == pyxtts.bfloat16, name
    assert sd["step"] == 3


@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_a_run_with_one_param_group(coqui_run, tmp_path, weight_decay):
    """Without optimizer_wd_only_on_weights, GPTTrainer's AdamW has one param group over
    xtts.gpt.parameters() in their order, every tensor decayed alike. Its moments map by
    that order; a decay on the biases and norms pyxtts cannot give is refused."""
    from coqui import require_coqui

    c = require_coqui()
    torch = c.torch
    model = coqui_run.trainer.model
    config = copy.deepcopy(model.config)
    config.optimizer_wd_only_on_weights = False
    config.optimizer_params = {"betas": [0.9, 0.96], "eps": 1e-8, "weight_decay": weight_decay}
    own, model.config = model.config, config
    try:
        opt = model.get_optimizer()  # GPTTrainer's own
    finally:
        model.config = own
    assert len(opt.param_groups) == 1
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(2):
        for p in model.xtts.gpt.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    folder = tmp_path / "one-group"
    folder.mkdir()
    c.trainer_save_checkpoint(config, model, str(folder), current_step=8, epoch=0, optimizer=[opt])
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2), encoding="utf-8")
    ours = continue_config(coqui_run, tmp_path / "ck")
    ours.training.weight_decay = weight_decay
    if weight_decay:
        with pytest.raises(CheckpointError, match=r"^training\.weight_decay: the Coqui run decays \S+ by 0\.01 "
                                                  r"\(optimizer_wd_only_on_weights: False\), the config by 0\.0"):
            pyxtts.continue_xtts_run(folder / "checkpoint_8.pth", ours)
        assert not (tmp_path / "ck").exists()
        return
    info = pyxtts.continue_xtts_run(folder / "checkpoint_8.pth", ours)
    assert info["step"] == 2 and info["coqui_step"] == 8
    pmodel = model_from_config(ours, "cpu")
    popt = optimizer_from_config(pmodel, ours.training)
    load_checkpoint(info["path"], pmodel, popt)
    sd = popt.state_dict()
    params = pmodel.parameters()
    offsets = flat_offsets(params)
    for name, p in model.xtts.gpt.named_parameters():
        lo, n = offsets[name], p.numel()
        assert np.array_equal(sd["m"][lo:lo + n], opt.state[p]["exp_avg"].numpy().reshape(-1)), name
        assert np.array_equal(sd["v"][lo:lo + n], opt.state[p]["exp_avg_sq"].numpy().reshape(-1)), name


def rewritten(run: CoquiRun, tmp_path: Path, edit) -> Path:
    """A copy of the run's checkpoint_4.pth (and config.json) changed by ``edit(ck)``."""
    from coqui import require_coqui

    folder = tmp_path / "edited"
    folder.mkdir()
    (folder / "config.json").write_bytes((run.folder / "config.json").read_bytes())
    ck = coqui_file(run)
    edit(ck)
    require_coqui().torch.save(ck, folder / f"checkpoint_{CHECKPOINT}.pth")
    return folder / f"checkpoint_{CHECKPOINT}.pth"


def _drop_state(ck):
    del ck["optimizer"][0]["state"][5]


def _other_steps(ck):
    ck["optimizer"][0]["state"][5]["step"] += 1


def _adam(ck):
    ck["config"]["optimizer"] = "Adam"


def _amsgrad(ck):
    ck["optimizer"][0]["param_groups"][1]["amsgrad"] = True


def _one_group_short(ck):
    ck["optimizer"][0]["param_groups"][1]["params"].pop()


def _groups_swapped(ck):
    groups = ck["optimizer"][0]["param_groups"]
    groups[0]["params"], groups[1]["params"] = groups[1]["params"], groups[0]["params"]


def _states_swapped(ck):
    state = ck["optimizer"][0]["state"]
    state[0], state[89] = state[89], state[0]


def _no_optimizer(ck):
    ck["optimizer"] = None


def _fp16_moments(ck):
    s = ck["optimizer"][0]["state"][0]
    s["exp_avg"] = s["exp_avg"].half()


def _moments_swapped(ck):
    s = ck["optimizer"][0]["state"][0]
    s["exp_avg"], s["exp_avg_sq"] = s["exp_avg_sq"], s["exp_avg"]


def _grad_clip(ck):
    ck["config"]["grad_clip"] = 1.0


def _lr(ck):
    for g in ck["optimizer"][0]["param_groups"]:
        g["lr"] = 2.5e-6


@pytest.mark.parametrize("edit, message", [
    (_no_optimizer, r"holds no optimizer state .*--init alone starts from its weights with a fresh AdamW"),
    (_drop_state, r"tensor 5 of the param groups \(xtts\.gpt\..+\) has no optimizer state: it never had a gradient"),
    (_other_steps, r"its tensors have had different numbers of updates \(3, 4; xtts\.gpt\..+: 3\)"),
    (_adam, r"its run trained with the optimizer 'Adam' .*pyxtts continues torch\.optim\.AdamW runs only"),
    (_amsgrad, r"param group 1 has \{'amsgrad': True, 'maximize': False, 'decoupled_weight_decay': True\}"),
    (_one_group_short, r"its param groups hold 35\+54 = 89 tensors, the GPT 90"),
    (_groups_swapped, r"^training\.weight_decay: the Coqui run decays \S+ by 0\.01 \(optimizer_wd_only_on_weights: "
                      r"True\), the config by 0\.0"),
    (_states_swapped, r"the exp_avg of tensor 0 has shape \(\d+, \d+\), xtts\.gpt\.\S+ \(\d+, \d+(, 1)?\): the param "
                      r"groups are not in the order GPTTrainer builds them"),
    (_fp16_moments, r"the exp_avg of xtts\.gpt\..+ is float16; pyxtts's moments are float32"),
    (_moments_swapped, r"its optimizer state: state\['v'\]: the second moments must be >= 0, got -"),
    (_grad_clip, r"^training\.grad_clip: the Coqui run clips at 1\.0 \(its grad_clip 1\.0\), the config at None$"),
    (_lr, r"^training\.learning_rate: the Coqui run's next update \(its step 4\) takes lr 2\.5e-06, the config's "
          r"multistep schedule gives 5e-06"),
])
def test_what_does_not_map_exactly_is_refused_with_nothing_written(coqui_run, tmp_path, edit, message):
    pth = rewritten(coqui_run, tmp_path, edit)
    config = continue_config(coqui_run, tmp_path / "ck")
    with pytest.raises(CheckpointError, match=message):
        pyxtts.continue_xtts_run(pth, config)
    assert not (tmp_path / "ck").exists()


def test_a_config_that_is_not_the_runs_is_refused(coqui_run, tmp_path):
    pth = coqui_run.folder / f"checkpoint_{CHECKPOINT}.pth"
    config = continue_config(coqui_run, tmp_path / "ck")
    config.training.betas = [0.9, 0.999]
    with pytest.raises(CheckpointError, match=r"^training\.betas: the Coqui run's AdamW has \[0\.9, 0\.96\], the "
                                              r"config \[0\.9, 0\.999\]"):
        pyxtts.continue_xtts_run(pth, config)
    config = continue_config(coqui_run, tmp_path / "ck")
    config.training.weight_decay_on = "matrices"  # the embeddings decay too
    with pytest.raises(CheckpointError, match=r"^training\.weight_decay: the Coqui run decays \S+ by 0\.0 "
                                              r"\(optimizer_wd_only_on_weights: True\), the config by 0\.01"):
        pyxtts.continue_xtts_run(pth, config)
    config = continue_config(coqui_run, tmp_path / "ck")
    config = config.with_model(dataclasses.replace(config.model, text_vocab_size=640))  # a new language's rows
    with pytest.raises(CheckpointError, match=r"the config's model has 640 text rows, the Coqui run 600: the rows "
                                              r"grown for a new vocabulary have no moments"):
        pyxtts.continue_xtts_run(pth, config)
    with pytest.raises(CheckpointError, match=r"holds no optimizer state \(a released model\.pth"):
        pyxtts.continue_xtts_run(coqui_run.xtts_dir / "model.pth", continue_config(coqui_run, tmp_path / "ck"))
    with pytest.raises(TypeError, match=r"^config: expected an XTTSConfig, got dict$"):
        pyxtts.continue_xtts_run(pth, {})
    assert not (tmp_path / "ck").exists()


def test_the_cli_refuses_continue_without_a_coqui_run(coqui_run, tmp_path, capsys):
    pth = str(coqui_run.folder / f"checkpoint_{CHECKPOINT}.pth")
    ck_dir = tmp_path / "ck"
    base = ["train", "--synthetic", "8", "--checkpoint-dir", str(ck_dir), "--no-progress"]
    for extra, said in ((["--continue"], "--continue: continues the Coqui run whose checkpoint --init names"),
                        (["--init", pth, "--continue", "--resume"], "--continue: not with --resume latest"),
                        (["--init", pth, "--continue", "--overwrite"], "--continue: not with --overwrite"),
                        (["--init", str(coqui_run.xtts_dir), "--continue"],
                         f"--continue {coqui_run.xtts_dir}: {coqui_run.xtts_dir / 'model.pth'}: holds no optimizer "
                         "state")):
        assert pyxtts.cli.main([*base, *extra]) == 2
        assert said in capsys.readouterr().err
        assert not ck_dir.exists()
    # the continued checkpoint and the import are taken back when the command fails after them
    assert pyxtts.cli.main(["train", "--data", str(tmp_path / "nowhere"), "--init", pth, "--continue",
                            "--checkpoint-dir", str(ck_dir), "--no-progress"]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert not ck_dir.exists()


def test_a_failed_write_takes_back_the_folders_it_made(coqui_run, tmp_path, monkeypatch):
    """A checkpoint_dir whose parents are missing too: a write that fails (a full disk)
    leaves none of the folders made for it, as export and speak leave none."""
    import pyxtts.coqui_continue

    def full(path, *args, **kwargs):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(pyxtts.coqui_continue, "save_checkpoint", full)
    config = continue_config(coqui_run, tmp_path / "a" / "b" / "ck")
    with pytest.raises(OSError, match="No space left"):
        pyxtts.continue_xtts_run(coqui_run.folder / f"checkpoint_{CHECKPOINT}.pth", config)
    assert not (tmp_path / "a").exists()

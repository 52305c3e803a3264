"""The command line: `pyxtts train` (the demo with no config, a config with data,
resume, refusals) and `pyxtts memtest` (plan vs a real step, verdicts, exit codes)."""
from __future__ import annotations

import json
import os
import re
import shlex
import time

import pytest

import pyxtts
import pyxtts.cli
from conftest import run_python
from pyxtts import SyntheticDataset, XTTSConfig, _C, write_shards
from pyxtts.memory import format_bytes
from pyxtts.memtest import run_memtest

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

SMALL = {"model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "text_vocab_size": 64, "audio_vocab_size": 97,
                   "max_text_tokens": 24, "max_audio_tokens": 48, "n_cond_latents": 0,
                   "conditioning": False},
         "training": {"learning_rate": 3e-3, "lr_schedule": "constant", "max_steps": 6, "epochs": None,
                      "checkpoint_interval": 3, "eval_interval": 3, "device": "cpu"},
         "data": {"batch_size": 4}}


def small_config(tmp_path, **training):
    d = json.loads(json.dumps(SMALL))
    d["training"].update(checkpoint_dir=str(tmp_path / "ckpt"), **training)
    path = tmp_path / "small.yaml"
    XTTSConfig.from_dict(d).save(path)
    return path


def train_log(folder):
    return [json.loads(line) for line in (folder / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_demo_trains_in_under_3_minutes_and_the_loss_falls(tmp_path):
    """`python -m pyxtts` with no arguments: cpu_demo.yaml on the synthetic set."""
    t0 = time.perf_counter()
    r = run_python("import runpy; runpy.run_module('pyxtts', run_name='__main__')", timeout=600,
                   cwd=str(tmp_path))
    wall = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    log = train_log(tmp_path / "checkpoints" / "cpu_demo")
    evals = [x["loss"] for x in log if x["type"] == "eval"]
    steps = [x for x in log if x["type"] == "train"]
    assert len(steps) == 600 and steps[-1]["step"] == 600
    assert evals[-1] < 0.1 * evals[0], evals  # ~7.0 (chance) -> ~0.03 measured
    assert "eval loss" in r.stderr and "trained 600 steps" in r.stdout
    assert (tmp_path / "checkpoints" / "cpu_demo" / "step_00000600.safetensors").exists()
    if not os.environ.get("PYXTTS_SANITIZED"):
        assert wall < 180, f"the demo took {wall:.0f} s"


def test_train_with_a_config_resume_and_refusals(tmp_path, capsys):
    cfg = small_config(tmp_path)
    ck = tmp_path / "ckpt"
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "24", "--no-progress"]) == 0
    assert "trained 6 steps" in capsys.readouterr().out
    assert [x["step"] for x in train_log(ck) if x["type"] == "train"] == list(range(1, 7))
    # a second fresh run would overwrite the first: refused, with the way out named
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "24", "--no-progress"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "24", "--no-progress", "--resume",
                            "--max-steps", "9"]) == 0
    assert "trained 3 steps, 7-9, after resuming at step 6" in capsys.readouterr().out
    assert [x["step"] for x in train_log(ck) if x["type"] == "train"] == list(range(1, 10))
    # no data at all
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--overwrite", "--no-progress"]) == 2
    assert "no training data" in capsys.readouterr().err
    assert pyxtts.cli.main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "8", "--max-steps", "0"]) == 2
    assert "max_steps" in capsys.readouterr().err


def test_train_from_shards(tmp_path, capsys):
    cfg = small_config(tmp_path, max_steps=3)
    model = XTTSConfig.load(cfg).model
    write_shards(SyntheticDataset(model, 20, seed=1).samples, tmp_path / "shards", samples_per_shard=8)
    write_shards(SyntheticDataset(model, 6, seed=2).samples, tmp_path / "eval", samples_per_shard=8)
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--data", str(tmp_path / "shards"),
                            "--eval-data", str(tmp_path / "eval"), "--log", str(tmp_path / "log.jsonl")]) == 0
    out = capsys.readouterr()
    assert "eval loss" in out.out and "step 3: eval loss" in out.err
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log if x["type"] == "eval"] == [0, 3]
    # a sample over the model's maxima: refused before training, nothing truncated
    long = SyntheticDataset(model.__class__(**{**SMALL["model"], "max_text_tokens": 40, "max_audio_tokens": 80}),
                            4, min_text=30)
    write_shards(long.samples, tmp_path / "long")
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--data", str(tmp_path / "long"), "--overwrite"]) == 2
    assert "never truncates" in capsys.readouterr().err


def test_memtest_plan_matches_a_real_step():
    report = run_memtest(XTTSConfig.load("cpu_demo"), batch_size=6, verbose=True)
    assert report.verdict == "fits"
    # the step's one arena is planned to the byte: measured == planned
    assert report.measured_peak == report.plan.total, (report.measured_peak, report.plan.total)
    assert "block   1" in report.text and "real step: peak allocated" in report.text
    assert pyxtts.memory_stats("cpu")["limit_bytes"] is None  # the budget was a temporary limit


def test_memtest_cli_verdicts(capsys):
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo"]) == 0
    out = capsys.readouterr().out
    assert "verdict: FITS" in out and "advice:" in out
    for row in ("parameters", "gradients (fp32)", "optimizer state", "saved activations", "total"):
        assert row in out
    # 20 MiB x max_memory_fraction 0.5 is under the plan: no step, exit 1, advice
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--memory", "20MiB"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "real step: not run" in out and "advice: optimize_config" in out
    # the XTTS v2 GPT planned for a 12 GiB GPU, plan only (no step on this CPU)
    rc = pyxtts.cli.main(["memtest", "--config", "memory_optimized", "--memory", "12GiB", "--no-step",
                          "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and "30 layers x d 1024" in out and "real step" not in out
    # a budget the plan fits but a real step under it does not: the OOM is the verdict
    tight = run_memtest(XTTSConfig.load("cpu_demo"), memory=2 * 40 * 2**20, step=True)
    assert tight.verdict in ("fits", "tight")
    assert pyxtts.cli.main(["memtest", "--config", "nonexistent-tier"]) == 2
    assert "nonexistent-tier" in capsys.readouterr().err
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--batch-size", "0"]) == 2
    assert "--batch-size: " in capsys.readouterr().err  # the flag, as typed


# ---- planning for a card, the host's memory, the advice -----------------------------------

def test_memtest_plans_a_card_this_machine_lacks_when_given_its_memory(capsys):
    rc = pyxtts.cli.main(["memtest", "--config", "gpu_8gb", "--device", "cuda:0", "--memory", "8GiB"])
    out = capsys.readouterr().out
    assert rc == 0 and "verdict: FITS" in out, out
    assert "optimizer state in host memory" in out and "host: optimizer state (offloaded)" in out
    assert "host: the offloaded optimizer state needs 4.94 GiB (page-locked)" in out
    if not pyxtts.cuda_available():  # no step on a card that is not here, and it says why
        assert "real step: not run (cuda:0 is not in this machine: planned for 8.00 GiB)" in out


@pytest.mark.skipif(pyxtts.cuda_available(), reason="needs a machine without the GPU it names")
def test_memtest_for_a_card_elsewhere_does_not_judge_this_machines_memory(capsys, monkeypatch):
    # the offloaded state lives on the machine that trains: a planning machine short of memory
    # (1 GiB available here) is no reason for "DOES NOT FIT"
    info = _C.device_info
    monkeypatch.setattr(_C, "device_info",
                        lambda d: dict(info(d), free_memory=1 << 30) if str(d) == "cpu" else info(d))
    rc = pyxtts.cli.main(["memtest", "--config", "gpu_4gb", "--device", "cuda", "--memory", "4GiB", "--no-step"])
    out = capsys.readouterr().out
    assert rc == 0 and "verdict: FITS" in out and "NOT ENOUGH" not in out, out
    assert ("host: the offloaded optimizer state needs 4.94 GiB (page-locked) on the machine that trains "
            "(cuda is not in this one, so its memory is not checked)") in out, out


@pytest.mark.skipif(pyxtts.cuda_available(), reason="needs a machine without the GPU it names")
def test_memtest_of_a_missing_card_without_its_memory_says_what_to_pass(capsys):
    assert pyxtts.cli.main(["memtest", "--config", "gpu_8gb", "--device", "cuda:0"]) == 2
    err = capsys.readouterr().err
    assert "cuda:0 is not in this machine" in err and "--memory" in err


def test_memtest_advice_names_the_settings_and_the_tier_that_fit(capsys):
    # the 12 GB tier keeps the optimizer's state on the device: at 8 GiB it does not fit, and
    # the advice says what does (the state in host memory among the settings) and which tier
    rc = pyxtts.cli.main(["memtest", "--config", "memory_optimized", "--memory", "8GiB", "--device", "cuda:0",
                          "--no-step"])
    out = capsys.readouterr().out
    assert rc == 1 and "DOES NOT FIT: device memory is short" in out
    assert "training.optimizer_offload true" in out and "--memory 8GiB --device cuda:0" in out
    assert "the shipped tier gpu_8gb" in out and "use a smaller model" not in out


def test_memtest_advice_gives_a_command_that_runs(capsys, tmp_path):
    # the command the advice prints is complete: run as it stands, it writes the config that fits
    rc = pyxtts.cli.main(["memtest", "--config", "gpu_8gb", "--memory", "3.5GiB", "--device", "cuda:0", "--no-step"])
    out = capsys.readouterr().out
    assert rc == 1, out
    command = re.search(r"`pyxtts (optimize-config [^`]*)` writes it", out).group(1)
    assert "--memory 3584MiB" in command and "--config gpu_8gb" in command, command
    args = shlex.split(command.replace("NEW.yaml", str(tmp_path / "new.yaml")))
    assert pyxtts.cli.main(args) == 0, capsys.readouterr()
    capsys.readouterr()
    assert pyxtts.cli.main(["memtest", "--config", str(tmp_path / "new.yaml"), "--memory", "3.5GiB",
                            "--device", "cuda:0", "--no-step"]) == 0, capsys.readouterr().out


def test_memtest_advice_keeps_the_effective_batch(capsys):
    # TIGHT: the smaller micro-batch comes with the accumulation that keeps the effective batch;
    # room to spare with no larger divisor of it: no advice to change the micro-batch
    assert pyxtts.cli.main(["memtest", "--config", "gpu_4gb", "--memory", "4GB", "--device", "cuda:0",
                            "--no-step"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"data\.batch_size (\d+) x gradient_accumulation_steps (\d+) leaves 10% and keeps the "
                  r"effective batch 252", out)
    assert "TIGHT" in out and m and int(m.group(1)) * int(m.group(2)) == 252, out
    assert pyxtts.cli.main(["memtest", "--config", "gpu_16gb", "--memory", "16GiB", "--device", "cuda:0",
                            "--no-step"]) == 0
    out = capsys.readouterr().out
    assert "FITS" in out and "data.batch_size 4 x gradient_accumulation_steps 63" not in out, out
    assert "learning rate adjusted" not in out, out


def test_memtest_advice_for_a_micro_batch_under_test_keeps_the_recipe(capsys):
    """--batch-size 64 on gpu_8gb: the advice once kept 64 x 84 as the effective batch
    ('data.batch_size 3 x gradient_accumulation_steps 1792') and named gpu_8gb, the config
    in use, as the tier that fits."""
    rc = pyxtts.cli.main(["memtest", "--config", "gpu_8gb", "--memory", "8GiB", "--device", "cuda:0",
                          "--batch-size", "64", "--no-step"])
    out = capsys.readouterr().out
    assert rc == 1 and "micro-batch 64" in out
    assert "(effective batch 252 kept)" in out and "1792" not in out, out
    assert "the shipped tier" not in out, out


def test_memtest_on_the_cpu_counts_an_offloaded_state_in_its_memory(capsys):
    """gpu_8gb (optimizer_offload: true) planned for the CPU with 8 GiB: 5.59 GiB on the
    'device' and 4.94 GiB in the host pool, the same RAM, said FITS."""
    rc = pyxtts.cli.main(["memtest", "--config", "gpu_8gb", "--memory", "8GiB", "--device", "cpu", "--no-step"])
    out = capsys.readouterr().out
    assert rc == 1 and "is in cpu's memory too: 10.53 GiB in all" in out, out
    assert "DOES NOT FIT: device memory is short: 10.53 GiB of 7.20 GiB" in out, out


def test_memtest_advice_on_the_cpu_counts_an_offloaded_state_as_the_verdict_does():
    """The micro-batch the advice offers passes memtest's own verdict, which on the CPU counts
    the offloaded state in the budget: at 768 MiB the demo widened to d 512 is TIGHT at
    micro-batch 4 and the advice names a smaller one (it named 4 itself), at 1 GiB the
    largest micro-batch offered fits (it offered 16, 124% of the budget)."""
    cfg = XTTSConfig.load("cpu_demo")
    cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads = 4, 512, 8
    cfg.training.optimizer_offload = True
    tight = run_memtest(cfg, memory="768MiB", step=False)
    micro = int(re.search(r"data.batch_size (\d+) x gradient_accumulation_steps", tight.advice[0]).group(1))
    assert tight.verdict == "tight" and micro < cfg.data.batch_size, tight.advice
    assert run_memtest(cfg, batch_size=micro, memory="768MiB", step=False).verdict == "fits"
    roomy = run_memtest(cfg, memory="1GiB", step=False)
    largest = int(re.search(r"micro-batches up to (\d+) fit", roomy.advice[0]).group(1))
    assert roomy.verdict == "fits" and largest > cfg.data.batch_size, roomy.advice
    assert run_memtest(cfg, batch_size=largest, memory="1GiB", step=False).verdict == "fits"
    assert run_memtest(cfg, batch_size=largest + 1, memory="1GiB", step=False).verdict != "fits"


def test_memtest_says_when_the_state_fits_on_the_card_after_all():
    """gpu_8gb (the state in host memory) on a 16 GiB card: the state fits on the device at
    its micro-batch, which saves the offload's copies every optimizer step; said, and true
    when applied. On a 12 GiB card it does not fit there: not said."""
    tier = XTTSConfig.load("gpu_8gb")
    report = run_memtest(tier, device="cuda:0", memory="16GiB", step=False)
    said = [a for a in report.advice if a.startswith("training.optimizer_offload false also fits")]
    assert report.offload and len(said) == 1, report.advice
    tier.training.optimizer_offload = False
    applied = run_memtest(tier, device="cuda:0", memory="16GiB", step=False)
    assert not applied.offload and applied.verdict == "fits", applied.text
    assert f"({pyxtts.memory.format_bytes(applied.plan.total)} on the device" in said[0]
    tier.training.optimizer_offload = True
    small = run_memtest(tier, device="cuda:0", memory="12GiB", step=False)
    assert small.verdict == "fits" and not any("optimizer_offload false" in a for a in small.advice), small.advice


def test_a_memory_in_decimal_units_says_what_a_card_of_that_size_has(capsys, tmp_path):
    """--memory 8GB is 7.45 GiB, 7% less than an '8 GB' card has: said where the budget is."""
    assert pyxtts.cli.main(["memtest", "--config", "gpu_8gb", "--memory", "8GB", "--device", "cuda:0",
                            "--no-step"]) == 0
    out = capsys.readouterr().out
    assert "7.45 GiB (given; 8GB is decimal (GB = 10^9 bytes): a card sold as 8 GB has 8 GiB, --memory 8GiB)" in out
    assert pyxtts.cli.main(["memtest", "--config", "gpu_8gb", "--memory", "8GiB", "--device", "cuda:0",
                            "--no-step"]) == 0
    assert "decimal" not in capsys.readouterr().out
    assert pyxtts.cli.main(["optimize-config", "--config", "gpu_8gb", "--memory", "12.5GB", "--device", "cuda:0",
                            "--out", str(tmp_path / "o.yaml")]) == 0
    assert "a card sold as 12.5 GB has 12.5 GiB, --memory 12.5GiB" in capsys.readouterr().out


def test_memtest_names_the_host_when_it_is_short(monkeypatch):
    from pyxtts import memtest

    cfg = XTTSConfig.load("cpu_demo")
    cfg.training.optimizer_offload = True  # the state in the host pool, as on a GPU
    real = memtest._C.device_info

    def short_host(device):
        info = dict(real(device))
        if device == "cpu":
            info["free_memory"] = 1 << 20  # 1 MiB available
        return info

    monkeypatch.setattr(memtest._C, "device_info", short_host)
    report = run_memtest(cfg, step=True)
    assert report.verdict == "does not fit" and report.short == "host" and report.offload
    assert report.plan.host_total > report.host_available == 1 << 20
    assert "host memory is short" in report.text and "NOT ENOUGH" in report.text
    assert "real step: not run (the host lacks the memory the optimizer state needs)" in report.text
    assert any("training.optimizer_offload false" in a for a in report.advice)


def test_memtest_counts_the_offloaded_state_of_every_process_on_the_machine(monkeypatch):
    """Each process keeps its own optimizer state in host memory: two on one machine need
    twice one's, two on two machines one's each."""
    from pyxtts import memtest

    cfg = XTTSConfig.load("cpu_demo")
    cfg.training.optimizer_offload = True
    one = run_memtest(cfg, step=False).plan.host_total
    real = memtest._C.device_info

    def host_of_one_and_a_half(device):
        info = dict(real(device))
        if device == "cpu":
            info["free_memory"] = one * 3 // 2
        return info

    monkeypatch.setattr(memtest._C, "device_info", host_of_one_and_a_half)
    assert run_memtest(cfg, step=False).short is None
    report = run_memtest(cfg, step=False, world_size=2)
    assert report.plan.host_total == one and report.host_needed == 2 * one
    assert report.verdict == "does not fit" and report.short == "host"
    assert (f"needs {format_bytes(one)} (pageable) in each of the 2 processes on a machine, {format_bytes(2 * one)} in all; this "
            f"machine has {format_bytes(one * 3 // 2)} available: NOT ENOUGH") in report.text, report.text
    assert f"host memory is short: the optimizer state needs {format_bytes(2 * one)} (2 processes)" in report.text
    assert any(f"free host memory for the optimizer state ({format_bytes(2 * one)})" in a for a in report.advice)
    apart = run_memtest(cfg, step=False, world_size=2, nodes=2)
    assert apart.host_needed == one and apart.short is None


@pytest.mark.skipif(pyxtts.cuda_available(), reason="says so only where no GPU is")
def test_optimize_config_says_when_auto_plans_for_the_cpu(tmp_path, capsys):
    rc = pyxtts.cli.main(["optimize-config", "--config", "cpu_demo", "--output", str(tmp_path / "o.yaml")])
    assert rc == 0
    assert "no GPU here" not in capsys.readouterr().err  # cpu_demo says device: cpu
    cfg = XTTSConfig.load("cpu_demo")
    cfg.training.device = "auto"
    cfg.save(tmp_path / "auto.yaml")
    rc = pyxtts.cli.main(["optimize-config", "--config", str(tmp_path / "auto.yaml"), "--output",
                          str(tmp_path / "o2.yaml")])
    err = capsys.readouterr().err
    assert rc == 0 and "no GPU here" in err and "--device cuda --memory 8GiB" in err


@pytest.mark.skipif(pyxtts.cuda_available(), reason="says so only where no GPU is")
def test_memtest_says_when_auto_plans_for_the_cpu(capsys):
    """--memory 4GiB without --device, on a machine without a GPU, plans the tier for this
    CPU (a verdict about RAM, not the card): said, with the flags that plan for the card."""
    assert pyxtts.cli.main(["memtest", "--config", "gpu_4gb", "--memory", "4GiB", "--no-step"]) == 1
    err = capsys.readouterr().err
    assert "no GPU here, so training.device 'auto' plans for this machine's CPU" in err, err
    assert "--device cuda --memory 4GiB" in err, err
    assert pyxtts.cli.main(["memtest", "--config", "gpu_4gb", "--memory", "4GiB", "--device", "cuda",
                            "--no-step"]) == 0
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--no-step"]) == 0  # it says device: cpu
    assert "no GPU here" not in capsys.readouterr().err


def test_init_that_changes_the_model_says_so_and_replans():
    tier = XTTSConfig.load("cpu_demo")
    assert pyxtts.cli._replanned(tier, tier, "cpu") is None  # nothing changed: nothing said
    other = tier.with_model(pyxtts.ModelConfig(**{**tier.model.__dict__, "n_layers": 3, "dropout": 0.1}))
    line = pyxtts.cli._replanned(tier, other, "cpu")
    assert line.startswith("--init: the checkpoint's model replaces the config's (n_layers 2 -> 3; dropout 0.0 -> 0.1")
    plan = other.memory_plan("cpu")
    budget = int(pyxtts.device_info("cpu")["total_memory"] * tier.training.max_memory_fraction)
    assert f"re-planned on cpu: {pyxtts.memory.format_bytes(plan.total)} of the budget " in line
    assert line.endswith("fits") == (plan.total <= budget)


def test_resume_with_no_checkpoint_says_so_without_progress(tmp_path, capsys):
    # --resume in a folder with no checkpoint (a typo?) starts afresh, and says so even with
    # --no-progress
    rc = pyxtts.cli.main(["train", "--synthetic", "8", "--max-steps", "1", "--resume", "--no-progress",
                          "--checkpoint-dir", str(tmp_path / "typo")])
    err = capsys.readouterr().err
    assert rc == 0 and f"resume: no checkpoint in {tmp_path / 'typo'}; starting from step 0" in err, err


def test_train_synthetic_refuses_a_count_below_one_and_data_beside_it(tmp_path, capsys):
    for n in ("0", "-3"):
        assert pyxtts.cli.main(["train", "--synthetic", n, "--checkpoint-dir", str(tmp_path / n)]) == 2
        err = capsys.readouterr().err
        assert f"--synthetic: expected a number of samples, an int >= 1, got {n}" in err, err
    assert pyxtts.cli.main(["train", "--synthetic", "8", "--data", str(tmp_path),
                            "--checkpoint-dir", str(tmp_path / "d")]) == 2
    assert "--synthetic: train on --data or on a synthetic set, not both" in capsys.readouterr().err
    assert not (tmp_path / "0").exists() and not (tmp_path / "d").exists()  # refused before anything


@pytest.mark.parametrize("value, says", [("8", "'8' would be 8 bytes; give a unit, e.g. '8GiB'"),
                                         ("-1", "must be > 0 bytes, got '-1'"),
                                         ("0", "must be > 0 bytes, got '0'")])
def test_memory_without_a_unit_or_not_positive_is_refused(value, says, capsys):
    assert pyxtts.cli.main(["memtest", "--config", "gpu_8gb", "--device", "cuda", "--memory", value]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("device", ["gpu", "tpu", "CPU"])
def test_memtest_names_a_bad_device_name_as_such(device, capsys):
    assert pyxtts.cli.main(["memtest", "--config", "gpu_8gb", "--device", device]) == 2
    assert f"device: expected 'cpu', 'cuda' or 'cuda:N', got '{device}'" in capsys.readouterr().err


def test_a_misspelt_command_is_named_not_trained_on(capsys):
    assert pyxtts.cli.main(["memtset", "--config", "gpu_4gb"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'memtset'; did you mean 'memtest'?" in err and "commands: train, memtest" in err, err


def test_train_says_when_the_optimizer_state_is_in_host_memory(tmp_path, capsys):
    cfg = tmp_path / "off.yaml"
    cfg.write_text("base: cpu_demo\ntraining:\n  optimizer_offload: true\n")
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "8", "--max-steps", "1",
                            "--checkpoint-dir", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "checkpointing" in err and ", optimizer state in host memory): " in err, err
    # --no-progress: the JSONL log's optimizer_host_bytes was all that said it; the start does
    argv = ["train", "--config", str(cfg), "--synthetic", "8", "--max-steps", "1", "--no-progress"]
    assert pyxtts.cli.main([*argv, "--checkpoint-dir", str(tmp_path / "quiet")]) == 0
    err = capsys.readouterr().err
    host = [r["optimizer_host_bytes"] for r in train_log(tmp_path / "quiet") if r["type"] == "train"][-1]
    assert f"optimizer state in host memory: {format_bytes(host)} (training.optimizer_offload: true)" in err, err
    assert "checkpointing" not in err  # the rest of the progress output stays off
    cfg.write_text("base: cpu_demo\ntraining:\n  optimizer_offload: false\n")
    assert pyxtts.cli.main([*argv, "--checkpoint-dir", str(tmp_path / "on_device")]) == 0
    assert "host memory" not in capsys.readouterr().err


def test_a_host_too_small_for_the_offloaded_state_is_named_with_what_helps(tmp_path, capsys):
    """The host pool holds the offloaded optimizer state, which no micro-batch, precision or
    checkpointing shrinks: its out-of-memory error says to free host memory or keep the
    state on the device, and the run writes nothing."""
    cfg = tmp_path / "off.yaml"
    cfg.write_text("base: cpu_demo\ntraining:\n  optimizer_offload: true\n")
    pyxtts.empty_cache("host")
    pyxtts.set_memory_limit(1 << 20, "host")  # 1 MiB: less than the demo's state
    try:
        rc = pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "8", "--max-steps", "1",
                              "--checkpoint-dir", str(tmp_path / "run")])
    finally:
        pyxtts.set_memory_limit(None, "host")
    err = capsys.readouterr().err
    assert rc == 1 and "Host out of memory" in err, err
    assert "free host memory, or keep the state on the device with training.optimizer_offload false" in err, err
    assert "optimize-config" not in err, err  # its settings leave the state's size as it is
    assert not (tmp_path / "run").exists()


def test_a_refused_init_leaves_no_run_folder(tmp_path, capsys):
    run = tmp_path / "run"
    assert pyxtts.cli.main(["train", "--init", str(tmp_path / "missing"), "--checkpoint-dir", str(run),
                            "--synthetic", "8"]) == 2
    err = capsys.readouterr().err
    assert "--init" in err and not run.exists()
    # without --config, --init trains Coqui's recipe (the CPU demo's data caps refused XTTS v2's clips)
    assert "no --config: Coqui's recipe (xtts_v2_finetune.yaml" in err, err


def test_init_of_a_pyxtts_checkpoint_says_how_a_run_starts_from_one(tmp_path, capsys):
    """`--init run/best.safetensors` was refused as "not a PyTorch zip checkpoint", without
    saying that --init takes Coqui's checkpoints and training.init_checkpoint takes pyxtts's."""
    run = tmp_path / "run"
    assert pyxtts.cli.main(["train", "--synthetic", "8", "--max-steps", "1", "--checkpoint-dir", str(run),
                            "--no-progress"]) == 0
    best = run / "best.safetensors"
    capsys.readouterr()
    assert pyxtts.cli.main(["train", "--init", str(best), "--checkpoint-dir", str(tmp_path / "new"),
                            "--synthetic", "8"]) == 2
    err = capsys.readouterr().err
    assert (f"--init {best}: " in err and "it is a pyxtts checkpoint, and --init takes Coqui's: a new run starts "
            "from its weights with training.init_checkpoint: PATH in its config") in err, err
    (tmp_path / "start.yaml").write_text(f"base: cpu_demo\ntraining:\n  init_checkpoint: {best}\n")
    assert pyxtts.cli.main(["train", "--config", str(tmp_path / "start.yaml"), "--synthetic", "8", "--max-steps",
                            "1", "--checkpoint-dir", str(tmp_path / "new"), "--no-progress"]) == 0
    (tmp_path / "other.bin").write_bytes(b"neither")  # any other file: no such hint
    assert pyxtts.cli.main(["train", "--init", str(tmp_path / "other.bin"), "--checkpoint-dir", str(tmp_path / "o"),
                            "--synthetic", "8"]) == 2
    assert "pyxtts checkpoint" not in capsys.readouterr().err


def test_resume_of_another_model_is_refused_at_once_with_how_to_continue(tmp_path, capsys):
    """A run resumed without the --init it started with was refused after building XTTS v2's
    model (30 s on a CPU, gigabytes) and once per checkpoint, without saying what was missing."""
    run = tmp_path / "run"
    assert pyxtts.cli.main(["train", "--synthetic", "8", "--max-steps", "4", "--checkpoint-dir", str(run),
                            "--no-progress"]) == 0
    (tmp_path / "wide.yaml").write_text("base: cpu_demo\nmodel:\n  n_layers: 3\n")
    capsys.readouterr()
    assert pyxtts.cli.main(["train", "--config", str(tmp_path / "wide.yaml"), "--synthetic", "8", "--resume",
                            "--checkpoint-dir", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("another architecture") == 1 and "n_layers: checkpoint 2, model 3" in err, err
    assert "continue a run with the --config (and --init) it started with" in err, err
    (run / "init_xtts.safetensors").write_bytes(b"")  # the mark of a run that started from --init
    assert pyxtts.cli.main(["train", "--config", str(tmp_path / "wide.yaml"), "--synthetic", "8", "--resume",
                            "--checkpoint-dir", str(run), "--no-progress"]) == 2
    assert "continue it with the --config and --init XTTS_DIR it started with" in capsys.readouterr().err


@pytest.mark.parametrize("argv, hint", [(["--confg", "gpu_8gb"], "--confg: did you mean --config?"),
                                        (["memtest", "--config", "gpu_8gb", "--memroy=8GiB"],
                                         "--memroy: did you mean --memory?")])
def test_a_misspelt_flag_gets_the_closest_one(argv, hint, capsys):
    with pytest.raises(SystemExit) as exc:
        pyxtts.cli.main(argv)
    assert exc.value.code == 2 and hint in capsys.readouterr().err


def test_memtest_shows_the_plan_before_the_real_step_and_stops_cleanly(monkeypatch, capsys):
    """On a CPU the real step of a large config takes minutes: memtest printed nothing until
    it ended, and Ctrl-C during it printed a traceback. The plan comes first now, a line says
    the step is running, and Ctrl-C ends with 130 and one line."""
    import pyxtts.memtest

    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "real step: running one step of micro-batch" in err and "--no-step plans only" in err, err
    assert out.count("memtest: ") == 1 and out.index("total") < out.index("real step: peak allocated"), out
    assert out.rstrip().splitlines()[-1].startswith(("advice:", "verdict:")), out

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pyxtts.memtest, "_synthetic_step", interrupted)
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--device", "cpu"]) == 130
    out, err = capsys.readouterr()
    assert "memtest: " in out and "Traceback" not in err, (out, err)
    assert "pyxtts memtest: interrupted during the real step; the plan above stands" in err, err


def test_optimize_config_says_what_it_writes_and_how_to_plan_for_a_card_elsewhere(tmp_path, capsys):
    """Its summary said "optimizer_offload: false" where the file it wrote said auto; a second
    run replaced the output without a word; --device cuda on a machine without that card
    said to reinstall with the CUDA toolkit, not that --memory plans for a card elsewhere."""
    from pyxtts.config import device_present

    out = tmp_path / "o.yaml"
    argv = ["optimize-config", "--config", "cpu_demo", "--device", "cpu", "--output", str(out)]
    assert pyxtts.cli.main(argv) == 0
    text = capsys.readouterr().out
    written = pyxtts.XTTSConfig.load(out).training.optimizer_offload
    assert written == "auto" and "optimizer state on the device (optimizer_offload: auto in the output)" in text
    assert text.rstrip().endswith(f"written: {out}"), text
    assert pyxtts.cli.main(argv) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"written: {out} (it replaced the file there)")
    if not device_present("cuda:3"):
        assert pyxtts.cli.main(["optimize-config", "--config", "gpu_8gb", "--device", "cuda:3", "--output",
                                str(tmp_path / "x.yaml")]) == 2
        assert ("pyxtts optimize-config: --device: cuda:3 is not in this machine; to plan for it elsewhere give its "
                "memory (--memory 8GiB, say)") in capsys.readouterr().err


def test_the_resume_hint_is_this_command_line(monkeypatch):
    """The line Ctrl-C prints: the command as main read it (not the process's own argv, which
    is pytest's here), --overwrite dropped, --resume added once; under --gpus's torchrun the
    launching command, --gpus included."""
    from pyxtts.cli import _resume_command

    monkeypatch.delenv("PYXTTS_COMMAND", raising=False)
    assert _resume_command(["train", "--config", "my run.yaml", "--overwrite"]) == \
        "pyxtts train --config 'my run.yaml' --resume"
    assert _resume_command(["train", "--resume", "a.safetensors"]) == "pyxtts train --resume a.safetensors"
    monkeypatch.setenv("PYXTTS_COMMAND", "pyxtts train --gpus 0,1 --config c.yaml")
    assert _resume_command(["train", "--config", "c.yaml"]) == "pyxtts train --gpus 0,1 --config c.yaml --resume"


def test_a_run_that_stopped_early_names_the_patience_not_max_steps(tmp_path, capsys, monkeypatch):
    """'nothing to train ... raise --max-steps' was said to a run that early stopping had
    ended, with --max-steps already far above its step: the patience is what holds it."""
    from pyxtts.trainer import FitResult

    cfg = small_config(tmp_path)
    done = FitResult(step=300, epoch=3, stopped="early_stopping", final_loss=None, eval_loss=0.5,
                     checkpoint=tmp_path / "ckpt" / "step_00000300.safetensors", log_path=tmp_path / "log",
                     elapsed_s=0.0)
    monkeypatch.setattr(pyxtts.Trainer, "fit", lambda self, *a, **k: done)
    assert pyxtts.cli.main(["train", "--config", str(cfg), "--synthetic", "24", "--no-progress", "--resume",
                            "--max-steps", "1000"]) == 0
    out = capsys.readouterr().out
    assert "its end (early_stopping); raise training.early_stopping_patience" in out and "--max-steps" not in out

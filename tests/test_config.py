"""XTTSConfig: sections, aliases, validation messages, YAML round trips, the shipped
tiers (their memory plans must fit their tier), optimize_config and its CLI."""
from __future__ import annotations

import dataclasses
import errno
import os
import re

import pytest
import yaml

import pyxtts
import pyxtts.cli
from helpers.disk import file_size_limit
from pyxtts.config import (CONFIGS_DIR, DataConfig, TrainingConfig, XTTSConfig, optimize_config,
                           parse_memory_size, plan_for, shipped_configs)

GB, GiB, MiB = 10**9, 2**30, 2**20

# tier -> the card size it is for (GiB), at which optimize_config chooses its settings
TIERS = {"large_gpu": 80, "gpu_24gb": 24, "gpu_16gb": 16, "gpu_12gb": 12, "gpu_8gb": 8, "gpu_6gb": 6, "gpu_4gb": 4}
# the tiers' names before the sizes: each now just its size tier
ALIASES = {"standard": "gpu_24gb", "memory_optimized": "gpu_12gb", "extreme_memory_optimized": "gpu_8gb"}
MARGIN = 0.10
# The tiers are for GPUs: their fits are checked on the plan for "cuda:0" (every build has
# the CUDA backend's workspace sizes, cuda/sizes.c; no GPU is needed, a plan allocates
# nothing), and on the CPU backend's plan too.
PLAN_DEVICES = ["cpu", "cuda:0"]
PLAN_DEVICE = "cuda:0"  # optimize_config: the GPU's plan


def xtts_v2(batch=8, accum=4, conditioning=True, **training) -> XTTSConfig:
    return XTTSConfig(model=pyxtts.ModelConfig(conditioning=conditioning),
                      training=TrainingConfig(gradient_accumulation_steps=accum, **training),
                      data=DataConfig(batch_size=batch))


def plan_total(cfg: XTTSConfig, device=PLAN_DEVICE, memory=None) -> int:
    return cfg.memory_plan(device, memory=memory).total


# ---- sections and aliases -------------------------------------------------------

def test_defaults_are_xtts_v2():
    cfg = XTTSConfig()
    assert cfg.model == pyxtts.ModelConfig()
    assert cfg.data.max_text_tokens == 404 and cfg.data.max_audio_tokens == 608
    assert cfg.sequence_length == 32 + 404 + 608
    assert cfg.training.precision == "fp32" and cfg.training.mixed_precision is False
    assert cfg.training.checkpointing == "none" and cfg.training.enable_gradient_checkpointing is False
    assert pyxtts.XTTSConfig is XTTSConfig and pyxtts.optimize_config is optimize_config


@pytest.mark.parametrize("kw, precision, mixed", [
    ({"mixed_precision": True}, "bf16", True),
    ({"mixed_precision": False}, "fp32", False),
    ({"precision": "fp16"}, "fp16", True),
    ({"precision": "bf16", "mixed_precision": True}, "bf16", True),
    ({"precision": "fp32", "mixed_precision": False}, "fp32", False),
])
def test_mixed_precision_alias(kw, precision, mixed):
    t = TrainingConfig(**kw)
    assert (t.precision, t.mixed_precision) == (precision, mixed)


@pytest.mark.parametrize("kw", [{"precision": "fp32", "mixed_precision": True},
                                {"precision": "bf16", "mixed_precision": False}])
def test_mixed_precision_contradiction(kw):
    with pytest.raises(ValueError, match=r"training\.mixed_precision.*contradicts.*precision"):
        TrainingConfig(**kw)


@pytest.mark.parametrize("kw, policy, enabled", [
    ({"enable_gradient_checkpointing": True}, "full", True),
    ({"enable_gradient_checkpointing": False}, "none", False),
    ({"checkpointing": "selective"}, "selective", True),
    ({"checkpointing": "auto", "enable_gradient_checkpointing": True}, "auto", True),
])
def test_checkpointing_alias(kw, policy, enabled):
    t = TrainingConfig(**kw)
    assert (t.checkpointing, t.enable_gradient_checkpointing) == (policy, enabled)


@pytest.mark.parametrize("kw", [{"checkpointing": "none", "enable_gradient_checkpointing": True},
                                {"checkpointing": "full", "enable_gradient_checkpointing": False}])
def test_checkpointing_contradiction(kw):
    with pytest.raises(ValueError, match=r"enable_gradient_checkpointing.*contradicts.*checkpointing"):
        TrainingConfig(**kw)


def test_enable_gradient_checkpointing_in_model_section_moves_to_training():
    cfg = XTTSConfig.from_dict({"model": {"n_layers": 2, "enable_gradient_checkpointing": True}})
    assert cfg.training.checkpointing == "full" and cfg.model.n_layers == 2


# ---- validation messages --------------------------------------------------------

@pytest.mark.parametrize("section, key, value, pattern", [
    ("training", "learning_rate", -1.0, r"training\.learning_rate: must be finite and > 0, got -1\.0"),
    ("training", "betas", [0.9, 1.5], r"training\.betas\[1\]: must be in \[0, 1\), got 1\.5"),
    ("training", "gradient_accumulation_steps", 0, r"training\.gradient_accumulation_steps: must be >= 1, got 0"),
    ("training", "max_memory_fraction", 1.5, r"training\.max_memory_fraction: must be in \(0, 1\], got 1\.5"),
    ("training", "precision", "fp8", r"training\.precision: must be one of fp32, bf16, fp16, got 'fp8'"),
    ("training", "checkpointing", "some", r"training\.checkpointing: must be one of none, selective, full, auto"),
    ("training", "lr_schedule", "linear", r"training\.lr_schedule: must be one of .*got 'linear'"),
    ("training", "cleanup_interval", 0, r"training\.cleanup_interval: must be >= 1, got 0"),
    ("training", "device", "tpu", r"training\.device: must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ("data", "batch_size", 0, r"data\.batch_size: must be >= 1, got 0"),
    ("data", "max_audio_tokens", 700, r"data\.max_audio_tokens: must be <= model\.max_audio_tokens=608, got 700"),
    ("model", "d_model", 1000, r"ModelConfig\.d_model: must be divisible by n_heads=16, got 1000"),
])
def test_validation_names_field_value_rule(section, key, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        XTTSConfig.from_dict({section: {key: value}})


@pytest.mark.parametrize("section, key, value, pattern", [
    ("training", "learning_rate", "fast", r"training\.learning_rate: expected float, got 'fast'"),
    ("training", "enable_memory_cleanup", 1, r"training\.enable_memory_cleanup: expected bool, got 1"),
    ("data", "batch_size", 2.5, r"data\.batch_size: expected int, got 2\.5"),
    ("training", "betas", 0.9, r"training\.betas: expected a list of float, float, got 0\.9"),
    ("model", "n_layers", "30", r"ModelConfig\.n_layers: expected int"),
])
def test_types_are_checked(section, key, value, pattern):
    with pytest.raises(TypeError, match=pattern):
        XTTSConfig.from_dict({section: {key: value}})


@pytest.mark.parametrize("doc, pattern", [
    ({"training": {"learning_rte": 1e-4}}, r"training: unknown key 'learning_rte'; did you mean 'learning_rate'\?"),
    ({"data": {"batchsize": 4}}, r"data: unknown key 'batchsize'; did you mean 'batch_size'\?"),
    ({"model": {"n_layer": 4}}, r"model: unknown key 'n_layer'; did you mean 'n_layers'\?"),
    ({"trainig": {}}, r"config: unknown key 'trainig'; did you mean 'training'\?"),
])
def test_unknown_key_names_closest(doc, pattern):
    with pytest.raises(ValueError, match=pattern):
        XTTSConfig.from_dict(doc)


def test_int_is_accepted_for_float_and_list_for_tuple():
    cfg = XTTSConfig.from_dict({"training": {"learning_rate": 1, "betas": [0, 0.5]}})
    assert cfg.training.learning_rate == 1.0 and isinstance(cfg.training.learning_rate, float)
    assert cfg.training.betas == (0.0, 0.5)


# ---- YAML -----------------------------------------------------------------------

def test_yaml_round_trip(tmp_path):
    cfg = XTTSConfig(model=pyxtts.ModelConfig(n_layers=3, d_model=96, n_heads=3),
                     training=TrainingConfig(mixed_precision=True, enable_gradient_checkpointing=True,
                                             learning_rate=3e-4, betas=(0.8, 0.99), grad_clip=None,
                                             lr_schedule="warmup_cosine", warmup_steps=5, max_steps=50,
                                             checkpoint_dir=str(tmp_path / "runs")),
                     data=DataConfig(batch_size=3, max_text_tokens=100, bucketing=False,
                                     train_metadata=str(tmp_path / "data/metadata.csv")))
    path = tmp_path / "cfg.yaml"
    cfg.save(path)
    back = XTTSConfig.load(path)
    assert back == cfg
    assert back.to_yaml() == cfg.to_yaml()


def test_yaml_errors(tmp_path):
    with pytest.raises(ValueError, match="not valid YAML"):
        XTTSConfig.from_yaml("model: [unclosed")
    with pytest.raises(TypeError, match="expected a mapping"):
        XTTSConfig.from_yaml("- a\n- b\n")
    assert XTTSConfig.from_yaml("") == XTTSConfig()


def test_yaml_reads_exponent_floats_without_a_dot():
    """PyYAML (YAML 1.1) reads `2e-3` as the string '2e-3'; a config file means a number."""
    cfg = XTTSConfig.from_yaml("model:\n  layer_norm_eps: 1E-5\ntraining:\n  learning_rate: 2e-3\n"
                               "  eps: 1e-8\n  min_lr: +1e-4\n  weight_decay: 1.e+0\n"
                               "  checkpoint_dir: '1e3'\n")
    t = cfg.training
    assert (t.learning_rate, t.eps, t.min_lr, t.weight_decay) == (2e-3, 1e-8, 1e-4, 1.0)
    assert cfg.model.layer_norm_eps == 1e-5
    assert t.checkpoint_dir == "1e3"  # quoted: still a string
    with pytest.raises(TypeError, match="training.max_steps: expected int, got 1000.0"):
        XTTSConfig.from_yaml("training:\n  max_steps: 1e3\n")  # a float, not silently an int
    import yaml

    assert yaml.safe_load("a: 2e-3") == {"a": "2e-3"}  # PyYAML's own loader is left as it is


# ---- shipped configs ------------------------------------------------------------

def test_shipped_configs_present():
    assert set(shipped_configs()) == {"xtts_v2_finetune", "cpu_demo", *TIERS, *ALIASES}


def test_a_missing_config_names_the_path_and_the_closest_shipped_name(tmp_path, monkeypatch):
    """A misspelled name used to give "[Errno 2] No such file or directory: '...'"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        XTTSConfig.load("extreme_memory_optimised")
    assert str(info.value) == ("config: 'extreme_memory_optimised' is neither a file nor a shipped config's name; "
                               "did you mean 'extreme_memory_optimized'?")
    with pytest.raises(FileNotFoundError, match=r"'gpu_12GB\.yaml' .*; did you mean 'gpu_12gb'\?$"):
        XTTSConfig.load("gpu_12GB.yaml")
    with pytest.raises(FileNotFoundError) as info:  # nothing close: every shipped name
        XTTSConfig.load(tmp_path / "my_run.yaml")
    assert str(info.value) == (f"config: {str(tmp_path / 'my_run.yaml')!r} is neither a file nor a shipped "
                               f"config's name; the shipped configs are {', '.join(shipped_configs())}")
    (tmp_path / "tier.yaml").write_text("base: standrd\n")  # in a base, the file that names it is named
    with pytest.raises(FileNotFoundError, match=r"tier\.yaml: base: 'standrd' .*; did you mean 'standard'\?$"):
        XTTSConfig.load(tmp_path / "tier.yaml")


@pytest.mark.parametrize("name", ["xtts_v2_finetune", "cpu_demo", *TIERS, *ALIASES])
def test_shipped_config_loads_and_round_trips(name, tmp_path):
    cfg = XTTSConfig.load(CONFIGS_DIR / f"{name}.yaml")
    assert XTTSConfig.load(name) == cfg  # by its stem
    cfg.save(tmp_path / "x.yaml")
    # the shipped configs' paths are relative to the working directory; a saved one's
    # are relative to its folder, and point at the same place
    assert same_place(XTTSConfig.load(tmp_path / "x.yaml"), cfg)


def same_place(a: XTTSConfig, b: XTTSConfig) -> bool:
    """a == b, paths compared by where they point (from the working directory)."""
    from pyxtts.config import PATH_FIELDS

    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        for section, name in PATH_FIELDS:
            if d[section][name] is not None:
                d[section][name] = os.path.abspath(d[section][name])
    return da == db


def test_paths_in_a_file_are_relative_to_the_file(tmp_path, monkeypatch):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg/run.yaml").write_text("training:\n  checkpoint_dir: runs/a\n  init_checkpoint: /abs/x\n"
                                           "data:\n  train_metadata: ../data/m.jsonl\n")
    monkeypatch.chdir(tmp_path)
    cfg = XTTSConfig.load("cfg/run.yaml")
    assert cfg.training.checkpoint_dir == os.path.join("cfg", "runs", "a")
    assert cfg.data.train_metadata == os.path.join("data", "m.jsonl")
    assert cfg.training.init_checkpoint == "/abs/x" and cfg.data.eval_metadata is None
    # saved elsewhere, they are rewritten relative to the new file: same places
    (tmp_path / "other").mkdir()
    cfg.save("other/x.yaml")
    text = (tmp_path / "other/x.yaml").read_text()
    assert "checkpoint_dir: ../cfg/runs/a" in text and "train_metadata: ../data/m.jsonl" in text
    assert XTTSConfig.load("other/x.yaml") == cfg
    assert XTTSConfig.load(tmp_path / "other/x.yaml").training.checkpoint_dir == str(tmp_path / "cfg/runs/a")
    # a shipped config's paths stay relative to the working directory
    assert XTTSConfig.load("cpu_demo").training.checkpoint_dir == "checkpoints/cpu_demo"


def _stated(name: str) -> tuple[float, float]:
    """The device and host totals (GiB) a tier's YAML header states for its plan."""
    import re

    text = shipped_configs()[name].read_text()
    device = re.search(r"([\d.]+) GiB on the device", text.replace("\n# ", " "))
    host = re.search(r"([\d.]+) GiB of host memory", text.replace("\n# ", " "))
    assert device is not None, f"{name}: the header states no device total"
    return float(device.group(1)), float(host.group(1)) if host else 0.0


@pytest.mark.parametrize("plan_device", PLAN_DEVICES)
@pytest.mark.parametrize("name", list(TIERS))
def test_tier_is_coquis_whole_recipe_and_fits_its_card(name, plan_device):
    cfg = XTTSConfig.load(name)
    xtts_v2_framing = dict(start_text_token=261, stop_text_token=0, start_audio_token=1024, stop_audio_token=1025)
    # every tier trains the XTTS v2 GPT with its conditioning path and dropout 0.1, framed as
    # Coqui does, on the recipe's batch of 3 x 84 = 252 samples per optimizer step
    xtts_v2 = pyxtts.ModelConfig(**xtts_v2_framing)
    assert cfg.model == xtts_v2 and cfg.model.conditioning and cfg.model.dropout == 0.1
    assert (cfg.data.max_text_tokens, cfg.data.max_audio_tokens) == (404, 608), "full-length sequences"
    assert cfg.effective_batch_size == 252
    assert isinstance(cfg.training.optimizer_offload, bool), "a tier says where the optimizer state lives"
    limit = TIERS[name] * GiB * cfg.training.max_memory_fraction
    plan = cfg.memory_plan(plan_device)
    # the GPU's plan within the margin; the CPU backend's (larger workspaces: 3.28 against
    # 3.20 GiB at 4 GB) within the budget
    room = limit * (1 - MARGIN) if plan_device != "cpu" else limit
    assert plan.total <= room, f"{name}: plan {plan.total / GiB:.2f} GiB over {room / GiB:.2f} GiB"
    assert (plan.host_total > 0) == cfg.training.optimizer_offload
    if plan_device != "cpu":  # the header states the GPU's plan, to the hundredth of a GiB
        assert _stated(name) == (round(plan.total / GiB, 2), round(plan.host_total / GiB, 2)), name
    # and the plan is the one estimate_memory gives for those settings directly
    direct = pyxtts.estimate_memory(xtts_v2, cfg.data.batch_size, 404, 608, cond_len=32,
                                    checkpointing=cfg.training.checkpointing, optimizer=True,
                                    precision=cfg.training.precision, device=plan_device,
                                    cond_frames=xtts_v2.planned_cond_frames, offload=cfg.training.optimizer_offload)
    assert (direct.total, direct.host_total) == (plan.total, plan.host_total)


TIER_ROW = re.compile(r"^\| `(\w+)` \| (\d+) GB[^|]*\| (\w+) \| (\d+) × (\d+) \| (host memory|device) \| "
                      r"([\d.]+) GiB \|(?: ([\d.]+) GiB)? \|$", flags=re.M)


def test_the_tier_table_of_api_md_is_each_tiers_settings_and_plan():
    """docs/api.md's table of the tiers states each one's settings and its plan at the
    longest sequences on its card (`pyxtts memtest --config NAME --device cuda --memory
    SIZE --no-step`), and the README quotes gpu_4gb's: a tier retuned without its row
    would leave the docs promising another plan."""
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    rows = TIER_ROW.findall((repo / "docs" / "api.md").read_text())
    assert sorted(r[0] for r in rows) == sorted(TIERS)
    for name, card, policy, micro, accumulation, where, device, host in rows:
        cfg = XTTSConfig.load(name)
        plan = cfg.memory_plan("cuda", f"{card}GiB")
        stated = (int(card), policy, int(micro), int(accumulation), where == "host memory", float(device),
                  float(host or 0))
        assert stated == (TIERS[name], cfg.training.checkpointing, cfg.data.batch_size,
                          cfg.training.gradient_accumulation_steps, cfg.training.optimizer_offload,
                          round(plan.total / GiB, 2), round(plan.host_total / GiB, 2)), name
    small = dict((r[0], r) for r in rows)["gpu_4gb"]
    readme = (repo / "README.md").read_text()
    assert f"device plan **{small[6]} GiB**" in readme and f"{small[7]} GiB of host memory" in readme


SETTINGS = ("precision", "checkpointing", "gradient_accumulation_steps", "optimizer_offload")


@pytest.mark.parametrize("name", list(TIERS))
def test_tier_is_what_optimize_config_chooses_for_its_size(name):
    """Each size tier is the choice of optimize_config for its card from Coqui's recipe in
    bf16; no two sizes share settings (else they would be one tier)."""
    base = XTTSConfig.load("xtts_v2_finetune")
    base = base.replace(training=dataclasses.replace(base.training, precision="bf16", mixed_precision=True))
    chosen, _ = optimize_config(base, f"{TIERS[name]}GiB", device="cuda:0", keep_precision=True)
    tier = XTTSConfig.load(name)
    got = [getattr(tier.training, k) for k in SETTINGS] + [tier.data.batch_size]
    assert got == [getattr(chosen.training, k) for k in SETTINGS] + [chosen.data.batch_size], name


def test_no_two_size_tiers_share_settings():
    seen = {}
    for name in TIERS:
        t = XTTSConfig.load(name)
        key = tuple(getattr(t.training, k) for k in SETTINGS) + (t.data.batch_size,)
        assert key not in seen, f"{name} and {seen.get(key)} have the same settings: one tier"
        seen[key] = name


@pytest.mark.parametrize("alias", list(ALIASES))
def test_old_tier_names_are_their_size_tiers(alias):
    assert XTTSConfig.load(alias) == XTTSConfig.load(ALIASES[alias])


RECIPE = ("learning_rate", "betas", "eps", "weight_decay", "weight_decay_on", "grad_clip", "lr_schedule",
          "lr_milestones", "lr_gamma", "warmup_steps", "epochs", "seed")


@pytest.mark.parametrize("name", list(TIERS))
def test_tiers_inherit_coquis_recipe(name, tmp_path):
    """Each tier is xtts_v2_finetune.yaml plus batch, precision, recomputation and memory
    settings: the optimizer recipe, schedule, model and data limits come from the base."""
    base, tier = XTTSConfig.load("xtts_v2_finetune"), XTTSConfig.load(name)
    assert yaml.safe_load(shipped_configs()[name].read_text())["base"] == "xtts_v2_finetune"
    for field in RECIPE:
        assert getattr(tier.training, field) == getattr(base.training, field), field
    assert (base.training.learning_rate, base.training.betas, base.training.weight_decay) == (5e-6, (0.9, 0.96), 1e-2)
    assert tier.model == base.model
    assert (tier.data.max_text_tokens, tier.data.max_audio_tokens) == (404, 608)
    # an edit of the base reaches the tier: a copy of both, the base's learning rate changed
    (tmp_path / "xtts_v2_finetune.yaml").write_text(
        shipped_configs()["xtts_v2_finetune"].read_text().replace("learning_rate: 5.0e-06", "learning_rate: 1.0e-05"))
    (tmp_path / "tier.yaml").write_text(shipped_configs()[name].read_text().replace(
        "base: xtts_v2_finetune", "base: xtts_v2_finetune.yaml"))
    assert XTTSConfig.load(tmp_path / "tier.yaml").training.learning_rate == 1e-5


def test_base_errors_name_the_file(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ValueError, match="inherit in a circle"):
        XTTSConfig.load(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("base: [1]\n")
    with pytest.raises(TypeError, match="base: expected"):
        XTTSConfig.load(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("base: missing.yaml\n")
    with pytest.raises(OSError, match="missing.yaml"):
        XTTSConfig.load(tmp_path / "d.yaml")
    # a relative path in a tier of another folder stays relative to that file
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "e.yaml").write_text("training:\n  checkpoint_dir: runs\n")
    (tmp_path / "f.yaml").write_text("base: sub/e.yaml\n")
    assert XTTSConfig.load(tmp_path / "f.yaml").training.checkpoint_dir == str(tmp_path / "sub" / "runs")


@pytest.mark.parametrize("plan_device", PLAN_DEVICES)
def test_tiers_trade_memory_for_recomputation(plan_device):
    totals = [plan_total(XTTSConfig.load(n), plan_device) for n in TIERS]
    assert totals == sorted(totals, reverse=True), "a smaller card, a smaller plan on the device"
    offloaded = [XTTSConfig.load(n).training.optimizer_offload for n in TIERS]
    assert offloaded == sorted(offloaded), "the optimizer state goes to the host below some card size"
    order = ["none", "selective", "full"]
    ranks = [order.index(XTTSConfig.load(n).training.checkpointing) for n in TIERS]
    assert ranks == sorted(ranks)


def test_cpu_demo_is_tiny_and_trains():
    cfg = XTTSConfig.load("cpu_demo")
    t = cfg.training
    # tiny enough to train in well under 3 minutes on 2 cores (test_cli times the whole demo)
    assert t.device == "cpu" and t.max_steps is not None and t.max_steps <= 1000
    model = pyxtts.XTTSGPT(cfg.model, device="cpu", precision=t.precision, checkpointing=t.checkpointing,
                           seed=t.seed)
    assert model.num_parameters < 2_000_000
    assert plan_total(cfg, "cpu") < 256 * 2**20


# ---- memory sizes ---------------------------------------------------------------

@pytest.mark.parametrize("text, n", [("12GiB", 12 * GiB), ("12 GiB", 12 * GiB), ("12G", 12 * GiB),
                                     ("12g", 12 * GiB), ("12GB", 12 * GB), ("1.5GiB", 3 * GiB // 2),
                                     ("512MiB", 512 * 2**20), ("4194304", 4194304), (4096, 4096)])
def test_parse_memory_size(text, n):
    assert parse_memory_size(text) == n


@pytest.mark.parametrize("text, n", [("2.01GB", 2_010_000_000), ("2.01KB", 2010),
                                     ("99999999999999999999MB", 99999999999999999999 * 10**6),
                                     ("1.0000001KiB", 1024), ("0.5KiB", 512)])
def test_parse_memory_size_is_exact(text, n):
    # found by the fuzz: a float product said 2009999999 bytes for "2.01GB", and lost every
    # digit past the 17th of a long number
    assert parse_memory_size(text) == n


def test_parse_memory_size_refuses_a_small_number_without_a_unit():
    # "--memory 8" would be 8 bytes: a unit left out, not a device of 8 bytes (bytes as an int
    # stay bytes, and a number of a MiB or more stays bytes too)
    with pytest.raises(ValueError, match="^memory: '8' would be 8 bytes; give a unit, e.g. '8GiB'$"):
        parse_memory_size("8")
    # a card's size as nvidia-smi gives it (4096MiB) is offered as such, not as 4096 GiB
    with pytest.raises(ValueError, match="^memory: '4096' would be 4096 bytes; give a unit, e.g. '4096MiB'$"):
        parse_memory_size(" 4096 ")
    with pytest.raises(ValueError, match="e.g. '1023GiB'$"):
        parse_memory_size("1023")


@pytest.mark.parametrize("bad", ["12 parsecs", "GiB", "-1GiB", "0", 0, -5])
def test_parse_memory_size_rejects(bad):
    with pytest.raises(ValueError, match="memory"):
        parse_memory_size(bad)


# ---- optimize_config ------------------------------------------------------------

@pytest.mark.parametrize("memory", [80 * GiB, 24 * GiB, 16 * GiB, 12 * GiB, 10 * GiB, 8 * GiB])
@pytest.mark.parametrize("start", [(8, 4), (32, 1), (1, 32), (3, 2)])
def test_optimize_keeps_effective_batch_and_fits(memory, start):
    # on a GPU every size trains the whole recipe, the optimizer state in host memory where
    # it must; the CPU's plan keeps the state beside the parameters (offload: auto is never
    # on the CPU), and at 8 GB the 441 M parameters' fp32 gradients and moments alone take
    # 6.6 GiB of its 6.5 GiB budget: that check trains the GPT without its conditioning path
    cfg = xtts_v2(*start, conditioning=memory > 8 * GiB or PLAN_DEVICE != "cpu", mixed_precision=True)
    new, why = optimize_config(cfg, memory, device=PLAN_DEVICE)
    assert new.effective_batch_size == cfg.effective_batch_size
    limit = memory * cfg.training.max_memory_fraction * (1 - MARGIN)
    assert plan_total(new) <= limit
    assert new.model == cfg.model and new.data.max_audio_tokens == cfg.data.max_audio_tokens
    assert new.training.learning_rate == cfg.training.learning_rate
    assert "budget" in why and "chosen" in why and f"{new.data.batch_size} x" in why
    # what optimize_config writes is a valid config: aliases follow the choices
    assert new.training.mixed_precision == (new.training.precision != "fp32")
    assert new.training.enable_gradient_checkpointing == (new.training.checkpointing != "none")
    assert XTTSConfig.from_yaml(new.to_yaml()) == new


def test_optimize_prefers_less_recomputation_with_more_memory():
    cfg = xtts_v2(2, 16, checkpointing="full")
    big, _ = optimize_config(cfg, "80GiB", device=PLAN_DEVICE)
    # 10 GiB: the 441 M parameters' state leaves room for a micro-batch only with recomputation
    small, _ = optimize_config(cfg, "10GiB", device=PLAN_DEVICE)
    order = ["none", "selective", "full"]
    assert big.training.checkpointing == "none"
    assert order.index(big.training.checkpointing) < order.index(small.training.checkpointing)
    assert big.data.batch_size > small.data.batch_size
    assert big.training.gradient_accumulation_steps < small.training.gradient_accumulation_steps


def test_optimize_uses_fraction_and_margin():
    cfg = xtts_v2(8, 4)
    _, why = optimize_config(cfg, "20GiB", device=PLAN_DEVICE)
    assert "18.00 GiB" in why  # 20 GiB x 0.9
    assert "16.20 GiB" in why  # less 10 %
    tight = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, max_memory_fraction=0.5))
    new, _ = optimize_config(tight, "20GiB", device=PLAN_DEVICE)
    assert plan_total(new) <= 20 * GiB * 0.5 * 0.9


def test_optimize_keep_precision():
    cfg = xtts_v2(8, 4, precision="fp32")
    new, _ = optimize_config(cfg, "12GiB", keep_precision=True, device=PLAN_DEVICE)
    assert new.training.precision == "fp32"
    fp16, _ = optimize_config(xtts_v2(8, 4, precision="fp16"), "12GiB", device=PLAN_DEVICE)
    assert fp16.training.precision == "fp16"


def test_optimize_raises_when_nothing_fits():
    with pytest.raises(ValueError, match=r"no plan fits: the smallest.*needs [\d.]+ GiB.*budget of [\d.]+ GiB"):
        optimize_config(xtts_v2(8, 4), "2GiB", device=PLAN_DEVICE)


def recipe_bf16(offload="auto") -> XTTSConfig:
    base = XTTSConfig.load("xtts_v2_finetune")
    return base.replace(training=dataclasses.replace(base.training, precision="bf16", mixed_precision=True,
                                                     optimizer_offload=offload))


def test_optimize_offloads_only_to_fit_or_to_reach_coquis_micro_batch():
    for size, offload in ((4, True), (8, True), (12, False), (24, False)):
        new, why = optimize_config(recipe_bf16(), f"{size}GiB", device="cuda:0", keep_precision=True)
        assert new.training.optimizer_offload is offload, size
        plan = new.memory_plan("cuda:0")
        assert (plan.host_total > 0) is offload and plan.total <= size * GiB * 0.9 * 0.9
        assert ("offload cost:" in why) is offload and ("optimizer_offload: true" in why) is offload
        if offload:  # what each optimizer step moves: 4 bytes down, 2 (bf16) up per parameter
            assert f"{4 * plan.parameter_count / GiB:.2f} GiB of gradients down" in why
            assert f"{2 * plan.parameter_count / MiB:.2f} MiB of parameters up" in why \
                or f"{2 * plan.parameter_count / GiB:.2f} GiB of parameters up" in why
    # 9.5 GiB: with the state on the device full recomputation fits micro-batches of 1 and
    # 2, not Coqui's 3; in host memory, 3 and more fit: offload is chosen for that
    on_device = [m for m in (1, 2, 3) if plan_for(recipe_bf16(), "cuda:0", micro_batch=m, checkpointing="full",
                                                   offload=False).total <= 9.5 * GiB * 0.81]
    assert on_device == [1, 2]
    new, why = optimize_config(recipe_bf16(), "9.5GiB", device="cuda:0", keep_precision=True)
    assert new.training.optimizer_offload is True and new.data.batch_size >= 3
    assert "on the device no micro-batch of 3 fits" in why
    # a placement the config states is kept: false at 8 GiB fits nothing, and says what would
    with pytest.raises(ValueError, match="optimizer_offload true"):
        optimize_config(recipe_bf16(offload=False), "8GiB", device="cuda:0", keep_precision=True)
    kept, _ = optimize_config(recipe_bf16(offload=True), "80GiB", device="cuda:0", keep_precision=True)
    assert kept.training.optimizer_offload is True


def test_optimize_default_memory_is_the_devices():
    cfg = XTTSConfig.load("cpu_demo")
    new, why = optimize_config(cfg)
    assert "total memory of cpu" in why
    assert new.effective_batch_size == cfg.effective_batch_size
    assert new.training.checkpointing == "none"


# ---- CLI ------------------------------------------------------------------------

def test_cli_optimize_config_in_process(tmp_path, capsys):
    src, out = tmp_path / "in.yaml", tmp_path / "out.yaml"
    xtts_v2(8, 4).save(src)
    rc = pyxtts.cli.main(["optimize-config", "--config", str(src), "--output", str(out),
                          "--memory", "12GiB", "--device", PLAN_DEVICE])
    assert rc == 0
    new = XTTSConfig.load(out)
    assert new.effective_batch_size == 32
    assert plan_total(new) <= 12 * GiB * 0.9 * 0.9
    assert "chosen" in capsys.readouterr().out


def test_cli_optimize_config_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  learning_rte: 1.0e-4\n")
    rc = pyxtts.cli.main(["optimize-config", "--config", str(bad), "--output", str(tmp_path / "o.yaml")])
    assert rc == 2
    assert "did you mean 'learning_rate'" in capsys.readouterr().err
    assert not (tmp_path / "o.yaml").exists()


def test_cli_optimize_config_subprocess(tmp_path):
    from conftest import run_python

    out = tmp_path / "out.yaml"
    r = run_python("import sys, pyxtts.cli; sys.exit(pyxtts.cli.main(sys.argv[1:]))",
                   "optimize-config", "--config", "standard", "--output", str(out), "--memory", "10GB",
                   "--device", PLAN_DEVICE)
    assert r.returncode == 0, r.stderr
    new = XTTSConfig.load(out)
    assert new.effective_batch_size == 252
    assert plan_total(new) <= 10 * GB * 0.9 * 0.9


def test_with_model_caps_the_datas_longest_sequences():
    """A tier written for XTTS v2's 404 + 608 positions, given a smaller checkpoint's GPT
    (``pyxtts train --init``, the notebook's XTTS_DIR), plans and validates that GPT's."""
    tier = XTTSConfig.load("memory_optimized")
    small = pyxtts.ModelConfig(n_layers=2, d_model=64, n_heads=4, text_vocab_size=300, audio_vocab_size=66,
                               max_text_tokens=82, max_audio_tokens=204, start_text_token=1, stop_text_token=0,
                               start_audio_token=64, stop_audio_token=65)
    cfg = tier.with_model(small)
    assert cfg.model == small and (cfg.data.max_text_tokens, cfg.data.max_audio_tokens) == (82, 204)
    assert cfg.training == tier.training and cfg.data.batch_size == tier.data.batch_size
    assert tier.model != small and tier.data.max_text_tokens == 404  # the original is untouched
    assert cfg.memory_plan("cpu").total < tier.memory_plan("cpu").total


@pytest.mark.parametrize("name", ["gpu_4gb", "gpu_6gb", "gpu_8gb", "gpu_12gb", "gpu_16gb"])
def test_a_turing_card_runs_its_tier_in_fp16_at_the_same_bytes(name):
    # these tiers name Turing cards, which have no bfloat16: their comment says to set fp16,
    # which must plan to the same bytes on the device and the host
    cfg = XTTSConfig.load(name)
    assert "Turing" in (CONFIGS_DIR / f"{name}.yaml").read_text()
    bf16 = plan_for(cfg, "cuda:0", memory=f"{TIERS[name]}GiB")
    fp16 = plan_for(cfg, "cuda:0", memory=f"{TIERS[name]}GiB", precision="fp16")
    assert (fp16.total, fp16.host_total) == (bf16.total, bf16.host_total), name


@pytest.mark.parametrize("size", [4, 6])
def test_optimize_config_says_why_a_cheaper_plan_that_fits_was_passed_over(size):
    # at 4 and 6 GiB a cheaper plan fits with micro-batch 1-2, below Coqui's 3: the explanation
    # must not count it among those that "do not fit"
    new, why = optimize_config(recipe_bf16(), f"{size}GiB", device="cuda:0", keep_precision=True)
    gib = lambda text: float(re.search(r"([\d.]+) GiB", text).group(1))  # noqa: E731
    limit = gib(re.search(r"plan limit: .*", why).group(0))
    unfit = re.search(r"do not fit \(the smallest of them, [^)]*needs ([\d.]+ GiB)\)", why)
    below = re.search(r"fit only below Coqui's micro-batch of 3 \(the cheapest, \w+ \w+ micro-batch ([12]), "
                      r"needs ([\d.]+ GiB)\)", why)
    assert unfit and gib(unfit.group(1)) > limit, why
    assert below and gib(below.group(2)) <= limit, why
    assert new.data.batch_size >= 3 and new.training.optimizer_offload is True, why


def test_a_config_file_that_is_no_config_is_named_with_what_is_wrong(tmp_path):
    folder = tmp_path / "cfgdir"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match="is a folder, not a YAML config file"):
        XTTSConfig.load(folder)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"model:\n  n_layers: \xff\n")
    with pytest.raises(ValueError, match=r"b\.yaml' is not UTF-8 text \(byte 19\)"):
        XTTSConfig.load(binary)
    empty = tmp_path / "e.yaml"
    empty.write_text("# nothing but a comment\n")
    with pytest.raises(ValueError, match=r"e\.yaml' is empty"):
        XTTSConfig.load(empty)
    broken = tmp_path / "x.yaml"
    broken.write_text("training:\n  precision: bf16\n model: [\n")
    with pytest.raises(ValueError, match=r"x\.yaml' is not valid YAML at line 3, column 2: ") as exc:
        XTTSConfig.load(broken)
    assert "<unicode string>" not in str(exc.value)


def test_a_config_changed_by_attribute_saves_a_file_that_loads_back(tmp_path):
    """precision and mixed_precision (checkpointing and enable_gradient_checkpointing) say
    one thing twice: setting one by attribute left the other stale, and the saved file
    was refused on load ('mixed_precision: False contradicts precision=bf16')."""
    c = XTTSConfig.load("cpu_demo")
    c.training.precision = "bf16"
    c.training.checkpointing = "full"
    c.save(tmp_path / "a.yaml")
    t = XTTSConfig.load(tmp_path / "a.yaml").training
    assert (t.precision, t.mixed_precision, t.checkpointing, t.enable_gradient_checkpointing) == \
        ("bf16", True, "full", True)
    c.training.mixed_precision = False
    c.training.enable_gradient_checkpointing = False
    assert (c.training.precision, c.training.checkpointing) == ("fp32", "none")
    c.training.mixed_precision = True  # the partner only moves when it disagrees
    c.training.precision = "fp16"
    c.training.mixed_precision = True
    assert c.training.precision == "fp16"
    c.validate()
    assert XTTSConfig.load(tmp_path / "a.yaml").validate() == XTTSConfig.load(tmp_path / "a.yaml")


def test_validate_refuses_what_an_attribute_changed_and_trainer_calls_it():
    import pyxtts

    c = XTTSConfig.load("cpu_demo")
    c.data.batch_size = "8"
    with pytest.raises(TypeError, match=r"^data\.batch_size: expected int, got '8'"):
        c.validate()
    with pytest.raises(TypeError, match=r"^data\.batch_size"):
        pyxtts.Trainer(c, progress=False)
    c.data.batch_size = 4
    c.training.precision = "bfloat16"
    with pytest.raises(ValueError, match=r"^training\.precision: must be one of"):
        pyxtts.Trainer(c, progress=False)


def test_a_trainer_that_fails_to_build_leaves_the_memory_limit_as_it_was(tmp_path):
    """Trainer applies max_memory_fraction before it builds the model: a failure after
    that (an init_checkpoint that is not there) left the limit set for the process."""
    import pyxtts

    c = XTTSConfig.load("cpu_demo")
    c.training.max_memory_fraction = 0.5
    c.training.init_checkpoint = str(tmp_path / "missing.safetensors")
    before = pyxtts.memory_stats("cpu")["limit_bytes"]
    with pytest.raises(FileNotFoundError, match="training.init_checkpoint"):
        pyxtts.Trainer(c, progress=False)
    assert pyxtts.memory_stats("cpu")["limit_bytes"] == before


def test_numpy_numbers_are_taken_as_the_numbers_they_are(tmp_path):
    """api.md says integers take NumPy integers and rates np.float32; the config's fields
    refused both ('expected int, got 4 (int64)'). They are stored as Python's numbers, so
    the saved YAML is plain."""
    import numpy as np

    d = DataConfig(batch_size=np.int64(4), shuffle=np.bool_(False))
    assert type(d.batch_size) is int and d.batch_size == 4 and d.shuffle is False
    t = TrainingConfig(learning_rate=np.float32(1e-4), max_steps=np.int32(10))
    assert type(t.learning_rate) is float and t.learning_rate == float(np.float32(1e-4))
    t.set_max_steps(np.int64(300))
    assert type(t.max_steps) is int and t.max_steps == 300
    assert parse_memory_size(np.int64(12 << 30)) == 12 << 30
    c = XTTSConfig(data=d, training=t)
    c.save(tmp_path / "c.yaml")
    assert "!!" not in (tmp_path / "c.yaml").read_text()  # no NumPy tags
    for bad in (np.float64(4.0), np.bool_(True)):
        with pytest.raises(TypeError, match=r"^data\.batch_size: expected int"):
            DataConfig(batch_size=bad)


def test_a_model_set_by_attribute_takes_the_datas_longest_sequences_along():
    """XTTSConfig() filled data.max_*_tokens from the default model (404 text positions);
    cfg.model = a smaller model left them there, and validate() refused the config."""
    import pyxtts

    small = pyxtts.ModelConfig(n_layers=1, d_model=8, n_heads=2, max_text_tokens=6, max_audio_tokens=8)
    cfg = XTTSConfig()
    cfg.model = small
    assert (cfg.data.max_text_tokens, cfg.data.max_audio_tokens) == (6, 8)
    cfg.validate()
    cfg.data.max_text_tokens = 4  # set lower: kept under a larger model
    cfg.model = pyxtts.ModelConfig(n_layers=1, d_model=8, n_heads=2, max_text_tokens=10, max_audio_tokens=12)
    assert (cfg.data.max_text_tokens, cfg.data.max_audio_tokens) == (4, 12)


def test_a_plans_memory_is_checked_on_the_cpu_too():
    """memory='12' (12 bytes: a unit left out) was ignored on the CPU, where offload_for
    does not read it, and refused on a GPU."""
    cfg = XTTSConfig.load("cpu_demo")
    with pytest.raises(ValueError, match=r"^memory: '12' would be 12 bytes"):
        cfg.memory_plan("cpu", memory="12")
    assert cfg.memory_plan("cpu", memory="8GiB").total == cfg.memory_plan("cpu").total


def test_yaml_reads_booleans_as_yaml_1_2_does(tmp_path):
    """PyYAML's YAML 1.1 read `language: no` (Norwegian, a new language's code) as False
    and `yes`/`on` as True; only true and false are booleans now."""
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  xtts_dir: X\n  test_sentences:\n    - {text: hei, language: no, reference: r.wav}\n"
                    "  mixed_precision: true\ndata:\n  shuffle: False\n")
    cfg = XTTSConfig.load(path)
    assert cfg.training.test_sentences[0]["language"] == "no"
    assert cfg.training.mixed_precision is True and cfg.data.shuffle is False
    path.write_text("training:\n  optimizer_offload: yes\n")
    with pytest.raises(ValueError, match=r"training.optimizer_offload: expected true, false or 'auto', got 'yes'"):
        XTTSConfig.load(path)


def test_optimize_config_for_the_cpu_never_offloads():
    """gpu_8gb says optimizer_offload: true; planned for the CPU with --memory 8GiB it kept the
    state 'in host memory', planning 5.59 GiB on the device and 4.94 GiB on the host, the same
    RAM, and said it fits in 8 GiB. On the CPU the state is counted where it is: once."""
    cfg = XTTSConfig.load("gpu_8gb")
    with pytest.raises(ValueError, match=r"^optimize_config: no plan fits"):
        optimize_config(cfg, "8GiB", device="cpu")
    new, text = optimize_config(cfg, "64GiB", device="cpu")
    assert new.training.optimizer_offload is False and "in host memory" not in text and "offload cost" not in text
    assert "optimizer_offload true" in text  # what it was, as the file spells it
    assert new.memory_plan("cpu").host_total == 0
    auto = XTTSConfig.load("xtts_v2_finetune")
    assert auto.training.optimizer_offload == "auto"
    assert optimize_config(auto, "64GiB", device="cpu")[0].training.optimizer_offload == "auto"


def test_a_save_that_fails_leaves_the_file_that_was_there(tmp_path, capsys):
    """`optimize-config --config my.yaml --output my.yaml` on a full disk (a file size limit:
    EFBIG where a full disk gives ENOSPC): the file was opened for writing, so emptied,
    before the disk was found full, and the config being optimized was lost. Now it is
    whole, and the one line names it and the cause."""
    path = tmp_path / "my.yaml"
    XTTSConfig.load("cpu_demo").save(path)
    before = path.read_bytes()
    with file_size_limit(len(before) // 2):
        rc = pyxtts.cli.main(["optimize-config", "--config", str(path), "--output", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines()[-1] == (f"pyxtts optimize-config: --output: cannot write {str(path)!r}: "
                                                f"{os.strerror(errno.EFBIG)}"), err
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["my.yaml"]


def test_save_refuses_what_load_would(tmp_path):
    """precision = "fp8" by attribute was written, and the file then refused on load."""
    c = XTTSConfig.load("cpu_demo")
    c.training.precision = "fp8"
    with pytest.raises(ValueError, match=r"^training\.precision: must be one of"):
        c.save(tmp_path / "c.yaml")
    assert not (tmp_path / "c.yaml").exists()

"""Continuing a run of Coqui's ``GPTTrainer``: ``continue_xtts_run``.

A checkpoint of Coqui's trainer (``checkpoint_<N>.pth``, ``best_model.pth``) holds, beside
the weights, the state dict of the ``torch.optim.AdamW`` that ``GPTTrainer.get_optimizer``
built over ``xtts.gpt``: per tensor ``exp_avg``, ``exp_avg_sq`` and ``step`` (the updates
that tensor has had), keyed by its index in the param groups. With
``optimizer_wd_only_on_weights`` (the recipe) the groups are the decayed tensors' names
sorted, then the others' sorted; without it one group in ``xtts.gpt.parameters()`` order,
which is the order of the ``xtts.gpt.*`` keys of the model's state dict.

pyxtts's AdamW does torch's arithmetic (``m += (1 - b1)(g - m)``, ``v = b2 v + (1 - b2) g g``,
the decay ``p *= 1 - lr wd``, ``p += -(lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)``
with ``t`` the updates taken, this one included), over one step count for all tensors.
So the state maps exactly when every tensor has had the same number of updates, the
hyperparameters agree per tensor, and the moments are float32: the moments go to their
tensors' places in the flat ``m`` and ``v``, Coqui's float32 weights become the master
copy, the step count is the tensors' ``step``. Whatever does not map exactly is refused
(``CheckpointError`` naming what and why) before anything is written. Nothing in the file
runs: it is read with ``pyxtts.torchfile`` like ``import_xtts_checkpoint``'s.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pyxtts._files import missing_folders, remove_empty_folders
from pyxtts.checkpoint import CheckpointError, architecture_diffs, flat_offsets, save_checkpoint
from pyxtts.coqui_checkpoint import XTTSCheckpoint, plain, read_xtts_checkpoint
from pyxtts.coqui_config import coqui_decay
from pyxtts.torchfile import TensorRef

__all__ = ["continue_xtts_run"]

# the keys torch.optim.AdamW keeps per tensor (amsgrad adds max_exp_avg_sq)
_STATE_KEYS = {"step", "exp_avg", "exp_avg_sq"}


@dataclasses.dataclass
class CoquiAdamW:
    """The AdamW state of a Coqui run, by GPT parameter name: ``m``/``v`` (TensorRefs
    into the file), ``weight_decay`` per tensor, one ``step`` (updates taken), ``lr`` (the
    rate its next update would take), ``betas``, ``eps``, and the run's ``config`` dict."""
    m: dict[str, TensorRef]
    v: dict[str, TensorRef]
    weight_decay: dict[str, float]
    step: int
    lr: float
    betas: tuple[float, float]
    eps: float
    config: Mapping


def _refuse(ck: XTTSCheckpoint, why: str) -> CheckpointError:
    return CheckpointError(f"{ck.file.path}: {why}")


def _optimizer_state(ck: XTTSCheckpoint) -> tuple[Mapping, Mapping]:
    """(the optimizer's state dict, the run's config dict) of a Coqui trainer checkpoint."""
    obj = ck.file.obj
    config = plain(obj.get("config")) if isinstance(obj, Mapping) else None
    opt = obj.get("optimizer") if isinstance(obj, Mapping) else None
    if not opt:
        raise _refuse(ck, "holds no optimizer state (a released model.pth, or a checkpoint saved without "
                          "one): there is nothing to continue; --init alone starts from its weights with a fresh "
                          "AdamW")
    if not isinstance(config, Mapping):
        raise _refuse(ck, "holds no trainer config (its 'config' entry), so which optimizer made its state is "
                          "unknown")
    if isinstance(opt, list):
        if len(opt) != 1:
            raise _refuse(ck, f"holds the states of {len(opt)} optimizers; GPTTrainer trains with one")
        opt = opt[0]
    if not isinstance(opt, Mapping) or not isinstance(opt.get("state"), Mapping) \
            or not isinstance(opt.get("param_groups"), list):
        raise _refuse(ck, "its 'optimizer' entry is not a torch optimizer's state dict (state, param_groups)")
    return opt, config


def _group_names(ck: XTTSCheckpoint, config: Mapping, names: list[str]) -> list[str]:
    """The GPT parameter names in the order of the param groups' indices, as
    ``GPTTrainer.get_optimizer`` lays them out (module docstring): sorted by group with
    ``optimizer_wd_only_on_weights``, else in the order of the checkpoint's state dict."""
    if config.get("optimizer_wd_only_on_weights"):
        decayed = set(coqui_decay(names))
        return sorted(decayed) + sorted(n for n in names if n not in decayed)
    ours = set(names)
    return [n for n in ck.tensors if n in ours]


def _check_group(ck: XTTSCheckpoint, i: int, group: Mapping) -> None:
    if group.get("amsgrad") or group.get("maximize") or group.get("decoupled_weight_decay") is False:
        flags = {k: group.get(k) for k in ("amsgrad", "maximize", "decoupled_weight_decay")}
        raise _refuse(ck, f"param group {i} has {flags}: pyxtts's AdamW has decoupled weight decay, no "
                          "amsgrad and no maximize")
    for key in ("lr", "betas", "eps", "weight_decay", "params"):
        if key not in group:
            raise _refuse(ck, f"param group {i} has no {key!r}: not the state dict of a torch AdamW")
    if not isinstance(group["params"], list) or not all(type(p) is int for p in group["params"]):
        raise _refuse(ck, f"param group {i}'s 'params' is not a list of indices")


def read_coqui_adamw(ck: XTTSCheckpoint, names: list[str]) -> CoquiAdamW:
    """The AdamW state of a Coqui trainer checkpoint over the GPT tensors ``names`` (those
    of the pyxtts model), checked to map exactly (module docstring)."""
    opt, config = _optimizer_state(ck)
    if config.get("optimizer") != "AdamW":
        raise _refuse(ck, f"its run trained with the optimizer {config.get('optimizer')!r} (the config's "
                          "'optimizer'); pyxtts continues torch.optim.AdamW runs only")
    groups = opt["param_groups"]
    for i, g in enumerate(groups):
        if not isinstance(g, Mapping):
            raise _refuse(ck, f"param group {i} is not a dict")
        _check_group(ck, i, g)
    indices = [p for g in groups for p in g["params"]]
    if len(indices) != len(names) or sorted(indices) != list(range(len(names))):
        sizes = "+".join(str(len(g["params"])) for g in groups)
        raise _refuse(ck, f"its param groups hold {sizes} = {len(indices)} tensors, the GPT {len(names)}: they "
                          "are not the parameters of xtts.gpt (GPTTrainer's optimizer)")
    order = _group_names(ck, config, names)
    by_index = dict(enumerate(order))
    m: dict[str, TensorRef] = {}
    v: dict[str, TensorRef] = {}
    wd: dict[str, float] = {}
    steps: dict[str, float] = {}
    for g in groups:
        for p in g["params"]:
            name = by_index[p]
            wd[name] = float(g["weight_decay"])
            s = opt["state"].get(p)
            if s is None:
                raise _refuse(ck, f"tensor {p} of the param groups ({ck.prefix}{name}) has no optimizer state: it "
                                  "never had a gradient, so torch counts its updates from 0 while the others are "
                                  "further on; pyxtts keeps one step count for all tensors")
            if not isinstance(s, Mapping) or set(s) != _STATE_KEYS:
                raise _refuse(ck, f"the state of tensor {p} ({ck.prefix}{name}) has the keys "
                                  f"{sorted(s) if isinstance(s, Mapping) else type(s).__name__}, torch's AdamW "
                                  f"{sorted(_STATE_KEYS)}")
            for key, out in (("exp_avg", m), ("exp_avg_sq", v)):
                ref = s[key]
                if not isinstance(ref, TensorRef) or ref.shape != ck.tensors[name].shape:
                    shape = ref.shape if isinstance(ref, TensorRef) else type(ref).__name__
                    raise _refuse(ck, f"the {key} of tensor {p} has shape {shape}, {ck.prefix}{name} "
                                      f"{ck.tensors[name].shape}: the param groups are not in the order "
                                      "GPTTrainer builds them")
                if ref.dtype != np.float32:
                    raise _refuse(ck, f"the {key} of {ck.prefix}{name} is {ref.dtype}; pyxtts's moments are "
                                      "float32")
                out[name] = ref
            steps[name] = _step_of(ck, s["step"], name)
    counts = sorted(set(steps.values()))
    if len(counts) != 1:
        behind = min(steps, key=steps.__getitem__)
        raise _refuse(ck, f"its tensors have had different numbers of updates ({', '.join(f'{c:g}' for c in counts)}"
                          f"; {ck.prefix}{behind}: {steps[behind]:g}); pyxtts keeps one step count for all tensors")
    first = groups[0]
    for i, g in enumerate(groups[1:], 1):
        for key in ("lr", "betas", "eps"):
            if _floats(g[key]) != _floats(first[key]):
                raise _refuse(ck, f"param groups 0 and {i} differ in {key} ({first[key]!r}, {g[key]!r}); pyxtts's "
                                  "AdamW has one of each")
    b1, b2 = _floats(first["betas"])
    return CoquiAdamW(m=m, v=v, weight_decay=wd, step=int(counts[0]), lr=float(first["lr"]), betas=(b1, b2),
                      eps=float(first["eps"]), config=config)


def _floats(value: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in value) if isinstance(value, (list, tuple)) else (float(value),)


def _step_of(ck: XTTSCheckpoint, ref: Any, name: str) -> float:
    value = float(ck.file.array(ref).reshape(())) if isinstance(ref, TensorRef) else ref
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 1 or value != int(value):
        raise _refuse(ck, f"the step of {ck.prefix}{name} is {value!r}, not a count of updates >= 1")
    return float(value)


def _check_hyperparameters(state: CoquiAdamW, model: Any, t: Any, schedule: Any) -> None:
    """The config's AdamW and schedule are the Coqui run's, tensor by tensor: else the
    continued steps would not be the ones Coqui's would take."""
    if (t.betas[0], t.betas[1]) != state.betas:
        raise CheckpointError(f"training.betas: the Coqui run's AdamW has {list(state.betas)}, the config "
                              f"{list(t.betas)}; set training.betas: {list(state.betas)} (the moments are averages "
                              "over those betas)")
    if t.eps != state.eps:
        raise CheckpointError(f"training.eps: the Coqui run's AdamW has {state.eps!r}, the config {t.eps!r}")
    params = model.parameters()
    decayed = set(coqui_decay(params)) if t.weight_decay_on == "weights" else \
        {n for n, p in params.items() if len(p.shape) >= 2}
    for name in params:
        ours = t.weight_decay if name in decayed else 0.0
        if ours != state.weight_decay[name]:
            raise CheckpointError(
                f"training.weight_decay: the Coqui run decays {name} by {state.weight_decay[name]!r} "
                f"(optimizer_wd_only_on_weights: {bool(state.config.get('optimizer_wd_only_on_weights'))}), the "
                f"config by {ours!r} (weight_decay {t.weight_decay!r} on {t.weight_decay_on})")
    clip = state.config.get("grad_clip")
    theirs = float(clip) if isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip > 0 else None
    if theirs != (t.grad_clip or None):
        raise CheckpointError(f"training.grad_clip: the Coqui run clips at {theirs!r} (its grad_clip "
                              f"{clip!r}), the config at {t.grad_clip!r}")
    lr = schedule(state.step)
    if not math.isclose(lr, state.lr, rel_tol=1e-12, abs_tol=0.0):
        raise CheckpointError(f"training.learning_rate: the Coqui run's next update (its step {state.step + 1}) "
                              f"takes lr {state.lr!r}, the config's {t.lr_schedule} schedule gives {lr!r} at that "
                              "step; set the rate (and milestones) the Coqui run had")


def continue_xtts_run(pth_path: str | os.PathLike, config: Any) -> dict:
    """Continues the Coqui ``GPTTrainer`` run whose checkpoint is ``pth_path`` (a
    ``checkpoint_<N>.pth`` or ``best_model.pth``, its run's ``config.json`` beside it): writes
    the pyxtts checkpoint of that run at its optimizer step S, ``step_<S>.safetensors`` in
    ``config.training.checkpoint_dir``, for ``Trainer.fit(resume=path)`` (``pyxtts train
    --init PTH --continue``): the weights, the AdamW state (moments, the float32 master
    from Coqui's weights, the step count of Coqui's optimizer) and the rate its next step
    takes. ``config`` (an ``XTTSConfig``) is the config the run goes on with: its model
    section must be the checkpoint's GPT, and its AdamW (betas, eps, weight decay per
    tensor, clipping) and the rate its schedule gives at step S the Coqui run's. Returns
    ``{"path", "step", "lr", "coqui_step", "coqui_epoch"}``. A refusal (``CheckpointError``;
    ``FileExistsError`` for a checkpoint_dir holding a pyxtts run's checkpoints) writes
    nothing."""
    from pyxtts.config import XTTSConfig

    if not isinstance(config, XTTSConfig):
        raise TypeError(f"config: expected an XTTSConfig, got {type(config).__name__}")
    folder = Path(config.training.checkpoint_dir)
    _check_folder(folder)
    ck = read_xtts_checkpoint(pth_path)
    made = missing_folders(folder)
    try:
        path, info = _write_continued(ck, config, folder)
    except BaseException:
        remove_empty_folders(made)  # the checkpoint_dir and the parents made for it
        raise
    finally:
        ck.file.close()
    return {"path": str(path), **info}


def _check_folder(folder: Path) -> None:
    """A continued run starts in a checkpoint_dir without a pyxtts run's checkpoints."""
    from pyxtts.callbacks import BEST_NAME
    from pyxtts.callbacks.checkpoints import CHECKPOINT_RE

    held = sorted(p.name for p in folder.iterdir() if CHECKPOINT_RE.fullmatch(p.name) or p.name == BEST_NAME) \
        if folder.is_dir() else []
    if held:
        raise FileExistsError(f"{folder} holds the checkpoints of a pyxtts run ({', '.join(held[-3:])}): "
                              "--resume continues that run; continue the Coqui run in another checkpoint_dir")


def _write_continued(ck: XTTSCheckpoint, config: Any, folder: Path) -> tuple[Path, dict]:
    from pyxtts.callbacks.checkpoints import step_checkpoint_name
    from pyxtts.trainer import model_from_config, optimizer_from_config, schedule_from_config

    _check_model(ck, config)
    model = model_from_config(config, "cpu")
    params = model.parameters()
    missing = [n for n in params if n not in ck.tensors]
    if missing:
        raise _refuse(ck, f"its GPT lacks {len(missing)} parameters of the config's model (e.g. "
                          f"{ck.prefix}{missing[0]})")
    state = read_coqui_adamw(ck, list(params))
    t = config.training
    schedule = schedule_from_config(t)
    _check_hyperparameters(state, model, t, schedule)
    weights = {}
    for name in params:
        ref = ck.tensors[name]
        if ref.dtype != np.float32:
            raise _refuse(ck, f"{ck.prefix}{name} is {ref.dtype}: the master copy of a continued run is the "
                              "float32 weights torch's AdamW updated")
        weights[name] = ck.file.array(ref)
    model.load_state_dict(weights, strict=True)
    optimizer = optimizer_from_config(model, t)
    sd = optimizer.state_dict()
    flat = {"m": np.zeros_like(sd["m"]), "v": np.zeros_like(sd["v"]), "master": sd["master"].copy()}
    for name, lo in flat_offsets(params).items():
        n = params[name].numel()
        flat["m"][lo:lo + n] = ck.file.array(state.m[name]).reshape(-1)
        flat["v"][lo:lo + n] = ck.file.array(state.v[name]).reshape(-1)
        flat["master"][lo:lo + n] = weights[name].reshape(-1)
    lr = schedule(state.step)
    sd.update(flat, step=state.step, lr=lr)
    try:
        optimizer.load_state_dict(sd)
    except (TypeError, ValueError) as exc:  # check_moments: not moments an AdamW with these betas made
        raise _refuse(ck, f"its optimizer state: {exc}") from exc
    obj = ck.file.obj
    info = {"step": state.step, "lr": lr, "coqui_step": obj.get("step"), "coqui_epoch": obj.get("epoch")}
    # the position: epoch 0 at batch S until the data says how long an epoch is (Trainer.fit
    # then places step S in its epochs)
    extra = {"epoch": 0, "batch_in_epoch": state.step, "config": config.to_dict(), "data": None,
             "coqui": {"continued_from": str(ck.file.path), "step": info["coqui_step"],
                       "epoch": info["coqui_epoch"]}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / step_checkpoint_name(state.step)
    save_checkpoint(path, model, optimizer, step=state.step, extra=extra)
    return path, info


def _check_model(ck: XTTSCheckpoint, config: Any) -> None:
    """The config's model is the checkpoint's GPT (a run on a grown vocabulary has text rows
    whose moments the Coqui run never had)."""
    rows = ck.tensors["text_embedding.weight"].shape[0] if "text_embedding.weight" in ck.tensors else None
    if rows is not None and config.model.text_vocab_size > rows:
        raise _refuse(ck, f"the config's model has {config.model.text_vocab_size} text rows, the Coqui run "
                          f"{rows}: the rows grown for a new vocabulary have no moments in its optimizer state; "
                          "--init alone starts from its weights with a fresh AdamW")
    diffs = architecture_diffs(dataclasses.asdict(ck.config), config.model)
    if diffs:
        raise _refuse(ck, f"the config's model is not its GPT ({ck.config_source}): " + "; ".join(diffs))

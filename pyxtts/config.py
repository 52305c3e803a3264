"""Training configuration: ``XTTSConfig(model, training, data)``, YAML load/save, and
``optimize_config``, which picks precision, checkpoint policy, micro-batch and
accumulation so that the memory plan of a step fits a device.

Field names follow the XTTS v2 / MyXTTS recipes. Two pairs of fields are aliases:

- ``training.checkpointing`` ("none", "selective", "full", "auto") is the policy the
  model runs; ``training.enable_gradient_checkpointing`` is its boolean alias. Given
  alone, ``True`` means ``"full"`` (recompute each block in backward, the classic meaning
  of gradient checkpointing) and ``False`` means ``"none"``. Given both, they must agree
  (``False`` only with ``"none"``, ``True`` with any other policy); a contradiction is a
  ``ValueError``. The shipped tiers set ``checkpointing`` explicitly.
- ``training.precision`` ("fp32", "bf16", "fp16") is what the model stores and computes
  in; ``training.mixed_precision`` is its boolean alias. Given alone, ``True`` means
  ``"bf16"`` and ``False`` ``"fp32"``; an explicit ``precision`` always wins, and given
  both they must agree (``True`` with bf16/fp16, ``False`` with fp32).

After construction both members of each pair are filled in and consistent, so a saved
file loads back equal. ``enable_gradient_checkpointing`` written in the ``model``
section (where some recipes keep it) is accepted and moved to ``training``.

Memory sizes (``--memory``, ``device_memory``) are ints (bytes) or strings: "12GiB",
"12 GiB", "12G" and "12g" are 12 * 2**30 bytes (binary, as nvidia-smi's and PyTorch's
"GB" really are); "12GB" is 12 * 10**9 (SI); likewise K/M/T, KiB/MiB/TiB, KB/MB/TB.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
import os
import re
import typing
from dataclasses import dataclass, field, fields
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from pyxtts._args import flag, integer, path_arg, real
from pyxtts._files import write_atomic
from pyxtts.comm_memory import device_communication, world_of
from pyxtts.model import ModelConfig, estimate_memory, precision_problem

__all__ = ["DataConfig", "TrainingConfig", "XTTSConfig", "offload_for", "optimize_config", "parse_memory_size",
           "plan_for", "tier_for", "CONFIGS_DIR", "PATH_FIELDS", "SIZE_TIERS", "shipped_configs"]

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"

# Fields holding a path: in a YAML file relative to the file's folder (``XTTSConfig.load``).
PATH_FIELDS = (("training", "checkpoint_dir"), ("training", "init_checkpoint"), ("training", "xtts_dir"),
               ("training", "vocab"),
               ("data", "train_metadata"), ("data", "eval_metadata"))
PRECISIONS = ("fp32", "bf16", "fp16")
POLICIES = ("none", "selective", "full", "auto")
SCHEDULES = ("constant", "warmup_cosine", "multistep")
DECAY_SETS = ("weights", "matrices")
# A device's name as the C layer takes it (training.device adds "auto")
DEVICE_NAME = re.compile(r"cpu|cuda(:\d+)?")


# ---- field checks ---------------------------------------------------------------

def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is tuple:
        return "a list of " + ", ".join(_type_name(a) for a in typing.get_args(hint))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(hint)[0])}"
    return getattr(hint, "__name__", str(hint))


def _coerce(where: str, value: Any, hint: Any) -> Any:
    """value checked against a type hint; ints become floats where a float is wanted,
    lists become tuples where a tuple is. TypeError names the field, value and type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if args and type(None) in args:  # Optional[X]
        if value is None:
            return None
        rest = [a for a in args if a is not type(None)]
        return _coerce(where, value, rest[0]) if len(rest) == 1 else value
    bad = TypeError(f"{where}: expected {_type_name(hint)}, got {value!r} ({type(value).__name__})")
    # NumPy's scalars (np.int64, np.float32, np.bool_) count as what they are, and are
    # stored as Python's, so that a saved file holds plain YAML
    if hint is bool:
        if not isinstance(value, (bool, np.bool_)):
            raise bad
        return bool(value)
    if hint is int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise bad
        return int(value)
    if hint is float:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise bad
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise bad
        return value
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise bad
        return tuple(_coerce(f"{where}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
    if origin is list:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise bad
        return [_coerce(f"{where}[{i}]", v, args[0]) for i, v in enumerate(value)]
    return value  # pragma: no cover - every field has one of the hints above


def _check_types(obj: Any, section: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        setattr(obj, f.name, _coerce(f"{section}.{f.name}", getattr(obj, f.name), hints[f.name]))


def _rule(ok: bool, where: str, value: Any, rule: str) -> None:
    if not ok:
        raise ValueError(f"{where}: must be {rule}, got {value!r}")


def _positive(where: str, value: float | int | None, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if allow_zero:
        _rule(math.isfinite(value) and value >= 0, where, value, "finite and >= 0")
    else:
        _rule(math.isfinite(value) and value > 0, where, value, "finite and > 0")


def _unknown_key(section: str, key: Any, valid: list[str]) -> ValueError:
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(valid)}"
    return ValueError(f"{section}: unknown key {key!r}{hint}")


# ---- sections -------------------------------------------------------------------

@dataclass
class TrainingConfig:
    """Optimizer, precision, memory policy, schedule, length of the run, checkpoints.

    The optimizer's defaults are Coqui's XTTS v2 fine-tuning recipe
    (``recipes/ljspeech/xtts_v2/train_gpt_xtts.py``): AdamW with lr 5e-6, betas
    (0.9, 0.96), eps 1e-8, weight decay 1e-2 on the weights only
    (``optimizer_wd_only_on_weights``), no gradient clipping (the recipe sets none and
    Coqui's trainer defaults to 0), MultiStepLR at 900k/2.7M/5.4M steps with gamma 0.5."""

    learning_rate: float = 5e-6
    betas: tuple[float, float] = (0.9, 0.96)
    eps: float = 1e-8
    weight_decay: float = 1e-2
    # "weights": Coqui's set (Linear/Conv weights, the perceiver's latents and gamma; never
    # biases, norms or embeddings); "matrices": every tensor of 2+ dims, embeddings included
    weight_decay_on: str = "weights"
    grad_clip: float | None = None  # None: no clipping
    gradient_accumulation_steps: int = 1
    precision: str | None = None  # None: from mixed_precision (True -> bf16), else fp32
    mixed_precision: bool | None = None
    checkpointing: str | None = None  # None: from enable_gradient_checkpointing (True -> full)
    enable_gradient_checkpointing: bool | None = None
    max_memory_fraction: float = 0.9
    enable_memory_cleanup: bool = True
    cleanup_interval: int = 100
    lr_schedule: str = "multistep"  # "constant", "warmup_cosine", "multistep"
    warmup_steps: int = 0
    min_lr: float = 0.0
    lr_milestones: list[int] = field(default_factory=lambda: [900_000, 2_700_000, 5_400_000])
    lr_gamma: float = 0.5
    max_steps: int | None = None
    epochs: int | None = 1000
    checkpoint_dir: str = "checkpoints"
    checkpoint_interval: int = 1000
    keep_checkpoints: int | None = 3  # newest step checkpoints kept in checkpoint_dir; None: all
    eval_interval: int = 1000
    # evaluations in a row without a lower eval loss after which the run stops (needs
    # evaluation data); None: never. The best checkpoint is kept either way (best.safetensors)
    early_stopping_patience: int | None = None
    # several processes (torchrun): every this many steps the processes compare a checksum of
    # their parameters, which must be bit-identical (null: never); and how long a process
    # waits for the others in a collective before the run ends with an error
    parameter_check_interval: int | None = 100
    distributed_timeout_s: float = 600.0
    log_interval: int = 50
    seed: int = 0
    device: str = "auto"  # "auto": cuda:0 when a GPU is available, else cpu
    # weights a fresh run starts from: a pyxtts checkpoint's model tensors, e.g. the file
    # import_xtts_checkpoint writes (a resumed run takes its own checkpoint's instead)
    init_checkpoint: str | None = None
    # where AdamW keeps its moments, fp32 master and EMA: true, in host memory (the device
    # keeps parameters and gradients; each optimizer step moves them); false, on the
    # device; "auto", in host memory only when the plan does not fit the device without
    # (never on the CPU, where both are the same RAM)
    optimizer_offload: bool | str = "auto"
    # the Coqui XTTS folder (model.pth, config.json, vocab.json) the run fine-tunes: what
    # test_sentences are spoken through (pyxtts train --init sets it)
    xtts_dir: str | None = None
    # the extended vocab.json the model's text rows were grown to (a new language:
    # prepare --new-language's OUT/vocab.json; pyxtts train --init sets it): the spoken
    # test sentences are exported and tokenized with it
    vocab: str | None = None
    # spoken at each evaluation by Coqui's inference in a child process, into
    # <checkpoint_dir>/samples/step_<N>/<i>.wav and TensorBoard's audio tab: a list of
    # {text, language, reference (a recording of the voice to clone)}; needs xtts_dir
    test_sentences: list[dict] | None = None

    def __post_init__(self) -> None:
        _check_types(self, "training")
        w = "training."
        if not isinstance(self.optimizer_offload, bool) and self.optimizer_offload != "auto":
            kind = TypeError if not isinstance(self.optimizer_offload, str) else ValueError
            raise kind(f"training.optimizer_offload: expected true, false or 'auto', got "
                       f"{self.optimizer_offload!r}")
        # precision <-> mixed_precision: an explicit precision wins; both must agree
        if self.precision is None:
            self.precision = "bf16" if self.mixed_precision else "fp32"
        _rule(self.precision in PRECISIONS, w + "precision", self.precision, f"one of {', '.join(PRECISIONS)}")
        if self.mixed_precision is None:
            self.mixed_precision = self.precision != "fp32"
        elif self.mixed_precision != (self.precision != "fp32"):
            raise ValueError(f"training.mixed_precision: {self.mixed_precision!r} contradicts "
                             f"training.precision={self.precision!r} (mixed_precision must be "
                             f"{self.precision != 'fp32'} with {self.precision}; set only one of them)")
        # checkpointing <-> enable_gradient_checkpointing
        if self.checkpointing is None:
            self.checkpointing = "full" if self.enable_gradient_checkpointing else "none"
        _rule(self.checkpointing in POLICIES, w + "checkpointing", self.checkpointing,
              f"one of {', '.join(POLICIES)}")
        if self.enable_gradient_checkpointing is None:
            self.enable_gradient_checkpointing = self.checkpointing != "none"
        elif self.enable_gradient_checkpointing != (self.checkpointing != "none"):
            raise ValueError(f"training.enable_gradient_checkpointing: {self.enable_gradient_checkpointing!r} "
                             f"contradicts training.checkpointing={self.checkpointing!r} "
                             f"(it must be {self.checkpointing != 'none'} with {self.checkpointing!r}; "
                             "set only one of them)")
        _positive(w + "learning_rate", self.learning_rate)
        for i, b in enumerate(self.betas):
            _rule(0.0 <= b < 1.0, f"{w}betas[{i}]", b, "in [0, 1)")
        _positive(w + "eps", self.eps)
        _positive(w + "weight_decay", self.weight_decay, allow_zero=True)
        _rule(self.weight_decay_on in DECAY_SETS, w + "weight_decay_on", self.weight_decay_on,
              f"one of {', '.join(DECAY_SETS)}")
        _positive(w + "grad_clip", self.grad_clip)
        _rule(self.gradient_accumulation_steps >= 1, w + "gradient_accumulation_steps",
              self.gradient_accumulation_steps, ">= 1")
        _rule(0.0 < self.max_memory_fraction <= 1.0, w + "max_memory_fraction", self.max_memory_fraction,
              "in (0, 1]")
        for name in ("cleanup_interval", "checkpoint_interval", "eval_interval", "log_interval"):
            _rule(getattr(self, name) >= 1, w + name, getattr(self, name), ">= 1")
        _rule(self.lr_schedule in SCHEDULES, w + "lr_schedule", self.lr_schedule, f"one of {', '.join(SCHEDULES)}")
        _rule(self.warmup_steps >= 0, w + "warmup_steps", self.warmup_steps, ">= 0")
        _rule(self.warmup_steps == 0 or self.lr_schedule == "warmup_cosine", w + "warmup_steps",
              self.warmup_steps, f"0 with lr_schedule {self.lr_schedule!r} (only 'warmup_cosine' warms up)")
        _rule(self.keep_checkpoints is None or self.keep_checkpoints >= 1, w + "keep_checkpoints",
              self.keep_checkpoints, ">= 1 or null")
        self._check_test_sentences()
        _rule(self.parameter_check_interval is None or self.parameter_check_interval >= 1,
              w + "parameter_check_interval", self.parameter_check_interval, "an int >= 1 (steps) or null (never)")
        _positive(w + "distributed_timeout_s", self.distributed_timeout_s)
        _rule(self.early_stopping_patience is None or self.early_stopping_patience >= 1,
              w + "early_stopping_patience", self.early_stopping_patience,
              "an int >= 1 (evaluations without improvement) or null (no early stopping)")
        _positive(w + "min_lr", self.min_lr, allow_zero=True)
        _rule(self.min_lr <= self.learning_rate, w + "min_lr", self.min_lr,
              f"<= learning_rate={self.learning_rate!r}")
        _rule(all(m >= 0 for m in self.lr_milestones) and
              all(b > a for a, b in zip(self.lr_milestones, self.lr_milestones[1:])),
              w + "lr_milestones", self.lr_milestones, "strictly increasing steps >= 0")
        _positive(w + "lr_gamma", self.lr_gamma)
        _rule(self.max_steps is None or self.max_steps >= 1, w + "max_steps", self.max_steps, ">= 1 or null")
        _rule(self.epochs is None or self.epochs >= 1, w + "epochs", self.epochs, ">= 1 or null")
        _rule(self.max_steps is not None or self.epochs is not None, w + "max_steps", self.max_steps,
              "set when epochs is null (the run needs an end)")
        if self.lr_schedule == "warmup_cosine":
            _rule(self.max_steps is not None, w + "max_steps", self.max_steps,
                  "set for lr_schedule 'warmup_cosine' (its total steps)")
            _rule(self.warmup_steps < self.max_steps, w + "warmup_steps", self.warmup_steps,
                  f"< max_steps={self.max_steps}")
        _rule(self.checkpoint_dir != "", w + "checkpoint_dir", self.checkpoint_dir, "a non-empty path")
        _rule(self.init_checkpoint != "", w + "init_checkpoint", self.init_checkpoint, "null or a path")
        _rule(self.seed >= 0, w + "seed", self.seed, ">= 0")
        _rule(self.device == "auto" or DEVICE_NAME.fullmatch(self.device) is not None,
              w + "device", self.device, "'auto', 'cpu', 'cuda' or 'cuda:N'")
        object.__setattr__(self, "_built", True)

    def __setattr__(self, name: str, value: Any) -> None:
        # precision/mixed_precision and checkpointing/enable_gradient_checkpointing say one
        # thing twice: once built, setting one sets its partner, so that a config changed by
        # attribute saves a file that loads back (the stale partner once contradicted it)
        object.__setattr__(self, name, value)
        if not self.__dict__.get("_built"):
            return
        if name == "precision" and isinstance(value, str):
            object.__setattr__(self, "mixed_precision", value != "fp32")
        elif name == "mixed_precision" and isinstance(value, bool):
            if value != (self.precision != "fp32"):
                object.__setattr__(self, "precision", "bf16" if value else "fp32")
        elif name == "checkpointing" and isinstance(value, str):
            object.__setattr__(self, "enable_gradient_checkpointing", value != "none")
        elif name == "enable_gradient_checkpointing" and isinstance(value, bool):
            if value != (self.checkpointing != "none"):
                object.__setattr__(self, "checkpointing", "full" if value else "none")

    def _check_test_sentences(self) -> None:
        """Each entry a mapping of exactly text, language and reference (non-empty strings);
        whether the clip, the language and the length suit the model is checked when a
        run starts (``pyxtts.speak.check_test_sentences``), where the XTTS folder is read."""
        if self.test_sentences is None:
            return
        _rule(self.xtts_dir is not None, "training.xtts_dir", self.xtts_dir,
              "the Coqui XTTS folder the run fine-tunes when training.test_sentences is set (its model "
              "speaks them)")
        keys = ("text", "language", "reference")
        for i, entry in enumerate(self.test_sentences):
            where = f"training.test_sentences[{i}]"
            if not isinstance(entry, Mapping):
                raise TypeError(f"{where}: expected a mapping with keys {', '.join(keys)}, got {entry!r}")
            for key in entry:
                if key == "speaker_wav":  # Coqui's GPTTrainerConfig names the voice so, as a list of files
                    raise ValueError(f"{where}: unknown key 'speaker_wav' (Coqui's name); pyxtts takes one recording "
                                     "of the voice as 'reference', a path (not a list), with 'text' and 'language'")
                if key not in keys:
                    raise _unknown_key(where, key, list(keys))
            for key in keys:
                v = entry.get(key)
                if not isinstance(v, str) or not v.strip():
                    raise (TypeError if v is not None and not isinstance(v, str) else ValueError)(
                        f"{where}.{key}: expected a non-empty string, got {v!r}")

    def set_max_steps(self, max_steps: int) -> str | None:
        """Sets ``max_steps`` (e.g. from ``--max-steps``) and checks the section again.
        A warmup that no longer fits the shorter run (``warmup_steps >= max_steps``) keeps
        the share of the run it had (rounded up, at most ``max_steps - 1``) instead of
        being refused; the returned note says so (None when nothing else changed)."""
        old_max, old_warmup = self.max_steps, self.warmup_steps
        if isinstance(max_steps, numbers.Integral) and not isinstance(max_steps, (bool, np.bool_)):
            max_steps = int(max_steps)  # np.int64 too
        ok = isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps >= 1
        note = None
        if ok and self.lr_schedule == "warmup_cosine" and old_warmup >= max_steps:
            share = old_warmup / old_max if old_max else 1.0
            self.warmup_steps = min(max_steps - 1, math.ceil(share * max_steps))
            note = (f"training.warmup_steps {old_warmup} does not fit max_steps {max_steps}: scaled to "
                    f"{self.warmup_steps}, the same share of the run as {old_warmup} of {old_max}")
        self.max_steps = max_steps
        try:
            self.__post_init__()
        except (TypeError, ValueError):
            self.max_steps, self.warmup_steps = old_max, old_warmup
            raise
        return note

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        from pyxtts import _C

        return "cuda:0" if _C.cuda_available() else "cpu"


@dataclass
class DataConfig:
    """Batches: micro-batch size, longest sequences, bucketing, shuffling, files."""

    batch_size: int = 4  # micro-batch; the effective batch is this x gradient_accumulation_steps
    max_text_tokens: int | None = None  # None: the model's max_text_tokens
    max_audio_tokens: int | None = None  # None: the model's max_audio_tokens
    bucketing: bool = True  # batch samples of similar length together
    bucket_size_multiplier: int = 10  # a bucket holds this many batches before it is split
    shuffle: bool = True
    shuffle_seed: int = 0  # the data order's seed, and the reference slices' (pyxtts.references)
    # with the conditioning path and samples cut from their own clip: the codes a step's
    # reference slice covers are not targets (Coqui's gpt_use_masking_gt_prompt_approach)
    mask_reference_targets: bool = True
    # threads collating the next batches while a step runs; 0: in the loop. 4: at XTTS v2's
    # sizes one thread draws the reference slices and computes their mels for a batch of 8 in
    # ~130 ms (16 ms a 6 s slice, NumPy), the step takes 57 ms on an H200: 2 threads keep the
    # GPU busy 88 % at most, 3 collate 1.3x as fast as it steps, 4 1.8x (tests/bench/bench_run.py)
    num_workers: int = 4
    train_metadata: str | None = None  # e.g. LJSpeech-style "metadata.csv"
    eval_metadata: str | None = None

    def __post_init__(self) -> None:
        _check_types(self, "data")
        w = "data."
        _rule(self.batch_size >= 1, w + "batch_size", self.batch_size, ">= 1")
        for name in ("max_text_tokens", "max_audio_tokens"):
            v = getattr(self, name)
            _rule(v is None or v >= 1, w + name, v, ">= 1 or null")
        _rule(self.bucket_size_multiplier >= 1, w + "bucket_size_multiplier", self.bucket_size_multiplier, ">= 1")
        _rule(self.shuffle_seed >= 0, w + "shuffle_seed", self.shuffle_seed, ">= 0")
        _rule(self.num_workers >= 0, w + "num_workers", self.num_workers, ">= 0")


@dataclass
class XTTSConfig:
    """The whole configuration: ``model`` (a ``ModelConfig``), ``training``, ``data``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self) -> None:
        for name, cls in (("model", ModelConfig), ("training", TrainingConfig), ("data", DataConfig)):
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"{name}: expected a {cls.__name__}, got {type(getattr(self, name)).__name__}")
        m, d = self.model, self.data
        if d.max_text_tokens is None:
            d.max_text_tokens = m.max_text_tokens
        if d.max_audio_tokens is None:
            d.max_audio_tokens = m.max_audio_tokens
        _rule(d.max_text_tokens <= m.max_text_tokens, "data.max_text_tokens", d.max_text_tokens,
              f"<= model.max_text_tokens={m.max_text_tokens}")
        _rule(d.max_audio_tokens <= m.max_audio_tokens, "data.max_audio_tokens", d.max_audio_tokens,
              f"<= model.max_audio_tokens={m.max_audio_tokens}")
        seq = m.n_cond_latents + d.max_text_tokens + d.max_audio_tokens
        _rule(seq <= m.max_attention_sequence_length, "model.max_attention_sequence_length",
              m.max_attention_sequence_length,
              f">= n_cond_latents + data.max_text_tokens + data.max_audio_tokens = {seq}")

    def __setattr__(self, name: str, value: Any) -> None:
        # cfg.model = other: the data's longest sequences followed the old model's maxima
        # (filled in when built), so they follow the new one's; one set lower stays, capped
        # at the new model's (as with_model does)
        old = self.__dict__.get("model")
        object.__setattr__(self, name, value)
        data = self.__dict__.get("data")
        if name != "model" or not isinstance(old, ModelConfig) or not isinstance(value, ModelConfig) \
                or not isinstance(data, DataConfig):
            return
        for cap in ("max_text_tokens", "max_audio_tokens"):
            mine = getattr(data, cap)
            if mine is not None and (mine == getattr(old, cap) or mine > getattr(value, cap)):
                setattr(data, cap, getattr(value, cap))

    def validate(self) -> "XTTSConfig":
        """Every check of loading, again, on the config as it is now: one changed by
        attribute (``config.data.batch_size = "8"``) is refused as that file would be.
        ``Trainer`` calls it; returns the config."""
        for name, cls in (("model", ModelConfig), ("training", TrainingConfig), ("data", DataConfig)):
            section = getattr(self, name)
            if not isinstance(section, cls):
                raise TypeError(f"{name}: expected a {cls.__name__}, got {type(section).__name__}")
            section.__post_init__()
        self.__post_init__()
        return self

    # ---- derived --------------------------------------------------------------
    @property
    def effective_batch_size(self) -> int:
        return self.data.batch_size * self.training.gradient_accumulation_steps

    @property
    def sequence_length(self) -> int:
        """The longest sequence the data allows: cond latents + text + audio."""
        return self.model.n_cond_latents + self.data.max_text_tokens + self.data.max_audio_tokens

    def memory_plan(self, device: str | None = None, memory: int | str | None = None, *,
                    world_size: int | None = None, nodes: int | None = None):
        """``plan_for(self, device, memory=memory, world_size=..., nodes=...)``: the plan of
        one training step as configured, at the longest sequences, the AdamW state counted
        where it lives (and, for one of several processes, their collectives' memory)."""
        return plan_for(self, device, memory=memory, world_size=world_size, nodes=nodes)

    # ---- dict / YAML ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        def plain(v: Any) -> Any:
            if isinstance(v, tuple):
                return [plain(x) for x in v]
            if isinstance(v, list):
                return [plain(x) for x in v]
            return v

        return {name: {f.name: plain(getattr(getattr(self, name), f.name)) for f in fields(getattr(self, name))}
                for name in ("model", "training", "data")}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "XTTSConfig":
        if d is None:
            d = {}
        if not isinstance(d, Mapping):
            raise TypeError(f"config: expected a mapping with sections model, training, data; got {d!r}")
        sections = {"model": ModelConfig, "training": TrainingConfig, "data": DataConfig}
        raw: dict[str, dict[str, Any]] = {}
        for key, value in d.items():
            if key not in sections:
                raise _unknown_key("config", key, list(sections))
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise TypeError(f"{key}: expected a mapping of fields, got {value!r}")
            raw[key] = dict(value)
        # recipes keep enable_gradient_checkpointing in the model section: move it
        model_raw = raw.setdefault("model", {})
        if "enable_gradient_checkpointing" in model_raw:
            train_raw = raw.setdefault("training", {})
            if "enable_gradient_checkpointing" in train_raw:
                raise ValueError("enable_gradient_checkpointing: given in both model and training; keep one")
            train_raw["enable_gradient_checkpointing"] = model_raw.pop("enable_gradient_checkpointing")
        built: dict[str, Any] = {}
        for name, sc in sections.items():
            values = raw.get(name, {})
            valid = [f.name for f in fields(sc)]
            for key in values:
                if key not in valid:
                    raise _unknown_key(name, key, valid)
            built[name] = sc(**values)
        return cls(**built)

    def to_yaml(self) -> str:
        """Block style throughout, lists of numbers on one line (``betas: [0.9, 0.96]``)."""
        return _yaml_text(self.to_dict())

    @classmethod
    def from_yaml(cls, text: str) -> "XTTSConfig":
        import yaml

        try:
            d = yaml.load(text, Loader=_yaml_loader())
        except yaml.YAMLError as exc:
            raise ValueError(f"config: not valid YAML: {exc}") from exc
        return cls.from_dict(d)

    def save(self, path: str | Path) -> None:
        """Writes the config as YAML (every field, aliases resolved). Relative paths
        (``PATH_FIELDS``; in memory relative to the working directory) are written
        relative to the file's folder, where ``load`` looks for them. A config that
        ``load`` would refuse (a field changed by attribute to a bad value) is refused here,
        with nothing written. The file is written atomically (``pyxtts._files.write_atomic``;
        its folder must exist): a full disk leaves a file that was there whole, and is an
        OSError naming the file and the cause."""
        self.validate()
        path = path_arg("path", path)
        folder = os.path.abspath(path.parent)
        d = self.to_dict()
        for section, name in PATH_FIELDS:
            v = d[section][name]
            if v is not None and not os.path.isabs(v):
                d[section][name] = os.path.relpath(os.path.abspath(v), folder)
        text = _yaml_text(d)
        write_atomic(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"), make_folder=False)

    @classmethod
    def load(cls, path: str | Path, defaults: Mapping[str, Mapping[str, Any]] | None = None) -> "XTTSConfig":
        """Reads a YAML file; a shipped config may be named by its stem ("standard").
        A relative path in the file (``PATH_FIELDS``) is relative to the file's folder and
        becomes one relative to the working directory (or absolute); the shipped configs'
        paths are relative to the working directory. An unreadable file is an ``OSError``
        naming it; a path that is neither a file nor a shipped config's name is a
        ``FileNotFoundError`` suggesting the closest shipped name (or listing them). A file
        may start from another: ``base: NAME_OR_PATH`` (a shipped config's name, or a path
        relative to the file's folder) takes that file's sections, and this file's keys
        replace theirs one by one (the shipped tiers are ``base: xtts_v2_finetune`` plus their
        batch, precision and checkpointing). ``defaults``: values by section
        (``{"training": {"xtts_dir": "XTTS-v2"}}``, paths relative to the working directory)
        for the fields the file leaves unset or null, in place before the fields are checked
        (``train --init`` gives its folder as the ``xtts_dir`` test sentences need)."""
        d = _load_raw(path_arg("path", path), ())
        for section, values in (defaults or {}).items():
            if d.get(section) is None or isinstance(d[section], Mapping):  # else from_dict says what it is
                own = dict(d.get(section) or {})
                d[section] = {**own, **{k: v for k, v in values.items() if own.get(k) is None}}
        return cls.from_dict(d)

    def replace(self, **sections: Any) -> "XTTSConfig":
        """A copy with whole sections replaced (``cfg.replace(data=...)``)."""
        return dataclasses.replace(self, **sections)

    def with_model(self, model: ModelConfig) -> "XTTSConfig":
        """A copy training ``model`` (e.g. a checkpoint's own config) with this config's
        training and data settings; the data's longest sequences are capped at the
        model's (a tier written for XTTS v2's 404 text positions, say, given a smaller GPT)."""
        d = self.data
        data = dataclasses.replace(
            d, max_text_tokens=None if d.max_text_tokens is None else min(d.max_text_tokens, model.max_text_tokens),
            max_audio_tokens=None if d.max_audio_tokens is None else min(d.max_audio_tokens, model.max_audio_tokens))
        return dataclasses.replace(self, model=model, data=data)


def _yaml_word(value: Any) -> str:
    """A setting as the YAML file spells it: true, false, null, auto, [0.9, 0.96]."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_word(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_word(v)}" for k, v in value.items()) + "}"
    return str(value)


# YAML 1.2 floats: PyYAML follows YAML 1.1, where a float needs a dot, so "2e-3" and
# "1e-8" (how learning rates are written) would be strings.
_FLOAT_12 = re.compile(r"""^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$""")


@functools.cache
def _yaml_loader() -> type:
    """PyYAML's safe loader read as YAML 1.2 does: ``2e-3`` is a float, and only
    true/false are booleans (YAML 1.1's yes/no/on/off made ``language: no``, Norwegian,
    the boolean False)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))
    return Loader


@functools.cache
def _yaml_dumper() -> type:
    """PyYAML's safe dumper writing every list in flow style and every mapping in block style."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))
    return Dumper


def _yaml_text(d: dict[str, Any]) -> str:
    import yaml

    return yaml.dump(d, Dumper=_yaml_dumper(), sort_keys=False, default_flow_style=False)


def _config_path(path: Path, where: str) -> Path:
    """``path``, or the shipped config of that name ("standard") when there is no such file.
    Neither is a ``FileNotFoundError`` starting with ``where`` that names the path and the
    closest shipped name (or all of them)."""
    if path.exists():
        return path
    shipped = shipped_configs()
    if path.suffix == "" and path.name in shipped:
        return shipped[path.name]
    name = path.stem if path.suffix in (".yaml", ".yml") else path.name
    close = difflib.get_close_matches(name, list(shipped), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"the shipped configs are {', '.join(shipped)}"
    raise FileNotFoundError(f"{where}: {str(path)!r} is neither a file nor a shipped config's name; {hint}")


def _rebase_references(d: dict, folder: Path) -> dict:
    """training.test_sentences' reference clips, relative to ``folder`` (as PATH_FIELDS)."""
    sec = d.get("training")
    entries = sec.get("test_sentences") if isinstance(sec, Mapping) else None
    if not isinstance(entries, list):
        return d
    out = []
    for e in entries:
        ref = e.get("reference") if isinstance(e, Mapping) else None
        if isinstance(ref, str) and ref and not os.path.isabs(ref):
            e = {**e, "reference": os.path.abspath(os.path.join(folder, ref))}
        out.append(e)
    return {**d, "training": {**sec, "test_sentences": out}}


def _load_raw(path: Path, chain: tuple[Path, ...], where: str = "config") -> dict[str, Any]:
    """The sections of a YAML config file as a dict, its ``base`` merged in (key by key,
    this file's winning) and its relative paths made relative to the working directory.
    ``where`` starts the message when there is no such file."""
    import yaml

    p = _config_path(path, where)
    if p.is_dir():
        raise IsADirectoryError(21, f"{where}: {str(p)!r} is a folder, not a YAML config file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: {str(p)!r} is not UTF-8 text (byte {exc.start}): not a YAML config") from exc
    try:
        d = yaml.load(text, Loader=_yaml_loader())
    except yaml.YAMLError as exc:
        # the parser's own first line names "<unicode string>": the file's name instead
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"{where}: {str(p)!r} is not valid YAML{at}: {problem}") from exc
    if d is None:
        raise ValueError(f"{where}: {str(p)!r} is empty: give at least one section (model, training, data) "
                         "or base: NAME")
    if not isinstance(d, Mapping):
        raise TypeError(f"{where}: expected a mapping with sections model, training, data; got {d!r}")
    d = dict(d)
    if p.resolve().parent != CONFIGS_DIR:
        for section, name in PATH_FIELDS:
            sec = d.get(section)
            v = sec.get(name) if isinstance(sec, Mapping) else None
            if isinstance(v, str) and not os.path.isabs(v):
                d[section] = {**sec, name: os.path.normpath(os.path.join(p.parent, v))}
        d = _rebase_references(d, p.parent)
    if "base" not in d:
        return d
    base = d.pop("base")
    if not isinstance(base, str) or not base:
        raise TypeError(f"{p}: base: expected the name of a shipped config or a path, got {base!r}")
    here = p.resolve()
    if here in chain:
        raise ValueError(f"{p}: base: configs inherit in a circle: " + " -> ".join(str(c) for c in (*chain, here)))
    bp = Path(base)
    if not bp.is_absolute() and (p.parent / bp).exists():
        bp = p.parent / bp
    merged = _load_raw(bp, (*chain, here), f"{p}: base")
    for key, value in d.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def shipped_configs() -> dict[str, Path]:
    """stem -> path of the YAML files in ``pyxtts/configs``."""
    return {p.stem: p for p in sorted(CONFIGS_DIR.glob("*.yaml"))}


# The shipped tiers by the card size (GiB) each is planned for, largest first: Coqui's whole
# recipe, each with optimize_config's settings for its size.
SIZE_TIERS = {"large_gpu": 80, "gpu_24gb": 24, "gpu_16gb": 16, "gpu_12gb": 12, "gpu_8gb": 8, "gpu_6gb": 6,
              "gpu_4gb": 4}


def tier_for(total_memory: int) -> str:
    """The shipped tier for a card of ``total_memory`` bytes: the largest whose size it
    has, counting 90% of the size as having it (a card reports somewhat less than its
    label: 11.6 GiB for a 12 GB one); ``gpu_4gb`` below that."""
    total_memory = integer("total_memory", total_memory, minimum=0)
    return next((name for name, gib in SIZE_TIERS.items() if total_memory >= 0.9 * gib * 2**30), "gpu_4gb")


# ---- one plan for a config ----------------------------------------------------------

def _device_total(device: str, memory: int | str | None) -> int:
    """``memory`` in bytes, else the total memory of ``device`` (which must be here)."""
    if memory is not None:
        return parse_memory_size(memory)
    from pyxtts import _C

    if not device_present(device):
        raise ValueError(f"device: {device} is not in this machine; to plan for it elsewhere give its memory "
                         "(--memory 8GiB, say)")
    return int(_C.device_info(device)["total_memory"])


def _on_gpu(device: str | int) -> bool:
    """Whether ``device`` names a GPU ("cuda", "cuda:N", or an int N as the C layer takes it)."""
    return (isinstance(device, int) and not isinstance(device, bool)) or str(device).startswith("cuda")


def device_present(device: str) -> bool:
    """Whether ``device`` is in this machine (and this build); a ValueError for a name that
    is no device's ("gpu"), which is not a device elsewhere either."""
    from pyxtts import _C

    if not (isinstance(device, int) and not isinstance(device, bool)) and \
            DEVICE_NAME.fullmatch(str(device)) is None:
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    try:
        _C.device_info(device)
    except ValueError:
        return False
    return True


def offload_for(config: XTTSConfig, device: str | None = None, memory: int | str | None = None,
                budget: int | None = None, *, world_size: int | None = None, nodes: int | None = None) -> bool:
    """Whether the run of ``config`` on ``device`` keeps AdamW's state in host memory:
    ``training.optimizer_offload`` when true or false; "auto" resolved: never on the CPU
    (host memory is its memory), else only when the plan without offload is over
    ``budget`` (bytes; default ``memory``, else the device's total, x
    ``max_memory_fraction``). ``world_size``/``nodes``: as ``plan_for`` (the collectives
    of several processes take device memory too)."""
    t = config.training
    if t.optimizer_offload != "auto":
        return bool(t.optimizer_offload)
    dev = t.resolved_device() if device is None else device
    if not _on_gpu(dev):
        return False
    if budget is None:
        if memory is None and not device_present(dev):
            raise ValueError(f"training.optimizer_offload: 'auto' decides by the memory of {dev}, which is not in "
                             "this machine: give its memory (memory='8GiB') or set "
                             "optimizer_offload true or false")
        budget = int(_device_total(dev, memory) * t.max_memory_fraction)
    return plan_for(config, dev, offload=False, world_size=world_size, nodes=nodes).total > budget


def plan_for(config: XTTSConfig, device: str | None = None, *, micro_batch: int | None = None,
             checkpointing: str | None = None, precision: str | None = None, offload: bool | None = None,
             memory: int | str | None = None, world_size: int | None = None, nodes: int | None = None):
    """The memory plan (``pyxtts.MemoryPlan``) of one training step of ``config`` on
    ``device`` (default: ``training.device`` resolved): its micro-batch, checkpointing,
    precision and optimizer placement unless given, the longest sequences the data
    allows, the conditioning path over its longest reference mel, a default AdamW's state
    counted (on the device, or with ``offload`` in the host pool). ``offload=None`` is
    ``offload_for(config, device, memory)``. Nothing is allocated: the plan for
    ``cuda:0`` is computed on any machine, a CPU-only build included (the CUDA backend's
    workspace sizes are in every build).

    ``world_size``: the plan of one of that many processes (``nodes`` machines, default 1)
    training together (``pyxtts.distributed``): their collectives' memory on this device
    (``pyxtts.comm_memory``: NCCL's estimated, gloo's) is the plan's ``communication`` and
    is in its ``total``. None: this process's world (torchrun's ``WORLD_SIZE`` when it
    started this one as one of several, else 1). One process's plan is the step's alone."""
    t, d, m = config.training, config.data, config.model
    dev = t.resolved_device() if device is None else device
    world, per_node = world_of(world_size, nodes)
    if memory is not None:  # checked wherever it is used: offload_for reads it only on a GPU
        parse_memory_size(memory)
    if offload is None:
        offload = offload_for(config, dev, memory, world_size=world_size, nodes=nodes)
    plan = estimate_memory(m, d.batch_size if micro_batch is None else micro_batch, d.max_text_tokens,
                           d.max_audio_tokens, cond_len=m.n_cond_latents, cond_frames=m.planned_cond_frames,
                           checkpointing=t.checkpointing if checkpointing is None else checkpointing, train=True,
                           device=dev, optimizer=True, precision=t.precision if precision is None else precision,
                           offload=bool(offload))
    comm = device_communication(dev, world, per_node)  # None for one process
    if comm is None:
        return plan
    return dataclasses.replace(plan, world_size=world, communication=comm.total, communication_backend=comm.backend,
                               total=plan.total + comm.total)


# ---- memory sizes ---------------------------------------------------------------

_UNITS = {"": 1, "b": 1,
          "k": 2**10, "kib": 2**10, "kb": 10**3,
          "m": 2**20, "mib": 2**20, "mb": 10**6,
          "g": 2**30, "gib": 2**30, "gb": 10**9,
          "t": 2**40, "tib": 2**40, "tb": 10**12}


def decimal_unit_note(value: Any) -> str:
    """For a size given in decimal units ("8GB": 8 x 10^9 bytes, 7.45 GiB), what a card sold
    as that many GB has: its memory is binary (8 GiB). "" for any other value."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT])[bB]\s*", value) if isinstance(value, str) else None
    if m is None:
        return ""
    return (f"; {value.strip()} is decimal ({m.group(2).upper()}B = 10^{3 * 'KMGT'.index(m.group(2).upper()) + 3} "
            f"bytes): a card sold as {m.group(1)} {m.group(2).upper()}B has {m.group(1)} "
            f"{m.group(2).upper()}iB, --memory {m.group(1)}{m.group(2).upper()}iB")


def parse_memory_size(value: int | str, name: str = "memory") -> int:
    """Bytes from 12884901888, "12GiB", "12 GiB", "12G" (binary) or "12GB" (SI)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected bytes (int) or a size like '12GiB', got {value!r}")
    if isinstance(value, (numbers.Integral, float)) and not (isinstance(value, float) and not value.is_integer()):
        n = int(value)  # bytes, however few (a string without a unit is refused below 1 MiB)
    elif isinstance(value, str):
        if re.fullmatch(r"\s*-\s*\d+(?:\.\d+)?\s*[a-zA-Z]*\s*", value):
            raise ValueError(f"{name}: must be > 0 bytes, got {value!r}")
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        if m is not None and not m.group(2) and 0 < Fraction(m.group(1)) < 2**20:
            # "8" from a command line is 8 bytes: far more likely a unit left out; "4096" is
            # nvidia-smi's MiB, not 4 TiB
            unit = "GiB" if Fraction(m.group(1)) < 1024 else "MiB"
            raise ValueError(f"{name}: {value.strip()!r} would be {value.strip()} bytes; give a unit, e.g. "
                             f"'{value.strip()}{unit}'")
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{name}: must be bytes or a number with a unit (B, KiB, MiB, GiB, TiB, "
                             f"K, M, G, T, KB, MB, GB, TB), got {value!r}")
        # exact: a float product loses bytes ("4.35GB" would be 4349999999, 20 digits worse)
        n = int(Fraction(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise TypeError(f"{name}: expected bytes (int) or a size like '12GiB', got {value!r}")
    if n <= 0:
        raise ValueError(f"{name}: must be > 0 bytes, got {value!r}")
    return n


# ---- optimize_config ------------------------------------------------------------

# Relative time of a training step, the figures optimize_config ranks plans by.
# Recomputation: "selective" redoes layernorms and GELU (cheap, memory-bound), "full"
# redoes each block's forward (training is ~3 forwards, so ~4/3).
RECOMPUTE_COST = {"none": 1.0, "selective": 1.05, "full": 4.0 / 3.0}
# Each micro-step pays a fixed price (kernel launches, reading every weight once,
# narrower GEMMs), modelled as this fraction of one sample's compute.
MICRO_STEP_OVERHEAD = 0.25
DEFAULT_MARGIN = 0.10
# Coqui's XTTS v2 recipe steps micro-batches of 3: optimize_config turns the optimizer
# offload on to reach it (or to fit at all), never merely to grow a micro-batch further.
COQUI_MICRO_BATCH = 3


def _divisors(n: int) -> list[int]:
    return sorted((d for d in range(1, n + 1) if n % d == 0), reverse=True)


def _step_cost(policy: str, micro: int) -> float:
    return RECOMPUTE_COST[policy] * (1.0 + MICRO_STEP_OVERHEAD / micro)


def offload_traffic(n_params: int, precision: str) -> tuple[int, int]:
    """Bytes one offloaded optimizer step moves: fp32 gradients down to the host, and the
    compute-precision parameters back up (each over every parameter)."""
    return 4 * n_params, (4 if precision == "fp32" else 2) * n_params


def optimize_config(config: XTTSConfig, device_memory: int | str | None = None, *,
                    margin: float = DEFAULT_MARGIN, keep_precision: bool = False,
                    device: str | None = None, world_size: int | None = None,
                    nodes: int | None = None) -> tuple[XTTSConfig, str]:
    """Chooses precision, checkpoint policy, micro-batch, accumulation steps and where
    AdamW's state lives so that the memory plan of a step fits ``device_memory ×
    max_memory_fraction`` with ``margin`` to spare, keeping the effective batch
    (micro-batch × accumulation).

    ``device_memory`` (bytes or "12GiB"): default, the total memory of the config's
    device; given, the device need not be in this machine (``device="cuda"`` plans for a
    GPU elsewhere). Plans come from ``plan_for`` (nothing is allocated), with the AdamW
    state and the longest sequences the data config allows. Candidates: every
    micro-batch dividing the effective batch, policies none/selective/full, precisions
    fp32 and bf16 (only the configured one with ``keep_precision=True`` or when it is
    fp16; on a GPU of this machine older than Ampere, which has no bfloat16, fp16 takes
    bf16's place, and ``keep_precision=True`` with bf16 is an error); they are ranked by an estimated step time (recomputation × per-micro-step
    overhead, see ``RECOMPUTE_COST``), ties going to the configured precision, then
    fp32. The optimizer's state stays on the device unless ``training.optimizer_offload``
    says true, or says "auto" (on a GPU) and no plan with the state on the device fits,
    or none reaches Coqui's micro-batch of 3 (``COQUI_MICRO_BATCH``) while one with it in
    host memory does; for a GPU the new config says true or false. ``world_size``/``nodes``:
    the config of one of that many processes (``plan_for``): their collectives' memory is
    counted in every plan, and the effective batch stays the global one. Returns
    ``(new_config, explanation)``; raises ``ValueError`` when not even the smallest plan fits."""
    if not isinstance(config, XTTSConfig):
        raise TypeError(f"config: expected an XTTSConfig, got {type(config).__name__}")
    margin = real("margin", margin, minimum=0.0, maximum=1.0, below=True)
    from pyxtts.memory import format_bytes as fb

    keep_precision = flag("keep_precision", keep_precision)
    world, per_node = world_of(world_size, nodes)
    world_size, nodes = world, -(-world // per_node)  # resolved once: every plan below is of this world
    t = config.training
    dev = t.resolved_device() if device is None else device
    total = _device_total(dev, device_memory)
    source = f"total memory of {dev}" if device_memory is None else "given" + decimal_unit_note(device_memory)
    budget = int(total * t.max_memory_fraction)
    limit = int(budget * (1.0 - margin))
    effective = config.effective_batch_size
    # a GPU here without bfloat16 (older than Ampere) gets float16 in its place
    no_bf16 = precision_problem("bf16", dev)
    if no_bf16 and keep_precision and t.precision == "bf16":
        raise ValueError(f"optimize_config: keep_precision=True, but {no_bf16}")
    half = "fp16" if no_bf16 else "bf16"
    if keep_precision or t.precision == "fp16":
        precisions = [t.precision]
    else:
        start = half if t.precision == "bf16" else t.precision
        precisions = [start] + [p for p in ("fp32", half) if p != start]
    on_gpu = _on_gpu(dev)
    # on the CPU the host's memory is the device's: the state in it would be counted twice
    placements = ([False] if not on_gpu else [bool(t.optimizer_offload)] if t.optimizer_offload != "auto"
                  else [False, True])
    cands = []
    for pi, prec in enumerate(precisions):
        for policy in ("none", "selective", "full"):
            for micro in _divisors(effective):
                cands.append((_step_cost(policy, micro), pi, prec, policy, micro))
    cands.sort(key=lambda c: (c[0], c[1]))
    plans: dict[tuple[str, str, int, bool], Any] = {}

    def plan(prec: str, policy: str, micro: int, off: bool):
        key = (prec, policy, micro, off)
        if key not in plans:
            plans[key] = plan_for(config, dev, micro_batch=micro, checkpointing=policy, precision=prec, offload=off,
                                  world_size=world_size, nodes=nodes)
        return plans[key]

    def cheapest(off: bool, min_micro: int = 1):
        if off not in placements:
            return None
        return next(((c, off) for c in cands if c[4] >= min_micro and plan(c[2], c[3], c[4], off).total <= limit),
                    None)

    target = min(COQUI_MICRO_BATCH, effective)
    chosen = cheapest(False)
    if True in placements and (chosen is None or cheapest(False, target) is None):
        # the state on the device does not fit, or keeps the micro-batch below Coqui's
        chosen = cheapest(True, target) or chosen or cheapest(True)
    seq = config.sequence_length
    if chosen is None:
        off = placements[-1]
        smallest = min(((plan(p, "full", 1, off).total, p) for p in precisions))
        where = " with the optimizer's state in host memory" if off else ""
        least = plan(smallest[1], "full", 1, off)
        if least.communication:  # say how much of it is the collectives', and how to lower that
            where += (f" (of it {fb(least.communication)} {least.communication_label}, one of {world_size} "
                      "processes; docs/distributed.md says how to lower it)")
        hint = ("" if off or not on_gpu else
                "; training.optimizer_offload true (or auto) keeps the optimizer's state in host memory")
        raise ValueError(
            f"optimize_config: no plan fits: the smallest, micro-batch 1 with full checkpointing in "
            f"{smallest[1]}{where} at {seq} tokens ({_sequence_parts(config)}), needs {fb(smallest[0])}, over "
            f"the budget of {fb(limit)} ({fb(total)} x max_memory_fraction {t.max_memory_fraction:g} less a "
            f"{margin:.0%} margin){hint}; lower data.max_text_tokens/max_audio_tokens, use a smaller model "
            "or a device with more memory")
    (cost, _, prec, policy, micro), off = chosen
    accum = effective // micro
    d = config.data
    new = XTTSConfig(
        model=dataclasses.replace(config.model),
        training=dataclasses.replace(t, precision=prec, mixed_precision=prec != "fp32",
                                     checkpointing=policy, enable_gradient_checkpointing=policy != "none",
                                     gradient_accumulation_steps=accum,
                                     # on the CPU "auto" stays, true is false: host memory is its memory
                                     optimizer_offload=(off if on_gpu else "auto" if t.optimizer_offload == "auto"
                                                        else False),
                                     lr_milestones=list(t.lr_milestones)),
        data=dataclasses.replace(d, batch_size=micro),
    )
    used = plan(prec, policy, micro, off)
    best = min(cands, key=lambda c: (c[0], c[1]))
    why = []
    if (policy, micro) == (best[3], best[4]):
        why.append("it is the cheapest candidate: no recomputation, the whole effective batch at once")
    else:
        cheaper = [c for c in cands if (c[0], c[1]) < (cost, precisions.index(prec))]
        # with the state in host memory for Coqui's micro-batch, a cheaper plan may fit only
        # below that micro-batch: it was passed over for it, not for its memory
        below = [c for c in cheaper if c[4] < target and plan(c[2], c[3], c[4], off).total <= limit]
        unfit = [c for c in cheaper if c not in below]
        top = sorted(unfit, key=lambda c: plan(c[2], c[3], c[4], off).total)[:1]
        if unfit:
            why.append(f"{len(unfit)} cheaper candidate(s) do not fit"
                       + (f" (the smallest of them, {top[0][2]} {top[0][3]} micro-batch {top[0][4]}, needs "
                          f"{fb(plan(top[0][2], top[0][3], top[0][4], off).total)})" if top else ""))
        if below:
            c = below[0]
            why.append(f"{len(below)} cheaper candidate(s) fit only below Coqui's micro-batch of {target} (the "
                       f"cheapest, {c[2]} {c[3]} micro-batch {c[4]}, needs {fb(plan(c[2], c[3], c[4], off).total)}): "
                       "with the optimizer's state in host memory the micro-batch is kept at Coqui's")
    if prec != t.precision and no_bf16 and t.precision == "bf16":
        why.append(f"precision changed from bf16 to {prec}: {dev} has no bfloat16 (compute capability "
                   "under 8.0)" + (", and fp32 lets a cheaper plan fit" if prec == "fp32" else ""))
    elif prec != t.precision:
        why.append(f"precision changed from {t.precision} to {prec}: it lets a cheaper plan fit")
    if off and t.optimizer_offload == "auto":
        why.append("the optimizer's state goes to host memory: on the device no plan fits"
                   if cheapest(False) is None else
                   f"the optimizer's state goes to host memory: on the device no micro-batch of {target} fits")
    lines = [
        f"device memory:      {fb(total)} ({source})",
        f"budget:             {fb(budget)} (x max_memory_fraction {t.max_memory_fraction:g})",
        f"plan limit:         {fb(limit)} (budget less a {margin:.0%} margin)",
        f"longest sequence:   {seq} tokens ({_sequence_parts(config)}), AdamW state counted",
        f"effective batch:    {effective} (kept)",
        f"chosen:             precision {prec}, checkpointing {policy}, micro-batch {micro} x "
        f"{accum} accumulation step(s), optimizer state "
        + ("in host memory" if off else "on the device")
        + f" (optimizer_offload: {_yaml_word(new.training.optimizer_offload)} in the output)",
        f"plan total:         {fb(used.total)} on the device ({used.total / limit:.0%} of the limit)"
        + (f", {fb(used.host_total)} of host memory ({'page-locked' if used.host_pinned else 'pageable'})"
           if used.host_total else ""),
        f"estimated step cost: {cost:.3f} (1.0 = no recomputation, no per-micro-step overhead)",
        *([f"communication:      {fb(used.communication)} per process in the plan total "
           f"({used.communication_label[len('communication ('):-1]}; {world} processes"
           f"{f' on {nodes} machines' if nodes > 1 else ''}; docs/distributed.md)"] if used.communication else []),
        f"was:                precision {t.precision}, checkpointing {t.checkpointing}, micro-batch "
        f"{d.batch_size} x {t.gradient_accumulation_steps}, optimizer_offload {_yaml_word(t.optimizer_offload)}",
        "why:                " + "; ".join(why),
    ]
    if off:
        down, up = offload_traffic(used.parameter_count, prec)
        lines.append(f"offload cost:       per optimizer step (once every {accum} micro-batch(es)) "
                     f"{fb(down)} of gradients down and {fb(up)} of parameters up, and AdamW over "
                     f"{used.parameter_count / 1e6:.0f} M parameters on the CPU "
                     "(tests/bench/bench_offload.py measures both on a machine)")
    return new, "\n".join(lines)


def _sequence_parts(config: XTTSConfig) -> str:
    """'32 cond + 404 text + 608 audio': the parts of the longest sequence."""
    d = config.data
    return f"{config.model.n_cond_latents} cond + {d.max_text_tokens} text + {d.max_audio_tokens} audio"

"""The XTTS v2 GPT: configuration, memory plans, and the model over the native core."""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, cast

import numpy as np

from pyxtts import _C
from pyxtts._args import flag, integer, real
from pyxtts._words import counted

BATCH_KEYS = ("text_inputs", "text_targets", "audio_inputs", "audio_targets", "text_lengths",
              "audio_lengths")
OPTIONAL_BATCH_KEYS = ("cond_latents", "cond_mels")
MEL_CHANNELS = 80  # the conditioning encoder's input: 80-band mel spectrograms


# The fields of ModelConfig the C engine takes (the others describe the data's framing
# and Coqui's conditioning inputs, which Python handles).
ENGINE_FIELDS = ("n_layers", "d_model", "n_heads", "text_vocab_size", "audio_vocab_size",
                 "max_text_tokens", "max_audio_tokens", "n_cond_latents", "layer_norm_eps",
                 "text_loss_weight", "audio_loss_weight", "max_attention_sequence_length", "dropout",
                 "conditioning", "max_cond_frames")
TOKEN_FIELDS = ("start_text_token", "stop_text_token", "start_audio_token", "stop_audio_token")


@dataclass
class ModelConfig:
    """Sizes of the XTTS GPT. Defaults are XTTS v2's as Coqui trains it (the GPT with its
    conditioning path, 441 M parameters, and dropout 0.1), except the start/stop token ids,
    which are unset: a config with them (``from_xtts_config``, the shipped XTTS v2
    configs) frames its data as Coqui does (``pyxtts.framing``); one without them
    takes batches whose ids the user framed."""

    n_layers: int = 30
    d_model: int = 1024
    n_heads: int = 16
    text_vocab_size: int = 6681
    audio_vocab_size: int = 1026
    max_text_tokens: int = 404
    max_audio_tokens: int = 608
    n_cond_latents: int = 32
    layer_norm_eps: float = 1e-5
    text_loss_weight: float = 0.01
    audio_loss_weight: float = 1.0
    # None: n_cond_latents + max_text_tokens + max_audio_tokens
    max_attention_sequence_length: int | None = None
    # Coqui's framing (all four or none): XTTS v2's are text 261/0, audio 1024/1025
    start_text_token: int | None = None
    stop_text_token: int | None = None
    start_audio_token: int | None = None
    stop_audio_token: int | None = None
    code_stride_len: int = 1024  # audio samples per DVAE code (Coqui's gpt_code_stride_len)
    use_perceiver_resampler: bool = True  # XTTS v2 (True) or v1 conditioning
    # GPT-2's dropout in training (embeddings, attention probabilities, both residual
    # branches); Coqui trains XTTS v2 with 0.1; 0 disables it
    dropout: float = 0.1
    # the conditioning encoder and perceiver (Coqui's conditioning path, trained from
    # batch["cond_mels"]); False: the GPT alone, conditioned by fixed cond_latents (or none).
    # None: the path when there are latents for it to make (n_cond_latents > 0) and the
    # conditioning is XTTS v2's (use_perceiver_resampler)
    conditioning: bool | None = None
    # the longest reference mel a batch may carry: Coqui's 132300-sample slices at hop 256
    max_cond_frames: int = 517

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in ("max_attention_sequence_length",) + TOKEN_FIELDS:
                continue
            if f.name == "use_perceiver_resampler":
                if not isinstance(value, bool):
                    raise TypeError(f"ModelConfig.{f.name}: expected bool, got {value!r}")
                continue
            if f.name == "conditioning":
                if value is not None and not isinstance(value, (bool, np.bool_)):
                    raise TypeError(f"ModelConfig.{f.name}: expected bool or None, got {value!r}")
                continue
            want = (float if f.name in ("layer_norm_eps", "text_loss_weight", "audio_loss_weight", "dropout")
                    else int)
            if isinstance(value, bool) or not isinstance(value, (int, float) if want is float else int):
                raise TypeError(f"ModelConfig.{f.name}: expected {want.__name__}"
                                + (" or None" if f.name in TOKEN_FIELDS else "") + f", got {value!r}")
        if self.conditioning is None:
            self.conditioning = self.use_perceiver_resampler and self.n_cond_latents > 0
        self.conditioning = bool(self.conditioning)
        if self.max_attention_sequence_length is None:
            self.max_attention_sequence_length = (self.n_cond_latents + self.max_text_tokens
                                                  + self.max_audio_tokens)
        # the rules of the sizes live in the engine, in one place (ValueError naming the field)
        _C.check_model_config(**self.engine_args())
        # code_stride_len and the start/stop ids are the data's (pyxtts.framing), which the
        # engine never sees
        if self.code_stride_len < 1:
            raise ValueError(f"ModelConfig.code_stride_len: must be >= 1, got {self.code_stride_len}")
        given = [n for n in TOKEN_FIELDS if getattr(self, n) is not None]
        if given and len(given) != len(TOKEN_FIELDS):
            missing = [n for n in TOKEN_FIELDS if n not in given]
            raise ValueError(f"ModelConfig: start/stop token ids are all set or all None; {', '.join(given)} "
                             f"set but {', '.join(missing)} None")
        for name in given:
            vocab = self.text_vocab_size if "text" in name else self.audio_vocab_size
            v = getattr(self, name)
            if not 0 <= v < vocab:
                raise ValueError(f"ModelConfig.{name}: must be in [0, {vocab}) "
                                 f"({'text' if 'text' in name else 'audio'}_vocab_size), got {v}")
        if self.conditioning and not self.use_perceiver_resampler:
            raise ValueError("ModelConfig.conditioning: pyxtts's conditioning path is XTTS v2's (the perceiver "
                             "resampler); with use_perceiver_resampler=False (XTTS v1's conditioning) set "
                             "conditioning=False and train from cond_latents")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def frames_data(self) -> bool:
        """True when the start/stop ids are set: collate and the Trainer frame the data
        as Coqui does (``pyxtts.framing``)."""
        return self.start_text_token is not None

    def engine_args(self) -> dict[str, Any]:
        """The fields the C engine takes, as keyword arguments."""
        return {name: getattr(self, name) for name in ENGINE_FIELDS}

    @classmethod
    def from_xtts_config(cls, cfg: Any, vocab: str | os.PathLike | None = None) -> "ModelConfig":
        """The config of the GPT Coqui builds from an XTTS config: ``cfg`` is the path of
        its ``config.json`` or a dict (the whole config or its ``model_args``). Sizes as
        Coqui's ``GPT`` derives them (2 more text positions, 3 more audio positions, 32
        conditioning latents with the perceiver resampler, else ``gpt_max_prompt_tokens``).
        The text vocabulary size and start/stop ids come from ``vocab`` (a tokenizer
        ``vocab.json``; default: the one beside a ``config.json`` path) when there is one,
        as Coqui's loader takes them, else from the config. See ``pyxtts.coqui_config``."""
        from pyxtts.coqui_config import model_config_from_xtts

        return model_config_from_xtts(cfg, vocab)

    @property
    def planned_cond_frames(self) -> int:
        """The reference mel the planning helpers assume a batch carries: the longest one
        (max_cond_frames) with the conditioning path, none without."""
        return self.max_cond_frames if self.conditioning else 0


@dataclass
class MemoryPlan:
    """Bytes of one training step by component; `total` is what the step peaks at on its
    device (parameters, gradients and, with an optimizer, its state there included; with
    several processes, ``communication``: what their collectives take there besides).
    An optimizer whose state is offloaded keeps it in the host pool instead:
    ``host_optimizer`` bytes, page-locked (``host_pinned``) beside a GPU, plain memory
    (``host_pageable``) beside the CPU; ``host_total`` is what the plan needs of the
    host's RAM besides the process itself."""

    parameters: int
    gradients: int
    optimizer: int
    inputs: int
    residuals: int
    saved_per_block: list[int]
    policies: list[str]
    final_norms: int
    work: int
    attention_workspace: int
    logits: int
    gemm_workspace: int
    activation_gradients: int
    saved: int
    scratch: int
    arena: int
    total: int
    batch_size: int
    sequence_length: int
    logits_rows: int
    train: bool
    allocator_rounding: int = 0  # what the allocator's blocks add to the requests (in total)
    head_casts: int = 0  # 16-bit models: fp32 head biases and a dt copy of dlogits (in scratch)
    reduce_workspace: int = 0  # partial sums of the deterministic reductions (in scratch)
    precision: str = "fp32"
    n_layers: int = field(repr=False, default=0)
    # the conditioning path (a batch with cond_mels of cond_frames frames; 0: none)
    cond_frames: int = 0
    conditioning_policy: str | None = None
    conditioning_inputs: int = 0  # the mels (in inputs)
    conditioning_saved: int = 0  # its stream, saved activations, the latents' gradient (in saved)
    conditioning_scratch: int = 0  # its phases' scratch (shares the scratch with the GPT's)
    parameter_count: int = 0  # the model's parameters (elements, not bytes)
    host_optimizer: int = 0  # an offloaded optimizer's state and staging, in the host pool
    host_pinned: int = 0  # of it, page-locked (the pool of a GPU)
    host_pageable: int = 0  # of it, pageable (the pool of the CPU)
    # several processes (pyxtts.distributed): the processes the plan is one of, and what their
    # collectives take on this device (pyxtts.comm_memory; in total, outside the allocator)
    world_size: int = 1
    communication: int = 0
    communication_backend: str | None = None  # "nccl" (an estimate) or "gloo"

    @classmethod
    def _from_native(cls, d: Mapping[str, Any]) -> "MemoryPlan":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def saved_activations(self) -> int:
        return sum(self.saved_per_block)

    @property
    def host_total(self) -> int:
        """Host memory the plan reserves (the host pool's blocks)."""
        return self.host_pinned + self.host_pageable

    @property
    def allocator_total(self) -> int:
        """What pyxtts's allocator peaks at: ``total`` less ``communication``, which the
        collective backend allocates outside it (``memory_stats``' peak measures this)."""
        return self.total - self.communication

    @property
    def communication_label(self) -> str:
        """The plan's line for ``communication``: NCCL's figure is an estimate."""
        return ("communication (NCCL, estimated)" if self.communication_backend == "nccl"
                else f"communication ({self.communication_backend})")

    def __str__(self) -> str:
        from pyxtts.memory import format_bytes as fb

        pol = {p: self.policies.count(p) for p in dict.fromkeys(self.policies)}
        rows = [
            ("parameters", self.parameters), ("gradients (fp32)", self.gradients),
            ("optimizer state", self.optimizer), ("inputs", self.inputs),
            ("residual stream", self.residuals), ("saved activations (blocks)", self.saved_activations),
            ("final norms", self.final_norms),
            ("conditioning path (saved)", self.conditioning_saved), ("block work area", self.work),
            ("attention workspace", self.attention_workspace), ("logits chunk", self.logits),
            ("head casts (16-bit)", self.head_casts),
            ("activation gradients", self.activation_gradients), ("GEMM workspace", self.gemm_workspace),
            ("reduction workspace", self.reduce_workspace),
            ("allocator rounding", self.allocator_rounding),
        ]
        if self.communication:  # one process has none: its table stays as it was
            rows.append((self.communication_label, self.communication))
        cond = (f", the conditioning path's {self.conditioning_policy} over {self.cond_frames} mel frames"
                if self.cond_frames else "")
        lines = [f"memory plan ({self.precision}): batch {self.batch_size} x {self.sequence_length} tokens, "
                 + "checkpointing " + ", ".join(f"{p} in {counted(n, 'block')}" for p, n in pol.items())
                 + cond, "-" * 52]
        lines += [f"{name:34}{fb(v):>18}" for name, v in rows]
        lines += ["-" * 52, f"{'total':34}{fb(self.total):>18}"]
        if self.host_total:
            kind = "page-locked" if self.host_pinned else "pageable"
            lines += [f"{'host: optimizer state (offloaded)':34}{fb(self.host_optimizer):>18}",
                      f"{'host total (' + kind + ')':34}{fb(self.host_total):>18}"]
        return "\n".join(lines)


def estimate_memory(config: ModelConfig, batch_size: int, text_len: int, audio_len: int,
                    cond_len: int | None = None, checkpointing: str = "none", train: bool = True,
                    budget: int | None = None, device: str = "cpu", optimizer: bool = False,
                    precision: str = "fp32", cond_frames: int = 0, offload: bool = False) -> MemoryPlan:
    """The memory plan of one step of a model of this config, without building the model:
    nothing is allocated, so the plan of the full XTTS v2 size prints on any machine.
    ``optimizer=True`` counts the state of a default ``AdamW`` (moments, no EMA; with a
    16-bit ``precision`` its fp32 master copy too); with ``offload=True`` that state is
    an ``AdamW(state_device="cpu")``'s, in the host pool (``MemoryPlan.host_total``), and
    only the norm's workspace stays on the device. ``precision``: "fp32", "bf16", "fp16".
    ``cond_frames``: the mel frames of a batch's ``cond_mels`` (0: the batch has none; the
    conditioning path is then not in the plan)."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config: expected a ModelConfig, got {type(config).__name__}")
    return MemoryPlan._from_native(_C.plan_memory(
        **config.engine_args(), batch_size=batch_size, text_len=text_len, audio_len=audio_len,
        cond_len=cond_len, checkpointing=checkpointing, train=train, budget=_budget_arg(budget), device=device,
        optimizer=flag("optimizer", optimizer), precision=precision, cond_frames=cond_frames, offload=offload))


def _budget_arg(budget: Any) -> int | None:
    """``budget``: None (the device's limit) or bytes, at least one."""
    return None if budget is None else integer("budget", budget, minimum=1)


# bfloat16 arithmetic (cuBLAS's bf16 products, the tensor-core attention) starts with
# Ampere; Turing (RTX 20xx, T4: 7.5) has float16 only
BF16_MIN_CAPABILITY = (8, 0)


def precision_problem(precision: str, device: str | int) -> str | None:
    """Why ``precision`` cannot train on ``device``, as a message that names both and
    what to use instead; None when it can, or when ``device`` is not in this machine
    (the engine then reports what it must). Only bfloat16 on a GPU older than Ampere
    (compute capability under 8.0) is refused: pyxtts would otherwise fail at its first
    bf16 product there."""
    if not isinstance(precision, str) or precision != "bf16":
        return None  # the engine's converter names what is wrong with any other value
    try:
        info = _C.device_info(device)
    except Exception:  # noqa: BLE001 - a device it cannot name: the engine's own error says so
        return None
    cap = tuple(info["capability"])
    if info["type"] != "cuda" or cap >= BF16_MIN_CAPABILITY:
        return None
    return (f"precision='bf16': {info['device']} ({info['name']}) has compute capability "
            f"{cap[0]}.{cap[1]}, and bfloat16 needs {BF16_MIN_CAPABILITY[0]}.{BF16_MIN_CAPABILITY[1]} "
            "or newer (Ampere and later: RTX 30xx/40xx, A100, H100); use precision='fp16' (trained "
            "with a dynamic loss scale) or 'fp32'")


def _as_array(value: Any, key: str) -> np.ndarray:
    if isinstance(value, _C.Tensor):
        return value.numpy()
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is the user's input
        # the converter's own words say why (a torch tensor that requires grad, on a GPU,
        # or in bfloat16, which NumPy has no type for)
        raise TypeError(f"batch[{key!r}]: expected an array, got {type(value).__name__} that NumPy cannot "
                        f"convert ({type(exc).__name__}: {str(exc)[:200]})") from exc


def _int_array(batch: Mapping[str, Any], key: str, ndim: int) -> np.ndarray:
    a = _as_array(batch[key], key)
    if a.dtype.kind not in "iu":
        raise TypeError(f"batch[{key!r}]: expected an integer array, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"batch[{key!r}]: expected {ndim} dimensions, got shape {a.shape}")
    return a.astype(np.int64, copy=False)


def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _graphs_from_env() -> bool:
    """``PYXTTS_CUDA_GRAPHS``: "1" records CUDA graphs (``XTTSGPT.cuda_graphs``), "0" or
    unset does not."""
    value = os.environ.get("PYXTTS_CUDA_GRAPHS", "0")
    if value not in ("0", "1"):
        raise ValueError(f"PYXTTS_CUDA_GRAPHS: expected '0' or '1', got {value!r}")
    return value == "1"


def _step_number(name: str, value: Any, limit: int = 1 << 64) -> int:
    """An int in [0, limit) (a step counter, a sample number)."""
    return integer(name, value, maximum=limit - 1)


class XTTSGPT:
    """The GPT of XTTS v2 (weights compatible), trained by a C engine.

    ``forward_backward`` adds into the gradients; ``forward`` evaluates. Memory for a
    step is planned and reserved before it starts (``estimate_memory``)."""

    def __init__(self, config: ModelConfig | None = None, device: str = "cpu",
                 precision: str = "fp32", checkpointing: str = "none", seed: int = 0,
                 cuda_graphs: bool | None = None) -> None:
        self.config = config if config is not None else ModelConfig()
        if not isinstance(self.config, ModelConfig):
            raise TypeError(f"config: expected a ModelConfig, got {type(config).__name__}")
        problem = precision_problem(precision, device)
        if problem:
            raise ValueError(problem)
        self._core = _C.GPT(**self.config.engine_args(), device=device, precision=precision,
                            checkpointing=checkpointing, seed=seed)
        self.precision = precision
        self._names = list(self._core.parameters())
        self._dropout_seed = _step_number("seed", seed)
        self._dropout_step = 0
        if cuda_graphs is None:
            cuda_graphs = _graphs_from_env() and self.device.startswith("cuda")
        self.cuda_graphs = cuda_graphs

    # ---- attributes -----------------------------------------------------------
    @property
    def device(self) -> str:
        return self._core.device

    @property
    def dtype(self) -> _C.dtype:
        return self._core.dtype

    @property
    def checkpointing(self) -> str:
        return self._core.checkpointing

    @checkpointing.setter
    def checkpointing(self, value: str) -> None:
        self._core.checkpointing = value

    @property
    def num_parameters(self) -> int:
        return self._core.num_parameters

    @property
    def cuda_graphs(self) -> bool:
        """Record a step's forward (up to the final norms) and backward (after the
        heads) as CUDA graphs, one pair per batch shape (8 graphs at most, the least
        recently used evicted), and replay them: the same kernels and the same bits as
        without, launched at once. Default: ``PYXTTS_CUDA_GRAPHS=1`` on a CUDA device.
        A record that fails turns this off and says why in ``graph_stats["error"]``."""
        return self._core.cuda_graphs

    @cuda_graphs.setter
    def cuda_graphs(self, value: bool) -> None:
        self._core.cuda_graphs = value

    @property
    def graph_stats(self) -> dict[str, Any]:
        """Graphs recorded, replayed, evicted and cached, failed records and the last
        failure's message (see ``cuda_graphs``)."""
        return self._core.graph_stats

    @property
    def dropout_seed(self) -> int:
        """The seed of the dropout masks: the model's ``seed`` unless set. Checkpoints
        save and restore it with ``dropout_step``."""
        return self._dropout_seed

    @dropout_seed.setter
    def dropout_seed(self, value: int) -> None:
        self._dropout_seed = _step_number("dropout_seed", value)

    @property
    def dropout_step(self) -> int:
        """The training step that keys the next dropout masks (with ``dropout_seed``).
        ``forward_backward`` advances it by one; checkpoints save and restore it, so a
        resumed run draws the masks the uninterrupted one would have."""
        return self._dropout_step

    @dropout_step.setter
    def dropout_step(self, value: int) -> None:
        self._dropout_step = _step_number("dropout_step", value)

    # ---- parameters -----------------------------------------------------------
    def parameters(self) -> dict[str, _C.Tensor]:
        """name -> Tensor view of the flat parameter buffer."""
        return self._core.parameters()

    def gradients(self) -> dict[str, _C.Tensor]:
        """name -> Tensor view of the flat fp32 gradient buffer."""
        return self._core.gradients()

    def flat_gradients(self) -> _C.Tensor:
        """The whole fp32 gradient buffer as one 1-D Tensor view (the tensors of
        ``gradients()`` and the zero padding between them): one all-reduce sums every
        gradient (``pyxtts.distributed``; ``torch.from_dlpack`` wraps it without a copy)."""
        return self._core.flat_gradients()

    def zero_grad(self) -> None:
        self._core.zero_grad()

    def state_dict(self) -> dict[str, np.ndarray]:
        """name -> NumPy copy, names and shapes as in an XTTS v2 checkpoint's GPT, in the
        model's dtype (float32; ml_dtypes.bfloat16 for bf16; float16 for fp16)."""
        return {k: v.numpy() for k, v in self._core.parameters().items()}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> tuple[list[str], list[str]]:
        """Loads parameters; also accepts the keys of a full XTTS v2 checkpoint, whose
        GPT keys carry one more ``gpt.`` prefix. Everything is checked before anything
        is written; values are converted to the model's dtype (round to nearest even).
        Returns (missing, unexpected) key lists (strict=False)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state: expected a mapping of name -> array, got {type(state).__name__}")
        params = self._core.parameters()
        chosen: dict[str, tuple[str, np.ndarray]] = {}
        unexpected: list[str] = []
        for key, value in state.items():
            if not isinstance(key, str):
                raise TypeError(f"state: keys must be parameter names (str), got {key!r}")
            name = key if key in params else key[4:] if key.startswith("gpt.") and key[4:] in params else None
            if name is None:
                unexpected.append(key)
                continue
            if name in chosen:
                raise ValueError(f"state: keys {chosen[name][0]!r} and {key!r} both name {name!r}")
            chosen[name] = (key, value)
        missing = [n for n in params if n not in chosen]
        if strict and (missing or unexpected):
            parts = []
            if missing:
                parts.append(f"missing {len(missing)} keys (e.g. {missing[:3]})")
            if unexpected:
                hints = [f"{u!r}" + (f" (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(u, params, 1)) else "")
                         for u in unexpected[:3]]
                parts.append(f"unexpected {len(unexpected)} keys (e.g. {', '.join(hints)})")
            raise KeyError("load_state_dict(strict=True): " + "; ".join(parts)
                           + "; pass strict=False to load a subset or a full XTTS checkpoint")
        arrays: dict[str, np.ndarray] = {}
        for name, (key, value) in chosen.items():
            a = _as_array(value, key)
            if a.dtype.kind not in "fV":
                raise TypeError(f"state[{key!r}]: expected a floating-point array, got dtype {a.dtype}")
            if tuple(a.shape) != params[name].shape:
                raise ValueError(f"state[{key!r}]: expected shape {params[name].shape} for {name!r}, "
                                 f"got {tuple(a.shape)}")
            if not np.isfinite(a.astype(np.float32)).all():
                raise ValueError(f"state[{key!r}]: contains NaN or infinity at {_first_bad(~np.isfinite(a.astype(np.float32)))}")
            if self.precision != "fp32":
                with np.errstate(over="ignore"):
                    finite = np.isfinite(a.astype(self.dtype.numpy).astype(np.float32))
                if not finite.all():
                    raise ValueError(f"state[{key!r}]: overflows {self.dtype.name} at {_first_bad(~finite)}")
            arrays[name] = a
        self._write("parameters", arrays)
        return missing, unexpected

    def _write(self, which: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Writes name -> array into the parameters or the gradients, all or none: the
        arrays are converted on the host (round to nearest even) before anything is
        written, and the writes themselves allocate nothing on the device, so neither a
        conversion error nor an out-of-memory error leaves some tensors written."""
        want = self.dtype.numpy if which == "parameters" else np.dtype(np.float32)
        host: list[np.ndarray | None] = []
        for name in self._names:
            a = arrays.get(name)
            if a is not None:
                if a.dtype != want:  # through float32, as the device's cast rounds
                    with np.errstate(over="ignore"):
                        a = np.asarray(a, dtype=np.float32).astype(want)
                a = np.ascontiguousarray(a, dtype=want)
            host.append(a)
        self._core._write(which, host)

    # ---- memory ---------------------------------------------------------------
    def estimate_memory(self, batch_size: int, text_len: int, audio_len: int, cond_len: int | None = None,
                        checkpointing: str | None = None, train: bool = True,
                        budget: int | None = None, optimizer: bool | None = None,
                        cond_frames: int = 0, offload: bool = False) -> MemoryPlan:
        """The plan of a step at this shape, computed without allocating anything.
        ``budget`` (bytes in all) guides checkpointing='auto'; default: the device's limit.
        ``optimizer``: None counts the state of the AdamW attached to this model (none: 0;
        on the device and, offloaded, in the host pool), True that or else a default
        AdamW's (``offload``: with its state in the host pool), False leaves optimizer
        state out. ``cond_frames``: the mel frames of the batch's ``cond_mels`` (0: none)."""
        optimizer = None if optimizer is None else flag("optimizer", optimizer)
        return MemoryPlan._from_native(self._core.estimate_memory(
            batch_size, text_len, audio_len, cond_len, checkpointing, train, _budget_arg(budget), optimizer,
            cond_frames, offload))

    def release_memory(self) -> int:
        """Frees the cached step arena (it is re-reserved by the next step); bytes freed."""
        return self._core.release_arena()

    # ---- steps ----------------------------------------------------------------
    def _prepare(self, batch: Mapping[str, Any]) -> tuple:
        if not isinstance(batch, Mapping):
            raise TypeError(f"batch: expected a dict of arrays, got {type(batch).__name__}")
        for k in batch:
            if k not in BATCH_KEYS and k not in OPTIONAL_BATCH_KEYS:
                close = difflib.get_close_matches(k, BATCH_KEYS + OPTIONAL_BATCH_KEYS, 1)
                raise KeyError(f"batch: unknown key {k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        for k in BATCH_KEYS:
            if k not in batch:
                raise KeyError(f"batch: missing key {k!r} (a batch holds {', '.join(BATCH_KEYS)} "
                               "and optionally cond_latents or cond_mels)")
        c = self.config
        ti, tt = _int_array(batch, "text_inputs", 2), _int_array(batch, "text_targets", 2)
        ai, at = _int_array(batch, "audio_inputs", 2), _int_array(batch, "audio_targets", 2)
        tl, al = _int_array(batch, "text_lengths", 1), _int_array(batch, "audio_lengths", 1)
        B, Lt = ti.shape
        La = ai.shape[1]
        for key, a, want in (("text_targets", tt, (B, Lt)), ("audio_inputs", ai, (B, La)),
                             ("audio_targets", at, (B, La)), ("text_lengths", tl, (B,)),
                             ("audio_lengths", al, (B,))):
            if a.shape != want:
                raise ValueError(f"batch[{key!r}]: expected shape {want}, got {a.shape}")
        if B < 1 or Lt < 1 or La < 1:
            raise ValueError(f"batch: empty batch (text_inputs {ti.shape}, audio_inputs {ai.shape})")
        if Lt > c.max_text_tokens:
            raise ValueError(f"batch['text_inputs']: {Lt} text positions exceed max_text_tokens="
                             f"{c.max_text_tokens}; pyxtts never truncates")
        if La > c.max_audio_tokens:
            raise ValueError(f"batch['audio_inputs']: {La} audio positions exceed max_audio_tokens="
                             f"{c.max_audio_tokens}; pyxtts never truncates")
        for key, lens, width in (("text_lengths", tl, Lt), ("audio_lengths", al, La)):
            bad = (lens < 0) | (lens > width)
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"batch[{key!r}][{i}] = {int(lens[i])}: must be in [0, {width}] "
                                 "(the array's length)")
        t_valid = np.arange(Lt)[None, :] < tl[:, None]
        a_valid = np.arange(La)[None, :] < al[:, None]
        for key, ids, valid, vocab, lo in (("text_inputs", ti, t_valid, c.text_vocab_size, 0),
                                           ("text_targets", tt, t_valid, c.text_vocab_size, -1),
                                           ("audio_inputs", ai, a_valid, c.audio_vocab_size, 0),
                                           ("audio_targets", at, a_valid, c.audio_vocab_size, -1)):
            bad = valid & ((ids < lo) | (ids >= vocab))
            if bad.any():
                pos = _first_bad(bad)
                raise ValueError(f"batch[{key!r}]{list(pos)} = {int(ids[pos])}: out of range "
                                 f"[{lo}, {vocab})")
        cond = batch.get("cond_latents")
        mels = batch.get("cond_mels")
        if cond is not None and mels is not None:
            raise ValueError("batch: cond_latents and cond_mels are exclusive (fixed latents, or the mels "
                             "the conditioning path makes them from)")
        if mels is not None:
            mels = self._mels(mels, B)
        if cond is not None:
            cond = _as_array(cond, "cond_latents")
            if cond.dtype.kind not in "fV":
                raise TypeError(f"batch['cond_latents']: expected a float array, got dtype {cond.dtype}")
            if cond.ndim != 3 or cond.shape[0] != B or cond.shape[2] != c.d_model:
                raise ValueError(f"batch['cond_latents']: expected shape ({B}, n_cond, {c.d_model}), "
                                 f"got {cond.shape}")
            cond = np.ascontiguousarray(cond, dtype=np.float32)
            if not np.isfinite(cond).all():
                raise ValueError(f"batch['cond_latents']{list(_first_bad(~np.isfinite(cond)))}: NaN or infinity")
            if self.precision != "fp32":  # the model's dtype, rounded to nearest even
                with np.errstate(over="ignore"):
                    cond = np.ascontiguousarray(cond.astype(self.dtype.numpy))
                finite = np.isfinite(cond.astype(np.float32))
                if not finite.all():
                    raise ValueError(f"batch['cond_latents']{list(_first_bad(~finite))}: "
                                     f"overflows {self.dtype.name}")
            if cond.shape[1] == 0:
                cond = None
        Nc = c.n_cond_latents if mels is not None else 0 if cond is None else cond.shape[1]
        T = Nc + Lt + La
        if T > c.max_attention_sequence_length:
            raise ValueError(f"batch: sequence length {T} ({Nc} conditioning + {Lt} text + {La} audio) "
                             f"exceeds max_attention_sequence_length={c.max_attention_sequence_length}; "
                             "pyxtts never truncates: shorten the sample or raise the maximum")
        # padding never matters: its ids become 0 and its targets are ignored
        i32 = np.int32
        text_ids = np.where(t_valid, ti, 0).astype(i32)
        audio_ids = np.where(a_valid, ai, 0).astype(i32)
        text_tgt = np.where(t_valid, tt, -1).astype(i32)
        audio_tgt = np.where(a_valid, at, -1).astype(i32)
        text_pos = np.ascontiguousarray(np.broadcast_to(np.arange(Lt, dtype=i32), (B, Lt)))
        audio_pos = np.ascontiguousarray(np.broadcast_to(np.arange(La, dtype=i32), (B, La)))
        key_mask = np.concatenate([np.ones((B, Nc), bool), t_valid, a_valid], axis=1).astype(np.uint8)
        counts = (int((text_tgt >= 0).sum()), int((audio_tgt >= 0).sum()))
        return (text_ids, audio_ids, text_tgt, audio_tgt, text_pos, audio_pos, key_mask,
                tl.astype(i32), al.astype(i32), cond, mels), counts

    def _mels(self, value: Any, B: int) -> np.ndarray:
        """batch['cond_mels'] as a C-contiguous (B, 80, S) array of the model's dtype."""
        c = self.config
        if not c.conditioning:
            raise ValueError("batch['cond_mels']: this model has no conditioning path "
                             "(ModelConfig.conditioning=False); pass cond_latents instead")
        mels = _as_array(value, "cond_mels")
        if mels.dtype.kind not in "fV":
            raise TypeError(f"batch['cond_mels']: expected a float array, got dtype {mels.dtype}")
        if mels.ndim == 4 and mels.shape[1] == 1:
            mels = mels[:, 0]
        if mels.ndim != 3 or mels.shape[0] != B or mels.shape[1] != MEL_CHANNELS or mels.shape[2] < 1:
            raise ValueError(f"batch['cond_mels']: expected shape ({B}, {MEL_CHANNELS}, S) or "
                             f"({B}, 1, {MEL_CHANNELS}, S) with S >= 1 mel frames, got {mels.shape}")
        if mels.shape[2] > c.max_cond_frames:
            raise ValueError(f"batch['cond_mels']: {mels.shape[2]} mel frames exceed max_cond_frames="
                             f"{c.max_cond_frames}; pyxtts never truncates: shorten the reference "
                             "slice or raise the maximum")
        mels = np.ascontiguousarray(mels, dtype=np.float32)
        if not np.isfinite(mels).all():
            raise ValueError(f"batch['cond_mels']{list(_first_bad(~np.isfinite(mels)))}: NaN or infinity")
        if self.precision != "fp32":  # the model's dtype, rounded to nearest even
            with np.errstate(over="ignore"):
                mels = np.ascontiguousarray(mels.astype(self.dtype.numpy))
            finite = np.isfinite(mels.astype(np.float32))
            if not finite.all():
                raise ValueError(f"batch['cond_mels']{list(_first_bad(~finite))}: overflows {self.dtype.name}")
        return mels

    def _run(self, batch: Mapping[str, Any], token_counts: tuple[int, int] | None, train: bool,
             loss_scale: float | None = None, dropout_step: int | None = None,
             sample_offset: int = 0, zero_grad: bool = False, keep_larger_arena: bool = False,
             on_gradients: Callable[[int, int], object] | None = None, reserve_only: bool = False) -> dict | None:
        arrays, (n_text, n_audio) = self._prepare(batch)
        step = self._dropout_step if dropout_step is None else _step_number("dropout_step", dropout_step)
        offset = _step_number("sample_offset", sample_offset, 1 << 32)
        norm = (n_text, n_audio)
        if token_counts is not None:
            if (not isinstance(token_counts, (tuple, list)) or len(token_counts) != 2
                    or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in token_counts)):
                raise TypeError(f"token_counts: expected (n_text, n_audio) ints, got {token_counts!r}")
            if token_counts[0] < n_text or token_counts[1] < n_audio:
                raise ValueError(f"token_counts: {tuple(token_counts)} counts fewer targets than this "
                                 f"batch holds ({n_text}, {n_audio}); pass the whole effective batch's counts")
            norm = (int(token_counts[0]), int(token_counts[1]))
        scale = 1.0
        if loss_scale is not None:
            scale = real("loss_scale", loss_scale, minimum=0.0, above=True)
        if on_gradients is not None and not callable(on_gradients):
            raise TypeError(f"on_gradients: expected None or a callable (offset, count), got {on_gradients!r}")
        sums = self._core._step(*arrays[:10], float(norm[0]), float(norm[1]), train, scale, arrays[10],
                                self._dropout_seed, step, offset, bool(zero_grad), bool(keep_larger_arena),
                                on_gradients, bool(reserve_only))
        if sums is None:  # reserve_only: the memory is reserved, nothing ran
            return None
        text_sum, audio_sum = sums
        if train and dropout_step is None:
            self._dropout_step = step + 1
        text_loss = text_sum / norm[0] if norm[0] else 0.0
        audio_loss = audio_sum / norm[1] if norm[1] else 0.0
        c = self.config
        return {"loss": c.text_loss_weight * text_loss + c.audio_loss_weight * audio_loss,
                "text_loss": text_loss, "audio_loss": audio_loss,
                "text_tokens": n_text, "audio_tokens": n_audio}

    def forward_backward(self, batch: Mapping[str, Any], token_counts: tuple[int, int] | None = None,
                         loss_scale: float | None = None, dropout_step: int | None = None,
                         sample_offset: int = 0, zero_grad: bool = False,
                         keep_larger_arena: bool = False,
                         on_gradients: Callable[[int, int], object] | None = None) -> dict:
        """Loss of the batch, with its gradients added into ``gradients()``.

        With ``zero_grad=True`` the gradients are set to zero first, once the step's memory
        is reserved: a step that does not fit raises ``OutOfMemoryError`` with them as they
        were, where ``zero_grad()`` then a failed step would leave zeros. With
        ``keep_larger_arena=True`` a cached step arena at least as large as this step needs
        serves it as it is (by default an arena of another shape is freed and this step's
        reserved): the micro-batches of one step, a row fewer than the first at most, then
        allocate nothing (``train_step_with_accumulation`` passes both).

        With ``token_counts=(n_text, n_audio)`` of a whole effective batch, the means use
        those counts, so micro-batches add up to exactly the big batch's gradient.
        Dropout masks are keyed by (seed, step, site, sample, position): by default the
        step is ``dropout_step``, which then advances by one. Micro-batches of one
        effective batch pass the same ``dropout_step=s`` and ``sample_offset`` = the
        number of their first row in it (``train_step_with_accumulation`` does), and draw
        exactly the masks of the whole batch; the counter is left to the caller then.
        ``loss_scale`` multiplies the gradients (not the reported losses): fp16 training
        passes its optimizer's dynamic scale explicitly,
        ``model.forward_backward(batch, loss_scale=opt.loss_scale)`` with
        ``AdamW(model, loss_scale=2.0**16)``, which unscales, skips non-finite steps and
        adjusts the scale. Nothing is attached automatically.

        ``on_gradients(offset, count)``, when given, is called during the backward each time
        a group of gradients holds all of this call's additions: elements ``[offset, offset +
        count)`` of ``flat_gradients()``, in backward order (the final norms with the heads,
        the blocks from the last, the embedding tables, the conditioning path); the groups
        cover every parameter once. It can start work on them while the backward goes on:
        the data-parallel strategy launches their all-reduce there. On a GPU the call comes
        once the group's kernels are queued: work the callback queues on the default stream
        runs after them. The model is busy meanwhile (its methods refuse). An exception it
        raises stops the step and propagates, the gradients then holding part of this
        call's additions."""
        return cast(dict, self._run(batch, token_counts, train=True, loss_scale=loss_scale, dropout_step=dropout_step,
                                    sample_offset=sample_offset, zero_grad=flag("zero_grad", zero_grad),
                                    keep_larger_arena=flag("keep_larger_arena", keep_larger_arena),
                                    on_gradients=on_gradients))

    def _reserve_step(self, batch: Mapping[str, Any]) -> None:
        """Reserves the memory of a training step on ``batch`` (kept when a larger one is
        cached, as ``keep_larger_arena``) and runs nothing: ``OutOfMemoryError`` here, and
        then ``forward_backward(batch, keep_larger_arena=True)`` allocates nothing."""
        self._run(batch, None, train=True, keep_larger_arena=True, reserve_only=True)

    def forward(self, batch: Mapping[str, Any], token_counts: tuple[int, int] | None = None) -> dict:
        """Loss of the batch for evaluation: nothing saved, no gradients."""
        return cast(dict, self._run(batch, token_counts, train=False))

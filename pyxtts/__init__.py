"""pyxtts: train XTTS-style text-to-speech transformers without running out of memory."""
from __future__ import annotations

import os as _os

# The engine's OpenMP threads meet at a barrier after every parallel loop. libgomp's
# default makes a waiting thread spin 300000 times before it sleeps: when other
# processes keep the cores busy, the spinner holds the core the late thread needs.
# Measured (tests/bench/bench_cpu_contention.py, 2 cores, median of 3 runs): a step
# of 17.6 ms idle took 560 ms beside two busy processes; spinning 1000 times (what
# libgomp itself uses when it knows it is oversubscribed) gives 18.4 ms idle, 34 ms
# beside one busy process (32 ms with the default) and 34 ms beside two. libgomp reads
# it when _C loads it, so it is set first; a user's OMP_WAIT_POLICY or
# GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "1000"

try:
    from pyxtts._C import (
        AdamW,
        Block,
        OutOfMemoryError,
        Tensor,
        attention,
        attention_backward,
        attention_forward,
        bfloat16,
        bool,
        build_info,
        cuda_available,
        device_count,
        device_info,
        dtype,
        empty,
        empty_cache,
        float16,
        float32,
        from_dlpack,
        int32,
        int64,
        max_memory_allocated,
        max_memory_reserved,
        memory_allocated,
        memory_reserved,
        memory_stats,
        reset_peak_memory_stats,
        set_memory_fraction,
        set_memory_limit,
        synchronize,
        tensor,
        uint8,
        zeros,
    )
except ImportError as exc:  # not built here, or built but a library it needs is missing
    from pyxtts._origin import load_error

    raise load_error(exc) from exc
from pyxtts._origin import warn_if_shadowing as _warn_if_shadowing

_warn_if_shadowing()
from pyxtts.batch import (
    StepResult,
    find_optimal_batch_size,
    train_step_with_accumulation,
)
from pyxtts.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from pyxtts.coqui_checkpoint import export_xtts_checkpoint, import_xtts_checkpoint
from pyxtts.coqui_continue import continue_xtts_run
from pyxtts.config import (
    DataConfig,
    TrainingConfig,
    XTTSConfig,
    optimize_config,
    parse_memory_size,
)
from pyxtts.data import (
    DataError,
    Sample,
    SyntheticDataset,
    TTSDataset,
    batch_groups,
    bucketed_batches,
    collate,
    collate_references,
    write_shards,
)
from pyxtts.memory import cleanup_gpu_memory, memory_summary
from pyxtts.model import XTTSGPT, MemoryPlan, ModelConfig, estimate_memory
from pyxtts.monitor import GPUMonitor
from pyxtts.schedule import ConstantLR, LRSchedule, MultiStepLR, WarmupCosineLR
from pyxtts.trainer import FitResult, Trainer

__version__: str = build_info()["version"]

__all__ = [
    "XTTSGPT",
    "AdamW",
    "Block",
    "CheckpointError",
    "ConstantLR",
    "DataConfig",
    "DataError",
    "FitResult",
    "GPUMonitor",
    "LRSchedule",
    "MemoryPlan",
    "ModelConfig",
    "MultiStepLR",
    "OutOfMemoryError",
    "Sample",
    "StepResult",
    "SyntheticDataset",
    "TTSDataset",
    "Tensor",
    "Trainer",
    "TrainingConfig",
    "WarmupCosineLR",
    "XTTSConfig",
    "attention",
    "attention_backward",
    "attention_forward",
    "batch_groups",
    "bfloat16",
    "bool",
    "bucketed_batches",
    "build_info",
    "cleanup_gpu_memory",
    "collate",
    "collate_references",
    "continue_xtts_run",
    "cuda_available",
    "device_count",
    "device_info",
    "dtype",
    "empty",
    "empty_cache",
    "estimate_memory",
    "export_xtts_checkpoint",
    "find_optimal_batch_size",
    "float16",
    "float32",
    "from_dlpack",
    "import_xtts_checkpoint",
    "int32",
    "int64",
    "load_checkpoint",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "optimize_config",
    "parse_memory_size",
    "reset_peak_memory_stats",
    "save_checkpoint",
    "set_memory_fraction",
    "set_memory_limit",
    "synchronize",
    "tensor",
    "train_step_with_accumulation",
    "uint8",
    "write_shards",
    "zeros",
]

"""pyxtts: train XTTS-style text-to-speech transformers without running out of memory."""
from __future__ import annotations

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
except ImportError as exc:  # a source checkout that was never built
    raise ImportError(
        "pyxtts's C extension (pyxtts._C) is not built here. Install the package with "
        "`pip install .` and run from outside the source tree, or build in place with "
        "`python setup.py build_ext --inplace`."
    ) from exc
from pyxtts.memory import cleanup_gpu_memory, memory_summary
from pyxtts.model import MemoryPlan, ModelConfig, XTTSGPT, estimate_memory
from pyxtts.checkpoint import CheckpointError, import_xtts_checkpoint, load_checkpoint, save_checkpoint
from pyxtts.schedule import ConstantLR, LRSchedule, MultiStepLR, WarmupCosineLR
from pyxtts.batch import StepResult, find_optimal_batch_size, train_step_with_accumulation
from pyxtts.data import DataError, Sample, SyntheticDataset, TTSDataset, bucketed_batches, collate, write_shards
from pyxtts.config import DataConfig, TrainingConfig, XTTSConfig, optimize_config, parse_memory_size
from pyxtts.monitor import GPUMonitor

__version__: str = build_info()["version"]

__all__ = [
    "AdamW", "Block", "MemoryPlan", "ModelConfig", "XTTSGPT", "estimate_memory",
    "CheckpointError", "import_xtts_checkpoint", "load_checkpoint", "save_checkpoint",
    "ConstantLR", "LRSchedule", "MultiStepLR", "WarmupCosineLR",
    "StepResult", "find_optimal_batch_size", "train_step_with_accumulation",
    "DataError", "Sample", "SyntheticDataset", "TTSDataset", "bucketed_batches", "collate", "write_shards",
    "DataConfig", "TrainingConfig", "XTTSConfig", "optimize_config", "parse_memory_size",
    "GPUMonitor",
    "attention", "attention_backward", "attention_forward",
    "OutOfMemoryError", "Tensor", "bfloat16", "bool", "build_info", "cleanup_gpu_memory",
    "cuda_available", "device_count", "device_info", "dtype", "empty", "empty_cache", "float16",
    "float32", "from_dlpack", "int32", "int64", "max_memory_allocated", "max_memory_reserved",
    "memory_allocated", "memory_reserved", "memory_stats", "memory_summary",
    "reset_peak_memory_stats", "set_memory_fraction", "set_memory_limit", "synchronize", "tensor",
    "uint8", "zeros",
]

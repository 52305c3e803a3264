"""Data-parallel training on torch.distributed: ``DataParallel``, the strategy of several
processes (``pyxtts.strategy``). NCCL between GPUs, gloo on CPUs, ``torchrun`` as the
launcher; pyxtts writes no transport of its own. This is the only module that imports
torch, and only when a ``DataParallel`` is made (``pip install 'pyxtts[distributed]'``).

Each process holds the whole model and the same optimizer. A step:

1. Each process collates its contiguous slice of the global batch (``shard``).
2. The target counts are summed over the processes (``reduce_counts``) before any loss is
   normalised.
3. The flat fp32 gradient buffer goes to torch through DLPack (no copy) and is all-reduced
   in place, bucket by bucket during the last micro-batch's backward (``gradient_hook``):
   as the backward finishes a group of gradients (the heads, each block from the last,
   the embeddings, the conditioning path), its all-reduce starts while the backward goes
   on, as DDP's buckets do; ``all_reduce_grads`` waits for them.
4. Every process runs the same AdamW step on the same bits.

``check_identical`` compares a checksum of every parameter's bits across the processes
and names a process that diverged.
"""
from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any, Callable

from pyxtts.strategy import contiguous_slice

__all__ = ["EXTRA", "MIN_TORCH", "DataParallel", "check_torch_version", "launched"]

EXTRA = "pip install 'pyxtts[distributed]'"
MIN_TORCH = (2, 4)  # the [distributed] extra's torch>=2.4
ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_TIMEOUT_S = 600.0  # a collective that waits longer than this ends the job (a hung or dead process)
DEFAULT_BUCKET_BYTES = 25 << 20  # DDP's bucket_cap_mb: fewer, larger collectives below it
ALIGN_ELEMENTS = 64  # the flat buffer's tensors start 256 bytes apart at most: gaps are padding


def _torch() -> tuple[Any, Any]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise ImportError(f"training on several processes needs torch.distributed, which is not installed "
                          f"({exc}); install it with: {EXTRA}") from exc
    check_torch_version(torch.__version__)
    if not dist.is_available():
        raise ImportError(f"this torch ({torch.__version__}) was built without torch.distributed; install a build "
                          f"that has it: {EXTRA}")
    return torch, dist


def check_torch_version(version: str) -> None:
    """ImportError when torch ``version`` (its ``__version__``, "2.3.1+cu121") is older than
    ``MIN_TORCH``, naming it and the command that installs a newer one; a version that
    does not read as one (a build of its own) is taken as it is."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is not None and (int(m.group(1)), int(m.group(2))) < MIN_TORCH:
        least = ".".join(map(str, MIN_TORCH))
        raise ImportError(f"training on several processes needs torch >= {least}, and this is torch {version}; "
                          f"install a newer one with: pip install 'torch>={least}' (what {EXTRA} asks for)")


def launched() -> bool:
    """Whether this process was started by torchrun (or alike) as one of several: its
    environment has RANK, WORLD_SIZE > 1 and LOCAL_RANK."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ and "LOCAL_RANK" in os.environ
    except ValueError:
        return False


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"{name} is not set: start the processes with torchrun (torchrun --nproc_per_node=N -m "
                         "pyxtts train ...), which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: expected an int, got {value!r}") from None


class _Buckets:
    """The all-reduce of one step's gradients, launched bucket by bucket as the backward
    finishes them (``XTTSGPT.forward_backward``'s ``on_gradients``). Groups arrive top-down
    in memory; a group that ends just below the open bucket (the gap between them is the
    buffer's zero padding) joins it, and a bucket of ``bucket_bytes`` or more is launched.
    Every process sees the same groups in the same order, so every process launches the
    same collectives in the same order."""

    def __init__(self, dist: Any, grads: Any, bucket_bytes: int) -> None:
        self._dist, self._grads, self._cap = dist, grads, bucket_bytes
        self._lo = self._hi = 0
        self._works: list = []
        self.covered = 0  # elements launched

    def __call__(self, offset: int, count: int) -> None:
        end = offset + count
        if self._hi > self._lo and 0 <= self._lo - end < ALIGN_ELEMENTS:
            self._lo = offset
        else:
            self.flush()
            self._lo, self._hi = offset, end
        if (self._hi - self._lo) * 4 >= self._cap:
            self.flush()

    def flush(self) -> None:
        if self._hi > self._lo:
            bucket = self._grads[self._lo:self._hi]
            self._works.append(self._dist.all_reduce(bucket, op=self._dist.ReduceOp.SUM, async_op=True))
            self.covered += self._hi - self._lo
        self._lo = self._hi = 0

    def wait(self) -> None:
        """Launches what is left, then waits for every bucket's sum."""
        self.flush()
        for work in self._works:
            work.wait()
        self._works.clear()


class DataParallel:
    """The strategy of ``WORLD_SIZE`` processes started by torchrun. ``device``: this
    process's device ("cpu" or "cuda:N"; default: ``cuda:LOCAL_RANK`` where pyxtts has a
    GPU, else the CPU); the backend is NCCL for a GPU, gloo for the CPU. ``timeout_s``: how
    long a collective waits for the other processes before it raises (a process that died
    or hangs ends the job instead of stalling it). The process group is joined here, or
    taken as it is when the caller already initialised one. ``bucket_bytes``: the size of
    the gradient buckets whose all-reduce overlaps the backward (0: one collective over
    every gradient once the backward is done)."""

    def __init__(self, device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        import pyxtts

        torch, dist = _torch()
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 0:
            raise ValueError(f"bucket_bytes: expected an int >= 0 (bytes; 0: no overlap), got {bucket_bytes!r}")
        self.bucket_bytes = bucket_bytes
        self._buckets: _Buckets | None = None
        self._torch, self._dist = torch, dist
        self.local_rank = _env_int("LOCAL_RANK")
        if device is None:
            device = f"cuda:{self.local_rank}" if pyxtts.device_count() > 0 else "cpu"
        if not isinstance(device, str) or not (device == "cpu" or device.startswith("cuda:")):
            raise ValueError(f"device: expected 'cpu' or 'cuda:N', got {device!r}")
        self.device = device
        self.cuda = device != "cpu"
        self.timeout_s = float(timeout_s)
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            _env_int("RANK")
            _env_int("WORLD_SIZE")
            if self.cuda:
                torch.cuda.set_device(int(device.split(":")[1]))
            dist.init_process_group("nccl" if self.cuda else "gloo", init_method="env://",
                                    timeout=timedelta(seconds=self.timeout_s))
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self._tensor_device = torch.device(device) if self.cuda else torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> tuple[int, int]:
        """This process's rows [lo, hi) of a global batch of ``n`` rows."""
        if n < self.world_size:
            raise ValueError(f"a global batch of {n} rows cannot be shared by {self.world_size} processes: each needs "
                             "at least one (raise data.batch_size x gradient_accumulation_steps)")
        return contiguous_slice(n, self.world_size, self.rank)

    def _reduce(self, values: list, dtype: Any, op: Any) -> list:
        t = self._torch.tensor(values, dtype=dtype, device=self._tensor_device)
        self._dist.all_reduce(t, op=op)
        return t.tolist()

    def reduce_counts(self, counts: tuple[int, int]) -> tuple[int, int]:
        text, audio = self._reduce(list(counts), self._torch.int64, self._dist.ReduceOp.SUM)
        return int(text), int(audio)

    def failed_rank(self, failed: bool) -> int | None:
        """The lowest rank that failed, None when none did."""
        lowest = int(self._reduce([self.rank if failed else self.world_size], self._torch.int64,
                                  self._dist.ReduceOp.MIN)[0])
        return None if lowest == self.world_size else lowest

    def agree(self, micro_batch: int) -> int:
        """The smallest micro-batch of any process."""
        return int(self._reduce([micro_batch], self._torch.int64, self._dist.ReduceOp.MIN)[0])

    def gradient_hook(self, model: Any) -> Callable[[int, int], None] | None:
        """The ``on_gradients`` of the step's last micro-batch: it launches the all-reduce of
        each bucket of finished gradients during the backward (None when ``bucket_bytes`` is
        0). On a GPU the launch comes when the group's kernels are queued: NCCL's stream
        waits for torch's current stream, the legacy default stream, which pyxtts's stream
        (a blocking one) runs before. ``all_reduce_grads`` then waits for the buckets."""
        if self.bucket_bytes == 0:
            return None
        self._buckets = _Buckets(self._dist, self._torch.from_dlpack(model.flat_gradients()), self.bucket_bytes)
        return self._buckets

    def all_reduce_grads(self, model: Any) -> None:
        """Sums the flat fp32 gradients of every process, in place, through DLPack: waits for
        the buckets ``gradient_hook`` launched, or all-reduces the whole buffer at once."""
        grads = self._torch.from_dlpack(model.flat_gradients())
        buckets, self._buckets = self._buckets, None
        if buckets is None:
            self._dist.all_reduce(grads, op=self._dist.ReduceOp.SUM)
        else:
            buckets.wait()
        if self.cuda:  # pyxtts's next kernels run on its own stream: the sum must be done
            self._torch.cuda.current_stream(grads.device).synchronize()

    def reduce_losses(self, losses: tuple[float, float]) -> tuple[float, float]:
        text, audio = self._reduce([float(v) for v in losses], self._torch.float64, self._dist.ReduceOp.SUM)
        return text, audio

    def sum_floats(self, values: list[float]) -> list[float]:
        """Each value summed over the processes, in float64."""
        return self._reduce([float(v) for v in values], self._torch.float64, self._dist.ReduceOp.SUM)

    def checksum(self, model: Any) -> int:
        """A 63-bit checksum of every parameter's bits, in name order."""
        import hashlib

        import numpy as np

        h = hashlib.blake2b(digest_size=8)
        for name, tensor in sorted(model.parameters().items()):
            h.update(name.encode())
            h.update(np.ascontiguousarray(tensor.numpy()).view(np.uint8).tobytes())
        return int.from_bytes(h.digest(), "little") >> 1

    def check_identical(self, model: Any) -> None:
        """RuntimeError naming the processes whose parameters differ from rank 0's."""
        mine = self.checksum(model)
        sums = [0] * self.world_size
        sums[self.rank] = mine
        every = self._reduce(sums, self._torch.int64, self._dist.ReduceOp.SUM)
        bad = [r for r, v in enumerate(every) if v != every[0]]
        if bad:
            raise RuntimeError(f"the parameters of rank(s) {', '.join(map(str, bad))} differ from rank 0's: the "
                               "processes no longer train the same model (a non-deterministic kernel, or memory "
                               "corrupted on one of them); stop and resume from the last checkpoint")

    def gather(self, obj: Any) -> list:
        """Every process's ``obj`` (picklable), in rank order, on every process."""
        out: list = [None] * self.world_size
        self._dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Waits for every process (at most ``timeout_s``)."""
        if self.cuda:
            self._dist.barrier(device_ids=[int(self.device.split(":")[1])])
        else:
            self._dist.barrier()

    def close(self) -> None:
        """Leaves the process group this object joined."""
        if self._owns_group and self._dist.is_initialized():
            self._dist.destroy_process_group()

    def communication(self) -> Any:
        """What this process's collectives are planned to take on its device
        (``pyxtts.comm_memory.CommunicationPlan``; None for one process): the reserve a
        memory budget of this device leaves them, NCCL's estimated."""
        from pyxtts.comm_memory import device_communication

        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        return device_communication(self.device, self.world_size, max(1, min(local, self.world_size)))

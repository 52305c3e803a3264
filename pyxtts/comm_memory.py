"""Memory the collectives of several processes take on each process's device: the plan's
``communication`` line (``pyxtts.config.plan_for`` with ``world_size > 1``).

pyxtts's own buffers: none for the gradients. ``DataParallel.all_reduce_grads`` hands the
flat fp32 gradient buffer to torch through DLPack and the backend sums it in place, so there
is no bucket and no copy (torch's DDP copies every gradient into bucket buffers; pyxtts has
one flat buffer already). The scalar collectives (target counts, losses, the out-of-memory
agreement, checksums) are a few bytes each, in tensors torch makes on the device; on a GPU
torch's caching allocator serves them from one small-pool segment (2 MiB, its
``kSmallBuffer``), which is counted.

The backend's:

- **NCCL** (GPUs): device memory for its channels (buffers per connection and protocol, and
  per-channel state), NVLink SHARP buffers where NVLS runs, and the communicator's own
  structures. ``nccl_bytes`` is an upper bound from NCCL's sources (2.30, ``src/init.cc``,
  ``src/transport/p2p.cc``, ``src/channel.cc``, ``src/transport/nvls.cc``) over the world
  size, the processes per machine and NCCL's environment variables, plus what one process
  alone was measured to take: NCCL's kernels and its communicator, 652 MiB on an H200
  (``tests/bench/results/ddp_gpu_h200_run3.json``: world size 1, torch 2.11's NCCL). The
  channels' part is an estimate until ``tests/bench/bench_ddp.py`` has measured several
  GPUs (it records both).
- **gloo** (CPUs): its ring all-reduce sums into the caller's buffer and receives into a
  scratch of two segments of at most ``kMaxSegmentSize`` (1 MiB) each (``gloo/allreduce.cc``):
  2 MiB of host memory, counted on the CPU "device" (host memory is its memory).

Nothing here imports torch: the plan is made on any machine, for a run elsewhere.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from pyxtts._args import integer

__all__ = ["CommunicationPlan", "communication_plan", "device_communication", "gloo_bytes", "nccl_bytes",
           "nccl_plan", "world_of"]

MiB = 2**20

# Every NCCL device allocation is a whole number of these: cuMem's minimum granularity on
# current GPUs (ncclCuMemAlloc rounds up to it; NCCL_CUMEM_ENABLE is on by default), and
# CUDA_IPC_MIN, which p2p.cc rounds each connection's buffer to whatever the allocator.
GRANULE = 2 * MiB
# Channels NCCL can run a collective on (MAXCHANNELS, src/include/device.h: 64 since 2.25,
# 32 before). How many it uses depends on the topology (a few over PCIe, 16 to 32 over
# NVLink); offline that is unknown, so the bound takes the most it may use.
MAX_CHANNELS = 64
NCCL_STEPS = 8
# Per-connection buffer of each protocol, NCCL's defaults (src/init.cc):
LL_BYTES = 8 * 512 * NCCL_STEPS * 16  # LL_LINES_PER_THREAD x LL_MAX_NTHREADS x STEPS x 16-byte line: 512 KiB
LL128_BYTES = 120 * 640 * NCCL_STEPS * 8  # LL128_ELEMS_PER_THREAD x LL128_MAX_NTHREADS x STEPS x 8: 4800 KiB
SIMPLE_BYTES = 4 * MiB  # DEFAULT_BUFFSIZE (NCCL_BUFFSIZE)
CONNECTION_HEADER = 4096  # sizeof(ncclSendMem) == sizeof(ncclRecvMem) == MEM_ALIGN (src/include/comm.h)
# cuMem allocations of one collective channel's state (initChannel, src/channel.cc): the
# shared device peers, this communicator's peer pointers, the ring's user ranks.
CHANNEL_STATE_ALLOCATIONS = 3
# What NCCL takes with no peer at all: its kernels (loaded into device memory at the first
# collective) and the communicator's own allocations. Measured, not derived: the free device
# memory lost at world size 1, less what pyxtts reserved meanwhile, on an H200 with torch
# 2.11's NCCL (tests/bench/results/ddp_gpu_h200_run3.json and _run4, the same bytes in both):
# 648 MiB after the first all-reduce, 654 MiB after a whole step, of which the torch segment
# counted beside this (TORCH_SMALL_SEGMENT) is 2. Another GPU or NCCL loads other code.
NCCL_FIXED_BYTES = 652 * MiB
# NVLink SHARP (NVLS, NVSwitch systems of compute capability 9.0 and up): channels (16 on
# sm_90, 24 or 32 on sm_100: the most) and each channel's chunk (NCCL_NVLS_CHUNKSIZE)
NVLS_CHANNELS = 32
NVLS_CHUNK_BYTES = 128 * 1024
# torch's caching allocator: small tensors come from segments of this size (kSmallBuffer)
TORCH_SMALL_SEGMENT = 2 * MiB
# gloo's ring all-reduce: scratch of two segments of at most kMaxSegmentSize (gloo/allreduce.h)
GLOO_MAX_SEGMENT = 1 * MiB


def _up(n: int, to: int = GRANULE) -> int:
    return -(-n // to) * to


def _pow2_up(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    """An NCCL variable as NCCL reads it (an integer, decimal or 0x hex); None when unset.
    A value NCCL would ignore is a ValueError naming it: the plan would be of another run."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip(), 0)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer (NCCL ignores anything else and runs with its "
                         "default); pyxtts plans NCCL's memory from it") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: expected an integer >= 0")
    return value


def _first(env: Mapping[str, str], *names: str) -> int | None:
    """The first of ``names`` that is set (NCCL's newer name before the legacy one)."""
    for name in names:
        value = _env_int(env, name)
        if value is not None:
            return value
    return None


def nccl_channels(env: Mapping[str, str]) -> int:
    """The most collective channels NCCL may open (src/graph/connect.cc, src/init.cc):
    ``NCCL_MAX_NCHANNELS`` (legacy ``NCCL_MAX_NRINGS``) and ``NCCL_MAX_CTAS`` cap them at
    MAX_CHANNELS or below, ``NCCL_MIN_NCHANNELS`` (``NCCL_MIN_NRINGS``) and ``NCCL_MIN_CTAS``
    raise the floor, and NCCL's own choice lies between."""
    caps = [v for v in (_first(env, "NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS"), _env_int(env, "NCCL_MAX_CTAS"))
            if v is not None]
    floors = [v for v in (_first(env, "NCCL_MIN_NCHANNELS", "NCCL_MIN_NRINGS"), _env_int(env, "NCCL_MIN_CTAS"))
              if v is not None]
    most = max(1, min([MAX_CHANNELS, *caps]))
    return min(MAX_CHANNELS, max([most, *floors]))


def nccl_connection_bytes(env: Mapping[str, str]) -> int:
    """Device bytes of one send and one receive connection (src/transport/p2p.cc): the
    receiver holds every protocol's buffer (LL, LL128, Simple) after a header, the sender
    a header; in P2P read mode the Simple buffer moves to the sender. Each side is rounded
    up to a granule; the bound is the larger layout. Defaults: 2 + 10 MiB (write) or 6 + 6
    MiB (read), 12 MiB. ``NCCL_PROTO`` changes nothing: the buffers of all three protocols
    are allocated whichever run."""
    simple = _env_int(env, "NCCL_BUFFSIZE") or SIMPLE_BYTES
    ll = _env_int(env, "NCCL_LL_BUFFSIZE") or LL_BYTES
    ll128 = _env_int(env, "NCCL_LL128_BUFFSIZE") or LL128_BYTES
    h = CONNECTION_HEADER
    write = _up(h) + _up(h + ll + ll128 + simple)
    read = _up(h + simple) + _up(h + ll + ll128)
    return max(write, read)


def nccl_bytes(world_size: int, local_world_size: int, env: Mapping[str, str] | None = None,
               capability: tuple[int, int] | None = None) -> list[tuple[str, int]]:
    """NCCL's device memory on one process of ``world_size`` (``local_world_size`` of them
    on its machine) for pyxtts's collectives (all-reduce, all-gather, barrier): an upper
    bound, by part. ``env``: NCCL's variables (default: this process's environment, which a
    run launched from this shell inherits). ``capability``: the GPU's compute capability
    when known (NVLS needs 9.0 or newer); None counts NVLS wherever it may run.

    - channels: C = ``nccl_channels(env)`` (64 unless capped);
    - buffers: C x P x ``nccl_connection_bytes`` where P counts this process's peers in a
      channel: the ring's one, and the tree's parent and children where they differ from it
      (NCCL connects each peer once per channel): at most 2 more on one machine (a chain),
      4 more across machines (the tree's parent and up to 3 children), never more than the
      other processes;
    - channel state: pow2(C) channels (the send/receive channels are C rounded up to a
      power of two) x 3 granule-rounded allocations;
    - NVLS, with more than one process on the machine unless ``NCCL_NVLS_ENABLE=0`` or the
      GPU is older than 9.0: channels (``NCCL_NVLS_NCHANNELS``, else 32, capped by
      ``NCCL_MAX_CTAS``) x 2 x chunk (``NCCL_NVLS_CHUNKSIZE``, 128 KiB) x 8 steps x the
      machine's processes (one head each), rounded up to a granule, and a granule per
      channel for its device peers;
    - NCCL's kernels and communicator: ``NCCL_FIXED_BYTES``, measured at world size 1 (all
      that one process takes: no channel has a peer).

    Not counted: host memory (its work FIFO and proxy buffers), CollNet/SHARP (off unless
    ``NCCL_COLLNET_ENABLE``), and PXN, which across machines may place another process's
    network buffers on this GPU."""
    env = os.environ if env is None else env
    world_size = integer("world_size", world_size, minimum=1)
    local_world_size = integer("local_world_size", local_world_size, minimum=1, maximum=world_size)
    fixed = ("NCCL kernels and communicator (measured)", NCCL_FIXED_BYTES)
    if world_size == 1:
        return [fixed]
    nodes = -(-world_size // local_world_size)
    channels = nccl_channels(env)
    peers = min(world_size - 1, 1 + (2 if nodes == 1 else 4))
    parts = [("NCCL channel buffers", channels * peers * nccl_connection_bytes(env)),
             ("NCCL channel state", _pow2_up(channels) * CHANNEL_STATE_ALLOCATIONS * GRANULE)]
    nvls_off = (env.get("NCCL_NVLS_ENABLE", "").strip() == "0" or local_world_size < 2
                or (capability is not None and tuple(capability) < (9, 0)))
    if not nvls_off:
        nvls_channels = _env_int(env, "NCCL_NVLS_NCHANNELS") or NVLS_CHANNELS
        cap = _env_int(env, "NCCL_MAX_CTAS")
        if cap is not None:
            nvls_channels = max(1, min(nvls_channels, cap))
        chunk = _env_int(env, "NCCL_NVLS_CHUNKSIZE") or NVLS_CHUNK_BYTES
        parts.append(("NCCL NVLS buffers", _up(nvls_channels * 2 * chunk * NCCL_STEPS * local_world_size)
                      + nvls_channels * GRANULE))
    parts.append(fixed)
    return parts


def gloo_bytes() -> list[tuple[str, int]]:
    """gloo's host memory on one process for an all-reduce: the ring's scratch, two
    segments of at most 1 MiB, whatever the buffer's size (gloo/allreduce.cc). Its pairs
    (one TCP connection per peer) keep no buffer of the data."""
    return [("gloo all-reduce scratch", 2 * GLOO_MAX_SEGMENT)]


@dataclass(frozen=True)
class CommunicationPlan:
    """What the collectives of ``world_size`` processes take on one process's device:
    ``parts`` (what, bytes), all of them in ``total``. ``estimated``: NCCL's channels are an
    upper bound from its sources, not yet measured on several GPUs."""

    backend: str  # "nccl" or "gloo"
    world_size: int
    local_world_size: int
    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.parts)

    @property
    def estimated(self) -> bool:
        return self.backend == "nccl"

    @property
    def nodes(self) -> int:
        return -(-self.world_size // self.local_world_size)

    @property
    def label(self) -> str:
        """The plan's line: "communication (NCCL, estimated)" or "communication (gloo)"."""
        return "communication (NCCL, estimated)" if self.estimated else "communication (gloo)"


def _on_gpu(device: str | int) -> bool:
    return (isinstance(device, int) and not isinstance(device, bool)) or str(device).startswith("cuda")


def communication_plan(device: str | int, world_size: int, local_world_size: int | None = None,
                       env: Mapping[str, str] | None = None,
                       capability: tuple[int, int] | None = None) -> CommunicationPlan | None:
    """The collectives' memory on ``device`` for one of ``world_size`` processes
    (``local_world_size`` per machine, default all on one), over NCCL on a GPU and gloo on
    the CPU, as ``pyxtts.distributed.DataParallel`` picks; None for one process, which
    communicates with nobody."""
    world_size = integer("world_size", world_size, minimum=1)
    if world_size == 1:
        return None
    local = world_size if local_world_size is None else local_world_size
    local = integer("local_world_size", local, minimum=1, maximum=world_size)
    if _on_gpu(device):
        return nccl_plan(world_size, local, env, capability)
    return CommunicationPlan("gloo", world_size, local, tuple(gloo_bytes()))


def nccl_plan(world_size: int, local_world_size: int, env: Mapping[str, str] | None = None,
              capability: tuple[int, int] | None = None) -> CommunicationPlan:
    """One GPU process's collectives over NCCL: torch's small-pool segment and
    ``nccl_bytes``. Also for world size 1, which only a benchmark runs over NCCL (the
    product makes no process group for one process: ``communication_plan`` says None)."""
    own = [("torch small-pool segment (scalar collectives)", TORCH_SMALL_SEGMENT)]
    return CommunicationPlan("nccl", world_size, local_world_size,
                             tuple(own + nccl_bytes(world_size, local_world_size, env, capability)))


def device_communication(device: str | int, world_size: int,
                         local_world_size: int | None = None) -> CommunicationPlan | None:
    """``communication_plan`` for a device by its name, this process's environment read for
    NCCL's variables; a GPU that is in this machine gives its compute capability (NVLS is
    left out below 9.0), one elsewhere is planned for as if NVLS may run."""
    capability = None
    if world_size != 1 and _on_gpu(device):
        from pyxtts import _C

        try:
            capability = tuple(_C.device_info(device)["capability"])
        except ValueError:  # not in this machine (or this build): planned for elsewhere
            capability = None
    return communication_plan(device, world_size, local_world_size, capability=capability)


def world_of(world_size: int | None = None, nodes: int | None = None,
             env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(processes, processes per machine) a plan is for. ``world_size`` given: that many,
    spread evenly over ``nodes`` machines (default 1; the larger share where they do not
    divide). None: this process's own world, torchrun's ``WORLD_SIZE`` and
    ``LOCAL_WORLD_SIZE`` when it started this process as one of several, else one."""
    if world_size is None:
        if nodes is not None:
            raise ValueError(f"nodes: given ({nodes!r}) without world_size; say how many processes in all")
        from pyxtts.distributed import launched

        env = os.environ if env is None else env
        if not launched():
            return 1, 1
        world = int(env["WORLD_SIZE"])
        local = env.get("LOCAL_WORLD_SIZE")
        try:
            per_node = int(local) if local is not None else world
        except ValueError:
            raise ValueError(f"LOCAL_WORLD_SIZE: expected an int, got {local!r}") from None
        return world, min(max(per_node, 1), world)
    world = integer("world_size", world_size, minimum=1)
    machines = integer("nodes", 1 if nodes is None else nodes, minimum=1, maximum=world)
    return world, -(-world // machines)

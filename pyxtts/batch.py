"""Batch size and accumulation: the largest batch the memory plan allows, verified by
one real step, and an accumulating training step that survives out-of-memory errors."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, cast

import numpy as np

from pyxtts import _C
from pyxtts._args import flag, integer, real
from pyxtts._interrupts import begin_commit
from pyxtts.memory import cleanup_gpu_memory
from pyxtts.model import XTTSGPT
from pyxtts.strategy import SingleProcess, Strategy

_MAX_SEARCH = 1 << 20  # upper end of the exponential search when max_batch_size is None
_MAX_VERIFY_STEPS = 3


# ---- snapshots: a trial step never trains the model ---------------------------------

def _snapshot(model, optimizer) -> tuple:
    params = model.state_dict()
    grads = {k: v.numpy() for k, v in model.gradients().items()}
    opt = optimizer.state_dict() if optimizer is not None else None
    return params, grads, opt, model.dropout_step


def _restore(model, optimizer, snap: tuple) -> None:
    """Puts the snapshot back. Nothing here allocates from a device's allocator (the
    writes copy host arrays into the existing buffers), so an out-of-memory error cannot
    interrupt it half way."""
    params, grads, opt, dropout_step = snap
    if optimizer is not None:
        optimizer.load_state_dict(opt)
    model.load_state_dict(params)
    model._write("gradients", grads)
    model.dropout_step = dropout_step


def _limit(device: str) -> int:
    s = _C.memory_stats(device)
    return s["limit_bytes"] if s["limit_bytes"] is not None else s["device_total_bytes"]


def _budget(device: str, safety_margin: float) -> int:
    return int(_limit(device) * (1.0 - safety_margin))


def _synthetic_batch(config, batch_size: int, text_len: int, audio_len: int, cond_len: int,
                     cond_frames: int = 0) -> dict:
    """A full-length batch (every position valid) for the verification step: cond_mels of
    cond_frames frames when given, else cond_len fixed latents."""
    rng = np.random.default_rng(0)
    B = batch_size
    batch = {
        "text_inputs": rng.integers(0, config.text_vocab_size, (B, text_len)),
        "text_targets": rng.integers(0, config.text_vocab_size, (B, text_len)),
        "audio_inputs": rng.integers(0, config.audio_vocab_size, (B, audio_len)),
        "audio_targets": rng.integers(0, config.audio_vocab_size, (B, audio_len)),
        "text_lengths": np.full(B, text_len), "audio_lengths": np.full(B, audio_len),
    }
    if cond_frames:
        batch["cond_mels"] = rng.standard_normal((B, 80, cond_frames)).astype(np.float32)
    elif cond_len:
        batch["cond_latents"] = rng.standard_normal((B, cond_len, config.d_model)).astype(np.float32)
    return batch


def _positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    return integer(name, value, minimum=1)


def _model(model: Any) -> XTTSGPT:
    if not isinstance(model, XTTSGPT):
        raise TypeError(f"model: expected a pyxtts.XTTSGPT, got {type(model).__name__}")
    return model


def _optimizer(where: str, optimizer: Any, model: XTTSGPT, optional: bool = False) -> Any:
    """An AdamW built on ``model``: another model's would step that one, silently."""
    if optimizer is None and optional:
        return None
    if not isinstance(optimizer, _C.AdamW):
        expected = "a pyxtts.AdamW or None" if optional else "a pyxtts.AdamW"
        raise TypeError(f"optimizer: expected {expected}, got {type(optimizer).__name__}")
    if not optimizer.steps(model):
        raise ValueError(f"optimizer: this AdamW was built on another model, not the one {where} was given; "
                         "build one on this model (pyxtts.AdamW(model, ...))")
    return optimizer


_STRATEGY_METHODS = ("shard", "reduce_counts", "failed_rank", "agree", "gradient_hook", "all_reduce_grads",
                     "reduce_losses", "sum_floats", "barrier")


def _strategy(strategy: Any) -> Strategy:
    if strategy is None:
        return SingleProcess()
    missing = [m for m in _STRATEGY_METHODS if not callable(getattr(strategy, m, None))]
    if missing or not isinstance(getattr(strategy, "world_size", None), int):
        raise TypeError(f"strategy: expected None or a pyxtts.distributed.DataParallel, got "
                        f"{strategy!r}")
    return cast(Strategy, strategy)


def largest_fitting(fits, start: int = 1, cap: int | None = None) -> int | None:
    """Largest b in [start, cap] with fits(b) for a fits that is monotone (true up to
    some size, false above it): doubling from start (up to 2**20 without a cap), then
    bisection. None when start does not fit."""
    if not fits(start):
        return None
    lo, hi = start, None  # lo fits; hi, once known, does not
    if cap is not None:
        if fits(cap):
            return cap
        hi = cap
    else:
        b = start
        while hi is None:
            b = min(b * 2, _MAX_SEARCH)
            if not fits(b):
                hi = b
            elif b == _MAX_SEARCH:
                return b
            else:
                lo = b
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def find_optimal_batch_size(model, optimizer=None, text_len: int | None = None,
                            audio_len: int | None = None, start_batch_size: int = 1,
                            max_batch_size: int | None = None, safety_margin: float = 0.05,
                            verify: bool = True, offload: bool = False, strategy: Strategy | None = None) -> int:
    """The largest batch size whose step fits the device's memory budget (``_find_here``).
    With a ``strategy`` of several processes each process searches its own device, and all
    return the smallest answer; when one of them finds none, every process raises (that
    process its own error, the others one that names it)."""
    where = "find_optimal_batch_size"
    model = _model(model)
    optimizer = _optimizer(where, optimizer, model, optional=True)
    strategy = _strategy(strategy)
    offload = flag("offload", offload)
    if optimizer is not None:  # its state is counted where it lives
        if offload and optimizer.state_device != "cpu":
            raise ValueError("offload: True plans the optimizer's state in host memory, but the given "
                             "optimizer keeps it on the device (state_device=None); pass an AdamW built with "
                             "state_device='cpu', or offload=False")
        offload = optimizer.state_device == "cpu"
    args = (model, optimizer, text_len, audio_len, start_batch_size, max_batch_size, safety_margin, verify, offload)
    if strategy.world_size == 1:
        return _find_here(*args)
    size = error = None
    try:
        size = _find_here(*args)
    except (_C.OutOfMemoryError, ValueError) as exc:
        error = exc
    failed = strategy.failed_rank(error is not None)
    if error is not None:
        raise error
    if failed is not None:
        raise _C.OutOfMemoryError(f"find_optimal_batch_size: rank {failed} of {strategy.world_size} found no batch "
                                  f"size that fits its device (this is rank {strategy.rank}); see its error")
    return strategy.agree(size)


def _find_here(model, optimizer, text_len: int | None, audio_len: int | None, start_batch_size: int,
               max_batch_size: int | None, safety_margin: float, verify: bool, offload: bool) -> int:
    """The largest batch size whose step fits this device's memory budget.

    The budget is the device's limit (``set_memory_limit``/``set_memory_fraction``) or, with
    none set, its total memory, less ``safety_margin`` (a fraction) and less whatever else is
    allocated on the device besides the model and the optimizer. The memory plan of a step at
    the longest sequences (``text_len``/``audio_len``, default the config's maxima, with
    ``n_cond_latents`` conditioning latents made from ``max_cond_frames`` mel frames by the
    conditioning path when the model has one; the optimizer's state counted) is solved for the
    batch size by bisection — nothing is allocated for that. With ``verify`` one real
    forward, backward and optimizer step runs at the chosen size on a synthetic full-length
    batch; on an out-of-memory error the next smaller size the plan allows (at least one less)
    is tried, at most 3 real steps in all, the last of them at ``start_batch_size``. Parameters, gradients and the optimizer's state are
    restored exactly afterwards: the search never trains the model. With no ``optimizer`` a
    temporary default ``AdamW`` takes the step (its state in host memory with ``offload``;
    a given optimizer's state counts where it lives). Raises ``OutOfMemoryError`` when not even
    ``start_batch_size`` fits a real step, ``ValueError`` when the plan says it cannot."""
    c = model.config
    text_len = c.max_text_tokens if text_len is None else _positive_int("text_len", text_len)
    audio_len = c.max_audio_tokens if audio_len is None else _positive_int("audio_len", audio_len)
    start = _positive_int("start_batch_size", start_batch_size)
    cap = _positive_int("max_batch_size", max_batch_size, allow_none=True)
    if cap is not None and cap < start:
        raise ValueError(f"max_batch_size: {cap} is smaller than start_batch_size={start}")
    safety_margin = real("safety_margin", safety_margin, minimum=0.0, maximum=1.0, below=True)
    verify = flag("verify", verify)
    offload = flag("offload", offload)
    cond_len, frames = c.n_cond_latents, c.planned_cond_frames
    device = model.device
    model.release_memory()  # a cached step arena is not part of the budget's "else"
    budget = _budget(device, safety_margin)
    limit = _limit(device)
    base = model.estimate_memory(1, text_len, audio_len, cond_len, optimizer=True, cond_frames=frames,
                                 offload=offload)
    # bytes allocated on the device that are neither the model's nor the optimizer's. The
    # free space inside their segments is counted as free: the step's blocks below 10 MiB
    # can be carved from it, larger ones cannot (a verification step that finds so re-plans)
    resident = base.parameters + base.gradients + base.optimizer
    foreign = max(0, _C.memory_stats(device)["allocated_bytes"] - resident)

    def plan_total(b: int, avail: int) -> int | None:
        try:
            plan = model.estimate_memory(b, text_len, audio_len, cond_len, budget=avail, optimizer=True,
                                         cond_frames=frames, offload=offload)
        except ValueError:  # past the engine's limit on the rows of one step: does not fit
            return None
        return plan.total + foreign

    def fits(b: int, avail: int) -> bool:
        total = plan_total(b, avail)
        return total is not None and total <= avail

    def solve(avail: int, hi_cap: int | None) -> int | None:
        return largest_fitting(lambda b: fits(b, avail), start, hi_cap)

    size = solve(budget, cap)
    if size is None:
        plan = model.estimate_memory(start, text_len, audio_len, cond_len, budget=budget, optimizer=True,
                                     cond_frames=frames, offload=offload)
        raise ValueError(f"find_optimal_batch_size: a step at batch size {start} x {text_len} text + "
                         f"{audio_len} audio tokens needs {plan.total + foreign} bytes, over the budget of "
                         f"{budget} bytes on {device} (safety margin {safety_margin:.0%}); shorten the "
                         "sequences, enable checkpointing or lower the precision")
    if not verify:
        return size

    opt = optimizer if optimizer is not None else _C.AdamW(model, state_device="cpu" if offload else None)
    snap = _snapshot(model, optimizer if optimizer is not None else None)
    try:
        for attempt in range(_MAX_VERIFY_STEPS):
            deficit = None
            try:
                opt.zero_grad()
                model.forward_backward(_synthetic_batch(c, size, text_len, audio_len, cond_len, frames),
                                       loss_scale=opt.loss_scale)
                opt.step()
            except _C.OutOfMemoryError as exc:
                deficit = 0
                if exc.limit_bytes is not None:
                    deficit = max(0, exc.requested_bytes + exc.reserved_bytes - exc.limit_bytes)
            if deficit is None:
                return size
            # outside the except block: the traceback (and what its frames hold) is gone
            model.release_memory()
            cleanup_gpu_memory(device)
            if size == start:
                break
            # the failed size's planned total was short by the deficit: plan below that less
            # the margin, not below the budget less the deficit (which kept the failed size's
            # slack, so the second try failed too: a 64 MiB limit once found 1 where 13 fits)
            failed = plan_total(size, budget)
            avail = (min(budget, failed) if failed is not None else budget) - deficit - (limit - budget)
            smaller = solve(avail, size - 1)
            size = start if smaller is None else min(smaller, size - 1)
            if attempt == _MAX_VERIFY_STEPS - 2:
                # the last try is start_batch_size itself, so that the error below is
                # true: on small budgets the segments the allocator reserves for a large
                # batch can exceed the plan by more than the safety margin
                size = start
        raise _C.OutOfMemoryError(
            f"find_optimal_batch_size: out of memory: a real step of batch size {start} x {text_len} text + "
            f"{audio_len} audio tokens does not fit on {device}")
    finally:
        try:
            _restore(model, optimizer, snap)
        finally:  # the trial's arena and temporary optimizer go whatever happened
            if optimizer is None:
                del opt
            model.release_memory()
            cleanup_gpu_memory(device)


# ---- accumulation ----------------------------------------------------------------------

@dataclass
class StepResult:
    """One optimizer step over a whole batch, however many micro-batches it took."""

    loss: float
    text_loss: float
    audio_loss: float
    grad_norm: float
    skipped: bool
    micro_batch_size: int  # the micro-batch size that finally ran (the largest piece)
    oom_splits: int  # how often the micro-batch was halved after an out-of-memory error
    tokens_per_s: float  # valid targets (text + audio) of the batch per second of the call
    peak_memory_bytes: int  # peak allocated bytes on the model's device during the call
    text_tokens: int = 0  # valid text targets of the whole batch
    audio_tokens: int = 0  # valid audio targets of the whole batch


def _rows(batch: Mapping[str, Any], lo: int, hi: int) -> dict:
    return {k: (v.numpy() if isinstance(v, _C.Tensor) else np.asarray(v))[lo:hi] for k, v in batch.items()}


def _splits(n: int, pieces: int) -> list[tuple[int, int]]:
    """n rows in `pieces` contiguous parts, sizes differing by at most one (10/4: 3,3,2,2)."""
    q, r = divmod(n, pieces)
    out, lo = [], 0
    for i in range(pieces):
        hi = lo + q + (1 if i < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


def train_step_with_accumulation(model, optimizer, batch: Mapping[str, Any],
                                 accumulation_steps: int, strategy: Strategy | None = None,
                                 first_row: int = 0) -> StepResult:
    """One optimizer step over ``batch``, run as ``accumulation_steps`` micro-batches.

    The rows are split into contiguous micro-batches whose sizes differ by at most one
    (no row is dropped: 10 rows in 4 steps run as 3, 3, 2, 2). Each micro-batch is
    normalised by the whole batch's valid-target counts and scaled by
    ``optimizer.loss_scale``, so the accumulated gradient is the big batch's. The gradients
    are zeroed once the first micro-batch's memory is reserved; the others, a row fewer at
    most, run in that memory and allocate nothing. Every micro-batch draws its dropout masks at the model's
    ``dropout_step`` with its rows numbered as in the whole batch, so the masks are the whole
    batch's, whatever the split; the step counter then advances by one. On
    ``OutOfMemoryError`` (only the first micro-batch's reservation can raise it, before any
    gradient is touched) the caches are released, the micro-batch halved and the whole
    batch redone: the step is, bit for bit, the step of a call made with the
    micro-batch that fitted (``micro_batch_size``), and the same mathematical step as one
    that never ran out of memory — it differs from that one only by the order of the fp32
    gradient sums (a few ulp). The error is raised only when a micro-batch of one sample
    does not fit; then the parameters, gradients, the optimizer's state and
    ``dropout_step`` are as before the call. Resets the device's peak-memory statistics.

    With a ``strategy`` of several processes (``pyxtts.distributed.DataParallel``), ``batch``
    is this process's rows of the global batch (``strategy.shard``), ``first_row`` the
    global number of its first row (its dropout masks are those rows'); the counts, the
    gradients and the reported losses are the global batch's, an out-of-memory error on any
    process halves every process's micro-batch, and every process takes the same optimizer
    step. The processes agree that the last micro-batch's memory is reserved before it
    runs; its backward then starts the gradients' all-reduce group by group
    (``strategy.gradient_hook``), overlapping the rest of the backward. The default,
    ``SingleProcess``, is the step above."""
    where = "train_step_with_accumulation"
    model = _model(model)
    optimizer = _optimizer(where, optimizer, model)
    steps = _positive_int("accumulation_steps", accumulation_steps)
    strategy = _strategy(strategy)
    first_row = integer("first_row", first_row, minimum=0)
    _, counts = model._prepare(batch)  # validates the whole batch before any work
    n_text, n_audio = strategy.reduce_counts((int(counts[0]), int(counts[1])))
    first = next(iter(batch.values()))
    n = int(first.shape[0] if isinstance(first, _C.Tensor) else np.asarray(first).shape[0])
    device = model.device
    _C.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    micro = -(-n // min(steps, n))  # ceil: the largest piece
    pieces = min(steps, n)
    splits = 0
    dropout_step = model.dropout_step

    def micro_batch(lo: int, hi: int, rows: dict, hook: Callable[[int, int], None] | None = None) -> dict:
        return model.forward_backward(rows, token_counts=(n_text, n_audio), loss_scale=optimizer.loss_scale,
                                      dropout_step=dropout_step, sample_offset=first_row + lo,
                                      zero_grad=lo == 0, keep_larger_arena=True, on_gradients=hook)

    while True:
        parts = _splits(n, pieces)
        text = audio = 0.0
        try:
            for lo, hi in parts[:-1]:
                r = micro_batch(lo, hi, _rows(batch, lo, hi))
                text += r["text_loss"]
                audio += r["audio_loss"]
            last = _rows(batch, *parts[-1])
            model._reserve_step(last)  # the last micro-batch's memory: after this nothing runs out of it
            reserved = True
        except _C.OutOfMemoryError:
            if micro == 1 and strategy.world_size == 1:
                raise
            reserved = False
        # every process has the last micro-batch's memory, or all retry: only now may the
        # gradients' all-reduce start, during that micro-batch's backward
        failed = strategy.failed_rank(not reserved)  # one process: None when reserved
        if failed is None:
            r = micro_batch(parts[-1][0], parts[-1][1], last, strategy.gradient_hook(model))
            out = (text + r["text_loss"], audio + r["audio_loss"])
            break
        # outside the except block, so the traceback's frames are already released
        cleanup_gpu_memory(device)
        model.release_memory()
        if strategy.agree(micro) == 1:  # several processes: one has no smaller micro-batch left
            raise _C.OutOfMemoryError(f"train_step_with_accumulation: out of memory on rank {failed} of "
                                      f"{strategy.world_size} (this is rank {strategy.rank}) with a micro-batch of "
                                      "one sample; every process stops with its parameters and optimizer state as "
                                      "before the step")
        micro = max(1, micro // 2)
        pieces = -(-n // micro)
        micro = -(-n // pieces)
        splits += 1
    strategy.all_reduce_grads(model)
    text, audio = strategy.reduce_losses(out)
    begin_commit()  # a Trainer holds Ctrl-C from here until it has counted the step (pyxtts._interrupts)
    step = optimizer.step()  # allocates nothing: AdamW reserves its state when it is built
    model.dropout_step = dropout_step + 1
    elapsed = time.perf_counter() - t0
    c = model.config
    return StepResult(
        loss=c.text_loss_weight * text + c.audio_loss_weight * audio, text_loss=text, audio_loss=audio,
        grad_norm=float(step["grad_norm"]), skipped=bool(step["skipped"]), micro_batch_size=micro,
        oom_splits=splits, tokens_per_s=(n_text + n_audio) / elapsed if elapsed > 0 else float("inf"),
        peak_memory_bytes=int(_C.memory_stats(device)["peak_allocated_bytes"]),
        text_tokens=int(n_text), audio_tokens=int(n_audio))

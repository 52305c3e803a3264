"""``pyxtts memtest``: a config's memory plan against a device and the host, one real
step at the longest sequences the config allows, predicted vs measured, a verdict and
advice that names the settings that fit.

    report = run_memtest(XTTSConfig.load("gpu_12gb"), device="cuda", memory="12GiB", step=False)
    print(report.text)

A device that is not in this machine is planned for when its memory is given (the
step is then left out): a user preparing a run for an 8 GB card elsewhere gets that
card's plan. The host check is this machine's available memory against the host pool an
offloaded optimizer reserves. For one of several processes (``world_size``, or torchrun's
own) the plan counts their collectives' memory on the device (``pyxtts.comm_memory``).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from pyxtts import _C
from pyxtts._args import as_flags, integer
from pyxtts.comm_memory import device_communication, world_of
from pyxtts.config import (SIZE_TIERS, XTTSConfig, _on_gpu, decimal_unit_note, device_present, offload_for,
                           optimize_config, parse_memory_size, plan_for, shipped_configs)
from pyxtts.memory import cleanup_gpu_memory
from pyxtts.memory import format_bytes as fb
from pyxtts.model import MemoryPlan

__all__ = ["MemtestReport", "memtest", "run_memtest"]

TIGHT = 0.10  # under this share of the budget left over, the verdict is "tight"


@dataclass
class MemtestReport:
    """What ``run_memtest`` found. ``verdict``: "fits", "tight" or "does not fit"."""

    device: str
    budget: int  # device memory x max_memory_fraction (bytes)
    plan: MemoryPlan
    verdict: str
    offload: bool = False  # the optimizer's state in host memory (training.optimizer_offload resolved)
    host_available: int | None = None  # this machine's available memory (MemAvailable), with offload
    host_needed: int = 0  # the host memory the offloaded states of the processes on one machine need
    short: str | None = None  # "device" or "host": the memory that is short, when the plan does not fit
    measured_peak: int | None = None  # allocator peak during the real step (bytes)
    measured_rss: int | None = None  # process peak RSS after the step (bytes)
    step_time_s: float | None = None
    oom: str | None = None  # the OutOfMemoryError's message, when the real step ran out
    split_micro_batch: int | None = None  # the smaller micro-batch a step that ran out went through with
    advice: list[str] = field(default_factory=list)
    text: str = ""


def _largest_batch(config: XTTSConfig, device: str, policy: str, offload: bool, limit: int,
                   world: tuple[int, int] = (1, 1)) -> int:
    """Largest micro-batch whose plan fits ``limit`` (0 when not even 1 does), counted as the
    verdict counts it (on the CPU an offloaded optimizer state is in the same memory)."""
    from pyxtts.batch import largest_fitting

    def fits(b: int) -> bool:
        return _on_device_bytes(plan_for(config, device, micro_batch=b, checkpointing=policy, offload=offload,
                                         world_size=world[0], nodes=world[1]), device) <= limit

    return largest_fitting(fits) or 0


def _synthetic_step(config: XTTSConfig, device: str, batch_size: int, offload: bool) -> tuple[int, float, int]:
    """One real training step (forward, backward, AdamW) at the longest sequences with a
    fresh model and optimizer; returns (allocator peak, seconds, the micro-batch that ran).
    A micro-batch smaller than ``batch_size`` means the step ran out of memory and was
    redone in halves (``train_step_with_accumulation``): the batch did not fit. Model and
    optimizer die with the call (the caller empties the cache once an OutOfMemoryError's
    traceback is gone too)."""
    from pyxtts.batch import _synthetic_batch, train_step_with_accumulation
    from pyxtts.trainer import model_from_config, optimizer_from_config

    d, m = config.data, config.model
    model = model_from_config(config, device)
    opt = optimizer_from_config(model, config.training, offload=offload)
    batch = _synthetic_batch(m, batch_size, d.max_text_tokens, d.max_audio_tokens, m.n_cond_latents,
                             m.planned_cond_frames)
    t0 = time.perf_counter()
    r = train_step_with_accumulation(model, opt, batch, 1)
    _C.synchronize(device)
    return r.peak_memory_bytes, time.perf_counter() - t0, r.micro_batch_size


def run_memtest(config: XTTSConfig, batch_size: int | None = None, device: str | None = None,
                memory: int | str | None = None, step: bool = True, verbose: bool = False, *,
                world_size: int | None = None, nodes: int | None = None,
                config_args: str | None = None, before_step: Callable[[str], None] | None = None) -> MemtestReport:
    """Plans a training step of ``config`` (micro-batch ``batch_size`` or
    ``data.batch_size``) for ``device`` with ``memory`` bytes (default: the device's total)
    times ``training.max_memory_fraction``, the optimizer's state where
    ``training.optimizer_offload`` puts it; checks an offloaded state against this
    machine's available memory; with ``step``, runs one real step under that budget (as a
    memory limit) and compares the allocator's peak with the plan. A device this machine
    lacks is planned for when ``memory`` is given (no step); else it is a ``ValueError``
    saying so. ``world_size``/``nodes``: the test of one of that many processes
    (``plan_for``; None: torchrun's world when it started this process, else one): the
    collectives' memory is a line of the plan and counts against the budget, and the real
    step's allocator peak is compared with the rest of the plan. ``config_args``: how the
    command line named the config (``--config X [--vocab V]``), for the command the advice
    gives; default a placeholder. ``before_step``: called with the report's text so far
    (the plan) just before the real step runs, which takes minutes on a CPU at XTTS v2's
    size, so that a command can show the plan first."""
    if not isinstance(config, XTTSConfig):
        raise TypeError(f"config: expected an XTTSConfig, got {type(config).__name__}")
    config = XTTSConfig.from_dict(config.to_dict())  # the caller's config stays as it is
    recipe = XTTSConfig.from_dict(config.to_dict())  # its effective batch: what the advice keeps
    t, d, m = config.training, config.data, config.model
    if batch_size is not None:  # the micro-batch under test; the recipe's effective batch stays
        d.batch_size = integer("batch_size", batch_size, minimum=1)
    dev = t.resolved_device() if device is None else device
    world_size, per_node = world_of(world_size, nodes)
    world = (world_size, -(-world_size // per_node))  # (processes, machines), as plan_for takes them
    here = device_present(dev)
    if not here and memory is None:
        raise ValueError(f"device: {dev} is not in this machine; to plan for it elsewhere give its memory "
                         f"(--memory 8GiB, say): the plan is then computed and no real step runs")
    total = int(_C.device_info(dev)["total_memory"]) if memory is None else parse_memory_size(memory)
    budget = int(total * t.max_memory_fraction)
    offload = offload_for(config, dev, budget=budget, world_size=world[0], nodes=world[1])
    plan = plan_for(config, dev, offload=offload, world_size=world[0], nodes=world[1])
    head = (f"memtest: {m.n_layers} layers x d {m.d_model} ({m.n_heads} heads), micro-batch {d.batch_size} "
            f"x {config.sequence_length} tokens ({m.n_cond_latents} cond + {d.max_text_tokens} text + "
            f"{d.max_audio_tokens} audio), {t.precision}, checkpointing {t.checkpointing}, on {dev}"
            + (", optimizer state in host memory" if offload else ""))
    source = f"(given{decimal_unit_note(memory)})" if memory is not None else "total"
    lines = [head, f"budget: {fb(budget)} = {fb(total)} {source} x max_memory_fraction {t.max_memory_fraction:g}"]
    if plan.communication:
        lines.append(_communication_line(plan, world))
    lines += ["", str(plan)]
    # this machine's memory is the training machine's only when the card is here
    host_avail = int(_C.device_info("cpu")["free_memory"]) if plan.host_total and here else None
    if verbose:
        lines += ["", "per block (policy, activations kept for backward):"]
        lines += [f"  block {i:3d}  {p:9s} {fb(s):>14}"
                  for i, (p, s) in enumerate(zip(plan.policies, plan.saved_per_block))]
        lines.append(f"step arena {fb(plan.arena)} (saved {fb(plan.saved)} + scratch {fb(plan.scratch)}), "
                     f"logits rows per chunk {plan.logits_rows}")
        if plan.communication:
            comm = device_communication(dev, world_size, per_node)
            lines.append(f"{plan.communication_label}, by part:")
            lines += [f"  {what:48s} {fb(n):>14}" for what, n in comm.parts]
    # each process on a machine keeps its own optimizer state in that machine's memory
    report = MemtestReport(device=dev, budget=budget, plan=plan, verdict="", offload=offload,
                           host_available=host_avail, host_needed=plan.host_total * per_node)
    shared = _on_device_bytes(plan, dev) - plan.total
    fits_device = plan.total + shared <= budget
    fits_host = host_avail is None or report.host_needed <= host_avail
    fits_plan = fits_device and fits_host
    report.short = None if fits_plan else "device" if not fits_device else "host"
    lines.append("")
    locked = 'page-locked' if plan.host_pinned else 'pageable'
    if shared:
        lines.append(f"host: the offloaded optimizer state's {fb(plan.host_total)} is in {dev}'s memory too: "
                     f"{fb(plan.total + shared)} in all against the budget (offload saves nothing on the CPU)")
    each = "" if per_node == 1 else (f" in each of the {per_node} processes on a machine, "
                                     f"{fb(report.host_needed)} in all")
    if host_avail is not None:
        lines.append(f"host: the offloaded optimizer state needs {fb(plan.host_total)} ({locked}){each}; this "
                     f"machine has {fb(host_avail)} available{'' if fits_host else ': NOT ENOUGH'}")
    elif plan.host_total:
        lines.append(f"host: the offloaded optimizer state needs {fb(plan.host_total)} ({locked}){each} on the "
                     f"machine that trains ({dev} is not in this one, so its memory is not checked)")
    if step and not here:
        lines.append(f"real step: not run ({dev} is not in this machine: planned for {fb(total)})")
    elif step and fits_plan:
        if before_step is not None:
            before_step("\n".join(lines))
        saved = _C.memory_stats(dev)["limit_bytes"]
        # the allocator's share: the collectives' reserve lies outside it, in the same budget
        _C.set_memory_limit(budget - plan.communication, dev)
        cleanup_gpu_memory(dev)  # earlier work's garbage (a notebook's last run) is not the step's peak
        _C.reset_peak_memory_stats(dev)
        oom = None
        try:
            peak, secs, ran = _synthetic_step(config, dev, d.batch_size, offload)
            if ran < d.batch_size:  # its peak is that of a smaller batch: not a measurement of this one
                oom = (f"micro-batch {d.batch_size} ran out of memory; the step went through only split into "
                       f"micro-batches of {ran}")
                report.split_micro_batch = ran
            else:
                report.measured_peak, report.step_time_s = peak, secs
        except _C.OutOfMemoryError as exc:
            oom = str(exc)
        finally:
            _C.set_memory_limit(saved, dev)
        cleanup_gpu_memory(dev)  # the step's model, optimizer and any traceback are gone now
        from pyxtts.monitor import _peak_rss_bytes

        report.measured_rss = _peak_rss_bytes()
        report.oom = oom
        if oom is None:  # the allocator's peak against the allocator's part of the plan
            planned = plan.allocator_total
            diff = report.measured_peak - planned
            lines.append(f"real step: peak allocated {fb(report.measured_peak)} vs planned {fb(planned)} "
                         f"({'+' if diff >= 0 else '-'}{fb(abs(diff))}, {diff / planned:+.2%}); "
                         f"{report.step_time_s:.2f} s; process peak RSS {fb(report.measured_rss)}"
                         + (f" ({_backend(plan)}'s {fb(plan.communication)} are planned outside the allocator)"
                            if plan.communication else ""))
        else:
            lines.append(f"real step: out of memory under the budget: {oom}")
    elif step:
        lines.append("real step: not run (the plan is over the budget)" if not fits_device else
                     "real step: not run (the host lacks the memory the optimizer state needs)")
    # what the device holds: the allocator's measured peak and the collectives' reserve
    peak = report.measured_peak + plan.communication if report.measured_peak is not None else plan.total + shared
    if not fits_plan or report.oom is not None:
        report.verdict = "does not fit"
    elif budget - peak < TIGHT * budget:
        report.verdict = "tight"
    else:
        report.verdict = "fits"
    if report.oom is not None:
        lines.append(f"verdict: {report.verdict.upper()}: the real step ran out of memory under the budget of "
                     f"{fb(budget)} (planned {fb(plan.total)})")
    elif report.short == "host":
        lines.append(f"verdict: {report.verdict.upper()}: host memory is short: the optimizer state needs "
                     f"{fb(report.host_needed)}{'' if per_node == 1 else f' ({per_node} processes)'}, "
                     f"{fb(host_avail or 0)} is available (the device would take "
                     f"{fb(plan.total)} of {fb(budget)})")
    elif report.short == "device":
        lines.append(f"verdict: {report.verdict.upper()}: device memory is short: {fb(peak)} of {fb(budget)} "
                     f"({peak / budget:.0%} of the budget)")
    else:
        lines.append(f"verdict: {report.verdict.upper()}: {fb(peak)} of {fb(budget)} "
                     f"({peak / budget:.0%} of the budget)")
    report.advice = _advice(config, dev, total, budget, report, world, config_args, recipe)
    lines += [f"advice: {a}" for a in report.advice]
    report.text = "\n".join(lines)
    return report


def _advice(config: XTTSConfig, dev: str, total: int, budget: int, report: MemtestReport,
            world: tuple[int, int] = (1, 1), config_args: str | None = None,
            recipe: XTTSConfig | None = None) -> list[str]:
    """What to change, from the plan. ``config_args``: how the command line named the config
    (``--config X [--vocab V]``), for the optimize-config command the advice gives.
    ``recipe``: the config before a micro-batch given to test, whose effective batch the
    advice keeps (64 under test once made it 64 x the recipe's accumulation)."""
    recipe = config if recipe is None else recipe
    t, d = config.training, config.data
    out: list[str] = []
    plan = report.plan
    if report.short == "device" and plan.communication and plan.allocator_total <= budget:
        # the step alone fits: the collectives' reserve is what puts it over
        out.append(f"the step alone needs {fb(plan.allocator_total)}, within the budget of {fb(budget)}; "
                   f"{_backend(plan)}'s reserve for {world[0]} processes ({fb(plan.communication)}"
                   f"{', estimated' if plan.communication_backend == 'nccl' else ''}) puts it over"
                   + ("" if plan.communication_backend != "nccl" else
                      ": NCCL_MAX_NCHANNELS (fewer channels), NCCL_NVLS_ENABLE=0 or a smaller NCCL_BUFFSIZE "
                      "lower it (docs/distributed.md), or free room with the settings below"))
    effective = recipe.effective_batch_size
    if report.oom is not None:  # the plan fits the budget; the device did not have it
        out.append(f"the plan fits the budget but the device ran out: other allocations on {dev} (another "
                   "process, a fragmented cache) leave less than the budget; free them, lower "
                   "training.max_memory_fraction to what is really there, or use a smaller micro-batch")
        ran = report.split_micro_batch
        if ran is not None:
            micro = max(b for b in range(1, ran + 1) if effective % b == 0)
            out.append(f"micro-batches of {ran} went through: data.batch_size {micro} x "
                       f"gradient_accumulation_steps {effective // micro} keeps the effective batch {effective}")
        return out
    if report.verdict == "does not fit":
        if report.short == "host":
            on_device = plan_for(config, dev, offload=False, world_size=world[0], nodes=world[1]).total
            out.append(f"free host memory for the optimizer state ({fb(report.host_needed)}), or keep the "
                       f"state on the device: training.optimizer_offload false plans {fb(on_device)} there, "
                       f"{'within' if on_device <= budget else 'over'} the budget of {fb(budget)}")
            return out
        try:  # the optimizer's placement is among the settings it may change
            anywhere = recipe.replace(training=dataclasses.replace(recipe.training, optimizer_offload="auto"))
            new, _ = optimize_config(anywhere, total, device=dev, world_size=world[0], nodes=world[1])
            nt, nd = new.training, new.data
            out.append(f"this fits with margin: precision {nt.precision}, checkpointing {nt.checkpointing}, "
                       f"data.batch_size {nd.batch_size} x gradient_accumulation_steps "
                       f"{nt.gradient_accumulation_steps} (effective batch {new.effective_batch_size} kept), "
                       f"training.optimizer_offload {str(nt.optimizer_offload).lower()}; "
                       f"`pyxtts optimize-config {config_args or '--config CONFIG.yaml'} --output NEW.yaml "
                       f"--memory {_size_arg(total)} --device {dev}{_world_flags(world)}` writes it")
        except ValueError as exc:
            out.append(str(exc))
        tier = _fitting_tier(recipe, dev, total, world)
        if tier is not None:
            out.append(f"the shipped tier {tier} (Coqui's recipe for that card size) fits: --config {tier}")
        return out
    largest = _largest_batch(config, dev, t.checkpointing, report.offload, int(budget * (1 - TIGHT)), world)
    # the largest micro-batch that divides the effective batch and leaves 10%: the settings
    # below keep the effective batch (and so the learning rate's meaning)
    micro = max(b for b in range(1, max(1, largest) + 1) if effective % b == 0)
    if report.verdict == "tight":
        out.append("less than 10% of the budget is left: a longer-than-planned batch cannot happen "
                   "(sequences are capped by data.max_*_tokens), but other processes on the device may "
                   f"push it over; data.batch_size {micro} x gradient_accumulation_steps {effective // micro} "
                   f"leaves 10% and keeps the effective batch {effective}")
    elif largest >= effective and t.gradient_accumulation_steps > 1:
        out.append(f"room to spare: the whole effective batch of {effective} fits in one micro-batch "
                   f"(data.batch_size {effective}, gradient_accumulation_steps 1); up to {largest} with 10% left")
    elif largest > d.batch_size and largest < effective and micro > d.batch_size:
        out.append(f"room to spare: micro-batch {largest} fits with 10% left; for the effective batch "
                   f"{effective}: data.batch_size {micro} x gradient_accumulation_steps {effective // micro} "
                   "(fewer, larger micro-batches run faster)")
    elif largest > d.batch_size and t.gradient_accumulation_steps == 1:
        out.append(f"room to spare: micro-batches up to {largest} fit with 10% left (data.batch_size, "
                   "with the learning rate adjusted to the larger batch)")
    if t.checkpointing in ("full", "selective"):
        lighter = "selective" if t.checkpointing == "full" else "none"
        if _largest_batch(config, dev, lighter, report.offload, int(budget * (1 - TIGHT)), world) >= d.batch_size:
            out.append(f"checkpointing {lighter!r} also fits at this micro-batch and recomputes less")
    if report.offload and _on_gpu(dev):  # the state's copies each optimizer step, paid for no memory
        on_device = plan_for(config, dev, offload=False, world_size=world[0], nodes=world[1]).total
        if on_device <= int(budget * (1 - TIGHT)):
            out.append(f"training.optimizer_offload false also fits at this micro-batch ({fb(on_device)} on the "
                       "device, the state there) and saves its copies to and from host memory each optimizer step")
    if not out:
        out.append("the config fits as it is")
    return out


def _fitting_tier(config: XTTSConfig, dev: str, total: int, world: tuple[int, int] = (1, 1)) -> str | None:
    """The largest shipped tier whose plan fits ``total`` bytes of ``dev`` (its own
    fraction and margin), when ``config`` trains the tiers' model; else None."""
    shipped = shipped_configs()
    for name in SIZE_TIERS:
        tier = XTTSConfig.load(shipped[name])
        if tier.model != config.model:
            return None
        budget = int(total * tier.training.max_memory_fraction)
        plan = plan_for(tier, dev, memory=total, world_size=world[0], nodes=world[1])
        if _on_device_bytes(plan, dev) <= budget * (1 - TIGHT):  # the config in use is no advice
            return None if tier.to_dict() == config.to_dict() else name
    return None


def _on_device_bytes(plan: MemoryPlan, dev: str) -> int:
    """What the plan takes of ``dev``'s memory: on the CPU the host pool is that same memory,
    so an offloaded optimizer state counts in it too."""
    return plan.total + (0 if _on_gpu(dev) else plan.host_total)


def _world_flags(world: tuple[int, int]) -> str:
    """The flags that say ``world`` (processes, machines) on the command line; "" for one."""
    if world[0] == 1:
        return ""
    return f" --world-size {world[0]}" + (f" --nodes {world[1]}" if world[1] > 1 else "")


def _communication_line(plan: MemoryPlan, world: tuple[int, int]) -> str:
    """What the plan's communication line is, said once above the table."""
    where = f"{world[0]} processes" + (f" on {world[1]} machines" if world[1] > 1 else " on one machine")
    line = (f"communication: one of {where}; the gradients are all-reduced in place through DLPack (pyxtts "
            f"keeps no copy of them); {_backend(plan)} reserves {fb(plan.communication)} of the device")
    if plan.communication_backend == "nccl":
        line += (" (its channels an upper bound from NCCL's sources and environment variables, not yet measured "
                 "on several GPUs; its kernels and communicator as measured on one H200: docs/distributed.md)")
    return line


def _backend(plan: MemoryPlan) -> str:
    """"NCCL" or "gloo": who takes the plan's communication bytes."""
    return "NCCL" if plan.communication_backend == "nccl" else str(plan.communication_backend)


def _size_arg(nbytes: int) -> str:
    """A size as --memory takes it: whole GiB or MiB where it is one, else bytes."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return str(nbytes)


def memtest(args: argparse.Namespace) -> int:
    """The ``pyxtts memtest`` command: 0 fits (or tight), 1 does not fit, 2 bad input."""
    try:
        config = XTTSConfig.load(args.config)
        if getattr(args, "vocab", None) is not None:
            from pyxtts.text_vocab import vocab_rows_line, with_vocab

            before, config = config, with_vocab(config, args.vocab)
            if int(os.environ.get("RANK", "0")) == 0:  # under torchrun: once, as the report
                print(vocab_rows_line(before, config, args.vocab), flush=True)
        from pyxtts.distributed import launched

        world_size, nodes = world_flags(args)
        if launched():
            return _memtest_every_rank(config, args)
        if args.device is None and config.training.device == "auto" and config.training.resolved_device() == "cpu":
            print("pyxtts memtest: no GPU here, so training.device 'auto' plans for this machine's CPU and RAM; "
                  f"for a GPU elsewhere say which: --device cuda --memory {shlex.quote(args.memory or '8GiB')}",
                  file=sys.stderr)
        again = f"--config {shlex.quote(args.config)}" + (
            f" --vocab {shlex.quote(str(args.vocab))}" if getattr(args, "vocab", None) is not None else "")
        shown: list[str] = []

        def plan_first(text: str) -> None:  # the plan while the step runs (minutes on a CPU)
            print(text, flush=True)
            print(f"real step: running one step of micro-batch {config.data.batch_size} on "
                  f"{args.device or config.training.resolved_device()} (Ctrl-C stops it; --no-step plans only)",
                  file=sys.stderr, flush=True)
            shown.append(text)

        report = run_memtest(config, args.batch_size, args.device, args.memory, step=not args.no_step,
                             verbose=args.verbose, world_size=world_size, nodes=nodes, config_args=again,
                             before_step=plan_first)
    except (ImportError, OSError, TypeError, ValueError) as exc:  # ImportError: torchrun's, without torch.distributed
        print(f"pyxtts memtest: {as_flags('memtest', str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pyxtts memtest: interrupted during the real step; the plan above stands (--no-step plans only)",
              file=sys.stderr)
        return 130
    text = report.text
    if shown and text.startswith(shown[0]):
        text = text[len(shown[0]):].lstrip("\n")
    print(text)
    return 1 if report.verdict == "does not fit" else 0


def world_flags(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """``--world-size N`` and ``--nodes M`` (``memtest``, ``optimize-config``), checked: a
    ValueError names the flag. Under torchrun the world is torchrun's: a ``--world-size``
    that differs from it (or any ``--nodes``) is refused rather than planned for."""
    world_size, nodes = getattr(args, "world_size", None), getattr(args, "nodes", None)
    if world_size is not None and world_size < 1:
        raise ValueError(f"--world-size: expected the number of processes training together, an int >= 1, "
                         f"got {world_size}")
    if nodes is not None:
        if world_size is None:
            raise ValueError("--nodes: give --world-size too (the processes in all, over the --nodes machines)")
        if not 1 <= nodes <= world_size:
            raise ValueError(f"--nodes: expected the machines the {world_size} processes run on, an int in "
                             f"[1, {world_size}], got {nodes}")
    from pyxtts.distributed import launched

    if launched():
        import os

        launched_world = int(os.environ["WORLD_SIZE"])
        if nodes is not None or (world_size is not None and world_size != launched_world):
            flag = "--nodes" if nodes is not None else "--world-size"
            raise ValueError(f"{flag}: torchrun started this process as one of {launched_world}, which is the world "
                             f"planned for; drop {flag}")
    return world_size, nodes


def _memtest_every_rank(config: XTTSConfig, args: argparse.Namespace) -> int:
    """``torchrun ... -m pyxtts memtest``: each process tests its own device (``--device``,
    else cuda:LOCAL_RANK or the CPU) and rank 0 prints every rank's report; the exit status
    is the worst (2 when any process could not test)."""
    from pyxtts.distributed import DataParallel

    dp = DataParallel(args.device)
    try:
        try:
            report = run_memtest(config, args.batch_size, dp.device, args.memory, step=not args.no_step,
                                 verbose=args.verbose)
            mine = (1 if report.verdict == "does not fit" else 0, report.text)
        except (OSError, TypeError, ValueError) as exc:
            mine = (2, f"pyxtts memtest: {exc}")
        every = dp.gather(mine)
        if dp.is_main:
            for rank, (_, text) in enumerate(every):
                print(f"--- rank {rank} of {dp.world_size}\n{text}")
        return max(rc for rc, _ in every)
    finally:
        dp.close()

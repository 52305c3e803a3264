"""The plan of one of several processes counts their collectives' memory on its device
(``pyxtts.comm_memory``): NCCL's upper bound from its sources and environment variables
(hand-computed below from NCCL 2.30's defaults), gloo's scratch; the plan's ``total`` grows by
exactly that line, one process's plan stays as it was, and ``memtest``/``optimize-config``
take the world size (``--world-size``, ``--nodes``) and refuse bad ones by name."""
from __future__ import annotations

import dataclasses

import pytest

import pyxtts
import pyxtts.cli
import pyxtts.strategy
from pyxtts.comm_memory import (communication_plan, nccl_bytes, nccl_channels, nccl_connection_bytes, nccl_plan,
                                 world_of)
from pyxtts.config import XTTSConfig, optimize_config, plan_for
from pyxtts.memtest import run_memtest

MiB = 2**20
NO_NVLS = {"NCCL_NVLS_ENABLE": "0"}
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_nccl_or_torchrun_env(monkeypatch):
    """The figures below are of NCCL's defaults and of one process unless a test says so."""
    import os

    for name in list(os.environ):
        if name.startswith("NCCL_") or name in TORCHRUN_ENV:
            monkeypatch.delenv(name)


def mib(parts) -> dict[str, float]:
    return {what: n / MiB for what, n in parts}


# ---- the formula ------------------------------------------------------------------------

def test_one_connection_is_12_mib_with_nccls_default_buffers():
    # write layout: the sender's header in one 2 MiB granule; the receiver's header + LL 512 KiB
    # + LL128 4800 KiB + Simple 4 MiB = 9637888 bytes in 5 granules (10 MiB). Read layout:
    # header + Simple (6 MiB) and header + LL + LL128 (6 MiB). Either way 12 MiB.
    assert nccl_connection_bytes({}) == 12 * MiB
    # NCCL_BUFFSIZE=1 MiB: write 2 + ceil(6492160 B) = 2 + 8; read 2 + 6: the bound is 10 MiB
    assert nccl_connection_bytes({"NCCL_BUFFSIZE": "1048576"}) == 10 * MiB
    assert nccl_connection_bytes({"NCCL_BUFFSIZE": "0x100000"}) == 10 * MiB  # NCCL reads hex too
    # 16 MiB: write 2 + ceil(22220800 B) = 2 + 22; read ceil(16781312 B) + 6 = 18 + 6: 24 MiB
    assert nccl_connection_bytes({"NCCL_BUFFSIZE": str(16 * MiB)}) == 24 * MiB
    # smaller LL/LL128 buffers: write 2 + ceil(4096 + 64K + 120K + 4M) = 2 + 6
    assert nccl_connection_bytes({"NCCL_LL_BUFFSIZE": "65536", "NCCL_LL128_BUFFSIZE": "122880"}) == 8 * MiB
    # NCCL_PROTO does not change what is allocated: every protocol's buffer exists
    assert nccl_connection_bytes({"NCCL_PROTO": "Simple"}) == 12 * MiB


def test_two_gpus_on_one_machine_with_nccls_defaults():
    plan = communication_plan("cuda:0", 2)
    assert plan.backend == "nccl" and plan.estimated and plan.label == "communication (NCCL, estimated)"
    assert mib(plan.parts) == {
        "torch small-pool segment (scalar collectives)": 2,
        "NCCL channel buffers": 768,  # 64 channels x 1 peer (the other process) x 12 MiB
        "NCCL channel state": 384,  # 64 channels x 3 allocations x 2 MiB
        "NCCL NVLS buffers": 192,  # 32 channels x 2 x 128 KiB x 8 steps x 2 heads = 128 MiB, + 32 x 2 MiB
        "NCCL kernels and communicator (measured)": 652,  # world size 1 on an H200, less torch's segment
    }
    assert plan.total == 1998 * MiB


def test_eight_gpus_with_four_channels_and_no_nvls():
    parts = mib(nccl_bytes(8, 8, {"NCCL_MAX_NCHANNELS": "4", **NO_NVLS}))
    # a channel's peers: the ring's one, the tree's parent and child: 3 x 4 channels x 12 MiB
    assert parts == {"NCCL channel buffers": 144, "NCCL channel state": 24,
                     "NCCL kernels and communicator (measured)": 652}
    assert communication_plan("cuda:1", 8, env={"NCCL_MAX_NCHANNELS": "4", **NO_NVLS}).total == 822 * MiB


def test_several_machines_count_the_trees_parent_and_three_children():
    env = {"NCCL_MAX_CTAS": "2", **NO_NVLS}
    # 16 processes on 2 machines: 1 + 4 peers a channel; 2 channels x 5 x 12; state 2 x 6
    assert mib(nccl_bytes(16, 8, env)) == {"NCCL channel buffers": 120, "NCCL channel state": 12,
                                           "NCCL kernels and communicator (measured)": 652}
    # never more peers than the other processes: 3 processes on 3 machines have 2
    assert mib(nccl_bytes(3, 1, env))["NCCL channel buffers"] == 2 * 2 * 12
    assert mib(nccl_bytes(3, 3, env))["NCCL channel buffers"] == 2 * 2 * 12


def test_the_channels_follow_nccls_variables():
    assert nccl_channels({}) == 64
    assert nccl_channels({"NCCL_MAX_NCHANNELS": "100"}) == 64  # NCCL's MAXCHANNELS caps it
    assert nccl_channels({"NCCL_MAX_NRINGS": "8"}) == 8  # the legacy name
    assert nccl_channels({"NCCL_MAX_NRINGS": "8", "NCCL_MAX_NCHANNELS": "16"}) == 16  # the new name wins
    assert nccl_channels({"NCCL_MAX_NCHANNELS": "16", "NCCL_MAX_CTAS": "6"}) == 6
    assert nccl_channels({"NCCL_MAX_NCHANNELS": "4", "NCCL_MIN_NCHANNELS": "12"}) == 12  # the floor wins
    assert nccl_channels({"NCCL_MIN_CTAS": "100"}) == 64
    assert nccl_channels({"NCCL_MAX_NCHANNELS": "0"}) == 1  # NCCL sets a maximum under 1 to 1
    # the channel state counts the send/receive channels: 6 rounded up to a power of two
    assert mib(nccl_bytes(2, 2, {"NCCL_MAX_CTAS": "6", **NO_NVLS}))["NCCL channel state"] == 8 * 3 * 2


def test_nvls_only_where_it_can_run():
    on = mib(nccl_bytes(2, 2, {"NCCL_NVLS_NCHANNELS": "16"}))
    assert on["NCCL NVLS buffers"] == 16 * 2 * 0.125 * 8 * 2 + 16 * 2  # 64 MiB of buffers, 16 granules
    capped = mib(nccl_bytes(2, 2, {"NCCL_MAX_CTAS": "8"}))
    assert capped["NCCL NVLS buffers"] == 8 * 2 * 0.125 * 8 * 2 + 8 * 2
    chunk = mib(nccl_bytes(4, 4, {"NCCL_NVLS_CHUNKSIZE": "65536", "NCCL_NVLS_NCHANNELS": "16"}))
    assert chunk["NCCL NVLS buffers"] == 16 * 2 * 0.0625 * 8 * 4 + 16 * 2
    assert "NCCL NVLS buffers" in mib(nccl_bytes(2, 2, {}, capability=(9, 0)))
    assert "NCCL NVLS buffers" not in mib(nccl_bytes(2, 2, {}, capability=(8, 6)))  # before Hopper
    assert "NCCL NVLS buffers" not in mib(nccl_bytes(2, 2, NO_NVLS))
    assert "NCCL NVLS buffers" not in mib(nccl_bytes(2, 1, {}))  # one GPU per machine: no NVLink domain


def test_gloo_and_one_process():
    plan = communication_plan("cpu", 3)
    assert plan.backend == "gloo" and not plan.estimated and plan.label == "communication (gloo)"
    assert plan.total == 2 * MiB  # the ring's scratch: two segments of at most 1 MiB
    assert communication_plan("cpu", 1) is None and communication_plan("cuda:0", 1) is None


def test_bad_values_are_refused_by_name():
    with pytest.raises(ValueError, match="NCCL_BUFFSIZE='4M': expected an integer"):
        nccl_connection_bytes({"NCCL_BUFFSIZE": "4M"})
    with pytest.raises(ValueError, match="NCCL_MAX_NCHANNELS='-1'"):
        nccl_channels({"NCCL_MAX_NCHANNELS": "-1"})
    with pytest.raises(ValueError, match="world_size"):
        communication_plan("cuda:0", 0)
    with pytest.raises(TypeError, match="world_size"):
        communication_plan("cuda:0", 2.0)
    with pytest.raises(ValueError, match="local_world_size"):
        communication_plan("cuda:0", 2, 3)


def test_the_world_a_plan_is_for(monkeypatch):
    assert world_of() == (1, 1)  # not started by torchrun
    assert world_of(8) == (8, 8) and world_of(16, 2) == (16, 8) and world_of(5, 2) == (5, 3)
    for bad, where in (((0, None), "world_size"), ((2, 3), "nodes"), ((None, 2), "nodes")):
        with pytest.raises(ValueError, match=where):
            world_of(*bad)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert world_of() == (4, 2) and world_of(2) == (2, 2)  # torchrun's own; a given one wins


# ---- the plan -----------------------------------------------------------------------------

CFG = XTTSConfig.load("cpu_demo")


def alone(plan) -> pyxtts.MemoryPlan:
    """The plan less its communication: what one process plans."""
    return dataclasses.replace(plan, world_size=1, communication=0, communication_backend=None,
                               total=plan.total - plan.communication)


def test_a_plan_of_several_processes_is_larger_by_exactly_the_line():
    one = plan_for(CFG, "cpu")
    assert plan_for(CFG, "cpu", world_size=1) == one and str(plan_for(CFG, "cpu", world_size=1)) == str(one)
    assert "communication" not in str(one) and one.communication == 0 and one.allocator_total == one.total
    three = plan_for(CFG, "cpu", world_size=3)
    assert three.total == one.total + 2 * MiB and three.communication == 2 * MiB
    assert three.world_size == 3 and three.communication_backend == "gloo"
    assert alone(three) == one and three.allocator_total == one.total
    table = str(three)
    assert "communication (gloo)                        2.00 MiB" in table
    assert table.replace("communication (gloo)                        2.00 MiB\n", "").replace(
        "27.37 MiB", "25.37 MiB") == str(one)  # the one new row, and the total
    assert CFG.memory_plan("cpu", world_size=3) == three


def test_torchrun_s_world_is_the_default(monkeypatch):
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    assert plan_for(CFG, "cpu").communication == 2 * MiB
    assert plan_for(CFG, "cpu", world_size=1).communication == 0


def test_bad_world_sizes_are_refused_by_name():
    with pytest.raises(ValueError, match="world_size: expected an int >= 1, got 0"):
        plan_for(CFG, "cpu", world_size=0)
    with pytest.raises(TypeError, match="world_size"):
        plan_for(CFG, "cpu", world_size=True)
    with pytest.raises(ValueError, match="nodes"):
        plan_for(CFG, "cpu", world_size=2, nodes=4)
    with pytest.raises(ValueError, match="world_size"):
        optimize_config(CFG, "1GiB", device="cpu", world_size=-2)


def test_a_gpu_plan_counts_nccls_estimate(monkeypatch):
    cfg = XTTSConfig.load("gpu_8gb")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # the GPU's generation then does not matter
    one = plan_for(cfg, "cuda:0", offload=True)
    two = plan_for(cfg, "cuda:0", offload=True, world_size=2)
    # 2 (torch) + 64 x 12 (buffers) + 64 x 6 (state) + 652 (kernels and communicator) MiB
    assert two.communication == 1806 * MiB and two.total == one.total + 1806 * MiB and alone(two) == one
    assert "communication (NCCL, estimated)" in str(two) and two.communication_backend == "nccl"
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "2")
    assert plan_for(cfg, "cuda:0", offload=True, world_size=2).communication == (2 + 24 + 12 + 652) * MiB


def test_optimize_config_fits_the_plans_with_the_communication():
    one = plan_for(CFG, "cpu", micro_batch=1, checkpointing="full", precision="bf16", offload=False).total
    f = CFG.training.max_memory_fraction
    memory = int((one + MiB // 2) / 0.9 / f) + 64  # the limit (budget less 10%) between one and one + 2 MiB
    limit = int(int(memory * f) * 0.9)
    assert one <= limit < one + 2 * MiB
    small = CFG.replace(data=dataclasses.replace(CFG.data, batch_size=1))
    new, why = optimize_config(small, memory, device="cpu")
    assert "communication" not in why
    with pytest.raises(ValueError, match=r"no plan fits.*of it 2\.00 MiB communication \(gloo\), one of 2 processes"):
        optimize_config(small, memory, device="cpu", world_size=2)
    new, why = optimize_config(CFG, "1GiB", device="cpu", world_size=2)
    assert "communication:      2.00 MiB per process in the plan total (gloo; 2 processes" in why


# ---- memtest and the flags ----------------------------------------------------------------

def test_memtest_refuses_a_budget_only_the_step_alone_fits(capsys):
    one = plan_for(CFG, "cpu").total
    memory = str(int((one + MiB) / CFG.training.max_memory_fraction))  # budget: the step + 1 MiB
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--memory", memory, "--no-step"]) == 0
    out = capsys.readouterr().out
    assert "communication" not in out and "verdict: TIGHT" in out
    assert pyxtts.cli.main(["memtest", "--config", "cpu_demo", "--memory", memory, "--no-step",
                            "--world-size", "2"]) == 1
    out = capsys.readouterr().out
    assert "communication: one of 2 processes on one machine" in out and "in place through DLPack" in out
    assert "communication (gloo)                        2.00 MiB" in out
    assert "verdict: DOES NOT FIT: device memory is short" in out
    assert "advice: the step alone needs 25.37 MiB, within the budget" in out
    assert "gloo's reserve for 2 processes (2.00 MiB) puts it over" in out
    assert "--device cpu --world-size 2` writes it" in out


def test_memtest_s_real_step_runs_under_the_budget_less_the_communication():
    report = run_memtest(CFG, batch_size=6, world_size=2, nodes=2, verbose=True)
    assert report.verdict == "fits" and report.plan.communication == 2 * MiB
    # the allocator's peak is the plan's allocator part to the byte; the collectives' is beside it
    assert report.measured_peak == report.plan.allocator_total == report.plan.total - 2 * MiB
    assert "2 processes on 2 machines" in report.text and "gloo all-reduce scratch" in report.text
    assert "(gloo's 2.00 MiB are planned outside the allocator)" in report.text
    assert pyxtts.memory_stats("cpu")["limit_bytes"] is None


def test_memtest_names_nccls_estimate(capsys):
    rc = pyxtts.cli.main(["memtest", "--config", "gpu_8gb", "--device", "cuda:0", "--memory", "8GiB", "--no-step",
                          "--world-size", "8", "--nodes", "2"])
    out = capsys.readouterr().out
    assert rc in (0, 1) and "communication (NCCL, estimated)" in out
    assert "one of 8 processes on 2 machines" in out and "not yet measured on several GPUs" in out


@pytest.mark.parametrize("command", [["memtest", "--config", "cpu_demo", "--no-step"],
                                     ["optimize-config", "--config", "cpu_demo", "--output", "unused.yaml"]])
def test_bad_world_flags_are_refused_by_name(command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for flags, says in ((["--world-size", "0"], "--world-size: expected the number of processes"),
                        (["--world-size", "-3"], "--world-size: expected"),
                        (["--nodes", "2"], "--nodes: give --world-size too"),
                        (["--world-size", "2", "--nodes", "3"], "--nodes: expected the machines the 2 processes"),
                        (["--world-size", "2", "--nodes", "0"], "--nodes: expected")):
        assert pyxtts.cli.main(command + flags) == 2, flags
        assert says in capsys.readouterr().err, flags
    with pytest.raises(SystemExit) as exc:
        pyxtts.cli.main(command + ["--world-size", "two"])
    assert exc.value.code == 2 and "argument --world-size: invalid int value: 'two'" in capsys.readouterr().err
    assert not (tmp_path / "unused.yaml").exists()


class _Reserving(pyxtts.strategy.SingleProcess):
    """One process that says its collectives take ``reserve`` bytes of its device (as a
    DataParallel of several processes does), to see what the Trainer makes of it."""

    def __init__(self, reserve: int) -> None:
        self.reserve = reserve

    def communication(self):
        return dataclasses.make_dataclass("Plan", ["total"])(self.reserve)


def test_the_trainer_holds_the_collectives_reserve_back_from_its_allocator_limit(tmp_path):
    from pyxtts.trainer import Trainer

    cfg = XTTSConfig.from_dict({"model": {"n_layers": 1, "d_model": 32, "n_heads": 4, "text_vocab_size": 41,
                                          "audio_vocab_size": 23, "max_text_tokens": 16, "max_audio_tokens": 24},
                                "training": {"device": "cpu", "max_memory_fraction": 0.5,
                                             "checkpoint_dir": str(tmp_path / "c")}})
    total = pyxtts.memory_stats("cpu")["device_total_bytes"]
    try:
        Trainer(cfg, progress=False)
        alone = pyxtts.memory_stats("cpu")["limit_bytes"]
        pyxtts.set_memory_limit(None, "cpu")
        Trainer(cfg, progress=False, strategy=_Reserving(3 * 2**20))
        held = pyxtts.memory_stats("cpu")["limit_bytes"]
    finally:
        pyxtts.set_memory_limit(None, "cpu")
    assert alone == int(total * 0.5) and held == alone - 3 * 2**20


def test_one_process_over_nccl_takes_the_measured_kernels_and_communicator():
    """World size 1 over NCCL (only the bench runs it: the product has no process group
    then) has no peer: no channel buffers, no NVLS, just what was measured on the H200."""
    assert mib(nccl_bytes(1, 1)) == {"NCCL kernels and communicator (measured)": 652}
    assert nccl_plan(1, 1).total == (2 + 652) * MiB  # what bench_ddp.py --gpus 1 compares with
    assert communication_plan("cuda:0", 1) is None  # one process communicates with nobody
    with pytest.raises(ValueError, match="world_size"):
        nccl_bytes(0, 1)


def test_memtest_s_real_step_is_not_charged_with_earlier_garbage():
    # a notebook's earlier run left a tensor in a reference cycle: memtest collects it before
    # measuring, so the peak is the step's to the byte
    import gc

    import numpy as np

    class Held:
        pass

    gc.disable()
    try:
        h = Held()
        h.me, h.t = h, pyxtts.tensor(np.zeros(1 << 18, np.float32))
        del h
        report = run_memtest(CFG, batch_size=6)
    finally:
        gc.enable()
    assert report.measured_peak == report.plan.allocator_total, report.text

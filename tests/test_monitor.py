"""GPUMonitor samples allocator stats and RSS on a background thread."""
from __future__ import annotations

import threading
import time

import pytest

import pyxtts
from pyxtts.monitor import GPUMonitor


def wait_for_samples(mon: GPUMonitor, n: int, bound_s: float = 60.0, allocated: int = 0) -> None:
    """Until the monitor holds n samples (of at least `allocated` bytes, if given): the
    sampling thread may be slow to run on a loaded machine, so the test waits for what it
    needs, not for a fixed time, and fails only past a bound no healthy run comes near."""
    deadline = time.monotonic() + bound_s
    while sum(s["cpu"]["allocated_bytes"] >= allocated for s in list(mon.samples)) < n:
        assert time.monotonic() < deadline, f"{len(mon.samples)} samples after {bound_s} s, {n} wanted"
        time.sleep(0.01)


def test_monitor_sees_an_allocation_and_stops():
    mon = GPUMonitor(interval=0.01, devices=["cpu"])
    before = threading.active_count()
    mon.start_monitoring()
    x = pyxtts.empty(32 << 20, dtype=pyxtts.uint8)  # 32 MiB while sampling
    wait_for_samples(mon, 3, allocated=32 << 20)  # three taken while it is allocated
    del x
    mon.stop_monitoring()
    assert threading.active_count() == before, "the sampling thread is still running"
    assert len(mon.samples) >= 3
    assert max(s["cpu"]["allocated_bytes"] for s in mon.samples) >= 32 << 20
    assert all(s["rss_bytes"] > 0 for s in mon.samples)
    times = [s["time_s"] for s in mon.samples]
    assert times == sorted(times)
    report = mon.get_summary_report()
    assert "cpu: allocated peak" in report and "samples" in report


def test_context_manager_and_misuse():
    with GPUMonitor(interval=0.01, devices=["cpu"]) as mon:
        with pytest.raises(RuntimeError, match="already monitoring"):
            mon.start_monitoring()
        wait_for_samples(mon, 2)
    assert len(mon.samples) >= 2
    mon.stop_monitoring()  # stopping twice is harmless
    with pytest.raises(ValueError, match="interval"):
        GPUMonitor(interval=0)
    with pytest.raises(ValueError, match="device"):
        GPUMonitor(devices=["gpu"])
    assert "no samples" in GPUMonitor(devices=["cpu"]).get_summary_report()


@pytest.mark.slow
def test_plot_needs_matplotlib_or_draws(tmp_path):
    mon = GPUMonitor(interval=0.01, devices=["cpu"])
    with mon:
        wait_for_samples(mon, 2)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="matplotlib"):
            mon.plot()
        return
    out = tmp_path / "memory.png"
    mon.plot(str(out))
    assert out.stat().st_size > 0


def test_devices_take_one_name_or_a_list_and_the_interval_has_a_floor():
    """devices='cpu' was walked letter by letter ('c' is no device), devices=5 failed on
    iteration, and interval=1e-9 made a busy loop whose samples outgrew memory."""
    assert GPUMonitor(devices="cpu").devices == ["cpu"]
    assert GPUMonitor(devices=("cpu",)).devices == ["cpu"]
    with pytest.raises(TypeError, match=r"^devices: expected None, a device name or a list of them, got 5"):
        GPUMonitor(devices=5)
    with pytest.raises(TypeError, match=r"^devices: .*\['cpu', 0\]"):
        GPUMonitor(devices=["cpu", 0])
    with pytest.raises(ValueError, match=r"^interval"):
        GPUMonitor(interval=1e-9)
    assert GPUMonitor(interval=0.01).interval == 0.01

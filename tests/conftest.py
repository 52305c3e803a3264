"""Shared fixtures: devices, a per-run random seed, an allocator leak check.

- ``DEVICES``: pytest params "cpu" and "cuda:0"; the GPU one carries the ``gpu``
  mark (``requires_cuda``), which skips a test (with a reason) when
  ``pyxtts.cuda_available()`` is False. Use it directly in
  ``@pytest.mark.parametrize("device", DEVICES)`` or through the ``device``
  fixture.
- ``devices``: the list of device names present here ("cpu" [+ "cuda:0"]).
- ``seed`` / ``rng``: a fresh seed every run (PYXTTS_TEST_SEED=N repeats a
  run; child processes inherit it). ``rng`` is salted with the test's id, so no
  two tests draw the same numbers. Put ``seed`` in assertion messages. All other
  randomness of the suite comes from ``helpers.make_rng`` (test_suite.py checks).
- ``check_memory``: fails a test whose allocator bytes in use
  (``memory_allocated``) differ from their start value once it is over. Opt in
  per module with ``pytestmark = pytest.mark.usefixtures("check_memory")``.
"""
from __future__ import annotations

import gc
import os
import types

import numpy as np
import pytest

import pyxtts
import pyxtts.testing
from helpers import SEED, make_rng

HAS_CUDA = pyxtts.cuda_available()
NO_GPU_REASON = "no CUDA device here (pyxtts.cuda_available() is False)"
# the mark of every CUDA-only test (or "cuda:0" parameter): skipped with NO_GPU_REASON
# on a machine without a GPU (pytest_collection_modifyitems), deselected by -m "not gpu"
requires_cuda = pytest.mark.gpu

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda:0", id="cuda:0", marks=requires_cuda),
]


def pytest_report_header(config):
    return f"pyxtts random seed: {SEED} (PYXTTS_TEST_SEED={SEED} repeats this run)"


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def devices() -> list[str]:
    return ["cpu"] + (["cuda:0"] if HAS_CUDA else [])


@pytest.fixture
def seed() -> int:
    return SEED


@pytest.fixture
def rng(request) -> np.random.Generator:
    # module and test name (with its parameters), wherever pytest runs from
    return make_rng(request.node.module.__name__, request.node.name)


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def collect_and_freeze() -> None:
    """gc.collect(), then everything still alive moves out of the collector's sight:
    torch, NumPy and pytest leave ~10^5 long-lived objects, and pytest adds its reports
    test after test, so without this each leak check's gc.collect() cost grew over a run
    (0.3 s per test late in a full run). The next collection sees only what came since."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session):
    collect_and_freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"_pxt_rep_{rep.when}", rep)


@pytest.fixture
def check_memory(request, devices):
    """Allocator bytes in use (on every device and in the host pool) are back to their
    start value after the test."""
    collect_and_freeze()
    devices = [*devices, "host"]  # the host pool: an offloaded optimizer's state
    start = {d: pyxtts.memory_allocated(d) for d in devices}
    yield
    rep = getattr(request.node, "_pxt_rep_call", None)
    if rep is not None and rep.failed:
        return  # the traceback holds the test's tensors; one failure is enough
    gc.collect()
    end = {d: pyxtts.memory_allocated(d) for d in devices}
    assert end == start, (f"allocator bytes in use changed over the test: {start} -> {end}; "
                          f"tensors made during the test still alive: {live_tensors()}")


def _holder(r, objs) -> str:
    """A referrer's type; a frame also by its function and by what keeps the frame
    alive (a traceback, a generator, a later frame's f_back): a test's own frame
    outliving the test held its tensors under compute-sanitizer on the H200."""
    if not isinstance(r, types.FrameType):
        return type(r).__name__
    keep = sorted({f"frame {k.f_code.co_name}" if isinstance(k, types.FrameType) else type(k).__name__
                   for k in gc.get_referrers(r) if k is not objs})
    return f"frame of {r.f_code.co_name} (kept by {', '.join(keep) or 'nothing the collector tracks'})"


def live_tensors(most: int = 8) -> str:
    """The pyxtts tensors the collector tracks (those made since the last gc.freeze),
    each with the types of what refers to it: the suspects of a leak. None listed means
    the bytes are held below Python (a C object or the engine)."""
    objs = gc.get_objects()
    rows = []
    for o in objs:
        if isinstance(o, pyxtts.Tensor):
            # a referrer frozen before the test (a module's list, a cache) is not searched
            held = sorted({_holder(r, objs) for r in gc.get_referrers(o) if r is not objs})
            rows.append(f"{o.device} {tuple(o.shape)} {o.dtype} held by "
                        f"{', '.join(held) or 'something older than the test'}")
    del objs
    return "; ".join(rows[:most]) + (f"; and {len(rows) - most} more" if len(rows) > most else "") \
        if rows else "none"


# ---- helpers shared by the tensor tests (import them from conftest) -------------

import ml_dtypes  # noqa: E402
from helpers.arrays import NP_DTYPE  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPE_NAMES = list(NP_DTYPE)
FLOAT_NAMES = ["float32", "float16", "bfloat16"]
INT_NAMES = ["int32", "int64", "uint8", "bool"]
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bit patterns of an array (unsigned ints of the same width)."""
    a = np.asarray(a)
    return a.view(_UINT[a.dtype.itemsize])


def random_array(rng: np.random.Generator, name: str, shape) -> np.ndarray:
    """Random data of a pyxtts dtype, never all zero.

    Floats are random bit patterns, so NaNs (quiet and signalling), infinities,
    subnormals and signed zeros all show up and copies must keep every bit.
    """
    shape = tuple(shape) if not isinstance(shape, int) else (shape,)
    dt = NP_DTYPE[name]
    if name == "bool":
        a = rng.random(shape) < 0.5
    elif dt.kind == "f" or dt == BF16:
        u = _UINT[dt.itemsize]
        a = rng.integers(0, np.iinfo(u).max, size=shape, dtype=u, endpoint=True).view(dt)
    else:
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    a = np.array(a, dtype=dt)  # 0-d stays an array
    if a.size and not bits(a).any():
        bits(a).reshape(-1)[0] = 1  # e.g. a single bool that came out False
    return a


def assert_bits_equal(actual, expected, msg: str = "") -> None:
    """Same dtype, same shape and every element bit for bit the same."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}; {msg}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}; {msg}"
    np.testing.assert_array_equal(bits(actual), bits(expected), err_msg=msg)


def assert_floats_equal(actual, expected, msg: str = "") -> None:
    """Bitwise equal where expected is a number; NaN (with the same sign) where it is NaN.

    For conversions, whose NaN payloads are not specified to match NumPy's.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}; {msg}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}; {msg}"
    a32, e32 = actual.astype(np.float32), expected.astype(np.float32)
    nan = np.isnan(e32)
    np.testing.assert_array_equal(np.isnan(a32), nan, err_msg=f"NaN positions differ; {msg}")
    np.testing.assert_array_equal(np.signbit(a32[nan]), np.signbit(e32[nan]),
                                  err_msg=f"NaN signs differ; {msg}")
    np.testing.assert_array_equal(bits(actual)[~nan], bits(expected)[~nan], err_msg=msg)


def run_python(code: str, *args: str, env: dict | None = None, timeout: float = 120, cwd: str = "/"):
    """Runs code in a fresh interpreter that imports this very pyxtts (the installed
    one in CI, the in-place build in a checkout), never the unbuilt source folder:
    the child starts outside the repository, with the package's parent first on
    PYTHONPATH. Returns the CompletedProcess (text output)."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(pyxtts.__file__).resolve().parent.parent)
    here = str(Path(__file__).resolve().parent)
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, here, full_env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout)


# ---- allocator tests: every test starts and ends with a clean allocator -------

def reset(device: str) -> None:
    """No limit, no injected fault, no cached segments."""
    pyxtts.set_memory_limit(None, device)
    pyxtts.testing.inject_oom(None, device)
    pyxtts.empty_cache(device)


@pytest.fixture(params=DEVICES)
def dev(request):
    """A device with a clean allocator; fails the test if it leaves blocks, segments
    or a limit behind."""
    device = request.param
    collect_and_freeze()
    for d in {"cpu", device}:
        reset(d)
    start = pyxtts.memory_stats(device)
    yield device
    for d in {"cpu", device}:
        reset(d)
    rep = getattr(request.node, "_pxt_rep_call", None)  # set by the report hook above
    if rep is not None and rep.failed:
        return  # the traceback holds the test's tensors; one failure is enough
    end = pyxtts.memory_stats(device)
    assert end["allocated_bytes"] == start["allocated_bytes"], "the test left live blocks"
    assert end["reserved_bytes"] == start["reserved_bytes"], "the test left segments behind"
    assert end["limit_bytes"] is None


@pytest.fixture
def no_limit_no_fault():
    """The CPU allocator without a limit or an injected fault, before and after."""
    pyxtts.testing.inject_oom(None, "cpu")
    pyxtts.set_memory_limit(None, "cpu")
    yield
    pyxtts.testing.inject_oom(None, "cpu")
    pyxtts.set_memory_limit(None, "cpu")

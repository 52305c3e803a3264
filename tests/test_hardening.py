"""Inputs that once crashed the process or were silently accepted (issue 11's list).

Each crash reproducer runs in a child process, so that a regression is a failure naming
the case instead of the end of the run. The child runs many cases in a row; it prints
one line per case as it starts and one when it ends, so a child that dies names the
case it died in.
"""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import pyxtts
from conftest import run_python

TINY_CFG = ("pyxtts.ModelConfig(n_layers=1, d_model=8, n_heads=2, text_vocab_size=5, "
            "audio_vocab_size=5, max_text_tokens=4, max_audio_tokens=4, n_cond_latents=0)")

CHILD = textwrap.dedent("""
    import json, sys, traceback
    import numpy as np
    import pyxtts
    cases = json.loads(sys.argv[1])
    for name, src in cases:
        print(json.dumps({"start": name}), flush=True)
        try:
            exec(src, {"pyxtts": pyxtts, "np": np})
            out = {"case": name, "raised": None}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = {"case": name, "raised": type(exc).__name__, "message": str(exc)}
        print(json.dumps(out), flush=True)
""")


def run_cases(cases: list[tuple[str, str]], timeout: float = 300) -> dict[str, dict]:
    """Runs (name, source) cases in one child; name -> {"raised": type name or None,
    "message": ...}. Fails naming the case when the child dies."""
    r = run_python(CHILD, json.dumps(cases), timeout=timeout)
    results, started = {}, None
    for line in r.stdout.splitlines():
        rec = json.loads(line)
        if "start" in rec:
            started = rec["start"]
        else:
            results[rec["case"]] = rec
            started = None
    assert started is None and r.returncode == 0, (
        f"the child died (exit {r.returncode}) in case {started!r}:\n{r.stderr[-3000:]}")
    return results


def expect_refused(results: dict[str, dict], want: dict[str, tuple[str, str]]) -> None:
    """Every case raised the exception type named, with the fragment in its message."""
    for name, (exc, fragment) in want.items():
        got = results[name]
        assert got["raised"] == exc, f"{name}: expected {exc}, got {got}"
        assert fragment in got["message"], f"{name}: {fragment!r} not in {got['message']!r}"


# ---- 1. strings the C side reads ------------------------------------------------------

def test_checkpointing_strings_are_checked_whole():
    """A lone surrogate has no UTF-8 (once a segfault), a NUL must not cut 'full\\0junk'
    to 'full'; either way the setting stays what it was."""
    setup = f"m = pyxtts.XTTSGPT({TINY_CFG}, checkpointing='selective')\n"
    cases = [("surrogate", setup + "m.checkpointing = '\\ud800'"),
             ("nul", setup + "m.checkpointing = 'full\\x00junk'"),
             ("kept", setup + "try:\n    m.checkpointing = 'full\\x00'\nexcept ValueError:\n    pass\n"
                              "assert m.checkpointing == 'selective', m.checkpointing")]
    res = run_cases(cases)
    expect_refused(res, {"surrogate": ("ValueError", "checkpointing"),
                         "nul": ("ValueError", "NUL")})
    assert res["kept"]["raised"] is None, res["kept"]


# ---- 2. a native core that never finished __init__ -----------------------------------

def test_uninitialised_gpt_is_refused():
    methods = ["zero_grad()", "gradients()", "parameters()", "release_arena()",
               "estimate_memory(1, 1, 1)", "num_parameters", "device", "checkpointing",
               "arena_bytes"]
    cases = [(f"new.{m}", f"g = pyxtts._C.GPT.__new__(pyxtts._C.GPT)\ng.{m}") for m in methods]
    cases += [(f"subclass.{m}", "class S(pyxtts._C.GPT):\n    def __init__(self):\n        pass\n"
               f"S().{m}") for m in methods]
    cases.append(("adamw_of_uninitialised",
                  "pyxtts.AdamW(pyxtts._C.GPT.__new__(pyxtts._C.GPT))"))
    res = run_cases(cases)
    want = {name: ("RuntimeError", "not initialised") for name, _ in cases[:-1]}
    want["adamw_of_uninitialised"] = ("TypeError", "model")
    expect_refused(res, want)


def test_gpt_left_by_oom_in_init_is_refused_then_usable():
    """An out-of-memory error at every allocation of __init__: the half-built core refuses
    every method, a second __init__ with memory builds it, nothing leaks."""
    src = f"""
from pyxtts.testing import inject_oom
kw = {TINY_CFG}.engine_args()
start = pyxtts.memory_allocated('cpu')
failed = 0
for i in range(100):
    g = pyxtts._C.GPT.__new__(pyxtts._C.GPT)
    inject_oom(i, 'cpu')
    try:
        g.__init__(**kw)
    except pyxtts.OutOfMemoryError:
        failed += 1
    else:
        inject_oom(None, 'cpu')
        break
    finally:
        inject_oom(None, 'cpu')
    for m in ('zero_grad', 'parameters', 'gradients', 'release_arena'):
        try:
            getattr(g, m)()
        except RuntimeError as exc:
            assert 'not initialised' in str(exc), exc
        else:
            raise AssertionError(m + ' ran on a half-built core')
    g.__init__(**kw)
    g.zero_grad()
    assert set(g.parameters()) == set(g.gradients())
    del g
del g
assert failed >= 2, failed
assert pyxtts.memory_allocated('cpu') == start, (pyxtts.memory_allocated('cpu'), start)
"""
    res = run_cases([("oom_init", src)])
    assert res["oom_init"]["raised"] is None, res["oom_init"]


# ---- 3. read-only memory through DLPack ------------------------------------------------

def test_read_only_survives_dlpack_reexport(tmp_path):
    """A read-only source (an np.load mmap: writing it was a segfault; an in-memory
    read-only array: silently overwritten) stays read-only through any re-export."""
    path = tmp_path / "a.npy"
    np.save(path, np.arange(10, dtype=np.float32))
    load = f"a = np.load({str(path)!r}, mmap_mode='r')\n"
    ram = "a = np.arange(10, dtype=np.float32)\na.flags.writeable = False\n"
    cases = []
    for src_name, src in (("mmap", load), ("ram", ram)):
        cases += [
            (f"{src_name}.legacy", src + "w = pyxtts.from_dlpack(pyxtts.from_dlpack(a).__dlpack__())\n"
                                         "w.copy_(np.zeros(a.shape, a.dtype))"),
            (f"{src_name}.versioned", src + "t = pyxtts.from_dlpack(a)\n"
             "w = pyxtts.from_dlpack(t.__dlpack__(max_version=(1, 0)))\nw.copy_(np.zeros(a.shape, a.dtype))"),
            (f"{src_name}.twice", src + "t = pyxtts.from_dlpack(pyxtts.from_dlpack(pyxtts.from_dlpack(a)))\n"
                                        "t.copy_(np.zeros(a.shape, a.dtype))"),
            (f"{src_name}.copy", src + "w = pyxtts.from_dlpack(pyxtts.from_dlpack(a).__dlpack__(copy=True))\n"
             "w.copy_(np.zeros(a.shape, a.dtype))\nassert (a == np.arange(10)).all()\n"
             "assert (w.numpy() == 0).all()"),
            (f"{src_name}.unchanged", src + "for f in (lambda: pyxtts.from_dlpack(pyxtts.from_dlpack(a).__dlpack__()),"
             " lambda: pyxtts.from_dlpack(a).copy_(np.zeros(10, np.float32))):\n"
             "    try:\n        f()\n    except (BufferError, ValueError):\n        pass\n"
             "assert (a == np.arange(10)).all(), a"),
        ]
    res = run_cases(cases)
    for s in ("mmap", "ram"):
        expect_refused(res, {f"{s}.legacy": ("BufferError", "read-only"),
                             f"{s}.versioned": ("ValueError", "read-only"),
                             f"{s}.twice": ("ValueError", "read-only")})
        assert res[f"{s}.copy"]["raised"] is None, res[f"{s}.copy"]
        assert res[f"{s}.unchanged"]["raised"] is None, res[f"{s}.unchanged"]


# ---- 4. copy_ between overlapping views -----------------------------------------------

@pytest.mark.parametrize("lo_dst,lo_src,n", [(0, 10, 50), (10, 0, 50), (0, 1, 59), (5, 5, 40)])
def test_copy_between_overlapping_views(rng, lo_dst, lo_src, n):
    """Overlapping source and destination (memcpy's undefined case, an ASan report):
    the result is that of copying the source's values as they were."""
    base = rng.standard_normal(60).astype(np.float32)
    a = base.copy()
    dst = pyxtts.from_dlpack(a[lo_dst:lo_dst + n])
    src = pyxtts.from_dlpack(a[lo_src:lo_src + n])
    dst.copy_(src)
    want = base.copy()
    want[lo_dst:lo_dst + n] = base[lo_src:lo_src + n]
    np.testing.assert_array_equal(a, want)


def test_copy_between_overlapping_views_with_a_cast(rng):
    """The source converted on the way (float16 into float32 over the same bytes)."""
    raw = rng.standard_normal(40).astype(np.float32)
    a = raw.copy()
    half = a.view(np.float16)  # 80 halves over the same 160 bytes
    src_values = half[:40].copy()
    dst = pyxtts.from_dlpack(a[:40])
    dst.copy_(pyxtts.from_dlpack(half[:40]))
    np.testing.assert_array_equal(a, src_values.astype(np.float32))


# ---- 15., 17. arguments refused with the argument named ----------------------------

def test_attention_scale_is_finite_and_positive():
    q = np.ones((1, 1, 4, 8), np.float32)
    for bad in (0.0, -1.0, float("inf"), float("nan"), 1e39):
        with pytest.raises(ValueError, match="scale"):
            pyxtts.attention(q, q, q, scale=bad)


def test_bad_arguments_name_themselves():
    """Each a TypeError or ValueError naming the argument, never OverflowError,
    UnicodeEncodeError or AttributeError."""
    m = f"m = pyxtts.XTTSGPT({TINY_CFG})\n"
    cases = {
        "device_huge": ("pyxtts.tensor(np.ones(3), device=2**70)", "ValueError", "device"),
        "device_surrogate": ("pyxtts.tensor(np.ones(3), device='\\ud800')", "ValueError", "device"),
        "dtype_surrogate": ("pyxtts.tensor(np.ones(3), dtype='\\ud800')", "ValueError", "dtype"),
        "block_huge": ("pyxtts.Block(2**40, 2)", "ValueError", "d_model"),
        "vocab_huge": ("pyxtts.ModelConfig(text_vocab_size=2**31)", "ValueError", "text_vocab_size"),
        "growth_huge": (m + "pyxtts.AdamW(m, growth_interval=2**70)", "ValueError", "growth_interval"),
        "seed_none": (f"pyxtts.XTTSGPT({TINY_CFG}, seed=None)", "TypeError", "seed"),
        "ckpt_none": (f"pyxtts.XTTSGPT({TINY_CFG}, checkpointing=None)", "TypeError", "checkpointing"),
        "state_int_key": (m + "m.load_state_dict({0: np.ones(3)}, strict=False)", "TypeError", "state"),
        "state_int_key_strict": (m + "m.load_state_dict({0: np.ones(3)})", "TypeError", "state"),
    }
    res = run_cases([(k, v[0]) for k, v in cases.items()])
    expect_refused(res, {k: (v[1], v[2]) for k, v in cases.items()})


# ---- 16. sizes: 64-bit arithmetic and limits that answer at once -------------------------

def test_plans_grow_with_the_batch_until_the_row_limit():
    """The residual stream once went negative at batch 2,057,007 x 1,044 rows and the
    plan was not monotonic: every component is now >= 0 and grows with the batch up to
    the limit of 2**31 - 1 rows, past which the batch is refused naming batch_size."""
    cfg = pyxtts.ModelConfig(n_layers=2, d_model=64, n_heads=2, text_vocab_size=50, audio_vocab_size=50,
                             max_text_tokens=64, max_audio_tokens=64, n_cond_latents=0)
    T = 128
    sizes = [1, 7, 1000, 2**20, 2057007, 2**31 // T - 2, 2**31 // T - 1]
    prev = None
    for b in sizes:
        p = pyxtts.estimate_memory(cfg, b, 64, 64)
        assert p.residuals == 3 * b * T * 64 * 4 and p.total > 0, b  # L+1 residual buffers of fp32
        if prev is not None:
            assert p.total > prev.total and p.residuals > prev.residuals, b
        prev = p
    with pytest.raises(ValueError, match="batch_size"):
        pyxtts.estimate_memory(cfg, 2**31 // T, 64, 64)
    with pytest.raises(ValueError, match="cond_len"):
        pyxtts.estimate_memory(cfg, 1, 64, 64, cond_len=2**32)


def test_absurd_configs_are_refused_at_once():
    """ModelConfig(n_layers=357913942, d_model=1, ...) once took 491 s to build."""
    import time

    base = dict(n_layers=2, d_model=8, n_heads=2, text_vocab_size=5, audio_vocab_size=5,
                max_text_tokens=4, max_audio_tokens=4, n_cond_latents=0)
    cases = [({"n_layers": 357913942, "d_model": 1, "n_heads": 1}, "n_layers"),
             ({"n_layers": 4097}, "n_layers"),
             ({"d_model": 2**15, "n_heads": 1}, "d_model"),
             ({"text_vocab_size": 2**28}, "text_vocab_size"),
             ({"max_audio_tokens": 2**28}, "max_audio_tokens"),
             ({"n_layers": 4096, "d_model": 8192, "n_heads": 8}, "parameters")]
    for change, name in cases:
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match=name):
            pyxtts.ModelConfig(**{**base, **change})
        assert time.perf_counter() - t0 < 0.01, change


@pytest.mark.parametrize("d_model", [2**31 - 1, 1518500250, 2**30])
def test_huge_d_model_is_refused_by_its_tensor_size(d_model):
    """4 * d_model * d_model (the MLP's matrices) passes 2**63 from d_model = 1518500250:
    the rule that refuses it once computed it in int64 and wrapped below its limit."""
    with pytest.raises(ValueError, match=rf"^ModelConfig\.d_model \(its 4\*d_model x d_model MLP matrices\): "
                                         rf"a {4 * d_model} x {d_model} tensor has more than 2\*\*31 - 1 elements"):
        pyxtts.ModelConfig(n_layers=1, d_model=d_model, n_heads=1, n_cond_latents=0)


def test_huge_batches_are_refused_naming_batch_size():
    """The plans' products (B x T rows, B x (S + latents) conditioning rows) stay in range
    because the batch is refused first, by name, whatever its size."""
    cfg = pyxtts.ModelConfig(n_layers=1, d_model=32, n_heads=2, text_vocab_size=5, audio_vocab_size=5,
                             max_text_tokens=8, max_audio_tokens=8, n_cond_latents=4, max_cond_frames=64)
    model = pyxtts.XTTSGPT(cfg)
    for estimate in (lambda *a, **k: pyxtts.estimate_memory(cfg, *a, **k), model.estimate_memory):
        for batch in (2**31 - 1, 2**28):
            with pytest.raises(ValueError, match=r"^batch_size: \d+ samples of 20 positions make \d+ rows, "
                                                 r"more than the limit of 2\*\*31 - 1 per step"):
                estimate(batch, 8, 8)
        with pytest.raises(ValueError, match=r"^batch_size: 33554432 samples of 64 mel frames make more rows "
                                             r"than the limit of 2\*\*31 - 1"):
            estimate(2**25, 8, 8, cond_frames=64)
        for batch in (2**31, 2**40, 2**63, 2**70):
            with pytest.raises(ValueError, match=r"^batch_size: "):
                estimate(batch, 8, 8)
        assert estimate(2**31 // 20, 8, 8).batch_size == 2**31 // 20  # the largest that fits

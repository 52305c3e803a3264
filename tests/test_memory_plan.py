"""The memory plan against the allocator, to the byte: a model's parameters and gradients,
its optimizer's state (on the device and offloaded to the host pool) and a step's arena
take exactly the blocks the plans say, across shapes, dtypes, EMA and offload chunks.

A block's size depends on where it lands: a request is served from the smallest free
block that holds it, which may be the free rest of an earlier segment, split there or,
when the rest would be too small to keep, taken whole. So the plans replay the requests
in their order through a copy of the allocator's own code. Two conditions are checked:
allocators that hold nothing yet (a fresh process, where ``pyxtts.estimate_memory`` of a
config also holds), and allocators that already hold, and have freed, other buffers
(``model.estimate_memory`` plans from their state). The shapes include the ones where
sizing each block as if cut from a fresh segment of its own missed, in both directions:
``cpu_demo``'s d_model 128 offloaded (the state's staging buffer lands in the free rest
of the moments' 20 MiB segment and takes it whole), state and parameters that split or
take the rest of a segment, and arenas that land in a rest."""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pyxtts
from pyxtts.config import XTTSConfig

from helpers import make_rng, random_batch

pytestmark = pytest.mark.usefixtures("check_memory")

B, LT, LA = 2, 16, 24


def _model(**kw) -> dict:
    base = dict(n_layers=2, d_model=128, n_heads=2, text_vocab_size=300, audio_vocab_size=200,
                max_text_tokens=64, max_audio_tokens=128, n_cond_latents=8, dropout=0.0, conditioning=False)
    return {**base, **kw}


# (id, ModelConfig fields, precision, offloaded, ema_decay, offload_chunk)
CASES = [
    ("cpu_demo-d128-offload", dataclasses.asdict(XTTSConfig.load("cpu_demo").model), "fp32", True, None, None),
    ("d128-bf16-offload-ema", _model(text_vocab_size=7367, audio_vocab_size=1026, max_text_tokens=404,
                                     max_audio_tokens=64, n_cond_latents=0), "bf16", True, 0.99, None),
    ("d128-fp16-cond-offload-chunk", _model(n_layers=3, n_heads=1, audio_vocab_size=1026, max_text_tokens=32,
                                            n_cond_latents=32, conditioning=True), "fp16", True, None, 1 << 18),
    ("d128-bf16-offload", _model(n_layers=3, n_heads=1, text_vocab_size=7856, audio_vocab_size=1026,
                                 max_text_tokens=32, n_cond_latents=32), "bf16", True, None, None),
    ("d512-fp16-ema", _model(n_layers=1, d_model=512, n_heads=8, text_vocab_size=64, max_audio_tokens=64),
     "fp16", False, 0.99, None),
    ("d320-fp16-ema", _model(n_layers=1, d_model=320, n_heads=5, max_text_tokens=404, max_audio_tokens=64,
                             n_cond_latents=32), "fp16", False, 0.99, None),
    ("d64-fp32-ema", _model(d_model=64, n_heads=1, text_vocab_size=6681, n_cond_latents=32), "fp32", False,
     0.99, None),
    ("d128-fp16", _model(n_layers=1, n_heads=1, text_vocab_size=6681, audio_vocab_size=1026, max_audio_tokens=64,
                         n_cond_latents=0), "fp16", False, None, None),
    ("d256-bf16", _model(n_layers=3, d_model=256, audio_vocab_size=1026, max_text_tokens=32, max_audio_tokens=64,
                         n_cond_latents=0), "bf16", False, None, None),
    ("d192-bf16-ema", _model(n_layers=4, d_model=192, n_heads=1, text_vocab_size=1651, max_audio_tokens=608,
                             n_cond_latents=0), "bf16", False, 0.99, None),
    ("d1024-fp32-offload", _model(n_layers=1, d_model=1024, n_heads=16), "fp32", True, None, 3 << 20),
]


def run_case(case: tuple, fresh: bool) -> list[str]:
    """Builds the case's model and AdamW and runs one forward and backward, comparing every
    plan with the allocators' counts; the mismatches, as text. ``fresh``: the allocators hold
    nothing (a config's plan must then hold too)."""
    _, fields, precision, offload, ema, chunk = case
    cfg = pyxtts.ModelConfig(**fields)
    default = ema is None and chunk is None  # the AdamW that optimizer=True plans
    bad = []

    def same(what: str, planned: int, measured: int) -> None:
        if planned != measured:
            bad.append(f"{what}: planned {planned}, allocator {measured} ({measured - planned:+d})")

    pre = pyxtts.estimate_memory(cfg, B, LT, LA, optimizer=True, precision=precision, offload=offload)
    dev0, host0 = pyxtts.memory_allocated("cpu"), pyxtts.memory_allocated("host")
    model = pyxtts.XTTSGPT(cfg, precision=precision, seed=0)
    ahead = model.estimate_memory(B, LT, LA, optimizer=True, offload=offload)
    dev1 = pyxtts.memory_allocated("cpu")
    kw = dict(lr=1e-4, ema_decay=ema, loss_scale=1024.0 if precision == "fp16" else None)
    opt = pyxtts.AdamW(model, **kw, **(dict(state_device="cpu", offload_chunk=chunk) if offload else {}))
    same("opt.state_bytes", opt.state_bytes, pyxtts.memory_allocated("cpu") - dev1)
    same("opt.host_state_bytes", opt.host_state_bytes, pyxtts.memory_allocated("host") - host0)
    plan = model.estimate_memory(B, LT, LA)
    pyxtts.reset_peak_memory_stats("cpu")
    model.forward_backward(random_batch(make_rng("memory-plan-batch"), cfg, B, LT, LA, full=True))
    dev, host = pyxtts.memory_allocated("cpu") - dev0, pyxtts.memory_allocated("host") - host0
    same("estimate_memory total", plan.total, dev)
    same("estimate_memory total, the step's peak", plan.total, pyxtts.max_memory_allocated("cpu") - dev0)
    same("estimate_memory host_total", plan.host_total, host)
    if default:
        same("estimate_memory(optimizer=True) before the AdamW: total", ahead.total, dev)
        same("estimate_memory(optimizer=True) before the AdamW: host_total", ahead.host_total, host)
    if default and fresh:
        same("pyxtts.estimate_memory(config, optimizer=True): total", pre.total, dev)
        same("pyxtts.estimate_memory(config, optimizer=True): host_total", pre.host_total, host)
    del model, opt
    return bad


def child() -> None:
    """Every case in this process, each in allocators that hold nothing: a case's buffers
    are freed and its segments released before the next."""
    out = {}
    for case in CASES:
        gc.collect()
        pyxtts.empty_cache("cpu")
        pyxtts.empty_cache("host")
        held = [pyxtts.memory_reserved(d) for d in ("cpu", "host")]
        out[case[0]] = [f"the allocators hold {held} bytes before the case"] if any(held) else run_case(case, True)
    print(json.dumps(out))


def test_plans_equal_fresh_allocators_to_the_byte():
    here = Path(__file__).resolve().parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(pyxtts.__file__).resolve().parent.parent),
                                                    str(here), env.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, "-c", "import test_memory_plan as t; t.child()"], env=env, cwd=here,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert list(out) == [c[0] for c in CASES]
    assert {k: v for k, v in out.items() if v} == {}


# free holes of every pool's kinds: small blocks, and rests of 20 MiB and larger segments
CLUTTER = [200_000, 3_000_000, 700_000, 5_000_000, 9_000_000, 50_000, 11_000_000, 1_500_000, 13_000_000]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plans_equal_allocators_that_hold_other_buffers_to_the_byte(case):
    # other buffers live and freed around the model's: the device's allocator, and the
    # host pool (an offloaded AdamW of another model, and one that was freed)
    keep = [pyxtts.tensor(np.zeros(n, np.uint8)) for n in CLUTTER]
    del keep[::2]
    other = pyxtts.XTTSGPT(pyxtts.ModelConfig(**_model(d_model=64, n_heads=1)))
    other_opt = pyxtts.AdamW(other, state_device="cpu", offload_chunk=1 << 16)
    pyxtts.AdamW(other, state_device="cpu")  # freed at once: holes in the host pool
    gc.collect()
    gc.disable()  # nothing else frees a buffer between a plan and what it plans
    try:
        bad = run_case(case, False)
    finally:
        gc.enable()
    assert bad == []
    del keep, other_opt, other

"""The CUDA attention backward's workspace in the plan, under each backward schedule
(PYXTTS_CUDA_ATTENTION_BWD, read once per process: each value runs in a child). The plan
for cuda:0 needs the CUDA backend's size functions only (cuda/sizes.c, in every build), so
this runs on any machine, the CPU-only build included.

- two-kernel (the default): Di (B, H, Tq) fp32 + 256 bytes of alignment, as before;
- one-pass: Di rounded up to 256 bytes, then the split dQ partials (S, B, H, Tq, D) fp32
  with S = 132 CTAs (264 for D = 128) / (B H) rounded to the nearest, at least 1, at most
  the key blocks (of 128 keys for D = 64, 64 for D = 128), + 256 (cuda/sizes.h);
- a bad value plans as two-kernel (the backward call itself names the value).
"""
from __future__ import annotations

import json
import math

import pyxtts
from conftest import run_python


CHILD = r"""
import json, sys
import pyxtts
cfg = pyxtts.ModelConfig()
out = {}
for B, lt, la in ((3, 200, 252), (8, 150, 340), (1, 40, 30)):
    for prec in ("bf16", "fp32"):
        p = pyxtts.estimate_memory(cfg, B, lt, la, checkpointing="full", precision=prec, device="cuda:0")
        out[f"{B},{lt},{la},{prec}"] = p.attention_workspace
print(json.dumps(out))
"""


def plans(value: str | None) -> dict[str, int]:
    env = {"PYXTTS_CUDA_ATTENTION_BWD": value} if value is not None else {}
    p = run_python(CHILD, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_one_pass_plans_its_split_partials_and_nothing_else_changes():
    default, two, one, bad = plans(None), plans("two-kernel"), plans("one-pass"), plans("fast")
    assert default == two == bad
    H, D = pyxtts.ModelConfig().n_heads, pyxtts.ModelConfig().d_model // pyxtts.ModelConfig().n_heads
    for key, w0 in default.items():
        B, prec = int(key.split(",")[0]), key.split(",")[3]
        if prec == "fp32":  # the tensor-core path is 16-bit only: no partials planned
            assert one[key] == w0, key
            continue
        # the largest call is the GPT's self-attention: its Tq from the default's Di
        rows = (w0 - 256) // 4
        assert rows * 4 + 256 == w0 and rows % (B * H) == 0, key
        T = rows // (B * H)
        S = min(max(1, (132 * (1 if D == 64 else 2) + B * H // 2) // (B * H)), math.ceil(T / (128 if D == 64 else 64)))
        want = math.ceil(rows * 4 / 256) * 256 + S * B * H * T * D * 4 + 256
        assert one[key] == want, (key, one[key], want, T, S)

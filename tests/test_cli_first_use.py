"""The command line as a new user meets it: each test runs ``pyxtts`` in a child
process (as a shell would) on a tiny config or a few steps of the CPU demo, and checks
the exit status, what is said and what is left on disk."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_python

CLI = "import sys, pyxtts.cli; sys.exit(pyxtts.cli.main(sys.argv[1:]))"


def pyxtts_cli(cwd: Path, *args: str, timeout: float = 180, env: dict | None = None):
    """``pyxtts ARGS`` in a fresh interpreter, working directory ``cwd``."""
    return run_python(CLI, *args, cwd=str(cwd), timeout=timeout, env=env)


def train_steps(folder: Path) -> list[int]:
    log = folder / "train_log.jsonl"
    return [r["step"] for r in map(json.loads, log.read_text().splitlines()) if r["type"] == "train"]


def test_demo_with_fewer_steps_than_its_warmup_scales_the_warmup(tmp_path):
    """cpu_demo warms up for 20 of 600 steps; `--max-steps 10` used to be refused
    ("warmup_steps: must be < max_steps=10, got 20")."""
    r = pyxtts_cli(tmp_path, "train", "--max-steps", "10", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "warmup_steps 20 does not fit max_steps 10: scaled to 1" in r.stderr
    assert "trained 10 steps" in r.stdout
    log = [json.loads(x) for x in (tmp_path / "checkpoints/cpu_demo/train_log.jsonl").read_text().splitlines()]
    lrs = [x["lr"] for x in log if x["type"] == "train"]
    # warmup of 1 step (rate 0 at step 0), then the cosine from 2e-3 down to 1e-4 at step 10
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(2e-3) and 1e-4 < lrs[-1] < lrs[1]


def test_set_max_steps_keeps_a_warmup_that_fits_and_refuses_nonsense():
    from pyxtts import XTTSConfig

    t = XTTSConfig.load("cpu_demo").training
    assert t.set_max_steps(100) is None and (t.max_steps, t.warmup_steps) == (100, 20)
    assert t.set_max_steps(1) is not None and (t.max_steps, t.warmup_steps) == (1, 0)
    with pytest.raises(ValueError, match="max_steps"):
        t.set_max_steps(0)
    assert (t.max_steps, t.warmup_steps) == (1, 0)  # a refusal changes nothing


def test_a_second_plain_run_is_refused_and_deletes_nothing(tmp_path):
    """`pyxtts train` twice: the second used to delete the first run's checkpoints and
    log without a word; the README promises a refusal, in the command line's words."""
    ck = tmp_path / "checkpoints" / "cpu_demo"
    assert pyxtts_cli(tmp_path, "train", "--max-steps", "2", "--no-progress").returncode == 0
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    assert "step_00000002.safetensors" in before
    r = pyxtts_cli(tmp_path, "train", "--max-steps", "2", "--no-progress")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "holds checkpoints of an earlier run (newest: step_00000002.safetensors)" in r.stderr
    assert "--resume" in r.stderr and "--overwrite" in r.stderr and "--checkpoint-dir" in r.stderr
    assert "resume=True" not in r.stderr and "overwrite=True" not in r.stderr
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before
    # --resume on the finished run: nothing to do, said plainly (it used to be a traceback)
    r = pyxtts_cli(tmp_path, "train", "--max-steps", "2", "--no-progress", "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "nothing to train: the run is at step 2, its end (max_steps)" in r.stdout
    assert train_steps(ck) == [1, 2]
    # --overwrite starts over, as documented
    r = pyxtts_cli(tmp_path, "train", "--max-steps", "1", "--no-progress", "--overwrite")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in ck.iterdir()) == ["step_00000001.safetensors", "train_log.jsonl"]
    assert train_steps(ck) == [1]

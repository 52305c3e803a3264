"""One process of the distributed tests (``tests/test_distributed.py``), started by
torchrun: ``torchrun --nproc_per_node=N tests/dist_child.py SCENARIO OUT``. Writes
``OUT/rank<R>.npz`` with what the test compares."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from dist_common import ACCUMULATION, CFG, SEED, STEPS, global_batch, rows  # noqa: E402

import pyxtts  # noqa: E402
import pyxtts.testing  # noqa: E402
from pyxtts.batch import train_step_with_accumulation  # noqa: E402
from pyxtts.distributed import DataParallel  # noqa: E402


def start() -> tuple[DataParallel, pyxtts.XTTSGPT, pyxtts.AdamW]:
    dp = DataParallel("cpu", timeout_s=120)
    model = pyxtts.XTTSGPT(CFG, seed=SEED)
    return dp, model, pyxtts.AdamW(model, lr=1e-3)


def train(out: Path, oom_at_start: bool) -> None:
    """STEPS AdamW steps, each over this rank's slice of the global batch; with
    ``oom_at_start`` the last rank runs out of memory at its first allocation of step 0."""
    dp, model, opt = start()
    record: dict[str, np.ndarray] = {}
    for step in range(STEPS):
        batch = global_batch(step)
        lo, hi = dp.shard(batch["text_inputs"].shape[0])
        if oom_at_start and step == 0 and dp.rank == dp.world_size - 1:
            pyxtts.testing.inject_oom(0, "cpu")
        r = train_step_with_accumulation(model, opt, rows(batch, lo, hi), ACCUMULATION, strategy=dp, first_row=lo)
        if step == 0:
            record["loss0"] = np.array([r.loss, r.text_loss, r.audio_loss, r.grad_norm])
            record["grads0"] = model.flat_gradients().numpy().copy()
            record["tokens0"] = np.array([r.text_tokens, r.audio_tokens])
            record["split0"] = np.array([r.oom_splits, r.micro_batch_size])
    dp.check_identical(model)
    record["checksum"] = np.array([dp.checksum(model)], dtype=np.uint64)
    for name, value in model.state_dict().items():
        record[f"param.{name}"] = value
    np.savez(out / f"rank{dp.rank}.npz", **record)
    dp.close()


def oom_always(out: Path) -> None:
    """The last rank cannot fit even one sample: every rank raises OutOfMemoryError, each
    with its parameters and optimizer state as they were."""
    dp, model, opt = start()
    before = model.state_dict()
    batch = global_batch(0)
    lo, hi = dp.shard(batch["text_inputs"].shape[0])
    filler = []
    if dp.rank == dp.world_size - 1:  # no new segment allowed, and the cache's free bytes taken
        pyxtts.set_memory_limit(pyxtts.memory_stats("cpu")["reserved_bytes"] + 1024, "cpu")
        size = pyxtts.memory_stats("cpu")["cached_bytes"]
        while size >= 512:
            try:
                filler.append(pyxtts.empty((size,), pyxtts.uint8, "cpu"))
            except pyxtts.OutOfMemoryError:
                size //= 2
    try:
        train_step_with_accumulation(model, opt, rows(batch, lo, hi), ACCUMULATION, strategy=dp, first_row=lo)
        message = "no error"
    except pyxtts.OutOfMemoryError as exc:
        message = str(exc)
    finally:
        pyxtts.set_memory_limit(None, "cpu")
        del filler
    after = model.state_dict()
    same = all(np.array_equal(before[k], after[k]) for k in before)
    (out / f"rank{dp.rank}.txt").write_text(f"{same}\n{message}\n", encoding="utf-8")
    dp.close()


def buckets(out: Path) -> None:
    """The same 3 steps with the gradients all-reduced at once after the backward
    (bucket_bytes=0), group by group (1 byte: every group is a bucket) and in DDP's 25 MiB
    buckets (here: one for the whole small model); each run from the same start."""
    dp, _, _ = start()
    record: dict[str, np.ndarray] = {}
    for cap in (0, 1, 25 << 20):
        dp.bucket_bytes = cap
        model = pyxtts.XTTSGPT(CFG, seed=SEED)
        opt = pyxtts.AdamW(model, lr=1e-3)
        for step in range(3):
            batch = global_batch(step)
            lo, hi = dp.shard(batch["text_inputs"].shape[0])
            train_step_with_accumulation(model, opt, rows(batch, lo, hi), ACCUMULATION, strategy=dp, first_row=lo)
        record[f"grads.{cap}"] = model.flat_gradients().numpy()
        record[f"params.{cap}"] = np.concatenate([v.ravel() for _, v in sorted(model.state_dict().items())])
    np.savez(out / f"rank{dp.rank}.npz", **record)
    dp.close()


def batch_size(out: Path) -> None:
    """Each rank under its own memory limit: the batch size each finds alone, and the one
    they agree on."""
    dp, model, opt = start()
    from pyxtts.batch import find_optimal_batch_size

    pyxtts.set_memory_limit((48 if dp.rank == 0 else 24) * 2**20, "cpu")
    try:
        alone = find_optimal_batch_size(model, opt)
        agreed = find_optimal_batch_size(model, opt, strategy=dp)
    finally:
        pyxtts.set_memory_limit(None, "cpu")
    np.savez(out / f"rank{dp.rank}.npz", sizes=np.array([alone, agreed]))
    dp.close()


if __name__ == "__main__":
    scenarios = {"exact": lambda out: train(out, False), "oom_once": lambda out: train(out, True),
                 "oom_always": oom_always, "batch_size": batch_size, "buckets": buckets}
    scenarios[sys.argv[1]](Path(sys.argv[2]))

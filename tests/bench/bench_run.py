"""The whole run against the step: `Trainer.fit` on prepared shards, the reference slices
drawn and their mels computed by the collating threads, against the step on one
pre-collated batch (what bench_xtts_gpu.py and profile_xtts_gpu.py time).

    python tests/bench/bench_run.py [--device cuda|cpu] [--config xtts_v2|tiny] [--batch 8]
        [--steps 20] [--warmup 3] [--workers 2,4,8] [--threads 1,2,4,8] [--data DIR]
        [--data-only] [--blas-threads N] [--json PATH]

A real run does more than the step: for every sample of every batch it draws a 3-6 s
slice of the sample's recording and computes its 80-band mel (`pyxtts.references`, NumPy
on the CPU, ~16 ms a sample on one core at XTTS v2's sizes), collates the batch, and then
logs the step. `data.num_workers` threads do the drawing and collating for the next
batches while the engine runs a step without the GIL; when they fall behind, the step
waits (`data_wait_s` in the step record). Measured, in one process, on one model (the
step and the runs first, the data side last; the JSON is rewritten after each part):

  data side   one thread's cost of a batch (the draw, the mels, the framing) and the
              throughput of 1, 2, 4, ... threads collating at once (--threads): how far
              the GIL and the cores let the threads scale; `workers_needed` is the
              fewest threads whose throughput at that scaling keeps up with the step
  step        `train_step_with_accumulation` on one batch collated once, repeated: the
              bench step (--steps, after --warmup), before and after the runs below
  run         `Trainer.fit` for --warmup + --steps steps on the shards, for each worker
              count of --workers: positions/s over the last --steps (wall clock from the
              end of the last warm-up step to the end of the last, so the waits for data,
              the step records, the JSONL log all count), its ratio to the bench step,
              the wait for data per step, the step's own time inside the run, and each
              collating thread's time per batch (wall and CPU; CPU < wall: the thread
              waited for the GIL or a core)

Tokens/s are positions/s as bench_xtts_gpu.py counts them: batch x (conditioning latents
+ text + audio positions) of the padded batch, the work the GPU does; the targets the
trainer counts (its `tokens_per_s`) are fewer, since the codes a reference slice covers
are masked, by a different number every draw. The generated shards hold samples of one
length (XTTS v2: 149 text ids and 304 codes, framed to 150 + 308, with 32 latents 490
positions, bench_xtts_gpu.py's batch; each sample's recording is its own 14.1 s clip at
22,050 Hz, 1024 samples a code), so every batch is the bench step's work and the ratio is
the run's overhead alone. --data DIR takes `pyxtts prepare`'s output (or a folder of its
shards) instead; the bench batch is then its first --batch samples, and the ratio also
holds the difference in length between them and the run's batches.

The model: XTTS v2's GPT as Coqui fine-tunes it (`xtts_v2_finetune`: the conditioning
encoder and perceiver on 517-frame mels of 6 s slices, dropout 0.1, Coqui's framing and
optimizer), bf16 without recomputation on a GPU, fp32 on the CPU; `--config tiny` is a
2-layer model with 64-frame references, to check this script where no GPU is (the CPU's
ratio means nothing: the step and the threads share its cores). --data-only measures the
data side alone, without a model (XTTS v2's sizes on a machine that cannot run its step).
Checkpoints are not written (the trainer's saves are skipped: they are not the steps').
The scaling is measured twice where threadpoolctl is installed: with NumPy's BLAS as it
is (a thread a core, which every collating thread's filterbank product starts) and on one
thread; --blas-threads N runs the whole bench with N.

The goal (the GPU issue): the run's positions/s >= 0.95 x the bench step's at batch 8, on
a 16-core host, i.e. the GPU kept >= 95 % as busy as by the step alone.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

# (text ids, codes) of every generated sample: framed, 150 + 308 positions (bench_xtts_gpu.py's
# batch) for XTTS v2; 40 + 80 for the tiny model
LENGTHS = {"xtts_v2": (149, 304), "tiny": (39, 76)}
DISTINCT = 64  # samples written to the shards; the run tiles them (each index draws its own slice)
GOAL = 0.95


# ---- the model and the data -----------------------------------------------------------------

def model_config(name: str) -> Any:
    """XTTS v2's GPT as the shipped recipe trains it, or a tiny model with the same parts."""
    import pyxtts

    if name == "xtts_v2":
        return pyxtts.XTTSConfig.load("xtts_v2_finetune").model
    return pyxtts.ModelConfig(n_layers=2, d_model=64, n_heads=4, text_vocab_size=256, audio_vocab_size=66,
                              max_text_tokens=48, max_audio_tokens=96, n_cond_latents=32, max_cond_frames=64,
                              start_text_token=1, stop_text_token=0, start_audio_token=64, stop_audio_token=65)


def write_prepared(folder: Path, model: Any, n: int, lengths: tuple[int, int], seed: int = 0) -> Path:
    """``pyxtts prepare``'s layout, generated: ``n`` samples of ``lengths`` (text ids, codes),
    each with its own clip as the reference recording (codes x code_stride_len samples of
    noise: a mel costs the same whatever the sound), and a ``mel_stats.npy`` beside them."""
    from pyxtts.data import Sample, write_shards

    rng = np.random.default_rng(seed)
    n_text, n_codes = lengths
    clip = n_codes * model.code_stride_len
    samples = [Sample(rng.integers(2, model.text_vocab_size, n_text), rng.integers(0, model.audio_vocab_size - 2, n_codes),
                      source=f"generated sample {i}", ref_audio=(0.1 * rng.standard_normal(clip)).astype(np.float32),
                      ref_is_clip=True)
               for i in range(n)]
    write_shards(samples, folder, samples_per_shard=32)
    np.save(folder / "mel_stats.npy", rng.uniform(1.0, 5.0, 80))
    return folder


def load_prepared(path: Path) -> Any:
    """The training shards of a ``pyxtts prepare`` output folder, or of a folder of shards."""
    from pyxtts.data import TTSDataset, prepared_splits

    splits = prepared_splits(path)
    data = TTSDataset.load(splits[0] if splits else path)
    if data.mel_stats is None or data[0].ref_audio is None:
        raise SystemExit(f"{path}: the samples carry no reference recordings (or no mel_stats.npy): "
                         "the run draws no slices; prepare the data with pyxtts prepare")
    return data


def tiled(data: Any, n: int) -> Any:
    """At least ``n`` samples: ``data`` repeated. A repeated sample has its own index, so its
    own slice each epoch; the run stays inside its first epoch (an epoch's end restarts the
    collating threads, whose first batch then cannot be ready: a cost of short epochs only)."""
    from pyxtts.data import TTSDataset

    reps = -(-n // len(data))
    return TTSDataset(list(data.samples) * reps, mel_stats=data.mel_stats)


def references(model: Any, data: Any) -> Any:
    from pyxtts.references import References

    return References.for_model(model, data.mel_stats, seed=0)


def positions(batch: dict, model: Any) -> int:
    """The positions the step computes: batch x (latents + padded text + padded audio)."""
    b, lt = batch["text_inputs"].shape
    return b * (model.n_cond_latents + lt + batch["audio_inputs"].shape[1])


# ---- the data side alone ----------------------------------------------------------------------

def collate_cost(data: Any, model: Any, batch: int, repeats: int) -> dict:
    """One thread's cost of a batch: the draw and the mels (``References.batch``), then the
    framing (``collate``), each batch other samples; median over ``repeats`` batches."""
    from pyxtts.data import collate

    refs = references(model, data)
    draw, frame, cpu = [], [], []
    for r in range(repeats):
        idx = [(r * batch + i) % len(data) for i in range(batch)]
        samples = [data[i] for i in idx]
        t0, c0 = time.perf_counter(), time.thread_time()
        _, ranges = refs.batch(samples, idx, epoch=0)
        t1 = time.perf_counter()
        collate(samples, config=model, ignore_code_ranges=ranges)
        frame.append(time.perf_counter() - t1)
        draw.append(t1 - t0)
        cpu.append(time.thread_time() - c0)
    per_batch = statistics.median(d + f for d, f in zip(draw, frame))
    # the thread's own CPU time: what the batch costs a free core (a loaded machine stretches
    # the wall time, not this), less any work NumPy's BLAS threads did for it
    return {"batches": repeats, "ms_per_batch": per_batch * 1e3, "ms_per_sample": per_batch / batch * 1e3,
            "cpu_ms_per_sample": statistics.median(cpu) / batch * 1e3,
            "references_ms_per_sample": statistics.median(draw) / batch * 1e3,
            "framing_ms_per_batch": statistics.median(frame) * 1e3, "slice_samples": refs.max_samples,
            "mel_frames": refs.frames()}


def collate_scaling(data: Any, model: Any, batch: int, threads: list[int], per_thread: int = 2) -> list[dict]:
    """Batches/s of ``t`` threads collating at once (as the trainer's workers do, with the
    references), for each ``t``: ``per_thread`` batches each; speedup against one thread."""
    from pyxtts.data import collate_references

    refs = references(model, data)
    out: list[dict] = []
    for t in threads:
        n = per_thread * t
        groups = [np.arange(k * batch, (k + 1) * batch) % len(data) for k in range(n)]

        def one(g: np.ndarray) -> None:
            collate_references([data[int(i)] for i in g], g, model, refs, epoch=1)

        with ThreadPoolExecutor(max_workers=t) as pool:
            t0 = time.perf_counter()
            list(pool.map(one, groups))
            rate = n / (time.perf_counter() - t0)
        out.append({"threads": t, "batches_per_s": rate})
    for row in out:
        row["speedup"] = row["batches_per_s"] / out[0]["batches_per_s"] * out[0]["threads"]
    return out


def blas_limited(threads: int | None) -> Any:
    """A context in which NumPy's BLAS (the mel's filterbank product) uses ``threads`` threads
    (threadpoolctl), or None where threadpoolctl is not installed. Its default is one thread
    a core, and every collating thread's product starts them all."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(threads, user_api="blas")


def workers_needed(step_s: float, scaling: list[dict], goal: float = GOAL) -> int | None:
    """The fewest threads whose measured throughput keeps the step ``goal`` busy (a batch
    every ``step_s / goal`` s), None when none of those measured does."""
    for row in scaling:
        if row["batches_per_s"] * step_s / goal >= 1.0:
            return row["threads"]
    return None


# ---- the step, and the run ------------------------------------------------------------------

def bench_config(model: Any, device: str, batch: int, folder: Path) -> Any:
    """A run of Coqui's recipe (its optimizer, a constant rate) that writes nothing but its log."""
    import pyxtts

    t = {"precision": "bf16" if device.startswith("cuda") else "fp32", "checkpointing": "none",
         "lr_schedule": "constant", "learning_rate": 5e-6, "weight_decay_on": "weights", "grad_clip": None,
         "max_steps": 1, "epochs": None, "checkpoint_dir": str(folder / "ckpt"), "checkpoint_interval": 10**9,
         "eval_interval": 10**9, "log_interval": 10**9, "enable_memory_cleanup": False, "device": device,
         "optimizer_offload": False, "seed": 0}
    d = {"batch_size": batch, "bucketing": True, "shuffle": True, "num_workers": 0}
    fields = {f: getattr(model, f) for f in model.__dataclass_fields__}
    return pyxtts.XTTSConfig.from_dict({"model": fields, "training": t, "data": d})


def make_trainer(config: Any, clock: list[float]) -> Any:
    """A Trainer whose saves are skipped (the run's end would write ~6 GB of XTTS v2 state,
    nothing a step does) and whose ``clock`` gets the time at the end of every step."""
    from pyxtts import Trainer
    from pyxtts.callbacks import Callback

    class Clock(Callback):
        def on_step_end(self, run: Any, record: dict) -> None:
            clock.append(time.perf_counter())

    class Unsaved(Trainer):
        def save(self, path: Any = None, weights_only: bool = False) -> Path:
            return Path(path) if path is not None else self.checkpoint_dir / "not-written.safetensors"

    return Unsaved(config, progress=False, callbacks=[Clock()])


def bench_step(trainer: Any, batch: dict, steps: int, warmup: int) -> dict:
    """The step on one pre-collated batch, repeated: median and mean of ``steps`` after ``warmup``."""
    import pyxtts
    from pyxtts.batch import train_step_with_accumulation

    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        train_step_with_accumulation(trainer.model, trainer.optimizer, batch, 1)
        pyxtts.synchronize(trainer.device)
        times.append(time.perf_counter() - t0)
    times = times[warmup:]
    return {"steps": steps, "step_ms_median": statistics.median(times) * 1e3,
            "step_ms_mean": statistics.fmean(times) * 1e3, "step_s": times}


class Spy:
    """What the run does, seen from inside ``pyxtts.trainer``: each collation's thread, wall
    and CPU time (its module's ``collate_references``), and each step's positions (its
    ``train_step_with_accumulation``); the originals are put back on ``close``."""

    def __init__(self, model: Any) -> None:
        import pyxtts.trainer as tr

        self.tr, self.model = tr, model
        self.collations: list[tuple[str, float, float]] = []
        self.positions: list[int] = []
        self.originals = (tr.collate_references, tr.train_step_with_accumulation)
        collate, step = self.originals

        def timed_collate(*args: Any, **kwargs: Any) -> dict:
            w0, c0 = time.perf_counter(), time.thread_time()
            out = collate(*args, **kwargs)
            self.collations.append((threading.current_thread().name, time.perf_counter() - w0,
                                    time.thread_time() - c0))
            return out

        def counted_step(model: Any, opt: Any, batch: dict, *args: Any, **kwargs: Any) -> Any:
            self.positions.append(positions(batch, self.model))
            return step(model, opt, batch, *args, **kwargs)

        tr.collate_references, tr.train_step_with_accumulation = timed_collate, counted_step

    def close(self) -> None:
        self.tr.collate_references, self.tr.train_step_with_accumulation = self.originals


def fit_run(trainer: Any, data: Any, workers: int, steps: int, warmup: int, clock: list[float],
            batch: int) -> dict:
    """``trainer.fit`` for ``warmup + steps`` more steps with ``workers`` collating threads;
    the rates over the last ``steps``."""
    c = trainer.config
    c.data.num_workers = workers
    c.training.max_steps = trainer.step + warmup + steps
    spy = Spy(c.model)
    del clock[:]
    try:
        r = trainer.fit(data)
    finally:
        spy.close()
    hist = r.history[-steps:]
    wall = clock[-1] - clock[-steps - 1]
    done = sum(spy.positions[-steps:])
    waits = [h["data_wait_s"] for h in hist]
    step_s = [h["step_time_s"] for h in hist]
    coll_wall = [w for _, w, _ in spy.collations]
    coll_cpu = [cpu for _, _, cpu in spy.collations]
    return {"workers": workers, "steps": steps, "wall_s": wall, "positions": done, "tokens_per_s": done / wall,
            "counted_tokens_per_s": sum(h["text_tokens"] + h["audio_tokens"] for h in hist) / wall,
            "interval_ms_median": statistics.median(np.diff(clock[-steps - 1:])) * 1e3,
            "step_ms_median": statistics.median(step_s) * 1e3,
            "wait_ms_mean": statistics.fmean(waits) * 1e3, "wait_ms_max": max(waits) * 1e3,
            "wait_share": sum(waits) / wall,
            "other_ms_per_step": (wall - sum(waits) - sum(step_s)) / steps * 1e3,
            "collations": len(spy.collations), "collating_threads": len({n for n, _, _ in spy.collations}),
            "collate_ms_per_batch": statistics.median(coll_wall) * 1e3,
            "collate_cpu_ms_per_batch": statistics.median(coll_cpu) * 1e3,
            "collate_ms_per_sample": statistics.median(coll_wall) / batch * 1e3,
            "first_wait_ms": r.history[0]["data_wait_s"] * 1e3 if len(r.history) > steps else None}


# ---- the driver ---------------------------------------------------------------------------------

def host() -> dict:
    """The host's side of the data: its cores and the BLAS threads NumPy's mel product may use."""
    out: dict[str, Any] = {"cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
                           "python": platform.python_version(), "numpy": np.__version__,
                           "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
                           "load_average": os.getloadavg()[0]}
    try:
        from threadpoolctl import threadpool_info

        out["blas"] = [{k: p.get(k) for k in ("internal_api", "num_threads", "filepath")} for p in threadpool_info()]
    except ImportError:
        pass
    return out


def int_list(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v]
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of counts >= 0, got {text!r}")
    return values


def report(out: dict) -> None:
    """The figures, as lines a log keeps."""
    d = out["data_side"]
    print(f"# {out['command']}")
    print(f"# {out['device']}, {out['config']}, batch {out['batch']} x {out['positions_per_sample']} positions, "
          f"{out['host']['cpu_count']} CPUs (load {out['host']['load_average']:.1f})")
    print(f"data side, one thread: {d['ms_per_batch']:.1f} ms a batch, {d['ms_per_sample']:.2f} ms a sample "
          f"({d['cpu_ms_per_sample']:.2f} ms of its CPU; draw + mel {d['references_ms_per_sample']:.2f}, "
          f"framing {d['framing_ms_per_batch']:.2f} ms a batch)")
    for name in ("scaling", "scaling_blas1"):
        for row in out.get(name) or []:
            print(f"  {row['threads']:>2} threads{' (BLAS 1 thread)' if name != 'scaling' else '':16}: "
                  f"{row['batches_per_s']:7.2f} batches/s, speedup {row['speedup']:.2f}")
    if "step" not in out:
        return
    s = out["step"]
    print(f"bench step: {s['step_ms_median']:.1f} ms median ({out['step_after']['step_ms_median']:.1f} after the "
          f"runs), {out['step_tokens_per_s']:,.0f} tok/s; threads needed for {GOAL:.0%}: "
          f"{out['workers_needed']} (one thread's batch / step = {out['collate_to_step']:.2f})")
    print(f"{'workers':>7} {'tok/s':>9} {'vs step':>8} {'step in run':>11} {'wait/step':>9} {'wait max':>8} "
          f"{'other':>7} {'collate/batch':>13} {'(cpu)':>7}")
    for f in out["runs"]:
        print(f"{f['workers']:>7} {f['tokens_per_s']:>9,.0f} {f['ratio']:>7.3f}x {f['step_ms_median']:>9.1f}ms "
              f"{f['wait_ms_mean']:>7.1f}ms {f['wait_ms_max']:>6.1f}ms {f['other_ms_per_step']:>5.1f}ms "
              f"{f['collate_ms_per_batch']:>11.1f}ms {f['collate_cpu_ms_per_batch']:>5.1f}ms")
    print(f"goal run >= {GOAL} x step: {'met' if out['goal_met'] else 'NOT met'} (best {out['best_ratio']:.3f} at "
          f"{out['best_workers']} workers; default data.num_workers = {out['default_workers']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (cuda:0), cuda:N or cpu")
    ap.add_argument("--config", default="xtts_v2", choices=tuple(LENGTHS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="steps measured, per run and for the bench step")
    ap.add_argument("--warmup", type=int, default=3, help="steps before those measured")
    ap.add_argument("--workers", type=int_list, default=None,
                    help="the runs' data.num_workers, e.g. 2,4,8 (default: the config default)")
    ap.add_argument("--threads", type=int_list, default=[1, 2, 4, 8], help="thread counts of the scaling")
    ap.add_argument("--data", type=Path, help="pyxtts prepare's output folder (or of its shards)")
    ap.add_argument("--data-only", action="store_true", help="the data side alone, no model")
    ap.add_argument("--repeats", type=int, default=8, help="batches of the one-thread cost")
    ap.add_argument("--blas-threads", type=int, help="NumPy's BLAS threads for the whole bench (threadpoolctl)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.warmup < 1:
        ap.error("--warmup: expected >= 1 (the runs' rates start at the end of a warm-up step)")
    limit = blas_limited(args.blas_threads) if args.blas_threads else None
    if args.blas_threads and limit is None:
        ap.error("--blas-threads needs threadpoolctl (pip install threadpoolctl)")
    with limit or contextlib.nullcontext():
        run(args)


def run(args: argparse.Namespace) -> None:
    """Everything the options ask for, in order of value: the step and the runs first, then
    the data side alone. The JSON is rewritten after each part (``complete`` false until
    the end), so a run stopped at its time limit still leaves what it measured."""
    device = "cuda:0" if args.device == "cuda" else args.device
    import pyxtts

    model = model_config(args.config)
    default_workers = pyxtts.DataConfig().num_workers
    workers = args.workers or [default_workers]
    with tempfile.TemporaryDirectory(prefix="bench_run_") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        source = args.data or write_prepared(folder / "shards", model, DISTINCT, LENGTHS[args.config])
        runs_steps = len(workers) * (args.warmup + args.steps)
        data = tiled(load_prepared(source), args.batch * (runs_steps + 1))
        batch = first_batch(data, model, args.batch)
        out: dict[str, Any] = {
            "command": "python tests/bench/bench_run.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
            "complete": False, "device": device if device == "cpu" else pyxtts.device_info(device)["name"],
            "config": args.config, "batch": args.batch, "bench_positions": positions(batch, model),
            "positions_per_sample": positions(batch, model) // args.batch,
            "host": host(), "blas_threads": args.blas_threads, "default_workers": default_workers,
            "data_prepare_s": time.perf_counter() - t0,
            "data": str(args.data) if args.data else f"generated: {DISTINCT} samples of {LENGTHS[args.config]} "
                                                     "(text ids, codes), tiled"}

        def save() -> None:
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(out, indent=1, default=float) + "\n")

        if not args.data_only:
            measure_runs(out, args, device, folder, data, batch, workers, save)
        measure_data_side(out, args, data, model, save)
        if not args.data_only:
            conclude(out)
        out["complete"] = True
        save()
    report(out)


def first_batch(data: Any, model: Any, batch: int) -> dict:
    """The bench step's batch: the first ``batch`` samples with their reference mels."""
    from pyxtts.data import collate_references

    first = list(range(batch))
    return collate_references([data[i] for i in first], first, model, references(model, data), epoch=0)


def measure_runs(out: dict, args: argparse.Namespace, device: str, folder: Path, data: Any, batch: dict,
                 workers: list[int], save: Any) -> None:
    """The bench step, a run for each worker count, the step again (the machine's drift)."""
    model = model_config(args.config)
    clock: list[float] = []
    t0 = time.perf_counter()
    trainer = make_trainer(bench_config(model, device, args.batch, folder), clock)
    out.update(model_build_s=time.perf_counter() - t0, parameters=trainer.model.num_parameters,
               precision=trainer.config.training.precision)
    step = bench_step(trainer, batch, args.steps, max(args.warmup, 2))
    out["step"] = {k: v for k, v in step.items() if k != "step_s"}
    rate = positions(batch, model) / statistics.fmean(step["step_s"])
    print(f"bench step: {step['step_ms_median']:.1f} ms median", flush=True)
    save()
    out["runs"] = []
    for w in workers:
        r = fit_run(trainer, data, w, args.steps, args.warmup, clock, args.batch)
        r["ratio"] = r["tokens_per_s"] / rate  # against the step before it; conclude() uses both
        out["runs"].append(r)
        print(f"run with {w} workers: {r['ratio']:.3f} x the step, {r['wait_ms_mean']:.1f} ms waited a step",
              flush=True)
        save()
    after = bench_step(trainer, batch, args.steps, 1)
    out["step_after"] = {k: v for k, v in after.items() if k != "step_s"}
    out["step_s"] = statistics.fmean(step["step_s"] + after["step_s"])  # both sets: the drift averaged
    save()


def measure_data_side(out: dict, args: argparse.Namespace, data: Any, model: Any, save: Any) -> None:
    """One thread's cost of a batch, and the throughput of several, with NumPy's BLAS as it
    is and (where threadpoolctl is) on one thread: its spinning threads can cost more than
    they give on a busy host."""
    out["data_side"] = collate_cost(data, model, args.batch, args.repeats)
    out["scaling"] = collate_scaling(data, model, args.batch, args.threads)
    save()
    limit = blas_limited(1)
    if limit is not None:
        with limit:
            out["scaling_blas1"] = collate_scaling(data, model, args.batch, args.threads)
        save()


def conclude(out: dict) -> None:
    """The ratios against the step's mean over both sets, the threads the step needs, the goal."""
    step_s = out["step_s"]
    rate = out["bench_positions"] / step_s
    for r in out["runs"]:
        r["ratio"] = r["tokens_per_s"] / rate
    best = max(out["runs"], key=lambda r: r["ratio"])
    out.update(step_tokens_per_s=rate, collate_to_step=out["data_side"]["ms_per_batch"] / 1e3 / step_s,
               workers_needed=workers_needed(step_s, out["scaling"]), best_ratio=best["ratio"],
               best_workers=best["workers"], goal_met=best["ratio"] >= GOAL)


if __name__ == "__main__":
    main()

"""The pyxtts command line."""
from __future__ import annotations

import argparse
import difflib
import errno
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import pyxtts
from pyxtts._args import CLI_FLAGS, as_flags
from pyxtts._files import folder_problem
from pyxtts._words import counted
from pyxtts.memory import format_bytes
from pyxtts.memtest import memtest as _memtest


def _gpu_info(args: argparse.Namespace) -> int:
    info = pyxtts.build_info()
    devices = ["cpu"] + [f"cuda:{i}" for i in range(pyxtts.device_count())]
    if args.json:
        print(json.dumps({"build": info, "devices": [pyxtts.device_info(d) for d in devices]}, indent=2))
        return 0
    print(f"pyxtts {info['version']}  (compiled by {info['compiler']}, {info['c_standard']})")
    print(f"  BLAS:  {info['blas']}")
    if info["cuda"]:
        print(f"  CUDA:  runtime {info['cuda_version']}, cuBLAS {info['cublas_version']}, "
              f"driver {info['cuda_driver_version'] or 'not found'}, kernels for {' '.join(info['cuda_archs'])}")
    else:
        print("  CUDA:  not built (CPU-only module)")
    print("devices:")
    for d in devices:
        p = pyxtts.device_info(d)
        cap = f", compute capability {p['capability'][0]}.{p['capability'][1]}" if p["type"] == "cuda" else ""
        if p["type"] == "cuda" and pyxtts.model.precision_problem("bf16", d):
            cap += " (no bfloat16: train with precision fp16)"
        unit = "SMs" if p["type"] == "cuda" else "cores"
        print(f"  {d:8s} {p['name']}: {format_bytes(p['total_memory'])} total, "
              f"{format_bytes(p['free_memory'])} free, {p['multiprocessors']} {unit}{cap}")
    if info["cuda"] and pyxtts.device_count() == 0:
        print("  (the CUDA backend is built, but no GPU is visible: no driver or no device)")
    return 0


def _world_arguments(parser: argparse.ArgumentParser) -> None:
    """``--world-size`` and ``--nodes`` of ``memtest`` and ``optimize-config``."""
    parser.add_argument("--world-size", type=int, default=None, metavar="N",
                        help="plan for one of N processes training together (one per GPU): their collectives' "
                             "memory (NCCL's, estimated) counts against each device's budget (default: torchrun's "
                             "world under torchrun, else 1)")
    parser.add_argument("--nodes", type=int, default=None, metavar="M",
                        help="with --world-size: the N processes run on M machines (default 1)")


def _optimize_config(args: argparse.Namespace) -> int:
    from pyxtts.config import XTTSConfig, optimize_config
    from pyxtts.memtest import world_flags

    try:
        config = XTTSConfig.load(args.config)
        if args.vocab is not None:
            from pyxtts.text_vocab import vocab_rows_line, with_vocab

            before, config = config, with_vocab(config, args.vocab)
            print(vocab_rows_line(before, config, args.vocab))
        device = args.device if args.device is not None else config.training.resolved_device()
        if device == "cpu" and args.device is None and config.training.device == "auto":
            print("pyxtts optimize-config: no GPU here, so training.device 'auto' plans for this machine's "
                  "CPU and RAM; for a GPU elsewhere say which: --device cuda --memory 8GiB", file=sys.stderr)
        world_size, nodes = world_flags(args)
        new, explanation = optimize_config(config, args.memory, device=device, world_size=world_size, nodes=nodes)
    except (OSError, TypeError, ValueError) as exc:
        print(f"pyxtts optimize-config: {as_flags('optimize-config', str(exc))}", file=sys.stderr)
        return 2
    replaced = Path(args.output).is_file()
    try:
        new.save(args.output)
    except OSError as exc:  # it names the file and the cause
        print(f"pyxtts optimize-config: --output: {_said(exc)}", file=sys.stderr)
        return 2
    print(explanation)
    print(f"written: {args.output}" + (" (it replaced the file there)" if replaced else ""))
    return 0


DEMO_SAMPLES, DEMO_EVAL = 1024, 64
RECIPE = "xtts_v2_finetune"  # the config `train --init` takes without --config: Coqui's whole recipe
COMMAND_ENV = "PYXTTS_COMMAND"  # --gpus tells its torchrun workers the command line that started them
VOCAB_HELP = ("plan with the text rows of this vocab.json (a new language's, from prepare --new-language) "
              "instead of the config's")


def _fail(command: str, exc: BaseException) -> int:
    print(f"pyxtts {command}: {as_flags(command, _said(exc))}", file=sys.stderr)
    return 2


def _said(exc: BaseException) -> str:
    """The error's words for a person: an OSError without its "[Errno 20]" prefix; one about
    a path that a file or a broken symbolic link stands in the way of says that instead."""
    if isinstance(exc, OSError) and exc.strerror:
        if exc.filename is None:
            return exc.strerror
        path = Path(os.fsdecode(exc.filename))
        problem = folder_problem(path) if exc.errno in (errno.EEXIST, errno.ENOENT, errno.ENOTDIR) else None
        return problem or f"{exc.strerror}: {str(path)!r}"
    return str(exc)


def _dataset(path: str, where: str):
    """``TTSDataset.load(path)``; an error names the option or config field it came from."""
    from pyxtts.data import DataError, TTSDataset

    try:
        return TTSDataset.load(path)
    except OSError as exc:
        hint = " (a path in a config file is relative to the file's folder)" if where.startswith("data.") else ""
        raise DataError(f"{where}: cannot read {path!r}: {exc.strerror or exc}{hint}") from exc
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from exc


def _train_note(line: str, strategy: Any = None) -> None:
    """A note of ``pyxtts train`` on stderr; with several processes, rank 0's only."""
    if strategy is None or strategy.is_main:
        print(f"pyxtts train: {line}", file=sys.stderr)


def _train_data(data: str, want_eval: bool, strategy: Any = None) -> tuple[Any, Any]:
    """``--data``'s samples and None; for an output folder of ``pyxtts prepare`` (no shards
    of its own, shards in ``train/``), its ``train/`` samples and, when ``want_eval``, its
    ``eval/`` ones (None without eval/), said in one line on stderr."""
    from pyxtts.data import prepared_splits

    splits = prepared_splits(data)
    if splits is None:
        return _dataset(data, "--data"), None
    train, held = splits
    held = held if want_eval else None
    empty = want_eval and held is None and (Path(data) / "eval").is_dir()  # prepare dropped every held-out clip
    none = want_eval and held is None and not empty  # prepared without --eval-fraction (Coqui holds out 1%)
    _train_note(f"--data {data} is an output folder of pyxtts prepare: training on {train}"
                + (f", evaluating on {held}" if held is not None else "")
                + (f"; its eval/ holds no sample (every held-out clip was dropped: {Path(data) / 'report.tsv'} "
                   "says why), so there is no evaluation; --eval-data gives one" if empty else "")
                + ("; it has no eval/ (prepare --eval-fraction holds clips out), so there is no evaluation and no "
                   "best checkpoint; --eval-data gives one" if none else ""), strategy)
    return _dataset(str(train), "--data"), None if held is None else _dataset(str(held), "--data")


def _eval_data(eval_data: str, strategy: Any = None) -> Any:
    """``--eval-data``'s samples; for an output folder of ``pyxtts prepare``, its ``eval/``
    (its held-out clips), else its ``train/`` (recordings prepared for evaluation alone),
    said in one line."""
    from pyxtts.data import prepared_splits

    splits = prepared_splits(eval_data)
    if splits is None:
        return _dataset(eval_data, "--eval-data")
    train, held = splits
    chosen = held if held is not None else train
    _train_note(f"--eval-data {eval_data} is an output folder of pyxtts prepare: evaluating on {chosen}"
                + (" (its held-out split)" if held is not None else " (it has no held-out split: all its samples)"),
                strategy)
    return _dataset(str(chosen), "--eval-data")


def _init_vocab(path: Path) -> str | None:
    """The digest of the vocabulary an ``init_xtts.safetensors`` was grown to (None: XTTS
    v2's own)."""
    from pyxtts.fingerprint import saved_extra

    grown = saved_extra(path).get("vocab")
    return grown.get("sha256") if isinstance(grown, dict) else None


def _check_run_vocab(out: Path, vocab: Path | None) -> None:
    """A run whose checkpoints exist keeps the vocabulary it started with: the same text
    has other ids under another one. Checked before ``init_xtts.safetensors`` is replaced."""
    from pyxtts.prepare.vocab import read_vocab_doc, vocab_sha256
    from pyxtts.trainer import CHECKPOINT_RE

    if not out.is_file() or not any(CHECKPOINT_RE.fullmatch(p.name) for p in out.parent.iterdir()):
        return
    try:
        then = _init_vocab(out)
    except Exception:  # noqa: BLE001 - an unreadable earlier import is replaced as before
        return
    now = None if vocab is None else vocab_sha256(read_vocab_doc(vocab))
    if then != now:
        def name(digest: str | None) -> str:
            return "XTTS v2's own vocabulary" if digest is None else f"an extended vocabulary (sha256 {digest[:12]}...)"

        raise ValueError(f"the run in {out.parent} started from {name(then)}, and --data's text ids come from "
                         f"{name(now)}{'' if vocab is None else f' ({vocab})'}: the same text has other ids under "
                         "another vocabulary, so the run cannot continue on it; train on the data it started "
                         "with, or start a new run (--checkpoint-dir DIR, or --overwrite)")


def _import_once(source: str, out: Path, vocab: Path | None, strategy: Any) -> dict:
    """``import_xtts_checkpoint(source, out)``; with several processes rank 0 imports and
    the others read what it wrote (a refusal on rank 0 stops them all)."""
    from pyxtts.checkpoint import CheckpointError
    from pyxtts.coqui_checkpoint import import_xtts_checkpoint
    from pyxtts.fingerprint import saved_meta

    if strategy is None:
        return import_xtts_checkpoint(source, out, vocab=vocab)
    meta, error = None, None
    if strategy.is_main:
        try:
            meta = import_xtts_checkpoint(source, out, vocab=vocab)
        except (CheckpointError, OSError) as exc:
            error = exc
    if strategy.failed_rank(error is not None) is not None:
        if error is not None:
            raise error
        raise CheckpointError("rank 0 could not import it (its error says why)")
    if meta is None:  # its config and extra, not its tensors (the Trainer loads those)
        meta = saved_meta(out)
    return meta


def _init_from_xtts(config: Any, source: str, vocab: Path | None = None, keep_run: bool = True,
                    strategy: Any = None) -> Any:
    """``--init``: the run starts from a Coqui XTTS checkpoint (the released folder, its
    ``model.pth``, or a GPTTrainer checkpoint), imported into
    ``<checkpoint_dir>/init_xtts.safetensors``; the checkpoint's own model config (sizes,
    token ids, XTTS v2's conditioning path and dropout) replaces the config's model section
    (``XTTSConfig.with_model``); returns the config to train. ``vocab``: the extended
    vocabulary of the data (prepare --new-language), which the text rows grow to.
    ``keep_run``: an existing run in the folder continues (not --overwrite), so its
    vocabulary must be ``vocab``'s (``_check_run_vocab``). ``strategy``: several processes
    (rank 0 imports, ``_import_once``)."""
    from pyxtts.checkpoint import CheckpointError
    from pyxtts.model import ModelConfig

    out = Path(config.training.checkpoint_dir) / "init_xtts.safetensors"
    if keep_run:
        _check_run_vocab(out, vocab)
    made = not out.parent.exists()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = _import_once(source, out, vocab, strategy)
    except (CheckpointError, OSError) as exc:
        if made and out.parent.is_dir() and not any(out.parent.iterdir()):
            out.parent.rmdir()  # a refused --init leaves no empty run folder behind
        if isinstance(exc, CheckpointError):
            raise CheckpointError(f"--init {source}: {exc}{_own_checkpoint_hint(source)}") from exc
        raise type(exc)(f"--init {source}: {exc.strerror or exc}") from exc
    config = config.with_model(ModelConfig(**meta["config"]))
    config.training.init_checkpoint = str(out)
    grown = meta["extra"].get("vocab")
    added = grown is not None and grown["size"] > grown["base_size"]
    # the base's own vocab.json goes with rows it has already (an earlier export's)
    config.training.vocab = str(vocab) if added else None
    if grown is not None and (strategy is None or strategy.is_main):
        if added:
            print(f"pyxtts train: --init: the text rows grow from {grown['base_size']} to {grown['size']} for the "
                  f"vocabulary {vocab} ([{grown['language']}]); the old rows keep their values, {grown['from_pieces']} "
                  f"new ones start from the mean of their pieces' rows, {grown['from_mean']} from a mean over rows",
                  file=sys.stderr)
        else:
            print(f"pyxtts train: --init: {source} already has the {grown['size']} text rows of the vocabulary "
                  f"{vocab} (its vocab.json has those tokens): nothing to grow, the rows go on from its values",
                  file=sys.stderr)
    folder = _init_folder(source)
    if config.training.xtts_dir is None and folder is not None:
        config.training.xtts_dir = folder  # what test_sentences are spoken through
    return config


def _own_checkpoint_hint(source: str) -> str:
    """How a run starts from a pyxtts checkpoint (``best.safetensors``, a step checkpoint),
    to end ``--init``'s refusal of one; "" for any other file."""
    from pyxtts.checkpoint import CheckpointError
    from pyxtts.fingerprint import saved_meta

    if not Path(source).is_file():
        return ""
    try:
        saved_meta(Path(source))
    except CheckpointError:
        return ""
    return ("; it is a pyxtts checkpoint, and --init takes Coqui's: a new run starts from its weights with "
            "training.init_checkpoint: PATH in its config")


def _check_continue(args: argparse.Namespace) -> None:
    """``--continue`` continues the Coqui run ``--init`` names, in a folder of its own."""
    if args.init is None:
        raise ValueError("--continue: continues the Coqui run whose checkpoint --init names; pass --init "
                         "RUN/checkpoint_N.pth (a checkpoint of Coqui's trainer, which holds its optimizer state)")
    if args.resume is not None:
        raise ValueError(f"--continue: not with --resume {args.resume}: --continue starts pyxtts's run from the Coqui "
                         "run's checkpoint, --resume goes on from pyxtts's own checkpoints (once the continued run "
                         "has written some, --resume alone continues it)")
    if args.overwrite:
        raise ValueError("--continue: not with --overwrite: a continued run starts in a checkpoint_dir without a "
                         "pyxtts run's checkpoints; pass another --checkpoint-dir")


def _continue_once(config: Any, source: str, strategy: Any, imported: _NewImport | None) -> Path:
    """``continue_xtts_run(source, config)``: the checkpoint the run resumes from. With
    several processes rank 0 writes it and the others take the newest checkpoint of the
    folder, which held none before (a refusal on rank 0 stops them all)."""
    from pyxtts.checkpoint import CheckpointError
    from pyxtts.coqui_continue import continue_xtts_run
    from pyxtts.trainer import run_checkpoint

    info, error = None, None
    if strategy is None or strategy.is_main:
        try:
            info = continue_xtts_run(source, config)
        except (CheckpointError, OSError) as exc:
            error = exc
    if strategy is not None and strategy.failed_rank(error is not None) is not None and error is None:
        raise CheckpointError("--continue: rank 0 could not continue the Coqui run (its error says why)")
    if error is not None:
        if isinstance(error, CheckpointError):
            raise CheckpointError(f"--continue {source}: {error}") from error
        raise error
    if info is None:
        return run_checkpoint(config.training.checkpoint_dir, "latest")
    if imported is not None:
        imported.written.append(Path(info["path"]))
    coqui = ("" if info["coqui_step"] is None else
             f" (Coqui's step {info['coqui_step']} counts batches; epoch {info['coqui_epoch']})")
    _train_note(f"--continue: the Coqui run goes on at its optimizer step {info['step']}{coqui} with its AdamW "
                f"moments and lr {info['lr']:g}; its best loss does not carry over (docs/coqui.md, Continuing a Coqui run)",
                strategy)
    return Path(info["path"])


class _NewImport:
    """The ``init_xtts.safetensors`` that ``--init`` is about to write into a run's folder,
    taken back when the command then fails before the run writes anything beside it (a typo
    in ``--data``, a refused ``--resume``): a refused train leaves the folder as it was, not
    with a new 1.8 GB file (XTTS v2). One that was there before is the run's and stays."""

    def __init__(self, checkpoint_dir: str) -> None:
        folder = Path(checkpoint_dir)
        self.path = folder / "init_xtts.safetensors"
        self.made_folder = not folder.exists()
        self.existed = self.path.exists()
        self.before = set() if self.made_folder or not folder.is_dir() else {p.name for p in folder.iterdir()}
        self.written: list[Path] = []  # the command's files beside it (--continue's checkpoint)

    def undo(self) -> None:
        folder = self.path.parent
        if not folder.is_dir():
            return
        ours = {p.name for p in self.written} | ({self.path.name} if not self.existed else set())
        if {p.name for p in folder.iterdir()} - ours != self.before - ours:
            return  # the run wrote beside them: they are the run's now
        for p in self.written:
            p.unlink(missing_ok=True)
        if self.existed or not self.path.is_file():
            return
        self.path.unlink()
        if self.made_folder and not any(folder.iterdir()):
            folder.rmdir()


def _init_folder(source: str) -> str | None:
    """The Coqui XTTS folder ``--init`` names (it or its ``model.pth``), when it holds a
    ``model.pth``: the run's ``training.xtts_dir`` unless the config sets one."""
    folder = Path(source) if Path(source).is_dir() else Path(source).parent
    return str(folder) if (folder / "model.pth").is_file() else None


def _launched_strategy(config: Any, device: str | None) -> Any:
    """``DataParallel`` when torchrun started this process (one of several), else None:
    on ``device`` or ``cuda:LOCAL_RANK`` when the config trains on a GPU, else the CPU."""
    from pyxtts.distributed import DataParallel, launched

    if not launched():
        return None
    t = config.training
    if device is None and not t.resolved_device().startswith("cuda"):
        device = "cpu"
    return DataParallel(device, timeout_s=t.distributed_timeout_s)


def _check_vocab_size(config: Any, vocab: Path, data: str) -> None:
    """Without ``--init``, a model whose text rows do not match the data's extended
    vocabulary cannot train on it: say how to start from XTTS v2 with the rows grown, or,
    for a run that started so, the ``--init`` that continues it."""
    from pyxtts.coqui_config import read_vocab

    size = read_vocab(vocab)["number_text_tokens"]
    if config.model.text_vocab_size != size:
        started = _run_init_source(Path(config.training.checkpoint_dir))
        how = (f"the run in {config.training.checkpoint_dir} started from {started}: add --init {started} to continue "
               "it" if started is not None else "start from XTTS v2 with --init XTTS_DIR, which grows the rows to that "
               "vocabulary")
        raise ValueError(f"--data {data}: its text ids come from {vocab} ({size} tokens, a new language's), but the "
                         f"model has {config.model.text_vocab_size} text rows; {how}")


def _run_init_source(checkpoint_dir: Path) -> str | None:
    """The XTTS folder (or checkpoint) a run in ``checkpoint_dir`` was started from with
    ``--init``, as its import records it; None without one."""
    from pyxtts.fingerprint import saved_extra

    init = checkpoint_dir / "init_xtts.safetensors"
    if not init.is_file():
        return None
    try:
        source = saved_extra(init).get("imported_from")
    except Exception:  # noqa: BLE001 - an unreadable import: no hint rather than a second error
        return None
    if not isinstance(source, str):
        return None
    return str(Path(source).parent) if Path(source).name == "model.pth" else source


def _data_vocab(data: str) -> tuple[str, str] | None:
    """(identity, name) of the vocabulary a ``pyxtts prepare`` output's text ids come from
    (``data``: the output folder or one of its splits): its extended vocab.json (a new
    language's), else the XTTS folder's own vocab.json as prepare.json records it. None for
    data of another origin, which cannot be checked."""
    from pyxtts.prepare.vocab import read_vocab_doc, vocab_sha256

    for folder in (Path(data), Path(data).parent):
        manifest = folder / "prepare.json"
        if not manifest.is_file():
            continue
        if (folder / "vocab.json").is_file():
            digest = vocab_sha256(read_vocab_doc(folder / "vocab.json"))
            return digest, f"{folder / 'vocab.json'} (sha256 {digest[:12]}..., a new language's)"
        try:
            digest = json.loads(manifest.read_text(encoding="utf-8"))["settings"]["xtts_files"]["vocab.json"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return f"file:{digest}", f"the XTTS folder's own vocab.json (file sha256 {str(digest)[:12]}...)"
    return None


def _check_eval_vocab(data: str, eval_data: str) -> None:
    """``--eval-data`` prepared with another vocabulary than ``--data``: its ids would mean
    other text to the model, so its loss would measure nothing."""
    ours, theirs = _data_vocab(data), _data_vocab(eval_data)
    if ours is not None and theirs is not None and ours[0] != theirs[0]:
        raise ValueError(f"--eval-data {eval_data}: its text ids come from {theirs[1]}, and --data's from {ours[1]}: "
                         "the same text has other ids under another vocabulary; evaluate on clips prepared with the "
                         "training data (prepare --eval-fraction holds them out)")


def _replanned(before: Any, after: Any, device: str | None) -> str | None:
    """One line when ``--init`` changed the model (or the data's longest sequences) the
    config was planned for: what changed, and the new plan against the device's budget.
    None when it changed nothing."""
    from pyxtts.config import device_present, plan_for

    changed = [f"{f} {getattr(before.model, f)!r} -> {getattr(after.model, f)!r}"
               for f in before.model.__dataclass_fields__ if getattr(before.model, f) != getattr(after.model, f)]
    changed += [f"data.{f} {getattr(before.data, f)} -> {getattr(after.data, f)}"
                for f in ("max_text_tokens", "max_audio_tokens") if getattr(before.data, f) != getattr(after.data, f)]
    if not changed:
        return None
    t = after.training
    dev = device if device is not None else t.resolved_device()
    line = f"--init: the checkpoint's model replaces the config's ({'; '.join(changed[:4])}"
    line += f"; and {len(changed) - 4} more)" if len(changed) > 4 else ")"
    if not device_present(dev):
        return line
    budget = int(pyxtts.device_info(dev)["total_memory"] * t.max_memory_fraction)
    plan = plan_for(after, dev)
    verdict = "fits" if plan.total <= budget else "DOES NOT FIT (`pyxtts optimize-config` re-plans it)"
    return (f"{line}; re-planned on {dev}: {format_bytes(plan.total)} of the budget {format_bytes(budget)}: "
            f"{verdict}")


def _resume_command(argv: list[str]) -> str:
    """This command line (``argv``, or the ``--gpus`` one that started this process under
    torchrun) as it continues the run: --overwrite out, --resume in."""
    launcher = os.environ.get(COMMAND_ENV)
    words = shlex.split(launcher)[1:] if launcher else argv
    words = [w for w in words if w != "--overwrite"]
    if not any(w == "--resume" or w.startswith("--resume=") for w in words):
        words.append("--resume")
    return shlex.join(["pyxtts", *words])


def _out_of_memory_advice(exc: BaseException) -> str:
    """What to do about ``train``'s out-of-memory error: the host pool holds only the
    optimizer's offloaded state, which no micro-batch or checkpointing makes smaller."""
    if getattr(exc, "device", None) == "host":
        return ("the optimizer's state in host memory (training.optimizer_offload) needs more memory than this "
                "machine has available: free host memory, or keep the state on the device with "
                "training.optimizer_offload false where it has room; `pyxtts memtest --config ...` checks the "
                "device and this machine's memory")
    return ("`pyxtts memtest --config ...` shows the plan against the device; `pyxtts optimize-config` chooses a "
            "micro-batch, accumulation, precision and checkpointing that fit")


def _train(args: argparse.Namespace) -> int:
    from pyxtts.checkpoint import CheckpointError
    from pyxtts.config import XTTSConfig
    from pyxtts.data import DataError, SyntheticDataset, prepared_vocab
    from pyxtts.trainer import RunExistsError, Terminated, Trainer, check_resumable, hold_run_folder

    demo = args.config is None and args.init is None
    strategy = None
    imported: _NewImport | None = None  # taken back if the command fails before the run writes
    hold = None  # the run's folder, held from before --init writes into it to the run's end
    try:
        if args.synthetic is not None and args.synthetic < 1:
            raise ValueError(f"--synthetic: expected a number of samples, an int >= 1, got {args.synthetic}")
        if args.synthetic is not None and args.data is not None:
            raise ValueError("--synthetic: train on --data or on a synthetic set, not both")
        # without --config: the CPU demo, or with --init (XTTS v2 itself) Coqui's recipe; --init's
        # folder is the xtts_dir before the config's checks (test_sentences need one)
        folder = None if args.init is None else _init_folder(args.init)
        config = XTTSConfig.load(args.config or ("cpu_demo" if args.init is None else RECIPE),
                                 defaults=None if folder is None else {"training": {"xtts_dir": folder}})
        strategy = _launched_strategy(config, args.device)
        if args.config is None and args.init is not None:
            _train_note(f"no --config: Coqui's recipe ({RECIPE}.yaml; `pyxtts optimize-config --config {RECIPE} "
                        "--output my.yaml` fits it to a GPU)", strategy)
        if args.max_steps is not None:
            note = config.training.set_max_steps(args.max_steps)
            if note is not None:
                _train_note(note, strategy)
        if args.batch_size is not None:
            config.data.batch_size = args.batch_size
            config.data.__post_init__()
        if args.checkpoint_dir is not None:
            config.training.checkpoint_dir = args.checkpoint_dir
        vocab = prepared_vocab(args.data) if args.data is not None else None
        if args.data is not None and args.eval_data is not None:
            _check_eval_vocab(args.data, args.eval_data)
        if args.continue_run:
            _check_continue(args)
        # the run's folder is this command's before --init or --continue writes into it: a run
        # training there now keeps its files (the trainer takes the hold over)
        hold = hold_run_folder(config.training.checkpoint_dir, strategy)
        if args.init is not None:
            before = config
            if strategy is None or strategy.is_main:
                imported = _NewImport(config.training.checkpoint_dir)
            config = _init_from_xtts(config, args.init, vocab, keep_run=not args.overwrite, strategy=strategy)
            note = _replanned(before, config, args.device if strategy is None else strategy.device)
            if note is not None:
                _train_note(note, strategy)
        continued = None  # the checkpoint that continues a Coqui run (--continue)
        if args.continue_run:
            continued = _continue_once(config, args.init, strategy, imported)
        if args.data is not None:
            train, held = _train_data(args.data, want_eval=args.eval_data is None, strategy=strategy)
        elif demo or args.synthetic is not None:  # the flag before the config's data: it is the later word
            n = args.synthetic if args.synthetic is not None else DEMO_SAMPLES
            train, held = SyntheticDataset(config.model, n + DEMO_EVAL, seed=config.training.seed).split(DEMO_EVAL)
            _train_note(f"{'no --config: the CPU demo (cpu_demo.yaml) ' if demo else ''}on a synthetic set of {n} "
                        f"samples whose audio codes are a function of the text, {DEMO_EVAL} held out", strategy)
        elif config.data.train_metadata is not None:
            train, held = _dataset(config.data.train_metadata, "data.train_metadata"), None
        else:
            raise ValueError("no training data: pass --data (a folder of .npz shards, a JSONL manifest or the "
                             "output folder of pyxtts prepare), set data.train_metadata in the config, or "
                             "--synthetic N")
        if vocab is not None and args.init is None:
            _check_vocab_size(config, vocab, args.data)
        evals = held
        if args.eval_data is not None:
            evals = _eval_data(args.eval_data, strategy)
        elif config.data.eval_metadata is not None and held is None:
            evals = _dataset(config.data.eval_metadata, "data.eval_metadata")
        resume = False if args.resume is None else (True if args.resume == "latest" else args.resume)
        if continued is not None:
            resume = continued
        if not args.overwrite:
            check_resumable(config, resume)
        trainer = Trainer(config, device=None if strategy is not None else args.device, log_path=args.log,
                          progress=not args.no_progress, strategy=strategy)
        trainer.resume_hint = _resume_command(args.argv)
        trainer.folder_hold = hold
        result = trainer.fit(train, evals, resume=resume, overwrite=args.overwrite)
        imported = None
    except pyxtts.OutOfMemoryError as exc:
        print(f"pyxtts train: {exc}\n  {_out_of_memory_advice(exc)}", file=sys.stderr)
        return 1
    except FloatingPointError as exc:
        print(f"pyxtts train: {exc}", file=sys.stderr)
        return 1
    except Terminated as exc:
        return 128 + exc.signum
    except KeyboardInterrupt:
        return 130
    except RunExistsError as exc:
        print(f"pyxtts train: {exc.checkpoint_dir} holds checkpoints of an earlier run (newest: "
              f"{exc.newest.name}); nothing was deleted. Pass --resume to continue it, --overwrite to start "
              "over (deletes its checkpoints and log), or --checkpoint-dir DIR for a new run", file=sys.stderr)
        return 2
    except (CheckpointError, DataError, FileExistsError, ImportError, OSError, TypeError, ValueError) as exc:
        return _fail("train" if strategy is None else f"train (rank {strategy.rank})", exc)
    except RuntimeError as exc:
        if strategy is None:
            raise
        # a collective that failed: another process died, hung past the timeout, or diverged
        return _fail(f"train (rank {strategy.rank} of {strategy.world_size})",
                     RuntimeError(f"stopped because a step with the other processes failed (one of them ended, or "
                                  f"waited longer than training.distributed_timeout_s, or diverged); the run's "
                                  f"checkpoints are as they were, --resume continues from the newest: {exc}"))
    finally:
        if imported is not None:
            imported.undo()
        if hold is not None:  # a command that failed before fit took it over
            hold.release()
        if strategy is not None:
            strategy.close()
    if strategy is not None and not strategy.is_main:
        return 0
    if not result.steps_taken:  # a resumed run that had already reached its end
        longer = ("raise training.early_stopping_patience (or set it to null) to train on"
                  if result.stopped == "early_stopping" else
                  "raise --max-steps (or training.epochs) to train longer")
        print(f"nothing to train: the run is at step {result.step}, its end ({result.stopped}); {longer}; "
              f"checkpoint {result.checkpoint}")
        return 0
    first = result.step - result.steps_taken + 1  # a resumed run took the steps from there
    taken = f"trained {counted(result.steps_taken, 'step')}" + (
        "" if first == 1 else f", {first}-{result.step}, after resuming at step {first - 1}")
    print(f"{taken} ({result.stopped}): final loss {result.final_loss:.4f}"
          + (f", eval loss {result.eval_loss:.4f}" if result.eval_loss is not None else "")
          + f"; checkpoint {result.checkpoint}; log {result.log_path}")
    return 0


def _missing_hint(audio_dir: Path | None, example: Path | None) -> str:
    """The end of the line for audio files missing under ``audio_dir``: the first one looked
    for, and the folder to pass when the files are in a ``wavs/`` below it (Coqui's dataset
    ``path`` is the folder above LJSpeech's ``wavs/``; prepare's ``--audio-dir`` is ``wavs/``)."""
    if example is None or audio_dir is None:
        return "; is --audio-dir right?"
    try:
        below = audio_dir / "wavs" / example.relative_to(audio_dir)
    except ValueError:  # an absolute path in the transcript
        below = None
    if below is not None and below.is_file():
        return f" (e.g. {example}), and {below} exists: pass --audio-dir {audio_dir / 'wavs'}"
    return f" (e.g. {example}); is --audio-dir right?"


def _nothing_prepared(result: Any) -> str:
    """The likely cause when ``prepare`` kept no sample, in one line: missing audio files
    (with the folder they were looked for in), else the most frequent reason for a drop."""
    from pyxtts.prepare import REASONS

    s = result.summary
    missing = s["dropped"].get("missing", 0)
    if missing:
        files = "1 audio file is" if missing == 1 else f"{missing} audio files are"
        cause = f"{files} missing under {result.audio_dir}{_missing_hint(result.audio_dir, result.missing_example)}"
    else:
        top = max(s["dropped"], key=s["dropped"].get)
        cause = f"{s['dropped'][top]} of {s['samples']} samples were dropped as {top} ({REASONS.get(top, top)})"
    return f"no sample could be prepared: {cause} (each sample's reason is in {result.report})"


def _prepare(args: argparse.Namespace) -> int:
    try:
        from pyxtts.prepare import prepare
        from pyxtts.prepare.sources import MetadataError
        from pyxtts.prepare.vocab import DEFAULT_NEW_TOKENS

        if args.new_tokens is not None and not args.new_language:
            raise ValueError(f"--new-tokens {args.new_tokens}: only means something with --new-language (a language "
                             "XTTS v2 does not speak)")

        result = prepare(args.xtts_dir, args.metadata, args.out, language=args.language, audio_dir=args.audio_dir,
                         eval_fraction=args.eval_fraction, workers=args.workers,
                         samples_per_shard=args.samples_per_shard, seed=args.seed, overwrite=args.overwrite,
                         max_wav_samples=args.max_wav_samples, min_seconds=args.min_seconds,
                         max_text_tokens=args.max_text_tokens, progress=not args.no_progress,
                         new_language=args.new_language,
                         new_tokens=DEFAULT_NEW_TOKENS if args.new_tokens is None else args.new_tokens,
                         vocab=args.vocab)
    except KeyboardInterrupt:
        print("pyxtts prepare: interrupted; finished shards are kept, the same command resumes", file=sys.stderr)
        return 130
    except ImportError as exc:
        return _fail("prepare", exc)
    except (MetadataError, FileExistsError, OSError, TypeError, ValueError) as exc:
        return _fail("prepare", exc)
    print(result.format_summary())
    if result.summary["kept"] == 0:
        print(f"pyxtts prepare: {_nothing_prepared(result)}", file=sys.stderr)
        return 2
    return 0


def _export_source(args: argparse.Namespace) -> str:
    """``--checkpoint``: a file, or "best" / "latest" of the run in ``--checkpoint-dir``
    (default: ``--config``'s training.checkpoint_dir, else the default "checkpoints")."""
    if args.checkpoint not in ("best", "latest"):
        return args.checkpoint
    from pyxtts.config import TrainingConfig, XTTSConfig
    from pyxtts.trainer import run_checkpoint

    folder = args.checkpoint_dir
    if folder is None:
        folder = (XTTSConfig.load(args.config).training.checkpoint_dir if args.config is not None
                  else TrainingConfig().checkpoint_dir)
    try:
        return str(run_checkpoint(folder, args.checkpoint))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"--checkpoint {args.checkpoint}: {exc}") from None


def _say_run_checkpoint(args: argparse.Namespace, source: str, step: int | None = None) -> None:
    """Which run's checkpoint ``--checkpoint best/latest`` took (``step``: as the command
    read it with the weights; the run may have replaced the file since): --checkpoint-dir
    or --config may name another run's folder than the one meant."""
    if args.checkpoint in ("best", "latest"):
        print(f"--checkpoint {args.checkpoint}: {source}{'' if step is None else f', step {step}'} of the run "
              f"in {Path(source).parent} (--checkpoint-dir or --config name another run's folder)")


RUN_CHECKPOINT_TRIES = 3  # --checkpoint best/latest of a run that removes its older checkpoints as it saves

_T = TypeVar("_T")


def _with_run_checkpoint(args: argparse.Namespace, use: Callable[[str], _T]) -> tuple[str, _T]:
    """(the file, ``use(file)``) of ``--checkpoint``. For best / latest the run's newest again
    when the run removed the file chosen before ``use`` read it (``keep_checkpoints``): up to
    RUN_CHECKPOINT_TRIES choices; a file named by its path is used once."""
    from pyxtts.checkpoint import CheckpointError

    attempt = 1
    while True:
        source = _export_source(args)
        try:
            return source, use(source)
        except (CheckpointError, FileNotFoundError):
            if args.checkpoint not in ("best", "latest") or Path(source).exists() or attempt == RUN_CHECKPOINT_TRIES:
                raise
        attempt += 1


def _file_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, modification time) of ``path``: another once a new file is renamed
    over it; None when there is none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def _export(args: argparse.Namespace) -> int:
    from pyxtts.checkpoint import CheckpointError
    from pyxtts.coqui_checkpoint import export_xtts_checkpoint

    before = _file_identity(Path(args.out) / "model.pth")
    try:
        source, report = _with_run_checkpoint(args, lambda source: export_xtts_checkpoint(
            source, args.base, args.out, vocab=args.vocab, overwrite=args.overwrite))
    except KeyboardInterrupt:  # the files go into place together, after every one is written
        if _file_identity(Path(args.out) / "model.pth") != before:
            print(f"pyxtts export: interrupted once the export was in place: {args.out} holds it whole",
                  file=sys.stderr)
        else:
            print(f"pyxtts export: interrupted; nothing of this export was written ({args.out} is as it was)",
                  file=sys.stderr)
        return 130
    except (CheckpointError, OSError, TypeError, ValueError) as exc:
        return _fail("export", exc)
    _say_run_checkpoint(args, source, report["step"])
    print(f"written: {report['model_pth']}")
    print(f"  {len(report['replaced'])} GPT tensors from {source}")
    if report["carried_from_base"]:
        print(f"  {len(report['carried_from_base'])} GPT tensors carried unchanged from the base (the model "
              f"does not train them): {', '.join(report['carried_from_base'][:3])}, ...")
    if report.get("language"):
        print("  every other tensor and the pickled config: the base's, byte for byte (the pickle's only change: "
              "the grown text rows' shapes)")
    else:
        print("  every other tensor and the pickled config: the base's, byte for byte")
    if report.get("language"):
        print(f"  vocab.json: {args.vocab}; config.json: the base's, with {report['language']!r} in its languages "
              f"(in Coqui, pyxtts.coqui.enable_language(model, {report['language']!r}) lets the tokenizer take it)")
    print(f"  copied beside it: {', '.join(report['copied']) or 'nothing'}")
    if report["not_in_base"]:
        print(f"  not in the base, so not copied: {', '.join(report['not_in_base'])}")
    if report["removed"]:
        print(f"  removed, an earlier export's that the base lacks: {', '.join(report['removed'])}")
    return 0


def _speak(args: argparse.Namespace) -> int:
    import wave

    from pyxtts.checkpoint import CheckpointError
    from pyxtts.speak import clip_paths, synthesize

    clips = clip_paths(args.out, len(args.text))
    before = [_file_identity(f) for f in clips]

    def spoken(source: str | None) -> list[Path]:
        if source is not None:
            _say_run_checkpoint(args, source)  # its step: in synthesize's line, from the export's read
        return synthesize(args.text, args.out, args.reference, args.language, xtts_dir=args.xtts_dir,
                          checkpoint=source, base=args.base, vocab=args.vocab, seed=args.seed,
                          overwrite=args.overwrite, progress=True)

    try:
        if args.checkpoint is not None:
            if args.base is None:
                raise ValueError("--base: expected the Coqui XTTS folder the checkpoint was fine-tuned from (the "
                                 "checkpoint is exported into a scratch copy of it to be spoken)")
            files = _with_run_checkpoint(args, spoken)[1]
        elif args.base is not None or args.checkpoint_dir is not None or args.config is not None:
            used = "--base" if args.base is not None else "--checkpoint-dir" if args.checkpoint_dir else "--config"
            raise ValueError(f"{used}: only used with --checkpoint; --xtts-dir is spoken as it is")
        else:
            files = spoken(None)
    except KeyboardInterrupt:  # the clips go into place together, once all are spoken
        if all(_file_identity(f) not in (None, b) for f, b in zip(clips, before)):
            print(f"pyxtts speak: interrupted once the clips were in place: {', '.join(map(str, clips))}",
                  file=sys.stderr)
        else:
            print(f"pyxtts speak: interrupted; no clip was written ({args.out} is as it was)", file=sys.stderr)
        return 130
    except RuntimeError as exc:  # the child's: its last line says why (Coqui's warnings come before it)
        lines = str(exc).strip().splitlines()
        print(f"pyxtts speak: {lines[0].partition(':')[0]}: {lines[-1].strip()}", file=sys.stderr)
        return 2
    except (CheckpointError, ImportError, OSError, TypeError, ValueError) as exc:
        return _fail("speak", exc)
    for f in files:
        with wave.open(str(f)) as w:
            print(f"written: {f} ({w.getnframes() / w.getframerate():.1f} s at {w.getframerate()} Hz)")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose "unrecognized arguments" names the closest flag of the command
    (Python 3.11's argparse suggests none): `--confg` gets "did you mean --config?"."""

    commands: dict[str, argparse.ArgumentParser] | None = None  # the subcommands' parsers, by name

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        known, extra = self.parse_known_args(args, namespace)
        if extra:
            parser = (self.commands or {}).get(getattr(known, "command", None) or "", self)
            flags = [f for a in parser._actions for f in a.option_strings if f.startswith("--")]
            hints = []
            for word in extra:
                near = difflib.get_close_matches(word.split("=")[0], flags, n=1) if word.startswith("--") else []
                if near:
                    hints.append(f"{word.split('=')[0]}: did you mean {near[0]}?")
            self.error(f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else ""))
        return known


def main(argv: list[str] | None = None) -> int:
    from pyxtts.config import shipped_configs

    shipped = ", ".join(shipped_configs())
    parser = _Parser(prog="pyxtts", description=pyxtts.__doc__)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command")
    tr = sub.add_parser("train", help="train a config (the default command; no --config: the CPU demo)")
    tr.add_argument("--config", default=None,
                    help=f"YAML config or a shipped one's name ({shipped}; default: cpu_demo on a synthetic set)")
    tr.add_argument("--data", default=None,
                    help="training samples: a folder of .npz shards, a JSONL manifest, or the --out folder of "
                         "pyxtts prepare (its train/, and eval/ unless --eval-data)")
    tr.add_argument("--eval-data", default=None, help="evaluation samples (a folder of .npz shards, a manifest, or "
                    "an output folder of pyxtts prepare: its eval/, else all its samples)")
    tr.add_argument("--init", default=None, metavar="XTTS_DIR",
                    help="start from a Coqui XTTS checkpoint (the released folder or a model.pth, or a "
                         "checkpoint_N.pth or best_model.pth of Coqui's trainer); its model config replaces the "
                         "config's model section")
    tr.add_argument("--continue", dest="continue_run", action="store_true",
                    help="with --init RUN/checkpoint_N.pth: continue that Coqui run (its AdamW moments, optimizer "
                         "step and learning rate), as Coqui's --continue_path does; docs/coqui.md says what carries "
                         "over")
    tr.add_argument("--gpus", default=None, metavar="LIST",
                    help="train on these GPUs (e.g. 0,1), one process each: runs torchrun --standalone with "
                         "CUDA_VISIBLE_DEVICES=LIST (needs pyxtts[distributed]); several machines: run torchrun "
                         "yourself (docs/distributed.md)")
    tr.add_argument("--synthetic", type=int, default=None, metavar="N",
                    help="train on N synthetic samples (64 more held out for evaluation)")
    tr.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CHECKPOINT",
                    help="continue from the newest checkpoint in checkpoint_dir, or from CHECKPOINT")
    tr.add_argument("--overwrite", action="store_true", help="start over in a checkpoint_dir holding a run")
    tr.add_argument("--max-steps", type=int, default=None, help="override training.max_steps")
    tr.add_argument("--batch-size", type=int, default=None, help="override data.batch_size (the micro-batch)")
    tr.add_argument("--checkpoint-dir", default=None, help="override training.checkpoint_dir")
    tr.add_argument("--device", default=None, help="override training.device (cpu, cuda, cuda:N)")
    tr.add_argument("--log", default=None, help="JSONL log (default: <checkpoint_dir>/train_log.jsonl)")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar nor log lines")
    tr.set_defaults(func=_train)
    mt = sub.add_parser("memtest", help="a config's memory plan, one real step, predicted vs measured")
    mt.add_argument("--config", required=True, help=f"YAML config or a shipped one's name ({shipped})")
    mt.add_argument("--batch-size", type=int, default=None, help="micro-batch to test (default: data.batch_size)")
    mt.add_argument("--device", default=None, help="override training.device")
    mt.add_argument("--memory", default=None,
                    help="plan for this much device memory (e.g. 12GiB) instead of the device's total")
    mt.add_argument("--no-step", action="store_true", help="plan only, no real step")
    mt.add_argument("--verbose", action="store_true", help="every block's policy and saved bytes, the arena")
    mt.add_argument("--vocab", default=None, help=VOCAB_HELP)
    _world_arguments(mt)
    mt.set_defaults(func=_memtest)
    pr = sub.add_parser("prepare", help="recordings and transcripts -> training shards (text ids, DVAE codes)")
    pr.add_argument("--xtts-dir", required=True,
                    help="XTTS v2 checkpoint folder: config.json, vocab.json, dvae.pth, mel_stats.pth")
    pr.add_argument("--metadata", required=True,
                    help="LJSpeech metadata.csv, Coqui's audio_file|text|speaker_name CSV, or a .jsonl manifest")
    pr.add_argument("--audio-dir", default=None,
                    help="folder the audio paths are relative to (default: wavs/ beside an LJSpeech "
                         "metadata.csv, else the metadata's folder)")
    pr.add_argument("--language", default="en", help="language of the transcripts (default en)")
    pr.add_argument("--out", required=True, help="output folder: train/ and eval/ shards, report.tsv, summary.json")
    pr.add_argument("--eval-fraction", type=float, default=0.0,
                    help="share of samples held out into eval/ (default 0: none, and train evaluates nothing; "
                         "Coqui's recipe holds out 1%%, at most 256 samples)")
    pr.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    pr.add_argument("--samples-per-shard", type=int, default=256, help="samples per .npz shard (default 256)")
    pr.add_argument("--seed", type=int, default=0, help="seed of the evaluation split (default 0)")
    pr.add_argument("--max-wav-samples", type=int, default=255995,
                    help="longest clip kept, in samples at 22,050 Hz (default 255995, Coqui's max_wav_length)")
    pr.add_argument("--min-seconds", type=float, default=0.5, help="shortest clip kept (default 0.5)")
    pr.add_argument("--max-text-tokens", type=int, default=None,
                    help="most text ids per sample (default: the model's gpt_max_text_tokens; Coqui's recipe: 200)")
    pr.add_argument("--overwrite", action="store_true", help="replace an output folder prepared from other inputs")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar")
    pr.add_argument("--new-language", action="store_true",
                    help="--language is one XTTS v2 does not speak (e.g. vi): add its characters (of every transcript) "
                         "and BPE merges (learnt from the training split's) to the vocabulary, written to "
                         "OUT/vocab.json")
    pr.add_argument("--new-tokens", type=int, default=None,
                    help="with --new-language: tokens to add, its characters included (default 2000; "
                         "docs/new-language.md says how to choose)")
    pr.add_argument("--vocab", default=None, metavar="VOCAB_JSON",
                    help="a language already taught: the extended vocab.json of its earlier prepare --new-language "
                         "(or of an export), used as it is so the ids are the ones the model learnt")
    pr.set_defaults(func=_prepare)
    ex = sub.add_parser("export", help="write a fine-tuned GPT into a Coqui XTTS checkpoint folder")
    ex.add_argument("--checkpoint", required=True,
                    help="pyxtts checkpoint (e.g. RUN/step_N.safetensors), or 'best' (the lowest eval loss: "
                         "best.safetensors) or 'latest' (the newest step checkpoint) of the run in --checkpoint-dir")
    ex.add_argument("--checkpoint-dir", default=None,
                    help="the run's folder for --checkpoint best/latest (default: --config's "
                         "training.checkpoint_dir, else 'checkpoints')")
    ex.add_argument("--config", default=None, help="training config whose checkpoint_dir --checkpoint best/latest "
                                                   "looks in")
    ex.add_argument("--base", required=True,
                    help="the Coqui XTTS folder (model.pth, config.json, vocab.json) the model was fine-tuned from")
    ex.add_argument("--out", required=True, help="folder to write model.pth, config.json and vocab.json into")
    ex.add_argument("--overwrite", action="store_true", help="replace an export already in --out")
    ex.add_argument("--vocab", default=None,
                    help="the extended vocab.json a new language was trained with (prepare --new-language's "
                         "OUT/vocab.json)")
    ex.set_defaults(func=_export)
    sp = sub.add_parser("speak", help="speak text with an XTTS folder or a fine-tuned checkpoint (Coqui's inference)")
    sp.add_argument("--text", action="append", required=True, help="text to speak (repeat the flag for several)")
    sp.add_argument("--reference", required=True, help="a recording of the voice to clone (wav, flac, ...)")
    sp.add_argument("--language", default="en", help="language of the text (default en)")
    sp.add_argument("--out", required=True, help="a .wav file for one --text, else a folder for 0.wav, 1.wav, ...")
    voice = sp.add_mutually_exclusive_group(required=True)
    voice.add_argument("--xtts-dir", default=None, help="a Coqui XTTS folder: the released one or an export")
    voice.add_argument("--checkpoint", default=None,
                       help="a pyxtts checkpoint, or best / latest of a run (see --checkpoint-dir); needs --base")
    sp.add_argument("--base", default=None, help="the Coqui XTTS folder --checkpoint was fine-tuned from")
    sp.add_argument("--checkpoint-dir", default=None,
                    help="the run whose best / latest --checkpoint names (default: --config's, else checkpoints)")
    sp.add_argument("--config", default=None, help="training config whose checkpoint_dir --checkpoint best/latest "
                    "looks in")
    sp.add_argument("--vocab", default=None, help="with --checkpoint: a new language's vocab.json, as for export")
    sp.add_argument("--seed", type=int, default=0, help="seed of Coqui's sampling (default 0)")
    sp.add_argument("--overwrite", action="store_true", help="replace clips already at --out")
    sp.set_defaults(func=_speak)
    gi = sub.add_parser("gpu-info", help="build, devices and memory")
    gi.add_argument("--json", action="store_true", help="machine-readable output")
    gi.set_defaults(func=_gpu_info)
    oc = sub.add_parser("optimize-config", help="fit a training config's memory plan to a device")
    oc.add_argument("--config", required=True,
                    help=f"YAML config to start from, or a shipped one's name ({shipped})")
    oc.add_argument("--output", required=True, help="where to write the optimized YAML")
    oc.add_argument("--memory", default=None,
                    help="device memory, e.g. 12GiB, 12G, 12GB (10^9) or bytes; default: the device's total")
    oc.add_argument("--device", default=None, help="device to plan for (default: the config's training.device)")
    oc.add_argument("--vocab", default=None, help=VOCAB_HELP)
    _world_arguments(oc)
    oc.set_defaults(func=_optimize_config)
    parser.commands = dict(sub.choices)
    for name, command in sub.choices.items():
        CLI_FLAGS[name] = {a.dest: a.option_strings[-1] for a in command._actions
                           if a.option_strings and a.option_strings[-1].startswith("--")}
    CLI_FLAGS["export"]["model_or_checkpoint"] = "--checkpoint"
    CLI_FLAGS["speak"]["texts"] = "--text"
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in sub.choices:
        # a word first is a command (train takes none): a misspelt one is named, not trained on
        near = difflib.get_close_matches(argv[0], list(sub.choices), n=1)
        print(f"pyxtts: unknown command {argv[0]!r}" + (f"; did you mean {near[0]!r}?" if near else "")
              + f" (commands: {', '.join(sub.choices)})", file=sys.stderr)
        return 2
    if not argv or argv[0] not in (*sub.choices, "-h", "--help", "--version"):
        argv = ["train", *argv]  # train is the default command: `pyxtts --config c.yaml` trains
    args = parser.parse_args(argv)
    args.argv = argv  # the command line as the command read it (the hint that continues a run)
    if getattr(args, "gpus", None) is not None:
        return _run_on_gpus(args.gpus, argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:  # a command without its own handling (train saves, prepare keeps its work)
        print(f"pyxtts {args.command or 'train'}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pyxtts export ... | head -1`: the reader of the output has gone
        from pyxtts.callbacks.progress import drop_output

        drop_output(sys.stdout)  # else Python's flush at exit fails again, with a traceback
        return 128 + 13  # as a shell reports a command that SIGPIPE ended


def torchrun_command(gpus: str, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(command, environment additions) of ``pyxtts train --gpus LIST ...``: torchrun with
    one process per listed GPU, the same arguments less ``--gpus``."""
    ids = [g.strip() for g in gpus.split(",")]
    if not ids or any(not g.isdigit() for g in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"--gpus: expected distinct GPU numbers separated by commas, such as 0,1, got {gpus!r}")
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--gpus":
            skip = True
            continue
        if not a.startswith("--gpus="):
            rest.append(a)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={len(ids)}",
               "-m", "pyxtts", *rest]
    return command, {"CUDA_VISIBLE_DEVICES": ",".join(ids), COMMAND_ENV: shlex.join(["pyxtts", *argv])}


def _run_on_gpus(gpus: str, argv: list[str]) -> int:
    """``--gpus``: the same training under torchrun, one process per GPU; its exit status."""
    from pyxtts.distributed import check_torch_version, launched

    if launched():
        return _fail("train", ValueError("--gpus: this process is already one of several (torchrun started it); "
                                         "drop --gpus"))
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return _fail("train", ImportError("--gpus runs torchrun, which needs torch, not installed; install it "
                                          "with: pip install 'pyxtts[distributed]'"))
    try:  # before torchrun starts a process per GPU, each of which would say so
        check_torch_version(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:  # torch without its metadata: the workers check it
        pass
    except ImportError as exc:
        return _fail("train", ImportError(f"--gpus: {exc}"))
    try:
        command, env = torchrun_command(gpus, argv)
    except ValueError as exc:
        return _fail("train", exc)
    visible = pyxtts.device_count()
    wanted = [int(g) for g in env["CUDA_VISIBLE_DEVICES"].split(",")]
    if max(wanted) >= visible:
        where = ("this build has no CUDA backend" if not pyxtts.build_info()["cuda"]
                 else f"it sees {counted(visible, 'GPU')}")
        return _fail("train", ValueError(f"--gpus {gpus}: GPU {max(wanted)} is not in this machine ({where}); "
                                         "`pyxtts gpu-info` lists the GPUs pyxtts can use"))
    return run_torchrun(command, {**os.environ, **env})


def run_torchrun(command: list[str], env: dict[str, str]) -> int:
    """Runs torchrun and waits for it; its exit status (128 + N when signal N ended it).

    torchrun runs in this process's process group, so a terminal's Ctrl-C reaches it too,
    and it forwards SIGINT to its workers, which stop together at the next step boundary
    and save. So this process ignores SIGINT while it waits: a KeyboardInterrupt here would
    SIGKILL torchrun (``subprocess.run`` does so after 0.25 s) and give the terminal back
    while the workers still run, out of reach of a second Ctrl-C."""
    import signal
    import subprocess

    proc = subprocess.Popen(command, env=env)
    # ignored once torchrun has started: a process started with SIGINT ignored keeps it so
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        status = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    return status if status >= 0 else 128 - status


def _version() -> str:
    info = pyxtts.build_info()
    if info["cuda"]:
        backend = f"CUDA {info['cuda_version']} for {' '.join(info['cuda_archs'])}"
    else:
        backend = "CPU-only build"
    return f"pyxtts {info['version']} ({backend}; {info['compiler']})"


if __name__ == "__main__":
    sys.exit(main())

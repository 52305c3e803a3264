"""Callbacks of ``Trainer.fit``: the events of a run and the writers that watch it
(``pyxtts.callbacks.base`` says how they fit together)."""
from pyxtts.callbacks.base import HISTORY_LIMIT, Callback, CallbackList, Run, RunState
from pyxtts.callbacks.best import BEST_NAME, BestCheckpoint
from pyxtts.callbacks.checkpoints import StepCheckpoints
from pyxtts.callbacks.divergence import MAX_SKIPPED, StopOnDivergence
from pyxtts.callbacks.evaluation import Evaluation
from pyxtts.callbacks.jsonl import JSONLLog
from pyxtts.callbacks.progress import Progress, Reporter
from pyxtts.callbacks.samples import SpokenSamples, samples_dir
from pyxtts.callbacks.tensorboard_log import TensorBoardLog, event_files, tensorboard_dir

__all__ = ["BEST_NAME", "HISTORY_LIMIT", "MAX_SKIPPED", "BestCheckpoint", "Callback", "CallbackList", "Evaluation",
           "JSONLLog", "Progress", "Reporter", "Run", "RunState", "SpokenSamples", "StepCheckpoints",
           "StopOnDivergence", "TensorBoardLog", "event_files", "samples_dir", "tensorboard_dir"]

"""What every GPU benchmark's JSON records about where it ran: the device, the driver, the
library versions, the build and the PYXTTS_* switches it ran under (the attention path and
backward schedule among them)."""
from __future__ import annotations

import os
import platform
import subprocess


def environment(device: str) -> dict:
    import pyxtts

    env = {"python": platform.python_version(), "pyxtts": pyxtts.__version__,
           "build": pyxtts.build_info(), "device": pyxtts.device_info(device),
           "switches": {k: v for k, v in sorted(os.environ.items()) if k.startswith("PYXTTS_")}}
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
    except ImportError:
        pass
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["driver"] = None
    return env

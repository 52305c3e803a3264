"""What every GPU benchmark's JSON records about where it ran: the device, the driver, the
library versions and the build."""
from __future__ import annotations

import platform
import subprocess


def environment(device: str) -> dict:
    import pyxtts

    env = {"python": platform.python_version(), "pyxtts": pyxtts.__version__,
           "build": pyxtts.build_info(), "device": pyxtts.device_info(device)}
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

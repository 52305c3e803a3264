"""Optional dependencies of ``pyxtts prepare``: imported when first needed, with a message
that names the extra to install."""
from __future__ import annotations

import importlib
from types import ModuleType

EXTRA = "pip install 'pyxtts[prepare]'"


def require(module: str, purpose: str, install: str = EXTRA) -> ModuleType:
    """``import module`` or an ImportError saying what needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{purpose} needs the Python package {module!r}, which is not installed "
                          f"({exc}); install it with: {install}") from exc

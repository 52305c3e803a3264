"""Where pyxtts was imported from, and why its C extension did not load.

A source checkout holds a pyxtts/ folder too: run from the repository root,
`import pyxtts` finds it before the installed package. Its extension exists only
after `python setup.py build_ext --inplace`, and may belong to another build
than the installed one; these messages say which files are involved.
"""
from __future__ import annotations

import importlib.machinery
import re
import sys
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _is_checkout() -> bool:
    return (PACKAGE.parent / "setup.py").is_file() and (PACKAGE.parent / "csrc").is_dir()


def _extension_files() -> list[Path]:
    return sorted(p for suffix in importlib.machinery.EXTENSION_SUFFIXES for p in PACKAGE.glob("_C" + suffix))


def _installed_elsewhere() -> Path | None:
    """Another pyxtts package on sys.path than this one."""
    for entry in sys.path:
        try:
            base = Path(entry or ".").resolve()
        except OSError:
            continue
        if base != PACKAGE.parent and (base / "pyxtts" / "__init__.py").is_file():
            return base / "pyxtts"
    return None


def load_error(exc: ImportError) -> ImportError:
    """An ImportError that says why `from pyxtts._C import ...` failed."""
    built = _extension_files()
    if built:
        msg = f"pyxtts's C extension {built[0]} did not load: {exc}."
        lib = re.search(r"libcublas\.so\.(\d+)", str(exc))
        if lib:
            major = int(lib.group(1))
            wheel = f"nvidia-cublas>={major},<{major + 1}" if major >= 13 else f"nvidia-cublas-cu{major}"
            msg += (f" It was built with the CUDA backend, which needs cuBLAS {major} at run time: "
                    f"`pip install '{wheel}'`, or rebuild without CUDA: "
                    "`PYXTTS_CUDA=0 pip install --force-reinstall --no-deps .`.")
        return ImportError(msg)
    if _is_checkout():
        other = _installed_elsewhere()
        where = (f"an installed pyxtts is at {other}: run from outside the checkout to use it, "
                 if other else "install it with `pip install .` and run from outside the checkout, ")
        return ImportError(f"{PACKAGE} is pyxtts's source folder, with no C extension built in it; "
                           f"{where}or build in place with `python setup.py build_ext --inplace`.")
    return ImportError(f"pyxtts's C extension (pyxtts._C) is missing from {PACKAGE}: the installation is "
                       "incomplete; reinstall pyxtts.")


def warn_if_shadowing() -> None:
    """Warns when the checkout's in-place build is imported while another pyxtts
    is installed: the two may be different builds (CPU-only / CUDA, versions)."""
    if not _is_checkout():
        return
    other = _installed_elsewhere()
    if other is not None:
        built = _extension_files()
        warnings.warn(f"pyxtts is imported from the source checkout {PACKAGE.parent} (extension "
                      f"{built[0].name if built else '?'}), not from the installed copy at {other}; run from "
                      "outside the checkout to use the installed one", stacklevel=2)

"""The repository's own files as the tests read them: ``pyproject()``, its pyproject.toml
parsed. tomllib is in the standard library from Python 3.11; before, its backport tomli
(the test extra installs it there) reads the same TOML."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def pyproject() -> dict[str, Any]:
    """pyproject.toml at the repository root, as a dict."""
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))

"""The C sources keep the layering of the tree: csrc/engine/ is pure C (no Python.h,
no NumPy, no binding header), names no backend above the table, and the includes
between files form no circle; bindings reach backends only through the table."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)

if not CSRC.is_dir():  # the suite runs from a checkout; an sdist ships csrc/ too
    pytest.fail(f"no C sources at {CSRC}", pytrace=False)


def sources(sub: str) -> list[Path]:
    files = sorted(p for p in (CSRC / sub).iterdir() if p.suffix in (".c", ".h"))
    assert files, f"no sources in csrc/{sub}"
    return files


def includes(path: Path) -> list[str]:
    return INCLUDE.findall(path.read_text())


def test_the_tree_has_the_three_directories():
    assert {p.name for p in CSRC.iterdir() if p.is_dir()} == {"engine", "python", "cpu"}
    assert not [p.name for p in CSRC.iterdir() if p.is_file()], "csrc/ holds directories only"


@pytest.mark.parametrize("path", sources("engine"), ids=lambda p: p.name)
def test_engine_file_is_pure_c(path):
    for inc in includes(path):
        assert inc != "Python.h" and not inc.startswith(("numpy/", "python/", "cpu/")), (
            f"csrc/engine/{path.name} includes {inc}")
    text = path.read_text()
    assert "PyObject" not in text and "PyErr_" not in text and "PyMem_" not in text, path.name


@pytest.mark.parametrize("path", sources("engine"), ids=lambda p: p.name)
def test_engine_names_no_backend(path):
    if path.name in ("backend.h", "backend.c"):  # the table, and which backend fills it
        return
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)  # comments may say "CUDA"
    for word in ("pxt_cpu_", "pxt_cuda_", "cuda_runtime", "cublas", "PXT_WITH_CUDA"):
        assert word not in text, f"csrc/engine/{path.name} names {word}"


@pytest.mark.parametrize("path", sources("python"), ids=lambda p: p.name)
def test_bindings_reach_backends_through_the_table(path):
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    for word in ("pxt_cpu_", "pxt_cuda_", "PXT_WITH_CUDA"):
        assert word not in text, f"csrc/python/{path.name} names {word}"
    assert not [i for i in includes(path) if i.startswith("cpu/")], path.name


def test_cpu_backend_sees_only_the_engine_contract():
    for path in sources("cpu"):
        for inc in includes(path):
            assert inc in ("engine/pxt.h", "engine/backend.h") or "/" not in inc, (path.name, inc)
            assert inc != "Python.h", path.name


def test_includes_form_no_circle():
    files = {p.relative_to(CSRC).as_posix(): p for sub in ("engine", "python", "cpu")
             for p in sources(sub)}

    def resolve(src: str, inc: str) -> str | None:
        here = (Path(src).parent / inc).as_posix()
        return here if here in files else inc if inc in files else None

    graph = {f: [t for t in (resolve(f, i) for i in includes(p)) if t] for f, p in files.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            assert state.get(nxt) != 1, "include circle: " + " -> ".join(path + [nxt])
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for f in graph:
        if f not in state:
            visit(f, [f])

"""The Python sources run on the oldest Python that pyproject.toml's requires-python admits.

The suite runs on one Python at a time (CI's is 3.11); these checks read every source for
what an older one lacks: syntax newer than the oldest version admitted
(``ast.parse(feature_version=...)``), and standard-library modules and names added after
it (``NEWER``, from the "What's New" pages), outside code that asks for the version first
(``if sys.version_info >= ...``, or ``try: ... except ImportError``). Keyword arguments and
changed behaviour are not read here; docs/install.md says which versions ran the suite.
Sources: the package, the build's tools, setup.py, the tests, the notebook's code cells.
"""
from __future__ import annotations

import ast
import importlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.project import REPO, pyproject

# the version each module or name first appeared in; tests/test_python_versions.py checks
# every entry against the Python it runs on (present from its version, absent before)
NEWER: dict[str, tuple[int, int]] = {
    # 3.11
    "tomllib": (3, 11), "wsgiref.types": (3, 11),
    "builtins.ExceptionGroup": (3, 11), "builtins.BaseExceptionGroup": (3, 11),
    "typing.Self": (3, 11), "typing.LiteralString": (3, 11), "typing.Never": (3, 11),
    "typing.assert_never": (3, 11), "typing.assert_type": (3, 11), "typing.reveal_type": (3, 11),
    "typing.Required": (3, 11), "typing.NotRequired": (3, 11), "typing.TypeVarTuple": (3, 11),
    "typing.Unpack": (3, 11), "typing.dataclass_transform": (3, 11), "typing.get_overloads": (3, 11),
    "typing.clear_overloads": (3, 11),
    "datetime.UTC": (3, 11), "enum.StrEnum": (3, 11), "enum.ReprEnum": (3, 11), "enum.EnumCheck": (3, 11),
    "enum.FlagBoundary": (3, 11), "enum.verify": (3, 11), "enum.member": (3, 11), "enum.nonmember": (3, 11),
    "enum.global_enum": (3, 11), "enum.show_flag_values": (3, 11),
    "contextlib.chdir": (3, 11), "hashlib.file_digest": (3, 11), "operator.call": (3, 11),
    "logging.getLevelNamesMapping": (3, 11), "math.exp2": (3, 11), "math.cbrt": (3, 11),
    "inspect.getmembers_static": (3, 11), "asyncio.TaskGroup": (3, 11), "asyncio.timeout": (3, 11),
    "asyncio.Runner": (3, 11), "asyncio.Barrier": (3, 11), "sys.exception": (3, 11), "re.NOFLAG": (3, 11),
    "string.Template.get_identifiers": (3, 11), "string.Template.is_valid": (3, 11),
    "locale.getencoding": (3, 11), "zipfile.ZipFile.mkdir": (3, 11),
    # 3.12
    "itertools.batched": (3, 12), "typing.override": (3, 12), "typing.TypeAliasType": (3, 12),
    "math.sumprod": (3, 12), "os.path.splitroot": (3, 12), "os.path.isjunction": (3, 12),
    "pathlib.Path.walk": (3, 12), "pathlib.Path.is_junction": (3, 12),
    "pathlib.PurePath.with_segments": (3, 12), "sys.monitoring": (3, 12),
    "calendar.Month": (3, 12), "calendar.Day": (3, 12), "types.get_original_bases": (3, 12),
    "inspect.markcoroutinefunction": (3, 12), "random.binomialvariate": (3, 12),
    # 3.13
    "copy.replace": (3, 13), "warnings.deprecated": (3, 13), "os.process_cpu_count": (3, 13),
    "math.fma": (3, 13), "pathlib.Path.from_uri": (3, 13), "pathlib.PurePath.full_match": (3, 13),
    "glob.translate": (3, 13), "typing.ReadOnly": (3, 13), "typing.TypeIs": (3, 13),
    "typing.NoDefault": (3, 13), "typing.get_protocol_members": (3, 13), "typing.is_protocol": (3, 13),
    "statistics.kde": (3, 13), "base64.z85encode": (3, 13), "queue.ShutDown": (3, 13),
    "builtins.PythonFinalizationError": (3, 13),
}
BUILTINS = {name.split(".", 1)[1] for name in NEWER if name.startswith("builtins.")}
GUARD_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError"}


def oldest_python() -> tuple[int, int]:
    """(3, 10) from requires-python = ">=3.10"."""
    spec = pyproject()["project"]["requires-python"]
    m = re.fullmatch(r"\s*>=\s*3\.(\d+)\s*(,.*)?", spec)
    assert m, f"requires-python: expected '>=3.N', got {spec!r}"
    return (3, int(m.group(1)))


def notebook_code(path: Path) -> str:
    """The code cells, less IPython's shell (!) and magic (%) lines."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    lines = [line for c in cells if c["cell_type"] == "code" for line in "".join(c["source"]).splitlines()]
    return "\n".join(line for line in lines if not line.lstrip().startswith(("!", "%")))


def sources() -> list[tuple[str, str]]:
    """(path relative to the repository, source) of every Python file the project runs."""
    files = sorted({*(REPO / "pyxtts").rglob("*.py"), *(REPO / "build_support").glob("*.py"),
                    REPO / "setup.py", *(REPO / "tests").rglob("*.py")})
    found = [(str(p.relative_to(REPO)), p.read_text(encoding="utf-8")) for p in files]
    notebook = REPO / "notebooks" / "MyXTTSTrain.ipynb"
    return found + [(str(notebook.relative_to(REPO)), notebook_code(notebook))]


def is_guard(node: ast.AST) -> bool:
    """An ``if`` on sys.version_info, or a ``try`` that catches a missing module or name."""
    if isinstance(node, ast.If):
        return "version_info" in ast.dump(node.test)
    if isinstance(node, ast.Try):
        caught = {n.id for h in node.handlers if h.type is not None for n in ast.walk(h.type)
                  if isinstance(n, ast.Name)}
        return bool(caught & GUARD_ERRORS)
    return False


def unguarded(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, less those inside a guard."""
    yield tree
    for child in ast.iter_child_nodes(tree):
        if not is_guard(child):
            yield from unguarded(child)


def dotted(node: ast.AST, aliases: dict[str, str]) -> str:
    """'itertools.batched' for ``it.batched`` after ``import itertools as it``; '' otherwise."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return ""
    return ".".join([aliases[node.id], *reversed(parts)])


def imports(tree: ast.AST) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """Local name -> what it was imported as, and (line, dotted name) of each import."""
    aliases: dict[str, str] = {}
    used: list[tuple[int, str]] = []
    for node in unguarded(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                used.append((node.lineno, a.name))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            used.append((node.lineno, node.module))
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                used.append((node.lineno, f"{node.module}.{a.name}"))
    return aliases, used


def newer_uses(source: str, oldest: tuple[int, int]) -> list[str]:
    """'line N: name (3.x)' for each use of a module or name newer than ``oldest``."""
    tree = ast.parse(source)
    aliases, used = imports(tree)
    for node in unguarded(tree):
        if isinstance(node, ast.Attribute):
            name = dotted(node, aliases)
            used += [(node.lineno, ".".join(name.split(".")[:i])) for i in range(2, name.count(".") + 2)]
        elif isinstance(node, ast.Name) and node.id in BUILTINS and node.id not in aliases:
            used.append((node.lineno, f"builtins.{node.id}"))
    found = {(line, name) for line, name in used if NEWER.get(name, (0, 0)) > oldest}
    return [f"line {line}: {name} ({'.'.join(map(str, NEWER[name]))})" for line, name in sorted(found)]


def resolves(name: str) -> bool:
    """Whether this interpreter has the module or attribute ``name``."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_requires_python_names_the_oldest_version():
    assert oldest_python() >= (3, 10)


@pytest.mark.parametrize("name", sorted(NEWER))
def test_each_newer_name_appears_in_its_version(name):
    """An entry with a typo, or the wrong version, would let a use slip through."""
    assert resolves(name) == (sys.version_info[:2] >= NEWER[name]), (name, NEWER[name], sys.version_info[:2])


def test_the_checker_sees_newer_names_and_skips_guarded_ones():
    source = ("import tomllib\nfrom typing import Self\nimport itertools as it\nimport datetime\n"
              "x = it.batched([1], 1), datetime.UTC\n"
              "def f():\n    raise ExceptionGroup('x', [])\n"
              "if sys.version_info >= (3, 11):\n    import tomllib as t\n"
              "try:\n    from enum import StrEnum\nexcept ImportError:\n    StrEnum = str\n"
              "import math\ny = math.exp2(3)\n")
    assert newer_uses(source, (3, 10)) == [
        "line 1: tomllib (3.11)", "line 2: typing.Self (3.11)", "line 5: datetime.UTC (3.11)",
        "line 5: itertools.batched (3.12)", "line 7: builtins.ExceptionGroup (3.11)",
        "line 15: math.exp2 (3.11)"]
    assert newer_uses(source, (3, 12)) == []


def test_the_syntax_check_refuses_newer_syntax():
    with pytest.raises(SyntaxError):
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass\n", feature_version=(3, 10))


@pytest.mark.parametrize("path,source", sources(), ids=[p for p, _ in sources()])
def test_source_parses_as_the_oldest_python(path, source):
    ast.parse(source, path, feature_version=oldest_python())


def test_no_source_uses_a_module_or_name_newer_than_the_oldest_python():
    oldest = oldest_python()
    bad = [f"{path}: {use}" for path, source in sources() for use in newer_uses(source, oldest)]
    assert not bad, f"requires-python admits {oldest[0]}.{oldest[1]}, which lacks:\n" + "\n".join(bad)

"""Rules of the test suite itself: every random number comes from the run's seed.

A failing test must be repeatable with the PYXTTS_TEST_SEED its report prints, so the
tests and their helpers never draw from an unseeded or fixed-seed generator: NumPy
generators come from the ``rng`` fixture, ``helpers.make_rng`` or ``default_rng`` of a
value derived from the seed (``seed``, ``SEED``, a child's ``sys.argv``); ``random.Random``,
Hypothesis (``@seed(SEED)``) and torch (a ``generator=`` or ``manual_seed`` of such a value)
are seeded from it too. The check reads the code, including the Python programs that tests
run in child processes.
"""
from __future__ import annotations

import ast
import os
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SOURCES = sorted(p for p in TESTS.rglob("*.py") if "bench" not in p.relative_to(TESTS).parts)

LEGACY_NUMPY = {"seed", "rand", "randn", "randint", "random", "random_sample", "normal", "uniform",
                "choice", "shuffle", "permutation", "RandomState", "standard_normal", "bytes"}
TORCH_RANDOM = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
                "normal", "bernoulli", "multinomial", "poisson", "seed"}
RANDOM_MODULE = {"random", "randint", "randrange", "choice", "choices", "shuffle", "sample", "uniform",
                 "gauss", "normalvariate", "seed", "getrandbits", "randbytes"}


def dotted(node: ast.AST) -> str:
    """'np.random.default_rng' for that attribute chain, '' for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def unseeded_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) of every random draw in the code that is not derived from the seed."""
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)  # '' for a method of a call's result: torch.Generator().manual_seed
        head = name.rpartition(".")[0]
        last = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        literal_seed = (not node.args and not node.keywords) or (
            node.args and isinstance(node.args[0], ast.Constant))
        if last == "default_rng" and literal_seed:
            bad.append((node.lineno, ast.unparse(node)))
        elif head in ("np.random", "numpy.random") and last in LEGACY_NUMPY:
            bad.append((node.lineno, ast.unparse(node)))
        elif head == "torch" and last in TORCH_RANDOM and not any(k.arg == "generator" for k in node.keywords):
            bad.append((node.lineno, ast.unparse(node)))
        elif last == "manual_seed" and literal_seed:  # torch's global one or a Generator's
            bad.append((node.lineno, ast.unparse(node)))
        elif name == "random.Random" and literal_seed:
            bad.append((node.lineno, ast.unparse(node)))
        elif head == "random" and last in RANDOM_MODULE:
            bad.append((node.lineno, ast.unparse(node)))
    return bad


def unseeded_hypothesis(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every @given test without @seed(SEED)."""
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            calls = {dotted(d.func): d for d in node.decorator_list if isinstance(d, ast.Call)}
            given = any(name.rpartition(".")[2] == "given" for name in calls)
            seeded = any(name.rpartition(".")[2] == "seed" and ast.unparse(d.args[0]) == "SEED"
                         for name, d in calls.items() if d.args)
            if given and not seeded:
                bad.append((node.lineno, f"@given {node.name} without @seed(SEED)"))
    return bad


def embedded_programs(tree: ast.AST) -> list[tuple[int, ast.AST]]:
    """The string constants that are Python programs (a child process's code)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value:
            try:
                out.append((node.lineno, ast.parse(textwrap.dedent(node.value))))
            except SyntaxError:
                pass  # prose, YAML, ...
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(TESTS)))
def test_randomness_derives_from_the_run_seed(path):
    tree = ast.parse(path.read_text(), str(path))
    bad = [f"line {line}: {call}" for line, call in unseeded_calls(tree) + unseeded_hypothesis(tree)]
    for start, program in embedded_programs(tree):
        bad += [f"line {start + line - 1} (child program): {call}" for line, call in unseeded_calls(program)]
    if path.name != "__init__.py" or path.parent.name != "helpers":  # where SEED is drawn
        bad += [f"line {n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and dotted(n).startswith("secrets.")]
    assert not bad, f"{path.name}: random numbers not derived from PYXTTS_TEST_SEED:\n" + "\n".join(bad)


@pytest.mark.parametrize("code, n_bad", [
    ("np.random.default_rng()", 1), ("np.random.default_rng(0)", 1), ("np.random.default_rng(seed)", 0),
    ("np.random.default_rng([SEED, 3])", 0), ("np.random.rand(3)", 1), ("torch.randn(4, 4)", 1),
    ("torch.randn(4, generator=gen)", 0), ("torch.Generator().manual_seed(seed)", 0),
    ("torch.Generator().manual_seed(3)", 1), ("torch.manual_seed(0)", 1), ("torch.manual_seed(SEED)", 0),
    ("random.Random(7)", 1), ("random.Random(f'{SEED}:7')", 0),
    ("random.shuffle(x)", 1), ("make_rng('x').random(3)", 0), ("rng.random(3)", 0),
])
def test_the_randomness_check_finds_what_it_should(code, n_bad):
    assert len(unseeded_calls(ast.parse(code))) == n_bad


def test_the_hypothesis_check_finds_what_it_should():
    tree = ast.parse("@given(x=st.integers())\ndef test_a(x): pass\n"
                     "@given(x=st.integers())\n@seed(SEED)\ndef test_b(x): pass\n")
    assert [name for _, name in unseeded_hypothesis(tree)] == ["@given test_a without @seed(SEED)"]


# ---- what a run leaves in the temp directory ---------------------------------------

def test_a_run_keeps_only_the_temporary_folders_of_failed_tests(tmp_path):
    """A passing run of the suite left 2.5 GB under /tmp/pytest-of-<user> (checkpoints, XTTS
    folders, corpora), times the three runs pytest keeps. The suite's pytest settings
    (pyproject.toml) keep the folders of failed tests only; a session with those settings,
    run here in a child, shows it."""
    import subprocess
    import sys

    from helpers.project import pyproject

    settings = pyproject()["tool"]["pytest"]["ini_options"]
    keys = ("tmp_path_retention_policy", "tmp_path_retention_count")
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n" + "".join(f"{k} = {settings[k]}\n" for k in keys if k in settings))
    (project / "test_leftovers.py").write_text(
        "import os, pytest\n"
        "@pytest.fixture(scope='session')\n"
        "def shared(tmp_path_factory):\n"
        "    d = tmp_path_factory.mktemp('shared'); (d / 'big').write_bytes(bytes(1 << 20)); return d\n"
        "def test_passes(tmp_path, shared):\n"
        "    (tmp_path / 'big').write_bytes(bytes(1 << 20))\n"
        "def test_fails(tmp_path):\n"
        "    (tmp_path / 'evidence').write_text('kept')\n"
        "    assert os.environ.get('FAIL') != '1'\n")
    temp = tmp_path / "temp"
    temp.mkdir()

    def run(fail: bool) -> list[str]:
        env = {**os.environ, "TMPDIR": str(temp), "FAIL": "1" if fail else "0"}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                            str(project)], capture_output=True, text=True, cwd=project, env=env, timeout=120)
        assert r.returncode == (1 if fail else 0), r.stdout[-2000:]
        return sorted(str(p.relative_to(temp)) for p in temp.rglob("*") if p.is_file())

    assert run(fail=False) == []  # a passing run leaves no file
    run(fail=True)
    left = run(fail=True)  # a failing run keeps the failed test's folder (and the session's)
    assert any(p.endswith("/test_fails0/evidence") for p in left), left
    assert not any("/test_passes" in p for p in left), left  # never a passing test's
    assert len({p.split("/")[1] for p in left}) == 1, left  # of the last run only

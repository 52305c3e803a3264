"""Checks of the C sources themselves: every format string given to CPython's formatter
(PyErr_Format, PyUnicode_FromFormat, PyErr_WarnFormat) uses only conversions it knows.
It has no floating-point conversions: an unknown one makes it copy the rest of the format
as it stands, so a message would show "%g" and leave its number unread."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALL = re.compile(r"\b(PyErr_Format|PyUnicode_FromFormat|PyErr_WarnFormat)\s*\(")
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
# PyUnicode_FromFormat's conversions (CPython 3.9-3.13), with flags, width, precision
KNOWN = re.compile(r"%(?:%|[-0]*\d*(?:\.\d+)?(?:c|[diux]|l[diux]|ll[diux]|z[diux]|s|p|[AUVSRT]|N))")


def format_strings(text: str) -> list[tuple[int, str]]:
    """(line, the call's concatenated string literals) for each formatter call in a C file."""
    out = []
    for m in CALL.finditer(text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        out.append((text.count("\n", 0, m.start()) + 1, "".join(LITERAL.findall(text[m.end():i]))))
    return out


def bad_conversions(fmt: str) -> list[str]:
    bad, i = [], 0
    while (j := fmt.find("%", i)) >= 0:
        m = KNOWN.match(fmt, j)
        if m is None:
            bad.append(fmt[j:j + 4])
            i = j + 1
        else:
            i = m.end()
    return bad


def test_the_checker_sees_a_float_conversion():
    calls = format_strings('PyErr_Format(PyExc_ValueError, "x: got %g, "\n "%zd and %%", x, n);')
    assert calls == [(1, "x: got %g, %zd and %%")]
    assert bad_conversions(calls[0][1]) == ["%g, "]
    assert bad_conversions("%R %S %s %d %ld %lld %zd %zu %.200s %5d %c %p %U %%") == []


def test_no_format_string_uses_a_conversion_cpython_lacks():
    files = sorted(p for d in ("csrc", "cuda") for p in (ROOT / d).rglob("*") if p.suffix in (".c", ".h", ".cu"))
    assert len(files) > 30
    found = []
    for path in files:
        for line, fmt in format_strings(path.read_text(encoding="utf-8")):
            found += [f"{path.relative_to(ROOT)}:{line}: {b!r}" for b in bad_conversions(fmt)]
    assert not found, "\n".join(found)


TABLE_ENTRY = re.compile(r"^\s*\.(\w+_workspace)\s*=\s*(\w+),", re.M)


def workspace_entries(path: Path) -> dict[str, str]:
    return dict(TABLE_ENTRY.findall(path.read_text()))


def test_the_planning_table_sizes_as_the_cuda_backend_does():
    # a plan for a card made without the CUDA backend (cuda/sizes.c's table) must equal the
    # CUDA build's: both tables name the same workspace functions, every one of them
    full = workspace_entries(ROOT / "cuda" / "backend_cuda.cu")
    sizes = workspace_entries(ROOT / "cuda" / "sizes.c")
    assert len(full) >= 5 and full == sizes, (full, sizes)
    # and those functions are defined in sizes.c (compiled in every build), not in a .cu
    text = (ROOT / "cuda" / "sizes.c").read_text()
    for fn in full.values():
        assert re.search(rf"^size_t {fn}\(", text, re.M), fn
    for cu in (ROOT / "cuda").glob("*.cu"):
        for fn in full.values():
            assert not re.search(rf"^(extern \"C\" )?size_t {fn}\(", cu.read_text(), re.M), (cu.name, fn)

"""How pyxtts's messages say a count and what changed between two sets of settings."""
from __future__ import annotations

from typing import Any, Callable


def counted(n: int, noun: str) -> str:
    """'1 step', '3 steps'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def setting_changes(before: Any, after: Any, *, absent_too: bool = False, prefix: str = "",
                    word: Callable[[Any], str] = repr) -> list[str]:
    """The settings that differ between two (nested) dicts, as "name: old -> new", a
    nested one as "section.name", each value as ``word`` spells it (a config file's
    settings as the file does). Names one side lacks count only with ``absent_too`` (as
    None): settings an older file predates are not changes."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    names = list(after) + [k for k in before if k not in after] if absent_too else [k for k in after if k in before]
    out: list[str] = []
    for k in names:
        a, b = before.get(k), after.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += setting_changes(a, b, absent_too=absent_too, prefix=f"{prefix}{k}.", word=word)
        else:
            out.append(f"{prefix}{k}: {word(a)} -> {word(b)}")
    return out

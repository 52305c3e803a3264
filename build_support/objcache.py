"""A content-addressed cache of compiled objects, shared by every build of a checkout.

A compile unit is looked up in two steps, as ccache's "direct mode" does:
  1. its unit key hashes the compiler's identity (its version text), its
     arguments, the checkout's path (objects carry it in their debug info) and
     the source's bytes. Include directories enter as positions, not paths, so a
     build environment that pip creates in a fresh temporary folder still hits;
  2. the manifest stored under that key lists, per object stored so far, every
     file the compiler read (its -MD list) with the hash of its bytes. The first
     entry whose files all hash the same today names the object.
A miss compiles with -MD and then stores the object and a manifest entry.

Where: $PYXTTS_CACHE_DIR, else $XDG_CACHE_HOME/pyxtts, else ~/.cache/pyxtts.
PYXTTS_CACHE=0 turns the cache off. It keeps at most MAX_BYTES of objects,
dropping the least recently used first. Writes are atomic (a temporary file,
then a rename), so concurrent builds can share it; a manifest entry that two
builds add at the same moment may be lost, which costs one later miss.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "pyxtts-objcache-1"  # bump when the key's recipe changes
MAX_BYTES = 2 << 30
MAX_ENTRIES = 8  # objects remembered per unit key (e.g. switching dependency versions)


@dataclass
class UnitKey:
    """What identifies one compile before its dependencies are known."""

    compiler_identity: str
    args: list[str]  # the command minus source, output and include directories
    include_dirs: list[str]  # in search order
    root: str  # the checkout
    source: str  # absolute path
    extra: dict[str, str] = field(default_factory=dict)  # environment that steers the compiler


def default_dir() -> Path | None:
    if os.environ.get("PYXTTS_CACHE", "").strip() == "0":
        return None
    if os.environ.get("PYXTTS_CACHE_DIR"):
        return Path(os.environ["PYXTTS_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pyxtts"


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class ObjectCache:
    """Thread-safe: the compile pool's workers look up and store concurrently."""

    def __init__(self, root: Path):
        self.root = root
        self._hashes: dict[str, str] = {}  # path -> sha256 of its bytes, for this build
        self._lock = threading.Lock()

    # ---- hashing ------------------------------------------------------------------
    def file_hash(self, path: str) -> str | None:
        """sha256 of a file's bytes, once per build; None when it is gone."""
        with self._lock:
            if path in self._hashes:
                return self._hashes[path]
        try:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            return None
        with self._lock:
            self._hashes[path] = digest
        return digest

    def unit_key(self, k: UnitKey) -> str:
        h = hashlib.sha256()
        source_hash = self.file_hash(k.source)
        if source_hash is None:
            raise FileNotFoundError(k.source)
        parts = [FORMAT, k.compiler_identity, json.dumps(k.args), str(len(k.include_dirs)), k.root,
                 k.source, source_hash, json.dumps(sorted(k.extra.items()))]
        for p in parts:
            h.update(p.encode())
            h.update(b"\0")
        return h.hexdigest()

    # ---- dependency paths as tokens that survive a moved include directory ---------
    @staticmethod
    def _bases(k: UnitKey) -> list[str]:
        return [os.path.normpath(k.root)] + [os.path.normpath(d) for d in k.include_dirs]

    def tokens(self, k: UnitKey, deps: list[str]) -> list[list[str]] | None:
        """[[token, sha256], ...] of the files a compile read; a token is
        "i:relative" under base i (0: the checkout, then the include directories,
        the longest match), else the absolute path. None if a file is gone."""
        bases = self._bases(k)
        out = []
        for dep in deps:
            path = os.path.normpath(os.path.join(k.root, dep))
            best = -1
            for i, base in enumerate(bases):
                if path.startswith(base + os.sep) and (best < 0 or len(base) > len(bases[best])):
                    best = i
            token = f"{best}:{os.path.relpath(path, bases[best])}" if best >= 0 else path
            digest = self.file_hash(path)
            if digest is None:
                return None
            out.append([token, digest])
        return out

    def _resolve(self, k: UnitKey, token: str) -> str:
        if token.startswith("/"):
            return token
        index, rel = token.split(":", 1)
        return os.path.join(self._bases(k)[int(index)], rel)

    # ---- lookup and store ------------------------------------------------------------
    def _manifest(self, key: str) -> Path:
        return self.root / "manifests" / key[:2] / f"{key}.json"

    def _object(self, digest: str) -> Path:
        return self.root / "objects" / digest[:2] / f"{digest}.o"

    def lookup(self, k: UnitKey, key: str, dest: Path) -> bool:
        """Copies the cached object of this unit to dest; False on a miss."""
        try:
            entries = json.loads(self._manifest(key).read_text())
        except (OSError, ValueError):
            return False
        for entry in entries:
            if all(self.file_hash(self._resolve(k, t)) == h for t, h in entry["deps"]):
                obj = self._object(entry["object"])
                try:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(obj, dest)
                    os.utime(obj)  # recently used: pruned last
                    return True
                except OSError:
                    return False  # pruned since the manifest was written
        return False

    def store(self, k: UnitKey, key: str, obj: Path, deps: list[str]) -> None:
        tokens = self.tokens(k, deps)
        if tokens is None:
            return  # a file went away during the build: nothing trustworthy to store
        data = obj.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        target = self._object(digest)
        if not target.exists():
            _atomic_write(target, data)
        manifest = self._manifest(key)
        try:
            entries = json.loads(manifest.read_text())
        except (OSError, ValueError):
            entries = []
        entries = [e for e in entries if e["deps"] != tokens][-(MAX_ENTRIES - 1):]
        entries.append({"deps": tokens, "object": digest})
        _atomic_write(manifest, json.dumps(entries).encode())

    def prune(self, max_bytes: int = MAX_BYTES) -> None:
        """Drops the least recently used objects until the cache holds at most
        3/4 of max_bytes (when it holds more than max_bytes)."""
        files = []
        for p in (self.root / "objects").glob("*/*.o"):
            try:
                st = p.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in files)
        if total <= max_bytes:
            return
        for _, size, p in sorted(files):
            if total <= max_bytes * 3 // 4:
                break
            try:
                p.unlink()
                total -= size
            except OSError:
                pass


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a make rule as gcc and nvcc write them with -MD."""
    body = text.replace("\\\n", " ")
    _, _, deps = body.partition(": ")
    out, cur, escaped = [], [], False
    for ch in deps:
        if escaped:
            cur.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch.isspace():
            if cur:
                out.append("".join(cur))
                cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


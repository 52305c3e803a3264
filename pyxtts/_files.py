"""Files written so that a crash, a full disk or a read-only folder never leaves one
half-written, and an error that says which file and why in one line.

``write_atomic(path, write)`` (one file) and ``write_all_atomic(folder, writers)`` (several
that belong together) call each ``write(tmp)`` for ``<name>.tmp-<pid>`` beside its target,
fsync it and, once every one is written, rename each over its target and fsync the folder.
A process killed at any moment leaves every file either old or new, never a mix of
bytes; an error before the renames (no space, no inodes, a read-only file system, a
folder removed meanwhile) removes the temporary files, so the folder is as it was, and is
raised as an ``OSError`` of the same errno whose message names the target and the cause:
``cannot write 'run/step_00000004.safetensors': No space left on device``. The temporary
files of a process that died (``<name>.tmp-<pid>``, and the ``<name>.tmp-<pid>.d`` folder a
writer scratches in) are removed by the next write of that name, or by
``remove_stale_temps(folder)``.

``lock_folder(folder)`` holds a folder for one writer (a training run, a prepare, an
export, a speak) until its file descriptor is closed or its process ends;
``lock_holder(folder)`` says which process holds it, ``folder_in_use`` says so in words.
``missing_folders`` and ``remove_empty_folders`` take back the folders a failed writer made.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pyxtts._interrupts import deferred_sigint

__all__ = ["TEMP_RE", "folder_in_use", "folder_problem", "lock_folder", "lock_holder", "missing_folders",
           "remove_empty_folders", "remove_stale_temps", "scratch_folder", "write_all_atomic", "write_atomic",
           "write_error"]

# <name>.tmp-<pid>, and <name>.tmp-<pid>.d (a folder a writer scratches in)
TEMP_RE = re.compile(r"(.+)\.tmp-(\d+)(\.d)?")
# how safetensors' writer (Rust) reports the operating system's error: "... (os error 28)"
_OS_ERROR_RE = re.compile(r"\(os error (\d+)\)")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    """A file, or a folder and what it holds; nothing when it is gone already."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        pass


def _stale(name: str, stem: str | None = None) -> bool:
    """Whether ``name`` is a temporary file (or scratch folder) of a dead process; of a
    write of ``stem`` only, when given."""
    m = TEMP_RE.fullmatch(name)
    if m is None or (stem is not None and m.group(1) != stem):
        return False
    pid = int(m.group(2))
    return pid != os.getpid() and not _pid_alive(pid)


def remove_stale_temps(folder: Path, stem: str | None = None) -> None:
    """Removes the temporary files and scratch folders that dead processes left in
    ``folder`` (those of writes of ``stem`` alone, when given)."""
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return
    for p in entries:
        if _stale(p.name, stem):
            _remove(p)


def scratch_folder(tmp: Path) -> Path:
    """The folder a writer that makes files of its own beside its target (safetensors does)
    is given for ``tmp``: removed with it, and by ``remove_stale_temps`` after a crash."""
    return tmp.with_name(tmp.name + ".d")


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and put back
    os.umask(mask)
    return mask


def folder_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be made or written into when the path itself is the cause, in
    words: a file where a folder (or one of its parents) should be, or a symbolic link to
    nothing. None when the path is not the cause (a full disk, a read-only file system)."""
    for p in (folder, *folder.parents):
        if p.is_symlink() and not p.exists():
            return f"{str(p)!r} is a symbolic link to {os.readlink(p)!r}, which does not exist"
        if p.exists() and not p.is_dir():
            return f"{str(p)!r} is a file, not a folder"
    return None


def _os_error(exc: BaseException) -> OSError | None:
    """The operating system's error behind a failed write: ``exc`` itself, or the one
    safetensors' writer names in its message; None for any other failure."""
    if isinstance(exc, OSError):
        return exc
    if type(exc).__name__ != "SafetensorError":
        return None
    m = _OS_ERROR_RE.search(str(exc))
    if m is None:
        return None
    code = int(m.group(1))
    return OSError(code, os.strerror(code))


def write_error(path: Path, exc: BaseException) -> OSError | None:
    """``exc``, a failure to write ``path`` (or its temporary file), as an OSError of the
    same errno whose one-line message names ``path`` and the cause; None when ``exc`` is
    no error of the operating system's (a bug, Ctrl-C), and ``exc`` itself when it names
    another file (the source of a copy that could not be read)."""
    err = _os_error(exc)
    if err is None:
        return None
    if err.filename is not None:
        named = Path(os.fsdecode(err.filename))
        if not (str(named).startswith(str(path)) or named in path.parents):  # not it, its temporaries, its folders
            return err
    why = folder_problem(path.parent) or err.strerror or str(err)
    if err.errno == errno.ENOENT and not path.parent.exists():
        why += f" (the folder {str(path.parent)!r} does not exist)"
    return OSError(err.errno, f"cannot write {str(path)!r}: {why}")


def write_all_atomic(folder: str | os.PathLike, writers: Mapping[str, Callable[[Path], None]],
                     make_folder: bool = True, remove: Sequence[str] = ()) -> None:
    """Writes each file ``name`` of ``writers`` in ``folder`` (made when missing, unless not
    ``make_folder``) by calling its ``write(tmp)`` for ``<name>.tmp-<pid>``; each temporary
    file gets the mode a new file gets (0666 less the umask) and is fsynced; then every one
    is renamed over its name, the files ``remove`` names are removed, and the folder is
    fsynced (the module doc says what a failure or a crash leaves). A Ctrl-C during the
    renames and removals is raised once they are all done: the folder then holds all the
    new files, not some."""
    folder = Path(folder)
    pending: list[tuple[Path, Path]] = []  # (temporary file, target)
    current = folder / next(iter(writers))
    try:
        if make_folder:
            folder.mkdir(parents=True, exist_ok=True)
        for name, write in writers.items():
            current = folder / name
            remove_stale_temps(folder, name)
            tmp = folder / f"{name}.tmp-{os.getpid()}"
            pending.append((tmp, current))
            write(tmp)
            fd = os.open(tmp, os.O_RDWR)
            try:
                os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it (safetensors writes 0600)
                os.fsync(fd)
            finally:
                os.close(fd)
        with deferred_sigint():
            for tmp, target in pending:
                current = target
                os.replace(tmp, target)
            for name in remove:
                current = folder / name
                current.unlink(missing_ok=True)
    except BaseException as exc:
        for tmp, _ in pending:
            _remove(tmp)
        named = write_error(current, exc)
        if named is None or named is exc:
            raise
        try:
            raise named from exc
        finally:  # no cycle through this frame: the objects of the frames above (a trainer, its
            named = None  # model's memory) go as soon as the caller lets go of the error
    _fsync_dir(folder)


def write_atomic(path: str | os.PathLike, write: Callable[[Path], None], make_folder: bool = True) -> None:
    """``write_all_atomic`` of the one file ``path``."""
    path = Path(path)
    write_all_atomic(path.parent, {path.name: write}, make_folder)


def lock_folder(folder: Path) -> int | None:
    """A file descriptor of ``folder`` (made when missing) that holds it locked (an
    exclusive ``flock``) until it is closed; the kernel lets go of it however the process
    ends, kill -9 included. BlockingIOError when another open of the folder holds it (in
    any process, this one too). None where there is nothing to hold: a folder that cannot
    be made or opened (the writers then say why), a platform or file system without locks."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError:  # ENOLCK, EINVAL: a file system that keeps no locks
        os.close(fd)
        return None
    return fd


def lock_holder(folder: Path) -> int | None:
    """The process that holds ``folder``'s lock, as Linux's /proc/locks tells it; None
    where it does not."""
    try:
        st = folder.stat()
        lines = Path("/proc/locks").read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        fields = line.split()  # "1: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(st.st_ino):
            try:
                major, minor = (int(x, 16) for x in fields[5].split(":")[:2])
            except ValueError:
                continue
            if (major, minor) == (os.major(st.st_dev), os.minor(st.st_dev)) and fields[4].isdigit():
                return int(fields[4])
    return None


def folder_in_use(folder: Path, argument: str, advice: str) -> BlockingIOError:
    """The error of a writer refused ``folder`` (``argument``'s) because another holds its
    lock, naming the process that holds it where the system says; ``advice``: what to do."""
    pid = lock_holder(folder)
    who = "another pyxtts command" + (f" (process {pid})" if pid is not None and pid != os.getpid() else "")
    return BlockingIOError(errno.EAGAIN, f"{argument}: {str(folder)!r} is in use by {who} writing into it: {advice}")


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist, deepest first: what making it
    would make."""
    return [p for p in (folder, *folder.parents) if not p.exists() and not p.is_symlink()]


def remove_empty_folders(folders: list[Path]) -> None:
    """Removes ``folders`` (deepest first, as ``missing_folders`` gives them) while they are
    empty; the first that is not ends it (one gone already is passed over)."""
    for f in folders:
        try:
            f.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            break

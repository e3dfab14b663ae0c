"""Atomic file replacement for ``kiln.save``: a temp file next to the target, fsynced, renamed over it.

A crash, kill or power loss leaves either the old file or the new one under the name, never a partial
one. Temp files are named ``.<name>.<pid>.<16 hex>.tmp`` and locked while written, so the next save to
the same target can tell a dead writer's leftovers from a live writer's file.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import secrets
import stat
from collections.abc import Callable
from typing import BinaryIO

try:  # advisory locks mark a temp file as being written; absent on Windows
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]


def _temp_pattern(name: str) -> re.Pattern[str]:
    """Names of the temp files ``save`` writes for target ``name``: ``.<name>.<pid>.<16 hex>.tmp``."""
    return re.compile(rf"\.{re.escape(name)}\.([0-9]{{1,10}})\.[0-9a-f]{{16}}\.tmp")


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts as alive until its parent reaps it)."""
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists and may be signalled
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists but belongs to another user; anything else: be safe
        return True
    return True


def _remove_if_unlocked(path: str) -> None:
    """Delete a temp file unless a writer still holds its lock (written elsewhere: another PID namespace)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # gone already, or not ours to read: leave it
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a live writer holds it
        except OSError:
            pass  # the filesystem has no locks: the dead PID is all there is to go by
        # Gone already, or not ours to delete (another user's file in a sticky directory such as /tmp).
        with contextlib.suppress(OSError):
            os.unlink(path)
    finally:
        os.close(fd)


def _remove_stale_temps(directory: str, name: str) -> None:
    """Remove temp files of target ``name`` left by writers that died (killed mid-save, power loss).

    A temp file is stale when the PID in its name is no process any more and no one holds its lock.
    A live writer's file (another process, or another thread of this one) is never touched. Best
    effort: an ``OSError`` while listing the directory, or while opening, locking or deleting one
    candidate (say another user's stale file in a shared sticky directory), leaves that file where it
    is and moves on; it never fails the save.
    """
    if os.name != "posix" or fcntl is None:  # os.kill(pid, 0) is not a liveness probe on Windows
        return
    pattern = _temp_pattern(name)
    me = os.getpid()
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        m = pattern.fullmatch(entry)
        if m is None:
            continue
        pid = builtins.int(m.group(1))
        if pid == me or not 0 < pid < 2**31:
            continue
        with contextlib.suppress(OSError):  # this candidate stays; the others and the save go on
            if not _pid_alive(pid):
                _remove_if_unlocked(os.path.join(directory, entry))


def _existing_mode(path: str) -> int | None:
    """The permission bits of the regular file at ``path`` (symlinks already resolved); None if there is none.

    Only ``rwx`` for user, group and others: setuid/setgid are not carried over (writing to a file
    clears them too), and the sticky bit means nothing on a regular file.
    """
    if os.name != "posix":  # a mode there is only the read-only flag
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.S_IMODE(st.st_mode) & 0o777 if stat.S_ISREG(st.st_mode) else None


def _create_temp(directory: str, name: str) -> tuple[int, str]:
    """Create and lock ``.<name>.<pid>.<random>.tmp`` next to the target, with mode ``0o666 & ~umask``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)  # 0o666 & ~umask, as open(path, "wb") would give a new file
        except FileExistsError:
            continue
        if fcntl is not None:
            with contextlib.suppress(OSError):  # no locks on this filesystem: the PID alone marks it live
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd, tmp
    raise FileExistsError(f"kiln.save: could not create a temp file next to {os.path.join(directory, name)!r}")


def _fsync_directory(directory: str) -> None:
    try:  # make the rename itself durable; not every platform can open a directory
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def atomic_write(f: str | os.PathLike, write: Callable[[BinaryIO, str], None]) -> None:
    """Replace the file at ``f`` with what ``write(fh, path)`` writes to ``fh``, atomically.

    Through a symlink, the file it points to is replaced (renaming over the link itself would turn it
    into a regular file) and the link stays a link. The new file keeps the permission bits of the one
    it replaces; on any error the temp file is removed and the target left untouched.
    """
    path = os.path.realpath(os.fsdecode(os.fspath(f)))
    directory, name = os.path.split(path)
    _remove_stale_temps(directory, name)
    mode = _existing_mode(path)
    fd, tmp = _create_temp(directory, name)
    try:
        with os.fdopen(fd, "wb") as fh:
            # The temp file takes the target's mode before any data is in it, so a 0o600 checkpoint
            # is never readable by others, not even while its replacement is being written.
            if mode is not None and stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                os.fchmod(fd, mode)
            write(fh, path)
            fh.flush()
            os.fsync(fh.fileno())  # the data reaches the disk before the name points at it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)

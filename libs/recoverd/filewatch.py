"""Watch one file for changes, event-driven, the way a mounted ConfigMap changes.

:func:`watch_file` yields a file's content at start and again whenever it changes, and never polls:
it sleeps on inotify and reads the file only after an event.

**The directory is watched, not the file.** kubelet updates a mounted ConfigMap atomically: it
writes the new keys into a fresh ``..<timestamp>`` directory, points a temporary symlink at it and
renames that over ``..data``; ``reset.json`` itself is a fixed symlink to ``..data/reset.json``.
An inotify watch on ``reset.json`` (which follows the symlink to the old file) would never fire,
and the same is true of any writer that renames a new file into place. A watch on the directory
sees every such step (``MOVED_TO ..data``, ``CREATE``, ``DELETE``). In-place writes are seen too:
``CLOSE_WRITE`` on the file itself, and on the symlink's target when it lives in another directory
(such as ``..<timestamp>/``), whose directory is watched as well and re-followed after each swap.
``MODIFY`` is not watched: it fires for every ``write()``, so reading on it would hand out
half-written files; a writer that closes the file is seen by ``CLOSE_WRITE``.

Any event in a watched directory (or a queue overflow) triggers one re-read after ``debounce_s``, so
a burst of events costs one read, and a value is yielded only when it differs from the last one
yielded. Other files changing in the directory (``checkCode``, ``restartType``) cost a re-read and
nothing else. The watch is set up before the first read, so no change between the two is missed.

**Why asyncinotify** (pinned in pyproject): a pure-Python ctypes binding to ``inotify_init1`` /
``inotify_add_watch`` with no compiled part, typed (``py.typed``), and asyncio-native (it waits with
``loop.add_reader`` on the inotify descriptor). It works on the Python we run (3.11+), so a private
ctypes wrapper would only repeat it. Only Linux has inotify, and recoverd runs on Linux nodes.

Errors: a missing watch directory is :class:`~recoverd.errors.ConfigError` (it is a mount point, so
its absence is a deployment mistake), as is the directory disappearing or being replaced while
watched. A file over ``max_bytes`` (1 MiB, a ConfigMap's limit) is :class:`~recoverd.errors.BadRecord`
and is never read whole. A raised error ends the iterator; the caller records it and may start a new
watch. Nothing is ever written.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncGenerator

from asyncinotify import Inotify, Mask, Watch

from recoverd.errors import BadRecord, ConfigError

__all__ = ["MAX_BYTES", "read_bounded", "watch_file"]

#: Files larger than this are refused: a ConfigMap holds at most 1 MiB.
MAX_BYTES = 1 << 20

# Every way a name in the directory can come to point at new content. IN_Q_OVERFLOW and IN_IGNORED
# are always delivered.
_DIR_EVENTS = (
    Mask.CREATE
    | Mask.DELETE
    | Mask.CLOSE_WRITE
    | Mask.MOVED_FROM
    | Mask.MOVED_TO
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
)


def read_bounded(path: str, *, max_bytes: int = MAX_BYTES) -> bytes | None:
    """Read ``path`` (following symlinks); None if it does not exist.

    Raises :class:`BadRecord` if it is larger than ``max_bytes`` (never reading more than
    ``max_bytes + 1`` bytes) or is not a regular file; it is opened non-blocking, so a FIFO left at
    the path cannot hang the caller.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadRecord(f"{path} is not a regular file")
        if info.st_size > max_bytes:
            raise BadRecord(f"{path} is {info.st_size} bytes, larger than the {max_bytes}-byte limit")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        # It grew after the fstat.
        raise BadRecord(f"{path} is larger than the {max_bytes}-byte limit")
    return b"".join(chunks)


async def watch_file(
    path: str, *, debounce_s: float = 0.05, max_bytes: int = MAX_BYTES
) -> AsyncGenerator[bytes | None, None]:
    """Yield the content of ``path`` now, then each time it changes; None while it does not exist.

    Runs until the caller stops iterating (close it with ``contextlib.aclosing`` to release the
    inotify descriptor at once). Consecutive yields always differ. ``debounce_s`` is how long to let a
    burst of events settle before reading. Raises :class:`ConfigError` if the directory of ``path``
    does not exist, cannot be watched, or disappears or is replaced while watched;
    :class:`BadRecord` if the file is over ``max_bytes`` or not a regular file.
    """
    directory = _directory_of(path)
    identity = _directory_identity(directory, path)
    with Inotify() as inotify:
        # select(0) in sync_get: drain what is queued without blocking.
        inotify.sync_timeout = 0
        try:
            main_watch = inotify.add_watch(directory, _DIR_EVENTS)
        except OSError as err:
            raise ConfigError(f"cannot watch directory {directory} for {path}: {err}") from err
        target = _TargetWatch(inotify, directory)
        target.follow(path)
        last = read_bounded(path, max_bytes=max_bytes)
        yield last
        while True:
            await inotify.get()
            if debounce_s > 0:
                await asyncio.sleep(debounce_s)
            while inotify.sync_get() is not None:
                pass
            _check_directory(directory, path, identity)
            if main_watch not in inotify.watches:
                raise ConfigError(f"the inotify watch on {directory} was dropped (unmounted?) while watching {path}")
            target.follow(path)
            current = read_bounded(path, max_bytes=max_bytes)
            if current != last:
                last = current
                yield current


def _directory_of(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def _directory_identity(directory: str, path: str) -> tuple[int, int]:
    try:
        info = os.stat(directory)
    except FileNotFoundError as err:
        raise ConfigError(f"cannot watch {path}: directory {directory} does not exist") from err
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"cannot watch {path}: {directory} is not a directory")
    return info.st_dev, info.st_ino


def _check_directory(directory: str, path: str, identity: tuple[int, int]) -> None:
    try:
        info = os.stat(directory)
    except FileNotFoundError as err:
        raise ConfigError(f"directory {directory} was removed while watching {path}") from err
    if (info.st_dev, info.st_ino) != identity:
        raise ConfigError(f"directory {directory} was replaced while watching {path}")


class _TargetWatch:
    """A second watch on the directory that ``path``'s symlinks resolve into, when it is another one.

    Needed only for in-place writes to the target (a swap of ``..data`` is seen in the main
    directory). Re-pointed after every event; a target directory that vanished took its watch with it.
    """

    def __init__(self, inotify: Inotify, directory: str) -> None:
        self._inotify = inotify
        self._main = os.path.realpath(directory)
        self._dir: str | None = None
        self._watch: Watch | None = None

    def follow(self, path: str) -> None:
        target_dir = os.path.dirname(os.path.realpath(path))
        wanted = target_dir if target_dir != self._main and os.path.isdir(target_dir) else None
        alive = self._watch is not None and self._watch in self._inotify.watches
        if wanted == self._dir and (alive or wanted is None):
            return
        if alive and self._watch is not None:
            try:
                self._inotify.rm_watch(self._watch)
            except OSError:
                pass  # Its directory was removed in the meantime; the kernel dropped the watch.
        self._dir, self._watch = None, None
        if wanted is None:
            return
        try:
            self._watch = self._inotify.add_watch(wanted, _DIR_EVENTS)
        except OSError:
            return  # Gone again already: the swap that removed it is an event in the main directory.
        self._dir = wanted

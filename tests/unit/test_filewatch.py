"""watch_file: every way a file (or a mounted ConfigMap) changes is noticed, from events alone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from recoverd import filewatch
from recoverd.errors import BadRecord, ConfigError
from recoverd.filewatch import read_bounded, watch_file

# How long a test waits for a change to be noticed: generous, since an event arrives in microseconds.
NOTICE_S = 5.0
# How long a test watches for something that must not happen.
QUIET_S = 0.3


async def changed(watch: AsyncIterator[bytes | None]) -> bytes | None:
    return await asyncio.wait_for(anext(watch), NOTICE_S)


async def stays_quiet(watch: AsyncIterator[bytes | None]) -> bool:
    """True if nothing is yielded for QUIET_S (the pending anext is cancelled, ending the generator)."""
    try:
        await asyncio.wait_for(anext(watch), QUIET_S)
    except TimeoutError:
        return True
    return False


def write_in_place(path: Path, data: bytes) -> None:
    with open(path, "r+b" if path.exists() else "wb") as handle:
        handle.truncate(0)
        handle.write(data)


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def snapshot(root: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.lstat().st_mtime_ns, p.lstat().st_size) for p in root.rglob("*")}


class ConfigMapVolume:
    """A directory laid out the way kubelet's atomic writer lays out a ConfigMap volume."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        self.current: Path | None = None

    def publish(self, files: dict[str, bytes]) -> None:
        """Write ``files`` into a fresh ``..<timestamp>`` dir, swap ``..data`` to it, drop the old dir."""
        self.generation += 1
        fresh = self.root / f"..2026_01_01_00_00_0{self.generation}.{1000 + self.generation}"
        fresh.mkdir()
        for name, data in files.items():
            (fresh / name).write_bytes(data)
        tmp_link = self.root / "..data_tmp"
        tmp_link.symlink_to(fresh.name)
        os.replace(tmp_link, self.root / "..data")
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        if self.current is not None:
            shutil.rmtree(self.current)
        self.current = fresh


@contextlib.asynccontextmanager
async def watching(path: Path, **kwargs: Any) -> AsyncIterator[AsyncGenerator[bytes | None, None]]:
    async with contextlib.aclosing(watch_file(str(path), **kwargs)) as watch:
        yield watch


# ----------------------------------------------------------------------------------- changes


async def test_yields_current_content_then_in_place_writes(tmp_path: Path) -> None:
    path = tmp_path / "reset.json"
    path.write_bytes(b"one")
    async with watching(path) as watch:
        assert await changed(watch) == b"one"
        write_in_place(path, b"two")
        assert await changed(watch) == b"two"
        write_in_place(path, b"three, longer")
        assert await changed(watch) == b"three, longer"


async def test_atomic_rename_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "reset.json"
    path.write_bytes(b"old")
    async with watching(path) as watch:
        assert await changed(watch) == b"old"
        write_atomically(path, b"new")
        assert await changed(watch) == b"new"


async def test_configmap_symlink_swap_is_noticed(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path)
    volume.publish({"reset.json": b'{"status":"initializing"}', "checkCode": b"c1"})
    path = tmp_path / "reset.json"
    assert path.is_symlink() and os.readlink(path) == "..data/reset.json"
    async with watching(path) as watch:
        assert await changed(watch) == b'{"status":"initializing"}'
        volume.publish({"reset.json": b'{"RankList":[]}', "checkCode": b"c2"})
        assert await changed(watch) == b'{"RankList":[]}'
        volume.publish({"reset.json": b'{"RetryTime":1}', "checkCode": b"c3"})
        assert await changed(watch) == b'{"RetryTime":1}'
        # A swap that changes only another key is not a change of this file.
        volume.publish({"reset.json": b'{"RetryTime":1}', "checkCode": b"c4"})
        assert await stays_quiet(watch)


async def test_in_place_write_to_the_symlink_target_is_noticed(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path)
    volume.publish({"reset.json": b"v1"})
    path = tmp_path / "reset.json"
    async with watching(path) as watch:
        assert await changed(watch) == b"v1"
        assert volume.current is not None
        write_in_place(volume.current / "reset.json", b"v2")  # not how kubelet writes, but a hostPath might
        assert await changed(watch) == b"v2"
        volume.publish({"reset.json": b"v3"})  # the target directory moves; the watch follows it
        assert await changed(watch) == b"v3"
        write_in_place(volume.current / "reset.json", b"v4")
        assert await changed(watch) == b"v4"


async def test_missing_file_yields_none_until_created_and_after_deletion(tmp_path: Path) -> None:
    path = tmp_path / "reset.json"
    async with watching(path) as watch:
        assert await changed(watch) is None
        write_atomically(path, b"here")
        assert await changed(watch) == b"here"
        path.unlink()
        assert await changed(watch) is None
        path.write_bytes(b"back")
        assert await changed(watch) == b"back"


async def test_configmap_key_removed_yields_none(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path)
    volume.publish({"reset.json": b"x", "checkCode": b"c"})
    path = tmp_path / "reset.json"
    async with watching(path) as watch:
        assert await changed(watch) == b"x"
        volume.publish({"checkCode": b"d"})  # reset.json is now a dangling symlink
        assert await changed(watch) is None


async def test_a_burst_is_read_once_and_only_changes_are_yielded(tmp_path: Path) -> None:
    path = tmp_path / "reset.json"
    path.write_bytes(b"a")
    async with watching(path, debounce_s=0.05) as watch:
        assert await changed(watch) == b"a"
        for value in (b"b", b"c", b"d"):
            write_atomically(path, value)
        assert await changed(watch) == b"d"
        write_in_place(path, b"d")  # same content again: not a change
        (tmp_path / "unrelated").write_bytes(b"noise")  # another file in the directory: not a change
        assert await stays_quiet(watch)


async def test_events_only_no_polling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    real_read = filewatch.read_bounded

    def counting_read(path: str, *, max_bytes: int = filewatch.MAX_BYTES) -> bytes | None:
        reads.append(path)
        return real_read(path, max_bytes=max_bytes)

    monkeypatch.setattr(filewatch, "read_bounded", counting_read)
    path = tmp_path / "reset.json"
    path.write_bytes(b"1")
    async with watching(path) as watch:
        assert await changed(watch) == b"1"
        assert len(reads) == 1
        await asyncio.sleep(QUIET_S)  # a poller would have read again by now
        assert len(reads) == 1
        write_atomically(path, b"2")
        assert await changed(watch) == b"2"
        assert len(reads) == 2


# ------------------------------------------------------------------------------------ errors


async def test_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "not-mounted" / "reset.json"
    with pytest.raises(ConfigError, match=rf"cannot watch {path}: directory {path.parent} does not exist"):
        await anext(watch_file(str(path)))


async def test_directory_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ConfigError, match="is not a directory"):
        await anext(watch_file(str(tmp_path / "file" / "reset.json")))


async def test_directory_removed_while_watched_is_a_config_error(tmp_path: Path) -> None:
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "reset.json").write_bytes(b"x")
    async with watching(directory / "reset.json") as watch:
        assert await changed(watch) == b"x"
        shutil.rmtree(directory)
        with pytest.raises(ConfigError, match=f"directory {directory} was removed while watching"):
            await changed(watch)


async def test_oversized_file_is_a_bad_record(tmp_path: Path) -> None:
    path = tmp_path / "reset.json"
    path.write_bytes(b"x" * (filewatch.MAX_BYTES + 1))
    with pytest.raises(BadRecord, match=r"larger than the 1048576-byte limit"):
        await anext(watch_file(str(path)))

    path.write_bytes(b"small")
    async with watching(path, max_bytes=16) as watch:
        assert await changed(watch) == b"small"
        write_atomically(path, b"y" * 17)
        with pytest.raises(BadRecord, match=r"is 17 bytes, larger than the 16-byte limit"):
            await changed(watch)


def test_read_bounded(tmp_path: Path) -> None:
    assert read_bounded(str(tmp_path / "absent")) is None
    assert read_bounded(str(tmp_path / "absent" / "deeper")) is None
    (tmp_path / "f").write_bytes(b"12345")
    assert read_bounded(str(tmp_path / "f"), max_bytes=5) == b"12345"
    with pytest.raises(BadRecord, match="larger than the 4-byte limit"):
        read_bounded(str(tmp_path / "f"), max_bytes=4)
    with pytest.raises(BadRecord, match="not a regular file"):
        read_bounded(str(tmp_path))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(BadRecord, match="not a regular file"):  # opened non-blocking: no hang
        read_bounded(str(tmp_path / "fifo"))


async def test_watch_writes_nothing(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path)
    volume.publish({"reset.json": b"x"})
    before = snapshot(tmp_path)
    async with watching(tmp_path / "reset.json") as watch:
        assert await changed(watch) == b"x"
        assert await stays_quiet(watch)
    assert snapshot(tmp_path) == before

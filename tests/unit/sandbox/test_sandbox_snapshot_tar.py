"""Snapshot tars (sandbox/snapshot.py): what a restore accepts, and each hostile tar it refuses with the member named.
Everything here is read from memory on the host; nothing is unpacked (the sandbox writes the checked files)."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest

from sandbox.config import SandboxConfig
from sandbox.snapshot import CellLog, Entry, SnapshotError, checked, digest, from_tar, to_tar

CFG = SandboxConfig(max_concurrency=2, snapshot_max_bytes=4096, snapshot_max_files=8, max_file_bytes=3000)


def _tar(*members: tuple[tarfile.TarInfo, bytes | None], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes | None = None, **fields):
    info = tarfile.TarInfo(name)
    info.type = kind
    if data is not None:
        info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


def _refused(data: bytes, status: int, *words: str) -> str:
    with pytest.raises(SnapshotError) as raised:
        from_tar(data, CFG)
    message = str(raised.value)
    assert raised.value.status == status, message
    for word in words:
        assert word in message, message
    return message


def test_a_snapshot_round_trips_through_its_tar_with_contents_modes_and_mtimes():
    entries = checked([Entry("notes/a.txt", "file", 0o640, 1_700_000_000_123_456_000, b"alpha"),
                       Entry("notes", "dir", 0o750, 1_700_000_000_000_000_000),
                       Entry("run.sh", "file", 0o4755, 5, b"#!/bin/sh\n"),
                       Entry("empty", "dir", 0o700, 7)], CFG, "test")
    assert [e.path for e in entries] == ["empty", "notes", "notes/a.txt", "run.sh"]  # a directory before its files
    assert entries[3].mode == 0o755  # setuid and the like are dropped: permission bits only
    back = from_tar(to_tar(entries), CFG)
    assert [(e.path, e.kind, e.mode, e.data) for e in back] == [(e.path, e.kind, e.mode, e.data) for e in entries]
    assert back[2].mtime_ns == 1_700_000_000_000_000_000  # in whole seconds
    assert digest(back) == digest(entries)
    assert digest(back) != digest([e._replace(data=b"beta") if e.path == "notes/a.txt" else e for e in back])


def test_a_tar_made_by_tar_c_dot_is_read_and_missing_parents_are_added():
    data = _tar(_member("./", tarfile.DIRTYPE), _member("./deep/er/f.txt", data=b"x"), fmt=tarfile.GNU_FORMAT)
    assert [(e.path, e.kind) for e in from_tar(data, CFG)] == [("deep", "dir"), ("deep/er", "dir"),
                                                              ("deep/er/f.txt", "file")]


@pytest.mark.parametrize(("member", "what"), [
    (_member("evil", tarfile.SYMTYPE, linkname="/etc/passwd"), "a symbolic link"),
    (_member("evil", tarfile.LNKTYPE, linkname="/etc/shadow"), "a hard link"),
    (_member("evil", tarfile.CHRTYPE, devmajor=1, devminor=3), "a character device"),
    (_member("evil", tarfile.BLKTYPE, devmajor=8, devminor=0), "a block device"),
    (_member("evil", tarfile.FIFOTYPE), "a fifo"),
    (_member("evil", tarfile.CONTTYPE, data=b"x"), "a contiguous file"),
])
def test_links_devices_and_fifos_are_refused_by_name(member, what):
    _refused(_tar(_member("fine.txt", data=b"ok"), member), 400, "'evil'", what, "regular files only")


@pytest.mark.parametrize("name", ["../escape.txt", "a/../../escape.txt", "/etc/cron.d/evil", "a//b", "a/./b",
                                  "x" * 1100])
def test_paths_outside_or_around_the_work_dir_are_refused(name):
    _refused(_tar(_member(name, data=b"boom")), 400, "not a relative path inside the work dir")


def test_a_huge_file_is_refused_before_it_is_read():
    info, _ = _member("huge.bin")
    info.size = 10 << 30  # claims 10 GiB with a few bytes behind it
    raw = bytearray(_tar((info, None)))
    assert len(raw) <= tarfile.RECORDSIZE  # one tar record: a few headers
    _refused(bytes(raw), 413, "'huge.bin'", "10737418240 bytes", "max_file_bytes")


def test_a_tar_bomb_of_members_or_bytes_is_refused():
    many = _tar(*(_member(f"f{i}", data=b"") for i in range(CFG.snapshot_max_files + 1)))
    _refused(many, 413, "snapshot_max_files")
    big = _tar(*(_member(f"part{i}", data=b"z" * 2000) for i in range(3)))  # 6000 > snapshot_max_bytes 4096
    _refused(big, 413, "'part2'", "snapshot_max_bytes")
    dirs = _tar(_member("/".join(f"d{i}" for i in range(CFG.snapshot_max_files + 1)) + "/f", data=b""))
    _refused(dirs, 413, "snapshot_max_files")  # the parents it implies count too
    _refused(b"\0" * (CFG.snapshot_tar_bytes + 1), 413, "more than a snapshot can be")


def test_sparse_truncated_trailing_compressed_and_garbage_tars_are_refused():
    sparse = _tar(_member("holes.bin", data=b"abc", pax_headers={"GNU.sparse.map": "0,3", "GNU.sparse.size": "99"}))
    _refused(sparse, 400, "'holes.bin'", "sparse")
    gnu_sparse = _tar(_member("holes2.bin", tarfile.GNUTYPE_SPARSE, data=b""), fmt=tarfile.GNU_FORMAT)
    _refused(gnu_sparse, 400, "'holes2.bin'", "sparse")
    whole = _tar(_member("cut.txt", data=b"y" * 1500))
    _refused(whole[:whole.index(b"y" * 1500) + 700], 400)  # cut inside the member's data
    _refused(whole[:-1024] + b"not a tar header".ljust(512, b"!") + b"\0" * 512, 400, "after the last tar member")
    _refused(gzip.compress(whole), 400, "not an uncompressed tar")
    _refused(b"definitely not a tar archive".ljust(1024, b"?"), 400, "not an uncompressed tar")


def test_duplicates_and_files_where_directories_must_be_are_refused():
    _refused(_tar(_member("same", data=b"1"), _member("same", data=b"2")), 400, "'same' appears twice")
    _refused(_tar(_member("a", data=b"file"), _member("a/b", data=b"below a file")), 400, "'a/b' lies below 'a'")


def test_the_cell_log_follows_restarts_timeouts_and_its_size_limit():
    ok = {"restarted": False, "status": "ok"}
    log = CellLog(max_bytes=10)
    log.record("x = 1", ok)
    log.record("oops", {"restarted": False, "status": "error", "error": {"name": "NameError"}})
    assert log.cells == ["x = 1", "oops"] and log.replayable  # an exception is part of the history
    log.record("y", {"restarted": True, "status": "ok"})  # ran in a fresh interpreter
    assert log.cells == ["y"] and log.replayable
    log.record("z", {"restarted": True, "status": "error", "error": {"name": "SessionRestarted"}})
    assert log.cells == [] and log.replayable  # it killed its interpreter: the fresh one holds nothing
    log.record("sleep", {"restarted": False, "status": "timeout"})
    assert log.cells == [] and not log.replayable
    log.record("a = 1", ok)
    assert not log.replayable  # until the interpreter is replaced
    big = CellLog(max_bytes=10)
    big.record("a = 12345", ok)
    big.record("b = 12345", ok)
    assert big.cells == [] and not big.replayable and big.copy().replayable is False

"""Workspace snapshots (`GET /sessions/{id}/snapshot`, `POST /sessions/{id}/restore`, `POST /sessions` with a
snapshot): files restored exactly, state rebuilt by replay, the change flag, limits, and hostile tars. The shared
service has max_sessions=4 and a 64 MB tmpfs (sandbox_testlib.SERVICE_SETTINGS)."""

from __future__ import annotations

import base64
import io
import tarfile

import pytest
from sandbox_testlib import assert_benign, cell, python_session, sandbox_service, session

pytestmark = pytest.mark.slow

BUILD = [
    "import os, stat\nx = 41\nos.makedirs('data/sub', exist_ok=True)\nos.mkdir('empty')",
    "open('data/sub/blob.bin', 'wb').write(bytes(range(256)) * 3)\nopen('run.sh', 'w').write('#!/bin/sh\\n')\n"
    "os.chmod('run.sh', 0o750)\nopen('ünï.txt', 'w').write('named')\nlog = open('log.txt', 'a')\n"
    "log.write('one\\n'); log.flush()",
    "token = os.urandom(8).hex()\nopen('token.txt', 'w').write(token)",  # another token when replayed
    "os.symlink('/etc/passwd', 'link')\nos.mkfifo('pipe')",  # not in a snapshot
]
PROBE = ("print(x, open('token.txt').read() == token, sorted(os.listdir('.')), oct(os.stat('run.sh').st_mode & 0o777),"
         " open('data/sub/blob.bin', 'rb').read() == bytes(range(256)) * 3, open('ünï.txt').read())\n"
         "log.write('two\\n'); log.flush(); print(open('log.txt').read().split())")


def _snapshot(http, sid: str) -> dict:
    resp = http.get(f"/sessions/{sid}/snapshot")
    assert resp.status_code == 200, resp.text
    return resp.json()


def _live(http) -> int:
    return http.get("/health").json()["live_sessions"]


def _tar_b64(*members: tuple[str, bytes, bytes]) -> str:
    """(name, tar type, data) -> a base64 tar, as a hostile client could send it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "/etc/passwd"
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return base64.b64encode(out.getvalue()).decode()


def test_a_restored_session_has_the_snapshots_files_exactly_and_its_state_replayed(http, session_kind):
    with python_session(http, session_kind, setup="prepared = 'by the setup'" if session_kind == "forked" else ""
                        ) as sid:
        for code in BUILD:
            assert cell(http, sid, code)["status"] == "ok"
        snap = _snapshot(http, sid)
        assert snap["files"] == 5 and snap["bytes"] == 768 + 10 + 5 + 4 + 16, snap["bytes"]
        assert sorted(snap["skipped"]) == ["link", "pipe"] and snap["replayable"]
        setup = ["prepared = 'by the setup'"] if session_kind == "forked" else []
        assert snap["cells"] == setup + BUILD  # a fork's log starts with its source's
        names = tarfile.open(fileobj=io.BytesIO(base64.b64decode(snap["workspace"]))).getnames()
        assert names == ["data", "data/sub", "data/sub/blob.bin", "empty", "log.txt", "run.sh", "token.txt", "ünï.txt"]

        resp = http.post("/sessions", json={"language": "python", "snapshot": snap})
        assert resp.status_code == 200, resp.text
        restored, info = resp.json()["session_id"], resp.json()["restore"]
        try:
            # the replay drew another token: its files differed, the snapshot's were laid down over them
            assert info == {"replayed_cells": len(setup) + 4, "diverged": True, "digest": snap["digest"], "files": 5}
            out = cell(http, restored, PROBE)
            assert out["status"] == "ok", out
            first, second = out["stdout"].splitlines()
            # x from the replay; token.txt is the snapshot's, so the replayed variable disagrees with it
            assert first == ("41 False ['data', 'empty', 'log.txt', 'run.sh', 'token.txt', 'ünï.txt'] 0o750 True "
                             "named")
            assert second == "['one', 'two']"  # the replayed cell's open log appends to the restored file
            assert _snapshot(http, restored)["cells"] == setup + BUILD + [PROBE]
        finally:
            http.delete(f"/sessions/{restored}")
        # into an existing session, with the files only: nothing replayed
        with python_session(http) as target:
            resp = http.post(f"/sessions/{target}/restore", json={"workspace": snap["workspace"]})
            assert resp.status_code == 200 and resp.json()["replayed_cells"] == 0, resp.text
            assert resp.json()["diverged"] is True  # an empty work dir is not the snapshot's
            assert _snapshot(http, target)["digest"] == snap["digest"]


def _tracked(http, sid: str, code: str) -> dict:
    resp = http.post(f"/sessions/{sid}/run", json={"code": code, "timeout": 5, "track_workspace": True})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_each_cell_says_whether_it_changed_the_work_dir(http):
    with python_session(http) as sid:
        assert cell(http, sid, "open('untracked.txt', 'w').close()")["workspace_changed"] is None  # not asked
        changed = [_tracked(http, sid, code)["workspace_changed"] for code in (
            "import os\nx = 1",  # the first cell: nothing to compare with
            "y = x + 1", "open('a.txt', 'w').write('a')", "print(open('a.txt').read())",
            "open('a.txt', 'a').write('b')", "os.utime('a.txt', (0, 0))", "os.chmod('a.txt', 0o600)",
            "os.mkdir('d')", "len(os.listdir('d'))", "os.rmdir('d')", "os.remove('a.txt')", "z = 3")]
        assert changed == [True, False, True, False, True, True, True, True, False, True, True, False]
        big = _tracked(http, sid, "open('big.bin', 'wb').write(b'0' * (7 << 20))")  # past snapshot_max_bytes (6 MiB)
        assert big["workspace_changed"] is None
        resp = http.get(f"/sessions/{sid}/snapshot")
        assert resp.status_code == 413 and "snapshot_max_bytes" in resp.json()["detail"], resp.text
        assert _tracked(http, sid, "os.remove('big.bin')")["workspace_changed"] is True
        many = _tracked(http, sid, "for i in range(1100):\n    open(f'f{i}', 'w').close()")
        assert many["workspace_changed"] is None
        assert "snapshot_max_files" in http.get(f"/sessions/{sid}/snapshot").json()["detail"]
        died = _tracked(http, sid, "import os\nos._exit(3)")
        assert died["restarted"] and died["workspace_changed"] is True  # a new interpreter, a new work dir


def test_replayed_cells_cannot_redirect_the_restored_files(http):
    """The replay plants symlinks where the snapshot has a directory and a file: laying the files down replaces
    them instead of writing through them."""
    plant = ("import os\nopen('/tmp/target', 'w').write('original')\nos.symlink('/tmp', 'd')\n"
             "os.symlink('/tmp/target', 'x')\nos.mkdir('m')\nos.symlink('/tmp', 'm/inner')")
    workspace = _tar_b64(("d/inner.txt", tarfile.REGTYPE, b"inside"), ("x", tarfile.REGTYPE, b"restored"),
                         ("m/inner/deep.txt", tarfile.REGTYPE, b"deep"))
    with python_session(http) as sid:
        resp = http.post(f"/sessions/{sid}/restore", json={"cells": [plant], "workspace": workspace})
        assert resp.status_code == 200 and resp.json()["diverged"] is True, resp.text
        out = cell(http, sid, "print(os.path.islink('d'), os.path.islink('x'), os.path.islink('m/inner'), "
                              "open('/tmp/target').read(), sorted(os.listdir('/tmp')), open('x').read(), "
                              "open('d/inner.txt').read(), open('m/inner/deep.txt').read())")
        assert out["stdout"] == "False False False original ['target'] restored inside deep\n", out


@pytest.mark.parametrize(("name", "kind", "status", "words"), [
    ("escape/../../evil.txt", tarfile.REGTYPE, 400, "not a relative path inside the work dir"),
    ("/etc/cron.d/evil", tarfile.REGTYPE, 400, "not a relative path inside the work dir"),
    ("evil", tarfile.SYMTYPE, 400, "is a symbolic link"),
    ("evil", tarfile.LNKTYPE, 400, "is a hard link"),
    ("evil", tarfile.CHRTYPE, 400, "is a character device"),
    ("evil", tarfile.FIFOTYPE, 400, "is a fifo"),
])
def test_a_hostile_tar_is_refused_before_any_session_is_touched(http, name, kind, status, words):
    data = b"boom" if kind == tarfile.REGTYPE else b""
    workspace = _tar_b64(("fine.txt", tarfile.REGTYPE, b"ok"), (name, kind, data))
    live = _live(http)
    resp = http.post("/sessions", json={"language": "python", "snapshot": {"workspace": workspace, "cells": ["1"]}})
    assert resp.status_code == status and words in resp.json()["detail"] and repr(name) in resp.json()["detail"]
    assert _live(http) == live  # no session was made
    with python_session(http) as sid:
        resp = http.post(f"/sessions/{sid}/restore", json={"workspace": workspace, "cells": ["x = 1"]})
        assert resp.status_code == status, resp.text
        out = cell(http, sid, "import os\nprint('x' in dir(), os.listdir('.'))")
        assert out["stdout"] == "False []\n", out  # nothing was replayed, nothing written
    assert_benign(http)


def test_restore_refusals_name_the_cause(http):
    live = _live(http)
    stuck = {"cells": ["import time\ntime.sleep(30)"], "timeout": 1}
    resp = http.post("/sessions", json={"language": "python", "snapshot": stuck})
    assert resp.status_code == 409 and "replayed cell 1 of 1 timed out" in resp.json()["detail"], resp.text
    assert _live(http) == live  # the half-restored session is gone
    resp = http.post("/sessions", json={"language": "python", "snapshot": {"cells": ["x = 1"], "replayable": False}})
    assert resp.status_code == 400 and "cells: []" in resp.json()["detail"]
    resp = http.post("/sessions", json={"language": "python", "snapshot": {"workspace": "%%%"}})
    assert resp.status_code == 400 and "snapshot.workspace: not valid base64" in resp.json()["detail"]
    assert http.get("/sessions/nope/snapshot").status_code == 404
    with python_session(http) as sid:  # a timed-out cell: the snapshot carries files only
        assert cell(http, sid, "open('f', 'w').write('1')\nimport time\ntime.sleep(30)", timeout=1)["status"] == \
            "timeout"
        snap = _snapshot(http, sid)
        assert snap["replayable"] is False and snap["cells"] == [] and snap["files"] == 1
        resp = http.post("/sessions", json={"language": "python", "snapshot": snap})
        assert resp.status_code == 200 and resp.json()["restore"]["replayed_cells"] == 0, resp.text
        http.delete(f"/sessions/{resp.json()['session_id']}")


def test_a_snapshot_counts_against_the_sessions_disk_and_not_the_services_memory():
    with sandbox_service("tmpfs_mb=4") as http:
        source, small = session(http), session(http)
        assert cell(http, source, "open('a.bin', 'wb').write(b'a' * (3 << 20))\n"
                                  "open('b.bin', 'wb').write(b'b' * (3 << 20))")["status"] == "error"  # 4 MB tmpfs
        assert cell(http, source, "import os\nos.remove('b.bin')")["status"] == "ok"
        snap = _snapshot(http, source)
        pid = http.get("/health").json()["pid"]
        before = _rss_kb(pid)
        for _ in range(6):
            assert _snapshot(http, source)["digest"] == snap["digest"]
        assert _rss_kb(pid) - before < 32 * 1024  # 6 x 3 MiB snapshots: the service kept none of them
        assert cell(http, small, "open('mine.bin', 'wb').write(b'm' * (2 << 20))")["status"] == "ok"
        # the lay-down removes what the snapshot does not hold (mine.bin) before it writes: 3 MiB fit in 4
        resp = http.post(f"/sessions/{small}/restore", json={"workspace": snap["workspace"]})
        assert resp.status_code == 200, resp.text
        big = base64.b64encode(_tar_bytes(5 << 20)).decode()
        resp = http.post(f"/sessions/{small}/restore", json={"workspace": big})
        assert resp.status_code == 409 and "No space left" in resp.json()["detail"], resp.text
        assert_benign(http)


def _tar_bytes(size: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("huge.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(b"h" * size))
    return out.getvalue()


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

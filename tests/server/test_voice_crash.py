"""Crash safety of the voice library, with real server processes (``tests/server/tiny_serve.py``:
the real HTTP app, service and on-disk store over tiny models) killed with SIGKILL.

After a restart: every voice listed is complete and speaks, no upload that got a 2xx is missing,
no delete that got a 2xx is undone, and nothing partial is visible (temporaries are hidden and
never listed). A crash at a chosen point of a write is made deterministic by the test-only
``CHORUS_TEST_HOLD_WRITES`` hook (chorus/atomic.py): the server announces that it reached the
point and waits there until it is killed. Also: a full disk (507, nothing left behind) and the
voice files' mode."""
from __future__ import annotations

import concurrent.futures
import errno
import io
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile

from chorus.voices.records import upload_hash
from chorus.voices.voice import Voice
from tests.engine.tiny_models import tiny
from tests.server.live import LiveServer, server_config, tiny_loader
from tests.voices.checkpoints import BASE_ENV
from tests.voices.front_ends import tiny_front_end

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def clip(seed: int, seconds: float = 6.0) -> bytes:
    """A distinct, voiced clip per seed (so each is its own voice)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(16_000 * seconds)) / 16_000
    wave = 0.3 * np.sin(2 * np.pi * (150 + 10 * seed) * t) + 0.02 * rng.standard_normal(t.size)
    buffer = io.BytesIO()
    soundfile.write(buffer, wave.astype(np.float32), 16_000, format="WAV")
    return buffer.getvalue()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """One server process over ``voices_dir`` (``prefix``: a command that wraps it)."""

    def __init__(self, voices_dir: Path, log: Path, prefix: list[str] | None = None, **env: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # none of the Chorus settings of this process, but the tests' scratch directory
        environment = {k: v for k, v in os.environ.items()
                       if not k.startswith(("CHORUS_", "HF_")) or k == BASE_ENV}
        environment.update(PYTHONPATH=str(ROOT), TQDM_DISABLE="1", **env)
        self._log = log.open("ab")
        command = [sys.executable, "-m", "tests.server.tiny_serve", str(voices_dir), str(self.port)]
        self.proc = subprocess.Popen([*(prefix or []), *command], stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=self._log, env=environment, cwd=ROOT)
        self.log_path = log

    def wait_ready(self, timeout: float = 180.0) -> "Process":
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"the server exited {self.proc.returncode}:\n{self.log_path.read_text()}"
            try:
                if httpx.get(f"{self.url}/ready", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not ready:\n{self.log_path.read_text()[-3000:]}"
            time.sleep(0.1)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()

    def upload(self, data: bytes, timeout: float = 60) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/voices", files={"file": ("clip.wav", data, "audio/wav")}, timeout=timeout)

    def delete(self, voice_id: str) -> httpx.Response:
        return httpx.delete(f"{self.url}/v1/voices/{voice_id}", timeout=60)

    def voices(self) -> list[str]:
        return [v["id"] for v in httpx.get(f"{self.url}/v1/voices", timeout=30).json()["data"] if v["id"] != "default"]


def _wait_for(path: Path, proc: Process, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.proc.poll() is None and time.monotonic() < deadline, proc.log_path.read_text()[-3000:]
        time.sleep(0.02)


def _check_library(server: Process, voices_dir: Path, must_have: set[str], must_not_have: set[str]) -> list[str]:
    """Every listed voice is complete and speaks; acknowledged uploads are there, acknowledged
    deletes are not; every visible file is whole (temporaries are hidden and never listed)."""
    listed = server.voices()
    assert must_have <= set(listed), (must_have, listed)
    assert not must_not_have & set(listed), (must_not_have, listed)
    for voice_id in listed:
        speech = httpx.post(f"{server.url}/v1/audio/speech", timeout=60, json={
            "model": "chatterbox-turbo", "input": "Hello.", "voice": voice_id, "response_format": "pcm"})
        assert speech.status_code == 200 and speech.content, speech.text
    for path in voices_dir.iterdir():
        if path.name.startswith("."):
            continue  # a temporary of an interrupted write: hidden, never listed
        if path.suffix == ".json":
            assert json.loads(path.read_text())["id"] == path.stem
        elif path.suffix == ".clip":
            assert upload_hash(path.read_bytes()).startswith(path.stem)  # whole: its content address holds
        else:
            Voice.load(path)  # whole, or this raises
    return listed


@pytest.fixture(scope="module")
def seeded(module_tmp_path_factory) -> tuple[Path, list[str]]:
    """A voices directory holding two voices, uploaded through a server that was then killed."""
    directory = module_tmp_path_factory.mktemp("seeded") / "voices"
    server = Process(directory, directory.parent / "log").wait_ready()
    try:
        ids = []
        for seed in (1, 2):
            response = server.upload(clip(seed))
            assert response.status_code == 201, response.text
            ids.append(response.json()["id"])
    finally:
        server.kill()
    return directory, ids


@pytest.mark.parametrize("point, action", [("blob-write", "upload"), ("blob-create", "upload"),
                                           ("blob-delete", "delete")])
def test_kill_9_at_each_step_of_a_write_leaves_a_whole_library(tmp_path, seeded, point, action):
    voices_dir = tmp_path / "voices"
    shutil.copytree(seeded[0], voices_dir)
    first, second = seeded[1]
    held = tmp_path / "held"
    server = Process(voices_dir, tmp_path / "log", CHORUS_TEST_HOLD_WRITES=str(held),
                     CHORUS_TEST_HOLD_POINT=point).wait_ready()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(server.upload, clip(3)) if action == "upload" else pool.submit(server.delete, first)
        _wait_for(held, server)  # the server is inside the write, at `point`
        assert held.read_text().strip() == point
        server.kill()
        with pytest.raises(httpx.HTTPError):
            pending.result()  # never acknowledged
    server = Process(voices_dir, tmp_path / "log").wait_ready()
    try:
        listed = _check_library(server, voices_dir, must_have={second}, must_not_have=set())
        assert len(listed) == 2 if action == "upload" else listed in ([second], [first, second])
        again = server.upload(clip(3)) if action == "upload" else server.delete(first)
        assert again.status_code in (200, 201), again.text  # an interrupted upload can simply be repeated
        if action == "upload":
            _check_library(server, voices_dir, must_have={second, again.json()["id"]}, must_not_have=set())
    finally:
        server.kill()


def test_kill_9_in_a_burst_of_uploads_and_deletes_loses_nothing_acknowledged(tmp_path, seeded):
    voices_dir = tmp_path / "voices"
    shutil.copytree(seeded[0], voices_dir)
    held = tmp_path / "held"
    # uploads are built and written one at a time: three publish their records, the fourth is
    # held just before publishing its own (its files written), and the rest wait behind it
    server = Process(voices_dir, tmp_path / "log", CHORUS_TEST_HOLD_WRITES=str(held),
                     CHORUS_TEST_HOLD_POINT="blob-create", CHORUS_TEST_HOLD_AFTER="3").wait_ready()
    acknowledged, deleted = set(seeded[1]), set()

    def upload(seed):
        response = server.upload(clip(seed))
        if response.status_code == 201:
            acknowledged.add(response.json()["id"])

    def delete(voice_id):
        if server.delete(voice_id).status_code == 200:
            deleted.add(voice_id)

    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        deleting = pool.submit(delete, seeded[1][0])
        uploads = [pool.submit(upload, seed) for seed in range(10, 18)]
        answered = concurrent.futures.as_completed(uploads, timeout=120)
        for _ in range(3):  # the three that passed the hold point answer; no other upload can
            next(answered).result()
        _wait_for(held, server)  # the fourth is inside its write: kill now
        assert held.read_text().strip() == "blob-create"
        server.kill()
        for future in [deleting, *uploads]:
            future.exception()  # the unanswered ones fail; the answered ones are recorded
    assert len(acknowledged - set(seeded[1])) == 3
    server = Process(voices_dir, tmp_path / "log").wait_ready()
    try:
        _check_library(server, voices_dir, must_have=acknowledged - deleted, must_not_have=deleted)
    finally:
        server.kill()


# ---- a full disk ----------------------------------------------------------------------------------

def _can_mount_tmpfs(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None or sys.platform != "linux":
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    result = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs '{probe}'"],
                            capture_output=True, timeout=30)
    return result.returncode == 0


def test_a_full_disk_is_a_507_and_leaves_nothing(tmp_path):
    """A real full file system: a 16 KiB tmpfs mounted in a private mount namespace (``unshare
    -rm``, no privileges needed where user namespaces are allowed; skipped elsewhere, and
    ``test_a_record_that_cannot_be_written_leaves_no_voice_file`` covers the same path with a
    seam). A voice file does not fit, so the write fails with ENOSPC."""
    if not _can_mount_tmpfs(tmp_path):
        pytest.skip("cannot mount a tmpfs in a private mount namespace here")
    voices_dir, listing, pid_file = tmp_path / "voices", tmp_path / "listing", tmp_path / "pid"
    voices_dir.mkdir()
    script = (f"mount -t tmpfs -o size=16k,mode=0700 tmpfs '{voices_dir}' || exit 97; "
              f"\"$@\" & echo $! > '{pid_file}'; wait $!; ls -A '{voices_dir}' > '{listing}'")
    server = Process(voices_dir, tmp_path / "log", prefix=["unshare", "-rm", "sh", "-c", script, "sh"]).wait_ready()
    try:
        response = server.upload(clip(5))
        assert response.status_code == 507, response.text
        error = response.json()["error"]
        assert error["code"] == "insufficient_storage" and "out of space" in error["message"]
        assert server.voices() == []
        assert server.upload(clip(5)).status_code == 507  # still serving, still refusing cleanly
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGTERM)  # the server, so the shell lists what is left
        server.proc.wait(60)
    assert listing.read_text().split() == []  # no voice file, no record, no temporary


def test_a_record_that_cannot_be_written_leaves_no_voice_file(tmp_path, monkeypatch):
    """A seam, not a full disk: the record's write raises OSError(ENOSPC) after the voice file
    was written, the case a small real file system cannot time."""
    from chorus.voices.blobs import DirectoryBlobs

    def full(self, name, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.root / name))

    monkeypatch.setattr(DirectoryBlobs, "create", full)
    config = server_config(tmp_path)
    with LiveServer(config, tiny_loader(config, front_end=tiny_front_end(tiny("turbo")[0]))) as live:
        response = live.client.post("/v1/voices", files={"file": ("clip.wav", clip(6), "audio/wav")})
        assert response.status_code == 507 and response.json()["error"]["code"] == "insufficient_storage"
        assert live.client.get("/v1/voices").json()["data"][1:] == []
    assert list(tmp_path.iterdir()) == []


def test_voice_files_and_records_are_private_to_the_server_user(tmp_path):
    config = server_config(tmp_path)
    with LiveServer(config, tiny_loader(config, front_end=tiny_front_end(tiny("turbo")[0]))) as live:
        response = live.client.post("/v1/voices", files={"file": ("clip.wav", clip(7), "audio/wav")})
        assert response.status_code == 201
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert len(modes) == 3 and set(modes.values()) == {0o600}, modes  # record, clip, voice file

"""``chorus serve`` through the real command line, in a subprocess, over a light checkpoint
(tokenizer files and empty weight stand-ins): loading fails, and the server must stay up and say
why. Also: settings from the environment, JSON logs, clean stops on SIGTERM and SIGINT, every
setting has a flag, and a bad flag value is a one-line error."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from chorus.server.config import field_names
from tests.voices.checkpoints import light_checkpoint

ROOT = Path(__file__).resolve().parents[2]
EMPTY_WEIGHTS = ("t3_turbo_v1.safetensors", "s3gen_meanflow.safetensors", "ve.safetensors")


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without CHORUS_* settings, running this checkout's code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHORUS_", "HF_"))}
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TQDM_DISABLE="1", **extra)
    return env


def _chorus(*args: str) -> list[str]:
    # `-m chorus.cli` from the checkout, not the console script: that one runs the installed copy
    return [sys.executable, "-m", "chorus.cli", *args]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A ``chorus serve`` process; its stderr goes to a file (``log()``)."""

    def __init__(self, args: list[str], env: dict[str, str], port: int, log_path: Path):
        self.port, self.log_path = port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(_chorus("serve", *args), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._log, env=env, cwd=ROOT)

    def wait_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"chorus serve exited {self.proc.returncode}:\n{self.log()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            assert time.monotonic() < deadline, f"chorus serve did not answer /health:\n{self.log()}"
            time.sleep(0.1)

    def wait_state(self, state: str, timeout: float = 60.0) -> httpx.Response:
        deadline = time.monotonic() + timeout
        while True:
            ready = httpx.get(f"{self.url}/ready", timeout=5.0)
            if ready.json()["state"] == state:
                return ready
            assert time.monotonic() < deadline, f"state {ready.json()}, not {state}:\n{self.log()}"
            time.sleep(0.1)

    def stop(self, sig: int, timeout: float = 10.0) -> tuple[int, float]:
        started = time.monotonic()
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        return code, time.monotonic() - started

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@contextlib.contextmanager
def serving(tmp_path: Path, checkpoint: str, *flags: str, **env: str):
    """``chorus serve --checkpoint ...`` on a free port given by ``CHORUS_PORT`` (unless a flag
    names one), up and answering /health; killed on the way out whatever happened."""
    port = _free_port()
    environment = _env(CHORUS_PORT=str(port), **env)
    args = ["--checkpoint", checkpoint, "--voices-dir", str(tmp_path / "voices"), *flags]
    served = Served(args, environment, port, tmp_path / f"serve-{port}.log")
    try:
        served.wait_up()
        yield served
    finally:
        served.close()


@pytest.fixture(scope="module")
def light_turbo(module_tmp_path_factory) -> str:
    return light_checkpoint("turbo", module_tmp_path_factory.mktemp("turbo"))


@pytest.fixture(scope="module")
def failed_server(module_tmp_path_factory, light_turbo):
    """One server over the light checkpoint: port and max_queue from the environment, JSON logs
    from the flag."""
    with serving(module_tmp_path_factory.mktemp("served"), light_turbo, "--log-format", "json",
                 CHORUS_MAX_QUEUE="17") as served:
        served.wait_state("failed")
        yield served


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_the_server_stays_up_and_healthy_when_loading_fails(failed_server):
    assert httpx.get(f"{failed_server.url}/health", timeout=5).json() == {"status": "ok"}


def test_ready_says_failed_and_names_the_bad_file(failed_server):
    ready = httpx.get(f"{failed_server.url}/ready", timeout=5)
    body = ready.json()
    assert ready.status_code == 503 and body["ready"] is False and body["state"] == "failed"
    assert any(name in body["reason"] for name in EMPTY_WEIGHTS), body


def test_speech_is_refused_as_not_ready(failed_server):
    response = httpx.post(f"{failed_server.url}/v1/audio/speech", json={"model": "turbo", "input": "Hi."}, timeout=10)
    assert response.status_code == 503 and response.json()["error"]["code"] == "not_ready"
    assert "Retry-After" in response.headers


def test_settings_from_the_environment_reach_the_server(failed_server):
    # the port came from CHORUS_PORT (the server answers there); max_queue from CHORUS_MAX_QUEUE
    starting = next(line for line in _json_lines(failed_server.log()) if line["message"] == "starting")
    assert starting["config"]["port"] == failed_server.port and starting["config"]["max_queue"] == 17
    assert starting["config"]["checkpoint"] and starting["config"]["api_keys"] == "0 key(s)"


def test_log_format_json_writes_json_lines_to_stderr(failed_server):
    # an API call (probes are logged at debug level): 503 not_ready, since the model failed to load
    httpx.get(f"{failed_server.url}/v1/models", headers={"X-Request-Id": "cli-test-1"}, timeout=5)
    deadline = time.monotonic() + 10
    while "cli-test-1" not in failed_server.log():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    lines = _json_lines(failed_server.log())  # every line parses
    assert len(lines) >= 4 and all({"ts", "level", "logger", "message"} <= set(line) for line in lines)
    failure = next(line for line in lines if line["message"] == "start-up failed")
    assert failure["level"] == "error" and "Traceback" in failure["exc"]
    access = next(line for line in lines if line.get("request_id") == "cli-test-1")
    assert access["message"] == "GET /v1/models 200" and access["status"] == 200


@pytest.mark.parametrize("sig, codes", [(signal.SIGTERM, {0, -signal.SIGTERM}), (signal.SIGINT, {0, 130})])
def test_the_server_stops_cleanly_on_a_signal(tmp_path, light_turbo, sig, codes):
    # uvicorn shuts down gracefully, then re-raises the signal it caught: SIGTERM ends the
    # process by that signal (as supervisors expect), SIGINT ends it as Ctrl-C does everywhere
    # in the CLI (exit 130), or with 0 where SIGINT was ignored when the process started
    with serving(tmp_path, light_turbo, "--log-format", "json") as served:
        served.wait_state("failed")
        code, took = served.stop(sig)
        log = served.log()
    assert code in codes and took < 5, (code, took, log)
    lines = _json_lines(log.replace("chorus: interrupted", ""))  # nothing but JSON lines, no stray traceback
    assert "Application shutdown complete." in [line["message"] for line in lines]
    assert [line["message"] for line in lines if line["level"] in ("error", "critical")] == ["start-up failed"]


def test_help_lists_a_flag_for_every_setting():
    result = subprocess.run(_chorus("serve", "--help"), capture_output=True, text=True, timeout=60, env=_env(),
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    missing = [name for name in field_names() if f"--{name.replace('_', '-')}" not in result.stdout]
    assert not missing and "--config" in result.stdout
    assert "--no-warmup" in result.stdout and "CHORUS_MAX_QUEUE" in result.stdout


@pytest.mark.parametrize("flags, message", [
    (["--port", "0"], "port must be in 1..65535"),
    (["--max-queue", "abc"], "max_queue must be an integer"),
    (["--log-format", "xml"], "log_format must be"),
    (["--voices-url", "nope://bucket/voices"], "fsspec knows no 'nope' protocol"),
])
def test_a_bad_flag_value_exits_2_with_one_line(tmp_path, flags, message):
    result = subprocess.run(_chorus("serve", "--voices-dir", str(tmp_path), *flags), capture_output=True, text=True,
                            timeout=60, env=_env(), cwd=ROOT)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("chorus: error:") and message in lines[0]


def test_a_bad_env_value_exits_2_with_one_line():
    result = subprocess.run(_chorus("serve"), capture_output=True, text=True, timeout=60,
                            env=_env(CHORUS_WARMUP="perhaps"), cwd=ROOT)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "warmup must be true or false" in lines[0], result.stderr


def test_help_gives_each_setting_one_default():
    result = subprocess.run(_chorus("serve", "--help"), capture_output=True, text=True, timeout=60, env=_env(),
                            cwd=ROOT)
    blocks = [" ".join(block.split()) for block in re.split(r"\n  (?=--)", result.stdout)]
    twice = [block for block in blocks if block.count("default:") > 1]
    assert not twice, twice
    checkpoint = next(block for block in blocks if block.startswith("--checkpoint"))
    assert "official repo" in checkpoint and "env CHORUS_CHECKPOINT" in checkpoint

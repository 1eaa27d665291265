"""The quick start's scripts, run with bash as a user runs them (CHORUS_SERVE_DRY_RUN=1: what
serve.sh would serve and run, without installing anything)."""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def serve_plan(*args: str, **env: str) -> dict[str, str]:
    """serve.sh's dry run: {"would serve on": ..., "voices": ..., "command": ...}."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CHORUS_")}
    result = subprocess.run(["bash", "scripts/serve.sh", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, env={**clean, "CHORUS_SERVE_DRY_RUN": "1", **env})
    assert result.returncode == 0, result.stderr
    plan = {}
    for line in result.stdout.splitlines():
        key, _, value = line.partition(": ") if not line.startswith("would serve on ") else (
            "would serve on", "", line.removeprefix("would serve on "))
        plan[key] = value
    return plan


@pytest.mark.parametrize("args, env, url", [
    ((), {}, "http://127.0.0.1:8000"),
    (("--port", "9000"), {}, "http://127.0.0.1:9000"),
    (("--port=9001",), {}, "http://127.0.0.1:9001"),
    ((), {"CHORUS_PORT": "7000"}, "http://127.0.0.1:7000"),
    (("--port", "9000"), {"CHORUS_PORT": "7000"}, "http://127.0.0.1:9000"),  # the flag wins, as in chorus serve
    (("--host", "0.0.0.0", "--port", "9002"), {}, "http://127.0.0.1:9002"),
])
def test_serve_sh_prints_the_url_it_serves_on(args, env, url):
    plan = serve_plan(*args, **env)
    assert plan["would serve on"] == url
    assert plan["command"].endswith(" ".join(args)) and "--log-format text" in plan["command"]


def _ignored(path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0


def test_serve_sh_keeps_voices_in_a_git_ignored_state_dir():
    voices = serve_plan()["voices"]
    assert voices == ".chorus/voices" and _ignored(f"{voices}/0123abcd.safetensors")
    assert _ignored("voices/0123abcd.json")  # chorus serve's own default, run from the repository root


@pytest.mark.parametrize("args, env, voices", [
    (("--voices-dir", "/srv/voices"), {}, "set by the arguments or the config file"),
    (("--config", "chorus.toml"), {}, "set by the arguments or the config file"),
    ((), {"CHORUS_VOICES_DIR": "/srv/v"}, "/srv/v"),
])
def test_serve_sh_leaves_a_chosen_voices_dir_alone(args, env, voices):
    assert serve_plan(*args, **env)["voices"] == voices


CONFLICTS = ("ERROR: pip's dependency resolver does not currently take into account all the packages that are "
             "installed. This behaviour is the source of the following dependency conflicts.")


def _stub_venv(tmp_path: Path, pip_exit: int = 0, name: str = "venv") -> Path:
    """A virtual environment whose python only makes noise (and fails pip with ``pip_exit``;
    installing the oracle's requirements, it reports pip's dependency conflicts as pip does): the
    install scripts' own output is what is tested, not pip."""
    venv = tmp_path / name
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/usr/bin/env bash\n"
                      'echo "pip noise: $*"; echo "more pip noise" >&2\n'
                      f'[[ "$*" == *"oracle-requirements"* ]] && echo "{CONFLICTS}" >&2\n'
                      f'[[ "$*" == *"install -e ."* ]] && exit {pip_exit}\n'
                      "exit 0\n")
    python.chmod(0o755)
    return venv


def _install(venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/install-product-env.sh", str(venv)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_install_says_each_step_and_keeps_pip_output_in_a_log(tmp_path):
    venv = _stub_venv(tmp_path)
    result = _install(venv)
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert "noise" not in out
    assert all(f"[{n}/3]" in out for n in (1, 2, 3)) and f"{venv}/install.log" in out
    assert "pip noise: -m pip install -e ." in (venv / "install.log").read_text()


def test_the_test_install_says_each_step_and_explains_the_expected_conflicts(tmp_path):
    venv = _stub_venv(tmp_path, name="venv-test")
    result = subprocess.run(["bash", "scripts/install-test-env.sh", str(venv)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert "noise" not in out and "ERROR" not in out  # pip's output is in the log
    assert all(f"[{n}/6]" in out for n in range(1, 7)) and f"{venv}/install.log" in out
    assert "dependency conflicts" in out and "expected" in out and "on purpose" in out
    assert out.strip().endswith(f"test environment ready in {venv}")
    assert CONFLICTS in (venv / "install.log").read_text()


def test_a_failed_install_step_shows_the_end_of_its_log(tmp_path):
    venv = _stub_venv(tmp_path, pip_exit=3)
    result = _install(venv)
    assert result.returncode == 3
    assert "FAILED" in result.stderr and "pip noise: -m pip install -e ." in result.stderr


def test_serve_sh_names_the_playground():
    assert serve_plan("--port", "9000")["playground"] == "http://127.0.0.1:9000/"


def _announce(url: str, pid: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/announce-ready.sh", url, str(pid)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("playground", [True, False])
def test_serve_sh_says_where_to_try_the_server_once_it_is_ready(playground, tmp_path):
    """scripts/announce-ready.sh (serve.sh runs it beside the server) against a real server."""
    from tests.server.live import LiveServer, server_config, tiny_loader

    config = server_config(tmp_path / "voices", playground=playground)
    with LiveServer(config, tiny_loader(config)) as server:
        result = _announce(server.url, os.getpid())
        assert result.returncode == 0, result.stderr
        assert (server.client.get("/").status_code == 200) is playground
    api = f"{server.url}/v1/audio/speech"
    expected = (f"ready: open {server.url}/ in a browser to try it (the playground), or send requests to {api}"
                if playground else f"ready: send requests to {api}")
    assert result.stdout.strip() == expected


def test_the_ready_announcement_gives_up_quietly_when_the_server_ends():
    ended = subprocess.Popen(["true"])
    ended.wait()
    with socket.socket() as s:  # nobody listens there
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    result = _announce(url, ended.pid)
    assert result.returncode == 0 and result.stdout == "", result.stdout

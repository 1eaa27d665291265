"""The container image (Containerfile), built and run with podman by scripts/container.sh: the
CPU image serves the quick start's random-weight checkpoint, speaks, takes a voice upload and
drains on SIGTERM (the script's `test` says what it checks). Marker ``container``: skipped where
podman is missing, except under ``CHORUS_REQUIRE_CONTAINER=1`` (``.ci/run --container``). The
build takes 4-9 minutes and the run 2-3 on 2 CPU cores; the default CI run leaves it out."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import missing

pytestmark = [pytest.mark.container, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]


def _container_sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/container.sh", command], cwd=ROOT, capture_output=True, text=True,
                          timeout=1500)


@pytest.fixture(scope="module")
def image():
    if shutil.which("podman") is None:
        missing("CHORUS_REQUIRE_CONTAINER", "podman is not installed: apt-get install podman runc debootstrap")
    built = _container_sh("build")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]


def test_the_image_serves_speech_and_voices_and_drains_on_sigterm(image):
    result = _container_sh("test")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "drained and exited 0" in result.stdout

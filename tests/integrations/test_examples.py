"""The examples under examples/ run against a real server and write the speech they say they do."""
from __future__ import annotations

import importlib.util
import wave
from pathlib import Path

import pytest

from tests.integrations.conftest import KEY

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, framework", [("pipecat_tts", "pipecat"), ("livekit_tts", "livekit.agents")])
def test_an_example_speaks_into_a_wav_file(server, tmp_path, name, framework):
    pytest.importorskip(framework)
    out = tmp_path / "reply.wav"
    seconds = load(name).main(["--url", server.url, "--api-key", KEY, "--seed", "7", "--text", "Hello there, friend.",
                               "--out", str(out)])
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 24_000 and wav.getnframes() / 24_000 == pytest.approx(seconds, abs=1e-3)
    assert seconds > 0.5

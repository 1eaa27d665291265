"""One real server for this package's tests (uvicorn on loopback, the tiny random turbo models, an
API key), the turns they speak, and the agent frameworks they run."""
from __future__ import annotations

import importlib

import pytest

from chorus.integrations.ws_client import StreamConfig
from tests.conftest import missing
from tests.server.live import TOKENS, LiveServer, metric, server_config, tiny_loader

# A random model speaks each text chunk until its token cap. A short turn's chunks stop at TOKENS
# (about half a second of audio each); an interrupted turn's at LONG_TOKENS, so its first piece is
# still being generated (about a second more on a CPU) when its first audio arrives, and the
# interruption has audio to stop.
LONG_TOKENS = 200
SHORT = StreamConfig(model="chatterbox-turbo", seed=7, max_new_tokens=TOKENS)
LONG = StreamConfig(model="chatterbox-turbo", seed=7, max_new_tokens=LONG_TOKENS)
REPLY = ["Hello ", "there, ", "how are ", "you ", "today? ", "I am ", "fine."]
KEY = "integrations-test-key"
INTERRUPTED_REPLY = ["This reply ", "is long, ", "and the user ", "will interrupt ", "it. ", "It goes ", "on"]


def import_framework(*modules: str) -> None:
    """Import an agent framework's modules that a test module uses (``scripts/install-test-env.sh``
    installs both frameworks); where one does not import, the test module is skipped, or fails
    under ``CHORUS_REQUIRE_FRAMEWORKS=1`` (CI)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            missing("CHORUS_REQUIRE_FRAMEWORKS", f"{module} does not import ({exc}); "
                    "scripts/install-test-env.sh installs the agent frameworks")


@pytest.fixture(scope="package")
def server(session_tmp_path_factory):
    config = server_config(session_tmp_path_factory.mktemp("voices"), max_new_tokens=LONG_TOKENS, api_keys=(KEY,))
    with LiveServer(config, tiny_loader(config), api_key=KEY) as live:
        yield live


@pytest.fixture(scope="package")
def idle_server(session_tmp_path_factory):
    """A server that closes a connection after half a second without a message or a turn."""
    config = server_config(session_tmp_path_factory.mktemp("voices"), api_keys=(KEY,), ws_idle_timeout_s=0.5)
    with LiveServer(config, tiny_loader(config), api_key=KEY) as live:
        yield live


def ws_turns(server: LiveServer, outcome: str) -> float:
    """``chorus_ws_turns_total{outcome}`` on the server's /metrics."""
    return metric(server.client.get("/metrics").text, "chorus_ws_turns_total", f'outcome="{outcome}"')

"""A headless Chromium for the playground's tests (and its screenshot): the system's ``chromium``
(Debian's package; Playwright's own browser download is not used), driven by Playwright, and a
live server over the tiny random models with an API key, as the page sees a real one."""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from tests.engine.tiny_models import tiny
from tests.server.live import LiveServer, server_config, tiny_loader
from tests.voices.front_ends import tiny_front_end

KEY = "playground-key-1"
# WebAudio starts on the click that makes the AudioContext; the flag spares a headless browser
# without an audio device any doubt about it.
CHROMIUM_ARGS = ["--autoplay-policy=no-user-gesture-required"]


def chromium_path() -> str | None:
    """The system's Chromium binary, or None (``CHORUS_CHROMIUM`` names another)."""
    return os.environ.get("CHORUS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def headless_chromium(executable: str):
    """A Playwright ``Browser`` over ``executable``, closed on the way out."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def playground_server(voices_dir: Path, **overrides) -> LiveServer:
    """A live server with an API key and a voice front end (uploads work)."""
    config = server_config(voices_dir, api_keys=(KEY,), **overrides)
    return LiveServer(config, tiny_loader(config, front_end=tiny_front_end(tiny("turbo")[0])), api_key=KEY)

"""The playground page (chorus/server/playground) in a real browser: headless Chromium driven by
Playwright against a live server on loopback (tiny random models, an API key). Each test waits on
what the page shows (its elements' text and data attributes), never on time. Skipped where no
chromium binary is found, except under ``CHORUS_REQUIRE_BROWSER=1`` (CI), where that is an error.
Also ``chorus serve --no-playground`` through the command line."""
from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.conftest import DATA_DIR, missing
from tests.server.browser import KEY, chromium_path, headless_chromium, playground_server
from tests.server.live import EnginePause, metric
from tests.server.test_serve_cli import serving
from tests.voices.checkpoints import light_checkpoint

CLIP = Path(DATA_DIR) / "sample-01.mp3"
WAIT_MS = 20_000  # the longest any single wait on the page may take


@pytest.fixture(scope="module")
def browser():
    executable = chromium_path()
    if executable is None:
        missing("CHORUS_REQUIRE_BROWSER", "no chromium binary on PATH (apt-get install chromium)")
    with headless_chromium(executable) as launched:
        yield launched


@pytest.fixture(scope="module")
def server(module_tmp_path_factory):
    with playground_server(module_tmp_path_factory.mktemp("voices")) as live:
        yield live


@pytest.fixture
def page(browser, server):
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    context = browser.new_context()
    opened = context.new_page()
    opened.set_default_timeout(WAIT_MS)
    opened.goto(server.url + "/")
    yield opened
    context.close()


def _sign_in(page) -> None:
    """Type the key and load the models and voices."""
    from playwright.sync_api import expect

    page.get_by_label("API key", exact=True).fill(KEY)
    page.get_by_role("button", name="Load models and voices", exact=True).click()
    expect(page.get_by_label("Model", exact=True)).to_have_value("chatterbox-turbo")
    expect(page.locator("#error")).to_be_hidden()


@pytest.mark.timeout(30)
def test_the_page_is_served_with_a_strict_content_policy(server):
    page = httpx.get(server.url + "/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"] and "<title>Chorus playground" in page.text
    for script in ("playground.js", "load.js"):  # the page's module and the one it imports
        served = httpx.get(f"{server.url}/playground/{script}", timeout=10)
        assert served.status_code == 200 and served.headers["content-type"].startswith("text/javascript")
    assert httpx.get(server.url + "/playground/nothing.js", timeout=10).json()["error"]["code"] == "not_found"


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_a_missing_api_key_shows_the_servers_error(page):
    from playwright.sync_api import expect

    # the page loads models and voices at once, without a key: the server's 401 is shown
    expect(page.get_by_role("alert")).to_contain_text("401 invalid_api_key: missing or invalid API key")


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_the_key_lists_the_models_and_voices(page):
    from playwright.sync_api import expect

    _sign_in(page)
    expect(page.get_by_label("Voice", exact=True)).to_have_value("default")
    assert page.locator("#model option").all_inner_texts() == ["chatterbox-turbo", "turbo"]


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_an_uploaded_clip_becomes_the_selected_voice(page, server):
    from playwright.sync_api import expect

    _sign_in(page)
    page.get_by_label("Voice clip (a few seconds of one speaker)", exact=True).set_input_files(CLIP)
    page.get_by_label("Name", exact=True).fill("uploaded in the page")
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.locator("#status")).to_contain_text("added and selected")
    stored = {v["name"]: v["id"] for v in server.client.get("/v1/voices").json()["data"]}
    expect(page.get_by_label("Voice", exact=True)).to_have_value(stored["uploaded in the page"])


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_speech_is_streamed_and_decoded_in_the_page(page):
    from playwright.sync_api import expect

    _sign_in(page)
    page.get_by_label("Text", exact=True).fill("Hello there. This is the playground speaking.")
    page.get_by_role("button", name="Speak", exact=True).click()
    expect(page.locator("#turn")).to_have_attribute("data-state", "done")
    decoded = page.locator("#decoded")
    samples, audio_bytes = int(decoded.get_attribute("data-samples")), int(decoded.get_attribute("data-bytes"))
    # every byte of 16-bit audio was decoded into AudioBuffers, as much audio as the server says it sent
    assert samples > 0 and audio_bytes == 2 * samples
    assert abs(samples / 24_000 - float(decoded.get_attribute("data-audio-seconds"))) < 0.01
    expect(page.locator("#ttfa")).to_have_text(re.compile(r"^\d+ ms after the text was sent$"))
    expect(page.get_by_role("alert")).to_be_hidden()


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_stop_cancels_the_turn(page, server):
    from playwright.sync_api import expect

    def cancelled_turns() -> float:
        return metric(server.client.get("/metrics").text, "chorus_ws_turns_total", 'outcome="cancelled"')

    _sign_in(page)
    before = cancelled_turns()
    with EnginePause(server) as pause:  # the turn's first T3 step waits until the test lets it go
        page.get_by_role("button", name="Speak", exact=True).click()
        expect(page.locator("#turn")).to_have_attribute("data-state", "speaking")  # its text was sent
        assert pause.entered.wait(WAIT_MS / 1000), "the turn never reached the engine"
        page.get_by_role("button", name="Stop", exact=True).click()
        expect(page.locator("#turn")).to_have_attribute("data-state", re.compile("cancelling|cancelled"))
    # the server's `cancelled` event: the page sent `cancel` on the open connection
    expect(page.locator("#turn")).to_have_attribute("data-state", "cancelled")
    assert cancelled_turns() == before + 1
    assert page.locator("#decoded").get_attribute("data-samples") == "0"
    expect(page.get_by_role("alert")).to_be_hidden()


def _deleted_voice(page, server) -> tuple[str, list[str]]:
    """A voice the page lists, deleted by another client before it is spoken with."""
    clip = (Path(DATA_DIR) / "sample-01-02.flac").read_bytes()
    voice = server.client.post("/v1/voices", files={"file": ("clip.flac", clip, "application/octet-stream")},
                               data={"name": "soon gone"}).json()["id"]
    page.get_by_role("button", name="Load models and voices", exact=True).click()
    page.get_by_label("Voice", exact=True).select_option(voice)
    assert server.client.delete(f"/v1/voices/{voice}").status_code == 200
    return "Hello there.", ["400 voice_not_found", voice]


def _text_over_the_buffer(page, server) -> tuple[str, list[str]]:
    """More text than a turn may hold unsent (the error names the turn; its flush then fails too)."""
    words = "word " * (server.config.ws_text_buffer_chars // 5 + 1)
    return words, ["413 text_buffer_full", "turn-1"]


@pytest.mark.browser
@pytest.mark.timeout(60)
@pytest.mark.parametrize("cause", [_deleted_voice, _text_over_the_buffer], ids=["unknown_voice", "text_too_long"])
def test_an_error_event_from_the_server_is_shown(page, server, cause):
    from playwright.sync_api import expect

    _sign_in(page)
    text, shown = cause(page, server)
    page.get_by_label("Text", exact=True).fill(text)
    page.get_by_role("button", name="Speak", exact=True).click()
    for part in shown:
        expect(page.get_by_role("alert")).to_contain_text(part)
    expect(page.locator("#turn")).to_have_attribute("data-state", re.compile("error|closed"))


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_the_servers_load_is_shown(page):
    from playwright.sync_api import expect

    expect(page.locator("#ready")).to_have_text("ready")
    expect(page.locator("#degradation")).to_have_text("0 of 3")
    expect(page.locator("#in-flight")).to_have_text(re.compile(r"^\d+$"))


@pytest.mark.timeout(60)
def test_no_playground_turns_the_page_off(tmp_path):
    with serving(tmp_path, light_checkpoint("turbo", tmp_path / "turbo"), "--no-playground") as served:
        page = httpx.get(served.url + "/", timeout=10)
        asset = httpx.get(served.url + "/playground/playground.js", timeout=10)
    assert page.status_code == 404 and page.json()["error"]["code"] == "not_found"
    assert asset.status_code == 404

"""The playground page (chorus/server/playground) in a real browser: headless Chromium driven by
Playwright against a live server on loopback (tiny random models, an API key). Each test waits on
what the page shows (its elements' text and data attributes), never on time. Skipped where no
chromium binary is found, except under ``CHORUS_REQUIRE_BROWSER=1`` (CI), where that is an error.
Also ``chorus serve --no-playground`` through the command line, and the word timestamps toggle
(the WebSocket's ``timestamps`` events, each word highlighted as it plays)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.conftest import DATA_DIR, missing
from tests.server.browser import KEY, chromium_path, headless_chromium, playground_server
from tests.server.live import TOKENS, EnginePause, aligned_live_server, metric
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


@pytest.fixture(scope="module")
def long_server(module_tmp_path_factory):
    """Four times the speech per chunk (about 2 s): words long enough to watch each one play."""
    with playground_server(module_tmp_path_factory.mktemp("voices-long"), max_new_tokens=4 * TOKENS) as live:
        yield live


@pytest.fixture(scope="module")
def aligned_server(module_tmp_path_factory):
    """An original T3 with the alignment heads on a server that keeps them (no API key)."""
    with aligned_live_server(module_tmp_path_factory.mktemp("voices-aligned")) as live:
        yield live


@pytest.fixture
def open_page(browser):
    """``open_page(server)``: the playground of a live server in a browser context of its own."""
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    contexts = []

    def opened(server):
        contexts.append(browser.new_context())
        page = contexts[-1].new_page()
        page.set_default_timeout(WAIT_MS)
        page.goto(server.url + "/")
        return page

    yield opened
    for context in contexts:
        context.close()


@pytest.fixture
def page(open_page, server):
    return open_page(server)


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
    for script in ("playground.js", "words.js", "load.js"):  # the page's module and the two it imports
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


# -- word timestamps ---------------------------------------------------------------------------------
TIMED = "Hello there. This is the playground speaking."
# longer than the server's longest piece (ws_chunk_max_chars, 160): a turn of two pieces or more,
# so words come in several timestamps events
PIECES = ("The first sentence of this reply is long enough to fill a good part of a piece on its own. "
          "The second sentence keeps going, so that the server has to cut the reply in two. And a third ends it.")


def _speak_timed(page, text: str = TIMED) -> tuple[list, list]:
    """Speak ``text`` with the timestamps toggle on; the JSON messages the page sent over the
    WebSocket and those it received, as they are by then (both lists keep growing)."""
    sent, received = [], []

    def on_received(payload):
        if isinstance(payload, str):  # an event; binary frames hold audio
            received.append(json.loads(payload))

    def watch(ws):
        ws.on("framesent", lambda payload: sent.append(json.loads(payload)))
        ws.on("framereceived", on_received)

    page.on("websocket", watch)
    page.get_by_label("Text", exact=True).fill(text)
    page.get_by_label("Word timestamps", exact=True).check()
    page.get_by_role("button", name="Speak", exact=True).click()
    return sent, received


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_the_timestamps_toggle_asks_for_word_timings_and_lists_every_word(page):
    from playwright.sync_api import expect

    _sign_in(page)
    sent, received = _speak_timed(page, PIECES)
    expect(page.locator("#turn")).to_have_attribute("data-state", "done")
    assert sent[0] == {"type": "config", "model": "chatterbox-turbo", "voice": "default", "response_format": "pcm",
                       "timestamps": "word"}
    assert len([m for m in received if m["type"] == "timestamps"]) >= 2  # the words of several pieces
    expect(page.locator("#words .word")).to_have_text(PIECES.split())
    expect(page.get_by_role("alert")).to_be_hidden()


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_the_words_times_run_in_order_through_the_turns_audio(page):
    from playwright.sync_api import expect

    _sign_in(page)
    _speak_timed(page, PIECES)
    expect(page.locator("#turn")).to_have_attribute("data-state", "done")
    expect(page.locator("#words .word")).to_have_count(len(PIECES.split()))
    times = page.locator("#words .word").evaluate_all("(words) => words.map((w) => [+w.dataset.start, +w.dataset.end])")
    audio_seconds = float(page.locator("#decoded").get_attribute("data-audio-seconds"))
    # a later piece's words start after the audio of the pieces before it, all within the turn's audio
    ended = 0.0
    for start, end in times:
        assert ended - 1e-4 <= start < end <= audio_seconds + 1e-4, (times, audio_seconds)
        ended = end
    assert ended > audio_seconds / 2


@pytest.mark.browser
@pytest.mark.timeout(90)
@pytest.mark.parametrize("served, method", [("server", "estimate"), ("aligned_server", "alignment")],
                         ids=["turbo", "original_with_alignment"])
def test_the_timings_method_is_shown_next_to_the_words(open_page, request, served, method):
    from playwright.sync_api import expect

    server = request.getfixturevalue(served)
    page = open_page(server)
    if server.config.api_keys:
        _sign_in(page)
    expect(page.get_by_label("Model", exact=True)).not_to_have_value("")
    _speak_timed(page)
    expect(page.locator("#timing-method")).to_have_attribute("data-method", method)
    expect(page.locator("#timing-method")).to_contain_text(method)
    expect(page.locator("#turn")).to_have_attribute("data-state", "done")


@pytest.mark.browser
@pytest.mark.timeout(90)
def test_the_highlighted_word_follows_playback_to_the_last_word(open_page, long_server):
    from playwright.sync_api import expect

    page = open_page(long_server)
    _sign_in(page)
    # every word that becomes the current one, in order (a record of the page, not a sample of it)
    page.evaluate("""() => {
        window.highlighted = [];
        const words = document.getElementById("words");
        new MutationObserver((records) => {
            for (const record of records) {
                if (record.target.getAttribute("aria-current") === "true") {
                    window.highlighted.push([...words.children].indexOf(record.target));
                }
            }
        }).observe(words, { subtree: true, attributeFilter: ["aria-current"] });
    }""")
    # the page's clock is held until the turn is done, so that playback cannot outrun the server
    # (a piece's timings follow its audio: a slow machine would otherwise play a piece before its
    # words came, and no word of it would be highlighted)
    page.evaluate("""() => {
        const resume = AudioContext.prototype.resume;
        window.releaseAudio = () => resume.call(window.heldAudio);
        AudioContext.prototype.resume = function () { window.heldAudio = this; return this.suspend(); };
    }""")
    _speak_timed(page, PIECES)
    expect(page.locator("#turn")).to_have_attribute("data-state", "done")
    assert page.evaluate("() => window.heldAudio.state") == "suspended"
    assert page.evaluate("() => window.highlighted") == []
    page.evaluate("() => window.releaseAudio()")
    last = len(PIECES.split()) - 1
    page.wait_for_function(f"() => window.highlighted.includes({last})")
    highlighted = page.evaluate("() => window.highlighted")
    # it moved forward through the words of every piece, from the first, and reached the last
    assert highlighted[0] == 0 and len(highlighted) >= 2 and highlighted == sorted(set(highlighted)), highlighted
    expect(page.locator("#words .word[aria-current]")).to_have_count(0)  # and ended with the audio


@pytest.mark.browser
@pytest.mark.timeout(60)
@pytest.mark.parametrize("switched", [False, True], ids=["off_by_default", "switched_on_then_off"])
def test_with_the_toggle_off_the_config_asks_for_no_timestamps(page, switched):
    from playwright.sync_api import expect

    _sign_in(page)
    toggle = page.get_by_label("Word timestamps", exact=True)
    expect(toggle).not_to_be_checked()
    if switched:
        toggle.check()
        toggle.uncheck()
    sent = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(payload)))
    page.get_by_role("button", name="Speak", exact=True).click()
    expect(page.locator("#turn")).to_have_attribute("data-state", "done")
    # the config the page sent before the toggle existed: no timestamps field
    assert json.loads(sent[0]) == {"type": "config", "model": "chatterbox-turbo", "voice": "default",
                                   "response_format": "pcm"}
    expect(page.locator("#timed")).to_be_hidden()

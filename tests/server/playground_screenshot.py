"""``python -m tests.server.playground_screenshot OUT.png``: the screenshot of the playground in
docs/server.md (docs/playground.png), taken the way tests/server/test_playground.py drives the
page: headless Chromium, a live server over the tiny random models, a voice uploaded through the
page and a text spoken with it, its word timestamps on."""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from tests.conftest import DATA_DIR
from tests.server.browser import KEY, chromium_path, headless_chromium, playground_server
from tests.voices import checkpoints

TEXT = "Hello! This is Chorus, speaking while the text is still arriving."


def main(out: str) -> None:
    executable = chromium_path()
    assert executable is not None, "no chromium binary (apt-get install chromium)"
    # scratch space beside the picture (not the system's temp dir, as for tests), removed after
    with tempfile.TemporaryDirectory(prefix="playground-shot-", dir=Path(out).resolve().parent) as scratch:
        checkpoints.BASE[:] = [Path(scratch)]  # the tiny models' files, as under pytest
        try:
            shoot(executable, Path(scratch) / "voices", out)
        finally:
            checkpoints.remove_shared()
    print(f"wrote {out}")


def shoot(executable: str, voices: Path, out: str) -> None:
    from playwright.sync_api import expect

    with playground_server(voices) as server, headless_chromium(executable) as browser:
        page = browser.new_page(viewport={"width": 900, "height": 900}, device_scale_factor=1)
        page.set_default_timeout(20_000)
        page.goto(server.url + "/")
        page.get_by_label("API key", exact=True).fill(KEY)
        page.get_by_role("button", name="Load models and voices", exact=True).click()
        expect(page.get_by_label("Model", exact=True)).to_have_value("chatterbox-turbo")
        page.get_by_label("Voice clip (a few seconds of one speaker)", exact=True).set_input_files(
            Path(DATA_DIR) / "sample-01.mp3")
        page.get_by_label("Name", exact=True).fill("narrator")
        page.get_by_role("button", name="Upload", exact=True).click()
        expect(page.locator("#status")).to_contain_text("added and selected")
        page.get_by_label("Text", exact=True).fill(TEXT)
        page.get_by_label("Word timestamps", exact=True).check()
        page.get_by_role("button", name="Speak", exact=True).click()
        expect(page.locator("#turn")).to_have_attribute("data-state", "done")
        expect(page.locator("#words .word")).to_have_count(len(TEXT.split()))
        expect(page.locator("#in-flight")).to_have_text(re.compile(r"^\d+$"))
        page.screenshot(path=out, full_page=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""The README as a new user follows it from a clean clone: the Commands run as printed after the
quick start (on the checkpoint serve.sh writes), and everything its commands write is git-ignored."""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import soundfile

from tests.test_scripts import serve_plan

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _code_blocks(text: str = README) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def readme_commands() -> list[list[str]]:
    """The Commands section's ``chorus ...`` lines as argv (after ``chorus``), without comments
    and without the optional ``[...]`` parts."""
    commands = []
    for line in _code_blocks(_section("Commands"))[0].splitlines():
        words, optional = [], 0
        for word in shlex.split(line, comments=True):
            optional += word.startswith("[")
            if not optional:
                words.append(word)
            optional -= word.endswith("]")
        if words and words[0] == "chorus":
            commands.append(words[1:])
    return commands


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _serve_sh_checkpoint() -> str:
    """The checkpoint serve.sh serves when none is given (its dry run's command line)."""
    return _option(serve_plan()["command"].split(), "--checkpoint")


def test_readme_commands_use_the_checkpoint_serve_sh_writes():
    """Not a path the quick start never makes (``ckpt/turbo`` was one)."""
    written = _serve_sh_checkpoint()
    checkpoints = {_option(argv, "--checkpoint") for argv in readme_commands()} - {None, "DIR"}
    assert checkpoints == {written}
    assert ["checkpoint", "random", "--variant", "turbo", "--out", written] in readme_commands()
    assert f'Pipeline.load("turbo", "{written}"' in _section("Python")


# The commands that need nothing but the checkpoint (the others need your clips and texts, a
# running server or a GPU's time), in the README's order.
RUNNABLE = (["checkpoint", "random"], ["checkpoint", "check"], ["variants"], ["tokenize"], ["synth"])


@pytest.mark.fullsize
@pytest.mark.timeout(600)  # 3 minutes on a busy 2-core machine: a 2.8 GB checkpoint, a model load, 100 tokens
def test_readme_commands_run_as_printed(tmp_path, monkeypatch, capsys):
    """From a directory laid out as the repository root after the quick start: the first command
    writes the random-weight Turbo checkpoint where serve.sh writes it, the next ones read it,
    and synth speaks its capped 4 s."""
    from chorus.cli import main

    runnable = [argv for argv in readme_commands()
                if any(argv[:len(head)] == head for head in RUNNABLE) and "..." not in argv
                and "--text-file" not in argv]
    assert [argv[:len(head)] for argv, head in zip(runnable, RUNNABLE)] == list(RUNNABLE)
    monkeypatch.chdir(tmp_path)
    for argv in runnable:
        assert main(argv) == 0, (argv, capsys.readouterr().err)
    out = _option(runnable[-1], "--out")
    assert f"wrote {out}" in capsys.readouterr().out
    assert 0 < soundfile.info(str(tmp_path / out)).duration <= 100 / 25 + 0.5  # the random-weight cap


def _written_by_readme() -> set[str]:
    """Every file or directory the README's code blocks write, relative to the repository root."""
    patterns = (r"--out\s+(\S+)", r"\s-o\s+(\S+)", r"stream_to_file\(\"([^\"]+)\"\)", r"write_audio\(\"([^\"]+)\"")
    found = {m for block in _code_blocks() for pattern in patterns for m in re.findall(pattern, block)}
    return found - {"DIR"}


def _ignored(path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0


def test_everything_the_readme_writes_is_git_ignored():
    written = _written_by_readme()
    assert {"hello.wav", "hello.mp3", "me.wav", "voice.safetensors", "t3.json", ".ckpt/turbo-random"} <= written
    # a directory's files: a checkpoint directory is ignored as a whole
    not_ignored = sorted(p for p in written if not _ignored(p) and not _ignored(f"{p}/t3.safetensors"))
    assert not_ignored == []
    assert _ignored("ckpt/turbo/t3_turbo_v1.safetensors")  # where the README once wrote a checkpoint
    assert not _ignored("docs/server.md") and not _ignored("pyproject.toml")


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_readme_quotes_the_line_serve_sh_prints_when_ready():
    """The quick start points at the playground with serve.sh's own words."""
    said = (ROOT / "scripts" / "announce-ready.sh").read_text()
    line = "ready: open $URL/ in a browser to try it (the playground)"
    assert line in said
    assert line.replace("$URL", "http://127.0.0.1:8000") in _flat(_section("Quick start"))


def test_readme_says_what_test_sh_prints():
    """The install's expected conflicts and the closing line of skipped tests, in their own words."""
    from tests.skip_summary import KINDS

    quick = _flat(_section("Quick start"))
    assert ".venv-test/install.log" in quick and "chatterbox-tts 0.1.7 requires torch==2.6.0" in quick
    what, how, _ = KINDS["browser"]
    assert f"skipped: 8 {what} ({how.split(',')[0]}," in quick

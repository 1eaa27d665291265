"""The ``chorus`` command line on first use: paths checked before models load, fast failure
without a hub, Ctrl-C, checkpoint checks, device-dependent defaults, parser hygiene. No model
runs here: the checkpoints are light (tokenizer and built-in voice, empty weight files), so any
check that happened only after a model load would show up as a weight-file error instead."""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from chorus.cli import build_parser, main
from chorus.models.random_checkpoint import random_builtin_voice, write_random_checkpoint
from chorus.models.variants import get_variant
from chorus.voices import Voice
from tests.conftest import DATA_DIR
from tests.voices.checkpoints import light_checkpoint

ROOT = Path(__file__).resolve().parents[1]
CLIP = os.path.join(DATA_DIR, "sample-01.mp3")


def _error(capsys, argv: list[str]) -> str:
    """Run the CLI expecting a user error: exit code 2 and one ``chorus: error:`` line last."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("chorus: error:"), err
    return last


@pytest.fixture(scope="module")
def light_nano(module_tmp_path_factory):
    return light_checkpoint("nano", module_tmp_path_factory.mktemp("nano"))


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(PYTHONPATH=str(ROOT), TQDM_DISABLE="1", **extra)
    return env


def _chorus(args: list[str], timeout: float, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chorus.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(**env), cwd=ROOT)


# ---- every path is checked before a model loads ------------------------------------------------

def _path_cases(ckpt: str, tmp: Path) -> dict[str, tuple[list[str], str]]:
    missing_dir = tmp / "no-such-dir"
    synth = ["synth", "--variant", "nano", "--checkpoint", ckpt]
    voice = ["voice", "create", "--variant", "nano", "--checkpoint", ckpt]
    bench = ["bench", "t3", "--variant", "nano", "--checkpoint", ckpt, "--device", "cpu"]
    (tmp / "taken").write_text("a file")
    return {
        "synth --out": ([*synth, "--out", str(missing_dir / "o.wav"), "Hi."], "does not exist"),
        "synth --text-file": ([*synth, "--out", str(tmp / "o.wav"), "--text-file", str(tmp / "no.txt")], "file not found"),
        "synth --voice": ([*synth, "--out", str(tmp / "o.wav"), "--voice", str(tmp / "no.safetensors"), "Hi."],
                          "file not found"),
        "voice --out": ([*voice, "--audio", CLIP, "--out", str(missing_dir / "v.safetensors")], "does not exist"),
        "voice --audio": ([*voice, "--audio", str(tmp / "no.wav"), "--out", str(tmp / "v.safetensors")], "file not found"),
        "bench --out": ([*bench, "--out", str(missing_dir / "b.json")], "does not exist"),
        "bench --text-file": ([*bench, "--text-file", str(tmp / "no.txt")], "file not found"),
        "checkpoint random --out": (["checkpoint", "random", "--variant", "nano", "--out", str(tmp / "taken")],
                                    "not a directory"),
    }


@pytest.mark.parametrize("case", ["synth --out", "synth --text-file", "synth --voice", "voice --out",
                                  "voice --audio", "bench --out", "bench --text-file", "checkpoint random --out"])
def test_a_bad_path_is_reported_before_any_model_loads(case, light_nano, tmp_path, capsys):
    argv, expected = _path_cases(light_nano, tmp_path)[case]
    start = time.monotonic()
    line = _error(capsys, argv)
    assert expected in line and "could not read checkpoint file" not in line
    assert time.monotonic() - start < 20


def test_checkpoint_random_refuses_a_directory_with_other_content(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert "not empty" in _error(capsys, ["checkpoint", "random", "--variant", "nano", "--out", str(tmp_path)])
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


# ---- an unreachable hub fails fast -----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_fast_hub_failure(result: subprocess.CompletedProcess, elapsed: float) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert all(fix in lines[0] for fix in ("--checkpoint DIR", "HF_HUB_OFFLINE=1", "proxy"))
    assert elapsed < 20  # the unbounded retries took 210 s


def test_a_closed_hub_port_fails_fast_with_one_line(tmp_path):
    start = time.monotonic()
    result = _chorus(["tokenize", "--variant", "original", "Hello."], timeout=60,
                     HF_ENDPOINT=f"http://127.0.0.1:{_free_port()}", HF_HOME=str(tmp_path))
    _assert_fast_hub_failure(result, time.monotonic() - start)


def test_a_hub_that_never_answers_fails_fast_with_one_line(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_stay_silent():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept_and_stay_silent, daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        result = _chorus(["tokenize", "--variant", "original", "Hello."], timeout=60,
                         HF_ENDPOINT=f"http://127.0.0.1:{server.getsockname()[1]}", HF_HOME=str(tmp_path))
        _assert_fast_hub_failure(result, time.monotonic() - start)
        assert accepted  # it did connect, and got no answer
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        server.close()


# ---- Ctrl-C ------------------------------------------------------------------------------------

def test_ctrl_c_prints_one_line_exits_130_and_leaves_no_checkpoint(tmp_path):
    """The writer is held before its rename (``CHORUS_TEST_HOLD_WRITES``) and announces it, so
    SIGINT always lands while the temporary checkpoint exists, however fast the machine."""
    work, writing = tmp_path / "work", tmp_path / "writing"
    work.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "chorus.cli", "checkpoint", "random", "--variant", "original",
                             "--only", "t3", "--out", str(work / "ckpt")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(CHORUS_TEST_HOLD_WRITES=str(writing)),
                            cwd=ROOT, preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        _wait_for(writing.exists, proc, timeout_s=120)
        assert any(p.name.startswith(".ckpt.tmp-") for p in work.iterdir())  # the write is under way
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert err.strip() == "chorus: interrupted"
    assert list(work.iterdir()) == []


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child before it starts Python: SIGINT handled by default, as in a terminal. A
    suite started in the background of a shell without job control inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler, so the signal would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(condition, proc: subprocess.Popen, timeout_s: float) -> None:
    """Poll ``condition`` until it holds; fail at once if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"the process exited with {proc.returncode}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# ---- checkpoint check opens every file ---------------------------------------------------------

@pytest.fixture()
def checked_nano(tmp_path):
    """A nano checkpoint whose weight files hold no keys: check reports them as mismatches and
    goes on, so each test looks at the one file it breaks."""
    from safetensors.torch import save_file

    variant = get_variant("nano")
    write_random_checkpoint(variant, tmp_path, components=("tokenizer", "conds"))
    for name in (variant.files.voice_encoder, variant.files.t3, variant.files.s3gen):
        save_file({"x": torch.zeros(1)}, str(tmp_path / name))
    return tmp_path


def _check(capsys, directory) -> tuple[int, str]:
    code = main(["checkpoint", "check", "--variant", "nano", "--checkpoint", str(directory)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out


def test_check_validates_the_builtin_voice(checked_nano, capsys):
    assert "conds.pt: ok" in _check(capsys, checked_nano)[1]
    data = (checked_nano / "conds.pt").read_bytes()
    (checked_nano / "conds.pt").write_bytes(data[: len(data) // 2])
    code, report = _check(capsys, checked_nano)
    line = next(line for line in report.splitlines() if line.startswith("conds.pt:"))
    assert code == 1 and "ERROR" in line and str(checked_nano / "conds.pt") in line
    assert "download it again" in line and "weights_only" not in report


def test_check_validates_the_builtin_voice_keys(checked_nano, capsys):
    conds = random_builtin_voice(get_variant("nano"), 0)
    del conds["gen"]["embedding"]
    torch.save(conds, checked_nano / "conds.pt")
    code, report = _check(capsys, checked_nano)
    assert code == 1 and "conds.pt: ERROR" in report and "embedding" in report


def test_check_validates_the_tokenizer(checked_nano, capsys):
    vocab = checked_nano / "vocab.json"
    vocab.write_bytes(vocab.read_bytes()[:1000])
    code, report = _check(capsys, checked_nano)
    line = next(line for line in report.splitlines() if line.startswith("vocab.json"))
    assert code == 1 and "ERROR" in line


def test_a_truncated_weight_file_is_an_error_naming_it(checked_nano, capsys):
    t3 = checked_nano / get_variant("nano").files.t3
    t3.write_bytes(t3.read_bytes()[:-4])
    code, report = _check(capsys, checked_nano)
    assert code == 1 and f"t3_nano_v1.safetensors: ERROR (could not read checkpoint file {t3}" in report


# ---- defaults that depend on the device or the checkpoint --------------------------------------

def test_synth_defaults_to_fp32_on_the_cpu_without_a_warning(light_nano, tmp_path, capsys, caplog):
    with caplog.at_level("WARNING"):
        _error(capsys, ["synth", "--variant", "nano", "--checkpoint", light_nano, "--device", "cpu",
                        "--max-new-tokens", "5", "--out", str(tmp_path / "o.wav"), "Hi."])
    assert "slower than fp32" not in caplog.text


@pytest.mark.parametrize("command", ["synth", "bench"])
def test_bf16_on_the_cpu_warns(command, light_nano, tmp_path, capsys, caplog):
    argv = {"synth": ["synth", "--variant", "nano", "--checkpoint", light_nano, "--max-new-tokens", "5",
                      "--out", str(tmp_path / "o.wav"), "Hi."],
            "bench": ["bench", "t3", "--variant", "nano", "--checkpoint", light_nano]}[command]
    with caplog.at_level("WARNING"):
        _error(capsys, [*argv, "--device", "cpu", "--dtype", "bf16"])  # fails later, at the empty weights
    assert [r.getMessage() for r in caplog.records].count(
        next(r.getMessage() for r in caplog.records if "slower than fp32" in r.getMessage())) == 1


def test_bench_defaults_to_auto_dtype():
    args = build_parser().parse_args(["bench", "t3"])
    assert args.dtype == "auto"


def test_random_weights_cap_the_tokens_with_a_note(light_nano, tmp_path, capsys):
    assert main(["synth", "--variant", "nano", "--checkpoint", light_nano, "--device", "cpu",
                 "--out", str(tmp_path / "o.wav"), "Hi."]) == 2  # the empty weights fail to load
    assert "speech tokens capped at 100 per chunk" in capsys.readouterr().err


def test_random_weights_cap_yields_to_explicit_limits():
    from chorus.models.random_checkpoint import random_weights_token_cap

    assert random_weights_token_cap(True, 300, None) == (300, None)
    assert random_weights_token_cap(True, None, 150)[0] == 150
    assert random_weights_token_cap(False, None, None) == (None, None)


@pytest.mark.parametrize("value, expected", [("150,abc", "comma-separated integers"), ("10,200", "at least 20")])
def test_bench_refuses_bad_chunk_bounds_before_any_model_loads(value, expected, light_nano, capsys):
    line = _error(capsys, ["bench", "t3", "--variant", "nano", "--checkpoint", light_nano, "--device", "cpu",
                           "--chunk-chars", value])
    assert expected in line and "could not read checkpoint file" not in line


def test_bench_chunk_sweep_and_yardstick_options_reach_the_config(monkeypatch):
    import chorus.bench.t3_bench as t3_bench

    configs = []
    monkeypatch.setattr(t3_bench, "main_json", lambda cfg, out: configs.append(cfg))
    assert main(["bench", "t3", "--chunk-chars", "150,200,300,400", "--no-yardstick",
                 "--max-num-seqs", "1024"]) == 0
    assert main(["bench", "t3"]) == 0
    assert configs[0].chunk_chars == (150, 200, 300, 400) and not configs[0].yardstick
    assert configs[0].max_num_seqs == 1024
    assert configs[1].chunk_chars == () and configs[1].yardstick
    assert configs[1].max_num_seqs == t3_bench.T3BenchConfig().max_num_seqs


def test_bench_reports_random_weights_for_a_random_checkpoint(tmp_path, capsys):
    ckpt = tmp_path / "nano"
    variant = get_variant("nano")
    write_random_checkpoint(variant, ckpt, components=("t3", "tokenizer", "conds"))
    for name in (variant.files.voice_encoder, variant.files.s3gen):  # required, not read by the bench
        (ckpt / name).touch()
    out = tmp_path / "bench.json"
    assert main(["bench", "t3", "--variant", "nano", "--checkpoint", str(ckpt), "--device", "cpu",
                 "--batch-sizes", "1", "--decode-steps", "1", "--no-workload", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["random_weights"] is True and report["dtype"] == "fp32"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# ---- voices ------------------------------------------------------------------------------------

def test_a_voice_for_another_variant_is_refused_before_models_load(light_nano, tmp_path, capsys):
    base = Voice.from_conditionals(random_builtin_voice(get_variant("turbo"), 0))
    path = Voice(base.speaker_embedding, base.t3_prompt_tokens, base.s3gen_prompt_tokens, base.s3gen_prompt_mel,
                 base.xvector, name="t", variant="turbo").save(tmp_path / "t.safetensors")
    line = _error(capsys, ["synth", "--variant", "nano", "--checkpoint", light_nano, "--voice", str(path),
                           "--out", str(tmp_path / "o.wav"), "Hi."])
    assert "built for the turbo variant, not nano" in line


# ---- third-party noise -------------------------------------------------------------------------

def test_watermark_prints_no_third_party_noise(light_nano, tmp_path):
    pytest.importorskip("perth")
    result = _chorus(["synth", "--variant", "nano", "--checkpoint", light_nano, "--watermark", "perth",
                      "--device", "cpu", "--max-new-tokens", "5", "--out", str(tmp_path / "o.wav"), "Hi."],
                     timeout=300, HF_HUB_OFFLINE="1")
    assert result.stdout == ""  # perth's "loaded PerthNet" line went nowhere
    # Chorus's own warning that the (light) checkpoint has random weights, then the error
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "RANDOM WEIGHTS" in lines[0], result.stderr
    assert lines[1].startswith("chorus: error: could not read checkpoint file"), result.stderr


# ---- the parser --------------------------------------------------------------------------------

def _parsers(parser: argparse.ArgumentParser, path=("chorus",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_no_parser_matches_option_prefixes():
    assert [" ".join(p) for p, parser in _parsers(build_parser()) if parser.allow_abbrev] == []


def test_text_is_not_taken_for_text_file(capsys):
    with pytest.raises(SystemExit) as info:
        main(["synth", "--out", "o.wav", "--text", "hello.txt"])
    assert info.value.code == 2 and "unrecognized arguments: --text" in capsys.readouterr().err


def _has_subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(action, argparse._SubParsersAction) for action in parser._actions)


PARSER_PATHS = [path for path, _ in _parsers(build_parser())]


@pytest.mark.parametrize("path", PARSER_PATHS, ids=" ".join)
def test_every_command_prints_its_help(path, capsys):
    with pytest.raises(SystemExit) as info:
        main([*path[1:], "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {' '.join(path)} ")


def test_every_command_runs_a_module_level_handler_of_the_cli_package():
    """A command's handler is a named function of the module that registers it (not a lambda,
    not a leftover of another module), so the code behind ``chorus X Y`` is found by name."""
    for path, parser in _parsers(build_parser()):
        if _has_subcommands(parser):
            continue
        handler = parser.get_default("handler")
        assert handler is not None, " ".join(path)
        module = sys.modules[handler.__module__]
        assert module.__name__.startswith("chorus.cli."), f"{' '.join(path)}: {module.__name__}"
        assert getattr(module, handler.__name__, None) is handler, f"{' '.join(path)}: {handler.__qualname__}"


@pytest.mark.parametrize("path", [path for path, parser in _parsers(build_parser()) if _has_subcommands(parser)],
                         ids=" ".join)
def test_a_command_group_without_its_subcommand_prints_its_help_and_fails(path, capsys):
    assert main(list(path[1:])) == 2
    assert capsys.readouterr().out.startswith(f"usage: {' '.join(path)} ")


def test_the_console_script_runs_main():
    import importlib
    import tomllib

    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["chorus"]
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is main


def test_every_command_has_a_description_and_every_argument_help():
    for path, parser in _parsers(build_parser()):
        assert parser.description, " ".join(path)
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{' '.join(path)} {action.dest}"


def test_vocoder_options_are_read_as_their_fields_types_optional_ones_included():
    from chorus.cli.bench_models import parse_config_options
    from chorus.vocoder import VocoderConfig

    items = ["cuda_graphs=false", "compile_hift=false", "prompt_tokens=50", "max_graph_rows=8",
             "stream_context_tokens=none"]
    assert parse_config_options(VocoderConfig, items, "--vocoder-option") == {
        "cuda_graphs": False, "compile_hift": False, "prompt_tokens": 50, "max_graph_rows": 8,
        "stream_context_tokens": None}


# ---- chorus bench index ------------------------------------------------------------------------

def test_bench_index_check_accepts_the_repository(capsys):
    assert main(["bench", "index", "--check", "--root", str(ROOT)]) == 0
    assert capsys.readouterr().out.startswith("benchmarks/results: index current")


def test_bench_index_outside_a_repository_is_one_line_naming_the_missing_directory(tmp_path, capsys):
    line = _error(capsys, ["bench", "index", "--check", "--root", str(tmp_path)])
    assert line == f"chorus: error: {tmp_path.resolve()} has no benchmarks/results/: run it from the repository " \
                   f"root or pass --root"

"""``chorus bench plot``: figures drawn from bench reports, and the reports it refuses."""
from __future__ import annotations

import json

import pytest

from chorus.bench import plot
from chorus.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _stream_report(path, variant: str, p50_ms: list[float]) -> str:
    levels = [{"concurrency": n, "ttfa_s": {"p50": ms / 1000, "p99": 2 * ms / 1000}}
              for n, ms in zip((1, 16, 64, 256), p50_ms)]
    path.write_text(json.dumps({"variant": variant, "dtype": "bfloat16", "flow_steps": 2, "device_name": "card",
                                "stream": levels}))
    return str(path)


def _online_report(path, throughput: dict[int, float], card: str | None = None) -> str:
    levels = [{"concurrency": n, "throughput_audio_s_per_s": value, "ttfa_s": {"p99": 0.1}}
              for n, value in throughput.items()]
    report = {"benchmark": "online", "model": "chatterbox-turbo", "started_at": "2026-12-05T19:09:36+00:00",
              "levels": levels}
    if card:
        report["provenance"] = {"card": card}
    path.write_text(json.dumps(report))
    return str(path)


def _vocoder_roofline_report(path, shapes=((2, 4), (8, 20))) -> str:
    """A ``bench vocoder --roofline`` report made by the bench's own roofline code, one pass per shape."""
    import torch

    from chorus.bench.kernel_work import Work
    from chorus.bench.roofline import ClassTimes, resolve_roof, roof_section, roofline_report

    roof = resolve_roof("NVIDIA H100 80GB HBM3", 80 * 2**30)
    passes = []
    for batch, new_tokens in shapes:
        work = {"estimator.linear": Work(flops=batch * 4e12, bytes=batch * 2e10),
                "hift.snake": Work(elementwise_flops=batch * 1e10, bytes=batch * 4e9, fp32=True)}
        times = ClassTimes({"estimator.linear": batch * 0.02, "hift.snake": batch * 0.01, "hift.other": 0.001},
                           wall_seconds=batch * 0.05, profiled_seconds=batch * 0.031 + 0.001)
        passes.append({"batch": batch, "new_tokens": new_tokens,
                       "roofline": roofline_report(work, times, roof, torch.bfloat16, batch * 0.05)})
    path.write_text(json.dumps({"variant": "turbo", "dtype": "bfloat16", "device_name": "NVIDIA H100 80GB HBM3",
                                "roof": roof_section(roof, "NVIDIA H100 80GB HBM3"), "passes": passes}))
    return str(path)


# ---- ttfa ----------------------------------------------------------------------------------------

def test_ttfa_draws_a_png_from_stream_reports(tmp_path):
    reports = [_stream_report(tmp_path / "turbo.json", "turbo", [60, 90, 200, 700]),
               _stream_report(tmp_path / "original.json", "original", [120, 180, 400, 1500])]
    out = tmp_path / "ttfa.png"
    assert main(["bench", "plot", "ttfa", str(out), *reports]) == 0
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_ttfa_draws_a_p50_and_a_p99_line_per_report(tmp_path):
    reports = [_stream_report(tmp_path / "turbo.json", "turbo", [60, 90, 200, 700]),
               _stream_report(tmp_path / "original.json", "original", [120, 180, 400, 1500])]
    (axes,) = plot.plot_ttfa(tmp_path / "ttfa.png", reports).axes
    drawn = {line.get_label(): list(line.get_ydata()) for line in axes.get_lines()}
    assert drawn == {"turbo (bfloat16, 2 flow steps) p50": pytest.approx([60, 90, 200, 700]),
                     "turbo (bfloat16, 2 flow steps) p99": pytest.approx([120, 180, 400, 1400]),
                     "original (bfloat16, 2 flow steps) p50": pytest.approx([120, 180, 400, 1500]),
                     "original (bfloat16, 2 flow steps) p99": pytest.approx([240, 360, 800, 3000])}


def test_a_report_without_stream_levels_is_refused_by_name(tmp_path, capsys):
    online = tmp_path / "online.json"
    online.write_text(json.dumps({"benchmark": "online", "levels": []}))
    out = tmp_path / "ttfa.png"
    assert main(["bench", "plot", "ttfa", str(out), str(online)]) == 2
    assert f"{online} is not a `chorus bench stream` report" in capsys.readouterr().err
    assert not out.exists()


def test_a_missing_report_is_named(tmp_path, capsys):
    assert main(["bench", "plot", "ttfa", str(tmp_path / "ttfa.png"), "missing.json"]) == 2
    assert "REPORT missing.json: file not found" in capsys.readouterr().err


def test_a_report_that_is_not_json_is_named(tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text('{"stream": [')
    assert main(["bench", "plot", "ttfa", str(tmp_path / "ttfa.png"), str(broken)]) == 2
    assert f"chorus: error: {broken} is not JSON" in capsys.readouterr().err


def test_a_figure_needs_at_least_one_report(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "plot", "ttfa", str(tmp_path / "ttfa.png")])
    assert "the following arguments are required: REPORT" in capsys.readouterr().err


# ---- throughput ----------------------------------------------------------------------------------

def test_throughput_writes_a_png_from_online_reports(tmp_path):
    reports = [_online_report(tmp_path / "online-h100.json", {1: 28.4, 16: 187.0, 64: 297.0, 256: 422.0}),
               _online_report(tmp_path / "online-h200.json", {64: 278.0, 256: 363.0})]
    out = tmp_path / "throughput.png"
    assert main(["bench", "plot", "throughput", str(out), *reports]) == 0
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_throughput_draws_one_line_per_report_with_a_point_per_client_level(tmp_path):
    reports = [_online_report(tmp_path / "online-h100.json", {1: 28.4, 16: 187.0, 64: 297.0, 256: 422.0}),
               _online_report(tmp_path / "online-h200.json", {64: 278.0, 256: 363.0})]
    (axes,) = plot.plot_throughput(tmp_path / "throughput.png", reports).axes
    drawn = [(list(line.get_xdata()), list(line.get_ydata())) for line in axes.get_lines()]
    assert drawn == [([1, 16, 64, 256], [28.4, 187.0, 297.0, 422.0]), ([64, 256], [278.0, 363.0])]


def test_a_throughput_line_is_labelled_by_the_card_its_report_names(tmp_path):
    with_card = _online_report(tmp_path / "new.json", {64: 300.0}, card="NVIDIA H100 80GB HBM3")
    without = _online_report(tmp_path / "online-h200-2026-12-04-turbo.json", {64: 278.0})
    (axes,) = plot.plot_throughput(tmp_path / "throughput.png", [with_card, without]).axes
    assert [line.get_label() for line in axes.get_lines()] == [
        "chatterbox-turbo, NVIDIA H100 80GB HBM3, 2026-12-05", "chatterbox-turbo, online-h200-2026-12-04-turbo.json"]


def test_a_report_without_throughput_levels_is_refused_naming_what_it_lacks(tmp_path, capsys):
    stream = _stream_report(tmp_path / "stream.json", "turbo", [60, 90, 200, 700])
    out = tmp_path / "throughput.png"
    assert main(["bench", "plot", "throughput", str(out), stream]) == 2
    assert (f"{stream} is not a `chorus bench online` report (it has no 'levels' list whose items all hold "
            f"'concurrency' and 'throughput_audio_s_per_s')") in capsys.readouterr().err
    assert not out.exists()


# ---- roofline ------------------------------------------------------------------------------------

def test_roofline_writes_a_png_from_a_vocoder_roofline_report(tmp_path):
    out = tmp_path / "roofline.png"
    assert main(["bench", "plot", "roofline", str(out), _vocoder_roofline_report(tmp_path / "vocoder.json")]) == 0
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_roofline_draws_the_chosen_pass_a_point_per_class_with_work_and_a_roof_per_precision(tmp_path):
    report = _vocoder_roofline_report(tmp_path / "vocoder.json")
    (axes,) = plot.plot_roofline(tmp_path / "roofline.png", report, index=1).axes
    assert axes.get_title().startswith("turbo vocoder pass, B=8 N=20, bfloat16 on NVIDIA H100 80GB HBM3")
    assert [text.get_text() for text in axes.texts] == ["estimator.linear (30%)", "hift.snake (12%)"]
    assert len(axes.collections) == 2  # hift.other has time but no work: no point
    assert [line.get_label() for line in axes.get_lines()] == ["roof bf16: 989.5 TFLOP/s, 3350 GB/s",
                                                               "roof tf32: 494.5 TFLOP/s, 3350 GB/s"]


def test_the_redrawn_roofline_is_the_plot_the_run_wrote(tmp_path):
    from chorus.bench.roofline import write_plots

    report_path = _vocoder_roofline_report(tmp_path / "vocoder.json", shapes=((2, 4),))
    report = json.loads((tmp_path / "vocoder.json").read_text())
    write_plots(report_path, report)
    redrawn = tmp_path / "redrawn.png"
    plot.plot_roofline(redrawn, report_path)
    assert redrawn.read_bytes() == (tmp_path / report["passes"][0]["roofline_plot"]).read_bytes()


def test_a_pass_out_of_range_is_refused_with_the_passes_there_are(tmp_path, capsys):
    report = _vocoder_roofline_report(tmp_path / "vocoder.json")
    out = tmp_path / "roofline.png"
    assert main(["bench", "plot", "roofline", str(out), report, "--pass", "2"]) == 2
    assert f"--pass 2: {report} holds 2 with a roofline, numbered from 0 (0: b2-n4, 1: b8-n20)" in \
        capsys.readouterr().err
    assert not out.exists()


def test_a_report_without_a_roofline_is_refused_naming_what_it_lacks(tmp_path, capsys):
    vocoder = tmp_path / "vocoder.json"
    vocoder.write_text(json.dumps({"variant": "turbo", "dtype": "bfloat16", "device_name": "card",
                                   "passes": [{"batch": 1, "new_tokens": 20, "stage_pass_seconds": 0.01}]}))
    assert main(["bench", "plot", "roofline", str(tmp_path / "roofline.png"), str(vocoder)]) == 2
    assert (f"{vocoder} is not a `chorus bench vocoder --roofline` or `chorus bench t3 --roofline` report (it has no "
            f"passes or decode steps with a 'roofline', or no 'roof')") in capsys.readouterr().err

"""``chorus bench vc`` (chorus/bench/vc_bench.py) on tiny models that can convert: every part
timed, the tokens and audio of the source's length, and the command line."""
from __future__ import annotations

import numpy as np
import pytest

from chorus.bench.vc_bench import VCBenchConfig, run, synthetic_source
from chorus.models.s3gen.s3gen import SAMPLE_RATE
from tests.conversion.tiny_conversion import tiny_conversion_models
from tests.vocoder.models import random_voice

pytestmark = pytest.mark.timeout(120)


def test_the_bench_times_tokenizing_and_the_s3gen_pass_of_each_conversion():
    cfg = VCBenchConfig(variant="turbo", device="cpu", source_s=1.0, repeats=2, warmup=1, flow_steps=2)
    report = run(cfg, s3gen=tiny_conversion_models("turbo").s3gen, voice=random_voice(12, seed=3))
    assert report["source_seconds"] == 1.0 and report["source_tokens"] == 25  # 25 speech tokens per second
    assert report["audio_seconds"] == pytest.approx(25 * 960 / SAMPLE_RATE)  # S3Gen: 960 samples per token
    assert report["n_steps"] == 2 and report["prompt_tokens"] == 12 and report["device"] == "cpu"
    for part in ("plan_seconds", "vocode_seconds", "total_seconds"):
        assert len(report[part]["all"]) == 2 and 0 < report[part]["min"] <= report[part]["median"]
    totals = np.array(report["total_seconds"]["all"])
    parts = np.array(report["plan_seconds"]["all"]) + np.array(report["vocode_seconds"]["all"])
    assert np.allclose(totals, parts, rtol=0.05, atol=1e-3)
    assert report["realtime_factor"] == pytest.approx(report["audio_seconds"] / report["total_seconds"]["median"],
                                                      rel=0.02)
    assert "1 untimed conversions, then 2 timed" in report["method"]


def test_the_synthetic_source_is_voiced_not_silent_and_repeatable():
    wav = synthetic_source(2.0, seed=1)
    assert wav.shape == (32000,) and wav.dtype == np.float32
    assert 0.4 < np.abs(wav).max() <= 0.5 and np.array_equal(wav, synthetic_source(2.0, seed=1))


def test_the_cli_maps_its_options_onto_the_config(monkeypatch, capsys):
    from chorus import cli
    from chorus.bench import vc_bench

    seen = {}
    monkeypatch.setattr(vc_bench, "main_json", lambda cfg, out: seen.update(cfg=cfg, out=out))
    assert cli.main(["bench", "vc", "--variant", "original", "--device", "cpu", "--source-s", "4.5",
                     "--repeats", "3", "--warmup", "0", "--flow-steps", "5"]) == 0
    cfg = seen["cfg"]
    assert (cfg.variant, cfg.device, cfg.source_s, cfg.repeats, cfg.warmup, cfg.flow_steps) == (
        "original", "cpu", 4.5, 3, 0, 5)
    assert cli.main(["bench", "vc", "--source-s", "90"]) != 0
    assert "--source-s must be in [0.1, 60] seconds" in capsys.readouterr().err

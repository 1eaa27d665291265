"""``chorus bench vocoder`` on tiny random S3Gen models on the CPU: the FLOP count against
torch's own counter, and the report's fields and invariants (the real stage, split and
yardstick code runs, eagerly)."""
from __future__ import annotations

import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from chorus.bench.vocoder_bench import VocoderBenchConfig, YardstickPass, format_table, run, vocoder_flops
from chorus.bench.vocoder_pass import pass_inputs, run_encoder, run_hift, run_solver
from chorus.models.s3gen.s3gen import SAMPLE_RATE, output_num_samples
from tests.models.s3gen.oracle_s3gen import torch_threads
from tests.vocoder.models import random_s3gen, random_voice

PROMPT_TOKENS = 12


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny():
    return {name: random_s3gen(name, seed=3) for name in ("turbo", "original")}


@pytest.mark.parametrize("name", ["turbo", "original"])
def test_the_flop_count_matches_torchs_counter_on_the_modules(tiny, name):
    """FlopCounterMode counts 2 x M x N x K per matmul/linear (addmm, mm, bmm) and
    2 x outputs x c_in x kernel per convolution (a transposed one over its input), as
    vocoder_flops does; attention is forced onto the math backend, whose Q K^T and P V are
    bmms (the CPU's fused attention kernel is not counted by torch). Elementwise ops and FFTs
    count nothing in either, so the counts agree exactly (tolerance: none)."""
    s3gen, batch, new = tiny[name], 2, 7
    inp = pass_inputs(s3gen, random_voice(PROMPT_TOKENS, seed=1), [list(range(new))] * batch, 2,
                      s3gen.variant.s3gen.cfg_rate, seed=0)
    mask = torch.ones(batch, inp.frames, dtype=torch.bool)
    counted = {}
    with torch.inference_mode(), sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as counter:
            mu = run_encoder(s3gen, inp)
        counted["flow_encoder"] = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            mel = run_solver(s3gen, inp, mu, mask)
        counted["solver"] = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            run_hift(s3gen, inp, mel)
        counted["hift"] = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            YardstickPass(s3gen, inp)()  # the yardstick does the same work
        counted["total"] = counter.get_total_flops()
    guided = name == "original"
    expected = vocoder_flops(s3gen.flow.config, s3gen.mel2wav.config, batch, PROMPT_TOKENS, new, 2, guided)
    assert expected == counted
    assert sum(counted[k] for k in ("flow_encoder", "solver", "hift")) == counted["total"]


def test_the_flops_grow_with_batch_tokens_steps_and_guidance(tiny):
    config, hift = tiny["original"].flow.config, tiny["original"].mel2wav.config

    def count(batch=2, new=10, steps=2, guided=True):
        return vocoder_flops(config, hift, batch, PROMPT_TOKENS, new, steps, guided)

    one, two = count(batch=1), count(batch=2)
    assert all(two[k] > one[k] > 0 for k in one)
    assert two["hift"] == 2 * one["hift"] and two["solver"] == 2 * one["solver"]
    # the encoder's position table projection does not depend on the batch
    assert one["flow_encoder"] < two["flow_encoder"] < 2 * one["flow_encoder"]
    assert count(steps=4)["solver"] == 2 * count(steps=2)["solver"]
    assert count(guided=True)["solver"] == 2 * count(guided=False)["solver"]
    assert count(new=20)["total"] > count(new=10)["total"]


def test_the_vocoder_bench_reports_every_shape(tiny, tmp_path, capsys):
    from chorus.bench import vocoder_bench

    s3gen, voice = tiny["turbo"], random_voice(PROMPT_TOKENS, seed=2)
    cfg = VocoderBenchConfig(variant="turbo", device="cpu", batch_sizes=(1, 2), new_tokens=(4,), repeats=2,
                             warmup_passes=1)
    report = run(cfg, s3gen=s3gen, voice=voice)
    assert report["device"] == "cpu" and report["dtype"] == "fp32" and report["n_steps"] == 2
    assert [(p["batch"], p["new_tokens"]) for p in report["passes"]] == [(1, 4), (2, 4)]
    for p in report["passes"]:
        assert p["pass_tokens"] == 4 + 3  # turbo appends three silence tokens
        samples = output_num_samples(p["pass_tokens"], voice.s3gen_prompt_mel.shape[1], PROMPT_TOKENS, s3gen.rules)
        assert p["audio_seconds"] == pytest.approx(p["batch"] * samples / SAMPLE_RATE, abs=1e-4)
        assert p["new_frames"] == 2 * p["pass_tokens"] and p["frames"] == 2 * (PROMPT_TOKENS + p["pass_tokens"])
        assert p["stage_pass_seconds"] > 0 and len(p["stage_pass_seconds_all"]) == 2
        assert p["realtime_factor"] == pytest.approx(p["audio_seconds"] / p["stage_pass_seconds"], rel=0.02)
        assert p["stage_stats"]["passes"] == 3 and p["stage_stats"]["items"] == 3 * p["batch"]
        assert set(p["split_seconds"]) == {"flow_encoder", "solver", "hift"}
        assert all(v > 0 for v in p["split_seconds"].values()) and all(v > 0 for v in p["split_tflops"].values())
        assert p["flops"] == vocoder_flops(s3gen.flow.config, s3gen.mel2wav.config, p["batch"], PROMPT_TOKENS,
                                           p["pass_tokens"], 2, False)
        assert p["stage_tflops"] > 0 and p["yardstick_mode"] == "eager" and p["yardstick_seconds"] > 0
        assert p["yardstick_fraction"] > 0
        assert p["yardstick_fraction"] == pytest.approx(p["yardstick_seconds"] / p["stage_pass_seconds"], rel=0.01)
    assert report["passes"][1]["flops"]["total"] > report["passes"][0]["flops"]["total"]
    assert report["yardstick"]["mode"] == "eager"
    assert "yard/pass" in format_table(report)

    out = tmp_path / "vocoder.json"
    monkey = pytest.MonkeyPatch()
    monkey.setattr(vocoder_bench, "run", lambda c: report)
    try:
        vocoder_bench.main_json(cfg, str(out))
    finally:
        monkey.undo()
    assert json.loads(out.read_text()) == report
    captured = capsys.readouterr()
    assert json.loads(captured.out) == report and "yard/pass" in captured.err


def test_the_yardstick_can_be_left_out(tiny):
    cfg = VocoderBenchConfig(variant="original", device="cpu", batch_sizes=(1,), new_tokens=(3,), repeats=1,
                             warmup_passes=0, flow_steps=1, yardstick=False)
    report = run(cfg, s3gen=tiny["original"], voice=random_voice(PROMPT_TOKENS, seed=4))
    (entry,) = report["passes"]
    assert entry["n_steps"] == 1 and entry["guided"] is True and "yardstick_seconds" not in entry
    assert "yardstick" not in report and "-" in format_table(report)


def test_the_cli_maps_its_options_onto_the_config(monkeypatch, capsys):
    from chorus import cli
    from chorus.bench import vocoder_bench

    seen = {}
    monkeypatch.setattr(vocoder_bench, "main_json", lambda cfg, out: seen.update(cfg=cfg, out=out))
    assert cli.main(["bench", "vocoder", "--variant", "turbo", "--device", "cpu", "--batch-sizes", "1,16",
                     "--new-tokens", "20,250", "--repeats", "2", "--flow-steps", "3", "--no-yardstick",
                     "--no-cuda-graphs", "--compile-hift"]) == 0
    cfg = seen["cfg"]
    assert (cfg.variant, cfg.device, cfg.batch_sizes, cfg.new_tokens, cfg.repeats, cfg.flow_steps) == (
        "turbo", "cpu", (1, 16), (20, 250), 2, 3)
    assert cfg.yardstick is False and cfg.cuda_graphs is False and cfg.compile_hift is True and seen["out"] is None
    assert cli.main(["bench", "vocoder", "--new-tokens", "20,x"]) != 0
    assert "--new-tokens must be comma-separated integers" in capsys.readouterr().err

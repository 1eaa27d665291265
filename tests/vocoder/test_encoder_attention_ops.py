"""``VocoderConfig.encoder_attention_ops``: which kernel the flow encoder's attention runs in a
stage (validation, the opt-in default, the stage's wiring, the benches' options); on a GPU, a bf16
stage with the kernel against one with the plain ops, both against fp32."""
from __future__ import annotations

import pytest

from chorus.models.s3gen.encoder import RelPositionAttention
from chorus.vocoder import VocoderConfig, VocoderStage
from tests.vocoder.conftest import assert_kernels_keep_bf16_as_close_to_fp32
from tests.vocoder.models import random_s3gen, random_voice


def _attention_backends(s3gen) -> set[str]:
    return {m.ops_backend for m in s3gen.flow.encoder.modules() if isinstance(m, RelPositionAttention)}


def test_encoder_attention_ops_must_name_a_backend():
    with pytest.raises(ValueError, match=r"encoder_attention_ops must be one of \('auto', 'triton', 'torch'\), "
                                         r"got 'flash'"):
        VocoderConfig(encoder_attention_ops="flash")


def test_encoder_attention_ops_default_to_the_plain_ops():
    assert VocoderConfig().encoder_attention_ops == "torch"


def test_a_stage_sets_the_backend_of_its_encoder():
    s3gen = random_s3gen("turbo", seed=4)
    VocoderStage(s3gen, VocoderConfig(encoder_attention_ops="auto"))
    assert s3gen.flow.encoder.ops_backend == "auto" and _attention_backends(s3gen) == {"auto"}
    VocoderStage(s3gen)
    assert _attention_backends(s3gen) == {"torch"}


def test_the_pipeline_benches_vocoder_option_sets_encoder_attention_ops(monkeypatch):
    from chorus import cli
    from chorus.bench import pipeline_bench, report

    seen = []
    monkeypatch.setattr(pipeline_bench, "run_offline", lambda cfg: seen.append(cfg) or {})
    monkeypatch.setattr(report, "write_report", lambda result, out: None)
    assert cli.main(["bench", "offline", "--device", "cpu", "--vocoder-option", "encoder_attention_ops=triton"]) == 0
    assert [cfg.vocoder.encoder_attention_ops for cfg in seen] == ["triton"]


def test_the_vocoder_bench_cli_maps_encoder_attention_ops_onto_its_config(monkeypatch):
    from chorus import cli
    from chorus.bench import vocoder_bench

    seen = []
    monkeypatch.setattr(vocoder_bench, "main_json", lambda cfg, out: seen.append(cfg))
    assert cli.main(["bench", "vocoder", "--device", "cpu", "--encoder-attention-ops", "auto"]) == 0
    assert cli.main(["bench", "vocoder", "--device", "cpu"]) == 0
    assert [cfg.encoder_attention_ops for cfg in seen] == ["auto", "torch"]


def test_the_vocoder_bench_reports_encoder_attention_ops_and_its_yardstick_runs_the_plain_ops(monkeypatch,
                                                                                               tiny_turbo):
    from chorus.bench import vocoder_bench

    yardstick_ops = []

    class RecordingYardstick(vocoder_bench.YardstickPass):
        def __init__(self, s3gen, *args, **kwargs):
            yardstick_ops.append(s3gen.flow.encoder.ops_backend)
            super().__init__(s3gen, *args, **kwargs)

    monkeypatch.setattr(vocoder_bench, "YardstickPass", RecordingYardstick)
    cfg = vocoder_bench.VocoderBenchConfig(variant="turbo", device="cpu", batch_sizes=(1,), new_tokens=(3,),
                                           repeats=1, warmup_passes=0, flow_steps=1, flow_ops="torch",
                                           encoder_attention_ops="auto")
    encoder = tiny_turbo.flow.encoder
    try:
        report = vocoder_bench.run(cfg, s3gen=tiny_turbo, voice=random_voice(12, seed=4))
        assert report["stage_encoder_attention_ops"] == "auto" and yardstick_ops == ["torch"]
        assert encoder.ops_backend == "auto"  # the stage's, restored after the yardstick
    finally:
        encoder.ops_backend = "torch"  # the session's shared model as other tests expect it


@pytest.mark.gpu
def test_a_bf16_stage_with_the_fused_encoder_attention_is_as_close_to_fp32_graphed_and_eager():
    # as the fused flow norms' stage test: on random weights any moved bf16 rounding is amplified to
    # bf16's own distance from fp32, so both bf16 stages are held to fp32, the kernel's within 1 dB
    assert_kernels_keep_bf16_as_close_to_fp32("encoder_attention_ops", 1.0)

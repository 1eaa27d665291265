"""``VocoderConfig.flow_ops``: which kernels the flow estimator's norms run in a stage (validation,
the stage's wiring, the CLI and the vocoder bench); on a GPU, a stage with the fused kernels
against one with the plain ops, in graphed and eager passes."""
from __future__ import annotations

import pytest

from chorus.models.s3gen.estimator import CausalBlock, TransformerBlock
from chorus.vocoder import VocoderConfig, VocoderStage
from tests.vocoder.conftest import assert_kernels_keep_bf16_as_close_to_fp32
from tests.vocoder.models import random_s3gen, random_voice

# a bf16 stage's streams with the fused norms against an fp32 stage's: as close as the plain ops'
# bf16 streams, less this. Only the norm statistics' summation order or Mish's fp32 arithmetic
# moves a bf16 rounding, and random weights amplify every moved rounding to bf16's own distance
# from fp32 (16 dB on a GPU, measured), so the fused and plain bf16 audio can be that far apart
# from each other; both must stay as close to fp32.
STAGE_MARGIN_DB = 1.0


def _block_backends(s3gen) -> set[str]:
    estimator = s3gen.flow.decoder.estimator
    return {m.ops_backend for m in estimator.modules() if isinstance(m, (CausalBlock, TransformerBlock))}


def test_flow_ops_must_name_a_backend():
    with pytest.raises(ValueError, match=r"flow_ops must be one of \('auto', 'triton', 'torch'\), got 'cuda'"):
        VocoderConfig(flow_ops="cuda")


def test_flow_ops_default_to_the_kernels():
    assert VocoderConfig().flow_ops == "auto"


def test_a_stage_sets_the_backend_of_its_estimator():
    s3gen = random_s3gen("turbo", seed=4)
    VocoderStage(s3gen, VocoderConfig(flow_ops="torch"))
    assert s3gen.flow.decoder.estimator.ops_backend == "torch" and _block_backends(s3gen) == {"torch"}
    VocoderStage(s3gen)
    assert s3gen.flow.decoder.estimator.ops_backend == "auto" and _block_backends(s3gen) == {"auto"}


def test_the_pipeline_benches_vocoder_option_sets_flow_ops(monkeypatch, capsys):
    from chorus import cli
    from chorus.bench import pipeline_bench, report

    seen = []
    monkeypatch.setattr(pipeline_bench, "run_offline", lambda cfg: seen.append(cfg) or {})
    monkeypatch.setattr(report, "write_report", lambda result, out: None)
    assert cli.main(["bench", "offline", "--device", "cpu", "--vocoder-option", "flow_ops=auto"]) == 0
    assert [cfg.vocoder.flow_ops for cfg in seen] == ["auto"]
    assert cli.main(["bench", "offline", "--device", "cpu", "--vocoder-option", "flow_ops=cuda"]) != 0
    assert "vocoder settings: flow_ops must be one of" in capsys.readouterr().err


def test_the_vocoder_bench_cli_maps_flow_ops_onto_its_config(monkeypatch):
    from chorus import cli
    from chorus.bench import vocoder_bench

    seen = []
    monkeypatch.setattr(vocoder_bench, "main_json", lambda cfg, out: seen.append(cfg))
    assert cli.main(["bench", "vocoder", "--device", "cpu", "--flow-ops", "torch"]) == 0
    assert cli.main(["bench", "vocoder", "--device", "cpu"]) == 0
    assert [cfg.flow_ops for cfg in seen] == ["torch", "auto"]


def test_the_vocoder_bench_reports_flow_ops_and_its_yardstick_runs_the_plain_ops(monkeypatch, tiny_turbo):
    from chorus.bench import vocoder_bench

    yardstick_ops = []

    class RecordingYardstick(vocoder_bench.YardstickPass):
        def __init__(self, s3gen, *args, **kwargs):
            yardstick_ops.append(s3gen.flow.decoder.estimator.ops_backend)
            super().__init__(s3gen, *args, **kwargs)

    monkeypatch.setattr(vocoder_bench, "YardstickPass", RecordingYardstick)
    cfg = vocoder_bench.VocoderBenchConfig(variant="turbo", device="cpu", batch_sizes=(1,), new_tokens=(3,),
                                           repeats=1, warmup_passes=0, flow_steps=1, flow_ops="auto")
    estimator = tiny_turbo.flow.decoder.estimator
    try:
        report = vocoder_bench.run(cfg, s3gen=tiny_turbo, voice=random_voice(12, seed=4))
        assert report["stage_flow_ops"] == "auto" and yardstick_ops == ["torch"]
        assert estimator.ops_backend == "auto"  # the stage's, restored after the yardstick
    finally:
        estimator.ops_backend = "torch"  # the session's shared model as other tests expect it


@pytest.mark.gpu
def test_a_bf16_stage_with_the_fused_flow_norms_is_as_close_to_fp32_graphed_and_eager():
    assert_kernels_keep_bf16_as_close_to_fp32("flow_ops", STAGE_MARGIN_DB)

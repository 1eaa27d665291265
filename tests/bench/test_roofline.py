"""The roofline yardstick (chorus.bench.roofline) on the CPU: the card table, the kernel classes'
counts against hand counts, the attribution of profiled time to classes, and the reports and
plots of ``chorus bench vocoder --roofline`` and ``chorus bench t3 --roofline`` on tiny models."""
from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

from chorus.bench import vocoder_bench
from chorus.bench.kernel_work import Work, encoder_work, estimator_work, hift_work, t3_step_work
from chorus.bench.figures import require_matplotlib
from chorus.bench.roofline import ClassRanges, class_figures, find_card, profile_classes, resolve_roof, stage, write_plot
from chorus.bench.roofline_passes import s3gen_ranges
from chorus.models.s3gen.encoder import EncoderConfig
from chorus.models.s3gen.estimator import EstimatorConfig
from chorus.models.s3gen.f0_predictor import F0PredictorConfig
from chorus.models.s3gen.flow import FlowConfig
from chorus.models.s3gen.hift import HiFTConfig, draw_source_noise
from chorus.models.variants import tiny_variant
from chorus.vocoder.pass_graphs import vocode
from tests.models.s3gen.oracle_s3gen import torch_threads
from tests.vocoder.models import random_s3gen, random_voice

GIB = 2**30
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny_turbo():
    return random_s3gen("turbo", seed=5)


# ------------------------------------------------------------------------------ the card table
@pytest.mark.parametrize("name, memory_gib, row, bf16, gbps", [
    ("NVIDIA H100 80GB HBM3", 79.2, "H100 SXM 80GB", 989.5, 3350),
    ("NVIDIA H100 PCIe", 79.6, "H100 PCIe 80GB", 756.5, 2000),
    ("NVIDIA H100 NVL", 93.1, "H100 NVL 94GB", 835.5, 3900),
    ("NVIDIA H200", 139.8, "H200 SXM 141GB", 989.5, 4800),
    ("NVIDIA A100-SXM4-80GB", 79.2, "A100 80GB SXM", 312.0, 2039),
    ("NVIDIA L40S", 44.4, "L40S", 362.05, 864),
])
def test_a_known_card_name_maps_to_its_row(name, memory_gib, row, bf16, gbps):
    roof = resolve_roof(name, int(memory_gib * GIB))
    assert roof.card == row and roof.tflops["bf16"] == bf16 and roof.gbps == gbps


def test_an_a100_has_no_fp8_roof_and_its_memory_tells_the_variants_apart():
    assert "fp8" not in resolve_roof("NVIDIA A100-SXM4-80GB", 80 * GIB).tflops
    assert find_card("NVIDIA A100-SXM4-40GB", 40 * GIB).hbm_gbps == 1555
    assert find_card("NVIDIA H100 80GB HBM3", 96 * GIB) is None  # not the 80 GB part the row describes


def test_an_unknown_card_has_no_roof_unless_both_figures_are_given():
    assert resolve_roof("cpu", None) is None
    assert resolve_roof("Some Future GPU", 200 * GIB) is None
    roof = resolve_roof("cpu", None, peak_tflops=2.0, peak_gbps=100.0)
    assert roof.card is None and roof.peak("bf16") == roof.peak("tf32") == 2.0 and roof.gbps == 100.0
    with pytest.raises(ValueError, match="--peak-tflops and --peak-gbps"):
        resolve_roof("cpu", None, peak_tflops=2.0)


def test_an_override_replaces_one_figure_of_a_known_card():
    roof = resolve_roof("NVIDIA H100 80GB HBM3", 80 * GIB, peak_gbps=3000.0)
    assert roof.card == "H100 SXM 80GB" and roof.gbps == 3000.0 and roof.tflops["bf16"] == 989.5
    assert "peak_gbps given" in roof.source


# ------------------------------------------------------------------------------ the counts
HAND_HIFT = HiFTConfig(base_channels=8, upsample_rates=(2,), upsample_kernel_sizes=(4,), resblock_kernel_sizes=(3,),
                       resblock_dilations=((1,),), source_resblock_kernel_sizes=(3,), source_resblock_dilations=((1,),),
                       istft_n_fft=4, istft_hop=2, f0=F0PredictorConfig(hidden_channels=8))


def test_hifts_classes_equal_a_hand_count():
    """B=2 items of 5 frames, fp32. The one stage upsamples 8 -> 4 channels, 5 -> 10 samples (+1
    reflect pad: 11); a source and one kernel ResBlock, one dilation each: 4 convs k3, 4 Snakes."""
    work = hift_work(HAND_HIFT, batch=2, frames=5, elem=4)
    assert work["hift.upsample"] == Work(2 * 2 * 5 * 8 * 4 * 4, 0, 4 * (2 * 8 * 5 + 2 * 4 * 10 + 8 * 4 * 4 + 4))
    conv = Work(2 * 2 * 11 * 4 * 4 * 3, 0, 4 * (2 * 4 * 11 + 2 * 4 * 11 + 4 * 4 * 3 + 4))
    assert work["hift.resblock_conv"] == conv * 4
    elements = 2 * 4 * 11
    assert work["hift.snake"] == Work(0, 4 * 5 * elements, 4 * 4 * (2 * elements + 4))


def test_the_estimators_attention_equals_a_hand_count():
    """Two levels (down, up; no middle one), one block each: 2 rows of 3 frames, 2 heads of 4."""
    flow = FlowConfig(estimator=EstimatorConfig(channels=8, heads=2, head_dim=4, blocks_per_level=1, mid_levels=0))
    attention = estimator_work(flow, rows=2, frames=3, elem=4)["estimator.attention"]
    per_level = Work(2 * (2 * 2 * 3 * 3 * 8), 5 * 2 * 2 * 3 * 3, 4 * 4 * 2 * 3 * 8)
    assert attention == per_level * 2


def test_the_encoders_attention_equals_a_hand_count_with_and_without_the_kernel():
    """One layer before and one after the x2 upsampling, 2 items of 3 tokens (6 frames), width 32.
    The plain ops multiply Q_pos by all 2T-1 distances and are held to the least traffic of q, k,
    v, out and the table; the fused kernel multiplies each tile of up to 64 keys by a window of
    128 distances and reads both queries; neither has a T x T term in its bytes."""
    flow = FlowConfig(encoder=EncoderConfig(width=32, heads=2, num_layers=1, num_up_layers=1, ffn_width=32))

    def plain(n):
        rows = 2 * n
        return Work(2 * rows * (2 * n - 1) * 32 + 2 * 2 * rows * n * 32, 5 * 2 * 2 * n * n,
                    4 * (4 * rows * 32 + (2 * n - 1) * 32))

    def fused(n):
        rows = 2 * n
        return Work(2 * rows * 128 * 32 + 2 * 2 * rows * n * 32, 5 * 2 * 2 * n * n,
                    4 * (5 * rows * 32 + (2 * n - 1) * 32))

    assert encoder_work(flow, batch=2, tokens=3, elem=4)["encoder.attention"] == plain(3) + plain(6)
    with_kernel = encoder_work(flow, batch=2, tokens=3, elem=4, fused_attention=True)
    assert with_kernel["encoder.attention"] == fused(3) + fused(6)


def test_t3s_attention_reads_each_shared_prompt_once():
    """4 rows (2 CFG pairs) at a context of 10, a 6-token prompt per branch: 2 x 6 prompt tokens
    plus 4 rows x 4 own tokens are read, the 4 new K/V written; 2 layers of 4 heads of 16."""
    t3 = tiny_variant("original", layers=2, hidden=64, heads=4).t3
    work = t3_step_work(t3, rows=4, context=10, prompt_tokens=6, prompts=2, elem=4)["t3.attention"]
    per_layer = Work(2 * 2 * 4 * 10 * 4 * 16, 5 * 4 * 4 * 10, 4 * 4 * (2 * 4 + 2 * 4) * 16 + 4 * 2 * 4 * 16 * (28 + 4))
    assert work == per_layer * 2


def test_a_class_is_held_against_its_binding_roof():
    roof = resolve_roof("cpu", None, peak_tflops=100.0, peak_gbps=1000.0)  # ridge at 100 FLOP/B
    memory = class_figures(Work(0, 10**9, 10**9), 0.004, roof, torch.bfloat16)
    assert memory["bound"] == "memory" and memory["roof_tflops"] == pytest.approx(1.0)
    assert memory["roof_seconds"] == pytest.approx(0.001) and memory["roof_fraction"] == pytest.approx(0.25)
    compute = class_figures(Work(10**12, 0, 10**8), 0.02, roof, torch.bfloat16)
    assert compute["bound"] == "compute" and compute["roof_tflops"] == 100.0 and compute["intensity"] == 10000.0
    assert compute["roof_fraction"] == pytest.approx(0.5) and compute["achieved_tflops"] == pytest.approx(50.0)


# ------------------------------------------------------------------------------ attribution
def test_each_kernel_goes_to_its_innermost_class_range():
    torch.manual_seed(0)
    inner, other = nn.Linear(64, 64), nn.Linear(64, 64)
    outer = nn.Sequential(inner, nn.ReLU())
    x = torch.randn(32, 64)

    def call():
        with torch.inference_mode(), stage("s"):
            h = other(outer(x))
            torch.mm(h, h.T)  # outside every class range: the op rule's class
            h.exp()  # outside every class range and rule: the stage's .other

    with ClassRanges() as ranges:
        ranges.modules([(outer, "outer"), (inner, "inner"), (other, "other")])
        times = profile_classes(call, ranges, ("s",), torch.device("cpu"), ops={"aten::mm": "gemm"})
    assert set(times.seconds) == {"inner", "outer", "other", "gemm", "s.other"}
    assert all(t > 0 for t in times.seconds.values())
    assert times.kernel_seconds == pytest.approx(times.profiled_seconds) and times.kernel_seconds <= times.wall_seconds
    assert not inner._forward_pre_hooks and not inner._forward_hooks  # the ranges are gone


@pytest.mark.gpu
def test_a_triton_kernel_goes_to_the_class_range_it_was_launched_in():
    """Triton launches its kernels through the driver, tied to no PyTorch op: they still count,
    once, in the class whose range was open when they were launched."""
    from chorus.models.s3gen.fused_ops import snake

    class Snake(nn.Module):
        def forward(self, x, alpha):
            return snake(x, alpha, backend="triton")

    fused, linear = Snake(), nn.Linear(256, 256).cuda()
    x, alpha = torch.randn(8, 256, 4096, device="cuda"), torch.rand(256, device="cuda")

    def call():
        with torch.inference_mode(), stage("s"):
            linear(fused(x, alpha).transpose(1, 2))

    call()  # Triton compiles outside the profile
    with ClassRanges() as ranges:
        ranges.modules([(fused, "snake"), (linear, "linear")])
        times = profile_classes(call, ranges, ("s",), torch.device("cuda"))
    assert times.seconds["snake"] > 0 and times.seconds["linear"] > 0
    assert times.kernel_seconds == pytest.approx(times.profiled_seconds, rel=0.02)  # all of it, none twice


@pytest.mark.gpu
def test_the_fused_encoder_attention_goes_to_its_class():
    """The encoder's attention kernel is launched inside ``RelPositionAttention.forward``, the
    range of ``encoder.attention``: with the kernel on, the class still has the attention's time
    and every kernel of the encoder is counted once."""
    s3gen = random_s3gen("turbo", seed=5, device="cuda")
    encoder = s3gen.flow.encoder
    x, lengths = torch.randn(4, 200, 64, device="cuda"), torch.tensor([200, 150, 120, 80], device="cuda")

    def call():
        with torch.inference_mode(), stage("encoder"):
            encoder(x, lengths)

    encoder.ops_backend = "triton"
    call()  # Triton compiles outside the profile
    with ClassRanges() as ranges:
        s3gen_ranges(ranges, s3gen)
        times = profile_classes(call, ranges, ("encoder",), torch.device("cuda"))
    assert times.seconds["encoder.attention"] > 0 and times.seconds["encoder.linear"] > 0
    assert times.kernel_seconds == pytest.approx(times.profiled_seconds, rel=0.02)  # all of it, none twice


def test_a_tiny_hifts_time_lands_in_its_classes(tiny_turbo):
    hift = tiny_turbo.mel2wav
    mel = torch.randn(2, 80, 6)
    noise = draw_source_noise([6, 6], hift.config)

    def call():
        with torch.inference_mode(), stage("hift"):
            vocode(hift, mel, torch.tensor([6, 5]), noise)

    with ClassRanges() as ranges:
        s3gen_ranges(ranges, tiny_turbo)
        times = profile_classes(call, ranges, ("encoder", "estimator", "hift"), torch.device("cpu"))
    # Snake's own class has time only where the ResBlocks call the Snake modules (not fused with the convs)
    assert {"hift.source", "hift.conv", "hift.upsample", "hift.resblock_conv", "hift.istft"} <= set(times.seconds)
    assert set(times.seconds) <= {"hift.source", "hift.conv", "hift.upsample", "hift.resblock_conv", "hift.istft",
                                  "hift.snake", "hift.other"}
    assert times.kernel_seconds <= times.wall_seconds
    assert "_inverse_stft" not in vars(hift) and not hift.conv_pre._forward_hooks  # the model is as it was


# ------------------------------------------------------------------------------ the reports
def test_the_vocoder_bench_reports_a_roofline_per_pass_and_plots_it(tiny_turbo, tmp_path, monkeypatch):
    voice = random_voice(12, seed=2)
    cfg = vocoder_bench.VocoderBenchConfig(variant="turbo", device="cpu", batch_sizes=(2,), new_tokens=(4,),
                                           repeats=1, warmup_passes=0, yardstick=False, roofline=True,
                                           peak_tflops=1.0, peak_gbps=50.0)
    report = vocoder_bench.run(cfg, s3gen=tiny_turbo, voice=voice)
    assert report["roof"] == {"known": True, "device_name": "cpu", "card": None,
                              "peak_tflops": {"bf16": 1.0, "fp8": 1.0, "tf32": 1.0}, "hbm_gbps": 50.0,
                              "source": "given"}
    (entry,) = report["passes"]
    roofline = entry["roofline"]
    work = vocoder_bench.pass_work(tiny_turbo.flow.config, tiny_turbo.mel2wav.config, 2, 12, entry["pass_tokens"],
                                   entry["n_steps"], False, elem=4)
    counted = {name: w for module in work.values() for name, w in module.items()}
    assert set(counted) <= set(roofline["classes"])
    for name, c in roofline["classes"].items():
        assert set(c) == {"seconds", "flops", "matmul_flops", "bytes", "intensity", "achieved_tflops",
                          "achieved_gbps", "precision", "roof_tflops", "bound", "roof_seconds", "roof_fraction"}
        if name in counted:
            assert (c["flops"], c["bytes"]) == (counted[name].total_flops, counted[name].bytes)
            assert c["precision"] == "tf32" and c["roof_seconds"] > 0
        else:
            assert name.endswith(".other") and c["bytes"] == 0 and c["roof_seconds"] == 0.0
    assert sum(c["seconds"] for c in roofline["classes"].values()) == pytest.approx(roofline["kernel_seconds"], abs=1e-5)
    assert roofline["kernel_seconds"] <= roofline["profiled_wall_seconds"]
    assert roofline["roofline_fraction"] == pytest.approx(roofline["roof_seconds"] / entry["stage_pass_seconds"],
                                                          rel=2e-3)
    assert sum(c["matmul_flops"] for c in roofline["classes"].values()) == entry["flops"]["total"]
    assert "of the roofline" in vocoder_bench.format_table(report)

    out = tmp_path / "vocoder.json"
    monkeypatch.setattr(vocoder_bench, "run", lambda c: report)
    vocoder_bench.main_json(cfg, str(out))
    written = json.loads(out.read_text())
    plot = tmp_path / written["passes"][0]["roofline_plot"]
    assert plot.name == "vocoder-roofline-b2-n4.png" and plot.read_bytes()[:8] == PNG_MAGIC


def test_on_the_cpu_the_report_says_no_roof_is_known(tiny_turbo, tmp_path):
    cfg = vocoder_bench.VocoderBenchConfig(variant="turbo", device="cpu", batch_sizes=(1,), new_tokens=(3,),
                                           repeats=1, warmup_passes=0, yardstick=False, roofline=True)
    report = vocoder_bench.run(cfg, s3gen=tiny_turbo, voice=random_voice(12, seed=3))
    assert report["roof"]["known"] is False and "--peak-tflops" in report["roof"]["why"]
    roofline = report["passes"][0]["roofline"]
    assert roofline["roofline_fraction"] is None
    assert all(c["roof_fraction"] is None and c["roof_tflops"] is None for c in roofline["classes"].values())
    assert roofline["classes"]["hift.resblock_conv"]["achieved_tflops"] > 0
    path = tmp_path / "plot.png"
    write_plot(path, roofline, report["roof"], "no roof")  # the points without roof lines
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_the_t3_bench_reports_a_decode_steps_gemms_and_attention(tmp_path):
    from chorus.bench.t3_bench import T3BenchConfig, main_json

    text = tmp_path / "text.txt"
    text.write_text("A first short sentence. And a second one follows it here.")
    variant = tiny_variant("original", layers=2, hidden=64, heads=4)
    cfg = T3BenchConfig(variant=variant, device="cpu", batch_sizes=(2,), decode_steps=2, warmup_steps=1,
                        text_file=str(text), max_chars=40, tokens_per_char=0.5, cuda_graphs=False, max_num_seqs=8,
                        max_num_batched_tokens=1024, max_model_len=512, workload=False, yardstick=False,
                        roofline=True, peak_tflops=1.0, peak_gbps=50.0)
    out = tmp_path / "t3.json"
    report = main_json(cfg, str(out))
    (decode,) = report["decode"]
    roofline = decode["roofline"]
    assert roofline["rows"] == 4 and roofline["context_tokens"] > roofline["prompt_tokens"]
    expected = t3_step_work(variant.t3, 4, roofline["context_tokens"], roofline["prompt_tokens"], 2, 4)
    for name in ("t3.linear", "t3.attention"):
        c = roofline["classes"][name]
        assert c["seconds"] > 0 and (c["flops"], c["bytes"]) == (expected[name].total_flops, expected[name].bytes)
    assert roofline["kernel_seconds"] <= roofline["profiled_wall_seconds"]
    assert (tmp_path / decode["roofline_plot"]).read_bytes()[:8] == PNG_MAGIC


# ------------------------------------------------------------------------------ the command line
def test_the_cli_maps_the_roofline_options(monkeypatch):
    from chorus import cli

    seen = {}
    monkeypatch.setattr(vocoder_bench, "main_json", lambda cfg, out: seen.update(cfg=cfg))
    assert cli.main(["bench", "vocoder", "--roofline", "--peak-tflops", "500", "--peak-gbps", "2000"]) == 0
    assert (seen["cfg"].roofline, seen["cfg"].peak_tflops, seen["cfg"].peak_gbps) == (True, 500.0, 2000.0)


@pytest.mark.parametrize("args, message", [
    (["--peak-tflops", "500"], "--peak-tflops needs --roofline"),
    (["--roofline", "--peak-gbps", "0"], "--peak-gbps must be positive"),
])
def test_the_cli_refuses_roofline_options_that_cannot_apply(args, message, capsys):
    from chorus import cli

    assert cli.main(["bench", "vocoder", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_matplotlib_fails_with_the_extra_to_install(monkeypatch, tmp_path, capsys):
    from chorus import cli

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without it imports
    with pytest.raises(RuntimeError, match=r"chorus-tts\[bench\]"):
        require_matplotlib()
    assert cli.main(["bench", "vocoder", "--roofline", "--out", str(tmp_path / "v.json")]) == 2
    assert "pip install 'chorus-tts[bench]'" in capsys.readouterr().err

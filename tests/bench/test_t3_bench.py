"""``chorus bench t3`` measures what it claims, on a tiny random T3 on the CPU (the real loading,
engine and report code), so the benchmark cannot rot between GPU runs."""
from __future__ import annotations

import json

import pytest

from chorus.bench.t3_bench import T3BenchConfig, main_json
from chorus.models.variants import tiny_variant
from chorus.text import split_into_chunks


def test_the_t3_bench_reports_decode_steps_and_the_workload(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("A first short sentence. And a second one follows it here.")
    out = tmp_path / "t3.json"
    cfg = T3BenchConfig(variant=tiny_variant("turbo", layers=2, hidden=64, heads=4), device="cpu",
                        batch_sizes=(1, 3), decode_steps=3, warmup_steps=1, text_file=str(text), max_chars=40,
                        tokens_per_char=0.5, cuda_graphs=False, max_num_seqs=8, max_num_batched_tokens=1024,
                        max_model_len=512)
    report = main_json(cfg, str(out))
    assert json.loads(out.read_text()) == report
    assert report["random_weights"] is True and report["device"] == "cpu" and report["dtype"] == "fp32"
    assert report["provenance"]["card"] == "cpu"  # where it ran (chorus/bench/report.py: every bench's)
    assert [(d["batch"], d["rows"]) for d in report["decode"]] == [(1, 1), (3, 3)]  # turbo: no CFG rows
    assert report["decode"][0]["context_tokens"] == report["decode"][0]["prompt_tokens"] + 3
    for decode in report["decode"]:
        assert decode["step_ms"] > 0 and decode["speech_tokens_per_s"] > 0
        assert decode["yardstick_step_ms"] > 0 and decode["yardstick_ratio"] > 0
        assert decode["yardstick_ratio"] == pytest.approx(decode["yardstick_step_ms"] / decode["step_ms"], rel=0.01,
                                                          abs=1e-3)
        # prefill gives the first token, one warm-up step, then the middle of 3 timed steps; a
        # request whose prefill was split over two steps lags its batch by a token
        assert 0 <= decode["context_tokens"] - (decode["prompt_tokens"] + 1 + 1 + 1) <= 1
        phases = decode["breakdown_ms"]
        assert set(phases) == {"schedule", "prepare", "forward", "sample", "update"}
        # their sum vs step_ms is timing: the bench reports it; sample is a difference of two
        # timings, which noise can bring to 0
        assert all(v > 0 for k, v in phases.items() if k != "sample") and phases["sample"] >= 0
    workload = report["workload"]
    assert workload["chunks"] == 2
    assert workload["speech_tokens"] == sum(max(1, round(0.5 * len(c))) for c in
                                            ("A first short sentence.", "And a second one follows it here."))
    longest = max(round(0.5 * len("And a second one follows it here.")), round(0.5 * len("A first short sentence.")))
    assert workload["t3_seconds"] > 0 and workload["engine_steps"] >= longest
    timeline = workload["timeline"]
    assert len(timeline["steps_ms"]) == len(timeline["steps_rows"]) == workload["engine_steps"]
    assert sum(timeline[k]["steps"] for k in ("admission", "changed", "steady")) == workload["engine_steps"]
    assert timeline["admission"]["steps"] >= 1 and timeline["steps_rows"][0] == 0  # nothing ran before the first
    assert 0 <= timeline["sync_steps"] <= workload["engine_steps"]
    # the kernel warm-up runs on CUDA only: on the CPU the engines report none
    assert workload["engine_warmup_seconds"] is None and workload["cold_t3_seconds"] > 0
    assert all(d["engine_warmup_seconds"] is None for d in report["decode"])
    yardstick = report["yardstick"]
    assert yardstick["mode"] == "eager" and yardstick["backbone"] == "gpt2"
    assert yardstick["num_layers"] == 2 and yardstick["parameters"] > 0
    assert "chunk_sweep" not in report


def test_the_t3_bench_sweeps_chunk_bounds_and_calibrates_cfg_rows(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("A first short sentence here. A second one, somewhat longer, follows it closely. "
                    "And then a third sentence, the longest of them all, ends this little text.")
    cfg = T3BenchConfig(variant=tiny_variant("original", layers=2, hidden=64, heads=4), device="cpu",
                        batch_sizes=(2,), decode_steps=2, warmup_steps=1, text_file=str(text), max_chars=80,
                        chunk_chars=(40, 120), tokens_per_char=0.2, cuda_graphs=False, max_num_seqs=16,
                        max_num_batched_tokens=1024, max_model_len=512)
    report = main_json(cfg, None)
    decode = report["decode"][0]
    assert decode["rows"] == 4 and decode["yardstick_step_ms"] > 0 and decode["yardstick_ratio"] > 0  # CFG: 2 rows each
    assert report["yardstick"]["backbone"] == "llama"
    sweep = report["chunk_sweep"]
    assert [s["max_chars"] for s in sweep] == [40, 120]
    for entry in sweep:
        chunks = split_into_chunks(text.read_text(), max_chars=entry["max_chars"])
        longest = max(len(c) for c in chunks)
        assert entry["chunks"] == len(chunks) and entry["longest_chunk_chars"] == longest
        assert entry["longest_chunk_steps"] == round(0.2 * longest)
        assert entry["t3_seconds"] > 0 and entry["engine_steps"] >= entry["longest_chunk_steps"]
        assert entry["rows"] == 2 * len(chunks) and entry["max_num_seqs"] == 16
    assert sweep[0]["chunks"] > sweep[1]["chunks"] and sweep[0]["longest_chunk_chars"] <= 40
    err = capsys.readouterr().err
    assert "yard/step" in err and "max_chars" in err


def test_the_t3_bench_runs_on_an_fp8_kv_cache_and_reports_its_accuracy(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("A first short sentence. And a second one follows it here.")
    cfg = T3BenchConfig(variant=tiny_variant("turbo", layers=2, hidden=64, heads=4), device="cpu",
                        batch_sizes=(2,), decode_steps=2, warmup_steps=1, text_file=str(text), max_chars=40,
                        tokens_per_char=0.3, cuda_graphs=False, yardstick=False, max_num_seqs=8,
                        max_num_batched_tokens=1024, max_model_len=512, kv_cache_dtype="fp8_e4m3",
                        kv_accuracy_steps=3)
    report = main_json(cfg, None)
    kv = report["kv_cache"]
    assert kv["dtype"] == "fp8_e4m3" and kv["versus"] == "fp32" and kv["scale_rule"] == "calibrated"
    assert kv["steps"] == 4 and 0.99 < kv["logits_cosine_min"] <= kv["logits_cosine_mean"] <= 1.0
    assert 0 <= kv["top1_agreement"] <= 1
    # 2 layers x K and V x 16 positions x 4 heads x 16 dims, one byte each
    assert kv["bytes_per_block"] == 2 * 2 * 16 * 4 * 16
    assert report["decode"][0]["step_ms"] > 0 and report["workload"]["speech_tokens"] > 0


def test_the_t3_bench_names_the_model_dtype_cache_by_default(tmp_path):
    from chorus.bench.t3_bench import bench_kv_cache
    from tests.engine.tiny_models import tiny

    variant, model = tiny("turbo")
    kv = bench_kv_cache(model, variant, None, [1, 2], T3BenchConfig(variant=variant))
    assert kv == {"dtype": "fp32", "bytes_per_block": 4 * 2 * 2 * 16 * 4 * 16, "block_size": 16}


def test_the_kv_cache_dtype_flag_reaches_the_bench_config(monkeypatch):
    import chorus.bench.t3_bench as t3_bench
    from chorus.cli import main

    configs = []
    monkeypatch.setattr(t3_bench, "main_json", lambda cfg, out: configs.append(cfg))
    assert main(["bench", "t3", "--kv-cache-dtype", "fp8_e4m3"]) == 0
    assert main(["bench", "t3"]) == 0
    assert [c.kv_cache_dtype for c in configs] == ["fp8_e4m3", "auto"]


def test_the_no_warm_up_flag_reaches_the_engine_config(monkeypatch):
    from types import SimpleNamespace

    import torch

    import chorus.bench.t3_bench as t3_bench
    from chorus.cli import main
    from chorus.models.variants import get_variant

    configs = []
    monkeypatch.setattr(t3_bench, "main_json", lambda cfg, out: configs.append(cfg))
    assert main(["bench", "t3", "--no-warm-up"]) == 0
    assert main(["bench", "t3"]) == 0
    assert [c.warm_up_kernels for c in configs] == [False, True]
    engines = []
    monkeypatch.setattr(t3_bench, "T3Engine", lambda model, variant, config, **kw: engines.append(config))
    model = SimpleNamespace(device=torch.device("cpu"))
    for cfg in configs:
        t3_bench.bench_engine(model, get_variant("turbo"), cfg, 4)
    assert [e.warm_up_kernels for e in engines] == [False, True]


def test_the_t3_bench_measures_the_timestamps_cost_with_alignment_kept_idle_and_asked_for(tmp_path):
    # 14 layers of 16 heads: the smallest Llama stack that has the alignment heads
    cfg = T3BenchConfig(variant=tiny_variant("original", layers=14, hidden=64, heads=16), device="cpu",
                        batch_sizes=(2,), decode_steps=2, warmup_steps=1, workload=False, yardstick=False,
                        timestamps=True, cuda_graphs=False, max_num_seqs=8, max_num_batched_tokens=1024,
                        max_model_len=512)
    report = main_json(cfg, str(tmp_path / "t3.json"))
    (entry,) = report["timestamps_cost"]["entries"]
    assert (entry["batch"], entry["rows"]) == (2, 4)  # CFG: two rows a request
    assert entry["step_ms_off"] == report["decode"][0]["step_ms"]
    assert entry["step_ms_idle"] > 0 and entry["step_ms_all_rows"] > 0
    assert entry["cost_all_rows"] == pytest.approx(entry["step_ms_all_rows"] / entry["step_ms_off"] - 1, abs=1e-3)


def test_the_t3_bench_refuses_the_timestamps_cost_where_no_alignment_heads_are_known():
    cfg = T3BenchConfig(variant=tiny_variant("turbo", layers=2, hidden=64, heads=4), device="cpu", batch_sizes=(1,),
                        decode_steps=1, warmup_steps=1, workload=False, yardstick=False, timestamps=True,
                        cuda_graphs=False, max_num_seqs=4, max_num_batched_tokens=1024, max_model_len=512)
    with pytest.raises(ValueError, match="no alignment heads are known for the gpt2"):
        main_json(cfg, None)


def test_the_t3_bench_runs_fp8_linears_and_reports_their_error_beside_bf16_s(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("A first short sentence. And a second one follows it here.")
    cfg = T3BenchConfig(variant=tiny_variant("original", layers=2, hidden=64, heads=4), device="cpu",
                        batch_sizes=(2,), decode_steps=2, warmup_steps=1, text_file=str(text), max_chars=40,
                        tokens_per_char=0.3, cuda_graphs=False, yardstick=False, max_num_seqs=8,
                        max_num_batched_tokens=1024, max_model_len=512, fp8_linears=True, fp8_error_steps=5)
    report = main_json(cfg, None)
    error = report["fp8_error"]
    assert report["fp8_linears"] is True and report["dtype"] == "fp32"
    assert error["steps"] == 6 and error["low_dtype"] == "bf16"
    for pair in ("cosine_bf16_vs_fp32", "cosine_fp8_vs_fp32", "cosine_fp8_vs_bf16"):
        assert 0.9 < error[pair]["min"] <= error[pair]["mean"] <= 1.0
    # FP8's 3 mantissa bits against bf16's 8: on these weights it is farther from bf16 than bf16 from fp32
    assert error["cosine_fp8_vs_bf16"]["mean"] < error["cosine_bf16_vs_fp32"]["mean"]
    assert error["within_bf16_error"] is False
    assert 0 <= error["top1_agreement_fp8_vs_bf16"] <= 1 and 0 <= error["top1_agreement_bf16_vs_fp32"] <= 1
    assert report["decode"][0]["step_ms"] > 0 and report["workload"]["speech_tokens"] > 0
    assert "FP8 linears over 6 steps" in capsys.readouterr().err


def test_the_fp8_flag_reaches_the_bench_config(monkeypatch):
    import chorus.bench.t3_bench as t3_bench
    from chorus.cli import main

    configs = []
    monkeypatch.setattr(t3_bench, "main_json", lambda cfg, out: configs.append(cfg))
    assert main(["bench", "t3", "--fp8", "t3", "--fp8-error-steps", "8"]) == 0
    assert main(["bench", "t3"]) == 0
    assert [(c.fp8_linears, c.fp8_error_steps) for c in configs] == [(True, 8), (False, 64)]

"""``chorus bench t3`` measures what it claims, on a tiny random T3 on the CPU (the real loading,
engine and report code), so the benchmark cannot rot between GPU runs."""
from __future__ import annotations

import json

from chorus.bench.t3_bench import T3BenchConfig, main_json
from chorus.models.variants import tiny_variant


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
    assert [(d["batch"], d["rows"]) for d in report["decode"]] == [(1, 1), (3, 3)]  # turbo: no CFG rows
    for decode in report["decode"]:
        assert decode["step_ms"] > 0 and decode["speech_tokens_per_s"] > 0
        phases = decode["breakdown_ms"]
        assert set(phases) == {"schedule", "prepare", "forward", "sample", "update"}
        assert 0 < sum(phases.values()) <= decode["step_ms"] * 1.5
    workload = report["workload"]
    assert workload["chunks"] == 2
    assert workload["speech_tokens"] == sum(max(1, round(0.5 * len(c))) for c in
                                            ("A first short sentence.", "And a second one follows it here."))
    longest = max(round(0.5 * len("And a second one follows it here.")), round(0.5 * len("A first short sentence.")))
    assert workload["t3_seconds"] > 0 and workload["engine_steps"] >= longest

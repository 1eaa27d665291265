"""``chorus bench sampler`` and ``chorus bench shared-prefix``: kernel micro-benchmarks on a CUDA
GPU (their figures: docs/sampling.md, docs/engine.md)."""
from __future__ import annotations

import json

import pytest
import torch

from chorus.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
@pytest.mark.parametrize("stage", ["sampler", "shared-prefix"])
def test_without_cuda_the_bench_says_so(stage, capsys):
    assert main(["bench", stage]) == 2
    assert f"chorus bench {stage} needs a CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
def test_the_sampler_bench_times_both_paths_per_variant_and_rows(tmp_path):
    out = tmp_path / "sampler.json"
    assert main(["bench", "sampler", "--variants", "turbo", "--rows", "1,64", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(r["variant"], r["rows"]) for r in report["results"]] == [("turbo", 1), ("turbo", 64)]
    for result in report["results"]:
        assert all(result[key] > 0 for key in ("draw_torch_us", "draw_triton_us", "step_torch_us", "step_triton_us"))


@pytest.mark.gpu
def test_the_shared_prefix_bench_times_every_case_against_the_reference(tmp_path):
    out = tmp_path / "shared_prefix.json"
    assert main(["bench", "shared-prefix", "--quick", "--out", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert [(c["rows"], c["prefix_tokens"]) for c in cases] == [(r, p) for r in (1, 8, 64, 256) for p in (0, 34, 400)]
    for case in cases:
        assert "error" not in case, case
        assert case["ms_plain"] > 0 and case["ms_shared"] > 0
        assert case["rel_err_shared"] <= 2 * case["rel_err_plain"] + 1e-3  # the plan costs no accuracy

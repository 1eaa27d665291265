"""How far apart a full-size random-weight turbo stage's streams are (CUDA): fp32 and bf16, with
the plain ops and with each kernel option (``flow_ops``, ``hift_ops``), and the same bf16 stage
run twice. Writes every pair's per-stream SNR in dB as JSON; docs/vocoder.md, "Fused flow norms",
says what it showed and why the kernels' GPU tests compare with fp32.

    python3 scripts/gpu/stage_kernel_snr.py OUT.json   (from the repository root)
"""
from __future__ import annotations

import json
import math
import sys
import time

import torch

from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.vocoder.quality import snr_db
from tests.vocoder.conftest import graphed_and_eager_stream_audio
from tests.vocoder.models import random_s3gen

RUNS = {  # name: (dtype, flow_ops, hift_ops)
    "fp32": ("fp32", "torch", "auto"),
    "fp32_flow_kernels": ("fp32", "auto", "auto"),
    "bf16": ("bf16", "torch", "auto"),
    "bf16_again": ("bf16", "torch", "auto"),
    "bf16_flow_kernels": ("bf16", "auto", "auto"),
    "bf16_no_snake_kernel": ("bf16", "torch", "torch"),
}
PAIRS = [("bf16", "bf16_again"), ("bf16", "bf16_flow_kernels"), ("bf16", "bf16_no_snake_kernel"),
         ("fp32", "fp32_flow_kernels"), ("fp32", "bf16"), ("fp32", "bf16_flow_kernels"),
         ("fp32", "bf16_no_snake_kernel")]


def main(out: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    start, models, audio = time.perf_counter(), {}, {}
    for name, (dtype, flow_ops, hift_ops) in RUNS.items():
        if dtype not in models:
            models[dtype] = random_s3gen("turbo", tiny=False, seed=3, device="cuda",
                                         dtype=torch.float32 if dtype == "fp32" else torch.bfloat16)
        stage = VocoderStage(models[dtype], VocoderConfig(max_graph_rows=4, flow_ops=flow_ops, hift_ops=hift_ops))
        stage.warmup(prompt_tokens=30, chunk_tokens=60, max_items=4)
        audio[name] = {job: wav.float() for job, wav in graphed_and_eager_stream_audio(stage).items()}
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
    report = {"runs": RUNS, "device_name": torch.cuda.get_device_name(), "snr_db": {}}
    for a, b in PAIRS:
        snrs = {job: snr_db(audio[a][job], audio[b][job]) for job in audio[a]}
        report["snr_db"][f"{a} vs {b}"] = {job: "inf" if math.isinf(v) else round(v, 2) for job, v in snrs.items()}
        print(f"{a} vs {b}: {report['snr_db'][f'{a} vs {b}']}")
    with open(out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

"""The same T3 code on a CUDA device: fp32 matches the CPU, bf16 tracks fp32."""
import pytest
import torch

from chorus.models.t3 import T3Model, T3SingleSequence
from chorus.models.variants import tiny_variant
from tests.models.t3.weights import random_t3_state

pytestmark = pytest.mark.gpu


def _logits(name: str, *, device: str, dtype: torch.dtype) -> torch.Tensor:
    config = tiny_variant(name).t3
    model = T3Model.from_state_dict(config, random_t3_state(config, 0), dtype=dtype, device=device)
    g = torch.Generator().manual_seed(1)
    speaker, prompt = torch.randn(1, 256, generator=g), torch.randint(0, 6561, (1, 30), generator=g)
    text = torch.randint(1, 255, (9,), generator=g)
    cond = model.encode_conditioning(speaker, prompt, 0.5)
    runner = T3SingleSequence(model, cond, text, cfg=config.supports_cfg, max_new_tokens=8)
    steps = [runner.prefill()] + [runner.decode(t) for t in (1, 200, 3000, 6560, 7, 8, 9, 10)]
    return torch.stack(steps).float().cpu()


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_cuda_fp32_matches_cpu(name):
    cpu = _logits(name, device="cpu", dtype=torch.float32)
    cuda = _logits(name, device="cuda", dtype=torch.float32)
    assert float((cpu - cuda).abs().max()) <= 1e-4


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_cuda_bf16_tracks_fp32(name):
    fp32 = _logits(name, device="cuda", dtype=torch.float32)
    bf16 = _logits(name, device="cuda", dtype=torch.bfloat16)
    assert torch.isfinite(bf16).all()
    assert float((fp32 - bf16).abs().max()) < 0.05 * float(fp32.abs().max())


def test_prompt_embeddings_do_not_wait_for_the_work_queued_on_the_device():
    """An arrival is embedded while a T3 step runs: the text's copy to the device is queued
    behind that step, not waited for (with ``admit_ahead`` the admitting step is then launched
    while the step in flight still runs)."""
    config = tiny_variant("turbo").t3
    model = T3Model.from_state_dict(config, random_t3_state(config, 0), device="cuda")
    cond = model.encode_conditioning(torch.randn(1, 256), torch.randint(0, 6561, (1, 10)), 0.5)
    want = model.prefill_embeds(cond, torch.tensor([5, 6, 7]), cfg=False)
    torch.cuda.synchronize()
    torch.cuda._sleep(1 << 31)  # a step that keeps the device busy for about a second
    busy = torch.cuda.Event()
    busy.record()
    got = model.prefill_embeds_many([(cond, torch.tensor([5, 6, 7]), False)])[0]
    assert not busy.query(), "the embedding waited for the device's queued work"
    torch.cuda.synchronize()
    assert torch.equal(got, want)

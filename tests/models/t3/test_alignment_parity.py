"""The alignment map of ``T3SingleSequence(alignment=True)`` against the reference's attention
probabilities on the heads its alignment analyzer reads (0.1.7's T3, eager attention with
attention outputs on, random weights): one row per query that produced a speech token (the last
BOS copy, then each fed token), the conditional row's attention on the framed text, averaged
over the heads.

Tiny stacks are 14 layers x 16 heads (the smallest that have every alignment head); the full-size
case runs one short request on CPU.
"""
import gc

import pytest
import torch

from chorus.models.t3 import T3Model, T3SingleSequence
from chorus.models.variants import get_variant, tiny_variant
from tests.models.t3.oracle_t3 import Scenario, build_oracle_t3, make_request, report, run_oracle

pytestmark = pytest.mark.oracle

TOLERANCE = 1e-5  # probabilities in [0, 1], fp32 on both sides


def _reference_map(t3, config, request, scenario) -> torch.Tensor:
    """The reference's own loop with forward hooks on the attention of the heads its analyzer reads."""
    from chatterbox.models.t3.inference.alignment_stream_analyzer import LLAMA_ALIGNED_HEADS

    per_head = {tuple(pair): [] for pair in LLAMA_ALIGNED_HEADS}
    hooks = []
    for layer, head in LLAMA_ALIGNED_HEADS:
        def keep(_module, _inputs, output, pair=(layer, head)):
            per_head[pair].append(output[1][0, pair[1]].detach().clone())  # batch row 0: conditional
        hooks.append(t3.tfmr.layers[layer].self_attn.register_forward_hook(keep))
    # what the reference's analyzer switches on for the layers it reads
    t3.tfmr.config._attn_implementation = "eager"
    t3.tfmr.config.output_attentions = True
    try:
        capture = run_oracle(t3, config, request, scenario)
    finally:
        for hook in hooks:
            hook.remove()
    text_start = capture.cond.shape[1]
    text_end = text_start + len(request.text) + 2  # SOT ... EOT
    forwards = [torch.stack(maps).mean(dim=0) for maps in zip(*per_head.values())]
    # each forward's last row: the prefill's last BOS copy, then each fed token
    return torch.cat([f[-1:, text_start:text_end] for f in forwards])


def _chorus_map(model, request, scenario) -> torch.Tensor:
    with torch.inference_mode():
        cond = model.encode_conditioning(request.speaker, request.prompt, scenario.exaggeration)
    runner = T3SingleSequence(model, cond, request.text, cfg=scenario.cfg, max_new_tokens=len(request.fed_tokens),
                              alignment=True)
    runner.prefill()
    for token in request.fed_tokens:
        runner.decode(token)
    return runner.alignment_map


def _compare(variant, scenario, *, text_len: int, steps: int, label: str) -> None:
    config = variant.t3
    request = make_request(config, seed=3, text_len=text_len, steps=steps)
    t3 = build_oracle_t3(config, seed=0)
    state = {k: v.detach().clone() for k, v in t3.state_dict().items()}
    reference = _reference_map(t3, config, request, scenario)
    del t3
    gc.collect()
    ours = _chorus_map(T3Model.from_state_dict(config, state), request, scenario)
    assert ours.shape == reference.shape == (steps + 1, text_len + 2)
    error = float((ours - reference).abs().max())
    assert report(f"alignment map {label}", error) <= TOLERANCE


@pytest.mark.parametrize("name", ["original", "multilingual"])
@pytest.mark.parametrize("cfg", [True, False])
def test_tiny_alignment_map_matches_reference_heads(oracle, name, cfg):
    variant = tiny_variant(name, layers=14, hidden=64, heads=16)
    _compare(variant, Scenario(0.5, cfg=cfg), text_len=9, steps=12, label=f"tiny {name} cfg={cfg}")


@pytest.mark.fullsize
def test_full_size_alignment_map_matches_reference_heads(oracle):
    _compare(get_variant("multilingual"), Scenario(0.5, cfg=True), text_len=6, steps=4, label="full-size multilingual")


def test_alignment_is_refused_for_gpt2_variants():
    model = T3Model(tiny_variant("turbo").t3)
    with pytest.raises(ValueError, match="no alignment heads are known for the gpt2 T3 backbone"):
        T3SingleSequence(model, torch.zeros(1, 3, 64), torch.tensor([1, 2]), cfg=False, alignment=True)


def test_alignment_is_refused_for_a_stack_without_the_heads():
    model = T3Model(tiny_variant("original").t3)  # 2 layers, 4 heads
    with pytest.raises(ValueError, match="alignment head 15 of layer 12 does not exist"):
        T3SingleSequence(model, torch.zeros(1, 34, 64), torch.tensor([1, 2]), cfg=False, alignment=True)

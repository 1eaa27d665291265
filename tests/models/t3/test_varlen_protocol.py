"""The attention-cache protocol carries rows of different lengths in one flat batch.

A minimal list-based cache (a stand-in for the engine's paged one) runs a CFG pair that is
decoding and another request that is still in prefill through ONE backbone call; the logits
must equal each request run alone through ``T3SingleSequence``.
"""
import math

import torch

from chorus.models.t3 import AttentionCache, T3Model, T3SingleSequence
from chorus.models.variants import tiny_variant
from tests.models.t3.weights import random_t3_state


class ListKVCache(AttentionCache):
    """Per-row growing k/v lists; the layout is a list of (row, new tokens) segments."""

    def __init__(self):
        self.keys: dict[tuple[int, int], torch.Tensor] = {}
        self.values: dict[tuple[int, int], torch.Tensor] = {}
        self.lengths: dict[int, int] = {}
        self.segments: list[tuple[int, int]] = []

    def begin(self, segments: list[tuple[int, int]]) -> torch.Tensor:
        self.segments = segments
        return torch.cat([
            torch.arange(self.lengths.get(row, 0), self.lengths.get(row, 0) + n) for row, n in segments
        ])

    def end(self) -> None:
        for row, n in self.segments:
            self.lengths[row] = self.lengths.get(row, 0) + n

    def attend(self, layer, q, k, v):
        outs, start = [], 0
        for row, n in self.segments:
            sl = slice(start, start + n)
            start += n
            past = self.lengths.get(row, 0)
            key = (layer, row)
            self.keys[key] = torch.cat([self.keys.get(key, k[:0]), k[sl]])
            self.values[key] = torch.cat([self.values.get(key, v[:0]), v[sl]])
            scores = torch.einsum("thd,shd->hts", q[sl], self.keys[key]) / math.sqrt(q.shape[-1])
            allowed = torch.arange(past + n)[None, :] <= torch.arange(past, past + n)[:, None]
            scores = scores.masked_fill(~allowed, float("-inf"))
            outs.append(torch.einsum("hts,shd->thd", scores.softmax(-1), self.values[key]))
        return torch.cat(outs)


def _model() -> T3Model:
    config = tiny_variant("original").t3
    return T3Model.from_state_dict(config, random_t3_state(config, 0))


@torch.inference_mode()
def test_mixed_prefill_and_decode_rows_match_single_runs():
    model = _model()
    g = torch.Generator().manual_seed(1)
    prompt_a = torch.randint(0, 6561, (1, 9), generator=g)
    cond_a = model.encode_conditioning(torch.randn(1, 256, generator=g), prompt_a, 0.5)
    cond_b = model.encode_conditioning(torch.randn(1, 256, generator=g), None, 0.9)
    text_a, text_b = torch.randint(1, 255, (6,), generator=g), torch.randint(1, 255, (11,), generator=g)

    alone_a = T3SingleSequence(model, cond_a, text_a, cfg=True, max_new_tokens=2)
    alone_b = T3SingleSequence(model, cond_b, text_b, cfg=False, max_new_tokens=1)
    want_a = [alone_a.prefill(), alone_a.decode(11), alone_a.decode(12)]
    want_b = [alone_b.prefill(), alone_b.decode(99)]

    cache = ListKVCache()
    a_rows = model.prefill_embeds(cond_a, text_a, cfg=True)  # rows 0, 1
    b_rows = model.prefill_embeds(cond_b, text_b, cfg=False)  # row 2
    dim = a_rows.shape[-1]

    def step(segments, embeds):
        positions = cache.begin(segments)
        hidden = model(embeds, positions, cache)
        cache.end()
        ends = torch.tensor([n for _, n in segments]).cumsum(0) - 1
        return model.speech_logits(hidden[ends])

    # step 1: request A prefills alone
    got = step([(0, a_rows.shape[1]), (1, a_rows.shape[1])], a_rows.reshape(-1, dim))
    torch.testing.assert_close(got, want_a[0], rtol=0, atol=1e-5)

    # step 2: A decodes its first token while B prefills, in one call
    a_tok = model.speech_embeds(torch.tensor([11, 11]), torch.tensor([1, 1]))
    got = step([(0, 1), (1, 1), (2, b_rows.shape[1])], torch.cat([a_tok, b_rows[0]]))
    torch.testing.assert_close(got[:2], want_a[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[2:], want_b[0], rtol=0, atol=1e-5)

    # step 3: both decode, at different speech positions and cache lengths
    embeds = model.speech_embeds(torch.tensor([12, 12, 99]), torch.tensor([2, 2, 1]))
    got = step([(0, 1), (1, 1), (2, 1)], embeds)
    torch.testing.assert_close(got[:2], want_a[2], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[2:], want_b[1], rtol=0, atol=1e-5)

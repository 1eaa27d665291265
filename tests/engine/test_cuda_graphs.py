"""The padded layouts of ``chorus.engine.cuda_graphs`` on the CPU: a mixed step laid out in its
graph bucket computes the step's own logits and K/V (the capture itself is CUDA-only:
``test_engine_gpu.py`` replays the graphs against eager mode). The reference attention used
here ignores the bucket's host-side bounds (``max_query_len``, ``num_decodes``, ``max_seq_len``);
``tests/engine/attention/test_triton_interpreter.py`` runs the Triton kernels, which plan their
launches from them, on the same layout."""
from __future__ import annotations

import pytest
import torch

from chorus.engine.cuda_graphs import MIXED_PROMPT_ROWS, MixedBucket, StepBuffers, lay_out_mixed, mixed_token_buckets
from tests.engine.test_admit_ahead import _staggered, _with
from tests.engine.test_engine_parity import _engine, _requests
from tests.engine.tiny_models import tiny


def test_mixed_token_buckets_double_from_64_up_to_the_bound():
    assert mixed_token_buckets(256) == [64, 128, 256]
    assert mixed_token_buckets(200) == [64, 128, 200]
    assert mixed_token_buckets(32) == [32]
    assert mixed_token_buckets(0) == []


def _stale_buffers(runner, tokens: int, rows: int, width: int, seed: int = 0) -> StepBuffers:
    """Static buffers as a serving engine leaves them: every array holds earlier steps' values
    (valid slots, tables, lengths and indices; the embeddings NaN, so that a padding position
    reaching a real row shows), which a layout must overwrite wherever the bucket reads."""
    g = torch.Generator().manual_seed(seed)
    model, cache = runner.model, runner.cache
    b = StepBuffers.allocate(tokens, rows, width, model.config.hidden_size, model.dtype, "cpu")
    b.embeds.fill_(float("nan"))
    b.positions.copy_(torch.randint(0, 8, b.positions.shape, generator=g))
    b.slot_mapping.copy_(torch.randint(0, cache.num_blocks * cache.block_size, b.slot_mapping.shape, generator=g))
    b.block_tables.copy_(torch.randint(0, cache.num_blocks, b.block_tables.shape, generator=g))
    b.seq_lens.copy_(torch.randint(1, 5, b.seq_lens.shape, generator=g))
    b.query_start_loc.copy_(torch.randint(0, 3, b.query_start_loc.shape, generator=g))
    b.logits_index.copy_(torch.randint(0, tokens, b.logits_index.shape, generator=g))
    return b


def _padded_forward(runner, inputs, bucket, buffers):
    """The step's logits [rows needing logits, V] computed over ``bucket``'s padded layout in
    ``buffers``."""
    model, meta = runner.model, inputs.metadata
    count = lay_out_mixed(inputs, bucket, buffers)
    runner.cache.metadata = bucket.metadata(buffers, meta.max_seq_len)
    hidden = model(buffers.embeds[:bucket.tokens], buffers.positions[:bucket.tokens], runner.cache)
    runner.cache.metadata = None
    return model.speech_logits(hidden[buffers.logits_index[:count]]).float()


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_mixed_steps_in_their_padded_layout_give_the_steps_logits_and_cache(name):
    """Every mixed step of a run, laid out in one set of buffers that earlier steps (and
    garbage before them) left behind, as a serving engine's are."""
    variant, model = tiny(name)
    engine = _with(_engine(variant, model, budget=256), admit_ahead=True)
    runner, original = engine.runner, engine.runner.forward_logits
    buffers = _stale_buffers(runner, tokens=1024, rows=64, width=engine.config.scheduler.max_model_len // 16)
    checked = []

    def forward_logits(inputs):
        meta = inputs.metadata
        prompt_rows = meta.seq_lens.shape[0] - meta.num_decodes
        if meta.max_query_len == 1 or prompt_rows > MIXED_PROMPT_ROWS:
            return original(inputs)
        before = runner.cache.kv.clone()
        logits = original(inputs)
        after = runner.cache.kv.clone()
        runner.cache.kv.copy_(before)
        # one decode bucket above the step's rows and room to spare: padding on both sides
        bucket = MixedBucket(decode_rows=meta.num_decodes + 3, prompt_tokens=inputs.num_tokens - meta.num_decodes + 5)
        padded = _padded_forward(runner, inputs, bucket, buffers)
        torch.testing.assert_close(padded, logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(runner.cache.kv, after, rtol=1e-5, atol=1e-5)  # no other slot written
        checked.append((meta.num_decodes, prompt_rows))
        return logits

    runner.forward_logits = forward_logits
    _staggered(engine, _requests(variant, 5, seed=11, max_tokens=12, ignore_eos=True))
    assert any(decodes > 0 for decodes, _ in checked)  # steps that admitted beside decode rows
    assert any(decodes == 0 for decodes, _ in checked)  # and the first, with nothing decoding
    assert len(checked) >= 3  # the buffers served several steps in turn


def test_lay_out_mixed_moves_the_prompt_rows_past_the_decode_padding():
    variant, model = tiny("turbo")
    engine = _with(_engine(variant, model), admit_ahead=True)
    runner, original, seen = engine.runner, engine.runner.forward_logits, []

    def forward_logits(inputs):
        if inputs.metadata.max_query_len > 1 and inputs.metadata.num_decodes > 0 and not seen:
            seen.append(inputs)
        return original(inputs)

    runner.forward_logits = forward_logits
    _staggered(engine, _requests(variant, 3, seed=2, max_tokens=8, ignore_eos=True, same_voice=True))
    inputs = seen[0]
    meta, decodes = inputs.metadata, inputs.metadata.num_decodes
    rows, tokens = meta.seq_lens.shape[0], inputs.num_tokens
    bucket = MixedBucket(decode_rows=decodes + 2, prompt_tokens=tokens - decodes + 7)
    buffers = StepBuffers.allocate(bucket.tokens, bucket.rows, meta.block_tables.shape[1],
                                   model.config.hidden_size, torch.float32, "cpu")
    count = lay_out_mixed(inputs, bucket, buffers)
    pad = bucket.decode_rows - decodes
    assert buffers.slot_mapping[decodes:bucket.decode_rows].tolist() == [-1] * pad
    assert buffers.slot_mapping[bucket.decode_rows:bucket.decode_rows + tokens - decodes].tolist() \
        == meta.slot_mapping[decodes:].tolist()
    assert set(buffers.slot_mapping[bucket.decode_rows + tokens - decodes:bucket.tokens].tolist()) == {-1}
    assert buffers.seq_lens[decodes:bucket.decode_rows].tolist() == [0] * pad
    qsl = buffers.query_start_loc[:bucket.rows + 1].tolist()
    assert qsl[:bucket.decode_rows + 1] == list(range(bucket.decode_rows + 1))
    assert qsl[bucket.decode_rows:bucket.decode_rows + rows - decodes + 1] \
        == [q + pad for q in meta.query_start_loc[decodes:].tolist()]
    assert qsl[bucket.decode_rows + rows - decodes:] == [tokens + pad] * (bucket.rows - rows + decodes - bucket.decode_rows + 1)
    index = inputs.logits_index.tolist()
    assert buffers.logits_index[:count].tolist() == [i if i < decodes else i + pad for i in index]

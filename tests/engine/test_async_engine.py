import asyncio
import time

import pytest
import torch

from chorus.engine.async_engine import AsyncT3Engine
from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.engine.scheduler import AdmissionError
from chorus.sampling import SamplingParams
from chorus.t3_sequential import generate_speech_tokens
from tests.engine.tiny_models import conditioning, tiny, voice


def _engine(name="turbo", max_model_len=1024):
    variant, model = tiny(name)
    config = EngineConfig(variant=variant.name, default_deadline_s=None,
                          cache=CacheConfig(kv_cache_bytes=64 << 20),
                          scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512,
                                                    max_model_len=max_model_len))
    return variant, model, AsyncT3Engine(T3Engine(model, variant, config)).start()


def _request(variant, seed, tokens=12, text_len=8):
    params = SamplingParams.for_variant(variant, seed=seed, max_new_tokens=tokens, min_new_tokens=tokens)
    return T3Request(list(range(3, 3 + text_len)), conditioning(variant, tiny(variant.name)[1], voice(variant, seed)), params)


def test_concurrent_streams_get_their_own_tokens():
    variant, model, engine = _engine()
    try:
        async def run():
            return await asyncio.gather(*(engine.generate(_request(variant, s)) for s in range(3)))

        results = asyncio.run(run())
    finally:
        engine.stop()
    for seed, res in enumerate(results):
        req = _request(variant, seed)
        cond = req.conditioning.embeds
        assert res.tokens == generate_speech_tokens(model, variant, cond, torch.tensor(req.text_ids), req.params).tokens


def test_leaving_the_stream_early_aborts_and_frees_blocks():
    variant, model, engine = _engine()
    try:
        async def run():
            got = []
            async for token in engine.stream(_request(variant, 0, tokens=200)):
                got.append(token)
                if len(got) == 3:
                    break
            deadline = time.monotonic() + 30  # the abort is applied by the engine thread
            while engine.engine.has_unfinished_requests() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            return got

        got = asyncio.run(run())
    finally:
        engine.stop()
    assert len(got) == 3
    assert not engine.engine.has_unfinished_requests()
    assert engine.engine.kv_manager.num_free_blocks == engine.engine.kv_cache.num_blocks


def test_admission_error_reaches_the_consumer():
    variant, model, engine = _engine(max_model_len=400)
    try:
        async def run():
            async for _ in engine.stream(_request(variant, 0, tokens=300)):
                pass

        with pytest.raises(AdmissionError, match="max_model_len"):
            asyncio.run(run())
    finally:
        engine.stop()
    assert engine.is_running is False

"""Voice conversion on tiny models: through the pipeline's vocoder stage (equal to one S3Gen
call, streamed in pieces, batched with text-to-speech jobs), and every refusal of bad input,
raised before any work is queued."""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
import soundfile
import torch

from chorus.conversion import ConversionConfig, ConversionRequest, SourceAudioError, prepare_source
from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.models.s3gen.s3gen import TokenRules
from chorus.pipeline.pipeline import Pipeline, PipelineConfig
from chorus.voices import S3GenPrompt, VoiceFormatError
from chorus.vocoder import VocoderStage
from tests.conversion.tiny_conversion import speech, tiny_conversion_models
from tests.vocoder.models import random_tokens, random_voice

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", params=["original", "turbo"])
def pipe(request):
    name = request.param
    engine = EngineConfig(variant=name, cache=CacheConfig(kv_cache_bytes=64 << 20),
                          scheduler=SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=1024, max_model_len=1024,
                                                    step_time_target_s=math.inf))
    pipeline = Pipeline(tiny_conversion_models(name), PipelineConfig(engine=engine, max_chars=40)).start()
    yield pipeline
    pipeline.close()


def _request(seconds=2.0, **kw) -> ConversionRequest:
    return ConversionRequest(speech(seconds), sample_rate=16000, seed=5, flow_steps=2, **kw)  # 2 steps: quick


def test_a_conversion_is_one_s3gen_call_over_the_source_tokens(pipe):
    result = pipe.convert(_request()).result()
    planner = pipe.conversion_planner
    tokens, lengths = planner.tokenizer.tokenize(speech(2.0))
    assert result.chunks[0].speech_tokens == int(lengths[0]) == 50
    target = pipe.models.builtin_voice()
    [want] = pipe.models.s3gen.tokens_to_wav([tokens[0, :50]], target, seeds=[5], n_steps=2, postprocess=False,
                                             rules=TokenRules.verbatim())
    assert result.wav.shape == (50 * 960,)  # no silence tokens, no tail cut, whatever the variant
    np.testing.assert_allclose(result.wav, want.numpy(), atol=1e-4)
    assert result.chunks[0].finish_reason == "source" and result.seed == 5


def test_a_streamed_conversion_comes_in_pieces_of_the_same_length(pipe):
    whole = pipe.convert(_request(3.0)).result().wav
    stream = pipe.convert(_request(3.0, stream=True))
    pieces = list(stream)
    assert len(pieces) >= 3 and pieces[-1].final and not any(p.final for p in pieces[:-1])
    streamed = np.concatenate([p.samples for p in pieces])
    assert streamed.shape == whole.shape
    np.testing.assert_array_equal(stream.result().wav, streamed)


def test_conversions_and_speech_share_the_vocoder_stage_and_its_passes(pipe):
    stage = VocoderStage(pipe.models.s3gen)
    voice = random_voice(20, seed=1)
    tts, vc = random_tokens(30, seed=2), random_tokens(40, seed=3)
    stage.add("tts", voice, seed=1, streaming=False, n_steps=2)
    stage.add("vc", voice.s3gen_prompt, seed=2, streaming=False, n_steps=2, rules=TokenRules.verbatim())
    stage.push("tts", tts, final=True)
    stage.push("vc", vc, final=True)
    out = {o.job_id: o.samples for o in stage.step()}
    assert stage.stats.passes == 1 and stage.stats.items == 2
    [tts_alone] = pipe.models.s3gen.tokens_to_wav([tts], voice, seeds=[1], n_steps=2)
    [vc_alone] = pipe.models.s3gen.tokens_to_wav([vc], voice, seeds=[2], n_steps=2, postprocess=False,
                                                rules=TokenRules.verbatim())
    torch.testing.assert_close(out["tts"], tts_alone, rtol=0, atol=1e-4)
    torch.testing.assert_close(out["vc"], vc_alone, rtol=0, atol=1e-4)


def test_a_target_clip_becomes_s3gen_conditioning_of_its_first_10_s(pipe):
    planner = pipe.conversion_planner
    clip = speech(4.0, rate=24000)
    target = planner.resolve_target(_wav_bytes(clip, 24000))
    assert isinstance(target, S3GenPrompt)
    assert target.mel.shape[1] == 200 and target.tokens.shape[1] == 100
    result = pipe.convert(_request(voice=target)).result()
    assert result.wav.shape == (50 * 960,)


def test_a_voice_of_the_other_s3gen_kind_is_refused_with_what_to_do(pipe):
    variant = pipe.models.variant
    other = "turbo" if not variant.s3gen.meanflow else "original"
    same = "multilingual" if not variant.s3gen.meanflow else "nano"
    from dataclasses import replace

    voice = pipe.models.builtin_voice()
    with pytest.raises(VoiceFormatError, match="S3Gen is the") as error:
        pipe.convert(_request(voice=replace(voice, variant=other)))
    assert "chorus voice create --variant" in str(error.value)
    assert pipe.convert(_request(voice=replace(voice, variant=same))).result().wav.size


def _wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


@pytest.mark.parametrize("source, reason, status", [
    (_wav_bytes(np.zeros(0, np.float32), 16000), "empty", 400),
    (_wav_bytes(np.zeros(32000, np.float32), 16000), "silent", 400),
    (_wav_bytes(np.full(800, 0.1, np.float32), 16000), "too_short", 400),
    (b"definitely not audio", "invalid_audio", 400),
    (_wav_bytes(np.full(16000 * 3, 0.1, np.float32), 16000), "too_long", 413),
])
def test_bad_sources_are_refused_with_a_reason_and_status(source, reason, status):
    with pytest.raises(SourceAudioError) as error:
        prepare_source(source, ConversionConfig(max_source_s=2.0))
    assert error.value.reason == reason and error.value.status == status
    assert isinstance(error.value, ValueError)


def test_a_long_source_is_refused_at_convert_and_nothing_is_queued(pipe):
    planner = pipe.models.conversion_planner(ConversionConfig(max_source_s=1.5))
    with pytest.raises(SourceAudioError, match="at most 1.5 s") as error:
        planner.plan(_request(2.0))
    assert error.value.status == 413
    with pytest.raises(SourceAudioError, match="silent"):
        pipe.convert(ConversionRequest(np.zeros(16000, np.float32), sample_rate=16000))
    with pytest.raises(ValueError, match="watermark"):
        pipe.convert(_request(stream=True, watermark="perth"))
    assert pipe.active_requests == 0


def test_config_limits_are_checked():
    with pytest.raises(ValueError, match="max_source_s"):
        ConversionConfig(max_source_s=0)
    with pytest.raises(ValueError, match="must not exceed"):
        ConversionConfig(max_source_s=1.0, min_source_s=2.0)

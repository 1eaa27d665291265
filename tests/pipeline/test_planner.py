"""RequestPlanner: every check before any model runs, chunk seeds, voice resolution."""
from __future__ import annotations

from dataclasses import replace

import pytest

from chorus.engine.request import Priority
from chorus.models.random_checkpoint import RANDOM_WEIGHTS_TOKEN_CAP
from chorus.pipeline.planner import chunk_seed, is_voice_file, needs_voice_models
from chorus.pipeline.request import SpeechRequest
from chorus.sampling.params import MAX_SEED
from chorus.text import TextInputError, UnsupportedLanguageError
from tests.pipeline.tiny_pipeline import tiny_models

LONG = "First sentence here. " * 12 + "And the last one."


@pytest.fixture(scope="module")
def planner():
    return tiny_models("original").planner(max_chars=80)


def test_chunks_are_tokenized_and_seeded_from_the_base_seed(planner):
    plan = planner.plan(SpeechRequest(LONG, seed=40, normalize=False))
    assert len(plan.chunks) > 2
    assert [c.seed for c in plan.chunks] == [40 + i for i in range(len(plan.chunks))]
    assert all(len(c.text) <= 80 and c.text_ids == tuple(planner.text_encoder.encode(c.text)) for c in plan.chunks)
    assert " ".join(c.text for c in plan.chunks) == " ".join(LONG.split())


def test_chunk_seeds_wrap_around_the_seed_range():
    assert chunk_seed(MAX_SEED, 1) == 0 and chunk_seed(5, 2) == 7


def test_defaults_and_ignored_parameters():
    turbo = tiny_models("turbo").planner()
    plan = turbo.plan(SpeechRequest("Hi there.", cfg_weight=0.7, exaggeration=0.9, seed=1))
    assert plan.ignored == ("cfg_weight", "exaggeration") and plan.exaggeration == 0.0
    assert plan.chunks[0].params.cfg_weight == 0.0 and plan.priority is Priority.NORMAL


@pytest.mark.parametrize("request_limits, max_new_tokens", [
    ({}, RANDOM_WEIGHTS_TOKEN_CAP),
    ({"max_new_tokens": 300}, 300),  # an explicit limit wins
    ({"min_new_tokens": 150}, 150),  # the cap never undercuts the floor
])
def test_random_weights_cap_what_a_request_leaves_unlimited(request_limits, max_new_tokens):
    """The Python API's planner applies the rule of chorus synth and chorus serve."""
    planner = replace(tiny_models("turbo"), random_weights=True).planner()
    plan = planner.plan(SpeechRequest("Hi there.", **request_limits))
    assert plan.chunks[0].params.max_new_tokens == max_new_tokens


def test_real_weights_keep_the_variants_limit():
    planner = tiny_models("turbo").planner()
    assert planner.plan(SpeechRequest("Hi there.")).chunks[0].params.max_new_tokens == \
        planner.variant.sampling.max_new_tokens > RANDOM_WEIGHTS_TOKEN_CAP


@pytest.mark.parametrize("field, value, match", [
    ("flow_steps", 0, "flow_steps"), ("top_p", 1.5, "top_p"), ("exaggeration", -1.0, "exaggeration"),
    ("priority", 7, "priority"), ("deadline_s", 0.0, "deadline_s"), ("watermark", "nope", "watermark"),
])
def test_bad_parameters_are_rejected_with_the_parameter_named(planner, field, value, match):
    with pytest.raises(ValueError, match=match):
        planner.validate(SpeechRequest("Hello.", **{field: value}))


def test_empty_text_and_wrong_language_are_rejected(planner):
    with pytest.raises(TextInputError):
        planner.validate(SpeechRequest("  \n "))
    with pytest.raises(UnsupportedLanguageError):
        planner.validate(SpeechRequest("Bonjour.", language="fr"))


def test_a_streamed_request_cannot_be_watermarked(planner):
    with pytest.raises(ValueError, match="whole waveform"):
        planner.validate(SpeechRequest("Hello.", watermark="perth", stream=True))


def test_a_listener_orders_streamed_audio_only(planner):
    assert planner.plan(SpeechRequest("Hello.", stream=True, listener="turn-1")).listener == "turn-1"
    with pytest.raises(ValueError, match="stream=True"):
        planner.validate(SpeechRequest("Hello.", listener="turn-1"))
    with pytest.raises(ValueError, match="listener"):
        planner.validate(SpeechRequest("Hello.", stream=True, listener=""))


def test_validate_never_resolves_the_voice():
    def no_voice():
        raise AssertionError("resolved")

    from chorus.pipeline.planner import RequestPlanner

    models = tiny_models("turbo")
    RequestPlanner(models.variant, models.text_encoder, builtin_voice=no_voice).validate(SpeechRequest("Hi."))


def test_voice_arguments_are_told_apart():
    assert is_voice_file("me.safetensors") and is_voice_file("ME.SAFETENSORS")
    assert not is_voice_file("me.wav") and not is_voice_file(b"RIFF")
    assert needs_voice_models("me.wav") and not needs_voice_models(None)
    assert not needs_voice_models("me.safetensors")


def test_a_reference_clip_needs_the_voice_models(planner):
    with pytest.raises(ValueError, match="voice models are not loaded"):
        planner.plan(SpeechRequest("Hello.", voice="clip.wav"))


def test_the_builtin_voice_is_the_default(planner):
    assert planner.plan(SpeechRequest("Hello.")).voice.name == "short0"


def test_a_break_splits_a_sentence_into_chunks_and_records_each_pause(planner):
    plan = planner.plan(SpeechRequest('<break time="200ms"/>Wait for it <break time="1.5s"/> now.<break time="1s"/>',
                                      normalize=False))
    assert [(c.text, c.pause_before_s) for c in plan.chunks] == [("Wait for it", 0.2), ("now.", 1.5)]
    assert plan.pause_after_s == 1.0 and plan.pauses_s == (0.2, 1.5, 1.0)


def test_ssml_is_planned_with_its_prosody_rate_as_the_plans_speed(planner):
    plan = planner.plan(SpeechRequest('<speak><prosody rate="80%"><s>One.</s><s>Two.</s></prosody></speak>',
                                      input_format="ssml", normalize=False))
    assert [c.text for c in plan.chunks] == ["One.", "Two."] and plan.speed == pytest.approx(0.8)


def test_input_of_breaks_only_is_refused_as_empty(planner):
    with pytest.raises(TextInputError, match="text is empty"):
        planner.plan(SpeechRequest('<break time="1s"/>'))

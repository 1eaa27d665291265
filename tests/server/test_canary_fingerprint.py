"""The canary's integrity fingerprint (docs/quality.md): a live server over tiny models whose
weights a test corrupts in place, through the model objects the registry holds (no hook in the
server), is caught by its next canary: the model is degraded on /ready with the reason, the
metrics count it and the log holds both fingerprints. Canaries here run when the test says
(``canary_interval_s`` is an hour)."""
from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
import torch

from tests.server.live import LiveServer, metric, server_config, tiny_loader

pytestmark = pytest.mark.timeout(180)


@pytest.fixture()
def live(tmp_path):
    config = server_config(tmp_path, canary_interval_s=3600.0, canary_action="unready")
    with LiveServer(config, tiny_loader(config)) as server:
        yield server


def _canary(server: LiveServer, service=None) -> None:
    service = service or server.service
    asyncio.run_coroutine_threadsafe(service.run_canary(), server.loop).result(60)


@contextlib.contextmanager
def _corrupted(module: torch.nn.Module, name: str):
    """Parameter ``name`` of ``module`` scaled by -3 in place (what a bad load or a stray kernel
    write does), restored afterwards."""
    parameter = dict(module.named_parameters())[name]
    saved = parameter.detach().clone()
    with torch.no_grad():
        parameter.mul_(-3.0)
    try:
        yield
    finally:
        with torch.no_grad():
            parameter.copy_(saved)


def _metrics(server: LiveServer) -> str:
    return server.client.get("/metrics").text


def test_a_corrupted_t3_weight_makes_the_model_degraded_and_unready(live, caplog):
    _canary(live)  # a canary of the healthy model matches the fingerprint start-up recorded
    assert live.client.get("/ready").json()["degraded"] == []
    assert metric(_metrics(live), "chorus_canary_snr_db") == 200.0
    with _corrupted(live.pipeline.models.t3, "speech_head.weight"), \
            caplog.at_level(logging.WARNING, logger="chorus.server"):
        _canary(live)
        ready = live.client.get("/ready")
        assert ready.status_code == 503
        assert "degraded" in ready.json()["reason"] and "speech tokens differ" in ready.json()["reason"]
        assert len(ready.json()["degraded"]) == 1 and "version" in ready.json()["degraded"][0]
        text = _metrics(live)
        assert metric(text, "chorus_canary_degraded") == 1
        assert metric(text, "chorus_canary_mismatches_total", 'reason="tokens"') == 1
        logged = [r for r in caplog.records if r.getMessage().startswith("canary mismatch: tokens")]
        assert len(logged) == 1
        assert logged[0].canary["tokens_sha256"] != logged[0].fingerprint["tokens_sha256"]
        confirmation = [r for r in caplog.records if "confirming with a second canary" in r.getMessage()]
        assert len(confirmation) == 1  # a first mismatch is confirmed before it counts
    _canary(live)  # the weight restored: the model speaks as before
    assert live.client.get("/ready").status_code == 200
    assert metric(_metrics(live), "chorus_canary_degraded") == 0


def test_a_corrupted_vocoder_weight_is_an_audio_mismatch(live):
    with _corrupted(live.pipeline.models.s3gen, "mel2wav.conv_post.weight"):
        _canary(live)
        ready = live.client.get("/ready").json()
    assert ready["ready"] is False and "audio" in ready["reason"] and "dB from its fingerprint" in ready["reason"]
    text = _metrics(live)
    assert metric(text, "chorus_canary_mismatches_total", 'reason="audio"') == 1
    assert metric(text, "chorus_canary_snr_db") < 20


def test_warn_keeps_the_model_ready_and_names_it_degraded(tmp_path):
    config = server_config(tmp_path, canary_interval_s=3600.0, canary_action="warn")
    with LiveServer(config, tiny_loader(config)) as live:
        with _corrupted(live.pipeline.models.t3, "speech_head.weight"):
            _canary(live)
            ready = live.client.get("/ready")
        assert ready.status_code == 200 and ready.json()["reason"] is None
        assert "speech tokens differ" in ready.json()["degraded"][0]
        assert metric(_metrics(live), "chorus_canary_degraded") == 1


def test_a_swapped_in_version_records_its_own_fingerprint_before_it_takes_traffic(live, caplog):
    old = live.service
    with caplog.at_level(logging.INFO, logger="chorus.server"):
        asyncio.run_coroutine_threadsafe(live.backend.load_version("chatterbox-turbo", {}, "v2"), live.loop).result(120)
    new = live.backend.route_of("chatterbox-turbo").versions[0].service
    assert new is not old and new.fingerprint is not None and new.fingerprint is not old.fingerprint
    messages = [(r.getMessage(), getattr(r, "version", None)) for r in caplog.records]
    recorded = messages.index(("canary fingerprint recorded", "v2"))
    routed = next(i for i, (m, _) in enumerate(messages) if m.startswith("model chatterbox-turbo now routes to"))
    assert recorded < routed


def test_a_multilingual_server_passes_its_start_up_canary(tmp_path):
    """The canary speaks English on a multilingual model, which needs a language for every request."""
    config = server_config(tmp_path, variant="multilingual")
    with LiveServer(config, tiny_loader(config)) as server:
        assert server.service.fingerprint is not None

"""What an operator needs to see trouble coming: stage times, vocoder busy time, KV-cache
fragmentation, admission refusals and deadline misses by kind, GPU gauges only where NVML is."""
from __future__ import annotations

import time

import pytest
import torch

from chorus.server.metrics import OPTIONAL_METRICS, STAGES, EngineSnapshot, ServerMetrics, kv_fragmentation
from tests.server.live import metric, until


def test_each_stage_observes_its_work(server):
    before = server.client.get("/metrics").text
    assert server.speech(input="Hello there.", response_format="pcm").status_code == 200
    after = server.client.get("/metrics").text
    for stage in STAGES:
        name, labels = "chorus_stage_seconds_count", f'stage="{stage}"'
        assert metric(after, name, labels) > metric(before, name, labels), stage


def test_the_vocoder_busy_ratio_follows_the_passes(server):
    service = server.service
    assert server.speech(input="Hello there.", response_format="pcm").status_code == 200
    passes = server.pipeline.vocoder.stats.passes
    deadline = time.monotonic() + 10
    while service.snapshot.vocoder_passes < passes:  # wait for a monitor snapshot after the passes
        assert time.monotonic() < deadline, "no monitor snapshot"
        time.sleep(0.05)
    ratio = metric(server.client.get("/metrics").text, "chorus_vocoder_busy_ratio")
    assert 0.0 <= ratio <= 1.0


def test_admission_exports_the_busiest_stages_utilization_it_averages(server):
    assert server.speech(input="Hello there.", response_format="pcm").status_code == 200
    until(lambda: server.service.capacity.utilization is not None, what="a monitor refresh after the request")
    text = server.client.get("/metrics").text
    assert 0.0 <= metric(text, "chorus_admission_utilization") <= 1.0
    assert metric(text, "chorus_admission_saturated") in (0.0, 1.0)
    assert metric(text, "chorus_admission_saturated_tokens_per_second") >= 0.0  # 0 until measured at saturation


def test_a_total_deadline_missed_before_the_first_audio_counts_as_a_total_miss(server):
    text = lambda: server.client.get("/metrics").text  # noqa: E731
    before = [metric(text(), "chorus_deadline_misses_total", f'kind="{k}"') for k in ("start", "total")]
    answer = server.speech(input="Hello there, this is a longer text.", response_format="pcm", deadline_s=0.001)
    assert answer.status_code == 504
    after = [metric(text(), "chorus_deadline_misses_total", f'kind="{k}"') for k in ("start", "total")]
    assert after == [before[0], before[1] + 1]


def test_every_labelled_series_exists_before_its_first_event():
    text = ServerMetrics().render().decode()
    for series in ('chorus_admission_refusals_total{reason="queue_full"} 0.0',
                   'chorus_admission_refusals_total{reason="memory_pressure"} 0.0',
                   'chorus_admission_overloaded_total{rule="start"} 0.0',
                   'chorus_admission_overloaded_total{rule="realtime"} 0.0',
                   'chorus_deadline_misses_total{kind="start"} 0.0',
                   'chorus_deadline_misses_total{kind="total"} 0.0',
                   'chorus_stage_seconds_count{stage="t3"} 0.0'):
        assert series in text, series


@pytest.mark.parametrize("code, reason", [("queue_full", "queue_full"), ("memory_pressure", "memory_pressure")])
def test_an_admission_refusal_counts_by_reason(code, reason):
    metrics = ServerMetrics()
    metrics.record_error(code)
    text = metrics.render().decode()
    assert metric(text, "chorus_admission_refusals_total", f'reason="{reason}"') == 1
    assert metric(text, "chorus_errors_total", f'type="{code}"') == 1


@pytest.mark.parametrize("rule", ["start", "realtime"])
def test_an_overloaded_refusal_also_counts_by_its_rule(rule):
    metrics = ServerMetrics()
    metrics.record_error("overloaded", rule)
    text = metrics.render().decode()
    assert metric(text, "chorus_admission_refusals_total", 'reason="overloaded"') == 1
    assert metric(text, "chorus_admission_overloaded_total", f'rule="{rule}"') == 1
    other = "realtime" if rule == "start" else "start"
    assert metric(text, "chorus_admission_overloaded_total", f'rule="{other}"') == 0


def test_other_errors_are_not_refusals():
    metrics = ServerMetrics()
    metrics.record_error("voice_not_found")
    text = metrics.render().decode()
    assert metric(text, "chorus_admission_refusals_total", 'reason="queue_full"') == 0
    assert metric(text, "chorus_deadline_misses_total", 'kind="total"') == 0


def test_a_stream_cut_by_its_deadline_is_a_miss_of_that_deadline():
    metrics = ServerMetrics()
    metrics.stream_cut("deadline", "total")
    metrics.stream_cut("error")
    text = metrics.render().decode()
    assert metric(text, "chorus_deadline_misses_total", 'kind="total"') == 1
    assert metric(text, "chorus_stream_cuts_total", 'reason="deadline"') == 1


@pytest.mark.parametrize("free, used, running, want", [
    (40, 40, 4, 0.0),      # typical request 10 blocks: 4 more fit exactly
    (45, 40, 4, 5 / 45),   # 5 blocks left over after 4 typical requests
    (7, 40, 4, 1.0),       # not one more typical request fits
    (50, 0, 0, 0.0),       # nothing running: no typical size
])
def test_kv_fragmentation_is_the_free_share_a_typical_request_cannot_use(free, used, running, want):
    assert kv_fragmentation(free, used, running) == pytest.approx(want)


def test_kv_gauges_come_from_the_snapshot():
    snapshot = EngineSnapshot(kv_blocks_used=40, kv_blocks_free=7, kv_blocks_evictable=3, kv_fragmentation=1.0)
    text = ServerMetrics(lambda: snapshot).render().decode()
    assert metric(text, "chorus_kv_evictable_blocks") == 3
    assert metric(text, "chorus_kv_fragmentation") == 1.0


def test_gpu_gauges_are_not_exported_off_cuda(server):
    assert not server.service.metrics.watch_device(torch.device("cpu"))
    text = server.client.get("/metrics").text
    assert all(name not in text for name in OPTIONAL_METRICS)

"""What the service's monitor reads from a running pipeline between two refreshes: whether it
still makes progress, the engine snapshot of the metrics (rates over the interval), and the audio
delivered meanwhile for admission's capacity model."""
from __future__ import annotations

from typing import TYPE_CHECKING

from chorus.server.capacity import stage_load_s
from chorus.server.metrics import EngineSnapshot, kv_fragmentation

if TYPE_CHECKING:  # the pipeline module imports torch; the service is built before any model loads
    from chorus.pipeline.pipeline import PipelineStats


class EngineWatch:
    """The counters of one pipeline at the last refresh, to turn the next ones into rates."""

    def __init__(self):
        self.progress: tuple[float, int, int] | None = None  # (last progress, T3 tokens, vocoder passes)
        self.last_tokens: tuple[float, int] | None = None
        self.last_passes: tuple[int, int] = (0, 0)
        # the vocoder's graph captures and their seconds when warm-up ended (later ones: while serving)
        self.warmup_captures: tuple[int, float] = (0, 0.0)
        # (time, tokens delivered, busy, the pipeline's counters) at the last delivery observation
        self.last_delivery: tuple[float, float, bool, PipelineStats] | None = None
        self.last_vocoder_busy: tuple[float, float] | None = None  # (when, vocoder busy seconds)

    def warmed_up(self, pipeline) -> None:
        """Warm-up is over: graph captures from now on happen while serving."""
        stats = pipeline.vocoder.stats
        self.warmup_captures = (stats.graph_captures, stats.graph_capture_seconds)

    def no_progress(self, pipeline, now: float, timeout_s: float) -> str | None:
        """Why the pipeline counts as stalled (work in it and no T3 token nor vocoder pass for
        ``timeout_s``), or None."""
        self.track_progress(pipeline, now)
        since = now - self.progress[0]
        if since > timeout_s:
            return (f"no T3 token and no vocoder pass for {since:.1f} s with {pipeline.active_requests} "
                    f"request(s) in the pipeline")
        return None

    def track_progress(self, pipeline, now: float) -> None:
        """Note when the pipeline last made progress. An idle pipeline counts as progressing, and
        so does one inside a T3 step or a vocoder pass: whether that has run too long is
        ``Pipeline.stall``'s judgement (a pass of many streams on a loaded CPU takes seconds)."""
        tokens, passes = pipeline.t3_tokens, pipeline.vocoder.stats.passes
        if (self.progress is None or pipeline.active_requests == 0 or pipeline.working
                or (tokens, passes) != self.progress[1:]):
            self.progress = (now, tokens, passes)

    def observe_delivery(self, pipeline, admission, capacity, now: float) -> None:
        """Feed ``capacity`` the audio delivered since the last refresh (busy time only) and how
        busy the busiest stage was meanwhile."""
        delivered, busy = admission.delivered_tokens, admission.in_flight > 0
        stats = pipeline.stats()
        if self.last_delivery is not None:
            then, before, was_busy, last = self.last_delivery
            load = stage_load_s(now - then, t3_busy_s=stats.t3_busy_s - last.t3_busy_s,
                                t3_steps=stats.t3_steps - last.t3_steps,
                                vocoder_busy_s=stats.vocoder_busy_s - last.vocoder_busy_s)
            capacity.observe_delivery(now - then, delivered - before, busy and was_busy, load)
        self.last_delivery = (now, delivered, busy, stats)

    def snapshot(self, pipeline, stats, now: float) -> EngineSnapshot:
        """The metrics' engine snapshot from the engine's ``stats`` and the pipeline's counters."""
        tokens = pipeline.t3_tokens
        rate = 0.0
        if self.last_tokens is not None and now > self.last_tokens[0]:
            rate = (tokens - self.last_tokens[1]) / (now - self.last_tokens[0])
        self.last_tokens = (now, tokens)
        vocoder = pipeline.vocoder.stats
        passes, items = vocoder.passes - self.last_passes[0], vocoder.items - self.last_passes[1]
        self.last_passes = (vocoder.passes, vocoder.items)
        busy_s, busy = pipeline.vocoder_busy_s, 0.0
        if self.last_vocoder_busy is not None and now > self.last_vocoder_busy[0]:
            busy = min(1.0, (busy_s - self.last_vocoder_busy[1]) / (now - self.last_vocoder_busy[0]))
        self.last_vocoder_busy = (now, busy_s)
        kv = stats.kv
        return EngineSnapshot(
            kv_blocks_used=kv.num_used_blocks, kv_blocks_free=kv.num_free_blocks,
            prefix_hit_rate=kv.prefix_hit_rate, preemptions=stats.num_preemptions,
            t3_waiting=stats.num_waiting, t3_running=stats.num_running, t3_rows=stats.num_running_rows,
            t3_tokens=tokens, t3_tokens_per_s=rate, vocoder_passes=vocoder.passes, vocoder_items=vocoder.items,
            vocoder_items_per_pass=items / passes if passes else 0.0, pipeline_active=pipeline.active_requests,
            vocoder_busy_ratio=busy, vocoder_eager_calls=vocoder.eager_runs,
            vocoder_graph_calls=vocoder.graph_replays - vocoder.covered_replays,
            vocoder_covered_calls=vocoder.covered_replays,
            vocoder_serving_captures=vocoder.graph_captures - self.warmup_captures[0],
            vocoder_serving_capture_seconds=vocoder.graph_capture_seconds - self.warmup_captures[1],
            kv_blocks_evictable=kv.num_cached_free_blocks,
            kv_fragmentation=kv_fragmentation(kv.num_free_blocks, kv.num_used_blocks, stats.num_running))

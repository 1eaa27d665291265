"""Graceful degradation: under sustained pressure, new requests get cheaper settings.

Levels (docs/server.md): 0 normal; 1 fewer flow-matching steps; 2 also no classifier-free
guidance in T3; 3 also a smaller admission queue. A level is entered after the pressure stayed
above its threshold for ``hold_s`` and left after it stayed ``hysteresis`` below it for
``hold_s``, so a burst does not flap the service. Each request reports what was applied to it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from chorus.models.variants import Variant
from chorus.pipeline.request import SpeechRequest
from chorus.server.config import DegradationConfig


@dataclass(frozen=True)
class Applied:
    """What degradation did to one request (empty ``changes``: nothing)."""

    level: int
    changes: tuple[str, ...] = ()

    def header(self) -> str:
        return ", ".join(self.changes) if self.changes else "none"


class DegradationPolicy:
    """The current level and its transitions; one owner (the server's monitor) calls
    :meth:`update`, request handlers call :meth:`apply`."""

    def __init__(self, config: DegradationConfig):
        self.config = config
        self.level = 0
        self._above_since: float | None = None  # pressure above the next level's threshold
        self._below_since: float | None = None  # pressure below this level's exit point

    def update(self, pressure: float, now: float) -> int:
        """Feed the current pressure (0..1); returns the level after this observation."""
        cfg = self.config
        if not cfg.enabled:
            self.level = 0
            return 0
        up = cfg.thresholds[self.level] if self.level < 3 else None
        down = cfg.thresholds[self.level - 1] - cfg.hysteresis if self.level > 0 else None
        if up is not None and pressure > up:
            self._above_since = now if self._above_since is None else self._above_since
            if now - self._above_since >= cfg.hold_s:
                self.level += 1
                self._above_since = self._below_since = None
            return self.level
        self._above_since = None
        if down is not None and pressure < down:
            self._below_since = now if self._below_since is None else self._below_since
            if now - self._below_since >= cfg.hold_s:
                self.level -= 1
                self._below_since = None
        else:
            self._below_since = None
        return self.level

    def queue_limit(self, max_queue: int) -> int:
        """Admission's queue bound at the current level."""
        if self.level >= 3:
            return max(1, int(max_queue * self.config.level3_queue_fraction))
        return max_queue

    def apply(self, request: SpeechRequest, variant: Variant) -> tuple[SpeechRequest, Applied]:
        """``request`` with the current level's settings applied (never raising a setting the
        client chose lower)."""
        level, changes = self.level, []
        if level >= 1:
            default = variant.s3gen.flow_steps
            asked = request.flow_steps if request.flow_steps is not None else default
            # meanflow variants (2 steps) drop to 1; the others to the configured count
            target = max(1, default // 2) if default <= 2 else self.config.reduced_flow_steps
            if target < asked:
                request = replace(request, flow_steps=target)
                changes.append(f"flow_steps={target}")
        if level >= 2 and variant.sampling.cfg_weight > 0:  # variants whose T3 uses CFG
            if request.cfg_weight is None or request.cfg_weight > 0:
                request = replace(request, cfg_weight=0.0)
                changes.append("cfg_weight=0")
        return request, Applied(level, tuple(changes))

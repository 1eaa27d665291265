"""Fault injection for tests: make a T3 step or a vocoder pass raise, give NaN, or run out of
CUDA memory, so that tests can prove what a failure costs (only the affected requests) and that
the server recovers by itself.

**Off by default, and a test tool only**: nothing here runs unless a test installs a
:class:`Faults` on the engine's runner / the vocoder stage (their ``faults`` attribute), or the
process starts with ``CHORUS_FAULTS`` set (a subprocess server in a test)::

    CHORUS_FAULTS="t3_step:raise:0.01,vocoder_pass:nan:0.01,t3_step:oom:@3"
    CHORUS_FAULTS_SEED=7        # optional, default 0

A rule is ``SITE:MODE:WHEN``. Sites: ``t3_step`` (checked once per launched T3 step, after the
forward) and ``vocoder_pass`` (once per S3Gen pass). Modes: ``raise`` (an :class:`InjectedFault`),
``oom`` (``torch.cuda.OutOfMemoryError``, what the allocator raises; it is constructible without
CUDA), ``nan`` (the site poisons its own output: one row of the step's logits, or the first audio
piece of the pass). WHEN: a rate in [0, 1] (drawn from a generator seeded by the seed and the
site, so a run is reproducible) or ``@N``, exactly the Nth check of that site (counted from when
the :class:`Faults` was made).

When off, the cost at each site is one attribute check (``if self.faults is not None``). This
module imports only torch: the engine and the vocoder (lower floors) may import it.
"""
from __future__ import annotations

import os
import random
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Mapping

SITES = ("t3_step", "vocoder_pass")
MODES = ("raise", "nan", "oom")
ENV = "CHORUS_FAULTS"
SEED_ENV = "CHORUS_FAULTS_SEED"


class InjectedFault(RuntimeError):
    """The failure a ``raise`` rule injects."""


@dataclass(frozen=True)
class FaultRule:
    """One rule: at ``site``, inject ``mode`` with probability ``rate`` per check, or exactly at
    the ``nth`` check (1-based) when it is set."""

    site: str
    mode: str
    rate: float = 0.0
    nth: int | None = None

    def __post_init__(self):
        if self.site not in SITES:
            raise ValueError(f"fault site must be one of {', '.join(SITES)}, got {self.site!r}")
        if self.mode not in MODES:
            raise ValueError(f"fault mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.nth is None and not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"fault rate must be in [0, 1], got {self.rate!r}")
        if self.nth is not None and self.nth < 1:
            raise ValueError(f"a fault's @N must be >= 1, got {self.nth!r}")


@dataclass(frozen=True)
class FaultConfig:
    rules: tuple[FaultRule, ...] = ()
    seed: int = 0

    @classmethod
    def parse(cls, spec: str, seed: int = 0) -> "FaultConfig":
        """``"site:mode:rate|@N,..."`` (see the module docstring)."""
        rules = []
        for item in (i.strip() for i in spec.split(",")):
            if not item:
                continue
            parts = item.split(":")
            if len(parts) != 3:
                raise ValueError(f"{ENV}: a rule is SITE:MODE:RATE or SITE:MODE:@N, got {item!r}")
            site, mode, when = (p.strip() for p in parts)
            try:
                rule = FaultRule(site, mode, nth=int(when[1:])) if when.startswith("@") else \
                    FaultRule(site, mode, rate=float(when))
            except ValueError as exc:
                raise ValueError(f"{ENV}: bad rule {item!r}: {exc}") from None
            rules.append(rule)
        return cls(tuple(rules), seed)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "FaultConfig | None":
        """The rules of ``CHORUS_FAULTS`` (None when it is unset or empty)."""
        env = os.environ if env is None else env
        spec = env.get(ENV, "").strip()
        if not spec:
            return None
        try:
            seed = int(env.get(SEED_ENV, "0"))
        except ValueError:
            raise ValueError(f"{SEED_ENV} must be an integer, got {env.get(SEED_ENV)!r}") from None
        return cls.parse(spec, seed)


class Faults:
    """Decides, check by check, whether a site fails (thread-safe: the T3 and vocoder threads
    each check their own site). ``fired`` counts the faults injected, by ``(site, mode)``."""

    def __init__(self, config: FaultConfig):
        self.config = config
        self.fired: Counter = Counter()
        self._checks: Counter = Counter()
        self._rngs = {site: random.Random(f"{config.seed}:{site}") for site in SITES}
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, spec: str, seed: int = 0) -> "Faults":
        return cls(FaultConfig.parse(spec, seed))

    def check(self, site: str) -> bool:
        """Count one check of ``site``: raise the fault a rule injects now, return True when the
        caller must poison its output with NaN, else False."""
        mode = self._draw(site)
        if mode == "raise":
            raise InjectedFault(f"injected fault at {site} (a test's fault rule)")
        if mode == "oom":
            import torch

            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (injected at {site} by a test's fault rule)")
        return mode == "nan"

    def _draw(self, site: str) -> str | None:
        with self._lock:
            self._checks[site] += 1
            n, rng, chosen = self._checks[site], self._rngs[site], None
            for rule in self.config.rules:
                if rule.site != site:
                    continue
                hit = rule.nth == n if rule.nth is not None else rng.random() < rule.rate
                if hit and chosen is None:
                    chosen = rule.mode
            if chosen is not None:
                self.fired[(site, chosen)] += 1
            return chosen


def from_env(env: Mapping[str, str] | None = None) -> Faults | None:
    """A :class:`Faults` for ``CHORUS_FAULTS``, or None (the normal case: no faults)."""
    config = FaultConfig.from_env(env)
    return None if config is None else Faults(config)

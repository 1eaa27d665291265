"""Per-request sampling parameters, validated at the user-facing edge.

``SamplingParams.for_variant(variant, **overrides)`` is the constructor the engine and the server
use: it starts from the variant's defaults, applies the caller's overrides, checks every value
against its allowed range and resets parameters the variant does not use (see ``ignored``).
"""
from __future__ import annotations

import functools
import logging
import math
import secrets
from dataclasses import dataclass, fields, replace
from typing import Any

from chorus.models.variants import SamplingStep, Variant

logger = logging.getLogger(__name__)

MAX_SEED = 2**64 - 1
# Guards against fp32 overflow (logits / T, logits / penalty); 0 itself means greedy.
MIN_TEMPERATURE = 1e-3
MIN_REPETITION_PENALTY = 1e-3

# Parameter -> (logits step that uses it, the value that turns the step off).
_STEP_OF_PARAM: dict[str, tuple[SamplingStep, float]] = {
    "cfg_weight": ("cfg", 0.0),
    "repetition_penalty": ("repetition_penalty", 1.0),
    "temperature": ("temperature", 1.0),
    "min_p": ("min_p", 0.0),
    "top_k": ("top_k", 0),
    "top_p": ("top_p", 1.0),
}


@functools.cache
def _params_outside(order: tuple[SamplingStep, ...]) -> tuple[tuple[str, float], ...]:
    """(name, off value) of the parameters whose step is not in ``order`` (checked for every row
    of every batch composition, so worked out once per order)."""
    return tuple((name, off) for name, (step, off) in _STEP_OF_PARAM.items() if step not in order)


class InvalidSamplingParams(ValueError):
    """A sampling parameter is out of range; ``param`` names it (for API error bodies)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidSamplingParams(name, f"must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidSamplingParams(name, f"must be finite, got {value}")
    return value


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSamplingParams(name, f"must be an integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples its speech tokens.

    - ``temperature``: 0 means greedy (argmax after CFG, EOS ban and repetition penalty; the
      temperature, min-p, top-k and top-p steps are skipped), otherwise >= 1e-3; 1 disables it.
    - ``top_k``: >= 0, 0 disables; values above the vocabulary keep everything.
    - ``top_p``: in (0, 1]; 1 disables.
    - ``min_p``: in [0, 1]; 0 disables.
    - ``repetition_penalty``: >= 1e-3; 1 disables.
    - ``cfg_weight``: >= 0; 0 disables (no unconditional row needed).
    - ``seed``: in [0, 2**64); None draws a random one at construction, so every instance
      carries the seed it will use.
    - ``max_new_tokens`` >= 1 and ``0 <= min_new_tokens <= max_new_tokens``: EOS is banned
      while fewer than ``min_new_tokens`` tokens exist; ``ignore_eos`` bans it throughout.
    - ``ignored``: names of overrides the variant does not support and that were reset to
      their off value (the reference also ignores them); surface these to the caller.

    Direct construction only checks ranges; ``for_variant`` also fits the values to a variant.
    """

    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.05
    repetition_penalty: float = 1.2
    cfg_weight: float = 0.5
    seed: int | None = None
    max_new_tokens: int = 1000
    min_new_tokens: int = 0
    ignore_eos: bool = False
    ignored: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        checked = dict(
            temperature=self._check_temperature(),
            top_k=self._check_top_k(),
            top_p=self._check_top_p(),
            min_p=self._check_min_p(),
            repetition_penalty=self._check_repetition_penalty(),
            cfg_weight=self._check_cfg_weight(),
            seed=self._check_seed(),
            **self._check_lengths(),
        )
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSamplingParams("ignore_eos", f"must be true or false, got {self.ignore_eos!r}")
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "ignored", tuple(self.ignored))

    def _check_temperature(self) -> float:
        t = _number("temperature", self.temperature)
        if t != 0.0 and t < MIN_TEMPERATURE:
            raise InvalidSamplingParams(
                "temperature", f"must be 0 (greedy) or >= {MIN_TEMPERATURE}, got {t}")
        return t

    def _check_top_k(self) -> int:
        k = _integer("top_k", self.top_k)
        if k < 0:
            raise InvalidSamplingParams("top_k", f"must be >= 0 (0 disables top-k), got {k}")
        return k

    def _check_top_p(self) -> float:
        p = _number("top_p", self.top_p)
        if not 0.0 < p <= 1.0:
            raise InvalidSamplingParams("top_p", f"must be in (0, 1] (1 disables top-p), got {p}")
        return p

    def _check_min_p(self) -> float:
        p = _number("min_p", self.min_p)
        if not 0.0 <= p <= 1.0:
            raise InvalidSamplingParams("min_p", f"must be in [0, 1] (0 disables min-p), got {p}")
        return p

    def _check_repetition_penalty(self) -> float:
        r = _number("repetition_penalty", self.repetition_penalty)
        if r < MIN_REPETITION_PENALTY:
            raise InvalidSamplingParams(
                "repetition_penalty", f"must be >= {MIN_REPETITION_PENALTY} (1 disables it), got {r}")
        return r

    def _check_cfg_weight(self) -> float:
        w = _number("cfg_weight", self.cfg_weight)
        if w < 0.0:
            raise InvalidSamplingParams("cfg_weight", f"must be >= 0 (0 disables CFG), got {w}")
        return w

    def _check_seed(self) -> int:
        if self.seed is None:
            return secrets.randbits(64)
        seed = _integer("seed", self.seed)
        if not 0 <= seed <= MAX_SEED:
            raise InvalidSamplingParams("seed", f"must be in [0, 2**64 - 1], got {seed}")
        return seed

    def _check_lengths(self) -> dict[str, int]:
        longest = _integer("max_new_tokens", self.max_new_tokens)
        if longest < 1:
            raise InvalidSamplingParams("max_new_tokens", f"must be >= 1, got {longest}")
        shortest = _integer("min_new_tokens", self.min_new_tokens)
        if not 0 <= shortest <= longest:
            raise InvalidSamplingParams(
                "min_new_tokens", f"must be in [0, max_new_tokens={longest}], got {shortest}")
        return dict(max_new_tokens=longest, min_new_tokens=shortest)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def for_variant(cls, variant: Variant, **overrides: Any) -> SamplingParams:
        """The variant's defaults with ``overrides`` applied (None means "use the default").

        Raises ``InvalidSamplingParams`` for out-of-range values and ``TypeError`` for unknown
        names. Parameters whose step the variant does not run (CFG and min-p on Turbo/Nano,
        top-k on EN/MTL) are reset to their off value, logged and listed in ``ignored``.
        """
        allowed = {f.name for f in fields(cls)} - {"ignored"}
        unknown = sorted(set(overrides) - allowed)
        if unknown:
            raise TypeError(f"unknown sampling parameter(s) {unknown}; allowed: {sorted(allowed)}")
        d = variant.sampling
        values: dict[str, Any] = dict(
            temperature=d.temperature, top_k=d.top_k, top_p=d.top_p, min_p=d.min_p,
            repetition_penalty=d.repetition_penalty, cfg_weight=d.cfg_weight,
            max_new_tokens=d.max_new_tokens,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values).fitted_to(variant)

    def fitted_to(self, variant: Variant) -> SamplingParams:
        """A copy with parameters of steps ``variant`` does not run reset to their off value."""
        assert ("cfg" in variant.sampling.order) == variant.t3.supports_cfg, variant.name
        reset = {name: _STEP_OF_PARAM[name][1] for name in self.unsupported_by(variant)}
        if not reset:
            return self
        logger.warning("variant %s does not support %s; ignoring them", variant.name, sorted(reset))
        return replace(self, **reset, ignored=tuple(sorted({*self.ignored, *reset})))

    def unsupported_by(self, variant: Variant) -> list[str]:
        """Names of parameters set to a non-off value for a step ``variant`` does not run."""
        return [name for name, off in _params_outside(variant.sampling.order) if getattr(self, name) != off]

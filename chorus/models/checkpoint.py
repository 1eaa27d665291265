"""Strict checking of checkpoint state dicts against the keys and shapes a module expects."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch
from torch import nn

Shape = tuple[int, ...]


@dataclass
class KeyReport:
    """Differences between a checkpoint's keys and the keys a module expects."""

    source: str
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    wrong_shape: list[tuple[str, Shape, Shape]] = field(default_factory=list)  # (key, expected, found)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.wrong_shape)

    def render(self, limit: int = 12) -> str:
        lines = [f"checkpoint {self.source} does not match the model:"]

        def section(title: str, items: list[str]) -> None:
            if not items:
                return
            lines.append(f"  {title} ({len(items)}):")
            lines.extend(f"    {item}" for item in items[:limit])
            if len(items) > limit:
                lines.append(f"    ... and {len(items) - limit} more")

        section("missing keys", sorted(self.missing))
        section("unexpected keys", sorted(self.unexpected))
        section(
            "wrong shapes",
            [f"{k}: expected {list(e)}, found {list(f)}" for k, e, f in sorted(self.wrong_shape)],
        )
        return "\n".join(lines)


class CheckpointMismatchError(ValueError):
    """A checkpoint file's keys or shapes differ from what the model expects."""

    def __init__(self, report: KeyReport):
        super().__init__(report.render())
        self.report = report


def compare_state_dict(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, Shape], source: str,
    optional: frozenset[str] | set[str] = frozenset(),
) -> KeyReport:
    """Compare ``state`` with ``expected`` (key -> shape). Keys in ``optional`` may be absent."""
    report = KeyReport(source=source)
    for key, shape in expected.items():
        if key not in state:
            if key not in optional:
                report.missing.append(key)
        elif tuple(state[key].shape) != tuple(shape):
            report.wrong_shape.append((key, tuple(shape), tuple(state[key].shape)))
    report.unexpected.extend(k for k in state if k not in expected)
    return report


def check_state_dict(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, Shape], source: str,
    optional: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Raise :class:`CheckpointMismatchError` with a readable report unless keys and shapes match."""
    report = compare_state_dict(state, expected, source, optional)
    if not report.ok:
        raise CheckpointMismatchError(report)


def meta_shapes(build: Callable[[], nn.Module]) -> dict[str, Shape]:
    """Key -> shape of the state dict of the module ``build()`` makes, built on the meta device
    (no memory is allocated)."""
    with torch.device("meta"):
        module = build()
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``state`` under ``prefix`` (e.g. ``"flow."`` of a whole S3Gen file), with
    the prefix removed; other keys are left out."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

"""The roofline yardstick: each kernel class of a pass against the card's own limits.

**The card.** Peak dense rates and HBM bandwidth per known card (:data:`CARDS`), matched from
``torch.cuda.get_device_name()`` and the device's memory; ``peak_tflops`` / ``peak_gbps``
override them (one rate for every precision). Figures from NVIDIA's datasheets (H100 and H100
NVL, H200, A100, L40S), which quote sparse rates: the dense rates here are half of those. TF32
is the roof of float32 work: cuDNN runs float32 convolutions on TF32 tensor cores by default.
On the CPU no roof is known unless both overrides are given.

**The time.** The modules run eagerly under ``torch.profiler`` with a ``record_function``
range around each class's modules (forward pre/post hooks) or methods (an instance attribute
that wraps the bound method; no model code changes), and one range per stage. Each device
kernel (CUDA: correlated to the CPU op that launched it) or, on the CPU, each op's self time is
given to the innermost class range around it; what a stage runs outside every class range is
``<stage>.other`` (masks, casts, copies, glue: time only, no roof). A stage may also name ops
(``aten::mm``, ...) whose time outside every class range goes to one class (T3's GEMMs).

**The figures.** Per class: seconds, FLOPs and bytes (:mod:`chorus.bench.kernel_work`),
achieved TFLOP/s and GB/s, arithmetic intensity, the binding roof
``min(peak, intensity x bandwidth)`` and the fraction reached (``roof_seconds / seconds``, where
``roof_seconds = max(flops / peak, bytes / bandwidth)``). Per pass: the sum of the classes'
roof seconds over the measured pass time (``roofline_fraction``) and over the profiled kernel
time (``kernel_roofline_fraction``).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from chorus.bench.kernel_work import Work
from chorus.bench.figures import new_figure


# ------------------------------------------------------------------------------ the cards
@dataclass(frozen=True)
class Card:
    """One row of the card table: dense peaks (TFLOP/s) and HBM bandwidth (GB/s)."""

    name: str
    match: tuple[str, ...]  # every one of these is in the device name (case-insensitive)
    bf16_tflops: float
    fp8_tflops: float | None
    tf32_tflops: float
    hbm_gbps: float
    memory_gib: tuple[float, float] = (0.0, math.inf)  # the device's memory lies in this range


CARDS: tuple[Card, ...] = (
    Card("H200 NVL", ("h200", "nvl"), 835.5, 1670.5, 417.5, 4800),
    Card("H200 SXM 141GB", ("h200",), 989.5, 1979.0, 494.5, 4800),
    Card("H100 NVL 94GB", ("h100", "nvl"), 835.5, 1670.5, 417.5, 3900),
    Card("H100 PCIe 80GB", ("h100", "pcie"), 756.5, 1513.0, 378.0, 2000),
    Card("H100 SXM 80GB", ("h100",), 989.5, 1979.0, 494.5, 3350, (70.0, 85.0)),
    Card("A100 80GB SXM", ("a100", "sxm"), 312.0, None, 156.0, 2039, (70.0, 85.0)),
    Card("A100 80GB PCIe", ("a100", "pcie"), 312.0, None, 156.0, 1935, (70.0, 85.0)),
    Card("A100 40GB", ("a100",), 312.0, None, 156.0, 1555, (35.0, 45.0)),
    Card("L40S", ("l40s",), 362.05, 733.0, 183.0, 864),
)


def find_card(device_name: str, memory_bytes: int | None = None) -> Card | None:
    """The first row whose tokens are all in ``device_name`` and whose memory range holds the
    device's memory (``None``: not checked); ``None`` when no row fits."""
    name = device_name.lower()
    gib = None if memory_bytes is None else memory_bytes / 2**30
    for card in CARDS:
        low, high = card.memory_gib
        if all(token in name for token in card.match) and (gib is None or low <= gib <= high):
            return card
    return None


@dataclass(frozen=True)
class Roof:
    """The limits a run is held against: peak TFLOP/s per precision and bandwidth in GB/s."""

    tflops: dict[str, float]  # "bf16", "fp8", "tf32"
    gbps: float
    card: str | None  # the table's row, if one was used
    source: str

    def peak(self, precision: str) -> float:
        return self.tflops.get(precision) or self.tflops["bf16"]

    def as_dict(self) -> dict:
        return {"card": self.card, "peak_tflops": dict(self.tflops), "hbm_gbps": self.gbps, "source": self.source}


def resolve_roof(device_name: str, memory_bytes: int | None, peak_tflops: float | None = None,
                 peak_gbps: float | None = None) -> Roof | None:
    """The card's roof from :data:`CARDS`, with either figure overridden; ``None`` when the card
    is unknown and no override is given. An unknown card with one override only is an error."""
    for value, option in ((peak_tflops, "peak_tflops"), (peak_gbps, "peak_gbps")):
        if value is not None and not value > 0:
            raise ValueError(f"{option} must be positive, got {value}")
    card = find_card(device_name, memory_bytes)
    if card is None and peak_tflops is None and peak_gbps is None:
        return None
    if card is None and (peak_tflops is None or peak_gbps is None):
        raise ValueError(f"no roof is known for {device_name!r}: give both --peak-tflops and --peak-gbps")
    overridden = [o for o, v in (("peak_tflops", peak_tflops), ("peak_gbps", peak_gbps)) if v is not None]
    if peak_tflops is not None:
        tflops = {"bf16": peak_tflops, "fp8": peak_tflops, "tf32": peak_tflops}
    else:
        tflops = {"bf16": card.bf16_tflops, "tf32": card.tf32_tflops}
        if card.fp8_tflops is not None:
            tflops["fp8"] = card.fp8_tflops
    source = "table (NVIDIA datasheets, dense)" if card else "given"
    if overridden and card:
        source += f", {' and '.join(overridden)} given"
    return Roof(tflops, peak_gbps if peak_gbps is not None else card.hbm_gbps, card.name if card else None, source)


def device_roof(device: torch.device, peak_tflops: float | None = None, peak_gbps: float | None = None) -> Roof | None:
    """:func:`resolve_roof` for ``device`` (the CPU matches no card)."""
    if device.type != "cuda":
        return resolve_roof("cpu", None, peak_tflops, peak_gbps)
    props = torch.cuda.get_device_properties(device)
    return resolve_roof(props.name, props.total_memory, peak_tflops, peak_gbps)


def precision(dtype: torch.dtype, work: Work) -> str:
    """The roof column a class is held against: TF32 for float32 work, bf16 for 16-bit."""
    return "tf32" if work.fp32 or dtype == torch.float32 else "bf16"


# ------------------------------------------------------------------------------ the ranges
class ClassRanges:
    """``record_function`` ranges around modules' forwards and objects' methods, for
    :func:`profile_classes`; a context manager that removes every hook and wrapper on exit."""

    def __init__(self):
        self.names: set[str] = set()
        self._handles: list = []
        self._wrapped: list[tuple[object, str]] = []

    def module(self, module: nn.Module, name: str) -> None:
        stack: list = []

        def enter(_module, _args):
            scope = record_function(name)
            scope.__enter__()
            stack.append(scope)

        def leave(_module, _args, _output):
            stack.pop().__exit__(None, None, None)

        self._handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
        self.names.add(name)

    def modules(self, pairs: Iterable[tuple[nn.Module, str]]) -> None:
        for module, name in pairs:
            self.module(module, name)

    def method(self, owner: object, attribute: str, name: str) -> None:
        bound = getattr(owner, attribute)

        def wrapped(*args, **kwargs):
            with record_function(name):
                return bound(*args, **kwargs)

        setattr(owner, attribute, wrapped)
        self._wrapped.append((owner, attribute))
        self.names.add(name)

    def __enter__(self) -> "ClassRanges":
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        for owner, attribute in reversed(self._wrapped):
            delattr(owner, attribute)
        self._handles, self._wrapped = [], []


@dataclass
class ClassTimes:
    """Seconds per class from one profiled call, the call's wall time and the kernel total."""

    seconds: dict[str, float]
    wall_seconds: float
    profiled_seconds: float  # every kernel's time (CUDA) or every op's self time (CPU) in the profile

    @property
    def kernel_seconds(self) -> float:
        return sum(self.seconds.values())


def _class_of(event, classes: set[str], stages: set[str], ops: dict[str, str]) -> str | None:
    op_class = None
    while event is not None:
        name = event.name
        if name in classes:
            return name
        if name in stages:
            return op_class or f"{name}.other"
        op_class = op_class or ops.get(name)
        event = event.cpu_parent
    return None


def profile_classes(call: Callable[[], object], ranges: ClassRanges, stages: Iterable[str],
                    device: torch.device, ops: dict[str, str] | None = None) -> ClassTimes:
    """Run ``call`` once under the profiler and give each kernel's time (CUDA) or each op's
    self time (CPU) to its innermost class range, else to its stage's ``.other`` (or to
    ``ops[name]`` for an op of that name outside every class range). ``call`` pushes the stage
    ranges itself (``record_function(stage)``); work outside every stage is not counted."""
    stages, ops = set(stages), ops or {}
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        began = time.perf_counter()
        call()
        if cuda:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - began
    seconds: dict[str, float] = {}
    markers = ranges.names | stages
    profiled = 0.0
    events = prof.events()
    cpu = torch.autograd.DeviceType.CPU
    unlinked = _unlinked_kernels(events) if cuda else []
    for event in events:
        # a range's span on the device (kineto's gpu_user_annotation) is no kernel of its own
        if event.device_type != cpu:
            if cuda and not event.is_user_annotation and event.name not in markers:
                profiled += event.device_time_total / 1e6
            continue
        if cuda:
            spent = sum(k.duration for k in event.kernels if k.name not in markers) / 1e6
        elif event.name not in markers:
            spent = event.self_cpu_time_total / 1e6
            profiled += spent
        else:
            continue
        if spent <= 0:
            continue
        name = _class_of(event, ranges.names, stages, ops)
        if name is not None:
            seconds[name] = seconds.get(name, 0.0) + spent
    marker_ranges = [e for e in events if e.device_type == cpu and e.name in markers] if unlinked else []
    for kernel, launch in unlinked:
        name = _class_of(_innermost_range(marker_ranges, launch), ranges.names, stages, ops)
        if name is not None and kernel.name not in markers:
            seconds[name] = seconds.get(name, 0.0) + kernel.device_time_total / 1e6
    return ClassTimes(seconds, wall, profiled)


def _unlinked_kernels(events) -> list[tuple[object, object]]:
    """The device kernels the profiler tied to no PyTorch op, each with the host call that
    launched it (same correlation id): Triton's kernels, launched through the driver from Python,
    arrive so. Those tied to an op are counted through the op's ``kernels``."""
    cpu = torch.autograd.DeviceType.CPU
    ops = {e.id for e in events if e.device_type == cpu and e.kernels}
    # a kernel's id is its launch's correlation id; the op it was tied to is named by its
    # linked_correlation_id where the profiler keeps one (newer PyTorch), else it is the op
    # around the launch that holds kernels
    linked = (lambda kernel, launch: kernel.linked_correlation_id in ops) if events and hasattr(
        events[0], "linked_correlation_id") else (lambda kernel, launch: _op_with_kernels_around(launch))
    launches = {e.id: e for e in events if e.device_type == cpu and "aunch" in e.name}
    found = []
    for e in events:
        if e.device_type == cpu or e.is_user_annotation or e.id not in launches:
            continue
        if not linked(e, launches[e.id]):
            found.append((e, launches[e.id]))
    return found


def _op_with_kernels_around(launch) -> bool:
    """Whether an op that holds kernels encloses ``launch`` on the host (a PyTorch op's launch)."""
    event = launch.cpu_parent
    while event is not None:
        if event.kernels:
            return True
        event = event.cpu_parent
    return False


def _innermost_range(marker_ranges: list, launch):
    """The innermost of ``marker_ranges`` (class and stage ranges) open on the host when ``launch`` ran."""
    start = launch.time_range.start
    around = [e for e in marker_ranges if e.time_range.start <= start <= e.time_range.end]
    return max(around, key=lambda e: e.time_range.start, default=None)


# ------------------------------------------------------------------------------ the report
def _figure(value: float) -> float:
    return float(f"{value:.4g}")


def class_figures(work: Work | None, seconds: float, roof: Roof | None, dtype: torch.dtype) -> dict:
    """One class's entry: its time, work, achieved rates, intensity and (with a roof) the
    binding roof and the fraction of it reached."""
    work = work or Work()
    flops, moved = work.total_flops, work.bytes
    entry = {"seconds": round(seconds, 9), "flops": flops, "matmul_flops": work.flops, "bytes": moved,
             "intensity": round(flops / moved, 3) if moved else None,
             "achieved_tflops": _figure(flops / seconds / 1e12) if seconds > 0 else None,
             "achieved_gbps": _figure(moved / seconds / 1e9) if seconds > 0 else None,
             "precision": precision(dtype, work) if moved else None}
    if roof is None or not moved:
        entry.update(roof_tflops=None, bound=None, roof_seconds=0.0 if roof and not moved else None,
                     roof_fraction=None)
        return entry
    peak, bandwidth = roof.peak(entry["precision"]), roof.gbps
    memory_rate = flops / moved * bandwidth / 1000  # TFLOP/s the bandwidth allows
    roof_seconds = max(flops / (peak * 1e12), moved / (bandwidth * 1e9))
    entry.update(roof_tflops=round(min(peak, memory_rate), 3), bound="compute" if peak <= memory_rate else "memory",
                 roof_seconds=round(roof_seconds, 9),
                 roof_fraction=_figure(roof_seconds / seconds) if seconds > 0 else None)
    return entry


def roofline_report(work: dict[str, Work], times: ClassTimes, roof: Roof | None, dtype: torch.dtype,
                    pass_seconds: float | None) -> dict:
    """Every class that has work or time, and the pass's fraction of the roofline."""
    names = sorted(set(work) | set(times.seconds))
    classes = {n: class_figures(work.get(n), times.seconds.get(n, 0.0), roof, dtype) for n in names}
    report = {"classes": classes, "profiled_wall_seconds": round(times.wall_seconds, 6),
              "kernel_seconds": round(times.kernel_seconds, 6),
              "unattributed_seconds": round(max(0.0, times.profiled_seconds - times.kernel_seconds), 6)}
    if roof is None:
        return report | {"roof_seconds": None, "roofline_fraction": None, "kernel_roofline_fraction": None}
    roof_seconds = sum(c["roof_seconds"] or 0.0 for c in classes.values())
    report["roof_seconds"] = round(roof_seconds, 9)
    report["roofline_fraction"] = _figure(roof_seconds / pass_seconds) if pass_seconds else None
    report["kernel_roofline_fraction"] = _figure(roof_seconds / times.kernel_seconds) if times.kernel_seconds > 0 else None
    return report


def roof_section(roof: Roof | None, device_name: str) -> dict:
    if roof is None:
        return {"known": False, "device_name": device_name,
                "why": "no card of the table matches this device; give --peak-tflops and --peak-gbps"}
    return {"known": True, "device_name": device_name} | roof.as_dict()


def format_classes(roofline: dict) -> list[str]:
    """The classes as table lines (stderr)."""
    lines = [f"  {'class':<24} {'ms':>9} {'TFLOP/s':>9} {'GB/s':>9} {'FLOP/B':>8} {'roof':>9} {'of roof':>8}"]
    for name, c in roofline["classes"].items():
        def show(value, fmt):
            return format(value, fmt) if value is not None else format("-", fmt[:2])
        lines.append(f"  {name:<24} {1000 * c['seconds']:>9.3f} {show(c['achieved_tflops'], '>9.2f')} "
                     f"{show(c['achieved_gbps'], '>9.1f')} {show(c['intensity'], '>8.1f')} "
                     f"{show(c['roof_tflops'], '>9.1f')} {show(c['roof_fraction'], '>8.3f')}")
    if roofline.get("roofline_fraction") is not None:
        lines.append(f"  pass: {roofline['roofline_fraction']:.3f} of the roofline "
                     f"({roofline['kernel_roofline_fraction']:.3f} of the profiled kernel time)")
    return lines


# ------------------------------------------------------------------------------ the plot
def plot_path(out: str, suffix: str) -> Path:
    """The plot's file next to the JSON report ``out``: ``<stem>-roofline-<suffix>.png``."""
    path = Path(out)
    return path.with_name(f"{path.stem}-roofline-{suffix}.png")


def roofline_entries(report: dict) -> list[tuple[dict, str, str]]:
    """The passes of a ``bench vocoder --roofline`` report, or the decode steps of a ``bench t3
    --roofline`` one, that hold a roofline, each with its plot's file suffix and title: for the
    run's own plots and for ``chorus bench plot roofline``."""
    on = f"{report['dtype']} on {report['device_name']}"
    if "passes" in report:
        return [(p, f"b{p['batch']}-n{p['new_tokens']}",
                 f"{report['variant']} vocoder pass, B={p['batch']} N={p['new_tokens']}, {on}")
                for p in report["passes"] if "roofline" in p]
    return [(d, f"b{d['batch']}", f"{report['variant']} T3 decode step, {d['rows']} rows, {on}")
            for d in report["decode"] if "roofline" in d]


def write_plots(out: str, report: dict) -> None:
    """One plot per pass or decode step of ``report`` (:func:`roofline_entries`) next to the JSON
    report ``out``; each entry records its file's name (``roofline_plot``)."""
    for entry, suffix, title in roofline_entries(report):
        path = plot_path(out, suffix)
        write_plot(path, entry["roofline"], report["roof"], title)
        entry["roofline_plot"] = path.name


def write_plot(path: str | Path, roofline: dict, roof: dict, title: str):
    """A log-log roofline: intensity (FLOP/B) against achieved TFLOP/s, one labelled point per
    class with work, and the roof of each precision the classes use (``roof``: the report's
    :func:`roof_section`). Returns the figure written to ``path`` (PNG)."""
    figure = new_figure(10, 7)
    points = [(n, c) for n, c in roofline["classes"].items() if c["intensity"] and c["achieved_tflops"]]
    axes = figure.add_subplot()
    axes.set_xscale("log")
    axes.set_yscale("log")
    xs = [c["intensity"] for _, c in points] or [1.0]
    low, high = min(xs + [0.1]) / 2, max(xs + [1000.0]) * 2
    if roof.get("known"):
        grid = [low * (high / low) ** (i / 200) for i in range(201)]
        gbps, peaks = roof["hbm_gbps"], roof["peak_tflops"]
        for column in sorted({c["precision"] for _, c in points}):
            peak = peaks.get(column) or peaks["bf16"]
            axes.plot(grid, [min(peak, x * gbps / 1000) for x in grid],
                      label=f"roof {column}: {peak:g} TFLOP/s, {gbps:g} GB/s")
        axes.legend(loc="lower right")
    for name, c in points:
        axes.scatter([c["intensity"]], [c["achieved_tflops"]])
        fraction = f" ({100 * c['roof_fraction']:.0f}%)" if c["roof_fraction"] is not None else ""
        axes.annotate(f"{name}{fraction}", (c["intensity"], c["achieved_tflops"]), textcoords="offset points",
                      xytext=(4, 4), fontsize=8)
    axes.set_xlim(low, high)
    axes.set_xlabel("arithmetic intensity (FLOP/byte)")
    axes.set_ylabel("achieved TFLOP/s")
    fraction = roofline.get("roofline_fraction")
    axes.set_title(title + (f"; pass at {fraction:.3f} of the roofline" if fraction is not None
                            else "; no roof known for this device"), fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(str(path), format="png", dpi=120)
    return figure


@contextlib.contextmanager
def stage(name: str):
    """The range of one stage of a profiled call."""
    with record_function(name):
        yield

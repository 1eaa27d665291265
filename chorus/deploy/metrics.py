"""The front's metrics: its own counters (errors, retries, cut streams, replicas by readiness)
and every replica's samples merged into one Prometheus text (:func:`merge_metrics`)."""
from __future__ import annotations

import re
from typing import Mapping


class FrontMetrics:
    """The front's own counters, in a registry of their own (the replicas' come merged)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.errors = Counter("chorus_front_errors", "Error answers the HTTP front sent, by type", ["type"],
                              registry=registry)
        self.retries = Counter("chorus_front_retries",
                               "Speech requests retried on another replica (theirs died before audio)",
                               registry=registry)
        self.stream_cuts = Counter("chorus_front_stream_cuts",
                                   "Responses cut after their first audio byte, by reason", ["reason"],
                                   registry=registry)
        self.replicas = Gauge("chorus_front_replicas", "Engine replicas that published recently, by readiness",
                              ["ready"], registry=registry)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def merge_metrics(per_replica: dict[str, bytes], labels: Mapping[str, Mapping[str, str]] | None = None) -> bytes:
    """Every replica's samples labelled ``replica="<id>"`` and the replica's ``labels`` (its
    ``model`` and ``version``), and per series (those labels included, so per model version) the
    sum over replicas labelled ``replica="total"``. Counters and gauges add up; a histogram's
    buckets, ``_sum`` and ``_count`` are counters, so their sums are the histogram of all
    requests (every replica uses the same buckets). ``_created`` timestamps are not summed.
    Label values are ids and version labels, which hold no character that needs escaping."""
    meta: dict[str, list[str]] = {}  # family -> its HELP and TYPE lines
    samples: dict[str, list[str]] = {}  # family -> labelled samples (in first-seen order)
    totals: dict[str, dict[tuple[str, str], float]] = {}  # family -> (name, labels) -> sum
    for replica, text in per_replica.items():
        own = ",".join(f'{name}="{value}"' for name, value in (labels or {}).get(replica, {}).items())
        family = None
        for line in text.decode().splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line.split()[2]
                if line not in meta.setdefault(family, []):
                    meta[family].append(line)
                samples.setdefault(family, [])
                totals.setdefault(family, {})
                continue
            match = _SAMPLE.match(line)
            if match is None or family is None:
                continue
            name, sample_labels, value = match.groups()
            inner = ",".join(part for part in (own, sample_labels[1:-1] if sample_labels else "") if part)
            samples[family].append(f'{name}{{replica="{replica}"{"," + inner if inner else ""}}} {value}')
            if not name.endswith("_created"):
                key = (name, inner)
                totals[family][key] = totals[family].get(key, 0.0) + float(value)
    out: list[str] = []
    for family, lines in samples.items():
        out += meta[family] + lines
        out += [f'{name}{{replica="total"{"," + inner if inner else ""}}} {value!r}'
                for (name, inner), value in totals[family].items()]
    return ("\n".join(out) + "\n").encode() if out else b""


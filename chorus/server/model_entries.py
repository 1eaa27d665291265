"""The server's model registry as configured: which models it serves, under which ids, from
which checkpoints, with which share of the GPU (docs/models.md).

A server serves one or more **models**, each under an id that requests name in ``model``. An id
may point at several **versions** (entries with the same id and different ``version`` labels):
traffic is split between them by ``weight``, sticky per request key (A/B). Each version runs its
own engine and vocoder stage on the shared device.

In a config file the entries are an array of tables::

    [[models]]
    id = "chatterbox-turbo"
    variant = "turbo"
    checkpoint = "ckpt/turbo"
    memory_share = 0.6

    [[models]]
    id = "chatterbox"
    variant = "original"
    checkpoint = "ResembleAI/chatterbox"

and as a flag or environment variable, entries are separated by ``;`` and their fields by ``,``:
``--models "id=chatterbox-turbo,variant=turbo,checkpoint=ckpt/turbo;id=chatterbox,variant=original"``.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Sequence, TypeVar

ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
DEFAULT_VERSION = "1"
# settings of a version's own deployment on Ray Serve (docs/scaling.md); a one-process server has none
SCALE_SETTINGS = ("replicas", "min_replicas", "max_replicas")


@dataclass(frozen=True)
class ModelEntry:
    """One version of one model (a config file's ``[[models]]`` table).

    id: what requests pass as ``model`` (``chatterbox-turbo``, a custom name).
    variant: the checkpoint's variant (original, multilingual, multilingual-v3, turbo, nano).
    checkpoint: a directory in the official layout or a Hugging Face repo id (None: the
      variant's official repo).
    t3_weights: the T3 weights' file name in the checkpoint when it is not the variant's official
      one (``NAME.safetensors``, e.g. a multilingual finetune); None: the official name.
    version: the version label, unique per id; answered in ``X-Chorus-Model-Version`` and in
      every metric's ``version`` label.
    weight: this version's share of its id's traffic, relative to the id's other versions (A/B).
    memory_share: the fraction of the process's GPU budget (``gpu_memory_utilization``) this
      version may use, weights and KV pool together; None: an equal part of what the entries
      with a share leave. The shares of all entries add up to at most 1.
    kv_cache_bytes, max_num_seqs, vocoder_max_batch_items: this version's own KV pool size,
      T3 batch rows and vocoder batch items (None: the server-wide setting).
    replicas, min_replicas, max_replicas: on Ray Serve, this version's own deployment's replica
      count (a number or ``auto``) and autoscaling bounds (None: the application's); a
      one-process server refuses them (docs/scaling.md).
    """

    id: str
    variant: str
    checkpoint: str | None = None
    t3_weights: str | None = None
    version: str = DEFAULT_VERSION
    weight: int = 100
    memory_share: float | None = None
    kv_cache_bytes: int | None = None
    max_num_seqs: int | None = None
    vocoder_max_batch_items: int | None = None
    replicas: str | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None

    def __post_init__(self):
        from chorus.models.variants import get_variant

        where = f"models entry {self.id!r}"
        if not isinstance(self.id, str) or not ID_RE.fullmatch(self.id):
            raise ValueError(f"models entry id {self.id!r}: ids are 1-128 characters of letters, digits and "
                             "'.', '_', ':', '-', starting with a letter or digit")
        try:
            object.__setattr__(self, "variant", get_variant(self.variant).name)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        if not isinstance(self.version, str) or not VERSION_RE.fullmatch(self.version):
            raise ValueError(f"{where}: version {self.version!r} must be 1-64 characters of letters, digits and "
                             "'.', '_', '+', '-'")
        if not (isinstance(self.weight, int) and not isinstance(self.weight, bool) and self.weight >= 0):
            raise ValueError(f"{where}: weight must be an integer >= 0, got {self.weight!r}")
        if self.memory_share is not None and not (
                isinstance(self.memory_share, (int, float)) and 0 < self.memory_share <= 1):
            raise ValueError(f"{where}: memory_share must be in (0, 1], got {self.memory_share!r}")
        for name in ("kv_cache_bytes", "max_num_seqs", "vocoder_max_batch_items"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"{where}: {name} must be a positive integer or unset, got {value!r}")
        self._check_scale(where)

    def _check_scale(self, where: str) -> None:
        if self.replicas is not None:
            replicas = str(self.replicas).strip().lower()
            counted = replicas == "auto" or (replicas.isdigit() and int(replicas) > 0)
            if isinstance(self.replicas, bool) or not counted:
                raise ValueError(f"{where}: replicas must be a positive integer or 'auto', got {self.replicas!r}")
            object.__setattr__(self, "replicas", replicas)
        for name in ("min_replicas", "max_replicas"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"{where}: {name} must be a positive integer or unset, got {value!r}")
        low, high = self.min_replicas, self.max_replicas
        if low is not None and high is not None and low > high:
            raise ValueError(f"{where}: min_replicas ({low}) must be <= max_replicas ({high})")

    @property
    def key(self) -> tuple[str, str]:
        return self.id, self.version


_INT_FIELDS = {"weight", "kv_cache_bytes", "max_num_seqs", "vocoder_max_batch_items", "min_replicas", "max_replicas"}
_FIELDS = [f.name for f in fields(ModelEntry)]


def parse_entry(raw: Mapping[str, Any] | ModelEntry) -> ModelEntry:
    """One entry from a config file's table (or already built)."""
    if isinstance(raw, ModelEntry):
        return raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"a models entry must be a table of settings, got {raw!r}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ValueError(f"models entry {raw.get('id')!r}: unknown setting(s) {', '.join(unknown)}; "
                         f"known: {', '.join(_FIELDS)}")
    for required in ("id", "variant"):
        if required not in raw:
            raise ValueError(f"models entry {dict(raw)!r} has no {required!r}")
    values = dict(raw)
    if isinstance(values.get("replicas"), str) and values["replicas"].strip().lower() in ("", "none"):
        values["replicas"] = None
    for name in _INT_FIELDS & set(values):
        values[name] = _number(values, name, int)
    if "memory_share" in values:
        values["memory_share"] = _number(values, "memory_share", float)
    return ModelEntry(**values)


def _number(values: dict, name: str, kind: type) -> Any:
    raw = values[name]
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none")):
        return None
    if isinstance(raw, str):
        try:
            return kind(raw.strip())
        except ValueError:
            raise ValueError(f"models entry {values.get('id')!r}: {name} must be a number, got {raw!r}") from None
    return raw


def parse_entries(raw: Any) -> tuple[ModelEntry, ...]:
    """The ``models`` setting: a file's array of tables, or the flag's text
    (``id=a,variant=turbo;id=b,variant=original``)."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        tables = []
        for part in (p.strip() for p in raw.split(";")):
            if not part:
                continue
            table = {}
            for item in (i.strip() for i in part.split(",")):
                key, sep, value = item.partition("=")
                if not sep or not key.strip():
                    raise ValueError(f"models: {item!r} in {part!r} is not name=value "
                                     "(entries are separated by ';' and their settings by ',')")
                table[key.strip()] = value.strip()
            tables.append(table)
        raw = tables
    if isinstance(raw, Mapping) or not isinstance(raw, Sequence):
        raise ValueError(f"models must be a list of entries, got {raw!r}")
    entries = tuple(parse_entry(r) for r in raw)
    check_entries(entries)
    return entries


def check_entries(entries: Sequence[ModelEntry], *, shares: bool = True) -> None:
    """The rules between entries: (id, version) unique, every id with some weight, one variant
    per id (a request's parameters mean the same on every version), and (``shares``: the plan
    of a start-up) memory shares adding up to at most 1. A version loaded later is checked
    against the device's free memory instead, when it loads."""
    seen: set[tuple[str, str]] = set()
    by_id: dict[str, list[ModelEntry]] = {}
    for entry in entries:
        if entry.key in seen:
            raise ValueError(f"models: id {entry.id!r} has version {entry.version!r} twice; give each version "
                             "its own label")
        seen.add(entry.key)
        by_id.setdefault(entry.id, []).append(entry)
    for model_id, versions in by_id.items():
        if sum(v.weight for v in versions) == 0:
            raise ValueError(f"models: every version of {model_id!r} has weight 0, so it would get no traffic")
        variants = {v.variant for v in versions}
        if len(variants) > 1:
            raise ValueError(f"models: the versions of {model_id!r} are of different variants ({', '.join(sorted(variants))}); "
                             "an id's versions must share a variant (serve the other under its own id)")
    if not shares:
        return
    given = [e.memory_share for e in entries if e.memory_share is not None]
    if sum(given) > 1 + 1e-9:
        raise ValueError(f"models: the memory shares add up to {sum(given):g}; they must add up to at most 1 "
                         "(each is a fraction of gpu_memory_utilization)")
    if len(given) < len(entries) and sum(given) >= 1 - 1e-9:
        raise ValueError("models: the memory shares given add up to 1 and leave nothing for the entries without one")


def memory_shares(entries: Sequence[ModelEntry]) -> dict[tuple[str, str], float]:
    """Each entry's fraction of the GPU budget: its own ``memory_share``, or an equal part of
    what the entries with one leave."""
    given = sum(e.memory_share for e in entries if e.memory_share is not None)
    rest = [e for e in entries if e.memory_share is None]
    each = (1.0 - given) / len(rest) if rest else 0.0
    return {e.key: e.memory_share if e.memory_share is not None else each for e in entries}


def aliases(entries: Sequence[ModelEntry]) -> dict[str, str]:
    """Other names each id answers to: ``turbo`` for ``chatterbox-turbo`` (the bare variant
    name, for the id ``chatterbox-<variant>``), unless another id already is that name."""
    ids = {e.id for e in entries}
    out: dict[str, str] = {}
    for entry in entries:
        alias = entry.variant
        if entry.id == f"chatterbox-{entry.variant}" and alias not in ids:
            out[alias] = entry.id
    return out


def check_one_process(entries: Sequence[ModelEntry]) -> None:
    """Refuse the Ray Serve settings of an entry in a one-process server, which runs each
    version once (they would be ignored there)."""
    for entry in entries:
        given = [name for name in SCALE_SETTINGS if getattr(entry, name) is not None]
        if given:
            raise ValueError(f"models entry {entry.id!r} version {entry.version!r}: {', '.join(given)} "
                             f"{'is a Ray Serve setting' if len(given) == 1 else 'are Ray Serve settings'} "
                             "(one deployment per model version, docs/scaling.md) and this server runs every "
                             "version once, in one process; remove them, or serve on Ray Serve (chorus serve "
                             "--replicas N, or serve run chorus.deploy:app)")


V = TypeVar("V")


def pick_version(model_id: str, key: str, versions: Sequence[V], *, weight: Callable[[V], int],
                 ready: Callable[[V], bool]) -> V:
    """The version of ``model_id`` that the request key ``key`` lands on: a point on the weights'
    line that depends on the key and the id alone, so the same key reaches the same version
    while the weights stay put, and a changed split moves only the keys between the old and the
    new boundary. Versions that are not ready are passed over while another one is (a failed
    start of one version must not fail its share of the traffic). The one rule of every
    backend that splits an id between versions (one process, or Ray Serve)."""
    candidates = ([v for v in versions if ready(v) and weight(v) > 0] or [v for v in versions if weight(v) > 0]
                  or list(versions))
    if len(candidates) == 1:
        return candidates[0]
    total = sum(weight(v) for v in candidates)
    digest = hashlib.blake2b(f"{model_id}\0{key}".encode(), digest_size=8).digest()
    point = int.from_bytes(digest, "big") % total
    for version in candidates:
        point -= weight(version)
        if point < 0:
            return version
    raise AssertionError("unreachable: the point lies within the total weight")

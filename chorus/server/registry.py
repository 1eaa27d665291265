"""Several models in one server: the model registry, the ``Backend`` of a ``chorus serve``
process (docs/models.md).

Each configured model version (``ModelEntry``) runs in its own :class:`SpeechService` (engine,
vocoder stage, admission, degradation, canary) on the shared device. A request's ``model``
names a **route**: one id and its versions. A route with several versions splits traffic by the
versions' weights, sticky per request key (``X-Chorus-Affinity``, else the API key, else the
request id): the same key always lands on the same version while the weights stay put, so a
conversation does not switch voices mid-way. The version that served is named in the
response's ``X-Chorus-Model-Version`` header and in the ``version`` label of its metrics.

Routes are immutable and replaced whole, on the event loop, so a request sees a route either
before or after a change, never half of one. A **swap** (``load_version`` without a weight)
loads the new version beside the old ones (its canary included), points the route at it alone,
then retires the old versions: they take no new requests, their requests and streams in flight
finish (nothing is cut), then their pipelines close and their memory is returned. A failed load
changes nothing and says why. ``/ready`` stays true throughout: the route always has a ready
version.
"""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from chorus import gc_pauses
from chorus.server.checks import unknown_model
from chorus.server.config import ServerConfig
from chorus.server.errors import APIError
from chorus.server.metrics import ProcessMetrics
from chorus.server.model_entries import (ModelEntry, aliases, check_entries, check_one_process, memory_shares,
                                         pick_version)
from chorus.server.process_watch import ProcessWatch
from chorus.server.service import Loaded, SpeechService

logger = logging.getLogger("chorus.server")

VERSION_HEADER = "X-Chorus-Model-Version"
AFFINITY_HEADER = "X-Chorus-Affinity"
# entry settings the admin API may give a new version (the rest come from the version it joins)
LOADABLE = ("variant", "checkpoint", "t3_weights", "weight", "memory_share", "kv_cache_bytes", "max_num_seqs",
            "vocoder_max_batch_items")


@dataclass(eq=False)
class Version:
    """One loaded model version and what routes to it."""

    entry: ModelEntry
    service: SpeechService
    routed: int = 0  # requests routed here that have not yet been admitted or answered
    retiring: bool = False

    @property
    def label(self) -> str:
        return self.entry.version

    def busy(self) -> bool:
        """Whether work still runs here: routed requests, admitted ones (until their last byte),
        and what the service's drain holds wait for (WebSocket turns)."""
        return bool(self.routed or self.service.admission.in_flight or self.service.held())


@dataclass(frozen=True)
class Route:
    """A model id and its versions (at least one). Immutable: the registry replaces it whole."""

    model_id: str
    versions: tuple[Version, ...]

    def pick(self, key: str) -> Version:
        """The version ``key`` lands on (``model_entries.pick_version``: sticky per key, split by
        weight, versions that are not ready passed over while another one is)."""
        return pick_version(self.model_id, key, self.versions, weight=lambda v: v.entry.weight,
                            ready=lambda v: v.service.state == "ready")


class ModelRegistry:
    """The ``LocalBackend`` (``backend.py``) of one process serving the models of ``config.entries()``.

    ``load(config)`` loads one model version (``config`` is ``ServerConfig.for_entry``'s, its
    ``models`` the one entry) on a worker thread and returns its started pipeline and voice
    store: ``chorus.server.main.load_models``, or tiny models in tests.
    """

    def __init__(self, config: ServerConfig, load: Callable[[ServerConfig], Loaded], *, clock=time.monotonic):
        check_one_process(config.entries())
        self.config = config
        self._load = load
        self._clock = clock
        self.started_at = time.time()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.routes: dict[str, Route] = {}
        self.aliases: dict[str, str] = aliases(config.entries())
        self.retiring: list[Version] = []
        self.metrics = ProcessMetrics(self._metric_sources)
        self._holds: list[Callable[[SpeechService], int]] = []
        self._admin = asyncio.Lock()
        self._watch = ProcessWatch(self.metrics)  # the event loop's lag and the collector's pauses
        self._starting = True
        self._draining = False
        shares = memory_shares(config.entries())
        for entry in config.entries():
            version = self._version(dataclasses.replace(entry, memory_share=shares[entry.key]))
            route = self.routes.get(entry.id)
            self.routes[entry.id] = Route(entry.id, (route.versions if route else ()) + (version,))

    def _version(self, entry: ModelEntry) -> Version:
        config = self.config.for_entry(entry)
        service = SpeechService(config, lambda: self._load(config), clock=self._clock)
        service.aliases = [name for name, target in self.aliases.items() if target == entry.id]
        for hold in self._holds:
            service.hold_drain(lambda hold=hold, service=service: hold(service))
        return Version(entry, service)

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start every version, one after another (each sizes its memory against what the
        ones before it hold). A version that fails stays in state ``failed``; the server serves
        the others and ``/ready`` names it."""
        self.loop = asyncio.get_running_loop()
        self._watch.start()
        for version in self.versions():
            await version.service.start()  # a failure is logged there, with the model and version
        if self.config.gc_freeze:
            gc_pauses.freeze()  # the models are loaded and warm: what lives now lives for good
        self._starting = False

    async def stop(self) -> None:
        self._watch.stop()
        await asyncio.gather(*(v.service.stop() for v in self.versions() + self.retiring))
        if self.config.gc_freeze:
            gc_pauses.thaw()

    async def drain(self, grace_s: float) -> None:
        """Shutting down: every version drains at once (``SpeechService.drain``)."""
        self._draining = True
        await asyncio.gather(*(v.service.drain(grace_s) for v in self.versions() + self.retiring))

    def hold_drain(self, count: Callable[[SpeechService], int]) -> None:
        """Make each version's drain (shutdown or retirement) also wait while ``count(its
        service)`` is above zero (e.g. WebSocket turns running on it)."""
        self._holds.append(count)
        for version in self.versions() + self.retiring:
            version.service.hold_drain(lambda service=version.service: count(service))

    def versions(self) -> list[Version]:
        return [v for route in self.routes.values() for v in route.versions]

    # ------------------------------------------------------------------------------ readiness
    @property
    def state(self) -> str:
        """starting/loading/warming while a version starts at start-up, draining while shutting
        down, ready when every model has a ready version, else failed."""
        if self._draining:
            return "draining"
        if self._starting:
            states = [v.service.state for v in self.versions()]
            return next((s for s in states if s in ("loading", "warming")), "starting")
        return "ready" if self._unready() is None else "failed"

    @property
    def failure(self) -> str | None:
        return None if self._starting or self._draining else self._unready()

    def _unready(self) -> str | None:
        """Why some model has no ready version (None: every one has)."""
        for route in self.routes.values():
            reasons = []
            for version in route.versions:
                ok, why = version.service.readiness()
                if ok:
                    break
                reasons.append(f"version {version.label}: {why}")
            else:
                return f"model {route.model_id}: " + "; ".join(reasons)
        return None

    def readiness(self) -> tuple[bool, str | None]:
        state = self.state
        if state != "ready":
            return False, self.failure or f"the server is {state}"
        return True, None

    def degraded(self) -> list[str]:
        return [f"model {v.entry.id} version {v.label}: {why}" for v in self.versions() for why in v.service.degraded()]

    @property
    def degradation_level(self) -> int:
        return max((v.service.degradation_level for v in self.versions()), default=0)

    def require_serving(self) -> None:
        """A 503 unless some version serves (what is not one model's: the voice library)."""
        if self._draining:
            raise APIError(503, "the server is shutting down; retry on another replica", code="shutting_down",
                           headers={"Retry-After": "5"})
        if not any(v.service.state == "ready" for v in self.versions()):
            raise APIError(503, f"not ready: {self.failure or 'the models are ' + self.state}", code="not_ready",
                           headers={"Retry-After": str(max(self.config.retry_after_s, 5))})

    # -------------------------------------------------------------------------------- routing
    def model_ids(self) -> list[str]:
        return [*self.routes, *self.aliases]

    def route_of(self, model: str) -> Route:
        route = self.routes.get(self.aliases.get(model, model))
        if route is None:
            raise unknown_model(model, self.model_ids())
        return route

    def pick(self, model: str, key: str) -> Version:
        """The version that serves a request for ``model`` with request key ``key``."""
        return self.route_of(model).pick(key)

    def serving(self, model: str, key: str) -> SpeechService:
        """The service a request for ``model`` with request key ``key`` goes to (WebSocket turns)."""
        return self.pick(model, key).service

    def model_cards(self) -> list[dict[str, Any]]:
        """What ``GET /v1/models`` says of each id (aliases after them, pointing at their id)."""
        return cards_of([(route.model_id, route.versions[0].service.config.variant,
                          [dict(version=v.label, weight=v.entry.weight, state=v.service.state) for v in route.versions])
                         for route in self.routes.values()], self.aliases)

    # ---------------------------------------------------------------------- refusing early
    def refusing(self) -> bool:
        return any(v.service.refusing() for v in self.versions())

    def certain_refusal(self, body, priority_header: str | None) -> APIError | None:
        """A version's certain refusal when every version the request could land on refuses."""
        try:
            route = self.route_of(body.model)
        except APIError:
            return None
        refusals = [v.service.certain_refusal(body, priority_header) for v in route.versions if v.entry.weight > 0]
        return refusals[0] if refusals and all(r is not None for r in refusals) else None

    # ------------------------------------------------------------------------------- requests
    async def speech(self, body, priority_header: str | None, request_id: str, *, arrived: float,
                     affinity: str | None = None, voice_clip: bytes | None = None, timed: bool = False):
        return await self._call(body.model, affinity or request_id,
                                lambda s: s.speech(body, priority_header, request_id, arrived=arrived,
                                                   voice_clip=voice_clip, timed=timed))

    async def convert(self, form, priority_header: str | None, request_id: str, *, arrived: float,
                      affinity: str | None = None):
        return await self._call(form.fields.model, affinity or request_id,
                                lambda s: s.convert(form, priority_header, request_id, arrived=arrived))

    async def _call(self, model: str, key: str, start):
        version = self.pick(model, key)
        version.routed += 1  # until admission holds it (or it is answered): a retirement waits
        try:
            response = await start(version.service)
        finally:
            version.routed -= 1
        response.headers[VERSION_HEADER] = version.label
        return response

    # --------------------------------------------------------------------------------- voices
    def _voices(self):
        """The voice library, through the first ready version's store (every store reads the
        same files; a voice is built per model family on first use)."""
        ready = [v for v in self.versions() if v.service.state == "ready"]
        return (ready or self.versions())[0].service

    async def add_voice(self, data: bytes, name: str | None):
        return await self._voices().add_voice(data, name)

    async def list_voices(self) -> list:
        return await self._voices().list_voices()

    async def voice_info(self, voice_id: str):
        return await self._voices().voice_info(voice_id)

    async def delete_voice(self, voice_id: str) -> bool:
        return await self._voices().delete_voice(voice_id)

    # -------------------------------------------------------------------------------- metrics
    def _metric_sources(self):
        return [(v.entry.id, v.label, v.service.metrics) for v in self.versions() + self.retiring]

    async def metrics_text(self) -> bytes:
        return self.metrics.render()

    def record_error(self, code: str, rule: str | None = None) -> None:
        self.metrics.record_error(code, rule)

    # ------------------------------------------------------------------------------ admin API
    def describe(self) -> list[dict[str, Any]]:
        """Every version, retiring ones included, for ``GET /v1/admin/models``."""
        rows = []
        for version in self.versions() + self.retiring:
            service, entry = version.service, version.entry
            rows.append(dict(id=entry.id, version=entry.version, variant=entry.variant, checkpoint=entry.checkpoint,
                             weight=entry.weight, memory_share=entry.memory_share,
                             state="retiring" if version.retiring else service.state, failure=service.failure,
                             in_flight=service.admission.in_flight + version.routed))
        return rows

    async def load_version(self, model_id: str, settings: dict[str, Any], version_label: str) -> dict[str, Any]:
        """Load ``version_label`` of ``model_id`` beside what serves (warm-up and canary
        included), then route to it: with a ``weight`` in ``settings`` beside the id's other
        versions (A/B), else instead of them (a swap: they retire). A new id adds a model. A load
        that fails changes nothing and raises a 422 ``load_failed`` naming the cause."""
        unknown = sorted(set(settings) - set(LOADABLE))
        if unknown:
            raise APIError(400, f"unknown setting(s) {', '.join(unknown)}; a version takes {', '.join(LOADABLE)}",
                           code="invalid_parameter", param=unknown[0])
        async with self._admin:
            self._require_running()
            route = self.routes.get(model_id)
            base = route.versions[0].entry if route else None
            if route is not None and any(v.label == version_label for v in route.versions):
                raise APIError(409, f"model {model_id!r} already serves version {version_label!r}; load a new "
                                    "version label", code="version_exists", param="version")
            if base is None and "variant" not in settings:
                raise APIError(400, f"model {model_id!r} is new here: give its variant", code="invalid_parameter",
                               param="variant")
            ab = "weight" in settings
            inherited = dataclasses.asdict(base) if base is not None else {}
            if base is not None and not ab:
                inherited["memory_share"] = sum(v.entry.memory_share or 0.0 for v in route.versions) or None
            values = {**{k: inherited[k] for k in LOADABLE if k in inherited and k != "weight"},
                      **settings, "id": model_id, "version": version_label}
            values.setdefault("weight", 100)
            try:
                entry = ModelEntry(**values)
                check_entries([v.entry for v in self.versions() if v.entry.id != model_id or ab] + [entry],
                              shares=False)
            except (TypeError, ValueError) as exc:
                raise APIError(400, str(exc), code="invalid_parameter") from None
            version = self._version(entry)
            logger.info("loading model %s version %s", model_id, version_label)
            await version.service.start()
            if version.service.state != "ready":
                failure = version.service.failure or f"the version is {version.service.state}"
                await version.service.stop()
                raise APIError(422, f"loading model {model_id!r} version {version_label!r} failed: {failure}; "
                                    "what served before still serves", code="load_failed")
            old = route.versions if route is not None else ()
            self.routes[model_id] = Route(model_id, old + (version,) if ab else (version,))
            if model_id not in self.aliases.values():
                self.aliases.update({a: t for a, t in aliases([entry]).items() if a not in self.routes
                                     and a not in self.aliases})
            logger.info("model %s now routes to version(s) %s", model_id,
                        ", ".join(v.label for v in self.routes[model_id].versions))
            if self.config.gc_freeze:
                gc_pauses.freeze()  # the new version's heap joins the frozen one (an unload thaws it)
            if not ab:
                for retired in old:
                    self._retire(retired)
            return self.describe_model(model_id)

    async def set_weights(self, model_id: str, weights: dict[str, int]) -> dict[str, Any]:
        """New weights for some of ``model_id``'s versions (the A/B split)."""
        async with self._admin:
            self._require_running()
            route = self._admin_route(model_id)
            labels = {v.label for v in route.versions}
            unknown = sorted(set(weights) - labels)
            if unknown:
                raise APIError(404, f"model {model_id!r} has no version {unknown[0]!r} (it has {', '.join(sorted(labels))})",
                               code="version_not_found", param="weights")
            try:
                versions = tuple(dataclasses.replace(v, entry=dataclasses.replace(v.entry, weight=weights[v.label]))
                                 if v.label in weights else v for v in route.versions)
                check_entries([v.entry for v in versions], shares=False)
            except (TypeError, ValueError) as exc:
                raise APIError(400, str(exc), code="invalid_parameter", param="weights") from None
            self.routes[model_id] = Route(model_id, versions)
            return self.describe_model(model_id)

    async def unload_version(self, model_id: str, version_label: str) -> dict[str, Any]:
        """Stop routing to one version of ``model_id`` and retire it (its work in flight
        finishes first). The last version of a model cannot be unloaded."""
        async with self._admin:
            self._require_running()
            route = self._admin_route(model_id)
            keep = tuple(v for v in route.versions if v.label != version_label)
            if len(keep) == len(route.versions):
                raise APIError(404, f"model {model_id!r} has no version {version_label!r}", code="version_not_found",
                               param="version")
            if not keep:
                raise APIError(409, f"version {version_label!r} is the last of model {model_id!r}; load another "
                                    "version first", code="last_version", param="version")
            self.routes[model_id] = Route(model_id, keep)
            self._retire(next(v for v in route.versions if v.label == version_label))
            return self.describe_model(model_id)

    def describe_model(self, model_id: str) -> dict[str, Any]:
        return dict(id=model_id, versions=[r for r in self.describe() if r["id"] == model_id])

    def _admin_route(self, model_id: str) -> Route:
        route = self.routes.get(model_id)
        if route is None:
            raise APIError(404, f"model {model_id!r} is not served here", code="model_not_found", param="model")
        return route

    def _require_running(self) -> None:
        if self._starting or self._draining:
            raise APIError(503, f"the server is {self.state}; retry when it is ready", code="not_ready",
                           headers={"Retry-After": "5"})

    def _retire(self, version: Version) -> None:
        version.retiring = True
        self.retiring.append(version)
        asyncio.get_running_loop().create_task(self._drain_retired(version))

    async def _drain_retired(self, version: Version) -> None:
        """Wait for the version's work in flight to finish (no deadline: a stream is never cut
        for a swap), then close it and return its memory."""
        logger.info("retiring model %s version %s (%d in flight)", version.entry.id, version.label,
                    version.service.admission.in_flight)
        while version.busy():
            await asyncio.sleep(0.05)
        await version.service.stop()
        version.service.pipeline = version.service.voices = None
        self.retiring.remove(version)
        await asyncio.to_thread(_release_memory, self.config.gc_freeze)
        logger.info("model %s version %s unloaded", version.entry.id, version.label)


def affinity_key(headers, query_key: str | None = None) -> str | None:
    """The request key that picks the version of an A/B-split model (docs/models.md, "Routing"):
    the ``X-Chorus-Affinity`` header, else the API key (one client, one version; a browser's
    WebSocket sends it as ``query_key``), else None (the caller's own id then decides)."""
    header = headers.get(AFFINITY_HEADER.lower())
    if header:
        return header
    scheme, _, key = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return key.strip()
    return query_key or None


def _release_memory(frozen: bool) -> None:
    """Return what a closed pipeline held: its tensors to the allocator, the allocator's cache
    to the device. ``frozen``: the heap was frozen at start-up (the pipeline's cycles with it)."""
    if frozen:
        gc_pauses.collect_everything()
    else:
        gc.collect()
    import torch

    from chorus import capture_gate

    if torch.cuda.is_available():
        capture_gate.empty_cache()


def cards_of(routes: list[tuple[str, str, list[dict[str, Any]]]], aliases: dict[str, str]) -> list[dict[str, Any]]:
    """``GET /v1/models``' cards from (id, variant, version rows) per id: each id, then each alias
    as a copy of its id's card with ``alias_of``."""
    cards = [dict(id=model_id, variant=variant, languages=_languages(variant), versions=versions)
             for model_id, variant, versions in routes]
    for alias, target in aliases.items():
        card = next(c for c in cards if c["id"] == target)
        cards.append({**card, "id": alias, "alias_of": target})
    return cards


def _languages(variant: str) -> list[str]:
    from chorus.models.variants import get_variant

    return list(get_variant(variant).languages)

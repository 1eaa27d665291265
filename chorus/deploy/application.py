"""Building the Serve application (:func:`build`, :func:`app` for ``serve run`` and Serve config
files) and running it on a local Ray cluster (:func:`run_local`, ``chorus serve --replicas N``):
``Ingress`` over one engine deployment per model version, each with a fixed replica count or
autoscaling bounds."""
from __future__ import annotations

import logging
import time
from typing import Any

import ray
from ray import serve
from ray.serve.config import AutoscalingConfig, RequestRouterConfig

from chorus.deploy.ingress import Ingress
from chorus.deploy.replica import DEFAULT_LOADER, EngineReplica, deployment_name
from chorus.deploy.routing import LeastLoadedRouter
from chorus.server.config import ServerConfig, build_config

logger = logging.getLogger("chorus.server")

SCALE_FIELDS = ("replicas", "min_replicas", "max_replicas", "target_ongoing_requests", "upscale_delay_s",
                "downscale_delay_s", "look_back_period_s", "gpus_per_replica", "loader")
_FLOAT_SCALE_FIELDS = ("target_ongoing_requests", "upscale_delay_s", "downscale_delay_s", "look_back_period_s",
                       "gpus_per_replica")


def visible_gpus() -> int:
    """GPUs of the Ray cluster when connected to one (``serve run``, a Serve config, or
    ``chorus serve`` after ``ray.init``), else the CUDA devices this process sees."""
    if ray.is_initialized():
        return int(ray.cluster_resources().get("GPU", 0))
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch, no CUDA: no GPUs
        return 0


def replica_count(replicas: str | int) -> int:
    """``auto``: one per visible GPU (1 without a GPU); otherwise the number."""
    if str(replicas).strip().lower() == "auto":
        return max(1, visible_gpus())
    return int(replicas)


def build(config: ServerConfig, *, replicas: str | int = 1, min_replicas: int | None = None,
          max_replicas: int | None = None, target_ongoing_requests: float = 32.0,
          upscale_delay_s: float = 30.0, downscale_delay_s: float = 600.0, look_back_period_s: float = 30.0,
          gpus_per_replica: float | None = None, loader: str = DEFAULT_LOADER):
    """The Serve application: ``Ingress`` over one ``EngineReplica`` deployment per model version
    (:func:`deployment_name`; without ``models``, the one ``EngineReplica``). A version's
    ``replicas``, ``min_replicas`` and ``max_replicas`` are its models entry's where given, else
    these.

    With ``min_replicas`` or ``max_replicas`` Serve autoscales a deployment's replicas on their
    ongoing requests (queued and running, averaged over ``look_back_period_s``): it adds replicas
    when the average per replica stays above ``target_ongoing_requests`` for ``upscale_delay_s``
    and removes them when it stays below for ``downscale_delay_s`` (Serve's defaults; the long
    one suits us: a replica costs a model load and a warm-up to bring back)."""
    from chorus.server.main import effective_config

    config = effective_config(config)
    if gpus_per_replica is None:
        gpus_per_replica = 1.0 if config.device != "cpu" and visible_gpus() > 0 else 0.0
    if config.admin_keys:
        logger.warning("admin_keys are set, but the admin API is not served on Ray Serve (/v1/admin answers 501); "
                       "swaps and A/B weights are Serve updates there (docs/scaling.md)")
    tuning = dict(target_ongoing_requests=float(target_ongoing_requests), upscale_delay_s=float(upscale_delay_s),
                  downscale_delay_s=float(downscale_delay_s), look_back_period_s=float(look_back_period_s))
    engines = {}
    for entry in config.entries():
        name = deployment_name(config, entry)
        scale = _scale(entry.replicas or replicas, _given(entry.min_replicas, min_replicas),
                       _given(entry.max_replicas, max_replicas), tuning)
        engines[name] = EngineReplica.options(
            name=name, ray_actor_options={"num_gpus": gpus_per_replica, "num_cpus": 1},
            max_ongoing_requests=config.max_queue + 8,  # admission (429) is the engine's own, above it
            request_router_config=RequestRouterConfig(request_router_class=LeastLoadedRouter,
                                                      request_routing_stats_period_s=0.5,
                                                      request_routing_stats_timeout_s=5.0),
            **scale).bind(config.for_entry(entry) if config.models else config, loader)
    return Ingress.options(ray_actor_options={"num_cpus": 0}).bind(config, engines)


def _given(value: int | None, default: int | None) -> int | None:
    return value if value is not None else default


def _scale(replicas: str | int, min_replicas: int | None, max_replicas: int | None,
           tuning: dict[str, float]) -> dict[str, Any]:
    """One deployment's replica options: a fixed ``num_replicas``, or an ``autoscaling_config``
    between the bounds (either one given), starting at ``replicas`` within them."""
    if min_replicas is None and max_replicas is None:
        return {"num_replicas": replica_count(replicas)}
    low = int(min_replicas if min_replicas is not None else 1)
    high = int(max_replicas if max_replicas is not None else max(low, replica_count(replicas)))
    return {"autoscaling_config": AutoscalingConfig(
        min_replicas=low, max_replicas=high, initial_replicas=min(max(low, replica_count(replicas)), high),
        **tuning)}


def app(args: dict[str, Any]):
    """The application builder of ``serve run chorus.deploy:app key=value ...`` and of a Serve
    config file's ``import_path: chorus.deploy:app`` (``args``: ServerConfig fields, ``models``
    included, plus ``replicas``, ``min_replicas``, ``max_replicas``, ``target_ongoing_requests``,
    ``upscale_delay_s``, ``downscale_delay_s``, ``look_back_period_s``, ``gpus_per_replica``,
    ``loader``; a models entry's own ``replicas``, ``min_replicas``, ``max_replicas`` win for its
    deployment). ``CHORUS_*`` environment variables apply as in ``chorus serve``."""
    args = dict(args or {})
    scale = {k: args.pop(k) for k in SCALE_FIELDS if k in args}
    replicas = scale.pop("replicas", None) or "1"
    config = build_config(args)
    numbers = {k: (float(v) if k in _FLOAT_SCALE_FIELDS else int(v))
               for k, v in scale.items() if k != "loader" and v is not None}
    if "loader" in scale:
        numbers["loader"] = scale["loader"]
    return build(config, replicas=replicas, **numbers)


def run_local(config: ServerConfig) -> None:
    """``chorus serve --replicas N|auto``: a local Ray cluster, the application on
    ``config.host:config.port``, until Ctrl-C or SIGTERM."""
    import signal

    from chorus.server.config import describe
    from chorus.server.logs import setup_logging

    setup_logging(config.log_format, config.log_level)
    logger.info("starting the engine replicas on Ray Serve", extra={"config": describe(config)})
    ray.init(ignore_reinit_error=True, log_to_driver=True)

    def interrupt(*_):
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):  # also while starting: Ray's own handler would just exit
        signal.signal(sig, interrupt)
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        serve.run(build(config, replicas=config.replicas), name="chorus", route_prefix="/", blocking=False)
        logger.info("serving on http://%s:%d: %s", config.host, config.port, ", ".join(
            f"{deployment_name(config, e)} ({replica_count(e.replicas or config.replicas)} replica(s))"
            for e in config.entries()))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        logger.info("shutting down")
    except RuntimeError as exc:  # the replicas failed to start (Serve retried them): the log says why
        raise SystemExit(f"chorus serve: {exc}; the replicas' errors are in the log above") from None
    finally:
        serve.shutdown()
        ray.shutdown()

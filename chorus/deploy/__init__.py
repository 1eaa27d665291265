"""Scale-out on Ray Serve: one engine replica per GPU behind the same HTTP API.

One Serve application of two kinds of deployment (docs/scaling.md):

* :class:`EngineReplica`: one :class:`~chorus.server.service.SpeechService` (model, engine,
  admission, canary) per replica, usually one per GPU. It streams speech as ``("start",
  media_type, headers)`` (or ``("error", fields)``) followed by the encoded audio chunks. A
  config with ``models`` has one such deployment per model version (:func:`deployment_name`),
  each with its own replica count or autoscaling bounds.
* :class:`Ingress`: the HTTP layer of ``chorus/server/app.py`` over a :class:`RemoteBackend`,
  which picks the model version of each request (by ``model``, then by weight, sticky per
  request key, as in one process) and forwards the call to one of its replicas through a Serve
  handle chosen by :class:`LeastLoadedRouter` (queue fill plus KV use, not round robin). Its
  ``user_config`` sets the A/B weights without restarting anything (:meth:`Ingress.reconfigure`).

Replicas publish their readiness and Prometheus text every second to a detached
:class:`ReplicaBoard` actor; the front reads it for ``/ready`` and ``/metrics``. Voices live in a
shared directory or object store (content-hashed files), so every replica sees every voice.

``serve run chorus.deploy:app variant=turbo checkpoint=... replicas=2`` or ``serve run
config.yaml`` (an application whose ``import_path`` is ``chorus.deploy:app``) builds the
application with :func:`app`; ``chorus serve --replicas N`` calls :func:`run_local`.

Modules: ``routing`` (the router), ``replica_board`` (the board), ``replica`` (the engine
deployment), ``metrics`` (the front's counters and the merge of the replicas'), ``backend`` (the
remote backend), ``ingress`` (the HTTP front), ``application`` (building and running it).
"""
from __future__ import annotations

from chorus.deploy.application import app, build, run_local
from chorus.deploy.backend import RemoteBackend
from chorus.deploy.ingress import Ingress
from chorus.deploy.metrics import merge_metrics
from chorus.deploy.replica import deployment_name
from chorus.deploy.replica_board import board

__all__ = ["Ingress", "RemoteBackend", "app", "board", "build", "deployment_name", "merge_metrics", "run_local"]

"""A real server for tests: uvicorn on a loopback port, in a thread, over the tiny random models
of tests/pipeline (the real pipeline, engine and vocoder code). Clients are real too (httpx, the
``openai`` SDK)."""
from __future__ import annotations

import dataclasses
import logging
import re
import socket
import threading
import time
from pathlib import Path

import httpx

from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.pipeline import ConversionConfig
from chorus.pipeline.pipeline import Pipeline, PipelineConfig
from chorus.server.config import DegradationConfig, ServerConfig
from chorus.server.main import uvicorn_server, vocoder_config
from chorus.server.registry import ModelRegistry
from chorus.server.service import Loaded, SpeechService
from chorus.voices.objectstore import open_blob_store
from chorus.voices.store import VoiceStore
from tests.pipeline.tiny_pipeline import aligned_models, tiny_models

TOKENS = 12  # speech tokens per chunk in server tests: about half a second of audio


def server_config(voices_dir: Path, **overrides) -> ServerConfig:
    base = dict(variant="turbo", voices_dir=str(voices_dir), max_new_tokens=TOKENS, canary_interval_s=30.0,
                stall_timeout_s=5.0, shutdown_grace_s=5.0, warmup=False, log_format="text",
                degradation=DegradationConfig(enabled=False), quality_sample_rate=0.0)
    base.update(overrides)
    return ServerConfig(**base)


def tiny_loader(config: ServerConfig, *, front_end=None, max_num_seqs: int = 16,
                kv_cache_bytes: int = 64 << 20, max_chars: int = 60, models_of=None):
    """A loader of the tiny models of a model version's config (the real one is
    chorus.server.main.load_models; called without one, ``config``'s), with the config's vocoder
    settings. ``front_end``: the voice front end, or a function of the variant name that returns
    one (several models); ``models_of(variant)`` replaces ``tiny_models`` (e.g. models that can
    convert voices)."""

    def load(version_config: ServerConfig | None = None) -> Loaded:
        model_config = version_config or config
        models = (models_of or tiny_models)(model_config.variant)
        if front_end is not None:
            models = dataclasses.replace(models, front_end=front_end(model_config.variant) if callable(front_end)
                                         else front_end)
            models._builtin = tiny_models(model_config.variant)._builtin
        engine = EngineConfig(variant=model_config.variant, alignment=model_config.timestamp_alignment,
                              cache=CacheConfig(kv_cache_bytes=kv_cache_bytes),
                              scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024,
                                                        max_model_len=1024))
        pipeline = Pipeline(models, PipelineConfig(engine=engine, vocoder=vocoder_config(model_config),
                                                   max_chars=max_chars,
                                                   conversion=ConversionConfig(max_source_s=model_config.max_source_s),
                                                   default_deadline_s=model_config.default_deadline_s,
                                                   default_start_deadline_s=model_config.start_deadline_for("cpu")))
        files = open_blob_store(model_config.voices_dir, model_config.voices_url)
        voices = VoiceStore(files, models.front_end, models.variant,
                            builtin=models.builtin_voice(), cache_size=model_config.voice_cache_size,
                            max_upload_bytes=model_config.max_upload_bytes)
        return Loaded(pipeline.start(), voices)

    return load


def aligned_live_server(voices_dir: Path, **overrides) -> "LiveServer":
    """A live server of the original variant whose tiny T3 has every alignment head, keeping
    alignment rows (``--timestamp-alignment``): timestamps there name the ``alignment`` method."""
    config = server_config(voices_dir, variant="original", timestamp_alignment=True, **overrides)
    return LiveServer(config, tiny_loader(config, models_of=lambda variant: aligned_models()))


class LiveServer:
    """``with LiveServer(config, loader) as server:`` -> ``server.url``, ``server.client`` (httpx),
    ``server.backend`` (the model registry) and ``server.service`` (the first model version's
    service); waits until /ready answers 200 (unless ``wait_ready=False``)."""

    def __init__(self, config: ServerConfig, loader, *, wait_ready: bool = True, api_key: str | None = None,
                 send_buffer_bytes: int | None = None):
        """``send_buffer_bytes``: a fixed kernel send buffer for every connection (the default
        grows to megabytes on loopback, which hides a client that stops reading)."""
        self.backend = ModelRegistry(config, loader)
        self.config = config
        self._wait_ready = wait_ready
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if send_buffer_bytes is not None:  # accepted sockets inherit it (Linux)
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, timeout=60.0, headers=headers)
        self._server = uvicorn_server(self.backend, lifespan="on")  # the limits and drain of `chorus serve`
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="chorus-live-server", daemon=True)

    def __enter__(self) -> "LiveServer":
        self._thread.start()
        deadline = time.monotonic() + 120
        while not self._server.started:
            assert self._thread.is_alive(), "the server thread died"
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        while self._wait_ready:
            answer = self.client.get("/ready")
            if answer.status_code == 200:
                break
            # a failed start is final: say why at once instead of at the deadline
            assert answer.json().get("state") != "failed" and time.monotonic() < deadline, f"not ready: {answer.json()}"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self._server.should_exit = True
        self._thread.join(30)
        self._socket.close()

    def begin_shutdown(self) -> None:
        """What SIGTERM does: stop listening and drain (``__exit__`` then waits for the end)."""
        self._server.should_exit = True

    @property
    def service(self) -> SpeechService:
        """The service of the first model's first version (of the one model, in most tests)."""
        return self.backend.versions()[0].service

    @property
    def loop(self):
        """The server's event loop (``asyncio.run_coroutine_threadsafe(..., server.loop)``)."""
        return self.backend.loop

    @property
    def pipeline(self) -> Pipeline:
        return self.service.pipeline

    def speech(self, **body) -> httpx.Response:
        body.setdefault("model", "chatterbox-turbo")
        return self.client.post("/v1/audio/speech", json=body)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until no request is inside the pipeline and no KV block is in use."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.pipeline.engine_stats()
            if self.pipeline.active_requests == 0 and stats.kv.num_used_blocks == 0 and stats.num_running == 0:
                return
            assert time.monotonic() < deadline, f"still busy: {stats}"
            time.sleep(0.05)


def until(condition, timeout: float = 30.0, what: str = "the condition") -> None:
    """Poll an observable state until ``condition()`` holds (not a guess at how long it takes);
    fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def access_record(caplog, prefix: str = "", request_id: str | None = None) -> logging.LogRecord:
    """The last access-log record whose message starts with ``prefix`` (and, if given, of
    ``request_id``), written by the server once the response has gone out: wait for it. Use
    inside ``caplog.at_level(logging.INFO, logger="chorus.server")``."""

    def found() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith(prefix)
                and (request_id is None or getattr(r, "request_id", None) == request_id)]

    until(found, what=f"the access line {prefix!r}")
    return found()[-1]


def metric(text: str, name: str, labels: str = "") -> float:
    """The sum of the samples of ``name`` in Prometheus text whose labels include ``labels``
    (``'kind="start"'``; a model version's samples also carry ``model`` and ``version``);
    0 when there is none."""
    wanted = set(_LABEL.findall(labels))
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, inner = head.partition("{")
        if sample == name and wanted <= set(_LABEL.findall(inner)):
            total += float(value)
    return total


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class _Hold:
    """Replaces ``owner.<name>`` inside a ``with`` block by a version whose held calls wait until
    ``release`` is set (``entered`` is set when one does), then run the real method; the block's
    end restores the method and releases. Which calls are held: :meth:`_holds`."""

    def __init__(self, owner, name: str):
        self._owner, self._name = owner, name
        self._real = getattr(owner, name)
        self.release = threading.Event()
        self.entered = threading.Event()

    def _holds(self) -> bool:
        return True

    def _call(self, *args):
        if self._holds():
            self.entered.set()
            self.release.wait(60)
        return self._real(*args)

    def __enter__(self):
        setattr(self._owner, self._name, self._call)
        return self

    def __exit__(self, *exc) -> None:
        setattr(self._owner, self._name, self._real)
        self.release.set()


class EnginePause(_Hold):
    """Holds the T3 engine's next step until released (``with EnginePause(server) as pause:``):
    requests admitted meanwhile stay in flight. The real step runs once released. With
    ``after_tokens``, steps run freely until the engine has sampled that many tokens since the
    pause began, and the step after them is held."""

    def __init__(self, server: LiveServer, after_tokens: int = 0):
        super().__init__(server.pipeline.engine, "step")
        self.after_tokens = after_tokens
        self.tokens = 0

    def _holds(self) -> bool:
        return self.tokens >= self.after_tokens

    def _call(self):
        events = super()._call()
        self.tokens += sum(1 for event in events if event.new_token is not None)
        return events


class VocoderPause(_Hold):
    """Holds the vocoder stage's next pass until released (``with VocoderPause(server) as pause:``),
    after the pass's jobs were chosen (so its predicted time is set); the real pass runs once
    released."""

    def __init__(self, server: LiveServer):
        super().__init__(server.pipeline.vocoder, "_run_pass")

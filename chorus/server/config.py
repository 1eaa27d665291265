"""The server's one typed configuration, from defaults < a config file < environment < flags.

Every field has a ``CHORUS_<NAME>`` environment variable and a ``--name`` flag (``chorus serve
--help``); a config file (``--config FILE``, TOML or JSON) holds the same names. Values are
checked in ``__post_init__``: a bad value fails at start-up with the field, the value and the rule.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from chorus.server.model_entries import ModelEntry, parse_entries

if TYPE_CHECKING:
    from chorus.server.text_pieces import Chunking

ENV_PREFIX = "CHORUS_"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class DegradationConfig:
    """When the server sheds quality to keep latency (docs/server.md, "Degradation").

    Pressure is the larger of the admission queue's fill (requests in flight / max_queue) and
    the KV pool's use. Level 1 above ``thresholds[0]``, 2 above ``thresholds[1]``, 3 above
    ``thresholds[2]``; a level is entered after pressure stayed above its threshold for
    ``hold_s`` and left after it stayed ``hysteresis`` below for ``hold_s``.
    Level 1: new requests get ``reduced_flow_steps`` (never more than they asked for).
    Level 2: also classifier-free guidance off for new requests (T3 and S3Gen).
    Level 3: also admission shrinks to ``level3_queue_fraction`` of ``max_queue``.
    """

    enabled: bool = True
    thresholds: tuple[float, float, float] = (0.6, 0.75, 0.9)
    hysteresis: float = 0.1
    hold_s: float = 2.0
    reduced_flow_steps: int = 5
    level3_queue_fraction: float = 0.5

    def __post_init__(self):
        t = tuple(float(x) for x in self.thresholds)
        object.__setattr__(self, "thresholds", t)
        _require(len(t) == 3 and 0 < t[0] <= t[1] <= t[2] <= 1,
                 f"degradation thresholds must be 3 increasing numbers in (0, 1], got {self.thresholds!r}")
        _require(0 <= self.hysteresis < t[0], f"degradation hysteresis must be in [0, {t[0]}), got {self.hysteresis!r}")
        _require(self.hold_s >= 0, f"degradation hold_s must be >= 0, got {self.hold_s!r}")
        _require(self.reduced_flow_steps >= 1, f"reduced_flow_steps must be >= 1, got {self.reduced_flow_steps!r}")
        _require(0 < self.level3_queue_fraction <= 1,
                 f"level3_queue_fraction must be in (0, 1], got {self.level3_queue_fraction!r}")


# The default start deadline (seconds to the first audio byte) by device. On a GPU the first
# audio of an unloaded server comes in well under a second; 10 s leaves room for a full queue.
# On a CPU one request's first audio takes seconds (a random-weight Turbo speaks a 4 s clip in
# 20-40 s on 2 cores), so the bound is looser there.
START_DEADLINE_S = {"cuda": 10.0, "cpu": 60.0}
# admission's real-time bound by device: off on the CPU, which serves full-size models slower than
# real time (the bound would admit one request at a time there)
REALTIME_HEADROOM = {"cuda": 1.25, "cpu": 0.0}


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``chorus serve`` can be told. See docs/server.md for each field."""

    # the model
    variant: str = "turbo"
    checkpoint: str | None = None  # a directory or a hub id; None: the variant's official repo
    t3_weights: str | None = None  # the T3 weights' file name when not the official one
    device: str = "auto"
    dtype: str = "auto"
    voice_models: bool = True  # load the models that build voices from uploads
    language_steps: str = "lenient"  # multilingual language steps: "lenient" or "strict" (docs/text.md)
    dicta_model: str | None = None  # Hebrew: Dicta's ONNX file
    pkuseg_model: str | None = None  # Chinese: a spacy-pkuseg model directory
    replicas: str = "1"  # engine replicas (per model version): a number or "auto" (one per GPU); above 1: Ray Serve
    # several models (docs/models.md); empty: the one of variant and checkpoint, as chatterbox-<variant>
    models: tuple[ModelEntry, ...] = ()
    # the network
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()  # bearer tokens; empty: no authentication
    admin_keys: tuple[str, ...] = ()  # bearer tokens of the admin API; empty: no admin API
    cors_origins: tuple[str, ...] = ()
    grpc_port: int | None = None  # Riva's speech-synthesis API over gRPC (docs/grpc.md); None: off
    grpc_tls_cert: str | None = None  # PEM certificate chain of the gRPC port; None: plaintext
    grpc_tls_key: str | None = None  # its PEM private key
    # voices
    voices_dir: str = "voices"  # the voices; with voices_url, this server's cache of them
    voices_url: str | None = None  # an object store shared by replicas (s3://bucket/prefix, ...)
    voice_cache_size: int = 64
    max_upload_bytes: int = 10 << 20
    max_source_s: float = 60.0  # voice conversion: the longest source clip (docs/voice-conversion.md)
    # limits and admission
    max_queue: int = 256  # requests in flight (queued or running) before 429
    admission: str = "predicted"  # "predicted": also refuse what cannot start in time; "queue": max_queue only
    tokens_per_char: float = 1.7  # admission's prior of speech tokens per input character (then learned)
    max_input_chars: int = 4096  # OpenAI's limit on `input`
    max_new_tokens: int | None = None  # cap on speech tokens per text chunk; None: the variant's
    max_body_bytes: int = 1 << 20  # JSON bodies (uploads have max_upload_bytes)
    max_header_bytes: int = 16 << 10  # the request line and headers together (431; bounds the parser's buffer)
    http_parser: str = "httptools"  # uvicorn's HTTP/1.1 parser: "httptools" (C) or "h11" (pure Python)
    body_timeout_s: float = 60.0  # a request body must arrive in full within this (slow-body attacks)
    start_deadline_s: float | None = None  # to the first audio byte; None: START_DEADLINE_S by device
    default_deadline_s: float | None = None  # total; None: none (a flowing stream is never cut)
    max_deadline_s: float = 300.0
    write_stall_s: float = 30.0  # a client that reads nothing for this long is dropped
    memory_pressure: float = 0.98  # KV pool use above which new requests get 503 while others wait
    retry_after_s: int = 1  # the least Retry-After of 429 and 503
    max_retry_after_s: int = 60
    realtime_headroom: float | None = None  # admit while streams get this x real time; None: by device
    # the voice-agent WebSocket (WS /v1/audio/speech/stream, docs/voice-agents.md)
    ws_max_connections: int = 1024  # WebSocket connections open at once; more are refused (503)
    ws_max_message_bytes: int = 64 << 10  # one client message; larger: close 1009
    ws_max_turns: int = 8  # turns open at once on one connection
    ws_text_buffer_chars: int = 16384  # a turn's text received and not yet sent to synthesis
    ws_idle_timeout_s: float = 300.0  # no message and no open turn (flushed or not) for this long: closed
    ws_chunk_min_chars: int = 20  # the text threshold's defaults (chorus/server/text_pieces.py)
    ws_chunk_max_chars: int = 160
    ws_chunk_max_wait_ms: int = 500
    # engine and pipeline
    max_num_seqs: int = 256
    max_chars: int = 300  # chunk length bound of long texts
    kv_cache_bytes: int | None = None
    kv_cache_dtype: str = "auto"  # "auto" (the model's dtype) or "fp8_e4m3"
    fp8: str = ""  # stages whose GEMMs run in FP8, a comma list: "t3" (EngineConfig.fp8_linears) or "" (none)
    gpu_memory_utilization: float = 0.85
    cuda_graphs: bool = True
    t3_admit_ahead: bool = True  # admit arrivals in T3's step scheduled ahead (SchedulerConfig.admit_ahead)
    t3_mixed_graph_tokens: int = 256  # admitting steps up to this many prompt positions replay graphs (EngineConfig)
    t3_admit_within_graphs: bool = True  # a step that decodes admits what a mixed graph holds (EngineConfig)
    timestamp_alignment: bool = False  # T3 keeps its aligned heads' queries: Llama variants time words by attention
    vocoder_max_pass_seconds: float | None = None  # while streams play, a vocoder pass's predicted time at most
    vocoder_first_window_tokens: int = 20  # speech tokens of a stream's first vocoder window
    vocoder_first_window_prompt_tokens: int | None = None  # voice-prompt tokens of a stream's first vocoder pass
    vocoder_follower_first_window_tokens: int | None = 100  # first vocoder window of a turn's later piece
    vocoder_graph_cover_work: float | None = 4.0  # a shape without a CUDA graph replays a larger one up to this padded work
    vocoder_encoder_attention_ops: str = "torch"  # the flow encoder's attention kernel: torch, auto or triton
    # operations
    warmup: bool = True
    canary_interval_s: float = 60.0  # canaries re-run this often (a failed one fails /ready; a late one not)
    canary_timeout_s: float = 60.0
    canary_action: str = "warn"  # a canary that does not match its fingerprint: "warn" or "unready"
    quality_sample_rate: float = 0.02  # share of requests DNSMOS scores (needs chorus-tts[quality]); 0: none
    switch_interval_ms: float = 1.0  # the GIL's switch interval (sys.setswitchinterval) set at start-up; Python's is 5
    gc_freeze: bool = True  # after start-up, hide the heap from the cyclic GC (gc.freeze): short full collections
    stall_timeout_s: float = 15.0  # a step this long, or work and no progress this long: not ready
    shutdown_grace_s: float = 30.0  # on SIGTERM, streams in flight get this long to finish
    log_format: str = "json"  # "json" or "text"
    log_level: str = "info"
    playground: bool = True  # the browser playground at GET / (off: GET / is 404)
    degradation: DegradationConfig = field(default_factory=DegradationConfig)

    def __post_init__(self):
        from chorus.models.variants import get_variant

        object.__setattr__(self, "variant", get_variant(self.variant).name)
        for name in ("max_queue", "max_input_chars", "max_body_bytes", "max_upload_bytes", "voice_cache_size",
                     "max_num_seqs", "max_chars", "retry_after_s", "max_retry_after_s", "max_header_bytes",
                     "ws_max_connections", "ws_max_message_bytes", "ws_max_turns", "ws_text_buffer_chars",
                     "vocoder_first_window_tokens"):
            value = getattr(self, name)
            _require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
                     f"{name} must be a positive integer, got {value!r}")
        _require(self.max_new_tokens is None or (isinstance(self.max_new_tokens, int) and self.max_new_tokens > 0),
                 f"max_new_tokens must be a positive integer or unset, got {self.max_new_tokens!r}")
        for name in ("kv_cache_bytes", "vocoder_first_window_prompt_tokens", "vocoder_follower_first_window_tokens"):
            value = getattr(self, name)
            _require(value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0),
                     f"{name} must be a positive integer or unset, got {value!r}")
        from chorus.engine.config import MIN_MIXED_GRAPH_TOKENS, valid_mixed_graph_tokens

        tokens = self.t3_mixed_graph_tokens
        _require(valid_mixed_graph_tokens(tokens),
                 f"t3_mixed_graph_tokens must be 0 (off) or an integer >= {MIN_MIXED_GRAPH_TOKENS}, got {tokens!r}")
        from chorus.vocoder.config import VocoderConfig

        _require(self.vocoder_first_window_tokens <= VocoderConfig.max_window_tokens,
                 f"vocoder_first_window_tokens must be at most {VocoderConfig.max_window_tokens} (the vocoder's "
                 f"largest window), got {self.vocoder_first_window_tokens}")
        from chorus.engine.config import KV_CACHE_DTYPES
        from chorus.triton_backend import BACKENDS

        _require(self.vocoder_encoder_attention_ops in BACKENDS,
                 f"vocoder_encoder_attention_ops must be one of {', '.join(BACKENDS)}, "
                 f"got {self.vocoder_encoder_attention_ops!r}")
        _require(self.kv_cache_dtype in KV_CACHE_DTYPES,
                 f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        from chorus.models.fp8 import parse_fp8_stages

        parse_fp8_stages(self.fp8)  # raises, naming the stage
        _require(self.canary_action in ("unready", "warn"),
                 f"canary_action must be unready or warn, got {self.canary_action!r}")
        _require(isinstance(self.quality_sample_rate, (int, float)) and 0 <= self.quality_sample_rate <= 1,
                 f"quality_sample_rate must be a number in [0, 1], got {self.quality_sample_rate!r}")
        _require(0 < self.port < 65536, f"port must be in 1..65535, got {self.port!r}")
        for name in ("max_deadline_s", "canary_interval_s", "canary_timeout_s", "stall_timeout_s", "write_stall_s",
                     "shutdown_grace_s", "tokens_per_char", "body_timeout_s", "ws_idle_timeout_s",
                     "switch_interval_ms", "max_source_s"):
            value = getattr(self, name)
            _require(isinstance(value, (int, float)) and value > 0, f"{name} must be a positive number, got {value!r}")
        _require(self.realtime_headroom is None or (isinstance(self.realtime_headroom, (int, float))
                                                    and self.realtime_headroom >= 0),
                 f"realtime_headroom must be a number >= 0 (0: off) or unset, got {self.realtime_headroom!r}")
        for name in ("start_deadline_s", "default_deadline_s", "vocoder_max_pass_seconds"):
            value = getattr(self, name)
            _require(value is None or (isinstance(value, (int, float)) and value > 0),
                     f"{name} must be a positive number or unset, got {value!r}")
        _require(self.vocoder_graph_cover_work is None or (isinstance(self.vocoder_graph_cover_work, (int, float))
                                                           and self.vocoder_graph_cover_work >= 1),
                 f"vocoder_graph_cover_work must be a number >= 1 or unset, got {self.vocoder_graph_cover_work!r}")
        _require(self.default_deadline_s is None or self.default_deadline_s <= self.max_deadline_s,
                 f"default_deadline_s ({self.default_deadline_s}) must be <= max_deadline_s ({self.max_deadline_s})")
        _require(self.retry_after_s <= self.max_retry_after_s,
                 f"retry_after_s ({self.retry_after_s}) must be <= max_retry_after_s ({self.max_retry_after_s})")
        self.ws_chunking()  # raises on bad sizes
        from chorus.server.admission import POLICIES

        from chorus.server.http_parser import PARSERS

        _require(self.http_parser in PARSERS,
                 f"http_parser must be one of {', '.join(PARSERS)}, got {self.http_parser!r}")
        _require(self.admission in POLICIES, f"admission must be one of {', '.join(POLICIES)}, got {self.admission!r}")
        _require(0 < self.memory_pressure <= 1, f"memory_pressure must be in (0, 1], got {self.memory_pressure!r}")
        _require(0 < self.gpu_memory_utilization <= 1,
                 f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        replicas = str(self.replicas).strip().lower()
        object.__setattr__(self, "replicas", replicas)
        _require(replicas == "auto" or (replicas.isdigit() and int(replicas) > 0),
                 f"replicas must be a positive integer or 'auto', got {self.replicas!r}")
        language_steps = str(self.language_steps).strip().lower()
        object.__setattr__(self, "language_steps", language_steps)
        _require(language_steps in ("lenient", "strict"),
                 f"language_steps must be 'lenient' or 'strict', got {self.language_steps!r}")
        _require(self.log_format in ("json", "text"), f"log_format must be 'json' or 'text', got {self.log_format!r}")
        _require(self.log_level.lower() in ("debug", "info", "warning", "error"),
                 f"log_level must be debug, info, warning or error, got {self.log_level!r}")
        _require(all(isinstance(k, str) and len(k) >= 8 for k in self.api_keys),
                 "api_keys: every API key must be a string of at least 8 characters")
        _require(all(isinstance(k, str) and len(k) >= 16 for k in self.admin_keys),
                 "admin_keys: every admin key must be a string of at least 16 characters")
        _require(not set(self.admin_keys) & set(self.api_keys),
                 "admin_keys: an admin key must not also be an API key (clients would hold admin rights)")
        object.__setattr__(self, "models", parse_entries(self.models))
        if self.voices_url is not None:
            from chorus.voices.objectstore import check_voices_url

            url = str(self.voices_url).strip() or None  # an empty CHORUS_VOICES_URL means none
            object.__setattr__(self, "voices_url", url)
            if url is not None:
                check_voices_url(url)
        self._check_grpc()

    def _check_grpc(self) -> None:
        if self.grpc_port is None:
            _require(self.grpc_tls_cert is None and self.grpc_tls_key is None,
                     "grpc_tls_cert and grpc_tls_key need grpc_port (the gRPC port they secure)")
            return
        _require(isinstance(self.grpc_port, int) and 0 < self.grpc_port < 65536 and self.grpc_port != self.port,
                 f"grpc_port must be in 1..65535 and differ from port ({self.port}), got {self.grpc_port!r}")
        _require((self.grpc_tls_cert is None) == (self.grpc_tls_key is None),
                 "grpc_tls_cert and grpc_tls_key go together: give both (TLS) or neither (plaintext)")
        _require(str(self.replicas) == "1",
                 "grpc_port needs replicas 1: run one gRPC server per engine process behind an L4/L7 "
                 "balancer (docs/grpc.md, \"Scale-out\")")

    def start_deadline_for(self, device_type: str) -> float:
        """The start deadline on a device of ``device_type`` ("cuda", "cpu", ...): the one
        configured, else ``START_DEADLINE_S``'s (the CPU is tens of times slower)."""
        if self.start_deadline_s is not None:
            return float(self.start_deadline_s)
        return START_DEADLINE_S.get(device_type, START_DEADLINE_S["cpu"])

    def realtime_headroom_for(self, device_type: str) -> float:
        """Admission's real-time headroom on a device of ``device_type``: the one configured, else
        ``REALTIME_HEADROOM``'s (off where the device is slower than real time)."""
        if self.realtime_headroom is not None:
            return float(self.realtime_headroom)
        return REALTIME_HEADROOM.get(device_type, REALTIME_HEADROOM["cpu"])

    def ws_chunking(self) -> "Chunking":
        """The WebSocket's default text threshold (a connection's ``chunking`` overrides it).
        A piece must pass the input check of any speech request, so the sizes are bounded by
        ``max_input_chars`` (a server with a small one cuts smaller pieces, not refuses to start)."""
        from chorus.server.text_pieces import Chunking

        _require(self.ws_chunk_min_chars <= self.ws_chunk_max_chars,
                 f"ws_chunk_min_chars ({self.ws_chunk_min_chars}) must be <= ws_chunk_max_chars "
                 f"({self.ws_chunk_max_chars})")
        max_chars = min(self.ws_chunk_max_chars, self.max_input_chars)
        try:
            return Chunking(min(self.ws_chunk_min_chars, max_chars), max_chars, self.ws_chunk_max_wait_ms)
        except ValueError as exc:
            raise ValueError(str(exc).replace("chunking.", "ws_chunk_")) from None

    def entries(self) -> tuple[ModelEntry, ...]:
        """The models served: ``models``, or the one of ``variant`` and ``checkpoint`` under the
        id ``chatterbox-<variant>``."""
        return self.models or (ModelEntry(id=f"chatterbox-{self.variant}", variant=self.variant,
                                          checkpoint=self.checkpoint, t3_weights=self.t3_weights),)

    def for_entry(self, entry: ModelEntry) -> "ServerConfig":
        """The settings of one model version: this config with the entry's variant, checkpoint
        and limits (a one-model config whose ``models`` is just the entry)."""
        return dataclasses.replace(
            self, variant=entry.variant, checkpoint=entry.checkpoint, t3_weights=entry.t3_weights, models=(entry,),
            kv_cache_bytes=entry.kv_cache_bytes if entry.kv_cache_bytes is not None else self.kv_cache_bytes,
            max_num_seqs=entry.max_num_seqs if entry.max_num_seqs is not None else self.max_num_seqs)

    @property
    def model_id(self) -> str:
        """The id clients pass as ``model`` for the first (in a one-model config, the only) model."""
        return self.entries()[0].id


# -- building a config -------------------------------------------------------------------------

_TUPLE_FIELDS = {"api_keys", "admin_keys", "cors_origins"}


def _convert(name: str, kind: Any, raw: Any) -> Any:
    """A value from a file, env var or flag, as the field's type."""
    if raw is None:
        return None
    text = isinstance(raw, str)
    if name == "models":
        return parse_entries(raw)
    if name in _TUPLE_FIELDS:
        items = raw.split(",") if text else list(raw)
        return tuple(i.strip() for i in items if str(i).strip())
    kind = str(kind)
    if "bool" in kind:
        if not text:
            _require(isinstance(raw, bool), f"{name} must be true or false, got {raw!r}")
            return raw
        lowered = raw.strip().lower()
        _require(lowered in ("1", "0", "true", "false", "yes", "no", "on", "off"),
                 f"{name} must be true or false, got {raw!r}")
        return lowered in ("1", "true", "yes", "on")
    if text and "None" in kind and raw.strip().lower() in ("", "none"):
        return None  # an optional number given as "none" (env var or flag)
    if "int" in kind and "float" not in kind:
        # a file's value must already be an integer: true or 80.5 must not become 1 or 80
        _require(text or (isinstance(raw, int) and not isinstance(raw, bool)),
                 f"{name} must be an integer, got {raw!r}")
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if "float" in kind:
        _require(text or (isinstance(raw, (int, float)) and not isinstance(raw, bool)),
                 f"{name} must be a number, got {raw!r}")
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number, got {raw!r}") from None
    return str(raw) if text or not isinstance(raw, (list, dict)) else raw


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The settings of a TOML (``.toml``) or JSON file: top-level keys are field names, a
    ``[degradation]`` table holds the degradation settings."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    if path.suffix.lower() == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise ValueError(f"config file {path}: TOML needs Python 3.11+; use a .json file") from None

        with path.open("rb") as f:
            return tomllib.load(f)
    if path.suffix.lower() == ".json":
        return json.loads(path.read_text())
    raise ValueError(f"config file {path}: use a .toml or .json file")


def field_names() -> list[str]:
    return [f.name for f in fields(ServerConfig) if f.name != "degradation"]


def build_config(file_values: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                 flags: Mapping[str, Any] | None = None) -> ServerConfig:
    """Merge the sources (later wins: file, then ``CHORUS_*`` env vars, then flags whose value
    is not None) into a checked :class:`ServerConfig`. Unknown keys in the file are an error;
    ``CHORUS_DEGRADATION_<FIELD>`` env vars set degradation fields."""
    types = {f.name: f.type for f in fields(ServerConfig)}
    deg_types = {f.name: f.type for f in fields(DegradationConfig)}
    values: dict[str, Any] = {}
    degradation: dict[str, Any] = {}
    for key, raw in (file_values or {}).items():
        if key == "degradation":
            _require(isinstance(raw, Mapping), "the config file's 'degradation' must be a table")
            for k, v in raw.items():
                _require(k in deg_types, f"unknown degradation setting {k!r}; known: {', '.join(deg_types)}")
                degradation[k] = v
            continue
        _require(key in types, f"unknown setting {key!r} in the config file; known: {', '.join(field_names())}")
        values[key] = _convert(key, types[key], raw)
    for key, raw in (env if env is not None else os.environ).items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name.startswith("degradation_") and name[len("degradation_"):] in deg_types:
            degradation[name[len("degradation_"):]] = raw
        elif name in types and name != "degradation":
            values[name] = _convert(name, types[name], raw)
    for key, raw in (flags or {}).items():
        if raw is not None:
            _require(key in types, f"unknown setting {key!r}")
            values[key] = _convert(key, types[key], raw)
    if degradation:
        converted = {}
        for k, v in degradation.items():
            if k == "thresholds":
                items = v.split(",") if isinstance(v, str) else v
                _require(isinstance(items, (list, tuple)), f"degradation thresholds must be 3 numbers, got {v!r}")
                converted[k] = tuple(_convert("degradation thresholds", "float", x) for x in items)
            else:
                converted[k] = _convert(k, deg_types[k], v)
        values["degradation"] = DegradationConfig(**converted)
    return ServerConfig(**values)


def describe(config: ServerConfig) -> dict[str, Any]:
    """The config as plain data, API keys hidden (for the start-up log)."""
    data = dataclasses.asdict(config)
    data["api_keys"] = f"{len(config.api_keys)} key(s)"
    data["admin_keys"] = f"{len(config.admin_keys)} key(s)"
    if config.voices_url is not None:
        data["voices_url"] = _without_userinfo(config.voices_url)
    return data


def _without_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` hidden."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    return scheme + sep + authority + slash + path

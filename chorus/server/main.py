"""``chorus serve``: load a checkpoint behind the HTTP API and run uvicorn."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

from chorus.server.config import ServerConfig, describe
from chorus.server.logs import setup_logging
from chorus.server.registry import ModelRegistry
from chorus.server.service import Loaded

logger = logging.getLogger("chorus.server")


def language_step_config(config: ServerConfig):
    """The text front end's language-step settings of a server config (strict refuses to load)."""
    from chorus.text import LanguageStepConfig

    return LanguageStepConfig(strict=config.language_steps == "strict", dicta_model=config.dicta_model,
                              pkuseg_model=config.pkuseg_model)


def memory_utilization(config: ServerConfig, device) -> float:
    """The ``gpu_memory_utilization`` of the engine of ``config``'s (one) model version on
    ``device``: what the process holds there already (the other models, or the version this one
    replaces) plus this version's share of the process's budget. The engine sizes its KV pool as
    that fraction of the device less everything allocated (docs/models.md, "Memory"). Raises
    ``ValueError`` when the device has too little free memory for the share."""
    import torch

    share = config.entries()[0].memory_share
    share = 1.0 if share is None else share
    if device.type != "cuda":
        return config.gpu_memory_utilization
    free, total = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_allocated(device)
    wanted = share * config.gpu_memory_utilization * total
    if held and wanted > free:  # (the first model is sized by the engine against what is free, as before)
        raise ValueError(f"model {config.model_id} version {config.entries()[0].version}: its memory share "
                         f"({share:g} of gpu_memory_utilization {config.gpu_memory_utilization:g}) is "
                         f"{wanted / 2**30:.1f} GiB but {device} has {free / 2**30:.1f} GiB free; lower the "
                         "share, or unload another model first")
    return min(1.0, held / total + share * config.gpu_memory_utilization)


def vocoder_config(config: ServerConfig):
    """The vocoder stage's settings of one model version (``config.for_entry``): its batch limit,
    the server's pass-time limit while streams play, first window, first-window prompt cap and
    followers' first window, and CUDA graphs as the server's ``cuda_graphs`` says (T3's and the vocoder's alike),
    shapes without a graph of their own covered as ``vocoder_graph_cover_work`` says, the encoder's
    attention kernel as ``vocoder_encoder_attention_ops`` says."""
    from chorus.vocoder.config import VocoderConfig

    entry = config.entries()[0]
    limits = {} if entry.vocoder_max_batch_items is None else {"max_batch_items": entry.vocoder_max_batch_items}
    return VocoderConfig(cuda_graphs=config.cuda_graphs, max_pass_seconds=config.vocoder_max_pass_seconds,
                         first_window_tokens=config.vocoder_first_window_tokens,
                         first_window_prompt_tokens=config.vocoder_first_window_prompt_tokens,
                         follower_first_window_tokens=config.vocoder_follower_first_window_tokens,
                         graph_cover_work=config.vocoder_graph_cover_work,
                         encoder_attention_ops=config.vocoder_encoder_attention_ops, **limits)


def engine_config(config: ServerConfig, gpu_memory_utilization: float):
    """The T3 engine's settings of one model version (``config.for_entry``)."""
    from chorus.engine.config import EngineConfig
    from chorus.models.fp8 import parse_fp8_stages

    return EngineConfig.from_flat(variant=config.variant, max_num_seqs=config.max_num_seqs,
                                  kv_cache_bytes=config.kv_cache_bytes, kv_cache_dtype=config.kv_cache_dtype,
                                  gpu_memory_utilization=gpu_memory_utilization, admit_ahead=config.t3_admit_ahead,
                                  mixed_graph_tokens=config.t3_mixed_graph_tokens,
                                  admit_within_graphs=config.t3_admit_within_graphs,
                                  alignment=config.timestamp_alignment,
                                  fp8_linears="t3" in parse_fp8_stages(config.fp8))


def load_models(config: ServerConfig) -> Loaded:
    """The real loader of one model version (``config.for_entry``): checkpoint -> models ->
    running pipeline, plus its voice store."""
    from chorus.models.loading import parse_device
    from chorus.pipeline import ConversionConfig, Pipeline, PipelineConfig, SpeechModels
    from chorus.voices.objectstore import open_blob_store
    from chorus.voices.store import VoiceStore

    utilization = memory_utilization(config, parse_device(config.device))
    models = SpeechModels.load(config.variant, config.checkpoint, t3_weights=config.t3_weights,
                               dtype=config.dtype, device=config.device,
                               voice_models=config.voice_models, language_steps=language_step_config(config))
    engine = engine_config(config, utilization)
    pipeline = Pipeline(models, PipelineConfig(engine=engine, vocoder=vocoder_config(config), max_chars=config.max_chars,
                                               conversion=ConversionConfig(max_source_s=config.max_source_s),
                                               default_deadline_s=config.default_deadline_s,
                                               default_start_deadline_s=config.start_deadline_for(
                                                   models.device.type),
                                               cuda_graphs=config.cuda_graphs, warmup=config.warmup))
    builtin = models.builtin_voice() if models.checkpoint.has_builtin_voice() else None
    files = open_blob_store(config.voices_dir, config.voices_url)
    voices = VoiceStore(files, models.front_end, models.variant, builtin=builtin,
                        cache_size=config.voice_cache_size, max_upload_bytes=config.max_upload_bytes)
    return Loaded(pipeline.start(), voices)


def effective_config(config: ServerConfig) -> ServerConfig:
    """Settings that depend on the checkpoint: random weights cap speech at 100 tokens per chunk
    unless a cap was given (such models rarely stop by themselves). With several models the cap
    applies when any checkpoint has random weights."""
    from chorus.models.random_checkpoint import is_random_checkpoint, random_weights_token_cap

    local = [e.checkpoint for e in config.entries() if e.checkpoint is not None and Path(e.checkpoint).is_dir()]
    if not local:
        return config
    cap, note = random_weights_token_cap(any(is_random_checkpoint(c) for c in local), config.max_new_tokens, None)
    if note is not None:
        logger.warning(note)
    return dataclasses.replace(config, max_new_tokens=cap)


# uvicorn's own grace, past the service's: a backstop that cancels what the drain did not end
UVICORN_GRACE_MARGIN_S = 5.0
WS_MAX_SIZE_FACTOR = 4


def uvicorn_options(config: ServerConfig) -> dict:
    """uvicorn's settings that are part of the server's limits (tests run uvicorn with these too).
    HTTP is parsed by ``config.http_parser``: httptools with the server's bound on the request
    line and headers (``http_parser.py``), or h11 given the same bound. WebSocket messages over
    ``WS_MAX_SIZE_FACTOR`` times the server's own limit are cut by uvicorn before the server
    reads them (the server answers the smaller ones over its limit itself); messages are not
    compressed (audio barely compresses and deflate would run on the event loop)."""
    from chorus.server.http_parser import bounded_httptools

    http = bounded_httptools(config.max_header_bytes) if config.http_parser == "httptools" else "h11"
    return dict(http=http, h11_max_incomplete_event_size=config.max_header_bytes,
                ws_max_size=WS_MAX_SIZE_FACTOR * config.ws_max_message_bytes, ws_per_message_deflate=False)


def uvicorn_server(service: ModelRegistry, **options):
    """A ``uvicorn.Server`` for ``service`` whose shutdown drains it: on SIGTERM/SIGINT the
    listener closes and, at once, the service starts draining (``/ready`` 503, new requests 503
    ``shutting_down``, streams in flight get ``shutdown_grace_s`` to finish, then are ended with
    one log line each); uvicorn waits for the connections meanwhile. ``options``: uvicorn.Config's
    (the server's limits, :func:`uvicorn_options`, are added)."""
    import uvicorn

    from chorus.server.app import create_app

    grace = service.config.shutdown_grace_s
    app = create_app(service)

    class _DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            draining = asyncio.create_task(service.drain(grace))
            try:
                if app.state.agents is not None and app.state.agents.connections:
                    # uvicorn closes WebSockets at once (1012): first stop listening and let the
                    # voice-agent connections finish their turns and close with 1001
                    for server in self.servers:
                        server.close()
                    for sock in sockets or []:
                        sock.close()
                    await app.state.agents.drain(grace)
                await super().shutdown(sockets)
            finally:
                if not draining.done():
                    draining.cancel()

    config = uvicorn.Config(app, log_config=None,
                            timeout_graceful_shutdown=grace + UVICORN_GRACE_MARGIN_S,
                            **{**uvicorn_options(service.config), **options})
    return _DrainingServer(config)


def serve(config: ServerConfig) -> None:
    setup_logging(config.log_format, config.log_level)
    config = effective_config(config)
    logger.info("starting", extra={"config": describe(config)})
    service = ModelRegistry(config, load_models)
    uvicorn_server(service, host=config.host, port=config.port, log_level=config.log_level.lower()).run()

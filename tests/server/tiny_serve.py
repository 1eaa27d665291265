"""``python -m tests.server.tiny_serve VOICES_DIR PORT``: the real server (uvicorn, the HTTP app,
the service, the pipeline and the on-disk voice store) in its own process, over the tiny random
models and the tiny voice front end, so tests can kill it (``kill -9``) and start it again in
seconds. ``chorus serve`` itself cannot load these models (they are not a checkpoint's sizes);
everything below the loader is the same code."""
from __future__ import annotations

import sys

import uvicorn

from chorus.server.app import create_app
from chorus.server.logs import setup_logging
from chorus.server.registry import ModelRegistry
from tests.engine.tiny_models import tiny
from tests.server.live import server_config, tiny_loader
from tests.voices.front_ends import tiny_front_end


def main(voices_dir: str, port: str) -> None:
    config = server_config(voices_dir, port=int(port), log_format="json")
    setup_logging(config.log_format, config.log_level)
    service = ModelRegistry(config, tiny_loader(config, front_end=tiny_front_end(tiny("turbo")[0])))
    uvicorn.run(create_app(service), host="127.0.0.1", port=config.port, log_config=None, log_level="info")


if __name__ == "__main__":
    main(*sys.argv[1:])

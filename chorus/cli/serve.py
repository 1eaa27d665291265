"""``chorus serve``: the voice server. Its options are the fields of ServerConfig, one flag each."""
from __future__ import annotations

import argparse
from dataclasses import MISSING as dataclasses_MISSING
from pathlib import Path

from chorus.cli.options import CliError, add_command


def add_parser(sub) -> None:
    from dataclasses import fields

    from chorus.server.config import ENV_PREFIX, ServerConfig
    from chorus.server.config_help import FIELD_HELP, SHOWN_DEFAULTS

    p = add_command(sub, "serve", help="run the voice server (OpenAI-compatible HTTP API)",
                    description="Load a checkpoint and serve it over HTTP: POST /v1/audio/speech (OpenAI-"
                                "compatible, streaming), /v1/voices, /v1/models, /health, /ready, /metrics. "
                                "Every option can also come from a CHORUS_<OPTION> environment variable "
                                "(e.g. CHORUS_MAX_QUEUE=64) or a --config file; flags win over the "
                                "environment, which wins over the file. See docs/server.md.")
    p.add_argument("--config", default=None, metavar="FILE", help="a .toml or .json file of settings")
    defaults = ServerConfig.__dataclass_fields__
    for f in fields(ServerConfig):
        if f.name == "degradation":
            continue
        flag = "--" + f.name.replace("_", "-")
        default = defaults[f.name].default if f.default is not dataclasses_MISSING else None
        shown = SHOWN_DEFAULTS.get(f.name, "none" if default in (None, ()) else default)
        env = f"env {ENV_PREFIX}{f.name.upper()}"
        described = FIELD_HELP[f.name]
        if "(default:" in described and described.endswith(")"):  # the help says the default in words
            text = f"{described[:-1]}; {env})"
        else:
            text = f"{described} (default: {shown}; {env})"
        kind = str(f.type)
        if kind == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            p.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(), help=text)
    p.set_defaults(handler=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    from chorus.server.config import build_config, field_names, read_config_file
    from chorus.server.main import serve

    file_values = read_config_file(args.config) if args.config else None
    flags = {name: getattr(args, name) for name in field_names()}
    config = build_config(file_values, flags=flags)
    if config.checkpoint is not None and not Path(config.checkpoint).exists() and "/" not in config.checkpoint:
        raise CliError(f"--checkpoint {config.checkpoint!r} is neither a directory nor a hub id (owner/name)")
    if config.grpc_port is not None:
        from chorus.server.grpc import require_grpc

        try:
            require_grpc()
        except RuntimeError as exc:
            raise CliError(f"--grpc-port: {exc}") from None
    if config.replicas != "1":
        try:
            from chorus.deploy import run_local
        except ImportError as exc:
            raise CliError(f"--replicas {config.replicas} needs Ray Serve: pip install 'chorus-tts[ray]' ({exc})")
        run_local(config)
        return 0
    serve(config)
    return 0

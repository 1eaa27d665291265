"""``chorus bench online|swap``: a running ``chorus serve`` under load, over HTTP or the
voice-agent WebSocket."""
from __future__ import annotations

import argparse

from chorus.cli.options import CliError, add_bench_out, add_command


def add_parsers(bench_sub) -> None:
    _add_online_bench_parser(bench_sub)
    _add_swap_bench_parser(bench_sub)


def _add_online_bench_parser(bench_sub) -> None:
    from chorus.bench.online_bench import DEFAULT_REQUESTS_PER_CLIENT, RESPONSE_FORMATS
    from chorus.bench.ws_bench import FORMATS as AGENT_FORMATS, SPACINGS, AgentBenchConfig as Agent

    p = add_command(
        bench_sub, "online", help="load test of a running server (chorus serve): concurrent streaming clients per "
                       "level; time to first audio, end-to-end time, real-time factor, rejections, server metrics",
        description="Load-test a running `chorus serve` over HTTP. For each concurrency level N, N clients "
                    "send POST /v1/audio/speech back to back (one connection each) and read every response "
                    "as a stream, until the level's requests are spent or its --duration-s is up. 429, 503 "
                    "and 504 answers (admission control, memory pressure, deadlines) are counted, not "
                    "errors. Prints a JSON report (docs/benchmarks.md, \"Online load test\"); a line per level "
                    "goes to stderr. --protocol grpc sends the same load to the Riva gRPC door instead; "
                    "--agent drives the voice-agent WebSocket (\"Voice-agent latency\").")
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000 (its "
                                                "/metrics and /v1/models are read over HTTP with any --protocol)")
    p.add_argument("--protocol", default="http", choices=("http", "grpc"),
                   help="how requests are sent: http (POST /v1/audio/speech) or grpc (Riva's SynthesizeOnline "
                        "at --grpc-target, LINEAR_PCM 24 kHz; docs/grpc.md) (default: http)")
    p.add_argument("--grpc-target", default=None, metavar="HOST:PORT",
                   help="the server's gRPC address (its --grpc-port), with --protocol grpc")
    p.add_argument("--api-key", default=None, help="bearer token, when the server has --api-keys (default: none)")
    p.add_argument("--model", default=None, help="model id to request (default: the first id of GET /v1/models)")
    p.add_argument("--voice", default="default", help="voice id (default: default, the model's built-in voice)")
    p.add_argument("--concurrency", default="1,16,64,256", help="concurrent clients per level (comma-separated; "
                                                                 "default 1,16,64,256)")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--requests-per-level", type=int, default=None, metavar="N",
                        help=f"requests per level, shared by its clients (default: {DEFAULT_REQUESTS_PER_CLIENT} "
                             f"per client)")
    amount.add_argument("--duration-s", type=float, default=None, metavar="SECONDS",
                        help="run each level this long instead; requests in flight at the end finish and count")
    p.add_argument("--text", default=None, help="text of every request (default: a 26-word sentence, the one "
                                                 "`chorus bench stream` speaks); with --agent, every turn's reply "
                                                 f"(default: a {len(Agent.text.split())}-word reply of three "
                                                 "sentences)")
    p.add_argument("--response-format", default="pcm", metavar="FORMAT",
                   help=f"{', '.join(RESPONSE_FORMATS)}; with --agent {', '.join(AGENT_FORMATS)}. pcm (the default), "
                        "wav and with --agent the pcm_* and mulaw_8000 formats are measured in audio seconds; other "
                        "formats in bytes only (no audio seconds, real-time factor, stalls or throughput)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="speech tokens per text chunk, sent with each request (with --agent: per piece, in each "
                        "connection's config; default: the server's; useful against random-weight servers)")
    p.add_argument("--warmup", type=int, default=1, help="requests sent one at a time before the first level, "
                                                          "not counted (with --agent: turns on one connection; "
                                                          "default 1)")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="seconds a request may take, from sending it to the end of its audio (with --agent: a "
                        "turn, from its first delta to its end; default 300)")
    p.add_argument("--ramp-s", type=float, default=None, metavar="SECONDS",
                   help="a level's clients send their first requests spread evenly over this long instead of all "
                        "at once (default 0: a level starts with a burst of N requests; with --agent: connection "
                        "i of N starts its first turn i/N of it later, default 0: all within one LLM token "
                        "interval)")
    p.add_argument("--honor-retry-after", action="store_true",
                   help="after a 429 or 503, a client waits the answer's Retry-After before its next request "
                        "(default: it sends the next one at once)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--arrival-rate", type=float, default=None, metavar="PER_S",
                      help="overload mode: open-loop Poisson arrivals at this many requests per second instead of "
                           "the closed-loop levels; reports goodput, rejections and their latency, deadline misses "
                           "after admission, KV blocks and memory over time")
    rate.add_argument("--overload-multiple", type=float, default=None, metavar="X",
                      help="overload mode at X times the capacity the closed-loop levels measured (completed "
                           "requests per second of the best level), run after them")
    p.add_argument("--overload-requests", type=int, default=200, metavar="N",
                   help="overload mode: requests to send at most (default 200)")
    p.add_argument("--overload-duration-s", type=float, default=60.0, metavar="SECONDS",
                   help="overload mode: stop sending after this long (default 60); requests in flight finish")
    p.add_argument("--arrival-seed", type=int, default=0, help="overload mode: seed of the arrival times")
    p.add_argument("--client-processes", "--overload-client-processes", dest="client_processes", type=int,
                   default=1, metavar="N",
                   help="send the requests from N processes (a level's clients split between them, the overload "
                        "mode's arrival i from process i mod N), so one busy client process's own lag does not add "
                        "to the latencies it measures (default 1; not with --agent). The overload report's "
                        "send_lag_s says whether the senders kept to their schedule")
    agent = p.add_argument_group(
        "voice-agent mode", "--agent: each level opens N WebSocket connections (WS /v1/audio/speech/stream), each an "
        "agent streaming --text as LLM token deltas turn after turn (docs/benchmarks.md, \"Voice-agent latency\")")
    agent.add_argument("--agent", action="store_true",
                       help="drive the voice-agent WebSocket instead of POST /v1/audio/speech; reports first text "
                            "delta -> first audio, flush -> last audio, stalls and barge-in latency per level")
    agent.add_argument("--turns", type=int, default=None, metavar="N",
                       help=f"turns per connection, one after the other (default {Agent.turns})")
    agent.add_argument("--llm-tokens-per-s", type=float, default=None, metavar="RATE",
                       help=f"the agent's LLM rate: text deltas per second (default {Agent.llm_tokens_per_s:g})")
    agent.add_argument("--token-spacing", default=None, choices=SPACINGS,
                       help=f"fixed: deltas 1/RATE apart; poisson: exponential gaps of mean 1/RATE "
                            f"(default {Agent.token_spacing})")
    agent.add_argument("--cancel-fraction", type=float, default=None, metavar="F",
                       help=f"barge in on this fraction of the turns: cancel at the turn's first audio "
                            f"(default {Agent.cancel_fraction:g})")
    agent.add_argument("--turn-gap-s", type=float, default=None, metavar="SECONDS",
                       help=f"pause between a turn's end and the next turn (default {Agent.turn_gap_s:g})")
    agent.add_argument("--turn-gap-max-s", type=float, default=None, metavar="SECONDS",
                       help="draw each pause uniformly between --turn-gap-s and this (seeded by --agent-seed), "
                            "as a user's answers differ in length, so listening agents drift out of step "
                            "(default: every pause --turn-gap-s)")
    agent.add_argument("--listen", action="store_const", const=True, default=None,
                       help="start a connection's next turn only once its last turn's audio has played at 1x "
                            "from its first frame (then --turn-gap-s), as an agent waits for its user to hear "
                            "the reply; a barged-in turn stops playing at its cancel (default: at the turn's end)")
    agent.add_argument("--agent-seed", type=int, default=None,
                       help=f"seed of the token spacing, the connections' phases and the cancelled turns "
                            f"(default {Agent.seed})")
    agent.add_argument("--chunking", default=None, metavar="min_chars=N,max_chars=N,max_wait_ms=N",
                       help="the connection's text threshold, sent in its config (default: the server's)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_online)


def _cmd_bench_online(args: argparse.Namespace) -> int:
    from chorus.bench.online_bench import DEFAULT_TEXT, OnlineBenchConfig, OnlineBenchError, OverloadConfig
    from chorus.bench.online_run import run_online
    from chorus.bench.report import write_report
    from chorus.cli.checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    try:
        concurrency = tuple(int(c) for c in args.concurrency.split(","))
    except ValueError:
        raise CliError(f"--concurrency must be comma-separated integers, got {args.concurrency!r}") from None
    if args.agent:
        return _bench_online_agent(args, concurrency)
    given = [flag for name, flag in _AGENT_OPTIONS.items() if getattr(args, name) is not None]
    if given:
        raise CliError(f"{', '.join(given)}: only with --agent")
    overload = None
    if args.arrival_rate is not None or args.overload_multiple is not None:
        try:
            overload = OverloadConfig(arrival_rate=args.arrival_rate, overload_multiple=args.overload_multiple,
                                      requests=args.overload_requests, duration_s=args.overload_duration_s,
                                      seed=args.arrival_seed)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    cfg = OnlineBenchConfig(
        url=args.url, api_key=args.api_key, model=args.model, voice=args.voice, concurrency=concurrency,
        requests_per_level=args.requests_per_level, duration_s=args.duration_s,
        text=DEFAULT_TEXT if args.text is None else args.text,
        response_format=args.response_format, max_new_tokens=args.max_new_tokens, warmup=args.warmup,
        timeout_s=args.timeout_s, honor_retry_after=args.honor_retry_after, overload=overload,
        client_processes=args.client_processes, ramp_s=0.0 if args.ramp_s is None else args.ramp_s,
        protocol=args.protocol, grpc_target=args.grpc_target)
    try:
        report = run_online(cfg, progress=not args.quiet)
    except OnlineBenchError as exc:
        raise CliError(str(exc)) from None
    write_report(report, args.out)
    return 0


# ``chorus bench online --agent`` options -> AgentBenchConfig fields (None: not given; the config's default)
_AGENT_OPTIONS = {"turns": "--turns", "llm_tokens_per_s": "--llm-tokens-per-s", "token_spacing": "--token-spacing",
                  "cancel_fraction": "--cancel-fraction", "turn_gap_s": "--turn-gap-s",
                  "turn_gap_max_s": "--turn-gap-max-s", "listen": "--listen",
                  "agent_seed": "--agent-seed",
                  "chunking": "--chunking"}  # --ramp-s serves both modes
_HTTP_ONLY_OPTIONS = {"requests_per_level": "--requests-per-level", "duration_s": "--duration-s",
                      "arrival_rate": "--arrival-rate", "overload_multiple": "--overload-multiple"}


def _bench_online_agent(args: argparse.Namespace, concurrency: tuple[int, ...]) -> int:
    """``chorus bench online --agent``: voice agents over the WebSocket (chorus/bench/ws_bench.py)."""
    from chorus.bench.online_bench import OnlineBenchError
    from chorus.bench.report import write_report
    from chorus.bench.ws_bench import AgentBenchConfig, run_agent

    given = [flag for name, flag in _HTTP_ONLY_OPTIONS.items() if getattr(args, name) is not None]
    given += ["--honor-retry-after"] if args.honor_retry_after else []
    given += ["--client-processes"] if args.client_processes != 1 else []
    given += ["--protocol grpc"] if args.protocol != "http" else []
    given += ["--grpc-target"] if args.grpc_target is not None else []
    if given:
        raise CliError(f"{', '.join(given)}: not with --agent (it runs --turns turns on each connection)")
    options = {name: getattr(args, name) for name in _AGENT_OPTIONS if getattr(args, name) is not None}
    if "agent_seed" in options:
        options["seed"] = options.pop("agent_seed")
    if "chunking" in options:
        options["chunking"] = _chunking(options["chunking"])
    if args.text is not None:
        options["text"] = args.text
    if args.ramp_s is not None:
        options["ramp_s"] = args.ramp_s
    try:
        cfg = AgentBenchConfig(url=args.url, api_key=args.api_key, model=args.model, voice=args.voice,
                               concurrency=concurrency, response_format=args.response_format,
                               max_new_tokens=args.max_new_tokens, warmup=args.warmup, timeout_s=args.timeout_s,
                               **options)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        report = run_agent(cfg, progress=not args.quiet)
    except OnlineBenchError as exc:
        raise CliError(str(exc)) from None
    write_report(report, args.out)
    return 0


def _chunking(value: str) -> dict:
    """``min_chars=40,max_chars=200,max_wait_ms=300`` -> ``{"min_chars": 40, ...}``."""
    out = {}
    for item in value.split(","):
        key, sep, raw = item.partition("=")
        if not sep or not raw.strip().lstrip("-").isdigit():
            raise CliError(f"--chunking takes KEY=INT pairs separated by commas, got {value!r}")
        out[key.strip()] = int(raw)
    return out


def _add_swap_bench_parser(bench_sub) -> None:
    p = add_command(
        bench_sub, "swap", help="a hot swap under load: N streaming clients while the admin API loads a new "
                                "version of the model; failed and cut requests, time to first audio per phase",
        description="Load a running `chorus serve` (started with --admin-keys) with N clients sending POST "
                    "/v1/audio/speech back to back, swap the model to a new version through the admin API after "
                    "--before-s, keep the load for --after-s after the swap answered, and report per phase "
                    "(before, during, after the swap call) the outcomes, time to first audio and the versions "
                    "that served (docs/benchmarks.md, \"Swap under load\").")
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--admin-key", required=True, help="an admin key of the server (its --admin-keys)")
    p.add_argument("--version", required=True, help="the label of the version to load")
    p.add_argument("--checkpoint", default=None, help="the new version's checkpoint (default: the model's own)")
    p.add_argument("--api-key", default=None, help="bearer token, when the server has --api-keys (default: none)")
    p.add_argument("--model", default=None, help="model id to load and request (default: the first of GET /v1/models)")
    p.add_argument("--concurrency", type=int, default=64, help="concurrent clients (default 64)")
    p.add_argument("--before-s", type=float, default=20.0, help="seconds of load before the swap (default 20)")
    p.add_argument("--after-s", type=float, default=20.0, help="seconds of load after the swap answered (default 20)")
    p.add_argument("--text", default=None, help="text of every request (default: the 26-word sentence of "
                                                 "`chorus bench online`)")
    p.add_argument("--response-format", default="pcm", help="as for chorus bench online (default pcm)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="speech tokens per text chunk (default: the "
                                                                     "server's)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="seconds a request may take (default 300)")
    add_bench_out(p)
    p.set_defaults(handler=_cmd_bench_swap)


def _cmd_bench_swap(args: argparse.Namespace) -> int:
    from chorus.bench.online_bench import DEFAULT_TEXT, OnlineBenchError
    from chorus.bench.report import write_report
    from chorus.bench.swap_bench import SwapBenchConfig, run_swap
    from chorus.cli.checks import check_output_file

    if args.out is not None:
        check_output_file(args.out, "--out")
    try:
        cfg = SwapBenchConfig(url=args.url, admin_key=args.admin_key, version=args.version,
                              checkpoint=args.checkpoint, api_key=args.api_key, model=args.model,
                              concurrency=args.concurrency, before_s=args.before_s, after_s=args.after_s,
                              text=DEFAULT_TEXT if args.text is None else args.text,
                              response_format=args.response_format, max_new_tokens=args.max_new_tokens,
                              timeout_s=args.timeout_s)
        report = run_swap(cfg)
    except (ValueError, OnlineBenchError) as exc:
        raise CliError(str(exc)) from None
    write_report(report, args.out)
    return 0

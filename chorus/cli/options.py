"""What several commands share: the error shown as one line, the subcommand parsers, the options
that mean the same everywhere (variant, checkpoint, precision, device, language steps, an audio
file to write, the watermark, a benchmark's --out) and the reading of comma-separated counts."""
from __future__ import annotations

import argparse


class CliError(Exception):
    """An error to show the user as one line, without a traceback."""


def add_command(sub, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand parser: its help line doubles as its ``--help`` description, and options are
    never matched by prefix (``--text`` must not silently mean ``--text-file``)."""
    return sub.add_parser(name, help=help, description=description or help, allow_abbrev=False)


def add_group(sub, name: str, help: str, dest: str, metavar: str):
    """A command of subcommands (``chorus bench``, ``chorus checkpoint``): given none, it prints its
    help and exits 2. Returns the group's subparsers, for its subcommands to join."""
    group = add_command(sub, name, help=help)
    group.set_defaults(handler=lambda args: (group.print_help(), 2)[1])
    return group.add_subparsers(dest=dest, metavar=metavar)


def add_dtype(parser: argparse.ArgumentParser) -> None:
    from chorus.models.loading import DTYPE_CHOICES

    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help="precision: auto (bf16 on CUDA, fp32 on the CPU; the default), fp32, bf16 or fp16")


def add_variant(parser: argparse.ArgumentParser) -> None:
    from chorus.models.variants import VARIANTS

    parser.add_argument("--variant", "-V", default="original",
                        help=f"model variant: {', '.join(VARIANTS)} (default: original)")


def add_checkpoint(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", "-c", default=None, metavar="DIR_OR_REPO",
                        help="local directory in the official layout, or a Hugging Face hub repo id "
                             "(default: the variant's official repo)")


def add_t3_weights(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--t3-weights", default=None, metavar="NAME.safetensors",
                        help="the T3 weights' file name in the checkpoint when it is not the variant's official "
                             "one (a multilingual finetune such as a Single Language Pack; docs/checkpoints.md)")


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")


def add_audio_out(parser: argparse.ArgumentParser) -> None:
    """The audio file a command writes."""
    parser.add_argument("--out", "-o", required=True, help="output file; the format comes from .wav, .flac or .mp3")


def add_watermark(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--watermark", choices=["perth"], default=None,
                        help="apply Resemble's Perth watermark (needs the `watermark` extra); default: none")


def add_language_steps(parser: argparse.ArgumentParser) -> None:
    """The options of the multilingual language steps (docs/text.md)."""
    parser.add_argument("--language-steps", default=None, choices=("lenient", "strict"),
                        help="multilingual variants: lenient speaks a language whose step lacks its package or "
                             "model as the reference does (plain text, one warning); strict refuses to start "
                             "(default: lenient; env CHORUS_LANGUAGE_STEPS)")
    parser.add_argument("--dicta-model", default=None, metavar="FILE",
                        help="Hebrew: Dicta's ONNX model (dicta-1.0.onnx) for chorus-tts[he] (default: env "
                             "CHORUS_DICTA_MODEL, else the cached copy, downloaded once unless HF_HUB_OFFLINE is set)")
    parser.add_argument("--pkuseg-model", default=None, metavar="DIR",
                        help="Chinese: a spacy-pkuseg model directory for chorus-tts[zh] (default: env "
                             "CHORUS_PKUSEG_MODEL, else spacy-pkuseg's default model in PKUSEG_HOME, downloaded "
                             "once unless HF_HUB_OFFLINE is set)")


def add_fp8(parser: argparse.ArgumentParser) -> None:
    """``--fp8 STAGES``: the stages whose GEMMs run in FP8 (``chorus.models.fp8``)."""
    parser.add_argument("--fp8", default="", metavar="STAGES",
                        help="comma list of stages whose GEMMs run in FP8 E4M3 with per-row scales; t3 (T3's layer "
                             "projections, EngineConfig.fp8_linears; CUDA capability 8.9+, an exact emulation on "
                             "the CPU) is the only one (flow: not implemented yet). Default: none (docs/engine.md, "
                             "\"FP8 linears\")")


def fp8_stages(args: argparse.Namespace) -> tuple[str, ...]:
    """``--fp8``'s stages, checked."""
    from chorus.models.fp8 import parse_fp8_stages

    try:
        return parse_fp8_stages(args.fp8)
    except ValueError as exc:
        raise CliError(f"--fp8: {exc}") from None


def language_step_config(args: argparse.Namespace):
    from chorus.text import LanguageStepConfig

    return LanguageStepConfig.from_options(args.language_steps, args.dicta_model, args.pkuseg_model)


def add_bench_out(p: argparse.ArgumentParser) -> None:
    """Where every benchmark writes its report, and the one exception to benchmarks/results/'s rule."""
    p.add_argument("--out", "-o", default=None, help="also write the JSON report to this file (atomically)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="write --out into a benchmarks/results/ directory although the checkout has uncommitted "
                        "changes (default: refused; the report's provenance says which commit ran)")


def positive_ints(value: str, option: str) -> tuple[int, ...]:
    try:
        numbers = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise CliError(f"{option} must be comma-separated integers, got {value!r}") from None
    if any(n < 1 for n in numbers):
        raise CliError(f"{option} values must be at least 1, got {value!r}")
    return numbers

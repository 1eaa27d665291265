"""``chorus voice create``: a voice file built from a reference clip."""
from __future__ import annotations

import argparse

from chorus.cli.options import CliError, add_checkpoint, add_command, add_device, add_group, add_variant


def add_parser(sub) -> None:
    actions = add_group(sub, "voice", help="build voices from reference clips", dest="voice_command", metavar="ACTION")
    p = add_command(actions, "create", help="build a voice from a reference clip and save it (.safetensors)")
    add_variant(p)
    add_checkpoint(p)
    p.add_argument("--audio", "-a", required=True, help="reference clip (5-15 s of clean speech works best)")
    p.add_argument("--out", "-o", required=True, help="voice file to write (.safetensors)")
    p.add_argument("--name", default=None, help="voice name stored in the file (default: the clip's file name)")
    add_device(p)
    p.set_defaults(handler=_cmd_voice_create)


def _cmd_voice_create(args: argparse.Namespace) -> int:
    from pathlib import Path

    from chorus.models.loading import Checkpoint
    from chorus.models.variants import get_variant
    from chorus.voices.voice import VOICE_FILE_SUFFIX
    from chorus.voices import VoiceFrontEnd, prepare_voice_audio

    from chorus.cli.checks import check_input_file, check_output_file

    variant = get_variant(args.variant)
    if Path(args.out).suffix.lower() != VOICE_FILE_SUFFIX:
        raise CliError(f"--out must name a {VOICE_FILE_SUFFIX} file, got {args.out!r}")
    check_output_file(args.out, "--out")
    check_input_file(args.audio, "--audio")
    reference = prepare_voice_audio(args.audio, variant)
    front_end = VoiceFrontEnd.from_checkpoint(Checkpoint.open(variant, args.checkpoint), device=args.device)
    voice = front_end.build(reference, name=args.name or Path(args.audio).stem)
    voice.save(args.out)
    note = f" (cut to its first {reference.policy.max_seconds:g} s)" if reference.truncated else ""
    print(f"wrote voice {voice.name!r} for {variant.name} to {args.out}: reference {reference.duration:.2f} s"
          f"{note}, {voice.t3_prompt_tokens.shape[1]} T3 prompt tokens, "
          f"{voice.s3gen_prompt_tokens.shape[1]} S3Gen prompt tokens; content hash {voice.content_hash}")
    return 0

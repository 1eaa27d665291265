"""``chorus vc``: voice conversion, a recording's words in another voice (S3Gen only)."""
from __future__ import annotations

import argparse

from chorus.cli.options import (
    CliError, add_audio_out, add_checkpoint, add_command, add_device, add_dtype, add_variant, add_watermark,
)


def add_parser(sub) -> None:
    from chorus.conversion.config import DEFAULT_MAX_SOURCE_S

    p = add_command(sub, "vc", help="voice conversion: say the words of a recording in another voice",
                    description="Convert SOURCE (speech in any audio file) to the voice --voice and write a .wav, "
                                ".flac or .mp3 file, as the reference's ChatterboxVC does: the source at 16 kHz "
                                "is turned into speech tokens by the checkpoint's S3 tokenizer, and S3Gen "
                                "speaks them with the target's S3Gen conditioning. Only the checkpoint's S3Gen "
                                "file (and conds.pt for the built-in voice) is read; T3 is not loaded. See "
                                "docs/voice-conversion.md.")
    add_variant(p)
    add_checkpoint(p)
    p.add_argument("source", metavar="SOURCE", help="the speech to convert (an audio file)")
    p.add_argument("--voice", required=True, metavar="VOICE",
                   help="the target voice: 'default' (the checkpoint's built-in voice), a voice file saved by "
                        "`chorus voice create` (.safetensors, built for a variant with the same S3Gen: "
                        "original/multilingual or turbo/nano), a voice id of the voice store in --voices-dir, "
                        "or a reference clip (any audio file; its first 10 s are used)")
    p.add_argument("--voices-dir", default=None, metavar="DIR",
                   help="where `chorus serve` keeps uploaded voices, for --voice ID (default: env "
                        "CHORUS_VOICES_DIR, else ./voices)")
    add_audio_out(p)
    p.add_argument("--seed", type=int, default=None,
                   help="random seed of S3Gen's noise (default: a random one, printed)")
    p.add_argument("--flow-steps", type=int, default=None, help="S3Gen solver steps (default 10; Turbo/Nano 2)")
    p.add_argument("--max-source-s", type=float, default=DEFAULT_MAX_SOURCE_S, metavar="SECONDS",
                   help=f"refuse a longer source (default: {DEFAULT_MAX_SOURCE_S:g})")
    add_watermark(p)
    add_dtype(p)
    add_device(p)
    p.set_defaults(handler=_cmd_vc)


def _cmd_vc(args: argparse.Namespace) -> int:
    import os
    import re

    from chorus.audio.encode import format_from_path, write_audio
    from chorus.cli.checks import check_input_file, check_output_file
    from chorus.conversion.config import ConversionConfig
    from chorus.conversion.planner import ConversionPlanner, check_s3gen_kind
    from chorus.conversion.request import ConversionRequest
    from chorus.conversion.source import prepare_source
    from chorus.models.loading import Checkpoint, resolve_dtype
    from chorus.models.variants import get_variant
    from chorus.pipeline.planner import is_voice_file
    from chorus.voices import Voice

    # Everything that can be wrong with the inputs and outputs is checked before S3Gen loads.
    variant = get_variant(args.variant)
    fmt = format_from_path(args.out)
    check_output_file(args.out, "--out")
    check_input_file(args.source, "SOURCE")
    config = ConversionConfig(max_source_s=args.max_source_s)
    request = ConversionRequest(args.source, seed=args.seed, flow_steps=args.flow_steps, watermark=args.watermark)
    ConversionPlanner(variant, None, builtin_voice=lambda: None, config=config).validate(request)
    request.source = prepare_source(args.source, config)
    dtype = resolve_dtype(args.dtype, args.device)  # warns (once) about a slow choice
    checkpoint = Checkpoint.open(variant, args.checkpoint)
    target = args.voice
    if target == "default":
        if not checkpoint.has_builtin_voice():
            raise CliError(f"the checkpoint at {checkpoint.directory} has no built-in voice; pass --voice "
                           "with a voice file, a voice id or a reference clip")
        target = None
    elif os.path.exists(target):
        check_input_file(target, "--voice")
        if is_voice_file(target):
            target = check_s3gen_kind(Voice.load(target), variant)
        else:  # a reference clip: decoded and checked now, embedded once S3Gen is loaded
            from chorus.audio import ReferencePolicy, prepare_reference

            target = prepare_reference(target, ReferencePolicy(variant_name="voice conversion"))
    elif re.fullmatch(r"[a-z0-9_-]{1,64}", target):
        target = _stored_voice(target, args.voices_dir, variant)
    else:
        raise CliError(f"--voice {target}: no such file, and not a voice id")

    from chorus.conversion.runner import convert_on_stage
    from chorus.models.s3gen.s3gen import S3Gen
    from chorus.vocoder import VocoderStage

    s3gen = S3Gen.from_checkpoint(checkpoint, dtype=dtype, device=args.device, voice_models=True)

    def builtin():
        return Voice.from_conditionals(checkpoint.builtin_voice_state())

    request.voice = target
    plan = ConversionPlanner.for_s3gen(s3gen, builtin_voice=builtin, config=config).plan(request)
    result = convert_on_stage(VocoderStage(s3gen), plan)
    write_audio(args.out, result.wav, result.sample_rate, fmt)
    print(f"wrote {args.out}: {result.duration:.2f} s at {result.sample_rate} Hz ({fmt}), converted from "
          f"{plan.source_seconds:.2f} s of source ({len(plan.tokens)} speech tokens) to voice "
          f"{plan.target.name or args.voice!r}, seed {result.seed}")
    return 0


def _stored_voice(voice_id: str, voices_dir: str | None, variant):
    """A voice of the voice store kept in ``voices_dir`` (the directory `chorus serve` keeps
    uploaded voices in), checked for the loaded S3Gen kind."""
    import os

    from chorus.conversion.planner import check_s3gen_kind
    from chorus.voices.store import UnknownVoiceError, VoiceStore, VoiceStoreError

    directory = voices_dir or os.environ.get("CHORUS_VOICES_DIR") or "voices"
    if not os.path.isdir(directory):
        raise CliError(f"--voice {voice_id}: no such file, and no voices directory {directory} to look the id "
                       "up in (--voices-dir)")
    store = VoiceStore(directory, None, variant, builtin=None, cache_size=0)
    try:
        return check_s3gen_kind(store.get(voice_id), variant)
    except UnknownVoiceError:
        raise CliError(f"--voice {voice_id}: no such file, and no {variant.name} voice {voice_id!r} in "
                       f"{directory}") from None
    except VoiceStoreError as exc:  # e.g. a voice not built for this variant yet: no voice models here
        raise CliError(f"--voice {voice_id}: {exc}") from None

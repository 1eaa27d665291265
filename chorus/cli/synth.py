"""``chorus synth``: speak a text to an audio file, through the pipeline or the exact sequential path."""
from __future__ import annotations

import argparse
import sys

from chorus.cli.options import (
    CliError, add_audio_out, add_checkpoint, add_command, add_t3_weights, add_device, add_dtype, add_language_steps, add_variant,
    add_watermark, language_step_config,
)
from chorus.text.chunking import DEFAULT_MAX_CHARS


def add_parser(sub) -> None:
    p = add_command(sub, "synth", help="speak a text (or a whole book with --text-file) to an audio file",
                    description="Speak TEXT (or --text-file) with a variant's models and write "
                                "a .wav, .flac or .mp3 file. The text is split into sentence chunks "
                                "that are generated in parallel through the pipeline (continuous "
                                "batching of T3, batched S3Gen); --exact runs them one at a time on the "
                                "plain reference path instead. Unset options use the variant's defaults. "
                                "A random-weight checkpoint caps speech tokens at 100 per chunk unless "
                                "--max-new-tokens is given.")
    add_variant(p)
    add_checkpoint(p)
    add_t3_weights(p)
    p.add_argument("text", nargs="?", default=None, help="the text to speak")
    p.add_argument("--text-file", default=None, help="read the text from this UTF-8 file instead")
    add_audio_out(p)
    p.add_argument("--voice", default=None, metavar="FILE",
                   help="reference clip (any audio file) or a voice saved by `chorus voice create` "
                        "(.safetensors); default: the checkpoint's built-in voice")
    p.add_argument("--language", "-l", default=None, help="language code (required by multilingual variants)")
    add_language_steps(p)
    p.add_argument("--exaggeration", type=float, default=None, help="emotion strength (original, multilingual)")
    p.add_argument("--cfg-weight", type=float, default=None, help="classifier-free guidance weight (0 disables)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold in (0, 1]")
    p.add_argument("--min-p", type=float, default=None, help="min-p threshold in [0, 1]")
    p.add_argument("--top-k", type=int, default=None, help="top-k (Turbo/Nano; 0 disables)")
    p.add_argument("--repetition-penalty", type=float, default=None, help="repetition penalty (1 disables)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: a random one, printed)")
    p.add_argument("--flow-steps", type=int, default=None, help="S3Gen solver steps (default 10; Turbo/Nano 2)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="speech tokens per chunk at most (25 per second)")
    p.add_argument("--min-new-tokens", type=int, default=None,
                   help="speech tokens per chunk at least (EOS banned before)")
    add_watermark(p)
    add_dtype(p)
    add_device(p)
    p.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS,
                   help=f"longest text chunk in characters (default {DEFAULT_MAX_CHARS}); chunks end at sentences")
    p.add_argument("--no-normalize", action="store_true",
                   help="speak the text as written (no spelling-out of numbers and abbreviations)")
    p.add_argument("--exact", action="store_true",
                   help="run the plain sequential reference path (one chunk at a time) instead of the pipeline")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(handler=_cmd_synth)


def _read_text(args: argparse.Namespace) -> str:
    if (args.text is None) == (args.text_file is None):
        raise CliError("give the text to speak as an argument or with --text-file (exactly one of them)")
    if args.text_file is None:
        return args.text
    from chorus.cli.checks import check_input_file

    check_input_file(args.text_file, "--text-file")
    try:
        with open(args.text_file, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as exc:
        raise CliError(f"--text-file {args.text_file} is not UTF-8 text ({exc.reason})") from None


def _cmd_synth(args: argparse.Namespace) -> int:
    from pathlib import Path

    from chorus.audio.encode import format_from_path, write_audio
    from chorus.models.loading import Checkpoint
    from chorus.models.variants import get_variant
    from chorus.pipeline.planner import RequestPlanner, is_voice_file
    from chorus.pipeline.request import SpeechRequest
    from chorus.cli.checks import check_input_file, check_output_file
    from chorus.models.loading import resolve_dtype
    from chorus.models.random_checkpoint import random_weights_token_cap
    from chorus.text import load_text_encoder
    from chorus.voices import Voice, prepare_voice_audio

    # Everything that can be wrong with the inputs and outputs is checked before the models load.
    variant = get_variant(args.variant)
    fmt = format_from_path(args.out)
    check_output_file(args.out, "--out")
    text = _read_text(args)
    if args.voice is not None:
        check_input_file(args.voice, "--voice")
    dtype = resolve_dtype(args.dtype, args.device)  # warns (once) about a slow choice
    checkpoint = Checkpoint.open(variant, args.checkpoint, t3_weights=args.t3_weights)
    args.max_new_tokens, note = random_weights_token_cap(checkpoint.has_random_weights, args.max_new_tokens,
                                                         args.min_new_tokens)
    if note is not None:
        print(f"chorus: note: {note}", file=sys.stderr)
    request = SpeechRequest(
        text, language=args.language, exaggeration=args.exaggeration, cfg_weight=args.cfg_weight,
        temperature=args.temperature, top_p=args.top_p, min_p=args.min_p, top_k=args.top_k,
        repetition_penalty=args.repetition_penalty, seed=args.seed, max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens, flow_steps=args.flow_steps, watermark=args.watermark,
        normalize=not args.no_normalize)

    def no_voice_yet():
        raise AssertionError("validate() does not resolve voices")

    language_steps = language_step_config(args)
    RequestPlanner(variant, load_text_encoder(variant, checkpoint.directory, language_steps=language_steps),
                   builtin_voice=no_voice_yet, max_chars=args.max_chars).validate(request)
    voice = reference = None
    if args.voice is None:
        if not checkpoint.has_builtin_voice():
            raise CliError(f"the checkpoint at {checkpoint.directory} has no built-in voice; pass --voice FILE")
    elif is_voice_file(args.voice):
        voice = Voice.load(args.voice).check_variant(variant)
    else:
        reference = prepare_voice_audio(args.voice, variant)

    from chorus.pipeline.models import SpeechModels

    models = SpeechModels.load(variant, checkpoint, dtype=dtype, device=args.device,
                               voice_models=reference is not None, language_steps=language_steps)
    if reference is not None:
        voice = models.front_end.build(reference, name=Path(args.voice).stem)
    request.voice = voice
    plan = models.planner(args.max_chars).plan(request)
    show_progress = not args.quiet and sys.stderr.isatty()
    if args.exact:
        from chorus.synthesis import Synthesizer

        result = Synthesizer(models, max_chars=args.max_chars).run(plan, progress=show_progress)
    else:
        result = _run_pipeline(models, plan, args.max_chars, show_progress)
    write_audio(args.out, result.wav, result.sample_rate, fmt)
    print(f"wrote {args.out}: {result.duration:.2f} s at {result.sample_rate} Hz ({fmt}), "
          f"{len(result.chunks)} chunk(s), seed {result.seed}"
          + (f"; ignored for {variant.name}: {', '.join(result.ignored)}" if result.ignored else ""))
    return 0


def _run_pipeline(models, plan, max_chars: int, show_progress: bool):
    """Run one plan through the pipeline, with a progress bar of chunks, audio seconds and
    speed (x real time) when ``show_progress``."""
    import time

    from chorus.pipeline.pipeline import Pipeline, PipelineConfig

    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(plan.chunks), unit="chunk", desc="synthesizing", leave=False)
    start, audio = time.monotonic(), [0.0]

    def progress(update) -> None:
        audio[0] += update.audio_seconds
        if bar is not None:
            elapsed = max(time.monotonic() - start, 1e-9)
            bar.set_postfix_str(f"{audio[0]:.1f} s audio, {audio[0] / elapsed:.2f}x real time", refresh=False)
            bar.update(1)

    try:
        with Pipeline(models, PipelineConfig(max_chars=max_chars)) as pipe:
            return pipe.submit(plan, progress=progress).result()
    finally:
        if bar is not None:
            bar.close()

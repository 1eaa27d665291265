"""Time one full-size synthesis of a fixed number of speech tokens per variant; print JSON.

    python scripts/time_synthesis.py [--variants original,turbo] [--tokens 250] [--checkpoint-root DIR]
        [--device cpu] [--threads 2] [--dtype fp32]

Without --checkpoint-root a random-weight checkpoint of each variant is written to a temporary
directory (random weights: the timing is real, the audio is noise). T3 is forced to exactly
``--tokens`` tokens (250 = 10 s of audio); S3Gen runs the variant's default solver (10 steps + CFG
for the original, 2 meanflow steps for Turbo/Nano) with the built-in voice's 10 s prompt.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chorus.models.loading import Checkpoint  # noqa: E402
from chorus.models.random_checkpoint import write_random_checkpoint  # noqa: E402
from chorus.models.variants import get_variant  # noqa: E402
from chorus.synthesis import Synthesizer  # noqa: E402
from chorus.t3_sequential import generate_speech_tokens  # noqa: E402

TEXT = ("Chorus serves the Chatterbox family of speech models, and this sentence gives the text "
        "encoder something ordinary to read before the timing starts.")


def _reference_s3gen_seconds(variant, synth, voice, tokens: list[int]) -> float:
    """The reference S3Gen (chatterbox-tts, random weights) on the same tokens and prompt, CPU."""
    from chatterbox.models.s3gen import S3Gen as ReferenceS3Gen

    model = ReferenceS3Gen(meanflow=variant.s3gen.meanflow).eval()
    ref_dict = dict(prompt_token=voice.s3gen_prompt_tokens.clone(),
                    prompt_token_len=torch.tensor([voice.s3gen_prompt_tokens.shape[1]]),
                    prompt_feat=voice.s3gen_prompt_mel.clone(), prompt_feat_len=None, embedding=voice.xvector.clone())
    torch.manual_seed(1)
    start = time.perf_counter()
    model.inference(speech_tokens=torch.tensor([tokens]), ref_dict=ref_dict,
                    n_cfm_timesteps=variant.s3gen.flow_steps)
    return round(time.perf_counter() - start, 2)


def time_variant(name: str, tokens: int, root: Path | None, device: str, dtype: str,
                 reference: bool = False) -> dict:
    variant = get_variant(name)
    with tempfile.TemporaryDirectory(prefix=f"chorus-time-{name}-") as tmp:
        directory = root / name if root else write_random_checkpoint(variant, Path(tmp))
        start = time.perf_counter()
        synth = Synthesizer.load(variant, Checkpoint.open(variant, directory), device=device, dtype=dtype,
                                 voice_models=False)
        load_s = time.perf_counter() - start
        voice = synth.builtin_voice()
        params = synth.sampling_params(seed=1, max_new_tokens=tokens, min_new_tokens=tokens)
        [(_, text_ids)] = synth.plan(TEXT)
        with torch.inference_mode():
            start = time.perf_counter()
            cond = synth.t3.encode_conditioning(voice.speaker_embedding, voice.t3_prompt_tokens,
                                                variant.sampling.exaggeration)
            out = generate_speech_tokens(synth.t3, variant, cond, torch.tensor(text_ids), params)
            t3_s = time.perf_counter() - start
            # Random weights sample ids S3Gen cannot vocode (the original's vocabulary has 1633 of
            # them), which the clean-up would drop; fold them into real codes so S3Gen vocodes
            # exactly ``tokens`` tokens.
            valid = [t % variant.t3.num_speech_codes for t in out.tokens]
            s3gen_tokens = synth.s3gen.postprocess_tokens(valid)
            start = time.perf_counter()
            [wav] = synth.s3gen.tokens_to_wav([s3gen_tokens], voice, seeds=[1], postprocess=False)
            s3gen_s = time.perf_counter() - start
        reference_s = _reference_s3gen_seconds(variant, synth, voice, s3gen_tokens) if reference else None
    audio_s = wav.shape[0] / 24000
    return {
        "variant": name, "speech_tokens": len(out.tokens), "s3gen_tokens": len(s3gen_tokens),
        "audio_seconds": round(audio_s, 2), "reference_s3gen_seconds": reference_s,
        "flow_steps": variant.s3gen.flow_steps, "flow_cfg": variant.s3gen.cfg_rate > 0,
        "s3gen_prompt_tokens": voice.s3gen_prompt_tokens.shape[1],
        "load_seconds": round(load_s, 1), "t3_seconds": round(t3_s, 2),
        "t3_ms_per_token": round(1000 * t3_s / max(1, len(out.tokens)), 1),
        "s3gen_seconds": round(s3gen_s, 2), "total_seconds": round(t3_s + s3gen_s, 2),
        "realtime_factor": round(audio_s / (t3_s + s3gen_s), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="original,turbo")
    parser.add_argument("--tokens", type=int, default=250)
    parser.add_argument("--checkpoint-root", default=None, help="DIR/<variant> holds each checkpoint")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reference-s3gen", action="store_true",
                        help="also time the reference chatterbox-tts S3Gen on the same input (test oracle)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(args.checkpoint_root) if args.checkpoint_root else None
    report = {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": args.device,
              "dtype": args.dtype, "results": []}
    for name in args.variants.split(","):
        report["results"].append(time_variant(name.strip(), args.tokens, root, args.device, args.dtype,
                                                  args.reference_s3gen))
        print(json.dumps(report["results"][-1]), file=sys.stderr)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

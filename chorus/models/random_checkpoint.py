"""Random-weight checkpoints in exactly the official layout.

No real weights are needed to exercise Chorus end to end: this writes a directory with the
variant's official file names, formats, keys and shapes (read off the reference modules, see
``chorus/assets/reference_keys``), stand-in tokenizer files with the real special tokens, and a
random built-in voice (``conds.pt``). Every test and benchmark then runs the real loading code.
A model with random weights speaks noise.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable

import torch

from chorus.atomic import atomic_directory
from chorus.models.loading import RANDOM_WEIGHTS_MARKER
from chorus.models.variants import Variant

NOISE_WARNING = "random weights: this checkpoint is for tests and benchmarks and speaks noise"
COMPONENTS = ("t3", "voice_encoder", "s3gen", "tokenizer", "conds")
RANDOM_WEIGHTS_TOKEN_CAP = 100  # 4 s of speech per chunk


@dataclass(frozen=True)
class KeySpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def reference_key_specs(table: str) -> list[KeySpec]:
    """Keys, shapes and dtypes of one official module (``ve``, ``s3gen``, ``s3genmf``, ``t3en`` ...)."""
    text = resources.files("chorus.assets").joinpath("reference_keys").joinpath(f"{table}.tsv").read_text()
    specs = []
    for line in text.splitlines():
        name, dtype, *rest = line.split("\t")
        shape = tuple(int(x) for x in (rest[0].split() if rest else []))
        specs.append(KeySpec(name, shape, getattr(torch, dtype)))
    return specs


def _is_norm_scale(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 1 and name.endswith(".weight")


def random_tensor(spec: KeySpec, generator: torch.Generator) -> torch.Tensor:
    """A plausible random value for one checkpoint entry, chosen by its name and shape.

    Matrices get fan-in scaled normal values; norm scales sit near 1 and biases near 0 (both
    perturbed so that a swapped scale/bias would show); batch-norm statistics are valid
    (positive variances); counters are zero.
    """
    name, shape = spec.name, spec.shape
    if not spec.dtype.is_floating_point:
        return torch.zeros(shape, dtype=spec.dtype)
    if name.endswith("running_var"):
        return 1.0 + 0.1 * torch.rand(shape, generator=generator)
    if name.endswith("running_mean"):
        return 0.1 * torch.randn(shape, generator=generator)
    if name.endswith("tokenizer.window"):
        return torch.hann_window(shape[0])
    if name.endswith("tokenizer._mel_filters"):
        from chorus.models.s3gen.mel import mel_filterbank

        return mel_filterbank(sr=16000, n_fft=400, n_mels=shape[0], fmin=0.0, fmax=8000.0).float()
    if _is_norm_scale(name, shape) or name.endswith("original0"):
        return 1.0 + 0.05 * torch.randn(shape, generator=generator)
    if len(shape) <= 1:
        return 0.02 * torch.randn(shape, generator=generator)
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
    return torch.randn(shape, generator=generator) / math.sqrt(max(fan_in, 1))


def random_state_dict(specs: Iterable[KeySpec], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {spec.name: random_tensor(spec, generator) for spec in specs}


def t3_key_specs(variant: Variant) -> list[KeySpec]:
    from chorus.models.t3.model import T3Model

    return [KeySpec(k, tuple(s), torch.float32) for k, s in T3Model.checkpoint_shapes(variant.t3).items()]


def _save(state: dict[str, torch.Tensor], path: Path) -> None:
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        # safetensors 0.8 writes through a private temporary file (mode 0600): give the file the
        # mode every other file gets, so that another user (a container's) can read the checkpoint
        umask = os.umask(0)
        os.umask(umask)
        path.chmod(0o666 & ~umask)
    else:
        torch.save(state, path)


def random_builtin_voice(variant: Variant, seed: int) -> dict:
    """A random ``conds.pt`` dict with the official structure and shapes."""
    g = torch.Generator().manual_seed(seed)
    speaker = torch.rand(1, variant.t3.speaker_embed_size, generator=g)  # the VE output is ReLU'd
    speaker = speaker / speaker.norm(dim=1, keepdim=True)
    prompt_frames = int(variant.s3gen_prompt_seconds * 50)
    return {
        "t3": {
            "speaker_emb": speaker,
            "clap_emb": None,
            "cond_prompt_speech_tokens": torch.randint(
                0, variant.t3.num_speech_codes, (1, variant.t3.speech_cond_prompt_len), generator=g),
            "cond_prompt_speech_emb": None,
            "emotion_adv": 0.5 * torch.ones(1, 1, 1),
        },
        "gen": {
            "prompt_token": torch.randint(0, variant.t3.num_speech_codes, (1, prompt_frames // 2), generator=g),
            "prompt_token_len": torch.tensor([prompt_frames // 2]),
            "prompt_feat": (-6.0 + 2.0 * torch.randn(1, prompt_frames, 80, generator=g)).clamp(min=math.log(1e-5)),
            "prompt_feat_len": None,
            "embedding": torch.randn(1, 192, generator=g),
        },
    }


def random_weights_token_cap(has_random_weights: bool, max_new_tokens: int | None,
                             min_new_tokens: int | None) -> tuple[int | None, str | None]:
    """``(max_new_tokens, note)``: a random-weight model rarely samples EOS, so without an explicit
    ``max_new_tokens`` every chunk would run to the variant's limit (about 1000 tokens, minutes
    on a CPU, 40 s of noise). Such checkpoints get a cap of :data:`RANDOM_WEIGHTS_TOKEN_CAP`
    tokens per chunk and a note saying so; everything else is returned unchanged. The one rule
    for every door: ``chorus synth``, ``chorus serve`` and the Python API (the request planner
    of models loaded from such a checkpoint)."""
    if not has_random_weights or max_new_tokens is not None:
        return max_new_tokens, None
    cap = max(RANDOM_WEIGHTS_TOKEN_CAP, min_new_tokens or 0)
    return cap, (f"random-weight checkpoint: speech tokens capped at {cap} per chunk ({cap / 25:g} s); "
                 f"pass --max-new-tokens to change")


def is_random_checkpoint(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a checkpoint written by :func:`write_random_checkpoint`."""
    return (Path(directory) / RANDOM_WEIGHTS_MARKER).is_file()


def write_random_checkpoint(variant: Variant, out_dir: str | os.PathLike, *, seed: int = 0,
                            components: Iterable[str] = COMPONENTS) -> Path:
    """Write a random-weight checkpoint of ``variant`` into ``out_dir``.

    ``components`` selects what to write (tests that need only T3 skip the 1 GB S3Gen file).
    The directory is written under a temporary name beside ``out_dir`` and renamed when complete
    (an interrupted run leaves nothing). ``out_dir`` may be absent (parents are created), empty,
    or an earlier random checkpoint (replaced); any other existing content is refused with
    :class:`FileExistsError`. Returns the directory.
    """
    components = tuple(components)
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown checkpoint components {sorted(unknown)}; choose from {COMPONENTS}")
    files = variant.files
    with atomic_directory(out_dir, replaceable=is_random_checkpoint) as out:
        if "t3" in components:
            _save(random_state_dict(t3_key_specs(variant), seed), out / files.t3)
        if "voice_encoder" in components:
            _save(random_state_dict(reference_key_specs("ve"), seed + 1), out / files.voice_encoder)
        if "s3gen" in components:
            table = "s3genmf" if variant.s3gen.meanflow else "s3gen"
            _save(random_state_dict(reference_key_specs(table), seed + 2), out / files.s3gen)
        if "tokenizer" in components:
            from chorus.text import write_standin_tokenizer_files

            write_standin_tokenizer_files(variant.tokenizer_kind, out)
        if "conds" in components:
            torch.save(random_builtin_voice(variant, seed + 3), out / files.conds)
        (out / RANDOM_WEIGHTS_MARKER).write_text(
            f"{NOISE_WARNING}\nvariant: {variant.name}\nseed: {seed}\n"
        )
    return Path(out_dir)

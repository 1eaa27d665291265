"""One vocoder pass's inputs and its modules called directly, as the stage calls them: shared by
``chorus bench vocoder`` (the split and the yardstick) and its roofline (``roofline_passes``)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from chorus.models.s3gen.hift import SourceNoise, draw_source_noise
from chorus.models.s3gen.s3gen import S3Gen
from chorus.vocoder.pass_graphs import vocode
from chorus.voices import Voice


@dataclass
class PassInputs:
    """The module inputs of one pass shape: B items of the same prompt + N tokens (so the
    pass's padded shapes are its real ones)."""

    tokens: torch.Tensor  # [B, Tp + N] long: prompt then new tokens
    lengths: torch.Tensor  # [B]
    cond: torch.Tensor  # [B, 80, T] the prompt mel, zeros after it
    speaker: torch.Tensor  # [B, 80] projected x-vector
    noise: torch.Tensor  # [B, 80, T] the solver's start
    prompt_mel_frames: int
    n_steps: int
    cfg_rate: float
    source_noise: SourceNoise  # for the new frames

    @property
    def frames(self) -> int:
        return self.noise.shape[2]

    @property
    def new_frames(self) -> int:
        return self.frames - self.prompt_mel_frames


@torch.inference_mode()
def pass_inputs(s3gen: S3Gen, voice: Voice, items: list[list[int]], n_steps: int, cfg_rate: float,
                seed: int) -> PassInputs:
    """``items``: per item, the tokens the stage vocodes (after the variant's clean-up), all of one length."""
    device, dtype, flow = s3gen.device, s3gen.dtype, s3gen.flow
    assert len({len(t) for t in items}) == 1, "a bench pass has items of one length"
    batch = len(items)
    prompt = voice.s3gen_prompt_tokens[0].to(torch.long)
    rows = [torch.cat([prompt, torch.tensor(t, dtype=torch.long)]) for t in items]
    tokens = torch.stack(rows).to(device)
    lengths = torch.full((batch,), tokens.shape[1], dtype=torch.long, device=device)
    frames = flow.config.token_mel_ratio * tokens.shape[1]
    mel = voice.s3gen_prompt_mel[0].to(device=device, dtype=dtype)  # [Tm, 80]
    cond = torch.zeros(batch, flow.config.mel_bins, frames, dtype=dtype, device=device)
    cond[:, :, :mel.shape[0]] = mel.transpose(0, 1)
    speaker = flow.speaker_projection(voice.xvector.to(device)).expand(batch, -1).contiguous()
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(batch, flow.config.mel_bins, frames, generator=generator).to(device=device, dtype=dtype)
    new = frames - mel.shape[0]
    source = draw_source_noise([new] * batch, s3gen.mel2wav.config, device)
    return PassInputs(tokens, lengths, cond, speaker, noise, mel.shape[0], n_steps, cfg_rate, source)


# ------------------------------------------------------------------------- the module calls
def run_encoder(s3gen: S3Gen, inp: PassInputs) -> torch.Tensor:
    """Embedding + conformer + ``encoder_proj``: mu ``[B, 80, T]``."""
    flow = s3gen.flow
    hidden, _ = flow.encode(inp.tokens, inp.lengths)
    return flow.encoder_proj(hidden).transpose(1, 2)


def run_solver(s3gen: S3Gen, inp: PassInputs, mu: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return s3gen.flow.decoder.solve(inp.noise, mask, mu, inp.speaker, inp.cond,
                                    n_steps=inp.n_steps, cfg_rate=inp.cfg_rate)


def run_hift(s3gen: S3Gen, inp: PassInputs, mel: torch.Tensor) -> torch.Tensor:
    """HiFT as the stage calls it (with frame counts, so the masked, per-item paths run)."""
    new = mel[:, :, inp.prompt_mel_frames:]
    counts = torch.full((new.shape[0],), new.shape[2], dtype=torch.long, device=new.device)
    return vocode(s3gen.mel2wav, new, counts, inp.source_noise)[0]

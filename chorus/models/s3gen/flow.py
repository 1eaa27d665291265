"""S3Gen's flow: speech tokens (25 Hz) -> 80-bin log-mel (50 Hz), for batches of any lengths.

Per item: tokens = [prompt tokens | new tokens] -> embedding -> conformer encoder (x2 in time)
-> ``encoder_proj`` = mu; cond = the prompt mel over the first ``Tm`` frames, zeros after;
speaker = Linear(L2-normalised x-vector); a flow-matching solve from noise gives a mel over all
``2 * (Tp + N)`` frames, of which the frames from ``Tm`` on are returned. ``Tm`` is the prompt-mel
length, not ``2 * Tp``: when it is odd, the first new frame falls in the prompt region and the
output has ``2N - 1`` frames, as in the reference.

State-dict keys are the checkpoint's ``flow.*`` keys without the prefix.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from chorus.models.checkpoint import check_state_dict, strip_prefix
from chorus.models.s3gen.encoder import EncoderConfig, UpsampleConformerEncoder, sequence_mask
from chorus.models.s3gen.estimator import EstimatorConfig
from chorus.models.s3gen.flow_matching import ConditionalFlowMatching

Noise = torch.Tensor | torch.Generator | Sequence[torch.Generator]


@dataclass(frozen=True)
class FlowConfig:
    """Token->mel flow. Defaults are the released checkpoints'; ``meanflow`` selects Turbo/Nano's."""

    vocab_size: int = 6561
    mel_bins: int = 80
    speaker_dim: int = 192
    meanflow: bool = False
    cfg_rate: float = 0.7  # classifier-free guidance weight (standard mode only)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)

    def __post_init__(self) -> None:
        if self.estimator.in_channels != 4 * self.mel_bins or self.estimator.out_channels != self.mel_bins:
            raise ValueError("the estimator must take 4 x mel_bins channels and give mel_bins")

    @property
    def default_steps(self) -> int:
        return 2 if self.meanflow else 10

    @property
    def token_mel_ratio(self) -> int:
        return self.encoder.upsample


def _broadcast_batch(x: torch.Tensor, batch: int) -> torch.Tensor:
    return x.expand(batch, *x.shape[1:]) if x.shape[0] == 1 and batch > 1 else x


def concat_padded(
    first: torch.Tensor, first_lengths: torch.Tensor, second: torch.Tensor, second_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, ``first[:len1] ++ second[:len2]``, right-padded with zeros: ``[B, max(len1+len2)]``."""
    lengths = first_lengths + second_lengths
    width = int(lengths.max())
    pos = torch.arange(width, device=first.device)[None, :]
    out = torch.zeros(first.shape[0], width, dtype=first.dtype, device=first.device)
    if first.shape[1]:
        from_first = first.gather(1, pos.clamp(max=first.shape[1] - 1).expand(first.shape[0], -1))
        out = torch.where(pos < first_lengths[:, None], from_first, out)
    if second.shape[1]:
        index = (pos - first_lengths[:, None]).clamp(0, second.shape[1] - 1)
        in_second = (pos >= first_lengths[:, None]) & (pos < lengths[:, None])
        out = torch.where(in_second, second.gather(1, index), out)
    return out, lengths


class FlowDecoder(nn.Module):
    """Token->mel module (``flow.*`` of ``s3gen.safetensors`` / ``s3gen_meanflow.safetensors``)."""

    def __init__(self, config: FlowConfig):
        super().__init__()
        self.config = config
        width = config.encoder.width
        self.input_embedding = nn.Embedding(config.vocab_size, width)
        self.spk_embed_affine_layer = nn.Linear(config.speaker_dim, config.mel_bins)
        self.encoder = UpsampleConformerEncoder(config.encoder)
        self.encoder_proj = nn.Linear(width, config.mel_bins)
        self.decoder = ConditionalFlowMatching(config.estimator, meanflow=config.meanflow)

    @classmethod
    def from_state_dict(
        cls,
        config: FlowConfig,
        state: Mapping[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        prefix: str = "",
        source: str = "flow state dict",
    ) -> "FlowDecoder":
        """Build from a state dict, strictly: any missing, unexpected or mis-shaped key raises
        :class:`~chorus.models.checkpoint.CheckpointMismatchError` with a readable report.

        With ``prefix`` (e.g. ``"flow."`` for a whole S3Gen file) only keys under it are used.
        """
        if prefix:
            state = strip_prefix(state, prefix)
        with torch.device("meta"):
            model = cls(config)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        check_state_dict(state, expected, source)
        model.load_state_dict(state, strict=True, assign=True)
        return model.to(device=device, dtype=dtype).eval().requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder_proj.weight.dtype

    def encode(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids ``[B, L]`` (right-padded) -> encoder states ``[B, 2L, width]`` and their lengths."""
        mask = sequence_mask(lengths, tokens.shape[1])
        embedded = self.input_embedding(tokens.masked_fill(~mask, 0)) * mask[:, :, None].to(self.dtype)
        return self.encoder(embedded, lengths)

    def speaker_projection(self, xvector: torch.Tensor) -> torch.Tensor:
        """CAMPPlus x-vectors ``[B, 192]`` -> ``[B, 80]``."""
        return self.spk_embed_affine_layer(F.normalize(xvector.to(self.dtype), dim=1))

    @torch.inference_mode()
    def inference(
        self,
        tokens: torch.Tensor,
        token_lengths: torch.Tensor,
        prompt_tokens: torch.Tensor,
        prompt_token_lengths: torch.Tensor,
        prompt_mel: torch.Tensor,
        prompt_mel_lengths: torch.Tensor,
        xvector: torch.Tensor,
        *,
        noise: Noise,
        generated_noise: torch.Tensor | None = None,
        n_steps: int | None = None,
        cfg_rate: float | None = None,
        speaker: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mel frames of the new tokens only: (``[B, 80, T_new]`` zero-padded, lengths ``[B]``).

        Args:
            tokens, token_lengths: new speech tokens ``[B, N]`` (ids < vocab_size), lengths ``[B]``.
            prompt_tokens, prompt_token_lengths: the voice's prompt tokens ``[B, Np]``, ``[B]``.
            prompt_mel, prompt_mel_lengths: the voice's prompt mel ``[B, Tm, 80]``, ``[B]``.
            xvector: CAMPPlus embeddings ``[B, 192]``.
              Prompt tensors and xvector may have batch 1 to share one voice across the batch.
            noise: the solver's initial noise. Either a tensor ``[B, 80, >= max 2(Tp+N)]`` laid
              out like each item's frames (prompt then new), or a generator (or one per item)
              from which each item's noise is drawn in the reference's order: for meanflow
              first ``[1, 80, 2N]`` for the new tokens then ``[1, 80, 2(Tp+N)]`` of which the
              first ``2Tp`` columns are kept; otherwise ``[1, 80, 2(Tp+N)]``. A shared generator
              draws item after item.
            generated_noise: optional ``[B, 80, >= max 2N]``; replaces the noise of each item's
              new-token columns ``2Tp .. 2(Tp+N)`` (the reference's meanflow noise).
            n_steps: Euler steps (default 10, meanflow 2). cfg_rate: default ``config.cfg_rate``.
            speaker: optional ``[B or 1, 80]`` result of :meth:`speaker_projection` for ``xvector``
              (a caller that caches it per voice saves the projection); None computes it.
        """
        config = self.config
        batch, device = tokens.shape[0], self.encoder_proj.weight.device
        tokens, token_lengths = tokens.to(device), token_lengths.to(device)
        prompt_tokens, prompt_token_lengths, prompt_mel, prompt_mel_lengths, xvector = (
            _broadcast_batch(x.to(device), batch)
            for x in (prompt_tokens, prompt_token_lengths, prompt_mel, prompt_mel_lengths, xvector)
        )
        self._check_inputs(tokens, token_lengths, prompt_tokens, prompt_token_lengths,
                           prompt_mel, prompt_mel_lengths, xvector)
        ratio = config.token_mel_ratio
        n_steps = config.default_steps if n_steps is None else n_steps
        if n_steps < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps}")

        all_tokens, all_lengths = concat_padded(prompt_tokens, prompt_token_lengths, tokens, token_lengths)
        frames = ratio * all_tokens.shape[1]
        like = torch.zeros(batch, config.mel_bins, frames, dtype=self.dtype, device=device)
        cond = torch.zeros_like(like)
        prompt_frames = min(prompt_mel.shape[1], frames)
        in_prompt = sequence_mask(prompt_mel_lengths, prompt_frames)[:, None, :]
        prompt = prompt_mel[:, :prompt_frames].transpose(1, 2).to(like.dtype)
        cond[:, :, :prompt_frames] = torch.where(in_prompt, prompt, 0.0)

        z = self._initial_noise(noise, generated_noise, ratio * prompt_token_lengths,
                                ratio * token_lengths, frames, like)
        speaker = self.speaker_projection(xvector) if speaker is None else _broadcast_batch(speaker.to(device), batch)
        mel = self.generate_mel(all_tokens, all_lengths, cond, z, speaker, n_steps,
                                self.decoder.guidance(config.cfg_rate if cfg_rate is None else cfg_rate))
        return self._new_frames(mel, prompt_mel_lengths, ratio * all_lengths)

    def generate_mel(self, tokens: torch.Tensor, lengths: torch.Tensor, cond: torch.Tensor, noise: torch.Tensor,
                     speaker: torch.Tensor, n_steps: int, guidance) -> torch.Tensor:
        """The flow's core, over prompt and new tokens together: encode, project, solve.

        tokens ``[B, L]`` (prompt then new tokens, right-padded) with ``lengths`` ``[B]`` (at
        least 1 each); cond, noise ``[B, 80, ratio * L]`` (cond: the prompt mel, zeros after);
        speaker ``[B, 80]`` (:meth:`speaker_projection`); guidance as
        :meth:`ConditionalFlowMatching.integrate` takes it (floats or 0-dim device tensors).
        Returns the mel ``[B, 80, ratio * L]`` of every frame (frames past an item's length keep
        their noise). No host synchronisation and no data-dependent control flow: the vocoder
        stage captures this call in CUDA graphs.
        """
        hidden, mel_lengths = self.encode(tokens, lengths)
        mu = self.encoder_proj(hidden).transpose(1, 2)
        mask = sequence_mask(mel_lengths, mu.shape[2])
        return self.decoder.integrate(noise, mask, mu, speaker, cond, n_steps, guidance)

    def _check_inputs(self, tokens, token_lengths, prompt_tokens, prompt_token_lengths,
                      prompt_mel, prompt_mel_lengths, xvector) -> None:
        batch = tokens.shape[0]
        for name, x, dims in (("tokens", tokens, 2), ("prompt_tokens", prompt_tokens, 2),
                              ("prompt_mel", prompt_mel, 3), ("xvector", xvector, 2)):
            if x.dim() != dims or x.shape[0] != batch:
                raise ValueError(f"{name} must be {dims}-D with batch {batch}, got {tuple(x.shape)}")
        for name, lengths, limit in (("token_lengths", token_lengths, tokens.shape[1]),
                                     ("prompt_token_lengths", prompt_token_lengths, prompt_tokens.shape[1]),
                                     ("prompt_mel_lengths", prompt_mel_lengths, prompt_mel.shape[1])):
            if lengths.shape != (batch,) or bool((lengths < 0).any()) or bool((lengths > limit).any()):
                raise ValueError(f"{name} must be [B] within 0..{limit}, got {lengths.tolist()}")
        if bool((token_lengths < 1).any()):
            raise ValueError("every item needs at least one new token")
        mel_lengths = self.config.token_mel_ratio * (prompt_token_lengths + token_lengths)
        if bool((prompt_mel_lengths >= mel_lengths).any()):
            raise ValueError("a prompt mel must be shorter than 2 x (prompt + new tokens) frames")
        if prompt_mel.shape[2] != self.config.mel_bins or xvector.shape[1] != self.config.speaker_dim:
            raise ValueError(f"prompt_mel must have {self.config.mel_bins} bins and xvector "
                             f"{self.config.speaker_dim} values")
        for name, ids, lengths in (("tokens", tokens, token_lengths),
                                   ("prompt_tokens", prompt_tokens, prompt_token_lengths)):
            valid = ids[sequence_mask(lengths, ids.shape[1])]
            if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= self.config.vocab_size):
                raise ValueError(f"{name} holds ids outside 0..{self.config.vocab_size - 1}")

    def _initial_noise(self, noise: Noise, generated_noise: torch.Tensor | None,
                       prompt_frames: torch.Tensor, new_frames: torch.Tensor,
                       frames: int, like: torch.Tensor) -> torch.Tensor:
        """The solver's starting point ``[B, 80, frames]``; see :meth:`inference` for the layout."""
        batch, bins = like.shape[:2]
        if isinstance(noise, torch.Tensor):
            if noise.dim() != 3 or noise.shape[:2] != (batch, bins) or noise.shape[2] < frames:
                raise ValueError(f"noise must be [{batch}, {bins}, >= {frames}], got {tuple(noise.shape)}")
            z = noise[:, :, :frames].to(device=like.device, dtype=like.dtype, copy=True)
        else:
            generators = [noise] * batch if isinstance(noise, torch.Generator) else list(noise)
            if len(generators) != batch:
                raise ValueError(f"need one generator per item ({batch}), got {len(generators)}")
            z = torch.zeros_like(like)
            drawn_new = []
            for i, gen in enumerate(generators):
                total = int(prompt_frames[i] + new_frames[i])
                if self.config.meanflow and generated_noise is None:
                    drawn_new.append(self._randn(int(new_frames[i]), gen, like))
                z[i, :, :total] = self._randn(total, gen, like)
            if drawn_new:
                generated_noise = torch.zeros(batch, bins, int(new_frames.max()), dtype=like.dtype,
                                              device=like.device)
                for i, draw in enumerate(drawn_new):
                    generated_noise[i, :, :draw.shape[1]] = draw
        if generated_noise is not None:
            if generated_noise.dim() != 3 or generated_noise.shape[:2] != (batch, bins) \
                    or generated_noise.shape[2] < int(new_frames.max()):
                raise ValueError(f"generated_noise must be [{batch}, {bins}, >= {int(new_frames.max())}]")
            for i in range(batch):
                start, count = int(prompt_frames[i]), int(new_frames[i])
                z[i, :, start:start + count] = generated_noise[i, :, :count].to(device=z.device, dtype=z.dtype)
        return z

    @staticmethod
    def _randn(frames: int, generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
        return torch.randn(1, like.shape[1], frames, generator=generator, dtype=like.dtype,
                           device=like.device)[0]

    @staticmethod
    def _new_frames(
        mel: torch.Tensor, start: torch.Tensor, end: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames ``start[i] .. end[i]`` of each row, left-aligned and zero-padded."""
        lengths = end - start
        width = int(lengths.max())
        index = (start[:, None] + torch.arange(width, device=mel.device)[None, :]).clamp(max=mel.shape[2] - 1)
        out = mel.gather(2, index[:, None, :].expand(-1, mel.shape[1], -1))
        return out * sequence_mask(lengths, width)[:, None, :].to(out.dtype), lengths

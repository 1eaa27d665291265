"""VoiceEncoder: the 256-d speaker embedding that conditions T3.

A 3-layer LSTM over 40-bin mel frames of 16 kHz audio. An utterance is silence-trimmed, cut
into overlapping partial windows of 160 frames (1.6 s), each window is embedded (last hidden
state -> Linear -> ReLU -> L2 norm), and the utterance embedding is the L2-normalised mean.

The front end reproduces the reference's librosa pipeline: ``effects.trim(top_db=20)``, a
centred reflect-padded STFT (n_fft 400, hop 160, periodic Hann) computed in float64 and stored
as complex64, power spectrum, 40 Slaney mel filters, linear amplitude (no log).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from chorus.models.checkpoint import check_state_dict, meta_shapes
from chorus.models.s3gen.mel import mel_filterbank


@dataclass(frozen=True)
class VoiceEncoderConfig:
    sample_rate: int = 16000
    num_mels: int = 40
    hidden_size: int = 256
    num_layers: int = 3
    embed_size: int = 256
    n_fft: int = 400
    hop: int = 160
    fmin: float = 0.0
    fmax: float = 8000.0
    partial_frames: int = 160
    # Partials start every round((sample_rate / rate) / partial_frames) = 77 frames.
    partial_rate: float = 1.3
    # A final, incomplete window is kept when it would be at least this full.
    min_coverage: float = 0.8
    trim_top_db: float | None = 20.0
    trim_frame_length: int = 2048
    trim_hop: int = 512

    @property
    def partial_step(self) -> int:
        return int(np.round((self.sample_rate / self.partial_rate) / self.partial_frames))


def trim_silence(wav: np.ndarray, top_db: float, frame_length: int = 2048, hop: int = 512) -> np.ndarray:
    """Cut leading and trailing audio quieter than ``top_db`` below the loudest frame.

    Same result as ``librosa.effects.trim(wav, top_db=top_db)``: frame RMS over centred,
    zero-padded frames, compared in dB with the loudest frame. Written with the same NumPy
    float32 operations so that frames right at the threshold fall on the same side.
    """
    assert wav.ndim == 1
    wav = np.asarray(wav, dtype=np.float32)
    padded = np.pad(wav, (frame_length // 2, frame_length // 2), mode="constant")
    windows = np.lib.stride_tricks.as_strided(
        padded, shape=(padded.shape[0] - frame_length + 1, frame_length),
        strides=(padded.strides[0], padded.strides[0]), writeable=False,
    )
    frames = np.moveaxis(windows, -1, -2)[:, ::hop]  # (frame_length, n_frames), a strided view
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float32), axis=-2))
    ref_power = np.max(rms) ** 2
    amin = 1e-5 ** 2
    level_db = 10.0 * np.log10(np.maximum(amin, np.square(rms)))
    level_db -= 10.0 * np.log10(np.maximum(amin, ref_power))
    loud = np.flatnonzero(level_db > -top_db)
    if loud.size == 0:
        return wav[:0]
    start = int(loud[0]) * hop
    end = min(wav.shape[0], (int(loud[-1]) + 1) * hop)
    return wav[start:end]


class VoiceEncoder(nn.Module):
    """Speaker encoder with the official ``ve.safetensors`` / ``ve.pt`` keys (16 entries)."""

    def __init__(self, config: VoiceEncoderConfig = VoiceEncoderConfig()):
        super().__init__()
        self.config = config
        self.lstm = nn.LSTM(config.num_mels, config.hidden_size, num_layers=config.num_layers, batch_first=True)
        self.proj = nn.Linear(config.hidden_size, config.embed_size)
        # Training-time similarity scale/offset; part of the official files, unused at inference.
        self.similarity_weight = nn.Parameter(torch.tensor([10.0]))
        self.similarity_bias = nn.Parameter(torch.tensor([-5.0]))

    @classmethod
    def checkpoint_shapes(cls, config: VoiceEncoderConfig = VoiceEncoderConfig()) -> dict[str, tuple[int, ...]]:
        return meta_shapes(lambda: cls(config))

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, torch.Tensor], *, config: VoiceEncoderConfig = VoiceEncoderConfig(),
        device: torch.device | str = "cpu", source: str = "VoiceEncoder state dict",
    ) -> "VoiceEncoder":
        """Build an eval-mode encoder (fp32) from an official state dict; keys are checked strictly."""
        check_state_dict(state, cls.checkpoint_shapes(config), source)
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict({k: v.to(device=device, dtype=torch.float32) for k, v in state.items()},
                              strict=True, assign=True)
        model.lstm.flatten_parameters()
        return model.eval().requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.proj.weight.device

    # ---- front end ------------------------------------------------------------------------

    def mel_spectrogram(self, wav: np.ndarray) -> torch.Tensor:
        """(T, num_mels) float32 linear mel power of 16 kHz audio, T = 1 + len // hop (on CPU)."""
        cfg = self.config
        wav = np.asarray(wav, dtype=np.float32)
        if wav.shape[0] == 0:
            raise ValueError("cannot compute a mel spectrogram of empty audio")
        # np.pad reflects repeatedly when the clip is shorter than the padding; torch would refuse.
        padded = torch.from_numpy(np.pad(wav, (cfg.n_fft // 2, cfg.n_fft // 2), mode="reflect"))
        frames = padded.unfold(0, cfg.n_fft, cfg.hop).double()
        window = torch.hann_window(cfg.n_fft, periodic=True, dtype=torch.float64)
        spectrum = torch.fft.rfft(frames * window, dim=-1).to(torch.complex64)
        power = spectrum.abs() ** 2
        filters = _mel_filters(cfg)
        return power @ filters.T

    def partial_windows(self, num_frames: int) -> tuple[int, int]:
        """(number of partial windows, mel length they cover) for an utterance of ``num_frames``."""
        cfg = self.config
        assert num_frames > 0
        step, win = cfg.partial_step, cfg.partial_frames
        count, remainder = divmod(max(num_frames - win + step, 0), step)
        if count == 0 or (remainder + (win - step)) / win >= cfg.min_coverage:
            count += 1
        return count, win + step * (count - 1)

    def _partials(self, mel: torch.Tensor) -> torch.Tensor:
        count, target = self.partial_windows(mel.shape[0])
        if target > mel.shape[0]:
            mel = F.pad(mel, (0, 0, 0, target - mel.shape[0]))
        return mel[:target].unfold(0, self.config.partial_frames, self.config.partial_step)[:count].transpose(1, 2)

    # ---- network --------------------------------------------------------------------------

    def forward(self, partials: torch.Tensor) -> torch.Tensor:
        """(N, partial_frames, num_mels) mel windows -> (N, embed_size) L2-normalised embeddings."""
        _, (hidden, _) = self.lstm(partials)
        embeds = F.relu(self.proj(hidden[-1]))
        return embeds / torch.linalg.norm(embeds, dim=1, keepdim=True)

    @torch.inference_mode()
    def embed_utterances(self, wavs: Sequence[np.ndarray], *, max_batch: int = 256) -> torch.Tensor:
        """Embed each 16 kHz utterance: (len(wavs), embed_size) float32 on the model's device.

        Partial windows of every utterance run through the LSTM together, in batches of at
        most ``max_batch`` windows. Raises ``ValueError`` for an utterance that is empty after
        trimming.
        """
        cfg = self.config
        if len(wavs) == 0:
            raise ValueError("embed_utterances needs at least one waveform")
        per_utterance = []
        for i, wav in enumerate(wavs):
            wav = np.asarray(wav, dtype=np.float32)
            if cfg.trim_top_db is not None and wav.size:
                wav = trim_silence(wav, cfg.trim_top_db, cfg.trim_frame_length, cfg.trim_hop)
            if wav.size == 0:
                raise ValueError(f"utterance {i} is empty (or silent) and has no speaker embedding")
            per_utterance.append(self._partials(self.mel_spectrogram(wav)))
        counts = [p.shape[0] for p in per_utterance]
        partials = torch.cat(per_utterance).to(self.device)
        embeds = torch.cat([self(chunk) for chunk in partials.split(max_batch)])
        means = torch.stack([chunk.mean(dim=0) for chunk in embeds.split(counts)])
        return means / torch.linalg.norm(means, dim=1, keepdim=True)

    def embed_utterance(self, wav: np.ndarray) -> torch.Tensor:
        """Speaker embedding (embed_size,) of one 16 kHz utterance (the T3 ``speaker_emb``)."""
        return self.embed_utterances([wav])[0]


def _mel_filters(config: VoiceEncoderConfig) -> torch.Tensor:
    return mel_filterbank(config.sample_rate, config.n_fft, config.num_mels, config.fmin, config.fmax)

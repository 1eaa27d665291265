"""A pass's inputs, laid out on the host in a few tensor calls (docs/vocoder.md, "A pass's host
work"): the pass's rows grouped by voice prompt, the flow's noise (a stream's read from its tape
by absolute column, a non-streaming job's drawn from its generator as the exact path draws it),
the mel frames HiFT vocodes, gathered from the flow's output in one call, and HiFT's source
noise and phases.

``VocoderStage._run_pass`` calls these; a job's audio depends on its own tokens, voice and seed
only, whatever else is in the pass.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from chorus.models.s3gen.hift import SourceNoise, draw_source_noise
from chorus.models.s3gen.s3gen import S3Gen
from chorus.vocoder.job import SAMPLES_PER_FRAME, FlowWindow, Job, read_tapes
from chorus.vocoder.voice_cache import VoicePrompt

Generators = dict[str, tuple[torch.Generator, torch.Generator]]
"""A non-streaming job's generators by job id: (the flow's and HiFT's noise, HiFT's phases)."""


def rows_by_prompt(prompts: list[VoicePrompt]) -> list[tuple[VoicePrompt, slice | list[int]]]:
    """The pass's rows of each distinct prompt (by identity; the voice cache hands out one
    object per voice and cap): all rows as a slice when every row shares one prompt."""
    groups: dict[int, tuple[VoicePrompt, list[int]]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(id(p), (p, []))[1].append(i)
    if len(groups) == 1:
        return [(prompts[0], slice(None))]
    return list(groups.values())


def flow_columns(ratio: int, prompt: VoicePrompt, window: FlowWindow) -> tuple[tuple[int, int], tuple[int, int]]:
    """A stream's flow-noise column ranges for its pass (``2 (Tp + N)`` columns: prompt frames,
    then new frames; ``ratio``: mel frames per token), by absolute column of its noise tape, in
    the layout of the voice's whole prompt (``d`` tokens cut by ``prompt_tokens``): the prompt's
    ``[2 d, 2 (d + Tp))``, then the window's tokens' ``[2 (d + Tp + first_token), 2 (d + Tp + end))``."""
    start = ratio * prompt.dropped_tokens
    prompt_end = start + ratio * prompt.num_tokens
    return (start, prompt_end), (prompt_end + ratio * window.first_token, prompt_end + ratio * window.end)


def drawn_flow_noise(s3gen: S3Gen, generator: torch.Generator, prompt: VoicePrompt, num_tokens: int) -> torch.Tensor:
    """A non-streaming job's solver noise [80, 2 (Tp + N)] for ``num_tokens`` new tokens, drawn
    as ``FlowDecoder.inference`` draws it from the job's ``generator``."""
    ratio = s3gen.flow.config.token_mel_ratio
    total = ratio * (prompt.num_tokens + num_tokens)
    like = dict(generator=generator, device=s3gen.device, dtype=s3gen.dtype)
    if s3gen.flow.config.meanflow:
        new = torch.randn(1, 80, ratio * num_tokens, **like)[0]
        noise = torch.randn(1, 80, total, **like)[0]
        noise[:, ratio * prompt.num_tokens:] = new
        return noise
    return torch.randn(1, 80, total, **like)[0]


def gather_frames(mel: torch.Tensor, items: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> torch.Tensor:
    """Row ``r``: ``mel[items[r], :, starts[r]:starts[r] + counts[r]]``, zero-padded to the largest
    count (``[len(items), 80, max(counts)]``), in one gather."""
    width = int(counts.max())
    offsets = np.arange(width)
    valid = offsets < counts[:, None]
    index = np.where(valid, starts[:, None] + offsets, 0)
    device = mel.device
    index_d = torch.from_numpy(index).to(device)[:, None, :].expand(-1, mel.shape[1], -1)
    rows = mel[torch.from_numpy(items).to(device)]
    return torch.where(torch.from_numpy(valid).to(device)[:, None, :], torch.gather(rows, 2, index_d), 0.0)


def source_noise(s3gen: S3Gen, generators: Generators, jobs: list[Job], spans: list[tuple[int, int]],
                 width: int) -> SourceNoise:
    """HiFT's source draws for the pass's vocoded items (mel frames ``spans[i]`` of
    ``jobs[i]``), noise zero-padded to ``width`` samples. A stream's phases continue where the
    one-pass sine would be at its span's start, and its noise comes from its tape by absolute
    sample (all streams in one read); a non-streaming job draws both from its ``generators``."""
    device, config = s3gen.device, s3gen.mel2wav.config
    phases = np.zeros((len(jobs), config.num_harmonics), np.float32)
    harmonics = np.arange(1, config.num_harmonics + 1, dtype=np.float64)
    drawn = {}
    for i, (job, (start, end)) in enumerate(zip(jobs, spans)):
        if job.stream is None:
            p, n = generators[job.job_id][1], generators[job.job_id][0]
            drawn[i] = draw_source_noise([end - start], config, device, noise_generators=[n],
                                         phase_generators=[p])
            phases[i] = drawn[i].phases[0].cpu().numpy()
            continue
        stream = job.stream
        assert start == stream.hift_start
        cycles = stream.cycles * harmonics  # the fraction of a cycle each harmonic is into
        phases[i] = stream.phases + 2 * math.pi * (cycles - np.floor(cycles))
    streams = [i for i, job in enumerate(jobs) if job.stream is not None]
    tapes = None
    if streams:
        tapes = read_tapes(
            [jobs[i].stream.source_noise for i in streams],
            [((spans[i][0] * SAMPLES_PER_FRAME, spans[i][1] * SAMPLES_PER_FRAME),) for i in streams], width)
    if len(streams) == len(jobs):
        noise = tapes
    else:
        noise = torch.zeros(len(jobs), config.num_harmonics, width, device=device)
        if streams:
            noise[streams] = tapes
        for i, source in drawn.items():
            noise[i, :, :source.noise.shape[-1]] = source.noise[0]
    return SourceNoise(torch.from_numpy(phases).to(device), noise)

"""The vocoder stage: batched, streaming S3Gen (speech tokens -> 24 kHz audio) for many jobs.

Used from one thread (the pipeline's vocoder thread): ``add`` a job, ``push`` its tokens as T3
emits them, call ``step`` while ``has_work``; each step runs one batched pass (flow encoder,
flow-matching solver, HiFT) over jobs that have a window ready and returns their new audio.
See docs/vocoder.md for the windowing scheme and its measured error.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Sequence

import numpy as np
import torch

from chorus import faults
from chorus.models.s3gen.postprocess import apply_trim_fade_at
from chorus.models.s3gen.s3gen import SAMPLE_RATE, SAMPLES_PER_TOKEN, S3Gen, TokenRules, item_generators
from chorus.vocoder.batching import Candidate, PassCostModel, select_batch
from chorus.vocoder.config import AudioOut, VocoderConfig, VocoderStats
from chorus.vocoder.job import SAMPLES_PER_FRAME, FlowWindow, Job, NoiseTape, new_stream, raised_cosine, read_tapes
from chorus.vocoder.listeners import Listeners
from chorus.vocoder.pass_graphs import FlowCall, HiFTCall, PassGraphs
from chorus.vocoder.pass_inputs import drawn_flow_noise, flow_columns, gather_frames, rows_by_prompt, source_noise
from chorus.vocoder.voice_cache import VoiceCache, VoicePrompt, s3gen_part
from chorus.vocoder.warmup import warmup_shapes
from chorus.voices import S3GenPrompt, Voice

logger = logging.getLogger(__name__)


class VocoderStage:
    """Batched, streaming S3Gen for many concurrent jobs; see the module docstring."""

    def __init__(self, s3gen: S3Gen, config: VocoderConfig | None = None,
                 clock: Callable[[], float] = time.monotonic):
        """``clock`` orders passes by deadline (see ``Job.deadline``); tests may pass a fake one."""
        self.s3gen = s3gen
        self._clock = clock
        self.config = config or VocoderConfig()
        self.faults = faults.from_env()  # test-only fault injection (chorus/faults.py); None in use
        self.voices = VoiceCache(s3gen.flow, self.config.voice_cache_size, self.config.prompt_tokens)
        self._jobs: dict[str, Job] = {}
        self._listeners = Listeners()
        self._generators: dict[str, tuple[torch.Generator, torch.Generator]] = {}
        self._order = 0
        self._stats = VocoderStats()
        self.cost = PassCostModel()
        """Learned seconds per padded flow token and per HiFT frame (sizes passes, see ``max_pass_seconds``)."""
        self.expected_pass_seconds = 0.0
        """The predicted time of the pass under way (``cost``, learned from this stage's passes;
        0.0 between passes and before any was measured): a pass far past it is stuck, not busy
        (``Pipeline.stall``)."""
        s3gen.mel2wav.ops_backend = self.config.hift_ops
        s3gen.flow.decoder.estimator.ops_backend = self.config.flow_ops
        s3gen.flow.encoder.ops_backend = self.config.encoder_attention_ops
        self._graphs = PassGraphs(s3gen.flow, s3gen.mel2wav, enabled=self.config.cuda_graphs,
                                  max_graphs=self.config.max_pass_graphs, max_rows=self.config.max_graph_rows,
                                  capture_after=self.config.capture_after, cover_work=self.config.graph_cover_work,
                                  covered_capture_after=self.config.covered_capture_after, stats=self._stats,
                                  compile_hift=self.config.compile_hift)

    # ------------------------------------------------------------------------------- interface
    def add(self, job_id: str, voice: Voice | S3GenPrompt, *, seed: int, streaming: bool,
            n_steps: int | None = None, cfg_rate: float | None = None, priority: int = 1,
            rules: TokenRules | None = None, listener: str | None = None) -> None:
        """Register a job. ``seed`` fixes all its randomness; a job's audio never depends on
        the other jobs. ``n_steps``/``cfg_rate`` default to the variant's solver settings.
        ``priority`` (lower first) orders passes before deadlines do. ``rules``: what is done
        to the pushed tokens and the audio (default: the variant's, for T3 output; voice
        conversion passes ``TokenRules.verbatim()``). ``listener`` (streams only): streams added
        with the same key are heard one after another in the order they were added (a request's
        chunks, a voice-agent turn's pieces), so a later one is scheduled for when the audio
        before it runs out, not at once (``chorus.vocoder.listeners``); it never changes the
        audio. Only the voice's S3Gen part is used.
        Non-streaming jobs give their whole audio in one piece once final, equal to
        ``S3Gen.tokens_to_wav`` for the same tokens, rules and seed."""
        if job_id in self._jobs:
            raise ValueError(f"vocoder job {job_id!r} already exists")
        if not isinstance(voice, (Voice, S3GenPrompt)):
            raise TypeError(f"voice must be a Voice or an S3GenPrompt, got {type(voice).__name__}")
        if n_steps is not None and n_steps < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps}")
        cfg = self.config
        job = Job(job_id, s3gen_part(voice), int(seed), n_steps, cfg_rate, rules or self.s3gen.rules, self._order,
                  priority=int(priority), added_at=self._clock())
        self._order += 1
        if streaming:
            first_window = cfg.first_window_tokens
            if (listener is not None and cfg.follower_first_window_tokens is not None
                    and self._listeners.has_audio_ahead(listener, job.added_at)):
                first_window = cfg.follower_first_window_tokens
            job.stream = new_stream(job.seed, self.s3gen.device, self.s3gen.dtype,
                                    self.s3gen.mel2wav.config.num_harmonics, first_window)
            if listener is not None:
                self._listeners.join(listener, job)
        else:
            self._generators[job_id] = item_generators(job.seed, self.s3gen.device)
        self._jobs[job_id] = job

    def push(self, job_id: str, tokens: Sequence[int], *, final: bool = False) -> None:
        """Append raw T3 speech tokens (as the engine emits them); ``final=True`` when T3 is done."""
        job = self._jobs.get(job_id)
        if job is None:
            raise KeyError(f"unknown vocoder job {job_id!r}")
        if job.final:
            raise ValueError(f"vocoder job {job_id!r} was already pushed final")
        job.accept([int(t) for t in tokens])
        job.final = bool(final)
        if job.final:
            job.final_at = self._clock()

    def step(self) -> list[AudioOut]:
        """One batched pass over jobs with a window ready (or a finished non-streaming job).
        Jobs without usable tokens finish here without a pass. Returns the pieces produced."""
        hold = self.config.holdback_tokens
        out = [self._finish_empty(job) for job in list(self._jobs.values())
               if job.final and not job.next_pass(hold)[0]]
        ready = [job for job in self._jobs.values() if job.is_ready(hold)]
        if not ready:
            return out
        batch = self._select(ready)
        start = time.perf_counter()
        try:
            poison = self.faults is not None and self.faults.check("vocoder_pass")  # tests only
            pieces, broken = self._run_pass(batch)
            out += self._finite(pieces, broken, poison)
        except Exception as exc:  # one bad pass fails its own jobs only
            logger.exception("vocoder pass over %d job(s) failed", len(batch))
            self._stats.failed_passes += 1
            for job, _, _ in batch:
                self._forget(job.job_id)
                out.append(AudioOut(job.job_id, torch.zeros(0), final=True,
                                    error=f"{type(exc).__name__}: {exc}"))
        self._stats.total_seconds += time.perf_counter() - start
        self.expected_pass_seconds = 0.0
        return out

    def abort(self, job_id: str) -> None:
        """Drop everything held for the job at once (unknown or finished ids are ignored)."""
        self._forget(job_id)

    def has_work(self) -> bool:
        """True while a call to :meth:`step` would produce something."""
        hold = self.config.holdback_tokens
        return any(job.is_ready(hold) for job in self._jobs.values())

    def capture_while_idle(self) -> bool:
        """Capture one CUDA graph that a covered shape is due (``VocoderConfig.covered_capture_after``)
        if the stage holds no job, so that no stream waits for it; call from the stage's thread
        when it has nothing else to do. True when a graph was captured. Only passes make a shape
        due, so this captures nothing while :meth:`warmup` runs on another thread before serving."""
        return not self._jobs and self._graphs.capture_due()

    def has_job(self, job_id: str) -> bool:
        return job_id in self._jobs

    def is_ready(self, job_id: str) -> bool:
        """Whether the job has a pass ready (a window's tokens, or its last ones)."""
        job = self._jobs.get(job_id)
        return job is not None and job.is_ready(self.config.holdback_tokens)

    @property
    def stats(self) -> VocoderStats:
        """Cumulative counters and timings (the live object; copy it to keep a snapshot)."""
        return self._stats

    @property
    def graphs(self) -> PassGraphs:
        """The pass's model calls (CUDA graphs on a GPU, see ``warmup``)."""
        return self._graphs

    def warmup(self, *, prompt_tokens: int | None = None, chunk_tokens: int = 240,
               whole_chunk_tokens: int | None = None, max_items: int | None = None,
               n_steps: int | None = None, cfg_rate: float | None = None, time_budget_s: float = 60.0) -> int:
        """Compile the noise-tape kernel (on CUDA) and HiFT's decoder (with ``compile_hift`` on),
        and capture the CUDA graphs of the shapes common passes need, so the first requests pay
        for none of them; call once at startup, before serving. Captures nothing (returns 0) on
        the CPU or with ``cuda_graphs`` off; returns the graphs captured. The compiles come first
        and are not counted in ``time_budget_s`` (they must happen before serving whatever they
        cost).

        Shapes (:func:`chorus.vocoder.warmup.warmup_shapes`): streaming passes over a voice prompt of ``prompt_tokens``
        (default: the variant's S3Gen prompt length, 10 s = 250 tokens, or
        ``VocoderConfig.prompt_tokens`` if smaller) plus at most ``chunk_tokens`` new tokens (under
        the default left-context cap a stream's passes read at most prompt + 215 tokens, inside
        these buckets with the default 240), at row buckets 1, 2, 4, ... up to ``max_items``
        (default ``max_batch_items``, at most ``max_graph_rows``); then, with
        ``whole_chunk_tokens``, non-streaming passes of whole chunks of up to that many tokens at
        the two largest row buckets (batch work, where every chunk is submitted at once, vocodes
        them 16-32 at a time). With the variant's solver settings unless ``n_steps``/``cfg_rate``
        are given. Captures stop once ``time_budget_s`` seconds have passed (a capture already
        started finishes) or ``max_pass_graphs`` graphs of a kind are held, so warm-up never
        evicts its own graphs.
        """
        graphs, cfg = self._graphs, self.config
        self._read_each_tape_kind()
        if graphs.hift_runner.compiled:
            logger.info("compiled HiFT's decoder in %.1f s", graphs.hift_runner.compile())
        if not graphs.active:
            return 0
        settings = self.s3gen.variant.s3gen
        if prompt_tokens is None:
            prompt_tokens = int(self.s3gen.variant.s3gen_prompt_seconds * SAMPLE_RATE / SAMPLES_PER_TOKEN)
            if cfg.prompt_tokens is not None:
                prompt_tokens = min(prompt_tokens, cfg.prompt_tokens)
        n_steps = settings.flow_steps if n_steps is None else n_steps
        cfg_rate = settings.cfg_rate if cfg_rate is None else cfg_rate
        most = min(cfg.max_batch_items if max_items is None else max_items, cfg.max_graph_rows)
        shapes = warmup_shapes(cfg, self.s3gen.flow.config.token_mel_ratio, prompt_tokens, chunk_tokens,
                               whole_chunk_tokens, most, self.s3gen.variant.append_silence_tokens)
        plan = [(graphs.hift_graphs, graphs.prepare_hift, shape) if kind == "hift"
                else (graphs.flow_graphs, graphs.prepare_flow, (*shape, n_steps, cfg_rate))
                for kind, shape in shapes]
        libraries = (graphs.flow_graphs, graphs.hift_graphs)
        failed_before = sum(library.failures for library in libraries)
        started, captured = time.perf_counter(), 0
        for library, prepare, args in plan:
            if time.perf_counter() - started >= time_budget_s:
                break
            if len(library.keys) < cfg.max_pass_graphs:
                captured += prepare(*args)
        logger.log(logging.INFO if captured else logging.DEBUG, "vocoder warm-up captured %d graphs in %.1f s",
                   captured, time.perf_counter() - started)
        failed = sum(library.failures for library in libraries) - failed_before
        if failed:
            logger.warning("vocoder warm-up: %d of %d shapes could not be captured and will run eagerly (the "
                           "warnings above say why; where it is out of memory, leave the vocoder more: a lower "
                           "gpu_memory_utilization or kv_cache_bytes)", failed, len(plan))
        return captured

    # -------------------------------------------------------------------------------- internals
    def _read_each_tape_kind(self) -> None:
        """One read of a stream's flow-noise tape and of its source-noise tape: on CUDA this
        compiles the tape kernel's two variants (rows and dtype differ) before serving."""
        device = self.s3gen.device
        flow_noise = NoiseTape(self.s3gen.flow.config.mel_bins, 0, device, self.s3gen.dtype)
        source_noise = NoiseTape(self.s3gen.mel2wav.config.num_harmonics, 0, device)
        for tape in (flow_noise, source_noise):
            read_tapes([tape], [((0, 1),)], 1)

    def _forget(self, job_id: str, *, finished: bool = False) -> None:
        """Drop a job: ``finished`` when its last audio has just been sent (its listener hears
        all of it), not when it was aborted or failed."""
        self._jobs.pop(job_id, None)
        self._generators.pop(job_id, None)
        self._listeners.leave(job_id, finished=finished)

    def _finite(self, pieces: list[AudioOut], broken: set[str], poison: bool) -> list[AudioOut]:
        """NaN or inf audio is never sent: the pieces of ``broken`` jobs (whose pass audio was not
        finite) fail their own jobs, the others go on. ``poison``: a test's fault rule breaks the
        job of the first non-empty piece."""
        if poison:
            broken = broken | {next((p.job_id for p in pieces if p.samples.numel()), None)}
        for i, piece in enumerate(pieces):
            if piece.job_id in broken:
                logger.error("vocoder job %s produced non-finite audio; failing it", piece.job_id)
                self._forget(piece.job_id)
                pieces[i] = AudioOut(piece.job_id, torch.zeros(0), final=True, error="non-finite (NaN) audio")
        return pieces

    def _finish_empty(self, job: Job) -> AudioOut:
        self._forget(job.job_id, finished=True)
        return AudioOut(job.job_id, torch.zeros(0), final=True)

    def _solver_key(self, job: Job) -> tuple[int, float]:
        settings = self.s3gen.variant.s3gen
        return (settings.flow_steps if job.n_steps is None else job.n_steps,
                settings.cfg_rate if job.cfg_rate is None else float(job.cfg_rate))

    def _select(self, ready: list[Job]) -> list[tuple[Job, VoicePrompt, FlowWindow]]:
        """The next pass's jobs, each with its voice prompt and flow window (worked out once,
        here, and read again by ``_run_pass``)."""
        cfg = self.config
        now = self._clock()
        leads = self._listeners.leads(now)
        margin = cfg.playback_margin_s
        ready.sort(key=lambda j: (j.priority, j.deadline(margin, leads.get(j.job_id)), j.order))  # then earliest deadline
        ratio = self.s3gen.flow.config.token_mel_ratio
        candidates, inputs = [], []
        for i, job in enumerate(ready):
            prompt = self.voices.get(job.voice, self._prompt_cap(job))
            window = self._flow_window(job, prompt)
            frames = ratio * window.end - (job.stream.hift_start if job.stream is not None else 0)  # HiFT's
            candidates.append(Candidate(i, prompt.num_tokens + len(window.tokens), self._solver_key(job), frames))
            inputs.append((job, prompt, window))
        chosen = select_batch(candidates, cfg.max_batch_items, cfg.max_batch_tokens, cfg.batching,
                              self.cost, self._pass_budget(now, leads))
        self.expected_pass_seconds = self.cost.predict(len(chosen) * max(candidates[i].length for i in chosen),
                                                       sum(candidates[i].frames for i in chosen))
        return [inputs[i] for i in chosen]

    def _prompt_cap(self, job: Job) -> int | None:
        """The prompt cap of the job's next pass beyond ``prompt_tokens``: a stream's
        ``first_window_prompt_tokens`` until a pass of it has emitted (its first, unless that one
        settled no frame), else None. A function of the job's windows, so the audio still depends
        only on the tokens."""
        stream = job.stream
        return self.config.first_window_prompt_tokens if stream is not None and not stream.passes else None

    def _pass_budget(self, now: float, leads: dict[str, float]) -> float | None:
        """Seconds a pass may take while streams are running: ``max_pass_seconds``, or less (down
        to half of it) when a playing stream would run out of audio sooner (``leads``: its
        listener's, ``Listeners.leads(now)``). None (no limit) without streams or without
        ``max_pass_seconds``."""
        limit = self.config.max_pass_seconds
        if limit is None:
            return None
        streams = [job for job in self._jobs.values() if job.stream is not None]
        if not streams:
            return None
        runs_out = (job.runs_out_at(leads.get(job.job_id)) for job in streams)
        slack = [t - now for t in runs_out if t is not None]
        # a stream with less in hand than half a pass cannot be saved by a smaller pass, and
        # passes of a few items would starve every other stream (measured: at 256 streams a
        # budget that followed the slack down shrank passes to single items and every stream stalled)
        return min([limit] + [max(s, limit / 2) for s in slack])

    @torch.inference_mode()
    def _run_pass(self, picked: list[tuple[Job, VoicePrompt, FlowWindow]]) -> tuple[list[AudioOut], set[str]]:
        """One batched pass: the pieces it produced, and the ids of jobs whose audio came out
        not finite (for :meth:`_finite`).

        Its host work is laid out in numpy and made of a few tensor calls per pass, not per
        item: on a server each tensor call hands the GIL to T3's thread (docs/vocoder.md,
        "A pass's host work"); per item there are only slices and numpy arithmetic."""
        s3gen, device = self.s3gen, self.s3gen.device
        flow, stats = s3gen.flow, self._stats
        ratio = flow.config.token_mel_ratio
        jobs, prompts, windows = (list(column) for column in zip(*picked))
        n_steps, cfg_rate = self._solver_key(jobs[0])
        lengths = np.array([p.num_tokens + len(w.tokens) for p, w in zip(prompts, windows)])
        width, batch = int(lengths.max()), len(jobs)
        stats.padded_tokens += batch * width
        stats.real_tokens += int(lengths.sum())

        # The flow's inputs, laid out as FlowDecoder.inference lays them: prompt then new tokens,
        # the prompt mel as the condition of its frames, each item's noise over its frames.
        host_tokens = np.zeros((batch, width), np.int64)
        for i, (p, w) in enumerate(zip(prompts, windows)):
            host_tokens[i, :p.num_tokens] = p.host_tokens
            host_tokens[i, p.num_tokens:lengths[i]] = w.tokens
        cond = torch.zeros(batch, 80, ratio * width, device=device, dtype=flow.dtype)
        for p, rows in rows_by_prompt(prompts):
            cond[rows, :, :p.mel_frames] = p.cond
        streams = [i for i, job in enumerate(jobs) if job.stream is not None]
        stream_noise = None
        if streams:  # every stream's noise from its tape in one read
            stream_noise = read_tapes([jobs[i].stream.flow_noise for i in streams],
                                      [flow_columns(ratio, prompts[i], windows[i]) for i in streams], ratio * width)
        if len(streams) == batch:
            noise = stream_noise
        else:
            noise = torch.zeros_like(cond)
            if streams:
                noise[streams] = stream_noise
            for i, (job, p) in enumerate(zip(jobs, prompts)):
                if job.stream is None:
                    noise[i, :, :ratio * lengths[i]] = drawn_flow_noise(s3gen, self._generators[job.job_id][0], p,
                                                                          len(windows[i].tokens))
        speaker = torch.stack([p.speaker for p in prompts])
        call = FlowCall(torch.from_numpy(host_tokens).to(device), torch.from_numpy(lengths).to(device), cond, noise,
                        speaker, n_steps, cfg_rate)
        timer = _PassTimer(device)
        mel = self._graphs.run_flow(call)
        timer.mark()

        # Item i's pass starts at its job's frame `frame_offset` (the left-context cap); its new
        # frames start where its prompt mel ends (odd prompt mels: see FlowDecoder).
        new_frames = [ratio * int(n) - p.mel_frames for n, p in zip(lengths, prompts)]
        spans = [self._hift_span(job, w.frame_offset + f, w.final) for job, f, w in zip(jobs, new_frames, windows)]
        vocode = [i for i, (a, b) in enumerate(spans) if b > a]
        wav = f0 = None
        broken: set[str] = set()
        if vocode:
            counts = np.array([spans[i][1] - spans[i][0] for i in vocode])
            starts = np.array([prompts[i].mel_frames + spans[i][0] - windows[i].frame_offset for i in vocode])
            hift_mel = gather_frames(mel, np.array(vocode), starts, counts)
            source = source_noise(s3gen, self._generators, [jobs[i] for i in vocode], [spans[i] for i in vocode],
                                  SAMPLES_PER_FRAME * int(counts.max()))
            wav, f0 = self._graphs.run_hift(HiFTCall(hift_mel, torch.from_numpy(counts).to(device), source))
            timer.mark()
            wav, f0 = wav.cpu().numpy(), f0.cpu().numpy()  # waits for the pass
            finite = np.isfinite(wav) | (np.arange(wav.shape[1]) >= SAMPLES_PER_FRAME * counts[:, None])
            broken = {jobs[i].job_id for i, ok in zip(vocode, finite.all(axis=1)) if not ok}
        flow_seconds, hift_seconds = timer.seconds()

        out, rows = [], {i: r for r, i in enumerate(vocode)}
        for i, job in enumerate(jobs):
            start, end = spans[i]
            piece = wav[rows[i], :(end - start) * SAMPLES_PER_FRAME] if i in rows else np.zeros(0, np.float32)
            if job.stream is None:
                limit = job.sample_limit(windows[i].end)
                samples = piece[:limit].copy()
                apply_trim_fade_at(samples, 0)
                out.append(AudioOut(job.job_id, torch.from_numpy(samples), final=True))
                self._forget(job.job_id)
            elif i in rows or windows[i].final:
                f0_row = f0[rows[i], :end - start] if i in rows else np.zeros(0, np.float32)
                piece_out = self._emit(job, piece, start, end, f0_row, windows[i].end, windows[i].final)
                if piece_out is not None:
                    out.append(piece_out)
            else:  # no settled frames yet (a prompt mel longer than 2 Tp): a larger window
                self._advance_window(job.stream)
        stats.passes += 1
        stats.items += len(jobs)
        stats.flow_seconds += flow_seconds
        stats.hift_seconds += hift_seconds
        self.cost.observe(batch * width, sum(b - a for a, b in spans), flow_seconds, hift_seconds)
        stats.audio_seconds += sum(o.samples.shape[0] for o in out) / SAMPLE_RATE
        return out, broken

    def _flow_window(self, job: Job, prompt: VoicePrompt) -> FlowWindow:
        """The job's next flow input (its left-context cap applied to a stream)."""
        ratio = self.s3gen.flow.config.token_mel_ratio
        return job.flow_window(self.config.holdback_tokens, self.config.stream_context_tokens,
                               prompt.mel_frames - ratio * prompt.num_tokens)

    def _hift_span(self, job: Job, frames: int, final: bool) -> tuple[int, int]:
        """Mel frames ``[start, end)`` this pass vocodes for the job."""
        stream = job.stream
        if stream is None:
            return 0, frames
        end = frames if final else frames - 2 * self.config.holdback_tokens
        return stream.hift_start, end if end > stream.mel_end else stream.hift_start

    def _emit(self, job: Job, piece: np.ndarray, start: int, end: int, f0: np.ndarray,
              num_tokens: int, final: bool) -> AudioOut | None:
        """Cross-fade the pass's audio into the stream, send what is settled, hold the rest."""
        cfg, stream = self.config, job.stream
        a0, a1 = start * SAMPLES_PER_FRAME, end * SAMPLES_PER_FRAME
        assert a0 <= stream.sent <= a1, (a0, stream.sent, a1)
        audio = piece[stream.sent - a0:].copy()
        held = stream.tail.shape[0]
        if held:
            fade_in, fade_out = raised_cosine(held)
            audio[:held] = stream.tail * fade_out + audio[:held] * fade_in
        limit = a1 if final else a1 - cfg.crossfade_frames * SAMPLES_PER_FRAME
        cap = job.sample_limit(num_tokens)
        if cap is not None:
            limit = min(limit, cap)
        limit = max(limit, stream.sent)
        samples = audio[:limit - stream.sent]
        apply_trim_fade_at(samples, stream.sent)
        stream.tail = audio[limit - stream.sent:]
        if stream.first_sent_at is None and samples.shape[0]:
            stream.first_sent_at = self._clock()
        stream.sent, stream.mel_end, stream.passes = limit, end, stream.passes + 1
        if final:
            self._forget(job.job_id, finished=True)
            return AudioOut(job.job_id, torch.from_numpy(samples), final=True)
        # The next pass re-reads HiFT context from here; carry the harmonic phase up to it.
        next_start = max(stream.hift_start, min(end - cfg.hift_context_frames, limit // SAMPLES_PER_FRAME))
        used = f0[:next_start - start].astype(np.float64)
        stream.cycles += float(used.sum()) * SAMPLES_PER_FRAME / self.s3gen.mel2wav.config.sample_rate
        stream.hift_start = next_start
        self._advance_window(stream)
        return AudioOut(job.job_id, torch.from_numpy(samples), final=False) if samples.shape[0] else None

    def _advance_window(self, stream) -> None:
        stream.next_window = self.config.next_window(stream.next_window)
        stream.next_threshold += stream.next_window


class _PassTimer:
    """Device time of a pass's parts: CUDA events on the current stream (read once the pass's
    output has been copied back, so no extra synchronisation), host time on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = [self._now()]

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def mark(self) -> None:
        self.marks.append(self._now())

    def seconds(self) -> tuple[float, float]:
        """Seconds of the flow and of HiFT (0 when HiFT did not run)."""
        if self.cuda:
            self.marks[-1].synchronize()
            spans = [a.elapsed_time(b) / 1000 for a, b in zip(self.marks, self.marks[1:])]
        else:
            spans = [b - a for a, b in zip(self.marks, self.marks[1:])]
        spans += [0.0] * (2 - len(spans))
        return spans[0], spans[1]

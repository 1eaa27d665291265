"""Who hears which streams, and so when each stream's audio is needed.

A *listener* hears its streams one after another, in the order they were added to the stage: a
streamed request's chunks, a voice-agent turn's pieces (each its own request). A stream after
the first is not needed the moment it is added: its listener is still hearing the audio before
it, so its first window is due only when that audio runs out, and once it has audio out, its
own audio plays from then, not from the moment it left the stage. Earliest-deadline-first
scheduling (``VocoderStage``, ``Job.deadline``) gets these times from here, so a later piece
no longer competes with a new stream's first window as if its listener were waiting for it.

The audio of a listener's streams leaves as fast as it is made and is played at 1x from its first
sample, the model of the player that the stage's deadlines use throughout (a listener that
buffers more only has more in hand).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from chorus.vocoder.job import Job


@dataclass
class _Listener:
    jobs: list[Job] = field(default_factory=list)  # its streams not yet heard to the end, in order
    finished: set[str] = field(default_factory=set)  # of those, the ones whose last audio has left
    heard_until: float | None = None  # when it runs out of the audio of the streams before ``jobs``


class Listeners:
    """The stage's listeners and their streams (one writer: the stage's thread)."""

    def __init__(self) -> None:
        self._by_key: dict[str, _Listener] = {}
        self._key_of: dict[str, str] = {}  # job id -> its listener's key

    def join(self, key: str, job: Job) -> None:
        """``job`` (a stream) is heard after the listener's streams added before it."""
        assert job.stream is not None, "only streams have listeners"
        assert job.job_id not in self._key_of, job.job_id
        self._by_key.setdefault(key, _Listener()).jobs.append(job)
        self._key_of[job.job_id] = key

    def has_audio_ahead(self, key: str, now: float) -> bool:
        """Whether a stream joining listener ``key`` now would have audio ahead of it to be
        heard first (a stream before it still in the stage, or audio not yet heard)."""
        listener = self._by_key.get(key)
        return listener is not None and (bool(listener.jobs) or
                                         (listener.heard_until is not None and listener.heard_until > now))

    def leave(self, job_id: str, *, finished: bool) -> None:
        """A stream leaves the stage: ``finished`` (its last audio sent: the listener hears all of
        it, after the streams before it) or not (aborted or failed: it is dropped)."""
        key = self._key_of.pop(job_id, None)
        if key is None:
            return
        listener = self._by_key[key]
        if finished:
            listener.finished.add(job_id)
        else:
            listener.jobs = [job for job in listener.jobs if job.job_id != job_id]
        while listener.jobs and listener.jobs[0].job_id in listener.finished:  # heard in full from here on
            job = listener.jobs.pop(0)
            listener.finished.discard(job.job_id)
            runs_out = job.runs_out_at(listener.heard_until)
            if runs_out is not None:
                listener.heard_until = runs_out

    def leads(self, now: float) -> dict[str, float]:
        """Per stream with earlier audio to be heard before its own, when that runs out (stage
        clock; ``math.inf`` behind a stream that has sent nothing yet, which is heard first).
        Streams first in line with nothing before them are not listed. Listeners with no stream
        left whose audio has run out are dropped here."""
        for key in [key for key, listener in self._by_key.items()
                    if not listener.jobs and (listener.heard_until is None or listener.heard_until <= now)]:
            del self._by_key[key]
        leads: dict[str, float] = {}
        for listener in self._by_key.values():
            lead = listener.heard_until
            for job in listener.jobs:
                if lead is not None:
                    leads[job.job_id] = lead
                runs_out = job.runs_out_at(lead)
                lead = math.inf if runs_out is None else runs_out
        return leads

    def __len__(self) -> int:
        return len(self._by_key)

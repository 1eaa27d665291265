"""Requests and their sequences, as the T3 engine sees them.

A ``Request`` owns one ``Sequence`` (a row of the batch), or two for a CFG request: the
conditional row and the unconditional row (text embeddings zeroed). The two rows have the same
length, advance in lockstep, share their generated tokens and are admitted, scheduled,
preempted and freed as one unit.

Every position of a sequence has a **position key**, an unsigned 64-bit int ``kind << 32 |
value`` (see ``position_key``). Keys are what the prefix cache hashes (a block's hash is the
chain of its parent's hash and its ``block_size`` keys), so two positions may share KV only if
their keys and everything before them are equal:

- conditioning positions: ``COND | index``. They are embeddings, not tokens; their identity is
  the request's ``cond_key`` (variant, voice content hash, exaggeration), which seeds the hash
  chain (``block_pool.root_hash``), so no block is ever shared across conditionings.
- text positions: ``TEXT | token id`` on the conditional row, ``UNCOND_TEXT | token id`` on the
  unconditional row (its KV differs, so it must hash differently).
- speech positions (BOS copies, then generated tokens): ``SPEECH | token id``.
"""
from __future__ import annotations

import enum
import heapq
import itertools
import time
from dataclasses import dataclass
from typing import Any

from chorus.models.variants import T3Config


class PositionKind(enum.IntEnum):
    COND = 1
    TEXT = 2
    UNCOND_TEXT = 3
    SPEECH = 4


def position_key(kind: PositionKind, value: int) -> int:
    """Pack a position's kind and value (token id, or index inside the conditioning)."""
    assert 0 <= value < 1 << 32, value
    return (int(kind) << 32) | value


_SPEECH_KEY = position_key(PositionKind.SPEECH, 0)


def split_key(key: int) -> tuple[PositionKind, int]:
    return PositionKind(key >> 32), key & 0xFFFFFFFF


def conditioning_key(variant: str, voice_hash: str, exaggeration: float) -> bytes:
    """Cache identity of a conditioning prefix: equal keys must mean equal conditioning
    embeddings. ``voice_hash`` is the voice's content hash; the float is encoded exactly."""
    return f"{variant}|{voice_hash}|{float(exaggeration).hex()}".encode()


def conditioning_length(t3: T3Config, num_prompt_speech_tokens: int) -> int:
    """Number of conditioning positions: speaker (+ emotion) plus either the perceiver's
    queries (original/multilingual: 34 in all) or the prompt speech tokens (turbo/nano: 1+P)."""
    prompt = t3.perceiver_queries if t3.use_perceiver else num_prompt_speech_tokens
    return t3.cond_len_without_prompt + prompt


class Priority(enum.IntEnum):
    HIGH = 0
    NORMAL = 1
    LOW = 2


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue; generated tokens kept
    FINISHED = "finished"


class FinishReason(enum.Enum):
    EOS = "eos"
    LENGTH = "length"
    ABORTED = "aborted"
    DEADLINE = "deadline"
    ERROR = "error"


class Branch(enum.Enum):
    COND = "cond"
    UNCOND = "uncond"


_TRANSITIONS = {
    RequestStatus.WAITING: {RequestStatus.RUNNING, RequestStatus.FINISHED},
    RequestStatus.RUNNING: {RequestStatus.PREEMPTED, RequestStatus.FINISHED},
    RequestStatus.PREEMPTED: {RequestStatus.RUNNING, RequestStatus.FINISHED},
    RequestStatus.FINISHED: set(),
}


@dataclass(frozen=True)
class T3Prompt:
    """The prefill of one request: ``cond_len`` conditioning embeddings, the text token ids as
    the model is fed them (framed with SOT/EOT where the variant frames text), then
    ``bos_copies`` BOS tokens. ``cfg`` asks for the unconditional row as well."""

    cond_key: bytes
    cond_len: int
    text_ids: tuple[int, ...]
    bos_token: int
    eos_token: int
    bos_copies: int = 1
    cfg: bool = False

    def __post_init__(self):
        if self.cond_len < 1:
            raise ValueError(f"cond_len must be >= 1, got {self.cond_len}")
        if not self.text_ids:
            raise ValueError("the prompt has no text tokens")
        if self.bos_copies < 1:
            raise ValueError(f"bos_copies must be >= 1, got {self.bos_copies}")

    @classmethod
    def for_variant(
        cls, t3: T3Config, *, cond_key: bytes, cond_len: int, text_ids, cfg: bool = False
    ) -> T3Prompt:
        """Build a prompt from tokenizer output (``text_ids`` unframed): frames the text with
        SOT/EOT as the model does (original/multilingual), takes the variant's BOS/EOS ids and
        BOS copies; rejects CFG where the variant has no unconditional path."""
        if cfg and not t3.supports_cfg:
            raise ValueError("this variant does not support CFG (cfg_weight must be 0)")
        framed = tuple(int(t) for t in text_ids)
        if t3.start_text_token is not None:
            framed = (t3.start_text_token, *framed, t3.stop_text_token)
        return cls(
            cond_key=cond_key, cond_len=cond_len, text_ids=framed,
            bos_token=t3.start_speech_token, eos_token=t3.stop_speech_token,
            bos_copies=t3.bos_copies, cfg=cfg,
        )

    @property
    def num_tokens(self) -> int:
        return self.cond_len + len(self.text_ids) + self.bos_copies

    @property
    def text_start(self) -> int:
        return self.cond_len

    @property
    def speech_start(self) -> int:
        """Position of the first BOS copy."""
        return self.cond_len + len(self.text_ids)

    def position_keys(self, branch: Branch) -> list[int]:
        text_kind = PositionKind.TEXT if branch is Branch.COND else PositionKind.UNCOND_TEXT
        return (
            [position_key(PositionKind.COND, i) for i in range(self.cond_len)]
            + [position_key(text_kind, t) for t in self.text_ids]
            + [position_key(PositionKind.SPEECH, self.bos_token)] * self.bos_copies
        )


class Sequence:
    """One row: its position keys (prompt, then generated tokens), how many positions have KV
    in the cache, and the memoised hash chain of its full blocks (keys only ever grow, so the
    chain stays valid across preemptions).

    The generated tokens are the request's ``output_tokens`` list, shared by both rows of a CFG
    pair; a row's keys past the prompt are derived from it, not stored again."""

    def __init__(self, request_id: str, branch: Branch, prompt: T3Prompt, output_tokens: list[int]):
        self.request_id = request_id
        self.branch = branch
        self.seq_id = f"{request_id}/{branch.value}"
        self.cond_key = prompt.cond_key
        self.prompt_keys: list[int] = prompt.position_keys(branch)
        self.num_prompt_tokens = len(self.prompt_keys)
        self.output_tokens = output_tokens
        self.num_computed_tokens = 0
        self.block_hashes: list[bytes] = []

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_tokens)

    @property
    def keys(self) -> list[int]:
        return self.keys_between(0, self.num_tokens)

    def keys_between(self, start: int, end: int) -> list[int]:
        """Position keys of positions ``[start, end)``."""
        p = self.num_prompt_tokens
        if start >= p:  # generated tokens only (every block past the prompt)
            return [_SPEECH_KEY | t for t in self.output_tokens[start - p:end - p]]
        keys = self.prompt_keys[start:min(end, p)]
        if end > p:
            keys += [_SPEECH_KEY | t for t in self.output_tokens[:end - p]]
        return keys

    def __repr__(self) -> str:
        return f"Sequence({self.seq_id}, tokens={self.num_tokens}, computed={self.num_computed_tokens})"


_arrivals = itertools.count()


class Request:
    """One T3 generation: prompt, limits, scheduling attributes and state.

    ``sampling`` and ``conditioning`` are opaque here (the sampler's parameters and the voice's
    conditioning tensors, read by the model runner). ``deadline`` is an absolute time on the
    scheduler's clock (``time.monotonic`` by default), or None.
    """

    def __init__(
        self, request_id: str, prompt: T3Prompt, *, sampling: Any = None,
        conditioning: Any = None, priority: Priority | int = Priority.NORMAL,
        arrival_time: float | None = None, deadline: float | None = None,
        max_tokens: int = 1000, min_tokens: int = 0, ignore_eos: bool = False,
    ):
        if priority not in tuple(Priority):
            raise ValueError(f"priority must be 0 (high), 1 (normal) or 2 (low), got {priority!r}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 0 <= min_tokens <= max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={max_tokens}], got {min_tokens}")
        self.request_id = request_id
        self.prompt = prompt
        self.sampling = sampling
        self.conditioning = conditioning
        self.priority = Priority(priority)
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.arrival_order = next(_arrivals)  # FIFO tie-break within a priority level
        self.deadline = deadline
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.ignore_eos = ignore_eos
        self.output_tokens: list[int] = []
        branches = (Branch.COND, Branch.UNCOND) if prompt.cfg else (Branch.COND,)
        self.sequences = tuple(Sequence(request_id, b, prompt, self.output_tokens) for b in branches)
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.num_preemptions = 0

    @property
    def num_rows(self) -> int:
        return len(self.sequences)

    @property
    def num_tokens(self) -> int:
        """Positions per row: prompt plus generated tokens."""
        return self.sequences[0].num_tokens

    @property
    def num_computed_tokens(self) -> int:
        # both rows of a CFG pair advance together (checked by Scheduler.check_invariants)
        return self.sequences[0].num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def max_total_tokens(self) -> int:
        """Positions per row at the longest: prompt plus ``max_tokens``."""
        return self.prompt.num_tokens + self.max_tokens

    def append_output(self, token: int) -> None:
        """Append a generated token (to every row: they share ``output_tokens``)."""
        assert 0 <= token < 1 << 32, token
        self.output_tokens.append(token)

    def set_status(self, status: RequestStatus) -> None:
        assert status in _TRANSITIONS[self.status], f"{self.request_id}: {self.status} -> {status}"
        self.status = status

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        self.set_status(RequestStatus.FINISHED)
        self.finish_reason = reason
        self.error = error

    def sort_key(self) -> tuple[int, int]:
        """Scheduling order: higher priority first, then earlier arrival."""
        return (int(self.priority), self.arrival_order)

    def __repr__(self) -> str:
        return (f"Request({self.request_id}, {self.status.value}, prio={self.priority.name}, "
                f"rows={self.num_rows}, tokens={self.num_tokens}, out={len(self.output_tokens)})")


class RequestQueue:
    """Waiting requests ordered by ``Request.sort_key`` (priority level, then FIFO). A
    preempted request keeps its arrival order, so it goes back ahead of later arrivals."""

    def __init__(self):
        self._heap: list[tuple[tuple[int, int], Request]] = []

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.sort_key(), request))

    def peek(self) -> Request | None:
        return self._heap[0][1] if self._heap else None

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[1]

    def remove(self, request: Request) -> bool:
        for i, (_, r) in enumerate(self._heap):
            if r is request:
                self._heap[i] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return True
        return False

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        """Requests in scheduling order."""
        return iter([r for _, r in sorted(self._heap, key=lambda e: e[0])])

"""Whether a request could ever run under the engine's configuration: checked once, when the
scheduler is given the request, before anything is queued or allocated (``Scheduler.add_request``).

A request that fails here never would fit, however long it waited: longer than ``max_model_len``,
larger than the whole KV pool, too long for the token budget without chunked prefill, or a CFG
pair where a step holds one row. The message says which limit and what to change.
"""
from __future__ import annotations

from chorus.engine.config import SchedulerConfig
from chorus.engine.kv_cache_manager import KVCacheManager
from chorus.engine.request import Request


class AdmissionError(ValueError):
    """The request can never run under this configuration; it was not queued."""


def check_admissible(request: Request, config: SchedulerConfig, kv: KVCacheManager) -> None:
    """Raise ``AdmissionError`` if ``request`` could never run under ``config`` with ``kv``'s pool."""
    p, cfg = request.prompt, config
    total = request.max_total_tokens()
    if total > cfg.max_model_len:
        raise AdmissionError(
            f"request {request.request_id!r}: the prompt has {p.num_tokens} positions "
            f"({p.cond_len} conditioning + {len(p.text_ids)} text + {p.bos_copies} BOS) and "
            f"max_tokens is {request.max_tokens}: {total} positions exceed max_model_len="
            f"{cfg.max_model_len}; shorten the text or lower max_tokens")
    blocks = request.num_rows * kv.num_blocks_for(total)
    if blocks > kv.pool.num_blocks:
        raise AdmissionError(
            f"request {request.request_id!r} may need {blocks} KV blocks ({request.num_rows} "
            f"row(s) of {total} positions) but the cache has {kv.pool.num_blocks}; "
            f"lower max_tokens or shorten the text")
    if not cfg.enable_chunked_prefill and request.num_rows * total > cfg.max_num_batched_tokens:
        raise AdmissionError(
            f"request {request.request_id!r}: {request.num_rows} row(s) of up to {total} "
            f"positions do not fit max_num_batched_tokens={cfg.max_num_batched_tokens} "
            f"without chunked prefill")
    if request.num_rows > cfg.max_num_seqs:
        raise AdmissionError(f"a CFG request needs 2 rows but max_num_seqs={cfg.max_num_seqs}")

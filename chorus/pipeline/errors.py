"""The pipeline's error for requests that fail after they were accepted (no heavy imports:
the CLI catches it at start-up)."""
from __future__ import annotations


class PipelineError(RuntimeError):
    """A request failed after it was accepted (a failed model step, an expired deadline, a
    cancel, or the pipeline stopping). ``reason`` is ``"error"``, ``"deadline"``, ``"aborted"``
    or ``"stopped"``; for ``"deadline"``, ``deadline`` says which one passed: ``"start"`` (no
    audio in time) or ``"total"``."""

    def __init__(self, request_id: str, reason: str, message: str, deadline: str | None = None):
        super().__init__(f"request {request_id} {reason}: {message}")
        assert (reason == "deadline") == (deadline in ("start", "total")), (reason, deadline)
        self.request_id, self.reason, self.message, self.deadline = request_id, reason, message, deadline

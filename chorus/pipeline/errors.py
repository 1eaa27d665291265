"""The pipeline's error for requests that fail after they were accepted (no heavy imports:
the CLI catches it at start-up)."""
from __future__ import annotations


class PipelineError(RuntimeError):
    """A request failed after it was accepted (a failed model step, an expired deadline, a
    cancel, or the pipeline stopping). ``reason`` is ``"error"``, ``"deadline"``, ``"aborted"``
    or ``"stopped"``."""

    def __init__(self, request_id: str, reason: str, message: str):
        super().__init__(f"request {request_id} {reason}: {message}")
        self.request_id, self.reason, self.message = request_id, reason, message

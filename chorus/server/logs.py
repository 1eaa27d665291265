"""Structured logs: one JSON object per line (or a line of text), with the request id of the
request being served.

The request id comes from the client's ``X-Request-Id`` header (when it is a short token) or is
made up, is returned in the response's ``X-Request-Id`` and rides a context variable, so every
log line written while serving the request carries it.
"""
from __future__ import annotations

import contextvars
import json
import logging
import time
import unicodedata

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("chorus_request_id", default=None)

# record attributes that are not extra fields (uvicorn's color_message repeats the message with
# terminal colour codes)
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName",
                                                                        "color_message"}
MAX_LOGGED_PATH = 256  # characters of a request path in the access line


def clean_for_log(text: str, limit: int | None = None) -> str:
    """``text`` safe to put in a log line: control, format (e.g. bidi overrides) and line or
    paragraph separator characters escaped as ``\\uXXXX`` (a client cannot start a fake log
    line or hide text), cut to ``limit`` characters with a mark."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"...[{len(text) - limit} more]"
    if text.isprintable():
        return text
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") else c
                   for c in text)


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", "request_id", ...extra fields, "exc"}``."""

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": clean_for_log(record.getMessage()),
        }
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        if request_id:
            data["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in data:
                data[key] = value  # nested data (the start-up config) stays JSON; the rest becomes text
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        try:
            return json.dumps(data, ensure_ascii=False, default=str)
        except (TypeError, ValueError):  # e.g. a dict with tuple keys: never fail to log
            return json.dumps({k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
                               for k, v in data.items()}, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """For people: ``time LEVEL logger [request id] message key=value ...``; the same request id
    and extra fields as the JSON lines (nested data, such as the start-up config, as JSON). The
    message stays on one line (control characters escaped; a traceback follows on its own lines)."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = clean_for_log(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        record.request_tag = f" [{request_id}]" if request_id else ""
        try:
            line = super().format(record)
        finally:
            del record.request_tag
        fields = []
        for key, value in vars(record).items():
            if key in _STANDARD or key in ("request_id", "request_tag") or value is None:
                continue
            if not isinstance(value, (str, int, float, bool)):
                try:
                    value = json.dumps(value, ensure_ascii=False, default=str)
                except (TypeError, ValueError):
                    value = str(value)
            fields.append(f"{key}={clean_for_log(str(value))}")
        if fields:
            head, sep, tail = line.partition("\n")  # a traceback stays below the line
            line = f"{head} {' '.join(fields)}{sep}{tail}"
        return line


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``--log-format`` (``json`` or ``text``)."""
    return JsonFormatter() if fmt == "json" else TextFormatter()


def setup_logging(fmt: str = "json", level: str = "info") -> None:
    """Send Chorus's and uvicorn's logs to stderr as JSON lines (or plain text); both carry the
    request id of the request being served."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # the server logs each request itself

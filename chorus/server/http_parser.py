"""The HTTP/1.1 parser uvicorn runs, with the server's bound on a request's head.

``httptools`` (llhttp, in C) parses a request for a fraction of the CPU time of ``h11`` (pure
Python), and every request's parsing runs on the event loop, under the GIL the model threads
need: at overload most requests are refused, so the parser's cost is most of what a refusal
takes from the models (docs/server.md, "What a refusal costs"). httptools has no limit on the
request line and headers, so :func:`bounded_httptools` adds the one ``h11`` is given
(``h11_max_incomplete_event_size``): bytes received while a request's head is incomplete are
counted, and past ``max_head_bytes`` the connection is answered 431 ``headers_too_large`` and
closed, so what is buffered for a head stays below that bound plus one read from the socket. A
complete head over the bound that arrives at once is answered 431 by the app
(``http.middleware.BodyLimit``), as under h11."""
from __future__ import annotations

import json

PARSERS = ("httptools", "h11")


def bounded_httptools(max_head_bytes: int) -> type:
    """uvicorn's httptools protocol, refusing a head (request line and headers) that grows past
    ``max_head_bytes`` before it is complete."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from chorus.server.errors import APIError

    error = APIError(431, f"the request line and headers exceed {max_head_bytes} bytes", code="headers_too_large")
    body = json.dumps(error.body()).encode()
    answer = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
              b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _head_open = True  # a request's head may be arriving (between requests, or inside a head)
        _head_bytes = 0  # bytes received since that head began (an upper bound on its size)

        def data_received(self, data: bytes) -> None:
            if self._head_open:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._head_open and self._head_bytes > max_head_bytes and not self.transport.is_closing():
                self.logger.warning("a request head over %d bytes was refused (431)", max_head_bytes)
                self.transport.write(answer)
                self.transport.close()

        def on_headers_complete(self) -> None:
            self._head_open, self._head_bytes = False, 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_open = True  # the next request's head (pipelined or on this kept-alive connection)

    return BoundedHttpToolsProtocol

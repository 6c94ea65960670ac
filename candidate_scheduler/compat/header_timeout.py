"""A header timeout for sglang's HTTP server (uvicorn): connections that never finish a request's head
(its request line and headers) cannot pile up.

uvicorn 0.54 has no header-read timeout: its keep-alive timer starts only after a response, and any byte
received cancels it. A connection that sends half a request line and then a byte a minute (slowloris)
is held for good, before authentication can run (`TokenAuth` sees a request only once its head is
complete), and enough of them use up the server's file descriptors. Here a connection waiting for a
request's head -- its first, or the next after a response on a kept-alive connection -- is closed when
the whole head has not arrived within `seconds` of the wait's start (nginx's `client_header_timeout`,
Apache's `RequestReadTimeout header=`). A request whose head has arrived is not timed: its body is read
by the app (the routes read it whole, behind the token check and the body limit of `ServedRoutes`),
and a websocket, once upgraded, belongs to another protocol object that this timer leaves alone.

compat/http.py's `install_uvicorn_options` has sglang's `launch_http_server_only` start uvicorn with
such a protocol."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S = 30.0


def _base_protocol() -> type[asyncio.Protocol]:
    """The protocol uvicorn's "auto" picks: httptools' where it is installed, else h11's."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return AutoHTTPProtocol


def protocol_class(seconds: float, base: type[asyncio.Protocol] | None = None) -> type[asyncio.Protocol]:
    """`base` (uvicorn's HTTP protocol; None: the one uvicorn would pick) with the header timeout."""
    if not seconds > 0:
        raise ValueError(f"the header timeout must be a positive number of seconds, not {seconds!r}")
    base = base or _base_protocol()

    class HeaderTimeout(base):  # type: ignore[valid-type, misc]
        header_timeout_s = float(seconds)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._header_timer = None
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()  # the wait for the next request's head starts now

        def connection_lost(self, exc) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            if not self.transport.is_closing():
                self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timed_out)

        def _cancel_header_timer(self) -> None:
            timer, self._header_timer = getattr(self, "_header_timer", None), None
            if timer is not None:
                timer.cancel()

        def _header_timed_out(self) -> None:
            self._header_timer = None
            # a request in progress (its head arrived, a `cycle` is running) is the app's to time; an
            # upgraded connection has another protocol now
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and not self.transport.is_closing() and self.transport.get_protocol() is self:
                log.info("closed a connection from %s: no complete request head within %g s",
                         _peer(self.client), self.header_timeout_s)
                self.transport.close()

    HeaderTimeout.__name__ = HeaderTimeout.__qualname__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeout


def _peer(client) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown peer"


"""One HTTP request answered by a WSGI application, as a task of the controller's loop.

REST (rest.py) serves its connections on the owner loop (owner_loop.py), as the coflow
API does, instead of a thread per request: `serve_wsgi_request` reads one request from a
connected non-blocking socket (plain or TLS, its handshake done by transport.py) with h11
(a sans-IO HTTP/1.1 parser), calls the application on the loop with the environ
wsgiref would give it (PEP 3333), writes the reply and returns; the caller closes the
connection (one request per connection, as HTTP/1.0). The views the application calls
read the controller's state directly, being on its loop.

Limits: the request line and headers at most MAX_HEAD_BYTES (431 beyond), a body at
most MAX_BODY_BYTES (413 beyond; REST reads none), a malformed request 400 (h11's own
checks: an HTTP/1.1 request without Host, a bad request line or header); the caller
bounds the whole request's time.
"""

from __future__ import annotations

import io
import logging
import sys
import urllib.parse
from collections.abc import Callable, Iterable
from http import HTTPStatus

import h11

from terra_controller.loop_frames import FrameReader, send_all

LOG = logging.getLogger("terra.rest")

MAX_HEAD_BYTES = 16 * 1024  # request line and headers
MAX_BODY_BYTES = 64 * 1024  # a request body (read and given to the application)
SERVER = b"terra-controller"


async def serve_wsgi_request(
    app: Callable, sock, addr, base_environ: dict[str, str], scheme: str
) -> None:
    """Read one HTTP request from `sock`, answer it with `app` and return.

    Args:
        app: the WSGI application (called on the loop).
        sock: the connected non-blocking socket (plain or ssl.SSLSocket).
        addr: the peer's (host, port).
        base_environ: the server's part of the environ (SERVER_NAME, SERVER_PORT, ...).
        scheme: "https" or "http" (wsgi.url_scheme).

    Raises:
        OSError: the connection broke (nothing more to answer).
    """
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    reader = FrameReader(sock)
    try:
        request, body = await _read_request(conn, reader)
    except h11.RemoteProtocolError as exc:
        LOG.debug("REST %s: bad request: %s", addr, exc)
        await send_error(sock, exc.error_status_hint or 400, str(exc)[:200])
        return
    except _Refused as exc:
        await send_error(sock, exc.status, exc.text)
        return
    if request is None:  # closed before a request
        return
    try:
        out = _reply(conn, app, wsgi_environ(request, body, addr, base_environ, scheme))
    except Exception:  # the application (or its headers) failed: 500, the server goes on
        LOG.exception("REST %s %r failed", addr, request.target[:200])
        await send_error(sock, 500, "internal error (logged)")
        return
    await send_all(sock, out)


def _reply(conn: h11.Connection, app: Callable, environ: dict) -> bytes:
    """The bytes of the application's whole answer to `environ` (one request per
    connection: "Connection: close")."""
    status, reason, headers, chunks = _call(app, environ)
    headers = [(k, v) for k, v in headers if k.lower() != "connection"]
    headers += [("Connection", "close"), ("Server", SERVER.decode())]
    out = conn.send(h11.Response(status_code=status, headers=headers, reason=reason)) or b""
    for chunk in chunks:
        if chunk:
            out += conn.send(h11.Data(data=chunk)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")


class _Refused(Exception):
    """A request refused before the application sees it: `status` and `text`."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


async def _read_request(conn: h11.Connection, reader: FrameReader):
    """(the h11.Request, its body bytes), or (None, b"") when the peer closed first.

    Raises:
        h11.RemoteProtocolError: a malformed request (or a head beyond MAX_HEAD_BYTES that
            arrived in parts).
        _Refused: a head beyond MAX_HEAD_BYTES (431), a body beyond MAX_BODY_BYTES (413).
    """
    request, body = None, bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read_some())
        elif isinstance(event, h11.Request):
            head = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
            if head > MAX_HEAD_BYTES:
                raise _Refused(431, f"a request's head is at most {MAX_HEAD_BYTES} bytes")
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY_BYTES:
                raise _Refused(413, f"a request body is at most {MAX_BODY_BYTES} bytes")
        elif isinstance(event, h11.EndOfMessage):
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            if request is not None:
                raise h11.RemoteProtocolError("connection closed inside a request")
            return None, b""


def wsgi_environ(
    request: h11.Request, body: bytes, addr, base_environ: dict[str, str], scheme: str
) -> dict:
    """The PEP 3333 environ of `request`, as wsgiref's handler builds it: PATH_INFO
    percent-decoded as Latin-1, QUERY_STRING as sent, each header as HTTP_NAME (repeated
    ones joined with ","; names with "_" left out, as a proxy could not tell them from
    "-"), CONTENT_TYPE and CONTENT_LENGTH apart."""
    target = request.target.decode("latin-1")
    path, _, query = target.partition("?")
    env = dict(base_environ)
    env.update({
        "SERVER_PROTOCOL": "HTTP/" + request.http_version.decode("ascii"),
        "REQUEST_METHOD": request.method.decode("ascii"),
        "PATH_INFO": urllib.parse.unquote(path, "iso-8859-1"),
        "QUERY_STRING": query,
        "REMOTE_ADDR": str(addr[0]) if addr else "",
        "CONTENT_TYPE": "text/plain",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scheme,
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    })  # fmt: skip
    for raw_name, raw_value in request.headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1").strip()
        if "_" in name:
            continue
        if name == "content-type":
            env["CONTENT_TYPE"] = value
        elif name == "content-length":
            env["CONTENT_LENGTH"] = value
        else:
            key = "HTTP_" + name.replace("-", "_").upper()
            env[key] = env[key] + "," + value if key in env else value
    return env


def _call(app: Callable, environ: dict) -> tuple[int, bytes, list[tuple[str, str]], list[bytes]]:
    """(status code, reason phrase, headers, body chunks) of the WSGI application's
    answer."""
    started: list = []

    def start_response(status: str, headers: list, exc_info=None) -> Callable:
        started[:] = [status, headers]
        return lambda data: None  # (no application here writes through it)

    result: Iterable[bytes] = app(environ, start_response)
    try:
        chunks = list(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status, headers = started
    code, _, reason = status.partition(" ")
    return int(code), reason.encode("latin-1"), list(headers), chunks


async def send_error(sock, status: int, text: str) -> None:
    """Answer `status` with `text` (plain text) outside h11's state (the request may not
    have been parsed); a peer gone is ignored."""
    body = text.encode("utf-8", "replace")
    reason = HTTPStatus(status).phrase
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    try:
        await send_all(sock, head.encode("latin-1") + body)
    except OSError as exc:
        LOG.debug("REST: %s", exc)

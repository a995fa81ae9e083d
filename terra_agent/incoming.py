"""The receiving side of data connections: listeners on the data and tunnel ports, the
authentication and "hello" of each connection, chunks checked and delivered in order to their
flows, acks back to the sender, and chunks held until their flow's descriptor arrives."""

from __future__ import annotations

import logging

import trio

from overlay.framing import FrameReader, FrameWriter
from overlay.sealed import SealedPayload, SealedReader, SealedWriter
from terra_security.data_auth import DataAuthError, accept
from terra_security.data_records import TO_RECEIVER, TO_SENDER, Opener, RecordError, Sealer
from terra_wire.control import (
    ProtocolError,
    error_message,
    validate_data,
)
from terra_wire.frames import FrameError

from .admission import serve_admitted
from .config import (
    DATA_BACKLOG,
    HELLO_S,
)
from .pending import HeldChunk
from .receiver import ChunkRejected, InFlow
from .sender import CONNECTION_ERRORS, TUNNEL_DEAD_PEER_S
from .tcp_options import detect_dead_peers

log = logging.getLogger("terra_agent.agent")


class IncomingData:
    """The receiving part of `terra_agent.agent.Agent` (a mixin: its state lives on the
    Agent)."""

    async def _start_listener(self, port: int) -> None:
        """Listen on a tunnel port (bound before this returns); errors are logged and reported."""
        try:
            await self._nursery.start(self._listen, port)
        except OSError as exc:
            message = f"cannot listen on {self.config.data_addr[0]}:{port}: {exc}"
            log.error(message)
            self.send_control(error_message(message))

    async def _listen(
        self, port: int, listeners=None, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        if listeners is None:
            listeners = await trio.open_tcp_listeners(
                port, host=self.config.data_addr[0], backlog=DATA_BACKLOG
            )
        with trio.CancelScope() as scope:
            self.listeners[port] = scope
            try:
                await serve_admitted(
                    self._serve_incoming,
                    listeners,
                    self.data_admission,
                    self._nursery,
                    task_status=task_status,
                )
            finally:
                self.listeners.pop(port, None)

    def stop_listening(self, port: int) -> None:
        """Close the listener on `port` (tests: make a tunnel unreachable)."""
        scope = self.listeners.get(port)
        if scope is not None:
            scope.cancel()

    def close_incoming(self, peer_agent: str, tunnel: str) -> int:
        """Abort the incoming connections from `peer_agent` on `tunnel`; returns how many."""
        streams = self.incoming.get((peer_agent, tunnel), set())
        for stream in list(streams):
            stream.socket.close()
        return len(streams)

    async def _serve_incoming(self, stream: trio.SocketStream) -> None:
        """One incoming tunnel connection: (authentication,) hello, then chunks; acks go back
        on it. With data_tls_server, the peer's certificate names the agent the "hello" must
        name; chunks are then accepted only for flows whose sender is that agent (_deliver)."""
        peer = "?"
        key = None
        try:
            async with stream:
                detect_dead_peers(stream, TUNNEL_DEAD_PEER_S)
                with trio.fail_after(HELLO_S):  # authentication and "hello": one deadline
                    greeting = await self._greet(stream)
                if greeting is None:
                    return
                self.data_admission.authenticated(stream)  # never evicted from now on
                reader, writer, authenticated, hello = greeting
                peer = f"{hello['agent']} via {hello['tunnel']}"
                key = (hello["agent"], hello["tunnel"])
                self.incoming.setdefault(key, set()).add(stream)
                while True:
                    frame = await reader.read()
                    if frame is None:
                        return
                    # the sender whose flows this connection may carry (_deliver checks it):
                    # the certificate's name when authenticated (== hello's), else hello's
                    sender = authenticated or hello["agent"]
                    await self._receive_chunk(frame[0], frame[1], writer, sender, stream)
        except trio.TooSlowError:
            self.closed_connections += 1
            self._hello_log.event(peer)
        except DataAuthError as exc:
            self.unauthenticated += 1
            self.closed_connections += 1
            self._auth_log.event(exc)
        except ChunkRejected as exc:
            self.closed_connections += 1
            self.rejected_chunks += 1
            log.error("incoming connection from %s: %s", peer, exc)
        except (FrameError, ProtocolError, RecordError) as exc:
            self.closed_connections += 1
            log.error("incoming connection from %s: %s; closing it", peer, exc)
        except CONNECTION_ERRORS as exc:
            log.warning("incoming connection from %s: %s", peer, exc)
        except Exception:
            self.closed_connections += 1
            log.exception("incoming connection from %s failed; closing it", peer)
        finally:
            if key is not None:
                self.incoming.get(key, set()).discard(stream)
            self.pending.drop_stream(stream)  # the sender requeues what it sent on it

    async def _greet(self, stream: trio.SocketStream):
        """Authenticate an incoming data connection (with data_tls_server) and read its
        "hello"; (reader, writer, the authenticated sender or None, hello), or None when the
        peer closed first.

        Raises:
            DataAuthError: authentication failed. ProtocolError / FrameError: the first frame
                is not a valid "hello", or names another agent than the certificate.
        """
        initial = b""
        authenticated = secret = None
        encrypt = self.config.encrypt_data
        if self.config.data_tls_server is not None:
            authenticated, initial, secret = await accept(
                stream,
                self.config.data_tls_server,
                self.config.agent_id,
                self._pair_key,
                seal=encrypt,
            )
        frames = FrameReader(
            stream, buffers=self.payload_buffers, initial=initial, keep_raw=encrypt
        )
        reader, writer = frames, FrameWriter(stream)
        if encrypt and secret is not None:  # AEAD records (terra_security/data_records.py)
            reader = SealedReader(frames, Opener(secret, TO_RECEIVER))
            writer = SealedWriter(stream, Sealer(secret, TO_SENDER))
        frame = await reader.read()
        if frame is None:
            return None
        hello = validate_data(frame[0])
        if hello["t"] != "hello":
            raise ProtocolError(f"first frame must be 'hello', got {hello['t']!r}")
        if authenticated is not None and hello["agent"] != authenticated:
            self.unauthenticated += 1
            raise ProtocolError(
                f"'hello' names agent {hello['agent']!r}, the peer's certificate {authenticated!r}"
            )
        return reader, writer, authenticated, hello

    async def _receive_chunk(
        self, header: dict, payload, writer: FrameWriter, peer: str, stream: trio.SocketStream
    ) -> None:
        validate_data(header)
        if header["t"] != "chunk":
            raise ProtocolError(f"unexpected {header['t']!r} frame on a receiving connection")
        key = (header["c"], header["f"])
        attempt = header.get("a", 0)
        self.received_bytes += len(payload)
        flow = self.in_flows.get(key)
        if flow is None:
            reason = self.refused.get(key)
            if reason is not None:
                raise ProtocolError(
                    f"chunk for flow {key[0]}/{key[1]}, which this agent refused: {reason}"
                )
            if key in self.dropped and attempt <= self.dropped[key]:
                return  # a late chunk of a flow the controller dropped: nobody wants it
            chunk = HeldChunk(
                header["o"], payload, header.get("d"), stream, writer, peer, attempt, header["m"]
            )
            self._hold(key, chunk)
            return
        await self._deliver(
            flow, header["o"], payload, header.get("d"), writer, peer, attempt, header["m"]
        )

    async def _deliver(
        self,
        flow: InFlow,
        offset: int,
        payload,
        digest,
        writer: FrameWriter,
        peer: str,
        attempt: int = 0,
        mac: bytes = b"",
    ) -> None:
        """Give one chunk to its flow (hashed later by the flow's _consume task), report a
        completion / failure not reported yet. A chunk that added in-order bytes is acked by
        _consume once they are hashed and written; any other (out of order, a duplicate: its
        sender may have missed an ack) gets the flow's acknowledged offset on `writer` at once.
        A chunk of an earlier attempt of the flow (`attempt`: the chunk's "a") is ignored.

        `peer`: the agent that sent the chunk (authenticated by its certificate when the agent
        has data_tls_server); a chunk whose flow's src_agent is another agent closes the
        connection before it reaches the flow (sink, reorder buffer, spill file). So does a
        chunk whose `mac` ("m", its leaf MACs) is not the flow key's MAC list of its bytes and
        offset (tampered, or made without the key; terra_security/integrity.py), a chunk off the
        leaf
        grid and a chunk ending more than the flow's max_ahead bytes past its in-order point
        (InFlow.admit): the connection's end makes the sender requeue everything
        unacknowledged on it, so the flow still completes.

        On an encrypted connection `payload` is a SealedPayload: its AEAD record is opened
        with the flow's key first (InFlow.open_record: a record that does not verify closes
        the connection like a bad MAC), and its leaf MACs, authenticated by the record, are
        taken as they are (no second pass over the bytes).

        Raises ProtocolError (wrong sender, bad MAC or record, too far ahead, chunk past the
        flow's end, changed digest, a later attempt than the receiver's descriptor) and the
        writer's connection errors.
        """
        key = flow.spec.key
        if peer != flow.spec.src_agent:
            raise ProtocolError(
                f"chunk for flow {key[0]}/{key[1]} from agent {peer!r}, "
                f"its sender is {flow.spec.src_agent!r}"
            )
        if attempt != flow.spec.attempt:
            if attempt < flow.spec.attempt:
                return  # the flow restarted from byte 0: bytes of the old attempt are void
            raise ProtocolError(
                f"chunk of attempt {attempt} for flow {key[0]}/{key[1]}, which is at attempt "
                f"{flow.spec.attempt} here; closing so the sender resends"
            )
        sealed = isinstance(payload, SealedPayload)
        if sealed:  # opened in place before anything of it is kept
            payload = flow.open_record(offset, payload)
        flow.admit(offset, payload, mac, verified=sealed)
        flow.ack_writer = writer
        added = await flow.receive(offset, payload, digest, mac)
        self._report_if_finished(flow)
        if not added:
            await writer.send(self._ack(flow))

    async def _consume(self, flow: InFlow) -> None:
        """The task that hashes and writes one receiving flow's in-order bytes (InFlow.consume)
        until it is complete or failed; acks each batch on the connection of the latest chunk
        and reports the completion (or failure) once."""
        key = flow.spec.key
        try:
            while await flow.consume():
                if flow.complete:
                    self._report_if_finished(flow)
                writer = flow.ack_writer
                if writer is not None:
                    try:
                        await writer.send(self._ack(flow))
                    except CONNECTION_ERRORS:
                        pass  # the sender resends on another connection; that one acks
        except Exception as exc:  # a bug or an unexpected sink error: fail this flow only
            log.exception("flow %s/%s: consuming its bytes failed", *key)
            flow.fail(f"flow {key[0]}/{key[1]}: consuming its bytes failed: {exc!r}")
        self._report_if_finished(flow)

    def _ack(self, flow: InFlow) -> dict:
        key = flow.spec.key
        ack = {"t": "ack", "c": key[0], "f": key[1], "o": flow.acknowledged, "e": self.epoch}
        if flow.spec.attempt:
            ack["a"] = flow.spec.attempt
        return ack

    def _report_if_finished(self, flow: InFlow) -> None:
        """Report a flow's completion (digest matched) or failure to the controller, once."""
        if flow.reported or not (flow.check_digest() or flow.failed is not None):
            return
        if flow.done:
            self._report_complete(flow)
        else:
            flow.reported = True
            self.send_control(self._in_failure(flow))

    # ------------------------------------------------------------ chunks ahead of descriptors

    def _hold(self, key: tuple[str, str], chunk: HeldChunk) -> None:
        """Hold a chunk of a flow without a descriptor (unacknowledged); ProtocolError (its
        connection closes, the sender resends) when the pending store is full."""
        first = self.pending.add(key, chunk)
        if first is None:
            self.pending.drop_stream(chunk.stream)
            raise ProtocolError(
                f"chunk for unknown flow {key[0]}/{key[1]}: {self.pending.held_bytes} bytes "
                f"already held for flows without a descriptor (limit "
                f"{self.pending.limit_bytes}); closing so the sender resends"
            )
        if first:
            log.info("chunk for flow %s/%s before its descriptor: holding it", *key)
        if key not in self._pending_timers:
            self._pending_timers.add(key)
            self._spawn(self._expire_held, key)

    async def _expire_held(self, key: tuple[str, str]) -> None:
        """After pending_timeout, drop what is still held for `key` and close its connections."""
        try:
            await trio.sleep(self.config.pending_timeout)
        finally:
            self._pending_timers.discard(key)
        held = self.pending.drop(key)
        if held:
            self._close_streams(
                held,
                f"chunks for unknown flow {key[0]}/{key[1]}: no descriptor within "
                f"{self.config.pending_timeout:g} s of the first",
            )

    def _close_streams(self, held: list[HeldChunk], why: str) -> None:
        """Close the connections that carried `held` (dropped) chunks so the sender resends."""
        streams = {id(c.stream): c.stream for c in held}
        for stream in streams.values():
            self.pending.drop_stream(stream)
            self.closed_connections += 1
            stream.socket.close()
        log.error(
            "%s: dropped %d held bytes, closed %d connection(s) so the sender resends",
            why,
            sum(len(c.payload) for c in held),
            len(streams),
        )

    async def _feed_held(self, flow: InFlow, held: list[HeldChunk]) -> None:
        """Deliver chunks held before `flow`'s descriptor arrived, in arrival order."""
        closed: set[int] = set()
        for chunk in held:
            if id(chunk.stream) in closed:
                continue
            try:
                await self._deliver(
                    flow,
                    chunk.offset,
                    chunk.payload,
                    chunk.digest,
                    chunk.writer,
                    chunk.peer,
                    chunk.attempt,
                    chunk.mac,
                )
            except ProtocolError as exc:
                closed.add(id(chunk.stream))
                self._close_streams([chunk], f"held chunk from {chunk.peer}: {exc}")
            except CONNECTION_ERRORS:
                closed.add(id(chunk.stream))  # connection gone: the sender requeued its chunks

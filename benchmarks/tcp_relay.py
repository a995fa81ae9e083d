"""A TCP relay on loopback that a test can cut: a partition between two real processes."""

from __future__ import annotations

import socket
import threading


class TcpRelay:
    """Forwards TCP connections from 127.0.0.1:`port` to `target` ("HOST:PORT"), a
    partition a test can make: `cut()` drops every byte of every connection, old and new,
    both ways (requests time out; nothing is refused) until `heal()`, which closes the cut
    connections so that clients reconnect. `addr` is "127.0.0.1:PORT".

    Raises OSError when no loopback port can be bound."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.pairs: list[dict] = []
        self.is_cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            pair = {"socks": [conn], "dead": self.is_cut}
            if not pair["dead"]:
                try:
                    upstream = socket.create_connection(self.target, timeout=2)
                    upstream.settimeout(None)  # an idle connection stays up, as without it
                    pair["socks"].append(upstream)
                except OSError:
                    conn.close()
                    continue
            with self.lock:
                self.pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair, 0), daemon=True).start()
            if len(pair["socks"]) == 2:
                threading.Thread(target=self._pump, args=(pair, 1), daemon=True).start()

    def _pump(self, pair: dict, side: int) -> None:
        src = pair["socks"][side]
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if pair["dead"]:
                continue  # dropped
            try:
                pair["socks"][1 - side].sendall(data)
            except OSError:
                break
        self._close(pair)

    def _close(self, pair: dict) -> None:
        for sock in pair["socks"]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def cut(self) -> None:
        """Drop every byte from now on, on the connections held and on new ones."""
        with self.lock:
            self.is_cut = True
            for pair in self.pairs:
                pair["dead"] = True

    def heal(self) -> None:
        """Forward again; the connections cut are closed."""
        with self.lock:
            self.is_cut = False
            dead = [p for p in self.pairs if p["dead"]]
            self.pairs = [p for p in self.pairs if not p["dead"]]
        for pair in dead:
            self._close(pair)

    def close(self) -> None:
        """Stop listening and close every connection."""
        self.server.close()
        self.cut()
        self.heal()

"""Put a TCP proxy between a worker and the server that can go silent, and come back.

``with Proxy(upstream_port) as p:`` listens on 127.0.0.1 (a free port, ``p.port``) and pumps
bytes both ways in one thread. ``p.silence()`` stops the pumping in both directions: no FIN, no
RST, nothing forwarded; ``p.resume()`` forwards what waited. Bounded: silence ends by itself
after ``max_silence`` seconds and the proxy closes itself after ``lifetime`` seconds; leaving
the ``with`` block (also on Ctrl-C) closes every socket and joins the thread.

What it cannot show, by construction: the proxy's own kernel still ACKs what the server sends
(data and TCP keepalive probes), so the server's socket stays healthy while the proxy is
silent. Only timers inside PostgreSQL (``idle_in_transaction_session_timeout``, statement
timeouts) and the job's lease notice. Dropping packets for real needs the kernel
(tenantlab/experiments/_netns.py: a network namespace whose link goes down).
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from types import TracebackType

log = logging.getLogger("tenantlab")

CHUNK = 65536


class ProxyError(RuntimeError):
    """The proxy could not start, or was used after it closed."""


class Proxy:
    """A silent-capable TCP proxy on 127.0.0.1 in front of ``upstream_host:upstream_port``."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1", *,
                 max_silence: float = 60.0, lifetime: float = 600.0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.max_silence, self.lifetime = max_silence, lifetime
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._pending: dict[socket.socket, bytearray] = {}
        self._lock = threading.Lock()
        self._silent_until: float | None = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"netproxy:{self.port}",
                                        daemon=True)
        self.silences: list[tuple[float, float | None]] = []  # (from, to) wall-clock times
        self.connections = 0
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._started = time.monotonic()
        self._thread.start()

    # -- control -------------------------------------------------------------------------------

    @property
    def silent(self) -> bool:
        with self._lock:
            return self._silent_until is not None

    def silence(self, seconds: float | None = None) -> None:
        """Stop forwarding both ways (for `seconds`, at most ``max_silence``)."""
        limit = min(seconds if seconds is not None else self.max_silence, self.max_silence)
        with self._lock:
            self._silent_until = time.monotonic() + limit
        self.silences.append((time.time(), None))

    def resume(self) -> None:
        """Forward again, starting with what waited in the buffers."""
        with self._lock:
            was = self._silent_until is not None
            self._silent_until = None
        if was and self.silences and self.silences[-1][1] is None:
            self.silences[-1] = (self.silences[-1][0], time.time())

    def close(self) -> None:
        """Close every socket and stop the thread (idempotent)."""
        self._closing.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._close_all()

    def open_sockets(self) -> int:
        """Return how many sockets the proxy holds open (0 once closed)."""
        return len(self._sel.get_map() or {}) if not self._closed else 0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- the pump ------------------------------------------------------------------------------

    _closed = False

    def _loop(self) -> None:
        try:
            while not self._closing.is_set():
                if time.monotonic() - self._started > self.lifetime:
                    log.warning("netproxy %s closed itself after its lifetime (%s s)",
                                self.port, self.lifetime)
                    break
                self._auto_resume()
                silent = self.silent
                for key, _ in self._sel.select(timeout=0.05):
                    if key.data == "accept":
                        self._accept()
                    elif not silent:
                        self._pump(key.fileobj)  # type: ignore[arg-type]
                if silent:
                    time.sleep(0.02)  # the kernel buffers meanwhile; nothing is read
                else:
                    self._flush()
        except Exception:  # pragma: no cover - a bug: close rather than hang the experiment
            log.exception("netproxy %s failed", self.port)
        finally:
            self._close_all()

    def _auto_resume(self) -> None:
        with self._lock:
            until = self._silent_until
        if until is not None and time.monotonic() >= until:
            self.resume()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError as e:
            log.warning("netproxy %s: upstream %s refused: %s", self.port, self.upstream, e)
            client.close()
            return
        for s in (client, server):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._pending[s] = bytearray()
            self._sel.register(s, selectors.EVENT_READ, "pump")
        self._pairs[client], self._pairs[server] = server, client
        self.connections += 1

    def _pump(self, src: socket.socket) -> None:
        dst = self._pairs.get(src)
        if dst is None:
            return
        try:
            data = src.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(src)
            return
        self._pending[dst] += data
        self._flush()

    def _flush(self) -> None:
        for dst, buf in list(self._pending.items()):
            if not buf:
                continue
            try:
                sent = dst.send(buf)
            except BlockingIOError:
                continue
            except OSError:
                self._drop(dst)
                continue
            del buf[:sent]

    def _drop(self, sock: socket.socket) -> None:
        """Close one connection's both sockets (one side closed: the other follows)."""
        other = self._pairs.pop(sock, None)
        for s in (sock, other):
            if s is None:
                continue
            self._pairs.pop(s, None)
            self._pending.pop(s, None)
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def _close_all(self) -> None:
        if self._closed:
            return
        self._closed = True
        for s in list(self._pairs):
            self._drop(s)
        try:
            self._sel.unregister(self._listener)
        except (KeyError, ValueError):
            pass
        self._listener.close()
        self._sel.close()

"""A TCP forwarder in front of the S3 server that a test can take down and bring back.

Down, it resets every open connection and refuses new ones, which is what a client sees when
the server process dies; up again on the same port, it forwards to the same server, whose data
survived, as a restarted MinIO's does on its disk (moto keeps everything in memory, so the
server itself must stay up). Real HTTP passes through unchanged; nothing is mocked.

``trip(...)`` schedules an outage at an exact point of the traffic: when the client's bytes
contain a pattern (e.g. the request line of one upload), or after so many bytes in either
direction (mid-upload, mid-download).
"""

from __future__ import annotations

import functools
import socket
import threading


class FlakyProxy:
    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.port = 0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._trip: dict | None = None
        self.outages = 0
        self.up()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ control
    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self, seconds: float | None = None) -> None:
        """Reset every connection and refuse new ones; back up after ``seconds`` (None: stay down)."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
            self.outages += 1
        for sock in ([listener] if listener else []) + conns:  # (shutdown wakes a thread blocked on it)
            for close in (functools.partial(sock.shutdown, socket.SHUT_RDWR), sock.close):
                try:
                    close()
                except OSError:
                    pass
        if seconds is not None:
            threading.Timer(seconds, self.up).start()

    def trip(
        self,
        *,
        pattern: bytes | None = None,
        after_upload: int | None = None,
        after_download: int | None = None,
        seconds: float | None = None,
    ) -> None:
        """One outage of ``seconds`` (None: for good) when the client sends ``pattern``, or once
        ``after_upload`` / ``after_download`` bytes have passed in that direction."""
        self._trip = {
            "pattern": pattern,
            "up": after_upload,
            "down": after_download,
            "seconds": seconds,
            "sent": 0,
            "received": 0,
        }

    def close(self) -> None:
        self._trip = None
        self.down()

    # ------------------------------------------------------------------ forwarding
    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # went down meanwhile
                    client.close()
                    server.close()
                    return
                self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if self._should_trip(data, upstream):
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _should_trip(self, data: bytes, upstream: bool) -> bool:
        trip = self._trip
        if trip is None:
            return False
        with self._lock:
            if self._trip is not trip:
                return False
            if upstream:
                trip["sent"] += len(data)
            else:
                trip["received"] += len(data)
            hit = (
                (upstream and trip["pattern"] is not None and trip["pattern"] in data)
                or (upstream and trip["up"] is not None and trip["sent"] >= trip["up"])
                or (not upstream and trip["down"] is not None and trip["received"] >= trip["down"])
            )
            if hit:
                self._trip = None
        if hit:
            self.down(trip["seconds"])
        return hit

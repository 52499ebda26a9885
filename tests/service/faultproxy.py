# SPDX-License-Identifier: Apache-2.0
"""
faultproxy.py - a small fault-injecting TCP proxy for loopback service tests.

A client that retries is only proven safe by the faults that make it retry: an answer lost after
the server executed the request, a connection reset before the request got anywhere.  This proxy
sits between a client and a server on 127.0.0.1 and treats every accepted connection by the next
mode of its plan (then `default`):

  FORWARD  relay both ways until either side closes (a normal connection).
  DROP     read the request, forward it, read the server's whole answer, then close the client's
           side without sending a byte of it: the server executed, the client saw nothing.
  RESET    read the request, then close the client's socket with SO_LINGER 0 (a TCP RST) without
           forwarding anything: the server never saw it.

Every connection is recorded (mode, request bytes, the answer the server gave), so a test can
compare the first, dropped execution with what the client finally printed.  Python's standard
library only, one thread per connection.
"""

import selectors
import socket
import struct
import threading
import time

FORWARD = "forward"
DROP = "drop"
RESET = "reset"

IO_TIMEOUT_S = 30.0
HEADER_MAX = 1 << 20


class Connection:
    """What happened on one accepted connection."""

    def __init__(self, index, mode):
        self.index = index
        self.mode = mode
        self.request = b""    # bytes the client sent
        self.response = b""   # bytes the server answered (sent on for FORWARD, kept for DROP)
        self.error = None     # an exception text, if the proxy itself failed
        self.done = threading.Event()

    def __repr__(self):
        return "<Connection %d %s req=%dB resp=%dB%s>" % (
            self.index, self.mode, len(self.request), len(self.response),
            " error=%s" % self.error if self.error else "")


def _read_http_message(sock, first=b""):
    """
    Reads one HTTP/1.1 message (head, then Content-Length bytes of body) from `sock`.  Without a
    Content-Length it reads until the peer closes.  Returns the bytes read (maybe more than one
    message if the peer pipelined, which the tests do not do).
    """
    data = first
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
        if len(data) > HEADER_MAX:
            return data
    head, _, rest = data.partition(b"\r\n\r\n")
    length = None
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        lname = name.strip().lower()
        if lname == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                length = None
        elif lname == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if length is not None:
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return head + b"\r\n\r\n" + rest
    if chunked:
        while not rest.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return head + b"\r\n\r\n" + rest
    # A request without a body ends at its head; an answer without a length ends at close.
    if head.split(b" ", 1)[0] in (b"GET", b"HEAD", b"DELETE", b"OPTIONS"):
        return head + b"\r\n\r\n" + rest
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def _close(sock):
    try:
        sock.close()
    except OSError:
        pass


def _reset(sock):
    """Closes with SO_LINGER {on, 0 s}: the kernel sends RST instead of FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    _close(sock)


class FaultProxy:
    """
    A proxy on 127.0.0.1:<ephemeral port> in front of upstream (host, port).  Use as a context
    manager or start()/close().  plan([...]) queues the modes of the next connections.
    """

    def __init__(self, upstream_host, upstream_port, default=FORWARD):
        self.upstream = (upstream_host, upstream_port)
        self.default = default
        self.host = "127.0.0.1"
        self.port = None
        self.connections = []
        self._plan = []
        self._lock = threading.Lock()
        self._listener = None
        self._threads = []
        self._stopping = threading.Event()

    @property
    def base_url(self):
        return "http://%s:%d" % (self.host, self.port)

    def plan(self, modes):
        """Queues one mode per coming connection; after them, `default` applies."""
        with self._lock:
            self._plan.extend(modes)
        return self

    def start(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, 0))
        s.listen(64)
        self._listener = s
        self.port = s.getsockname()[1]
        t = threading.Thread(target=self._accept_loop, name="faultproxy-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def close(self):
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            _close(self._listener)
        for t in self._threads:
            t.join(2.0)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False

    def wait_idle(self, timeout=10.0):
        """Waits until every connection accepted so far has been dealt with."""
        deadline = time.monotonic() + timeout
        for c in list(self.connections):
            c.done.wait(max(0.0, deadline - time.monotonic()))

    def _accept_loop(self):
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                mode = self._plan.pop(0) if self._plan else self.default
                conn = Connection(len(self.connections), mode)
                self.connections.append(conn)
            t = threading.Thread(target=self._handle, args=(client, conn),
                                 name="faultproxy-%d" % conn.index, daemon=True)
            t.start()
            self._threads.append(t)

    def _handle(self, client, conn):
        upstream = None
        try:
            client.settimeout(IO_TIMEOUT_S)
            if conn.mode == RESET:
                conn.request = _read_http_message(client)
                _reset(client)
                return
            upstream = socket.create_connection(self.upstream, timeout=IO_TIMEOUT_S)
            if conn.mode == DROP:
                conn.request = _read_http_message(client)
                upstream.sendall(conn.request)
                conn.response = _read_http_message(upstream)
                _close(client)  # the answer is never sent: the client sees the connection end
                return
            self._pump(client, upstream, conn)
        except Exception as e:  # noqa: BLE001 - recorded for the test's failure message
            conn.error = "%s: %s" % (type(e).__name__, e)
        finally:
            _close(client)
            if upstream is not None:
                _close(upstream)
            conn.done.set()

    @staticmethod
    def _pump(client, upstream, conn):
        """Relays both ways until one side closes, recording what went through."""
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, "c")
        sel.register(upstream, selectors.EVENT_READ, "u")
        try:
            while True:
                events = sel.select(IO_TIMEOUT_S)
                if not events:
                    return
                for key, _ in events:
                    src = key.fileobj
                    data = src.recv(65536)
                    if not data:
                        return
                    if key.data == "c":
                        conn.request += data
                        upstream.sendall(data)
                    else:
                        conn.response += data
                        client.sendall(data)
        finally:
            sel.close()


def split_http(raw):
    """(head text, body bytes) of one recorded HTTP message."""
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.decode("latin-1"), body

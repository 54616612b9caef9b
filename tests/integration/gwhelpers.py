# SPDX-License-Identifier: Apache-2.0
"""Clients and fakes for the gateway integration tests (test_gateway_*.py): raw HTTP/1.1 over a
socket (to see chunk boundaries, truncation and exact bytes), a raw HTTP/2 client on python-h2
(one connection, many streams, resets, no hidden pooling), and a tiny fake upstream for what
kvgate-simworker cannot do (echo request headers, send hop-by-hop headers, reset, stream an
endless body)."""
import hashlib
import json
import re
import socket
import threading
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import httpx
import hyperframe.frame

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"


class http:
    """httpx's one-shot calls without loading the CA bundle for each (about 50 ms a call, which
    adds up over a suite): every URL here is loopback, cleartext or self-signed TLS."""

    @staticmethod
    def _call(method, url, **kw):
        kw.setdefault("verify", False)
        kw.setdefault("timeout", 10)
        return httpx.request(method, url, **kw)

    @staticmethod
    def get(url, **kw):
        return http._call("GET", url, **kw)

    @staticmethod
    def post(url, **kw):
        return http._call("POST", url, **kw)

    @staticmethod
    def delete(url, **kw):
        return http._call("DELETE", url, **kw)


def wait_for(cond, timeout=5.0, step=0.02):
    """Poll cond() until it is true or the timeout passes; returns the last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return cond()


def sim_metric(sw, name, **labels):
    """Sum of a kvgate-simworker metric's samples whose labels include `labels`."""
    total = 0.0
    for line in http.get(sw.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in key for k, v in labels.items()):
                total += float(value)
    return total


def worker_cfg(w, **extra):
    """A config-file worker entry for a simworker Process (or anything with .name and .url)."""
    return {"name": w.name, "url": w.url, **extra}


def sse_data(text):
    """'data: a\\n\\ndata: b\\n\\n' -> ['a', 'b'] (asserts the framing)."""
    assert text.endswith("\n\n"), text[-200:]
    out = []
    for event in text[:-2].split("\n\n"):
        assert event.startswith("data: "), event
        out.append(event[len("data: "):])
    return out


def assert_openai_error(body, status, type_=None, admin=False, code=None):
    """body is the OpenAI error shape {"error":{"message","type","param","code"}} (the admin
    API documents it without "param" and with the status as its code). The gateway's own
    errors carry a string code as OpenAI's (docs/api.md); a worker's error passes through with
    the engine's (vLLM: the status). code, when given, is the one expected."""
    obj = json.loads(body) if isinstance(body, (bytes, str)) else body
    assert set(obj) == {"error"}, obj
    err = obj["error"]
    want = {"message", "type", "code"} if admin else {"message", "type", "param", "code"}
    assert set(err) >= want, err
    if admin:
        assert err["code"] == status, err
    elif code is not None:
        assert err["code"] == code, err
    else:
        assert err["code"] == status or (isinstance(err["code"], str)
                                         and re.fullmatch(r"[a-z_]+", err["code"])), err
    assert isinstance(err["message"], str) and err["message"], err
    if type_:
        assert err["type"] == type_, err
    return err


# ---- raw HTTP/1.1 ---------------------------------------------------------------------------------


def request_bytes(method, path, body=None, headers=None, host="test"):
    """An HTTP/1.1 request with Content-Length (body: bytes, str or a JSON-able object)."""
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + (body or b"")


class RawHTTP:
    """HTTP/1.1 over a plain socket: send bytes, read one response head, then the body chunk by
    chunk with arrival times. .complete says whether the body ended properly (terminal chunk or
    full Content-Length) rather than by the connection closing."""

    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.file = self.sock.makefile("rb")
        self.status = None
        self.headers = {}
        self.raw_headers = []
        self.complete = False

    def send(self, data):
        self.sock.sendall(data)
        return self

    def read_head(self):
        """Read the next final response head (skipping 1xx); returns the status, or None when
        the connection closed first."""
        while True:
            try:
                line = self.file.readline()
            except ConnectionResetError:
                line = b""
            if not line:
                self.status = None
                return None
            self.status = int(line.split()[1])
            self.headers, self.raw_headers = {}, []
            while True:
                h = self.file.readline().decode("latin-1").rstrip("\r\n")
                if not h:
                    break
                k, _, v = h.partition(":")
                self.raw_headers.append((k.strip(), v.strip()))
                self.headers[k.strip().lower()] = v.strip()
            if self.status >= 200:
                self.complete = False
                return self.status

    def chunks(self):
        """Yield (arrival time, bytes) for each piece of the body of the response just read."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                line = self.file.readline()
                if not line:
                    return
                size = int(line.strip().split(b";")[0], 16)
                if size == 0:
                    self.file.readline()
                    self.complete = True
                    return
                payload = self.file.read(size)
                if len(payload) < size:
                    return
                self.file.read(2)
                yield time.monotonic(), payload
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                piece = self.file.read1(min(left, 65536))
                if not piece:
                    return
                left -= len(piece)
                yield time.monotonic(), piece
            self.complete = True
        else:
            while True:
                piece = self.file.read1(65536)
                if not piece:
                    self.complete = True
                    return
                yield time.monotonic(), piece

    def body(self):
        return b"".join(p for _, p in self.chunks())

    def response(self):
        """(status, headers, body) of the next response."""
        self.read_head()
        return self.status, self.headers, self.body() if self.status else b""

    def closed_by_peer(self, timeout=5.0):
        """True when the server closes the connection (EOF or reset) within the timeout."""
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.file.read1(65536)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self):
        try:
            self.file.close()
        finally:
            self.sock.close()


def http1(port, method, path, body=None, headers=None, timeout=10.0):
    """One request on a fresh connection: (status, headers, body bytes)."""
    c = RawHTTP(port, timeout)
    try:
        c.send(request_bytes(method, path, body, headers))
        return c.response()
    finally:
        c.close()


# ---- raw HTTP/2 -----------------------------------------------------------------------------------


class H2Stream:
    def __init__(self, sid):
        self.id = sid
        self.headers = None
        self.data = bytearray()
        self.chunks = []       # (arrival time, bytes)
        self.ended = False
        self.reset = None      # error code of a RST_STREAM from the server

    @property
    def status(self):
        return int(self.headers[":status"]) if self.headers else None

    @property
    def done(self):
        return self.ended or self.reset is not None


class H2Client:
    """HTTP/2 with prior knowledge (or over a given socket, e.g. TLS) on one connection, driven
    by hand: request() sends, pump() reads and dispatches events. Received data is acknowledged
    (the windows reopen) unless auto_ack is False."""

    def __init__(self, port=None, sock=None, timeout=10.0, auto_ack=True, settings=None):
        self.sock = sock or socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        # A graceful GOAWAY (RFC 9113 6.8) lets the streams up to last_stream_id finish, but
        # python-h2 closes its state machine on any GOAWAY and then rejects their frames:
        # keep it open after a NO_ERROR GOAWAY so tests can see those streams through.
        receive_goaway = self.conn._frame_dispatch_table[hyperframe.frame.GoAwayFrame]

        def graceful_goaway(frame):
            result = receive_goaway(frame)
            if frame.error_code == h2.errors.ErrorCodes.NO_ERROR:
                self.conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
            return result
        self.conn._frame_dispatch_table[hyperframe.frame.GoAwayFrame] = graceful_goaway
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.sock.sendall(self.conn.data_to_send())
        self.streams = {}
        self.auto_ack = auto_ack
        self.goaway = None
        self.closed = False
        self.remote_settings = {}

    def request(self, method, path, body=None, headers=None, end=True):
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":path", path), (":scheme", "http"),
                (":authority", "test")]
        if body is not None:
            hdrs += [("content-type", "application/json"), ("content-length", str(len(body)))]
        hdrs += list((headers or {}).items())
        self.conn.send_headers(sid, hdrs, end_stream=(body is None and end))
        if body is not None:
            self._send_body(sid, body, end)
        self.streams[sid] = H2Stream(sid)
        self.flush()
        return self.streams[sid]

    def _send_body(self, sid, body, end):
        # Within the peer's windows and frame size; the gateway opens a 1 MiB stream window and
        # a 16 MiB connection window, more than any body the tests send.
        size = self.conn.max_outbound_frame_size
        for i in range(0, len(body), size):
            last = i + size >= len(body)
            self.conn.send_data(sid, body[i:i + size], end_stream=end and last)
        if not body and end:
            self.conn.end_stream(sid)

    def reset(self, stream):
        self.conn.reset_stream(stream.id)
        self.flush()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, timeout=None):
        """Read once (up to the timeout) and dispatch; False when the connection closed."""
        if timeout is not None:
            self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            return True
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            return False
        now = time.monotonic()
        for ev in self.conn.receive_data(data):
            sid = getattr(ev, "stream_id", None)
            s = self.streams.get(sid)
            if isinstance(ev, h2.events.ResponseReceived):
                s.headers = dict(ev.headers)
            elif isinstance(ev, h2.events.DataReceived):
                if s is not None:
                    s.data += ev.data
                    s.chunks.append((now, ev.data))
                if self.auto_ack and ev.flow_controlled_length:
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, sid)
            elif isinstance(ev, h2.events.StreamEnded):
                if s is not None:
                    s.ended = True
            elif isinstance(ev, h2.events.StreamReset):
                if s is not None:
                    s.reset = ev.error_code
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.goaway = ev
            elif isinstance(ev, h2.events.RemoteSettingsChanged):
                self.remote_settings.update({k: v.new_value
                                             for k, v in ev.changed_settings.items()})
        self.flush()
        return True

    def wait(self, streams, timeout=10.0):
        """Pump until every stream is done (ended or reset) or the connection closes."""
        deadline = time.monotonic() + timeout
        while not all(s.done for s in streams):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{sum(not s.done for s in streams)} streams not done")
            if not self.pump(min(left, 1.0)):
                break
        return streams

    def close(self):
        try:
            self.conn.close_connection()
            self.flush()
        except Exception:
            pass
        self.sock.close()


# ---- fake upstream --------------------------------------------------------------------------------


class FakeUpstream:
    """A minimal HTTP/1.1 worker on 127.0.0.1:0 in a thread. handler(req, sock) answers one
    request: req is a dict (method, path, headers (lowercase name -> value), raw_head, body);
    it writes the response itself and returns True to keep the connection for another request.
    GET /health is answered 200 unless health=False. Requests seen are in .requests (health
    checks excluded); .live counts the connections open now."""

    def __init__(self, handler, name="fake", health=True):
        self.handler = handler
        self.name = name
        self.health = health
        self.requests = []
        self.conns = []
        self.live = 0
        self.lock = threading.Lock()
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(128)
        self.port = self.lsock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stopping:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            if self.stopping:
                s.close()
                return
            self.conns.append(s)
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    @staticmethod
    def _read_request(s, buf):
        while b"\r\n\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                return None, buf
            buf += d
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        while len(rest) < n:
            d = s.recv(65536)
            if not d:
                return None, b""
            rest += d
        req = {"method": method, "path": path, "headers": headers, "raw_head": head,
               "body": rest[:n]}
        return req, rest[n:]

    def _serve(self, s):
        buf = b""
        with self.lock:
            self.live += 1
        try:
            while True:
                req, buf = self._read_request(s, buf)
                if req is None:
                    break
                if req["path"] == "/health" and self.health:
                    s.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    continue
                self.requests.append(req)
                if not self.handler(req, s):
                    break
        except OSError:
            pass
        finally:
            with self.lock:
                self.live -= 1
            try:
                s.close()
            except OSError:
                pass

    def close(self):
        self.stopping = True
        try:
            # Wake accept() up.
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            pass
        self.lsock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


def json_response(sock, obj, status=200, extra=b""):
    body = json.dumps(obj).encode()
    sock.sendall(b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                 % (status, len(body)) + extra + b"\r\n" + body)


def dead_port():
    """A loopback port with nothing listening (bound, then closed: connects are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- what a worker receives -----------------------------------------------------------------------

TEST_SECRET = "integration-secret-0123456789abcdef0123456789"  # the kvgate fixture's KVGATE_SECRET


def salt_of(scope, secret=TEST_SECRET):
    """The cache salt kvgate injects for a sharing scope: HMAC-SHA256(secret, scope),
    base64url without padding ("global" in open mode, "tenant:<id>", "group:<name>")."""
    import base64
    import hmac
    mac = hmac.new(secret.encode(), scope.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def forwarded(body: bytes, scope="global") -> bytes:
    """The bytes a worker gets for a client body without cache_salt: the same bytes with the
    scope's cache_salt added as the last member (kvgate copies everything else unchanged)."""
    assert body.rstrip().endswith(b"}") and b"cache_salt" not in body
    head = body.rstrip()[:-1]
    sep = b"" if head.rstrip().endswith(b"{") else b","
    return head + sep + b'"cache_salt":"' + salt_of(scope).encode() + b'"}'

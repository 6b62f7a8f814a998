#!/usr/bin/python3
"""A local HTTP server for remote-input tests and benchmarks (Python standard
library only): serves the files under ROOT with HEAD, single and multiple
byte ranges (multipart/byteranges), ETag and Last-Modified, over HTTP/1.1
keep-alive, and injects faults on demand.

The same server answers /vsicurl/ (http://127.0.0.1:PORT/path) and /vsis3/
(AWS_S3_ENDPOINT=127.0.0.1:PORT, AWS_HTTPS=NO, AWS_VIRTUAL_HOSTING=FALSE:
GET /bucket/key): a minimal S3-compatible responder for GET and HEAD, whose
SigV4 signature is not checked but whose presence is counted, so a test can
see that the credentials were sent (and grep them out of every output).

Control (GET /__ctl?...; answers JSON with the counters):
  latency=S          seconds added to every request (0.05: a 50 ms link)
  kind=K&n=N         the next N range GETs fail with K
  kind=K&every=E     every E-th range GET fails with K (until kind=none)
  kind=outage        every request (HEAD too) answers 503 until kind=none
  kind=silent        every request (HEAD too) is accepted and never answered
                     (the connection held open) until kind=none
  kind=drip          every request is answered one byte a second
  reset=1            zero the counters
K: 503 | 429 | 500 | reset (connection dropped, RST) | truncate (half the
body, then the connection is closed) | stall (no answer, connection held).
Counters: requests, gets, heads, bytes (body bytes sent), faults, signed
(requests with an AWS4-HMAC-SHA256 Authorization header), ranges (range
GETs), queries (the query strings seen, for redaction checks).

Run: httpfault.py ROOT [PORT]  (prints "port N" on stdout once listening;
PORT 0 = any free port).
"""
import email.utils
import hashlib
import http.server
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.parse

LOCK = threading.Lock()
STATE = {"latency": 0.0, "kind": "none", "n": 0, "every": 0}
COUNT = {}


def reset_counts():
    COUNT.update(requests=0, gets=0, heads=0, bytes=0, faults=0, signed=0, ranges=0,
                 range_gets=0, queries=[])


reset_counts()


def etag_of(path):
    st = os.stat(path)
    h = hashlib.md5(f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode()).hexdigest()
    return f'"{h}"', st


def parse_ranges(header, size):
    """[(start, end inclusive)] of a Range header, or None (not satisfiable)."""
    if not header or not header.startswith("bytes="):
        return None
    out = []
    for part in header[6:].split(","):
        a, _, b = part.strip().partition("-")
        if a == "":
            n = int(b)
            start, end = max(0, size - n), size - 1
        else:
            start = int(a)
            end = int(b) if b else size - 1
        end = min(end, size - 1)
        if start > end:
            continue
        out.append((start, end))
    return out or None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root = "."

    def log_message(self, fmt, *args):
        pass

    def _fault_for(self, is_range_get):
        """The fault this request gets, or None."""
        with LOCK:
            kind = STATE["kind"]
            if kind == "outage":
                COUNT["faults"] += 1
                return "503"
            if kind in ("silent", "drip"):
                COUNT["faults"] += 1
                return kind
            if kind == "none" or not is_range_get:
                return None
            COUNT["range_gets"] += 1
            if STATE["n"] > 0:
                STATE["n"] -= 1
                if STATE["n"] == 0 and not STATE["every"]:
                    STATE["kind"] = "none"
                COUNT["faults"] += 1
                return kind
            if STATE["every"] and COUNT["range_gets"] % STATE["every"] == 0:
                COUNT["faults"] += 1
                return kind
        return None

    def _error(self, code, body=b""):
        self.send_response(code)
        if code in (429, 503):
            self.send_header("Retry-After", "0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _control(self, query):
        q = urllib.parse.parse_qs(query)
        with LOCK:
            if "latency" in q:
                STATE["latency"] = float(q["latency"][0])
            if "kind" in q:
                STATE["kind"] = q["kind"][0]
                STATE["n"] = int(q.get("n", ["0"])[0])
                STATE["every"] = int(q.get("every", ["0"])[0])
            if "reset" in q:
                reset_counts()
            body = json.dumps(dict(COUNT, **STATE)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, head):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/__ctl":
            return self._control(url.query)
        with LOCK:
            COUNT["requests"] += 1
            COUNT["heads" if head else "gets"] += 1
            if url.query:
                COUNT["queries"].append(url.query)
            if self.headers.get("Authorization", "").startswith("AWS4-HMAC-SHA256"):
                COUNT["signed"] += 1
            latency = STATE["latency"]
        if latency:
            time.sleep(latency)
        rel = urllib.parse.unquote(url.path).lstrip("/")
        path = os.path.realpath(os.path.join(self.root, rel))
        rng = self.headers.get("Range")
        fault = self._fault_for(not head and rng is not None)
        if fault in ("silent", "stall"):
            # accepted, never answered: held until the client gives up (or
            # the fault is lifted: then the connection is closed unanswered)
            for _ in range(6000):
                with LOCK:
                    if STATE["kind"] == "none":
                        break
                time.sleep(0.1)
            self.close_connection = True
            return
        if fault == "drip":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(100000):
                with LOCK:
                    if STATE["kind"] == "none":
                        break
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(1.0)
            self.close_connection = True
            return
        if fault in ("503", "429", "500"):
            return self._error(int(fault), b"<Error><Code>SlowDown</Code></Error>")
        if fault == "reset":
            # RST instead of FIN: curl sees "Connection reset by peer" (or an
            # empty reply), as from a dropping load balancer.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if not path.startswith(os.path.realpath(self.root)) or not os.path.isfile(path):
            return self._error(404, b"<Error><Code>NoSuchKey</Code></Error>")
        etag, st = etag_of(path)
        size = st.st_size
        ranges = parse_ranges(rng, size) if rng else None
        if rng and ranges is None:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with open(path, "rb") as f:
            if not ranges:
                body = f.read() if not head else b""
                self.send_response(200)
                ctype, length = "application/octet-stream", size
            elif len(ranges) == 1:
                a, b = ranges[0]
                f.seek(a)
                body = f.read(b - a + 1) if not head else b""
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {a}-{b}/{size}")
                ctype, length = "application/octet-stream", b - a + 1
            else:
                parts = []
                for a, b in ranges:
                    f.seek(a)
                    parts.append(b"--TWBOUNDARY\r\nContent-Type: application/octet-stream\r\n"
                                 + f"Content-Range: bytes {a}-{b}/{size}\r\n\r\n".encode()
                                 + f.read(b - a + 1) + b"\r\n")
                body = b"".join(parts) + b"--TWBOUNDARY--\r\n"
                self.send_response(206)
                ctype, length = "multipart/byteranges; boundary=TWBOUNDARY", len(body)
                if head:
                    body = b""
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        self.end_headers()
        if head:
            return
        if ranges:
            with LOCK:
                COUNT["ranges"] += len(ranges)
        if fault == "truncate":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            with LOCK:
                COUNT["bytes"] += len(body) // 2
            return
        self.wfile.write(body)
        with LOCK:
            COUNT["bytes"] += len(body)

    def do_GET(self):
        try:
            self._serve(False)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_HEAD(self):
        try:
            self._serve(True)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(root, port=0):
    """Start in a background thread; returns the server (server_port)."""
    Handler.root = root
    srv = Server(("127.0.0.1", port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


if __name__ == "__main__":
    srv = serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(f"port {srv.server_port}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass

"""`meshtensor serve` at the edges of HTTP, from raw sockets (the standard library only).

Usage: python3 http_edges.py <case> <base url>
  stream_scores  streamed echo + logprobs: every prompt token but the first is scored, in 40
                 requests alone and 40 under load; text_offset counts the whole text in
                 every chunk; the running-batch gauge is 0 once the server is idle
  framing        1e999 gets 400 naming the field; two Content-Lengths get 400; pipelined
                 requests are answered in order; 413 comes before the body is sent
  connections    1,000 idle and trickling connections leave /health answering within 1 s
  over_limit     connections past --max-connections get 503 at once
Exits 1 naming the first check that failed.
"""

import json
import resource
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request

CASE, URL = sys.argv[1], sys.argv[2]
HOST, PORT = urllib.parse.urlsplit(URL).hostname, urllib.parse.urlsplit(URL).port


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def connect(timeout=10.0):
    sock = socket.create_connection((HOST, PORT), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request_bytes(method, path, body=None, extra=""):
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + (body.encode() if body is not None else b"")


class Reader:
    """Reads HTTP/1.1 responses (Content-Length or chunked) off one socket, in order."""

    def __init__(self, sock):
        self.sock, self.data = sock, b""

    def _fill(self):
        got = self.sock.recv(65536)
        if not got:
            raise EOFError("the server closed the connection")
        self.data += got

    def _line(self):
        while b"\r\n" not in self.data:
            self._fill()
        line, self.data = self.data.split(b"\r\n", 1)
        return line.decode("latin-1")

    def _take(self, n):
        while len(self.data) < n:
            self._fill()
        out, self.data = self.data[:n], self.data[n:]
        return out

    def response(self):
        status = int(self._line().split()[1])
        headers = {}
        while True:
            line = self._line()
            if not line:
                break
            name, value = line.split(":", 1)
            headers.setdefault(name.strip().lower(), []).append(value.strip())
        if status == 100:
            return self.response()
        if "chunked" in headers.get("transfer-encoding", [""])[0].lower():
            body = b""
            while True:
                size = int(self._line(), 16)
                body += self._take(size)
                self._take(2)
                if size == 0:
                    break
        else:
            body = self._take(int(headers.get("content-length", ["0"])[0]))
        return status, headers, body.decode("utf-8", "replace")


def call(method, path, body=None, extra=""):
    with connect() as sock:
        sock.sendall(request_bytes(method, path, body, extra))
        return Reader(sock).response()


def events(text):
    """The JSON events of a server-sent event stream (without [DONE])."""
    out = []
    for line in text.split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def metric(name):
    _, _, body = call("GET", "/metrics")
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    fail(f"no {name} in /metrics")


# --- stream_scores -------------------------------------------------------------------------

PROMPT = "The quick brown fox jumps over"


def streamed_echo():
    body = json.dumps({"prompt": PROMPT, "max_tokens": 3, "logprobs": 1, "echo": True,
                       "stream": True, "temperature": 0})
    status, _, text = call("POST", "/v1/completions", body)
    if status != 200:
        fail(f"streamed echo: status {status}: {text}")
    return events(text)


def check_stream(chunks, label):
    first = chunks[0]["choices"][0]
    if not first["text"].startswith(PROMPT):
        fail(f"{label}: the first chunk does not carry the prompt: {first['text']!r}")
    scores = first["logprobs"]["token_logprobs"][: len(PROMPT)]
    if scores[0] is not None or any(s is None for s in scores[1:]):
        fail(f"{label}: prompt scores missing in the first chunk: {scores}")
    whole = 0
    for chunk in chunks:
        choice = chunk["choices"][0]
        offsets = choice["logprobs"]["text_offset"] if choice["logprobs"] else []
        expected = list(range(whole, whole + len(offsets)))
        if offsets != expected:
            fail(f"{label}: text_offset {offsets}, not {expected} (the whole text's offsets)")
        whole += len(choice["text"].encode("utf-8", "surrogateescape"))


def busy(stop):
    while not stop.is_set():
        call("POST", "/v1/completions",
             json.dumps({"prompt": "load " * 8, "max_tokens": 24, "n": 4}))


def stream_scores():
    for i in range(40):
        check_stream(streamed_echo(), f"idle request {i}")
    stop = threading.Event()
    loaders = [threading.Thread(target=busy, args=(stop,)) for _ in range(4)]
    for t in loaders:
        t.start()
    try:
        time.sleep(0.2)
        for i in range(40):
            check_stream(streamed_echo(), f"request {i} under load")
    finally:
        stop.set()
        for t in loaders:
            t.join()
    deadline = time.monotonic() + 1.0
    while metric("meshtensor_running_batch") != 0:
        if time.monotonic() > deadline:
            fail("meshtensor_running_batch is not 0 a second after the last request ended")
        time.sleep(0.05)
    print("ok: streamed prompt scores in 80/80 requests, whole-text offsets, idle gauge 0")


# --- framing -------------------------------------------------------------------------------

def framing():
    status, _, body = call("POST", "/v1/completions", '{"prompt":"a","max_tokens":1e999}')
    if status != 400 or '"param":"max_tokens"' not in body:
        fail(f"max_tokens 1e999: status {status}: {body}")
    with connect() as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n"
                     b"Content-Length: 14\r\n\r\n{\"prompt\":\"a\"}")
        status, _, body = Reader(sock).response()
    if status != 400:
        fail(f"two different Content-Lengths: status {status}: {body}")
    # Three requests in one write: three answers, in order.
    with connect() as sock:
        sock.sendall(request_bytes("GET", "/health") +
                     request_bytes("POST", "/v1/completions",
                                   '{"prompt":"pipe","max_tokens":2,"temperature":0}') +
                     request_bytes("GET", "/v1/models"))
        reader = Reader(sock)
        answers = [reader.response() for _ in range(3)]
    if [a[0] for a in answers] != [200, 200, 200] or '"status":"ok"' not in answers[0][2] or \
            '"text_completion"' not in answers[1][2] or '"object":"list"' not in answers[2][2]:
        fail(f"pipelined requests: {[(a[0], a[2][:60]) for a in answers]}")
    # A body past the limit: 413 from the headers alone, before a byte of it is sent.
    for length in (100 << 20, 1 << 63):
        with connect(timeout=2.0) as sock:
            start = time.monotonic()
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         f"Content-Length: {length}\r\n\r\n".encode())
            try:
                status, _, body = Reader(sock).response()
            except (socket.timeout, EOFError) as e:
                fail(f"Content-Length {length}: no answer before the body ({e})")
            if status != 413 or time.monotonic() - start > 1.0:
                fail(f"Content-Length {length}: status {status} after "
                     f"{time.monotonic() - start:.2f} s: {body}")
    print("ok: 1e999 named, two lengths refused, pipelined answers in order, 413 on headers")


# --- connections ---------------------------------------------------------------------------

def raise_file_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))


def health_seconds():
    start = time.monotonic()
    with connect(timeout=5.0) as sock:
        sock.sendall(request_bytes("GET", "/health"))
        status, _, _ = Reader(sock).response()
    if status != 200:
        fail(f"/health answered {status}")
    return time.monotonic() - start


def connections():
    raise_file_limit()
    idle = [connect() for _ in range(500)]
    trickling = [connect() for _ in range(500)]
    partial = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "
    worst = 0.0
    for round_ in range(10):
        for sock in trickling:
            sock.send(partial[round_:round_ + 1] if round_ < len(partial) else b"a")
        worst = max(worst, health_seconds())
        time.sleep(0.2)
    status, _, body = call("POST", "/v1/completions", '{"prompt":"still","max_tokens":2}')
    if status != 200:
        fail(f"a completion beside 1,000 slow connections: {status}: {body}")
    for sock in idle + trickling:
        sock.close()
    if worst > 1.0:
        fail(f"/health took {worst:.2f} s beside 1,000 idle and trickling connections")
    print(f"ok: beside 1,000 idle and trickling connections /health took at most {worst:.3f} s")


def over_limit():
    limit = int(sys.argv[3])
    held = [connect() for _ in range(limit)]
    time.sleep(0.2)
    start = time.monotonic()
    with connect(timeout=5.0) as sock:
        sock.sendall(request_bytes("GET", "/health"))
        status, headers, body = Reader(sock).response()
    if status != 503 or "too_many_connections" not in body or \
            time.monotonic() - start > 1.0:
        fail(f"past the limit: status {status} after {time.monotonic() - start:.2f} s: {body}")
    for sock in held:
        sock.close()
    time.sleep(0.3)
    if health_seconds() > 1.0:
        fail("/health slow once the connections closed")
    print(f"ok: connection {limit + 1} answered 503 at once; served again once they closed")


{"stream_scores": stream_scores, "framing": framing, "connections": connections,
 "over_limit": over_limit}[CASE]()

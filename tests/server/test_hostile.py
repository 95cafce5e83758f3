"""Hostile input: malformed / duplicate-key / deeply nested JSON, wrong types, invalid UTF-8,
oversized bodies and headers, slow-loris clients, 1000 abrupt disconnects. Afterwards the server
must still answer a normal request correctly."""
import json
import os
import socket
import struct
import time
from urllib.parse import urlparse

from conftest import http
import pytest

U = urlparse(os.environ.get("DSINFER_URL", "http://127.0.0.1:8000"))
HOST, PORT = U.hostname, U.port


def raw(request: bytes, timeout=30.0) -> bytes:
    with socket.create_connection((HOST, PORT), timeout=timeout) as s:
        try:
            s.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (413, 431) before reading everything
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            out += chunk
        return out


def post(path: str, body: bytes, key: str, extra: bytes = b"") -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n").encode() + extra + b"\r\n"
    return raw(head + body)


def status(reply: bytes) -> int:
    return int(reply[9:12]) if reply.startswith(b"HTTP/1.1 ") else 0


def chat(content) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 2}).encode()


@pytest.mark.parametrize("body", [
    b"{", b"not json", b"[]", b"null", b'{"messages": 5}', b'{"messages": [{"role": 1}]}',
    b'{"messages": [{"role": "user", "content": {"a": 1}}]}', b'{"messages": [], "max_tokens": -1}',
    b'{"messages": [{"role":"user","content":"x"}], "temperature": "hot"}',
    b'{"messages": [{"role":"user","content":"x"}], "n": 1e400}',
    b'{"messages": [{"role":"user","content":"x"}], "stop": [1, 2]}',
    b'{"messages": [{"role":"user","content":"x"}], "logit_bias": {"abc": 1}}',
    b'{"messages": [{"role":"user","content":"\xff\xfe"}]}',
    b'{"messages": [{"role":"user","content":"\\ud800"}]}',
    b"[" * 100000 + b"]" * 100000,
    b'{"a":' * 50000 + b"1" + b"}" * 50000,
])
def test_malformed_bodies_are_400(key, body):
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions"):
        r = post(path, body, key)
        assert status(r) == 400, (path, body[:60], r[:300])
        payload = json.loads(r.split(b"\r\n\r\n", 1)[1])
        assert "error" in payload


def test_duplicate_keys_take_the_last_value(key):
    body = b'{"messages":[{"role":"user","content":"x"}],"max_tokens":500000,"max_tokens":1}'
    r = post("/v1/chat/completions", body, key)
    assert status(r) == 200, r[:300]
    assert json.loads(r.split(b"\r\n\r\n", 1)[1])["usage"]["completion_tokens"] == 1


def test_user_text_cannot_inject_special_tokens(url, key):
    plain = http("POST", "/tokenize", {"messages": [{"role": "user", "content": "<｜Assistant｜>"}]},
                 key).json()["tokens"]
    special = http("POST", "/tokenize", {"prompt": "<｜Assistant｜>"}, key).json()["tokens"]
    assert len(special) == 1
    assert plain.count(special[0]) == 1  # only the template's own <｜Assistant｜>


def test_oversized_body_and_headers(key):
    big = b"x" * (9 * 1024 * 1024)
    assert status(post("/v1/chat/completions", big, key)) == 413
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    assert status(raw(head)) == 431
    many = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(5000)) + b"\r\n"
    assert status(raw(many)) == 431


def test_garbage_http_is_rejected():
    assert status(raw(b"\x00\x01\x02 garbage\r\n\r\n")) in (400, 0)
    assert status(raw(b"GET / HTTP/9.9\r\n\r\n")) in (400, 0)
    assert status(raw(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n")) in (400, 0)


def test_slow_loris_is_dropped():
    s = socket.create_connection((HOST, PORT), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    start = time.time()
    closed = False
    while time.time() - start < 25:
        try:
            s.sendall(b"X-a: b\r\n")
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        s.settimeout(1.0)
        try:
            data = s.recv(4096)
            if data == b"" or data.startswith(b"HTTP/1.1 408"):
                closed = True
                break
        except socket.timeout:
            pass
    s.close()
    assert closed, "a client trickling headers kept its connection past the header deadline"


def test_thousand_abrupt_disconnects_then_normal_request(url, key, model):
    body = chat("hello")
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    for i in range(1000):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
        s.connect((HOST, PORT))
        if i % 3 == 0:
            s.sendall(req[: len(req) // 2])
        elif i % 3 == 1:
            s.sendall(req)
        s.close()
    deadline = time.time() + 60
    while time.time() < deadline:
        m = http("GET", "/metrics", key=key).text
        running = [l for l in m.splitlines() if l.startswith("dsinfer:num_requests_running ")]
        waiting = [l for l in m.splitlines() if l.startswith("dsinfer:num_requests_waiting ")]
        if running and float(running[0].split()[1]) == 0 and float(waiting[0].split()[1]) == 0:
            break
        time.sleep(0.5)
    else:
        pytest.fail("abandoned requests were not cancelled")
    r = http("POST", "/v1/chat/completions",
             {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}, key)
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] >= 1


def test_streaming_disconnect_is_counted_as_abort(url, key, model):
    def aborted():
        m = http("GET", "/metrics", key=key).text
        line = [l for l in m.splitlines() if l.startswith('dsinfer:num_aborted_requests_total{reason="client_disconnect"}')]
        return float(line[0].split()[1])
    before = aborted()
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000,
                       "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection((HOST, PORT), timeout=60)
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")  # streaming has begun
    s.close()
    deadline = time.time() + 10
    while aborted() == before and time.time() < deadline:
        time.sleep(0.1)
    assert aborted() == before + 1

"""The HTTP layer under hostile or unusual clients (issue #34, items 1-4, 6 and 7): connections
that trickle their headers do not slow other clients and are closed at the header deadline;
SIGTERM drains (running streams finish, or end with an error event and [DONE] after
--shutdown-timeout; exit 0); a second server cannot take the port; chunked bodies and headers have
caps; Connection: close, 405s, 401 accounting; a non-streaming request is cancelled when its client
leaves."""
import http.client
import json
import signal
import socket
import statistics
import subprocess
import threading
import time

import pytest

from conftest import MODEL_NAME, TINY_MODEL, Server, sample_value

OK = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4, "temperature": 0}


def timed_completion(port, timeout=5):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(OK), {"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    conn.close()
    return r.status, time.perf_counter() - start


def raw_exchange(port, data, timeout=5):
    """Sends raw bytes, returns everything the server sends until it closes (or the timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return b"".join(chunks), True
                chunks.append(chunk)
        except socket.timeout:
            return b"".join(chunks), False


def test_trickling_connections_do_not_starve_others(moet_bin, model_dir, tmp_path):
    s = Server(moet_bin, model_dir, tmp_path / "trickle.log", "--header-timeout", "6", "--max-connections", "2048")
    try:
        base = [timed_completion(s.port) for _ in range(10)]
        assert all(status == 200 for status, _ in base)
        socks = []
        for _ in range(1000):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(c)
        opened = time.time()
        stop = threading.Event()

        def trickle():  # one more partial header line every half second, for ever
            while not stop.wait(0.5):
                for c in socks:
                    try:
                        c.send(b"X-Slow: 1\r\n")
                    except OSError:
                        pass

        t = threading.Thread(target=trickle)
        t.start()
        time.sleep(1.0)
        during = [timed_completion(s.port) for _ in range(10)]
        assert all(status == 200 for status, _ in during), during
        base_median = statistics.median(d for _, d in base)
        during_median = statistics.median(d for _, d in during)
        assert during_median < 2 * base_median + 0.05, (base, during)
        assert max(d for _, d in during) < 1.0, during
        # The header deadline counts from the first byte: trickling does not extend it.
        time.sleep(max(0.0, opened + 7.5 - time.time()))
        stop.set()
        t.join()
        closed = 0
        for c in socks:
            c.settimeout(0.5)
            try:
                closed += c.recv(1) == b""
            except ConnectionResetError:
                closed += 1
            except socket.timeout:
                pass
            c.close()
        assert closed == len(socks)
        assert timed_completion(s.port)[0] == 200
    finally:
        s.stop()
    assert s.proc.returncode == 0


def open_stream(port, body, path="/v1/completions"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    return conn, response


def stream_body(body):
    return {**body, "stream": True}


LONG = {"model": MODEL_NAME, "prompt": "Once upon a time", "temperature": 0, "ignore_eos": True}


def rest_of_stream(response):
    """Reads the rest of a chunked SSE body with http.client (which checks the chunk framing and
    raises IncompleteRead on an unterminated body); returns the data payloads."""
    text = response.read().decode()
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            out.append("[DONE]" if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


def test_sigterm_lets_running_streams_finish(moet_bin, tmp_path):
    s = Server(moet_bin, TINY_MODEL, tmp_path / "drain.log", "--shutdown-timeout", "30", max_model_len=1024)
    streams = [open_stream(s.port, stream_body({**LONG, "max_tokens": 300, "prompt": f"Story {i}:"})) for i in range(4)]
    for _, response in streams:
        assert response.readline().startswith(b"data: ")  # the stream is running
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert s.proc.poll() is None, "the server must wait for its running streams"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", s.port), timeout=2)
    for conn, response in streams:
        events = rest_of_stream(response)
        assert events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        conn.close()
    assert s.proc.wait(timeout=30) == 0
    s.log.close()


def test_sigterm_after_the_timeout_ends_every_stream_with_done(moet_bin, tmp_path):
    s = Server(moet_bin, TINY_MODEL, tmp_path / "cut.log", "--shutdown-timeout", "1", max_model_len=4096)
    streams = [open_stream(s.port, stream_body({**LONG, "max_tokens": 3000, "prompt": f"Story {i}:"}))
               for i in range(4)]
    chat = open_stream(s.port, {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Tell me a story"}],
                                "max_tokens": 3000, "stream": True, "ignore_eos": True}, "/v1/chat/completions")
    streams.append(chat)
    blocking = {}

    def non_streaming():
        blocking["result"] = timed_completion_body(s.port, {**LONG, "max_tokens": 3000})

    t = threading.Thread(target=non_streaming)
    t.start()
    for _, response in streams:
        assert response.readline().startswith(b"data: ")
    time.sleep(0.2)
    start = time.time()
    s.proc.send_signal(signal.SIGTERM)
    for conn, response in streams:
        events = rest_of_stream(response)  # raises IncompleteRead if the chunked body is not terminated
        assert events[-1] == "[DONE]"
        assert "error" in events[-2] and events[-2]["error"]["message"]
        assert events[-3]["choices"][0]["finish_reason"] == "abort"
        conn.close()
    t.join(timeout=30)
    status, body = blocking["result"]
    assert status == 503 and json.loads(body)["error"]["message"]
    assert s.proc.wait(timeout=30) == 0
    assert time.time() - start < 10
    s.log.close()


def timed_completion_body(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def test_second_server_on_the_same_port_fails(moet_bin, model_dir, server):
    p = subprocess.run([moet_bin, "serve", str(model_dir), "--port", str(server.port), "--experts", "native",
                        "--max-model-len", "256"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "address already in use" in p.stderr.lower(), p.stderr
    assert server.post("/v1/completions", OK)[0] == 200


def send_until_answered(port, head, piece, total):
    """Sends head, then `piece` repeatedly up to `total` bytes while the server may answer and
    close; returns the server's answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        sent = 0
        try:
            while sent < total:
                s.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        return data, sent


def test_chunked_body_over_the_limit_is_413(server):
    rss = server.rss_bytes()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    piece = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"  # 64 KiB chunks: 20 MB in all, the limit is 8 MiB
    answer, _ = send_until_answered(server.port, head, piece, 20 << 20)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"error"' in answer
    assert server.rss_bytes() - rss < 30 << 20
    assert server.post("/v1/completions", OK)[0] == 200


def test_headers_over_the_limit_are_431(server):
    rss = server.rss_bytes()
    answer, _ = send_until_answered(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n",
                                    b"X-Filler: " + b"a" * 1000 + b"\r\n", 20 << 20)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert server.rss_bytes() - rss < 30 << 20
    assert server.get("/health")[0] == 200


def test_connection_close_is_honoured(server):
    answer, closed = raw_exchange(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200")
    assert b"connection: close" in answer.lower()
    assert closed, "the server must close the connection after answering"
    # The server's own "Connection: close" is kept too: after an error on a keep-alive connection
    # it either says close and closes, or keeps the connection and answers the next request.
    bad = b'{"prompt": '
    answer, closed = raw_exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                                  b"Content-Type: application/json\r\n\r\n%s" % (len(bad), bad) +
                                  b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=3)
    assert answer.startswith(b"HTTP/1.1 400")
    head = answer.split(b"\r\n\r\n")[0].lower()
    if b"connection: close" in head:
        assert closed and answer.count(b"HTTP/1.1 ") == 1
    else:
        assert answer.count(b"HTTP/1.1 ") == 2


def test_keep_alive_serves_pipelined_requests(server):
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    answer, _ = raw_exchange(server.port, request * 3 + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200") == 4


def test_wrong_method_is_405(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/v1/completions")
    r = conn.getresponse()
    body = json.loads(r.read())
    assert r.status == 405 and "POST" in r.getheader("Allow")
    assert body["error"]["message"]
    conn.close()


def test_model_by_id(server):
    status, body = server.get(f"/v1/models/{MODEL_NAME}")
    assert status == 200 and json.loads(body)["id"] == MODEL_NAME
    status, body = server.get("/v1/models/nope")
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"


def test_cors(moet_bin, model_dir, tmp_path):
    s = Server(moet_bin, model_dir, tmp_path / "cors.log", "--allowed-origins", "http://app.example")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        conn.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        r = conn.getresponse()
        r.read()
        assert r.status == 204
        assert r.getheader("Access-Control-Allow-Origin") == "http://app.example"
        assert "POST" in r.getheader("Access-Control-Allow-Methods")
        conn.request("GET", "/v1/models", headers={"Origin": "http://app.example"})
        r = conn.getresponse()
        r.read()
        assert r.status == 200 and r.getheader("Access-Control-Allow-Origin") == "http://app.example"
        conn.request("GET", "/v1/models", headers={"Origin": "http://evil.example"})
        r = conn.getresponse()
        r.read()
        assert r.getheader("Access-Control-Allow-Origin") is None
        conn.close()
    finally:
        s.stop()


def test_non_streaming_request_is_cancelled_when_its_client_leaves(tiny_server):
    before = sample_value(tiny_server.metrics(), "moet:request_success_total", finished_reason="abort")
    conn = http.client.HTTPConnection("127.0.0.1", tiny_server.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({**LONG, "max_tokens": 3000}),
                 {"Content-Type": "application/json"})
    deadline = time.time() + 10
    while sample_value(tiny_server.metrics(), "moet:num_requests_running") == 0 and time.time() < deadline:
        time.sleep(0.05)
    conn.sock.close()  # hang up before the answer
    conn.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        m = tiny_server.metrics()
        if sample_value(m, "moet:request_success_total", finished_reason="abort") > before and \
                sample_value(m, "moet:num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert sample_value(m, "moet:request_success_total", finished_reason="abort") == before + 1
    assert sample_value(m, "moet:num_requests_running") == 0
    assert sample_value(m, "moet:kv_blocks_used") == 0


def test_a_second_signal_exits_at_once(moet_bin, tmp_path):
    s = Server(moet_bin, TINY_MODEL, tmp_path / "twice.log", "--shutdown-timeout", "60", max_model_len=4096)
    conn, response = open_stream(s.port, stream_body({**LONG, "max_tokens": 3000}))
    assert response.readline().startswith(b"data: ")
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert s.proc.poll() is None  # draining: the stream may run for a minute
    start = time.time()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=10) == 1
    assert time.time() - start < 5
    conn.close()
    s.log.close()

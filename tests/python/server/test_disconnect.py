"""A client that disconnects mid-stream cancels its request: 8 streams aborted after a few chunks
give their KV blocks back (moet:kv_blocks_used returns to 0 in /metrics, aborts counted), while two
streams running alongside finish with exactly the output they have alone."""
import http.client
import json
import threading
import time

from conftest import MODEL_NAME, sample_value

BODY = {"model": MODEL_NAME, "max_tokens": 200, "temperature": 0, "stream": True, "ignore_eos": True}


def open_stream(server, prompt):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({**BODY, "prompt": prompt}),
                 {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def read_events(response, count=None):
    events = []
    while count is None or len(events) < count:
        line = response.fp.readline()
        if not line:
            break
        line = line.decode().strip()
        if line == "data: [DONE]":
            break
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
    return events


def stream_text(server, prompt):
    conn, response = open_stream(server, prompt)
    text = "".join(e["choices"][0]["text"] for e in read_events(response) if e["choices"])
    conn.close()
    return text


def test_aborted_streams_free_their_blocks(server):
    survivors = ["Survivor one says", "Survivor two says"]
    expected = [stream_text(server, p) for p in survivors]
    results = [None, None]

    def survive(i):
        results[i] = stream_text(server, survivors[i])

    aborted = [open_stream(server, f"Abort me {i} please") for i in range(8)]
    threads = [threading.Thread(target=survive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for conn, response in aborted:
        assert len(read_events(response, 3)) == 3
    assert sample_value(server.metrics(), "moet:kv_blocks_used") > 0
    for conn, response in aborted:
        conn.sock.close()  # hang up mid-stream
        conn.close()
    for t in threads:
        t.join(timeout=60)
    assert results == expected
    deadline = time.time() + 20
    while time.time() < deadline:
        m = server.metrics()
        if sample_value(m, "moet:kv_blocks_used") == 0 and sample_value(m, "moet:num_requests_running") == 0:
            break
        time.sleep(0.1)
    assert sample_value(m, "moet:kv_blocks_used") == 0
    assert sample_value(m, "moet:num_requests_running") == 0
    assert sample_value(m, "moet:request_success_total", finished_reason="abort") >= 8

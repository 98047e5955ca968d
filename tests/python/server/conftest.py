"""Fixtures of the server e2e suite: the test model folder (fixture weights + a tokenizer trained
here, see test_model.py) and running `moet serve` processes on free loopback ports, driven with
the official openai client."""
import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.request

import openai
import pytest

from test_model import build_model_dir

HERE = pathlib.Path(__file__).resolve().parent
FIXTURE = HERE.parents[1] / "fixtures" / "deepseek_v3"
MODEL_NAME = "tiny-test"
TINY_MODEL = HERE.parents[2] / "models" / "tiny"  # the bundled trained model (vocab 8192, 4096 positions)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `moet serve` child process; .url is its base URL, .get/.post speak raw HTTP."""

    def __init__(self, moet_bin, model_dir, log_path, *extra, max_model_len=256, port=None, experts="native"):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "w")
        args = [moet_bin, "serve", str(model_dir), "--port", str(self.port), "--served-model-name", MODEL_NAME,
                "--max-model-len", str(max_model_len), "--block-size", "8", "--max-num-batched-tokens", "64",
                "--max-num-seqs", "32", "--threads", "2",
                "--experts", experts,  # native unless a test is about the expert formats
                *map(str, extra)]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moet serve exited with {self.proc.returncode}; see {log_path}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moet serve did not become healthy; see {log_path}")

    def request(self, method, path, body=None, headers=None):
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, body, headers=None):
        return self.request("POST", path, body, headers)

    def metrics(self):
        from prometheus_client.parser import text_string_to_metric_families
        status, text = self.get("/metrics")
        assert status == 200
        return {f.name: f for f in text_string_to_metric_families(text.decode())}

    def client(self, api_key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60)

    def rss_bytes(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def log_text(self):
        self.log.flush()
        return pathlib.Path(self.log_path).read_text()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return build_model_dir(FIXTURE, tmp_path_factory.mktemp("server_model"))


@pytest.fixture(scope="session")
def server(moet_bin, model_dir, tmp_path_factory):
    s = Server(moet_bin, model_dir, tmp_path_factory.mktemp("logs") / "serve.log")
    yield s
    s.stop()
    assert s.proc.returncode == 0, "moet serve did not shut down cleanly on SIGTERM"


@pytest.fixture(scope="session")
def client(server):
    return server.client()


@pytest.fixture(scope="session")
def tiny_server(moet_bin, tmp_path_factory):
    """models/tiny (trained, so its outputs look like text) with a Hermes tool-call format."""
    s = Server(moet_bin, TINY_MODEL, tmp_path_factory.mktemp("tiny") / "tiny.log", "--tool-call-parser", "hermes",
               max_model_len=4096)
    yield s
    s.stop()


def sample_value(families, name, **labels):
    """The value of metric sample `name` with `labels` (sums over unlisted labels)."""
    total = 0.0
    for family in families.values():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total

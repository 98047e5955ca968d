"""The confidence gate's run-time endpoint through the real server (models/tiny, W2 experts, an FP4
pool with room for every expert, no manager): /admin/gate changes tau without a restart (tau 0:
the W2 output; tau 1: every step re-run until its experts are FP4, the --experts fp4 output), the
change shows on /metrics; bad values get 400 naming the field; the endpoint sits behind the API
key; the tau file is re-read when it changes."""
import json
import time

import pytest

from conftest import TINY_MODEL, Server

KEY = {"Authorization": "Bearer secret"}
PROMPT = [3, 140, 277, 414, 551, 688]


@pytest.fixture(scope="module")
def gate_server(moet_bin, tmp_path_factory):
    tau_file = tmp_path_factory.mktemp("gate") / "tau"
    tau_file.write_text("0\n")
    s = Server(moet_bin, TINY_MODEL, tmp_path_factory.mktemp("gate_logs") / "serve.log", "--fp4-pool-slots", 48,
               "--fp4-promote-per-step", 0, "--gate-rounds", 8, "--gate-budget", 1000, "--gate-tau-file", tau_file,
               "--api-key", "secret", max_model_len=4096, experts="w2")
    s.tau_file = tau_file
    yield s
    s.stop()


def cli_text(run_moet, *extra):
    result = run_moet("generate", "--model", TINY_MODEL, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", 8,
                      "--json", "--threads", 2, *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["text"]


def complete(server):
    status, body = server.post("/v1/completions", {"model": "tiny-test", "prompt": PROMPT, "max_tokens": 8,
                                                   "temperature": 0}, KEY)
    assert status == 200, body
    return json.loads(body)["choices"][0]["text"]


def metric(server, name):
    families = server.metrics()
    return families[name].samples[0].value


def set_tau(server, body, key=KEY):
    status, text = server.post("/admin/gate", body, key)
    return status, json.loads(text)


def test_tau_changes_without_a_restart(gate_server, run_moet):
    w2, fp4 = cli_text(run_moet), cli_text(run_moet, "--experts", "fp4")
    assert w2 != fp4, "the formats must differ for the test to mean anything"
    status, state = gate_server.request("GET", "/admin/gate", None, KEY)
    assert status == 200 and json.loads(state)["tau"] == 0 and json.loads(state)["fp4_tier"] is True
    assert complete(gate_server) == w2
    assert metric(gate_server, "moet:gate_judged_steps") == 0
    status, state = set_tau(gate_server, {"tau": 1})
    assert status == 200 and state["tau"] == 1.0 and state["rounds"] == 8
    assert complete(gate_server) == fp4
    assert metric(gate_server, "moet:gate_tau") == 1.0
    assert metric(gate_server, "moet:gate_gated_steps") == metric(gate_server, "moet:gate_judged_steps") == 8
    assert metric(gate_server, "moet:expert_fp4_forced_promotions") > 0
    assert set_tau(gate_server, {"tau": 0})[0] == 200
    assert metric(gate_server, "moet:gate_tau") == 0.0


@pytest.mark.parametrize("body, param", [
    ({"tau": 1.5}, "tau"), ({"tau": -0.2}, "tau"), ({"tau": "high"}, "tau"), ({"tau": None}, "tau"), ({}, "tau"),
    ({"tau": 0.5, "rounds": 3}, "rounds"),
])
def test_bad_values_are_400_naming_the_field(gate_server, body, param):
    status, error = set_tau(gate_server, body)
    assert status == 400
    assert error["error"]["param"] == param
    assert metric(gate_server, "moet:gate_tau") == 0.0  # unchanged


def test_bad_bodies_are_400(gate_server):
    assert gate_server.post("/admin/gate", b"{not json", KEY)[0] == 400
    assert gate_server.post("/admin/gate", [0.5], KEY)[0] == 400


def test_the_endpoint_needs_the_api_key(gate_server):
    assert set_tau(gate_server, {"tau": 0.5}, key={})[0] == 401
    assert gate_server.get("/admin/gate")[0] == 401
    assert metric(gate_server, "moet:gate_tau") == 0.0


def test_the_tau_file_is_read_again_when_it_changes(gate_server):
    gate_server.tau_file.write_text("0.25\n")
    deadline = time.time() + 10
    while time.time() < deadline:
        complete(gate_server)  # the file is polled at step starts
        if metric(gate_server, "moet:gate_tau") == 0.25:
            break
        time.sleep(0.3)
    assert metric(gate_server, "moet:gate_tau") == 0.25
    gate_server.tau_file.write_text("0\n")

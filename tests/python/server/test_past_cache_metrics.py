"""Past the expert cache through the real server (models/tiny, a cache of 24 of its 48 routed
experts, exclusive tiering, --cpu-experts auto, next-layer prefetch): requests are answered as the
resident CLI run answers them, and /metrics carries the modes' KPIs (moet:expert_*)."""
import json

import pytest

from conftest import TINY_MODEL, Server

PROMPT = [3, 140, 277, 414, 551, 688]


@pytest.fixture(scope="module")
def past_server(moet_bin, tmp_path_factory):
    s = Server(moet_bin, TINY_MODEL, tmp_path_factory.mktemp("past") / "serve.log", "--expert-cache-slots", 24,
               "--expert-tiering", "exclusive", "--cpu-experts", "auto", "--expert-prefetch", "next-layer",
               max_model_len=4096, experts="w2")
    yield s
    s.stop()


def test_answers_as_resident_and_reports(past_server, run_moet):
    resident = run_moet("generate", "--model", TINY_MODEL, "--prompt-ids", ",".join(map(str, PROMPT)),
                        "--max-tokens", 8, "--json")
    assert resident.returncode == 0, resident.stderr
    status, body = past_server.post("/v1/completions", {"model": "tiny-test", "prompt": PROMPT, "max_tokens": 8,
                                                        "temperature": 0})
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"] == json.loads(resident.stdout)["text"]
    families = past_server.metrics()
    value = lambda name: families[name].samples[0].value  # noqa: E731
    assert value("moet:expert_written_back_rows") > 0
    assert value("moet:expert_miss_host") + value("moet:expert_miss_fetch") > 0
    assert value("moet:expert_host_pairs") >= value("moet:expert_miss_host")
    assert 0 <= value("moet:expert_prefetch_hit_rate") <= 1 and value("moet:expert_prefetched_rows") > 0

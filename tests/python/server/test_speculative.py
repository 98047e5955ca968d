"""`moet serve --speculative-config` with the MTP layer of models/tiny: for k = 1, 2 and 3, greedy
completions (one request, then 16 concurrent ones, streamed and not) are token for token those of the
server without speculation, logprobs included; streamed chunks carry several tokens; /metrics reports
drafts, accepted tokens per position and the acceptance length."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import MODEL_NAME, TINY_MODEL, Server, sample_value

PROMPTS = [
    "def fibonacci(n):\n", "The history of the English language", "import os\ndef list_files(path):\n",
    "It was a cold morning when", "for i in range(10):\n", "The committee decided that",
    "#include <stdio.h>\nint main(void) {\n", "The server listens on port", "class Stack:\n    def __init__(self):\n",
    "Water \\Wa\"ter\\, n.", "with open(path) as f:\n", "The options are as follows:", "func main() {\n",
    "If the file does not exist,", "x = [i * i for i in", "The word is derived from",
]


def complete(client, prompt, **kw):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=20, temperature=0,
                                     extra_body={"ignore_eos": True}, **kw)


def texts(client, prompts, **kw):
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: complete(client, p, **kw).choices[0].text, prompts))


@pytest.fixture(scope="module")
def expected(tiny_server):
    client = tiny_server.client()
    return {"texts": [complete(client, p).choices[0].text for p in PROMPTS],
            "logprobs": complete(client, PROMPTS[0], logprobs=1).choices[0].logprobs.token_logprobs}


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_output_is_unchanged(moet_bin, tmp_path, expected, k):
    server = Server(moet_bin, TINY_MODEL, tmp_path / "spec.log", "--speculative-config",
                    f'{{"method":"mtp","num_speculative_tokens":{k}}}', max_model_len=4096)
    try:
        client = server.client()
        single = complete(client, PROMPTS[0], logprobs=1).choices[0]
        assert single.text == expected["texts"][0]
        assert single.logprobs.token_logprobs == expected["logprobs"]
        assert texts(client, PROMPTS) == expected["texts"]
        chunks = []
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            streams = list(pool.map(lambda p: [c.choices[0].text for c in complete(client, p, stream=True)], PROMPTS))
        assert ["".join(s) for s in streams] == expected["texts"]
        chunks = sum(len(s) for s in streams)
        assert chunks < 20 * len(PROMPTS)  # accepted drafts arrive with their bonus token in one chunk
        metrics = server.metrics()
        drafts = sample_value(metrics, "moet:spec_decode_num_drafts_total")
        accepted = sample_value(metrics, "moet:spec_decode_num_accepted_tokens_total")
        assert drafts > 0 and accepted > 0
        assert sample_value(metrics, "moet:spec_decode_acceptance_length") == pytest.approx(1 + accepted / drafts)
        per_position = [sample_value(metrics, "moet:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
                        for i in range(k)]
        assert sum(per_position) == accepted and per_position == sorted(per_position, reverse=True)
    finally:
        server.stop()
    assert server.proc.returncode == 0

"""The OpenAI surface of `moet serve`, driven with the official openai client: models, completions
and chat (streaming and not), stop strings, max_tokens, seeds, logprobs, n > 1, tool calls,
reasoning split, usage, tokenize/detokenize, /metrics and API keys."""
import json

import openai
import pytest

from conftest import MODEL_NAME, Server, sample_value
from test_model import FORCED_REASONING, FORCED_TOOL_CALL, token_id

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert models[0].object == "model"


def test_completion_stream_equals_non_stream(client):
    full = client.completions.create(model=MODEL_NAME, prompt="The quick brown", max_tokens=10, **GREEDY)
    choice = full.choices[0]
    assert choice.finish_reason == "length"
    assert full.usage.completion_tokens == 10
    assert full.usage.prompt_tokens > 0
    assert full.usage.total_tokens == full.usage.prompt_tokens + 10
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="The quick brown", max_tokens=10, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_stream_equals_non_stream(client):
    messages = [{"role": "user", "content": "Hello, how are you?"}]
    full = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, **GREEDY)
    assert full.choices[0].message.role == "assistant"
    assert full.usage.completion_tokens == 8
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, stream=True, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta for c in chunks]
    message = full.choices[0].message
    assert "".join(d.content or "" for d in deltas) == (message.content or "")
    assert ("".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
            == (getattr(message, "reasoning_content", None) or ""))


def test_max_tokens_and_eos(client):
    r = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens <= 3
    assert r.choices[0].finish_reason in ("length", "stop")


def test_stop_string_across_tokens(client):
    prompt = "def fibonacci(n):"
    ref = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, logprobs=0, **GREEDY)
    tokens = ref.choices[0].logprobs.tokens
    # A stop string spanning two tokens: the last char of token i and the first of token i+1.
    for i in range(1, len(tokens) - 1):
        a, b = tokens[i], tokens[i + 1]
        if a and b and a[-1].isascii() and b[0].isascii() and "\ufffd" not in a + b:
            stop = a[-1] + b[0]
            break
    else:
        pytest.skip("no ASCII token boundary in the reference output")
    text = ref.choices[0].text
    expected = text[:text.index(stop)]
    for stream in (False, True):
        r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, stop=[stop], stream=stream,
                                      **GREEDY)
        if stream:
            chunks = list(r)
            got, last = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0]
        else:
            got, last = r.choices[0].text, r.choices[0]
        assert got == expected
        assert last.finish_reason == "stop"
        assert last.model_extra["stop_reason"] == stop  # vLLM's extension field


def test_seed_reproducible(client):
    def run(seed):
        return client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=16, temperature=1.0,
                                         seed=seed, extra_body={"ignore_eos": True}).choices[0].text
    assert run(7) == run(7)
    assert run(7) != run(8)


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=4, logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0
        assert 1 <= len(top) <= 3  # a dict: tokens that decode alike (partial UTF-8) collapse
        assert max(top.values()) == pytest.approx(chosen, abs=1e-5)  # greedy picks the top token


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                       logprobs=True, top_logprobs=2, **GREEDY)
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_n_choices(client):
    r = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=8, n=3, temperature=1.0, seed=1,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert len({c.text for c in r.choices}) > 1
    assert r.usage.completion_tokens == 24
    stream = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=8, n=3, temperature=1.0, seed=1,
                                       stream=True, extra_body={"ignore_eos": True})
    texts = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in r.choices}


def test_tool_call_round_trip(client, model_dir):
    forced = {"logit_bias": {str(token_id(model_dir, FORCED_TOOL_CALL)): 100}}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=1, temperature=0,
                                       **forced)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # Streaming gives the same call.
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=1,
                                                 temperature=0, stream=True, **forced))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [("get_weather", {"city": "Paris"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # Round trip: the call (content null, as OpenAI sends it) and its result go back into the conversation.
    messages += [{"role": "assistant", "content": None,
                  "tool_calls": [tc.model_dump(exclude_none=True) for tc in choice.message.tool_calls]},
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    follow = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=4,
                                            **GREEDY)
    assert follow.choices[0].finish_reason in ("length", "stop")
    assert follow.usage.prompt_tokens > r.usage.prompt_tokens


def test_without_tools_the_markup_stays_content(client, model_dir):
    forced = {"logit_bias": {str(token_id(model_dir, FORCED_TOOL_CALL)): 100}}
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                       temperature=0, **forced)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == FORCED_TOOL_CALL


def test_reasoning_split(client, model_dir):
    forced = {"logit_bias": {str(token_id(model_dir, FORCED_REASONING)): 100}}
    messages = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=1, temperature=0, **forced)
    message = r.choices[0].message
    assert message.reasoning_content == "The user says hi."
    assert message.content == "Hello!"
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=1, temperature=0,
                                                 stream=True, **forced))
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "The user says hi."
    assert "".join(d.content or "" for d in deltas) == "Hello!"


def test_tokenize_detokenize(server):
    status, body = server.post("/tokenize", {"model": MODEL_NAME, "prompt": "Hello, how are you?"})
    assert status == 200
    tokens = json.loads(body)["tokens"]
    assert json.loads(body)["count"] == len(tokens) > 0
    status, body = server.post("/detokenize", {"model": MODEL_NAME, "tokens": tokens})
    assert status == 200 and json.loads(body)["prompt"] == "Hello, how are you?"


def test_metrics_parse(server, client):
    client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=4, **GREEDY)
    families = server.metrics()
    for name in ("moet:num_requests_running", "moet:num_requests_waiting", "moet:kv_cache_usage_perc",
                 "moet:kv_blocks_used", "moet:prefix_cache_queries", "moet:prefix_cache_hits", "moet:prompt_tokens",
                 "moet:generation_tokens", "moet:request_success", "moet:http_requests",
                 "moet:time_to_first_token_seconds", "moet:inter_token_latency_seconds"):
        assert name in families, name
    assert families["moet:time_to_first_token_seconds"].type == "histogram"
    assert sample_value(families, "moet:generation_tokens_total") >= 4
    assert sample_value(families, "moet:request_success_total", finished_reason="length") >= 1
    assert sample_value(families, "moet:time_to_first_token_seconds_count") >= 1
    assert sample_value(families, "moet:http_requests_total", status="200") >= 1


def test_api_key(moet_bin, model_dir, tmp_path):
    s = Server(moet_bin, model_dir, tmp_path / "serve_key.log", "--api-key", "sesame")
    try:
        before = s.metrics()
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").completions.create(model=MODEL_NAME, prompt="hi", max_tokens=1)
        status, body = s.get("/v1/models")
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        assert s.client("sesame").models.list().data[0].id == MODEL_NAME
        assert s.get("/health")[0] == 200  # health checks need no key
        after = s.metrics()
        # Each 401 counts once, as a 401 (not also as a 400), and logs one non-blank line.
        assert sample_value(after, "moet:http_requests_total", status="401") - \
            sample_value(before, "moet:http_requests_total", status="401") == 3
        assert sample_value(after, "moet:http_requests_total", status="400") == \
            sample_value(before, "moet:http_requests_total", status="400")
        lines = s.log_text().splitlines()
        assert sum(" 401" in line for line in lines) == 3
        assert all(line.strip() for line in lines)
    finally:
        s.stop()


def test_echo(client):
    r = client.completions.create(model=MODEL_NAME, prompt="The quick brown", max_tokens=4, echo=True, **GREEDY)
    plain = client.completions.create(model=MODEL_NAME, prompt="The quick brown", max_tokens=4, **GREEDY)
    assert r.choices[0].text == "The quick brown" + plain.choices[0].text
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="The quick brown", max_tokens=4, echo=True,
                                            stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_logprobs_bytes_of_a_partial_utf8_token(client, model_dir):
    byte_token = token_id(model_dir, "\u00e4")  # the byte-level token of the single byte 0xE4
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                       temperature=0, logprobs=True, top_logprobs=1,
                                       logit_bias={str(byte_token): 100})
    entry = r.choices[0].logprobs.content[0]
    assert entry.bytes == [0xE4]  # not U+FFFD's bytes [0xEF, 0xBF, 0xBD]
    assert entry.token == "\ufffd"


def test_serve_help(run_moet):
    out = run_moet("serve", "--help").stdout
    assert out.count("model folder") == 1
    assert "{false}" not in out and "{true}" not in out
    for flag in ("--max-header-bytes", "--header-timeout", "--shutdown-timeout", "--max-connections",
                 "--allowed-origins", "--max-request-bytes"):
        assert flag in out


def test_qwen3_template_takes_tool_calls_with_null_content(moet_bin, model_dir, shared_data, tmp_path):
    """Qwen3's template tests `'</think>' in message.content`, which fails on null content, and
    serializes arguments with tojson, which double-encodes a string: both are normalized."""
    import shutil
    qwen_dir = tmp_path / "qwen3_template"
    shutil.copytree(model_dir, qwen_dir)
    config = json.loads((qwen_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = json.loads((shared_data / "qwen3" / "tokenizer_config.json").read_text())["chat_template"]
    (qwen_dir / "tokenizer_config.json").write_text(json.dumps(config))
    s = Server(moet_bin, qwen_dir, tmp_path / "qwen3.log")
    try:
        messages = [{"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
        status, body = s.post("/tokenize", {"messages": messages, "tools": TOOLS})
        assert status == 200, body
        status, text = s.post("/detokenize", {"tokens": json.loads(body)["tokens"]})
        assert '"arguments": {"city": "Paris"}' in json.loads(text)["prompt"]
    finally:
        s.stop()

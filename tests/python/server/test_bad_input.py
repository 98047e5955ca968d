"""Each bad request gets a 4xx with OpenAI's error JSON, and the server keeps serving: after every
case a normal completion still succeeds. Unknown fields are ignored (200), as OpenAI does."""
import json

import pytest

from conftest import MODEL_NAME

OK = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

CASES = [
    ("malformed json", "/v1/completions", b'{"prompt": "hi", ', 400, None),
    ("body not an object", "/v1/completions", b'[1, 2]', 400, None),
    ("temperature wrong type", "/v1/completions", {**OK, "temperature": "hot"}, 400, "temperature"),
    ("max_tokens wrong type", "/v1/completions", {**OK, "max_tokens": "many"}, 400, "max_tokens"),
    ("stream wrong type", "/v1/completions", {**OK, "stream": "yes"}, 400, "stream"),
    ("prompt wrong type", "/v1/completions", {**OK, "prompt": 42}, 400, "prompt"),
    ("messages wrong type", "/v1/chat/completions", {**CHAT, "messages": "hi"}, 400, "messages"),
    ("message without role", "/v1/chat/completions", {**CHAT, "messages": [{"content": "hi"}]}, 400, "messages[0]"),
    ("unknown model", "/v1/completions", {**OK, "model": "gpt-17"}, 404, "model"),
    ("unknown model chat", "/v1/chat/completions", {**CHAT, "model": "gpt-17"}, 404, "model"),
    ("empty messages", "/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("prompt too long", "/v1/completions", {**OK, "prompt": list(range(3, 303))}, 400, "prompt"),
    ("prompt + max_tokens too long", "/v1/completions", {**OK, "prompt": list(range(3, 203)), "max_tokens": 100}, 400,
     "max_tokens"),
    ("chat prompt + max_tokens too long", "/v1/chat/completions", {**CHAT, "max_tokens": 1000}, 400, "max_tokens"),
    ("max_tokens zero", "/v1/completions", {**OK, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", "/v1/chat/completions", {**CHAT, "max_tokens": -5}, 400, "max_tokens"),
    ("logit_bias key not an id", "/v1/completions", {**OK, "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("logit_bias value not a number", "/v1/completions", {**OK, "logit_bias": {"5": "x"}}, 400, "logit_bias"),
    ("logit_bias id outside vocab", "/v1/completions", {**OK, "logit_bias": {"99999": 1}}, 400, "logit_bias"),
    ("logit_bias value out of range", "/v1/completions", {**OK, "logit_bias": {"5": 500}}, 400, "logit_bias"),
    ("top_p out of range", "/v1/completions", {**OK, "top_p": 1.5}, 400, "top_p"),
    ("temperature negative", "/v1/completions", {**OK, "temperature": -1}, 400, "temperature"),
    ("top_k below -1", "/v1/completions", {**OK, "top_k": -2}, 400, "top_k"),
    ("min_p out of range", "/v1/chat/completions", {**CHAT, "min_p": 2}, 400, "min_p"),
    ("repetition_penalty zero", "/v1/completions", {**OK, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("presence_penalty out of range", "/v1/completions", {**OK, "presence_penalty": 3}, 400, "presence_penalty"),
    ("frequency_penalty out of range", "/v1/chat/completions", {**CHAT, "frequency_penalty": -3}, 400,
     "frequency_penalty"),
    ("logprobs out of range", "/v1/completions", {**OK, "logprobs": 21}, 400, "logprobs"),
    ("top_logprobs out of range", "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, 400,
     "top_logprobs"),
    ("top_logprobs without logprobs", "/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    ("n out of range", "/v1/completions", {**OK, "n": 0}, 400, "n"),
    ("token id outside vocab", "/v1/completions", {**OK, "prompt": [1, 2, 100000]}, 400, "prompt"),
    ("stop_token_ids outside vocab", "/v1/completions", {**OK, "stop_token_ids": [100000]}, 400, "stop_token_ids"),
    ("empty stop string", "/v1/completions", {**OK, "stop": [""]}, 400, "stop"),
    ("model null", "/v1/completions", {**OK, "model": None}, 400, "model"),
    ("model null chat", "/v1/chat/completions", {**CHAT, "model": None}, 400, "model"),
    ("unknown role", "/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "messages[0].role"),
    ("user content null", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": None}]}, 400,
     "messages[0].content"),
    ("suffix", "/v1/completions", {**OK, "suffix": " end"}, 400, "suffix"),
    ("best_of above n", "/v1/completions", {**OK, "best_of": 3}, 400, "best_of"),
    ("echo with logprobs", "/v1/completions", {**OK, "echo": True, "logprobs": 1}, 400, "echo"),
    ("guided_grammar", "/v1/completions", {**OK, "guided_grammar": "root ::= \"a\""}, 400, "guided_grammar"),
    ("tool_choice unknown function", "/v1/chat/completions",
     {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice"),
    ("tool_choice invalid", "/v1/chat/completions",
     {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}, 400, "tool_choice"),
    ("tool_choice required without tools", "/v1/chat/completions", {**CHAT, "tool_choice": "required"}, 400,
     "tool_choice"),
    ("detokenize id outside vocab", "/detokenize", {"tokens": [1, 100000]}, 400, "tokens"),
    ("response_format not an object", "/v1/chat/completions", {**CHAT, "response_format": "json"}, 400,
     "response_format"),
    ("response_format unknown type", "/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}, 400,
     "response_format"),
    ("json_schema without schema", "/v1/chat/completions",
     {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400, "response_format"),
    ("json_schema unsupported keyword", "/v1/chat/completions",
     {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
         "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, 400, "response_format"),
    ("json_schema unsatisfiable", "/v1/completions",
     {**OK, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
         "type": "object", "required": ["a"], "additionalProperties": False}}}}, 400, "response_format"),
    ("guided_json not a schema", "/v1/completions", {**OK, "guided_json": 5}, 400, "guided_json"),
    ("guided_regex unsupported", "/v1/completions", {**OK, "guided_regex": "(a)\\1"}, 400, "guided_regex"),
    ("guided_choice empty", "/v1/completions", {**OK, "guided_choice": []}, 400, "guided_choice"),
    ("two constraints", "/v1/completions", {**OK, "guided_regex": "a", "guided_choice": ["a"]}, 400, "guided_choice"),
    ("tool_choice required with response_format", "/v1/chat/completions",
     {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, 400, "tool_choice"),
    ("invalid utf-8", "/v1/completions", b'{"prompt": "\xff\xfe bad", "max_tokens": 2}', 400, None),
    ("bad tokens to detokenize", "/detokenize", {"tokens": ["a"]}, 400, "tokens"),
]


def check_error(status, body, expected_status, param):
    assert status == expected_status, body
    error = json.loads(body)["error"]
    assert error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize("name,path,body,expected_status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_4xx_and_server_keeps_serving(server, name, path, body, expected_status, param):
    status, response = server.post(path, body)
    check_error(status, response, expected_status, param)
    status, response = server.post("/v1/completions", OK)
    assert status == 200, response


def test_oversized_body_is_413(server):
    body = json.dumps({**OK, "prompt": "x" * (10 * 1024 * 1024)}).encode()
    status, response = server.post("/v1/completions", body)
    check_error(status, response, 413, None)
    assert server.post("/v1/completions", OK)[0] == 200


def test_unknown_fields_are_ignored(server):
    status, response = server.post("/v1/completions", {**OK, "frobnicate": True, "metadata": {"a": 1}})
    assert status == 200, response
    status, response = server.post("/v1/chat/completions", {**CHAT, "user": "x", "parallel_tool_calls": False,
                                                            "some_future_field": [1, 2]})
    assert status == 200, response


def test_unknown_endpoint_is_404_json(server):
    status, response = server.get("/v1/nothing-here")
    check_error(status, response, 404, None)

"""Structured output on models/tiny (a small trained model that knows nothing of JSON): every
response_format / guided_* request ends with finish_reason "stop" and text that parses and
validates (jsonschema), greedy and sampled, streamed or not; tool_choice "required" and a named
function give tool calls whose arguments validate against the tool's parameters."""
import json
import re

import jsonschema
import pytest

from conftest import MODEL_NAME, sample_value

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
ORDER = {
    "$defs": {"item": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
        "qty": {"type": "integer", "minimum": 1, "maximum": 99},
        "price": {"type": "number", "minimum": 0, "maximum": 1000}},
        "required": ["sku", "qty", "price"], "additionalProperties": False}},
    "type": "object",
    "properties": {"id": {"type": "string", "format": "uuid"}, "date": {"type": "string", "format": "date"},
                   "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3},
                   "paid": {"type": "boolean"}, "note": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}]}},
    "required": ["id", "date", "items", "paid", "note"],
    "additionalProperties": False,
}
TREE = {
    "$defs": {"node": {"type": "object", "properties": {
        "label": {"type": "string", "maxLength": 6},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["label", "children"], "additionalProperties": False}},
    "$ref": "#/$defs/node",
}
TUPLE = {"type": "array", "prefixItems": [{"type": "integer", "minimum": -50, "maximum": 50},
                                          {"enum": ["x", "y", None]}, {"const": {"k": [1, 2]}}],
         "items": False}
SCHEMAS = {"person": PERSON, "order": ORDER, "tree": TREE, "tuple": TUPLE}


def chat(server, body, **extra):
    status, raw = server.post("/v1/chat/completions", {
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "Answer in JSON."}],
        "max_tokens": 1500, **body, **extra})
    assert status == 200, raw
    return json.loads(raw)


@pytest.mark.parametrize("name", SCHEMAS)
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 1},
                                      {"temperature": 1.2, "seed": 2, "top_p": 0.95}], ids=["greedy", "t1", "t1.2"])
def test_json_schema_output_validates(tiny_server, name, sampling):
    r = chat(tiny_server, {"response_format": {"type": "json_schema",
                                               "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}},
                           **sampling})
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    value = json.loads(choice["message"]["content"])
    jsonschema.validate(value, SCHEMAS[name], format_checker=jsonschema.FormatChecker())


def test_json_object_and_guided_json_stream_equals_non_stream(tiny_server):
    r = chat(tiny_server, {"response_format": {"type": "json_object"}, "temperature": 0})
    assert r["choices"][0]["finish_reason"] == "stop"
    assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)
    body = {"model": MODEL_NAME, "prompt": "A person:", "max_tokens": 1500, "temperature": 0,
            "guided_json": json.dumps(PERSON)}
    status, raw = tiny_server.post("/v1/completions", body)
    assert status == 200, raw
    text = json.loads(raw)["choices"][0]["text"]
    jsonschema.validate(json.loads(text), PERSON)
    streamed = "".join(c.choices[0].text for c in tiny_server.client().completions.create(
        model=MODEL_NAME, prompt="A person:", max_tokens=1500, temperature=0, stream=True,
        extra_body={"guided_json": PERSON}))
    assert streamed == text


def test_guided_regex_and_choice(tiny_server):
    pattern = r"(yes|no), because [a-z ]{1,30}\."
    client = tiny_server.client()
    for seed in range(3):
        r = client.completions.create(model=MODEL_NAME, prompt="Is it raining?", max_tokens=100, temperature=1.0,
                                      seed=seed, extra_body={"guided_regex": pattern})
        assert r.choices[0].finish_reason == "stop"
        assert re.fullmatch(pattern, r.choices[0].text), r.choices[0].text
    choices = ["red", "green", "dark blue"]
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "A colour?"}],
                                       max_tokens=20, n=4, temperature=1.5, seed=3,
                                       extra_body={"guided_choice": choices})
    assert all(c.message.content in choices and c.finish_reason == "stop" for c in r.choices)


def test_constrained_logprobs_and_cache(tiny_server):
    before = tiny_server.metrics()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    for _ in range(2):
        r = chat(tiny_server, {"response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": schema}},
                               "temperature": 0, "logprobs": True, "top_logprobs": 2})
        content = r["choices"][0]["logprobs"]["content"]
        # One entry per sampled token: the JSON's, then the end token's.
        assert "".join(t["token"] for t in content[:-1]) == r["choices"][0]["message"]["content"]
        assert json.loads(r["choices"][0]["message"]["content"]) in ({"ok": True}, {"ok": False})
    after = tiny_server.metrics()
    assert sample_value(after, "moet:structured_output_cache_misses_total") - \
        sample_value(before, "moet:structured_output_cache_misses_total") == 1
    assert sample_value(after, "moet:structured_output_cache_hits_total") - \
        sample_value(before, "moet:structured_output_cache_hits_total") == 1


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z][a-z]{2,8}/[A-Z][a-z]{2,8}$"}},
    "required": ["zone"], "additionalProperties": False}}}
TOOLS = {t["function"]["name"]: t for t in (WEATHER, TIME)}


def check_calls(calls):
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), TOOLS[call.function.name]["function"]["parameters"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tool_choice_named_and_required(tiny_server, seed):
    client = tiny_server.client()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, tools=list(TOOLS.values()), max_tokens=400, temperature=1.0, seed=seed,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named.choices[0].finish_reason == "tool_calls"
    calls = named.choices[0].message.tool_calls
    check_calls(calls)
    assert [c.function.name for c in calls] == ["get_time"]
    required = client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=list(TOOLS.values()),
                                              max_tokens=800, temperature=1.0, seed=seed, tool_choice="required")
    assert required.choices[0].finish_reason == "tool_calls"
    check_calls(required.choices[0].message.tool_calls)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=list(TOOLS.values()),
                                                 max_tokens=800, temperature=1.0, seed=seed, tool_choice="required",
                                                 stream=True))
    streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in streamed] == \
        [(c.function.name, c.function.arguments) for c in required.choices[0].message.tool_calls]

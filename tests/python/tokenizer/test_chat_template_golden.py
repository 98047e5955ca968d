"""Golden tests: `moet chat-template` against jinja2 configured exactly like HF transformers
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, {% generation %},
tojson/raise_exception/strftime_now). Every template in shared/data/templates plus the
tokenizer_config.json chat templates, times eight conversations: the rendered prompt must be
byte-identical, or both must fail.
"""
import copy
import json
import pathlib
import subprocess
from datetime import datetime

import jinja2
import pytest
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

SHARED = pathlib.Path(__file__).resolve().parents[4] / "shared" / "data"


class _Generation(Extension):
    """HF's AssistantTracker, reduced to what rendering needs: {% generation %} renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _hf_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]

TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call_0", "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}

THOUGHTFUL = {"role": "assistant", "content": "The answer is 4.", "reasoning_content": "2 + 2 = 4, simple."}

CONVERSATIONS = {
    "plain": {"messages": [{"role": "user", "content": "Hello! Who are you?"}]},
    "system": {"messages": [{"role": "system", "content": "You are a terse assistant."},
                            {"role": "user", "content": "Say hi in 中文."}]},
    "multi_turn": {"messages": [{"role": "user", "content": "What is 2+2?"},
                                {"role": "assistant", "content": "4"},
                                {"role": "user", "content": "And times 3?\nExplain."}]},
    "tool_call": {"tools": TOOLS, "messages": [
        {"role": "system", "content": "Use tools when helpful."},
        {"role": "user", "content": "Weather in Paris?"}, TOOL_CALL,
        {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": "{\"temp\": 18}"}]},
    "thinking_on": {"enable_thinking": True, "thinking": True, "reasoning_effort": "high", "messages": [
        {"role": "user", "content": "What is 2+2?"}, THOUGHTFUL, {"role": "user", "content": "Thanks!"}]},
    "thinking_off": {"enable_thinking": False, "thinking": False, "messages": [
        {"role": "user", "content": "What is 2+2?"}, THOUGHTFUL, {"role": "user", "content": "Thanks!"}]},
    "no_generation_prompt": {"add_generation_prompt": False, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"}]},
    "tools_no_call": {"tools": TOOLS, "reasoning_effort": "low", "messages": [
        {"role": "user", "content": "  spaces  and\ttabs  "}]},
}

TEMPLATE_FILES = sorted(SHARED.glob("templates/*.jinja")) + sorted(SHARED.glob("*/chat_template.from_tokenizer_config.jinja"))
MODEL_DIRS = [d for d in ("qwen3", "deepseek-v3", "kimi-k2") if (SHARED / d / "tokenizer_config.json").exists()]


def _request(name):
    request = copy.deepcopy(CONVERSATIONS[name])
    request.setdefault("add_generation_prompt", True)
    request.setdefault("bos_token", "<s>")
    request.setdefault("eos_token", "</s>")
    return request


def _oracle(source, request):
    variables = {"tools": None, "documents": None, **request}
    try:
        return _hf_environment().from_string(source).render(**variables), None
    except Exception as e:  # noqa: BLE001 - any jinja2 failure means moet must fail too
        return None, e


def _check(run_moet, tmp_path, source, extra_args, request):
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request, ensure_ascii=False), encoding="utf-8")
    want, error = _oracle(source, request)
    proc = run_moet("chat-template", *extra_args, "--request", path)
    if error is not None:
        assert proc.returncode != 0, f"jinja2 raised {error!r} but moet rendered"
        assert "line" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == want


@pytest.mark.parametrize("template", TEMPLATE_FILES, ids=lambda p: p.parent.name + "/" + p.stem)
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_template_file(template, conversation, run_moet, tmp_path):
    _check(run_moet, tmp_path, template.read_text(encoding="utf-8"), ["--template", template], _request(conversation))


@pytest.mark.parametrize("model", MODEL_DIRS)
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_model_dir(model, conversation, run_moet, tmp_path):
    config = json.loads((SHARED / model / "tokenizer_config.json").read_text(encoding="utf-8"))
    request = _request(conversation)
    for key in ("bos_token", "eos_token"):
        value = config.get(key)
        if value is not None:
            request[key] = value["content"] if isinstance(value, dict) else value
    _check(run_moet, tmp_path, config["chat_template"], ["--model", SHARED / model], request)

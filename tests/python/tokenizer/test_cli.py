"""`moet tokenize` and `moet chat-template` as users run them: output formats, exit codes, and
DeepSeek-V3.2's official chat-encoding test pair."""
import json


def test_tokenize_json_and_plain(run_moet, shared_data):
    proc = run_moet("tokenize", "--model", shared_data / "qwen3", "--text", "Hello world<|im_end|>", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"ids": [9707, 1879, 151645]}
    proc = run_moet("tokenize", "--model", shared_data / "qwen3", "--text", "Hello world")
    assert proc.stdout == "9707 1879\n"


def test_tokenize_special_tokens_flag(run_moet, shared_data):
    with_bos = run_moet("tokenize", "--model", shared_data / "mixtral", "--text", "Hi", "--json")
    without = run_moet("tokenize", "--model", shared_data / "mixtral", "--text", "Hi", "--json", "--no-special")
    assert json.loads(with_bos.stdout)["ids"] == [1] + json.loads(without.stdout)["ids"]


def test_tokenize_bad_model_dir(run_moet, tmp_path):
    proc = run_moet("tokenize", "--model", tmp_path, "--text", "x")
    assert proc.returncode == 1
    assert "tokenizer.json" in proc.stderr


def test_chat_template_prints_prompt_exactly(run_moet, shared_data, tmp_path):
    request = tmp_path / "r.json"
    request.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "enable_thinking": False}))
    proc = run_moet("chat-template", "--model", shared_data / "qwen3", "--request", request)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_chat_template_error_has_position(run_moet, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("line one\n{{ messages[0].content | nosuchfilter }}")
    request = tmp_path / "r.json"
    request.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    proc = run_moet("chat-template", "--template", template, "--request", request)
    assert proc.returncode == 1
    assert "line 2, column" in proc.stderr


def test_deepseek_v32_official_encoding_pair(run_moet, shared_data, tmp_path):
    folder = shared_data / "deepseek-v3.2"
    request = json.loads((folder / "encoding_test_input.json").read_text(encoding="utf-8"))
    # The pair was made with a non-jinja2 `from_json` filter for string arguments (HF's jinja2 has
    # none and raises, and so does moet); HF's convention is dict arguments, which takes the same path.
    for message in request["messages"]:
        for call in message.get("tool_calls") or []:
            if isinstance(call["function"]["arguments"], str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    request.update(enable_thinking=True, add_generation_prompt=False,
                   bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(request, ensure_ascii=False), encoding="utf-8")
    proc = run_moet("chat-template", "--template", shared_data / "templates" / "deepseek-ai-DeepSeek-V3.2.jinja",
                    "--request", path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (folder / "encoding_test_output.txt").read_text(encoding="utf-8").rstrip("\n")

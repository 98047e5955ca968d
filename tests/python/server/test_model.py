"""Builds the server tests' model folder: the deepseek_v3 fixture (random weights, vocab 512) plus
a small byte-level BPE tokenizer trained here with `tokenizers` and a ChatML chat template with
Hermes-style tools and an optional <think> opening. The weights are random, so tests that need a
particular output (tool calls, reasoning) force one token with logit_bias: the tokenizer has added
tokens whose text is a whole tool call or a whole reasoning block (FORCED_*)."""
import json
import shutil

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
FORCED_TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FORCED_REASONING = "<think>The user says hi.</think>Hello!"
FORCED = [FORCED_TOOL_CALL, FORCED_REASONING]

CHAT_TEMPLATE = """{%- if tools %}<|im_start|>system
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking %}<think>
{% endif %}{% endif %}"""

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Hello, how are you today? I am fine, thank you. What is the weather in Paris?",
    "Once upon a time there was a small model that served requests over HTTP.",
    "system user assistant tool response weather city Paris London Tokyo",
]


def build_model_dir(fixture, out):
    """Copies the fixture into `out` and writes tokenizer.json, tokenizer_config.json and
    generation_config.json (eos = <|im_end|>). Returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(fixture / name, out / name)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    base_vocab = 512 - len(SPECIAL) - len(MARKERS) - len(FORCED)
    trainer = trainers.BpeTrainer(vocab_size=base_vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.add_tokens(MARKERS + FORCED)
    assert tok.get_vocab_size() <= 512, tok.get_vocab_size()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "add_bos_token": False, "chat_template": CHAT_TEMPLATE}))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": SPECIAL.index("<|im_end|>")}))
    return out


def token_id(model_dir, text):
    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id(text)

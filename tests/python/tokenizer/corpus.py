"""Text corpus for the tokenizer golden tests and the encode benchmark.

`cases()` returns short targeted strings (scripts, combining marks, ZWJ emoji, code, whitespace
runs, CRLF, digits, special tokens inside text); `mixed_text(n)` returns about n bytes of mixed
real text, built deterministically from files every Debian/Python install has (Python stdlib
sources, /usr/share/common-licenses, the chat templates in shared/data) interleaved with
multilingual prose. Both sides of a golden test read the same corpus in the same run.
"""
import os
import pathlib
import random

MULTILINGUAL = [
    "人工智能正在改变我们的生活方式。机器学习模型需要大量的数据进行训练，而分词器是第一步。",
    "東京は日本の首都です。ひらがなとカタカナと漢字を混ぜて書きます。今日はいい天気ですね！",
    "대한민국의 수도는 서울입니다. 한국어는 한글로 씁니다. 안녕하세요, 만나서 반갑습니다.",
    "اللغة العربية هي إحدى أكثر اللغات انتشاراً في العالم، وتُكتب من اليمين إلى اليسار. مَرْحَبًا بِكُمْ",
    "हिन्दी भारत की राजभाषा है। यह देवनागरी लिपि में लिखी जाती है। नमस्ते, आप कैसे हैं?",
    "Москва — столица России. Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο. Καλημέρα κόσμε!",
    "Tiếng Việt có nhiều dấu: ả ã ạ ấ ầ ẩ ẫ ậ. Xin chào thế giới! Phở bò rất ngon.",
    "ไทยเป็นภาษาที่ไม่มีการเว้นวรรคระหว่างคำ สวัสดีครับ",
    "עברית נכתבת מימין לשמאל. שלום עולם!",
    "Emoji: 👩‍👩‍👧‍👦 family, 👨🏽‍💻 coder, 🏳️‍🌈 flag, 🇯🇵🇺🇸 flags, ❤️‍🔥, 1️⃣ keycap, 🤖🚀✨",
    "Combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0335\u0321\u0322a\u0337lgo, Å vs A\u030a, ﬁ ligature, ① ｆｕｌｌｗｉｄｔｈ",
    "Ünïcödé naïve café résumé façade jalapeño Straße ĳ œuvre",
]

CASES = [
    "",
    " ",
    "Hello world",
    "hello world",
    " Hello world",
    "Hello World!",
    "I'm don't you're we've they'll she'd IT'S",
    "   leading and trailing spaces   ",
    "tabs\tand\tmore\t\ttabs",
    "line one\nline two\n\nline four\n",
    "windows\r\nline\r\nendings\r\n\r\n",
    "lone \r carriage \r\r returns",
    " " * 100 + "x" + " " * 37,
    "\n" * 20 + "end",
    "\t \n \t\n  \n",
    "1234567890 3.14159 -42 1e10 0x1F 12,345,678.90 ٣٤٥ १२३ 一二三",
    "00000000000000000000000000000001",
    "def foo(x, y):\n    return x ** 2 + y // 3  # comment\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "{\"key\": [1, 2, {\"nested\": null}], \"emoji\": \"😀\"}",
    "https://example.com/path?query=1&b=2#frag user@example.com",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "!!!???...,,,;;;:::---___===+++***///\\\\\\|||~~~```",
    "Ａｂｃ　全角スペース　ｘｙｚ",
    "\u200b zero\u200bwidth \u200d joiner \ufeff bom \u00a0 nbsp \u2009 thin \u3000 ideographic",
    "\u0000 nul \u0001 control \u007f del \u0085 nel",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text <|endoftext|> spaced",
    "<s>[INST] question [/INST] answer</s>",
    "<｜begin▁of▁sentence｜>You are helpful<｜User｜>Hi<｜Assistant｜>",
    "<|start|>system<|message|>You are ChatGPT<|end|><|start|>user<|message|>hi<|end|>",
    "<|im_user|>user<|im_middle|>hello<|im_end|><|im_assistant|>assistant<|im_middle|>",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "▁already▁has▁metaspace ▁ ▁▁",
    "<0x0A> literal byte token text <unk>",
    "ĠĊ byte-level lookalikes Ġhello",
] + MULTILINGUAL + [" ".join(MULTILINGUAL)]


def cases():
    return list(CASES)


def _real_sources(shared_data):
    stdlib = pathlib.Path(os.__file__).parent
    files = sorted(stdlib.glob("*.py"))[:120] + sorted(stdlib.glob("email/*.py"))
    files += sorted(pathlib.Path("/usr/share/common-licenses").glob("*"))
    files += sorted(pathlib.Path(shared_data, "templates").glob("*.jinja"))
    texts = []
    for f in files:
        try:
            texts.append(f.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, IsADirectoryError, OSError):
            continue
    return texts


def mixed_text(shared_data, size=1 << 20, seed=1234):
    """About `size` bytes: paragraphs of real files interleaved with multilingual prose."""
    rng = random.Random(seed)
    paragraphs = []
    for text in _real_sources(shared_data):
        paragraphs.extend(p for p in text.split("\n\n") if p.strip())
    out, total = [], 0
    while total < size:
        p = rng.choice(paragraphs) if rng.random() < 0.8 else rng.choice(MULTILINGUAL)
        sep = rng.choice(["\n\n", "\n", " ", "\r\n", "\n\n\n    "])
        out.append(p + sep)
        total += len((p + sep).encode())
    return "".join(out)


def chunks(text, n):
    return [text[i:i + n] for i in range(0, len(text), n)]

"""The chat page at / in headless Chromium (Debian's chromium, driven over the DevTools pipe by
tools/chat_page/headless_chromium.py): it lists the model, streams an answer with the reasoning
in its own box, and keeps the conversation for a second turn."""
import json
import sys
import urllib.parse

from conftest import HERE, MODEL_NAME
from test_model import FORCED_REASONING, token_id

sys.path.insert(0, str(HERE.parents[2] / "tools" / "chat_page"))
from headless_chromium import ANSWER_DONE, Chromium  # noqa: E402


def test_page_files_are_served(server):
    for path in ("/", "/chat.js", "/chat.css"):
        status, body = server.get(path)
        assert status == 200 and body
    assert server.get("/nope.js")[0] == 404


def test_chat_page_streams_with_reasoning_apart(server, model_dir):
    extra = json.dumps({"logit_bias": {str(token_id(model_dir, FORCED_REASONING)): 100}})
    url = f"{server.url}/?q=hi&max_tokens=1&extra={urllib.parse.quote(extra)}"
    browser = Chromium()
    try:
        browser.open(url)
        assert browser.wait_for(ANSWER_DONE) == "done"
        assert browser.evaluate("document.getElementById('model').textContent").startswith(MODEL_NAME)
        bubble = "document.querySelector('.msg.assistant')"
        assert browser.evaluate(f"{bubble}.querySelector('.reasoning-text').textContent") == "The user says hi."
        assert browser.evaluate(f"{bubble}.querySelector('details.reasoning').hidden") is False
        assert browser.evaluate(f"{bubble}.querySelector('.content').textContent") == "Hello!"
        assert browser.evaluate(f"{bubble}.dataset.finish") == "length"
        # A second turn from the composer, sent with the first exchange as history.
        browser.evaluate("document.getElementById('extra').value = '';"
                         "document.getElementById('max-tokens').value = '3';"
                         "document.getElementById('input').value = 'and you?';"
                         "document.getElementById('composer').requestSubmit()")
        browser.wait_for("document.querySelectorAll('.msg.assistant').length === 2 && "
                         "document.querySelectorAll('.msg.assistant')[1].dataset.state === 'done'")
        assert browser.evaluate("document.querySelectorAll('.msg.user')[1].textContent").endswith("and you?")
        assert browser.evaluate("document.querySelectorAll('.msg.assistant')[1].dataset.finish") in ("length", "stop")
    finally:
        browser.close()

"""Drives headless Chromium (Debian's `chromium`) over the DevTools protocol on a pipe
(--remote-debugging-pipe: JSON messages ended by NUL on fds 3 and 4, no websocket needed), for the
chat page's test and screenshots. Usage as a tool:

    python3 tools/chat_page/headless_chromium.py --url 'http://127.0.0.1:8000/?q=Hello&max_tokens=80' \
        --out docs/images/chat_page.png [--size 900,560] [--open-reasoning]

loads the page (whose ?q= sends a first message), waits until the answer's bubble says
data-state="done", and saves a PNG."""
import argparse
import base64
import json
import os
import subprocess
import time


class Chromium:
    def __init__(self, width=900, height=560):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands from fd 3 and writes replies to fd 4.
        self._proc = subprocess.Popen(
            ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-pipe", f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: (os.dup2(to_chrome_r, 3), os.dup2(from_chrome_w, 4)))
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method, session=False, **params):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._from_chrome, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium exited")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        return result["result"].get("value")

    def open(self, url):
        self.call("Page.navigate", session=True, url=url)

    def wait_for(self, expression, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(expression)

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


ANSWER_DONE = "(() => { const m = document.querySelectorAll('.msg.assistant'); " \
              "return m.length && m[m.length - 1].dataset.state !== 'streaming' ? m[m.length - 1].dataset.state : ''; })()"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="900,560")
    ap.add_argument("--open-reasoning", action="store_true", help="expand the reasoning box before the shot")
    args = ap.parse_args()
    width, height = map(int, args.size.split(","))
    browser = Chromium(width, height)
    try:
        browser.open(args.url)
        browser.wait_for(ANSWER_DONE)
        if args.open_reasoning:
            browser.evaluate("document.querySelectorAll('details.reasoning').forEach(d => d.open = true)")
            time.sleep(0.2)
        browser.screenshot(args.out)
    finally:
        browser.close()


if __name__ == "__main__":
    main()

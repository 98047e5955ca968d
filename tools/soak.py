"""Soak test of `moet serve`: starts the server on a free loopback port, keeps STREAMS streaming
requests in flight for SECONDS (chat and completions, random lengths; one in 8 with a JSON schema,
whose output must parse and fit it when it ends with "stop", one in 16 hung up mid-stream, one in
16 non-streaming), samples the server's RSS every few seconds,
then stops it with SIGTERM. Passes when no request failed (a hang-up is not a failure), every
stream ended with [DONE] (or was hung up on purpose), the server exited 0, and the RSS at the end
is within --rss-tolerance of the RSS after the warm-up (the first fifth of the run). Bounded: it
stops by itself after SECONDS plus the drain. Prints a summary and writes --out JSON if given.

    python3 tools/soak.py --moet build/moet --model models/tiny --streams 64 --seconds 600 \
        --out bench/results/soak_tiny_cpu.json"""
import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import openai

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["name", "n"], "additionalProperties": False}
WORDS = "the quick brown fox jumps over a lazy dog while servers stream tokens to many clients".split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Stats:
    def __init__(self):
        self.requests = self.tokens = self.hangups = self.errors = self.structured = self.structured_cut = 0
        self.error_samples = []

    def fail(self, what):
        self.errors += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(what)


async def one_request(client, rng, stats):
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
    max_tokens = rng.randint(8, 200)
    kind = rng.randrange(16)
    extra = {"ignore_eos": True}
    if kind < 2:
        extra = {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}
        max_tokens = 400
    try:
        if kind == 15:  # non-streaming
            r = await client.completions.create(model="soak", prompt=prompt, max_tokens=max_tokens, temperature=0.8,
                                                extra_body=extra)
            stats.tokens += r.usage.completion_tokens
            stats.requests += 1
            return
        chat = kind % 2 == 0
        if chat:
            stream = await client.chat.completions.create(
                model="soak", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.8,
                stream=True, stream_options={"include_usage": True}, extra_body=extra)
        else:
            stream = await client.completions.create(model="soak", prompt=prompt, max_tokens=max_tokens,
                                                     temperature=0.8, stream=True,
                                                     stream_options={"include_usage": True}, extra_body=extra)
        text, usage, chunks, finish = "", None, 0, None
        async for chunk in stream:
            chunks += 1
            if kind == 14 and chunks == 3:  # hang up mid-stream
                await stream.close()
                stats.hangups += 1
                return
            usage = chunk.usage or usage
            if chunk.choices:
                text += (chunk.choices[0].delta.content or "") if chat else chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
        if usage is None:
            stats.fail("a stream ended without its usage chunk")
            return
        if kind < 2 and finish == "length":
            # Cut by max_tokens: in chat this happens when the model opens a reasoning block
            # (free text before the JSON) and does not close it. Not complete, not checked.
            stats.structured_cut += 1
        elif kind < 2:
            stats.structured += 1
            if finish != "stop":
                stats.fail(f"structured output ended with {finish}")
            value = json.loads(text)
            if not (isinstance(value, dict) and set(value) == {"name", "n"} and isinstance(value["n"], int)
                    and 0 <= value["n"] <= 999 and isinstance(value["name"], str) and len(value["name"]) <= 12):
                stats.fail(f"structured output does not fit the schema: {text[:80]}")
        stats.tokens += usage.completion_tokens
        stats.requests += 1
    except Exception as e:  # any failure of a request that was not hung up on purpose
        stats.fail(f"{type(e).__name__}: {e}"[:200])


async def worker(client, seed, deadline, stats):
    rng = random.Random(seed)
    while time.time() < deadline:
        await one_request(client, rng, stats)


async def run(args, port, proc):
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    stats = Stats()
    start = time.time()
    deadline = start + args.seconds
    samples = []

    async def sample_rss():
        while time.time() < deadline:
            samples.append((round(time.time() - start, 1), rss(proc.pid)))
            await asyncio.sleep(args.sample_seconds)

    sampler = asyncio.create_task(sample_rss())
    await asyncio.gather(*(worker(client, i, deadline, stats) for i in range(args.streams)))
    sampler.cancel()
    samples.append((round(time.time() - start, 1), rss(proc.pid)))
    await client.close()
    return stats, samples, time.time() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moet", default="build/moet")
    ap.add_argument("--model", default="models/tiny")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--sample-seconds", type=float, default=5)
    ap.add_argument("--rss-tolerance", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    port = free_port()
    # The server's log goes to a file: a pipe nobody reads would fill and block its writers.
    log = tempfile.NamedTemporaryFile("w+", prefix="moet_soak_", suffix=".log", delete=False)
    proc = subprocess.Popen([args.moet, "serve", args.model, "--port", str(port), "--served-model-name", "soak",
                             "--threads", str(args.threads), "--max-model-len", "1024", "--max-num-seqs", "64"],
                            stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"moet serve exited; its log: {log.name}")
            time.sleep(0.1)
    try:
        stats, samples, elapsed = asyncio.run(run(args, port, proc))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = -9
    warm = [r for t, r in samples if t >= args.seconds / 5]
    base, end = (warm[0], warm[-1]) if warm else (samples[0][1], samples[-1][1])
    growth = (end - base) / base
    ok = stats.errors == 0 and code == 0 and growth <= args.rss_tolerance
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    summary = {
        "command": " ".join(sys.argv), "commit": commit, "model": args.model, "streams": args.streams,
        "seconds": round(elapsed, 1), "requests": stats.requests, "structured": stats.structured,
        "structured_cut_by_max_tokens": stats.structured_cut,
        "hangups": stats.hangups, "errors": stats.errors, "error_samples": stats.error_samples,
        "generated_tokens": stats.tokens, "tokens_per_s": round(stats.tokens / elapsed, 1),
        "rss_after_warmup_mib": round(base / 2**20, 1), "rss_end_mib": round(end / 2**20, 1),
        "rss_growth_pct": round(100 * growth, 2), "rss_max_mib": round(max(r for _, r in samples) / 2**20, 1),
        "rss_median_mib": round(statistics.median(r for _, r in samples) / 2**20, 1),
        "server_exit_code": code, "server_log": log.name, "passed": ok, "rss_samples": samples}
    print(json.dumps({k: v for k, v in summary.items() if k != "rss_samples"}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

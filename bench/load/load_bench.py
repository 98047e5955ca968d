"""Load benchmark for a running `moet serve` (or any OpenAI-compatible server): for each
concurrency level, keeps that many streaming completions in flight (asyncio + the official openai
client) and reports request and token throughput, time to first token (TTFT) and inter-token
latency (ITL) percentiles, and errors. Prompts are fixed pseudo-random text (seeded), outputs have a
fixed length (ignore_eos), sampling is greedy.

    python3 bench/load/load_bench.py --url http://127.0.0.1:8000/v1 --concurrency 1 4 16 64 \
        --out bench/results/server_load_tiny_cpu
writes OUT.json (all numbers) and OUT.md (a table with the command and machine)."""
import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time

import openai

WORDS = ("the model serves requests over http while experts route tokens to the cache of blocks in a "
         "batch of prompts and outputs with latency and throughput measured per step").split()


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def make_prompt(rng, words):
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def one_request(client, model, prompt, max_tokens):
    start = time.perf_counter()
    stamps = []
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    tokens = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            stamps.append(time.perf_counter())
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    ttft = stamps[0] - start if stamps else end - start
    itls = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ttft": ttft, "itls": itls, "tokens": tokens, "latency": end - start}


async def run_level(client, model, concurrency, requests, prompt_words, max_tokens, seed):
    rng = random.Random(seed)
    prompts = [make_prompt(rng, prompt_words) for _ in range(requests)]
    queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    results, errors = [], []

    async def worker():
        while not queue.empty():
            prompt = queue.get_nowait()
            try:
                results.append(await one_request(client, model, prompt, max_tokens))
            except Exception as e:  # noqa: BLE001 -- every failure is counted and reported
                errors.append(repr(e))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    ttfts = [r["ttft"] for r in results]
    itls = [x for r in results for x in r["itls"]]
    tokens = sum(r["tokens"] for r in results)
    ms = lambda v: round(v * 1000, 2)  # noqa: E731
    return {
        "concurrency": concurrency, "requests": len(results), "errors": len(errors), "error_samples": errors[:3],
        "wall_s": round(wall, 3), "requests_per_s": round(len(results) / wall, 2),
        "output_tokens_per_s": round(tokens / wall, 1),
        "ttft_ms": {f"p{q}": ms(percentile(ttfts, q)) for q in (50, 90, 99)},
        "itl_ms": {f"p{q}": ms(percentile(itls, q)) for q in (50, 90, 99)},
        "mean_latency_s": round(statistics.mean(r["latency"] for r in results), 3) if results else None,
    }


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def write_markdown(path, report):
    lines = [f"# moet serve load benchmark: {report['model']}", "",
             f"- command: `{report['command']}`", f"- server: `{report['server_command']}`",
             f"- commit: {report['commit']}", f"- machine: {report['machine']}",
             *([f"- note: {report['note']}"] if report["note"] else []),
             f"- workload: {report['prompt_words']}-word prompts, {report['max_tokens']} output tokens, greedy, "
             f"streaming; {report['requests_per_level']} requests per level (at least 2 x concurrency)", "",
             "| concurrency | requests | errors | req/s | output tok/s | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) |",
             "|---:|---:|---:|---:|---:|---|---|"]
    for r in report["levels"]:
        t, i = r["ttft_ms"], r["itl_ms"]
        lines.append(f"| {r['concurrency']} | {r['requests']} | {r['errors']} | {r['requests_per_s']} | "
                     f"{r['output_tokens_per_s']} | {t['p50']} / {t['p90']} / {t['p99']} | "
                     f"{i['p50']} / {i['p90']} / {i['p99']} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's OpenAI base URL")
    ap.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--requests", type=int, default=32, help="requests per level (raised to 2 x concurrency)")
    ap.add_argument("--prompt-words", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-command", default="(not given)", help="how the server was started, for the report")
    ap.add_argument("--commit", default=subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown", help="commit the results are tagged with (default: HEAD)")
    ap.add_argument("--note", default="", help="a remark for the report (e.g. machine load)")
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = ap.parse_args()
    client = openai.AsyncOpenAI(base_url=args.url, api_key=args.api_key, max_retries=0, timeout=600)
    model = args.model or (await client.models.list()).data[0].id
    levels = []
    for c in args.concurrency:
        n = max(args.requests, 2 * c)
        level = await run_level(client, model, c, n, args.prompt_words, args.max_tokens, args.seed)
        print(json.dumps(level), flush=True)
        levels.append(level)
    report = {"model": model, "command": shlex.join(["python3"] + sys.argv), "server_command": args.server_command,
              "commit": args.commit, "machine": machine(), "note": args.note, "prompt_words": args.prompt_words,
              "max_tokens": args.max_tokens, "requests_per_level": args.requests, "levels": levels}
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(report, f, indent=2)
        write_markdown(args.out + ".md", report)
    return 1 if any(l["errors"] for l in levels) else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

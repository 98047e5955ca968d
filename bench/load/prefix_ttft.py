"""Prefix-cache benchmark for a running `moet serve`: time to first token of long prompts sent
cold (first time) and warm (again, so the prompt's full KV blocks come from the prefix cache),
with the cached token count the server reports in usage.

    python3 bench/load/prefix_ttft.py --url http://127.0.0.1:8000/v1 --out bench/results/server_prefix_ttft_tiny_cpu
writes OUT.json and OUT.md."""
import argparse
import subprocess
import asyncio
import json
import shlex
import statistics
import sys

import openai

from load_bench import machine, one_request

TEXT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    ap.add_argument("--repeats", type=int, default=60, help="copies of a 2-line snippet per prompt")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--commit", default=subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown", help="commit the results are tagged with (default: HEAD)")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    client = openai.AsyncOpenAI(base_url=args.url, api_key="none", max_retries=0, timeout=600)
    model = args.model or (await client.models.list()).data[0].id
    rows = []
    for i in range(args.prompts):
        prompt = f"# variant {i}\n" + TEXT * args.repeats
        cold = await one_request(client, model, prompt, 1)
        warm = await one_request(client, model, prompt, 1)
        usage = await client.completions.create(model=model, prompt=prompt, max_tokens=1)
        rows.append({"prompt_tokens": usage.usage.prompt_tokens,
                     "cached_tokens": usage.usage.prompt_tokens_details.cached_tokens,
                     "cold_ttft_ms": round(cold["ttft"] * 1000, 1), "warm_ttft_ms": round(warm["ttft"] * 1000, 1)})
        print(json.dumps(rows[-1]), flush=True)
    report = {"model": model, "command": shlex.join(["python3"] + sys.argv), "commit": args.commit,
              "machine": machine(), "note": args.note, "rows": rows,
              "median_cold_ttft_ms": statistics.median(r["cold_ttft_ms"] for r in rows),
              "median_warm_ttft_ms": statistics.median(r["warm_ttft_ms"] for r in rows)}
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(report, f, indent=2)
        lines = [f"# moet serve prefix-cache TTFT: {model}", "", f"- command: `{report['command']}`",
                 f"- commit: {args.commit}", f"- machine: {report['machine']}",
                 *([f"- note: {args.note}"] if args.note else []), "",
                 "| prompt tokens | cached on repeat | cold TTFT (ms) | warm TTFT (ms) |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['prompt_tokens']} | {r['cached_tokens']} | {r['cold_ttft_ms']} | {r['warm_ttft_ms']} |"
                  for r in rows]
        lines += ["", f"Median cold {report['median_cold_ttft_ms']} ms, warm {report['median_warm_ttft_ms']} ms."]
        with open(args.out + ".md", "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    asyncio.run(main())

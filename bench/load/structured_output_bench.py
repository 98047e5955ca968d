"""Structured-output speed: decode tokens/s of one greedy stream with and without a grammar on
the same server (it starts `moet serve MODEL` itself). Each constrained case runs once cold (a
schema the server has not seen: the automaton and masks are built as the stream goes) and then
warm (the same schema again: cached per schema), alternating with an unconstrained stream of as
many tokens.
Decode tokens/s = (completion tokens - 1) / (time of the last token - time of the first).

    python3 bench/load/structured_output_bench.py --moet build-cpu/moet --model models/tiny \
        --out bench/results/structured_output_tiny_cpu
writes OUT.json and OUT.md (with the command, commit and machine)."""
import argparse
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import openai

CASES = {
    "json_schema: one 1500-character string": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "story", "schema": {"type": "object", "properties": {
            "story": {"type": "string", "minLength": 1500, "maxLength": 1500}}, "required": ["story"],
            "additionalProperties": False}}}},
    "json_schema: 20 records": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "rows", "schema": {"type": "array", "minItems": 20, "maxItems": 20, "items": {
            "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999},
                                             "name": {"type": "string", "minLength": 4, "maxLength": 12},
                                             "ok": {"type": "boolean"}},
            "required": ["id", "name", "ok"], "additionalProperties": False}}}}},
    "guided_regex: [a-z ]{1500}": {"guided_regex": "[a-z ]{1500}"},
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream(client, extra, max_tokens):
    start = time.perf_counter()
    times, usage, text = [], None, ""
    for chunk in client.chat.completions.create(
            model="bench", messages=[{"role": "user", "content": "Write something long."}], max_tokens=max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True}, extra_body=extra):
        if chunk.choices:
            delta = chunk.choices[0].delta
            piece = (delta.content or "") + (getattr(delta, "reasoning_content", None) or "")
            if piece:
                times.append(time.perf_counter())
                text += piece
        usage = chunk.usage or usage
    tokens = usage.completion_tokens
    return {"completion_tokens": tokens, "ttft_s": times[0] - start, "seconds": times[-1] - start,
            "decode_tokens_per_s": (tokens - 1) / (times[-1] - times[0]), "text_bytes": len(text.encode())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moet", default="build/moet")
    ap.add_argument("--model", default="models/tiny")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm-runs", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([args.moet, "serve", args.model, "--port", str(port), "--served-model-name", "bench",
                               "--threads", str(args.threads), "--max-model-len", "4096"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
        results = {}
        for name, extra in CASES.items():
            cold = stream(client, extra, 2500)
            n = cold["completion_tokens"]
            # Warm and unconstrained runs alternate, so that load from elsewhere on the machine
            # falls on both alike; the ratio is the median of the pairs' ratios.
            warm, plain = [], []
            for _ in range(args.warm_runs):
                warm.append(stream(client, extra, 2500))
                plain.append(stream(client, {"ignore_eos": True}, n))
            w = statistics.median(r["decode_tokens_per_s"] for r in warm)
            p = statistics.median(r["decode_tokens_per_s"] for r in plain)
            ratio = statistics.median(a["decode_tokens_per_s"] / b["decode_tokens_per_s"] for a, b in zip(warm, plain))
            results[name] = {"tokens": n, "cold_tokens_per_s": cold["decode_tokens_per_s"], "warm_tokens_per_s": w,
                             "unconstrained_tokens_per_s": p, "warm_ratio": ratio,
                             "runs": {"cold": cold, "warm": warm, "unconstrained": plain}}
            print(f"{name}: {n} tokens, cold {cold['decode_tokens_per_s']:.1f}, warm {w:.1f}, "
                  f"unconstrained {p:.1f} tokens/s (warm {100 * w / p:.0f}%)", flush=True)
    finally:
        server.terminate()
        server.wait()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = " ".join(shlex.quote(a) for a in ["python3"] + sys.argv)
    meta = {"command": command, "commit": commit, "machine": f"{platform.node()} {platform.processor()} "
            f"{os.cpu_count()} cores", "model": args.model, "threads": args.threads}
    with open(args.out + ".json", "w") as f:
        json.dump({**meta, "results": results}, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"# Structured output speed ({args.model}, CPU, {args.threads} threads)\n\n"
                f"`{command}` at commit {commit}, {meta['machine']}.\n\n"
                "| constraint | tokens | cold tokens/s | warm tokens/s (median) | unconstrained tokens/s (median) | "
                "warm / unconstrained (median of 5 alternating pairs) |\n"
                "|---|---|---|---|---|---|\n")
        for name, r in results.items():
            f.write(f"| {name} | {r['tokens']} | {r['cold_tokens_per_s']:.1f} | {r['warm_tokens_per_s']:.1f} | "
                    f"{r['unconstrained_tokens_per_s']:.1f} | {100 * r['warm_ratio']:.0f}% |\n")


if __name__ == "__main__":
    main()

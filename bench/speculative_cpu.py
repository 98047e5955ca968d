#!/usr/bin/env python3
"""Speculative decoding on a real model and real text: acceptance length and decode tokens/s with
--speculative-config (MTP drafts, k = 1, 2, 3, and prompt lookup) against no speculation.

Each configuration is one `moet generate --prompts-file F --json` run (the model loaded once, each
prompt generated alone from an empty cache); the configurations run interleaved, --rounds times, so
that a busy machine slows them alike. Reported per configuration: the acceptance length (tokens per
verify step, 1 + accepted / verify steps with drafts, over every prompt), the per-position
acceptance rates, and decode tokens/s as (tokens - 1) summed over the prompts / decode seconds
summed over them (the median over rounds; the spread is the min and max); greedy output must be
the same token for token as without speculation (checked).

    python3 bench/speculative_cpu.py --moet build/moet --model models/tiny \
        --prompts tests/fixtures/quality_prompts.txt --max-tokens 64 --rounds 3 --out bench/results/x.json
"""
import argparse
import json
import statistics
import subprocess
import time

CONFIGS = [
    ("none", None),
    ("mtp k=1", {"method": "mtp", "num_speculative_tokens": 1}),
    ("mtp k=2", {"method": "mtp", "num_speculative_tokens": 2}),
    ("mtp k=3", {"method": "mtp", "num_speculative_tokens": 3}),
    ("ngram k=3", {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}),
]


def run(args, config):
    cmd = [args.moet, "generate", "--model", args.model, "--prompts-file", args.prompts, "--max-tokens",
           str(args.max_tokens), "--threads", str(args.threads), "--temperature", str(args.temperature),
           "--seed", "1", *args.extra]
    if config:
        cmd += ["--speculative-config", json.dumps(config)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def summary(results):
    tokens = sum(len(r["output_ids"]) - 1 for r in results)
    seconds = sum((len(r["output_ids"]) - 1) / r["decode_tokens_per_s"]
                  for r in results if r["decode_tokens_per_s"] > 0)
    out = {"decode_tokens_per_s": tokens / seconds}
    if "acceptance_length" in results[0]:
        steps = sum(r["verify_steps_with_drafts"] for r in results)
        accepted = sum(r["accepted_tokens"] for r in results)
        drafted = [sum(c) for c in zip(*(r["drafted_per_position"] for r in results))]
        kept = [sum(c) for c in zip(*(r["accepted_per_position"] for r in results))]
        out.update({"acceptance_length": 1 + accepted / steps if steps else 0.0,
                    "acceptance_rate_per_position": [a / d if d else 0.0 for a, d in zip(kept, drafted)],
                    "verify_steps_with_drafts": steps, "draft_tokens": sum(drafted), "accepted_tokens": accepted})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moet", default="build/moet")
    ap.add_argument("--model", default="models/tiny")
    ap.add_argument("--prompts", default="tests/fixtures/quality_prompts.txt")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("extra", nargs="*", help="more flags for moet generate (after --)")
    args = ap.parse_args()
    rounds = {name: [] for name, _ in CONFIGS}
    outputs = {}
    started = time.time()
    for _ in range(args.rounds):
        for name, config in CONFIGS:
            results = run(args, config)
            rounds[name].append(summary(results))
            outputs[name] = [r["output_ids"] for r in results]
    report = {"model": args.model, "prompts": args.prompts, "prompt_count": len(outputs["none"]),
              "max_tokens": args.max_tokens, "threads": args.threads, "temperature": args.temperature,
              "rounds": args.rounds, "seconds": time.time() - started, "configs": {}}
    base = statistics.median(r["decode_tokens_per_s"] for r in rounds["none"])
    for name, config in CONFIGS:
        rates = [r["decode_tokens_per_s"] for r in rounds[name]]
        entry = {"speculative_config": config, "decode_tokens_per_s": statistics.median(rates),
                 "decode_tokens_per_s_min": min(rates), "decode_tokens_per_s_max": max(rates),
                 "speedup": statistics.median(rates) / base,
                 "output_equals_no_speculation": outputs[name] == outputs["none"]}
        if config:
            last = rounds[name][-1]
            entry.update({k: last[k] for k in ("acceptance_length", "acceptance_rate_per_position",
                                               "verify_steps_with_drafts", "draft_tokens", "accepted_tokens")})
        report["configs"][name] = entry
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

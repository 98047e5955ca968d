#!/usr/bin/env python3
"""Next-layer prefetch on a real model and real text (--expert-prefetch next-layer, docs/experts.md):
how many of the experts a layer routes to the prediction named (layer L+1's router applied to layer
L's input), and what prefetching does to misses and decode tokens/s, on the CPU backend.

Each configuration is one `moet generate --prompts-file F --json` run (the model loaded once, each
prompt generated greedily from an empty cache); configurations run interleaved, --rounds times, so
that a busy machine slows them alike. Per configuration: the prediction hit rate over every prompt
(hits / routed experts of predicted layers), the token hit rate (routings that found their expert
cached), experts missing when their layer ran and experts loaded (prefetches included) per
decode token, and decode tokens/s (tokens summed over the
prompts / decode seconds summed; the median over rounds, the spread is the min and max). Greedy
output must be the same token for token with and without prefetch (checked: prefetch moves bytes).

    python3 bench/prefetch_cpu.py --moet build/moet --model models/tiny \
        --prompts tests/fixtures/quality_prompts.txt --out bench/results/prefetch_tiny_cpu.json
"""
import argparse
import json
import statistics
import subprocess


def run(args, slots, prefetch):
    cmd = [args.moet, "generate", "--model", args.model, "--prompts-file", args.prompts, "--max-tokens",
           str(args.max_tokens), "--threads", str(args.threads), "--json", "--kpi-every", "0",
           "--expert-cache-slots", str(slots), "--expert-prefetch", prefetch]
    if args.max_prompts:
        cmd += ["--max-prompts", str(args.max_prompts)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def summary(results):
    tokens = sum(len(r["output_ids"]) - 1 for r in results)
    seconds = sum((len(r["output_ids"]) - 1) / r["decode_tokens_per_s"]
                  for r in results if r["decode_tokens_per_s"] > 0)
    e = [r["experts"] for r in results]
    predicted = sum(x.get("predicted_routed", 0) for x in e)
    hits = sum(x.get("prefetch_hit_rate", 0) * x.get("predicted_routed", 0) for x in e)
    return {"decode_tokens_per_s": tokens / seconds if seconds else 0.0,
            "prediction_hit_rate": hits / predicted if predicted else None,
            "predicted_routed": predicted,
            "token_hit_rate": statistics.mean(x["hit_rate"] for x in e),
            "fetched_rows": sum(x["fetched_rows"] for x in e),
            "prefetched_rows": sum(x.get("prefetched_rows", 0) for x in e),
            "fetched_per_token": sum(x["fetched_rows"] for x in e) / tokens,
            "missing_per_token": sum(x["missing_pairs"] for x in e) / tokens,
            "outputs": [r["output_ids"] for r in results]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moet", default="build/moet")
    ap.add_argument("--model", default="models/tiny")
    ap.add_argument("--prompts", default="tests/fixtures/quality_prompts.txt")
    ap.add_argument("--max-prompts", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--coverages", default="0.25,0.5", help="cache sizes as fractions of the routed experts")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    config = json.load(open(f"{args.model}/config.json"))
    moe_layers = sum(1 for layer in range(config["num_hidden_layers"])
                     if layer >= config.get("first_k_dense_replace", 0))
    total = moe_layers * config["n_routed_experts"]
    configs = [(float(c), p) for c in args.coverages.split(",") for p in ("off", "next-layer")]
    runs = {c: [] for c in configs}
    for _ in range(args.rounds):
        for coverage, prefetch in configs:
            runs[(coverage, prefetch)].append(summary(run(args, max(config["num_experts_per_tok"],
                                                                       round(coverage * total)), prefetch)))
    report = {"model": args.model, "prompts": args.prompts, "max_prompts": args.max_prompts,
              "max_tokens": args.max_tokens, "threads": args.threads, "rounds": args.rounds,
              "routed_experts": total, "top_k": config["num_experts_per_tok"],
              "random_prediction_hit_rate": config["num_experts_per_tok"] / config["n_routed_experts"],
              "configs": []}
    for (coverage, prefetch), rs in runs.items():
        first = rs[0]
        tps = [r["decode_tokens_per_s"] for r in rs]
        report["configs"].append({
            "coverage": coverage, "slots": max(config["num_experts_per_tok"], round(coverage * total)),
            "prefetch": prefetch, "prediction_hit_rate": first["prediction_hit_rate"],
            "predicted_routed": first["predicted_routed"], "token_hit_rate": first["token_hit_rate"],
            "fetched_per_token": first["fetched_per_token"], "missing_per_token": first["missing_per_token"],
            "prefetched_rows": first["prefetched_rows"],
            "decode_tokens_per_s": statistics.median(tps), "decode_tokens_per_s_min": min(tps),
            "decode_tokens_per_s_max": max(tps),
            "same_output_as_without_prefetch": first["outputs"] == runs[(coverage, "off")][0]["outputs"]})
    json.dump(report, open(args.out, "w"), indent=1)
    print("coverage | prefetch | prediction hit rate | token hit rate | missing/token | fetched/token | prefetched | "
          "tok/s (min-max) | same output")
    for c in report["configs"]:
        hit = f"{c['prediction_hit_rate']:.3f}" if c["prediction_hit_rate"] is not None else "-"
        print(f"{c['coverage']:.2f} | {c['prefetch']} | {hit} | {c['token_hit_rate']:.3f} | "
              f"{c['missing_per_token']:.2f} | {c['fetched_per_token']:.2f} | {c['prefetched_rows']} | "
              f"{c['decode_tokens_per_s']:.1f} ({c['decode_tokens_per_s_min']:.1f}-"
              f"{c['decode_tokens_per_s_max']:.1f}) | "
              f"{c['same_output_as_without_prefetch']}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where a CUDA-graph step's time goes, from tools/gpu/kernel_trace.cpp's CSV.

The replays of the most frequent step (the decode step: one graph, or the pieces
graph_boundary() cut it into, launched back to back) are read one by one; in each, kernels
are ordered by their end. In a chain of dependent kernels a kernel adds `end - previous end` to
the step: its critical-path cost, whatever part of it ran early under programmatic dependent
launch. A kernel that began after the previous one ended leaves a bubble (start - previous end):
a launch the chain did not hide. Medians over the replays (the first WARMUP skipped) are summed
per kernel name, and one layer's sequence (the period of the kernel names mid-step) is listed
in order. When the trace holds copies and runtime calls (MOET_KERNEL_TRACE_KINDS=kernel,memcpy,runtime), the time
between consecutive replays is listed too: what ran in those gaps, host calls and copies alike.

Usage: trace_report.py TRACE.csv [--warmup N] [--json OUT.json]
"""
import argparse
import collections
import csv
import json
import re
import statistics


def short_name(name):
    name = name.replace("(anonymous namespace)::", "")
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, ch in enumerate(name):  # cut the parameter list: the first '(' outside template arguments
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            name = name[:i]
            break
    depth, cut = 0, 0
    for i, ch in enumerate(name):  # drop namespaces outside template arguments
        depth += ch == "<"
        depth -= ch == ">"
        if depth == 0 and name.startswith("::", i):
            cut = i + 2
    return name[cut:]


def replays_of_step(rows, joined_us=100):
    """The replays of the most frequent step: graph launches whose kernels follow the previous
    launch's within joined_us form one step (a step cut into pieces by graph_boundary())."""
    launches = collections.defaultdict(list)
    for row in rows:
        if row.get("kind", "kernel") == "kernel" and int(row["graph_id"]):
            launches[int(row["correlation"])].append(row)
    if not launches:
        raise SystemExit("no CUDA-graph kernels in the trace")
    ordered = sorted(launches.values(), key=lambda ks: min(int(k["start_ns"]) for k in ks))
    steps = []
    for kernels in ordered:
        first = min(int(k["start_ns"]) for k in kernels)
        if steps and first - max(int(k["end_ns"]) for k in steps[-1]) < joined_us * 1000:
            steps[-1].extend(kernels)
        else:
            steps.append(list(kernels))
    signature = lambda ks: tuple(sorted({int(k["graph_id"]) for k in ks})) + (len(ks),)
    common = collections.Counter(signature(ks) for ks in steps).most_common(1)[0][0]
    replays = [sorted(ks, key=lambda k: int(k["end_ns"])) for ks in steps if signature(ks) == common]
    return common[:-1], replays


def analyse(replays, warmup):
    timed = replays[warmup:] if len(replays) > warmup else replays
    positions = len(timed[0])
    cost = [[] for _ in range(positions)]
    bubble = [[] for _ in range(positions)]
    steps = []
    for kernels in timed:
        first_start = int(kernels[0]["start_ns"])
        steps.append(int(kernels[-1]["end_ns"]) - first_start)
        previous_end = first_start
        for i, k in enumerate(kernels):
            start, end = int(k["start_ns"]), int(k["end_ns"])
            cost[i].append(end - previous_end)
            bubble[i].append(max(0, start - previous_end))
            previous_end = end
    names = [short_name(k["name"]) for k in timed[0]]
    per_position = [(names[i], statistics.median(cost[i]) / 1e3, statistics.median(bubble[i]) / 1e3)
                    for i in range(positions)]
    return timed, statistics.median(steps) / 1e3, per_position


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--warmup", type=int, default=3, help="replays skipped at the start (default 3)")
    parser.add_argument("--json", help="also write the tables as JSON here")
    args = parser.parse_args()
    with open(args.trace, newline="") as f:
        rows = list(csv.DictReader(f))
    graph, replays = replays_of_step(rows)
    timed, step_us, per_position = analyse(replays, args.warmup)

    by_name = collections.OrderedDict()
    for name, cost, bubble in per_position:
        entry = by_name.setdefault(name, {"calls": 0, "cost_us": 0.0, "bubble_us": 0.0})
        entry["calls"] += 1
        entry["cost_us"] += cost
        entry["bubble_us"] += bubble
    total = sum(e["cost_us"] for e in by_name.values())
    print(f"graphs {list(graph)}: {len(timed)} replays of {len(per_position)} kernels; step {step_us:.1f} us "
          f"(median, first start to last end); sum of median costs {total:.1f} us")
    print(f"{'kernel':60s} {'calls':>6s} {'us/step':>9s} {'share':>6s} {'us/call':>8s} {'bubble/call':>11s}")
    for name, e in sorted(by_name.items(), key=lambda kv: -kv[1]["cost_us"]):
        print(f"{name[:60]:60s} {e['calls']:6d} {e['cost_us']:9.1f} {100 * e['cost_us'] / total:5.1f}% "
              f"{e['cost_us'] / e['calls']:8.2f} {e['bubble_us'] / e['calls']:11.2f}")

    # One layer: the shortest period of the kernel-name sequence over the middle third of the step.
    names = [name for name, _, _ in per_position]
    lo, hi = len(names) // 3, 2 * len(names) // 3
    period = next((p for p in range(2, max(2, hi - lo) // 2)
                   if all(names[i] == names[i + p] for i in range(lo, hi - p))), 0)
    layer = per_position[lo:lo + period]
    if layer:
        print(f"\none layer (positions {lo}..{lo + period - 1}): {sum(c for _, c, _ in layer):.1f} us")
        for name, cost, bubble in layer:
            print(f"  {name[:70]:70s} {cost:7.2f} us  bubble {bubble:5.2f}")
    between = gaps_between_replays(rows, timed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"graphs": list(graph), "replays": len(timed), "step_us": step_us, "by_name": by_name,
                       "layer": [{"name": n, "cost_us": c, "bubble_us": b} for n, c, b in layer],
                       "between_replays": between}, f, indent=1)


def gaps_between_replays(rows, replays):
    """Median gap between consecutive replays and the non-kernel spans that began in the gaps."""
    others = [r for r in rows if r.get("kind", "kernel") != "kernel"]
    if not others or len(replays) < 2:
        return {}
    gaps, spans = [], collections.defaultdict(list)
    for before, after in zip(replays, replays[1:]):
        end, start = int(before[-1]["end_ns"]), min(int(k["start_ns"]) for k in after)
        gaps.append(start - end)
        for r in others:
            if end <= int(r["start_ns"]) < start:
                spans[(r["kind"], r["name"])].append(int(r["end_ns"]) - int(r["start_ns"]))
    pairs = len(gaps)
    print(f"\nbetween replays: median gap {statistics.median(gaps) / 1e3:.1f} us (last kernel end to next first start)")
    table = {}
    for (kind, name), durations in sorted(spans.items(), key=lambda kv: -sum(kv[1])):
        table[f"{kind} {name}"] = {"per_gap": len(durations) / pairs, "median_us": statistics.median(durations) / 1e3}
        print(f"  {kind:8s} {name[:50]:50s} {len(durations) / pairs:5.1f}/gap  median {statistics.median(durations) / 1e3:8.1f} us")
    return {"median_gap_us": statistics.median(gaps) / 1e3, "spans": table}


if __name__ == "__main__":
    main()

"""FP4 tier and confidence gate study: what the FP4 recovery tier and the gate buy a W2 model,
measured with moet itself (experts/fp4_tier.h, engine/confidence_gate.h).

Settings, each scored teacher-forced on a held-out text one position per decode step (`moet score
--decode-steps --logits-out`: every position is a decode step that samples, so the tier's manager
and the gate act as while generating) and continued greedily from a set of prompts (`moet generate
--prompts-file`, the model loaded once):
  native            the checkpoint's experts (BF16 for a BF16 checkpoint): the reference
  fp4               every expert at MXFP4 (--experts fp4)
  w2                every expert at W2, no tier
  w2+pool P%        W2 plus an FP4 pool of P% of the routed experts, filled by the manager (no gate)
  w2+pool P%+gate T the same with the gate at tau T (signal maxprob, --gate-rounds 1, --gate-budget 64)
Reported per setting, against native and against fp4: mean and p99 KL(reference || setting), top-1
agreement, mean greedy match (leading tokens of the continuations equal to the reference's),
perplexity; plus the gate's gated-step fraction, the FP4 hit rate of routings and decode tokens/s.
The gate as a predictor of "W2 top-1 != FP4 top-1" per position of the held-out text, from the W2
logits: AUROC of each signal (maxprob, margin; lower = predicted different), and precision / recall
at each tau. Writes JSON + Markdown (+ a PNG when matplotlib is installed) to --out. Needs numpy.

Usage: python3 tools/quality/fp4_gate_study.py --model models/tiny --text FILE --prompts FILE
         --out DIR [--moet build/moet] [--device cpu|cuda] [--max-tokens N] [--greedy-tokens N]
         [--max-prompts N] [--pools 10,25,50] [--taus 0.3,0.5,0.7] [--extra "--threads 2"]
"""
import argparse
import json
import pathlib
import shlex
import subprocess
import tempfile
import time

import numpy as np


def moet(binary, *args):
    result = subprocess.run([binary, "--log-level", "error", *map(str, args)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"moet {' '.join(map(str, args))}: {result.stderr.strip()}")
    return result.stdout


def log_softmax(logits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def signals(logits):
    """Per row: the largest softmax probability and its margin over the second (the gate's)."""
    p = np.exp(log_softmax(logits))
    top2 = -np.sort(-p, axis=1)[:, :2]
    return top2[:, 0], top2[:, 0] - top2[:, 1]


def compare(ref_logits, logits):
    ref_lp, cur_lp = log_softmax(ref_logits), log_softmax(logits)
    kl = (np.exp(ref_lp) * (ref_lp - cur_lp)).sum(axis=1)
    top1 = (ref_logits.argmax(axis=1) == logits.argmax(axis=1)).mean()
    return {"kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)), "top1_agreement": float(top1)}


def greedy_match(greedy, ref_greedy):
    match = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), len(r)) for g, r in zip(greedy, ref_greedy)]
    return float(np.mean(match))


def auroc(scores, labels):
    """P(score of a positive > score of a negative), ties counted half (Mann-Whitney)."""
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    values = np.concatenate([pos, neg])[order]
    i = 0
    while i < len(values):  # average ranks over ties
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def predictor(w2_logits, fp4_logits, taus):
    """The gate's signals on the W2 logits as predictors of a top-1 that FP4 would change."""
    labels = w2_logits.argmax(axis=1) != fp4_logits.argmax(axis=1)
    out = {"positions": int(len(labels)), "w2_fp4_top1_differ": int(labels.sum())}
    for name, value in zip(("maxprob", "margin"), signals(w2_logits)):
        entry = {"auroc": auroc(-value, labels), "at_tau": []}
        for tau in taus:
            fired = value <= tau
            hits = int((fired & labels).sum())
            entry["at_tau"].append({"tau": tau, "fired_fraction": float(fired.mean()),
                                    "precision": hits / int(fired.sum()) if fired.any() else float("nan"),
                                    "recall": hits / int(labels.sum()) if labels.any() else float("nan")})
        out[name] = entry
    return out


def settings(args, total):
    """(label, flags, pool percent or None, tau) per setting."""
    out = [("native", ["--experts", "native"], None, 0.0), ("fp4", ["--experts", "fp4"], None, 0.0),
           ("w2", ["--experts", "w2"], None, 0.0)]
    for pool in args.pools:
        slots = max(1, round(total * pool / 100))
        base = ["--experts", "w2", "--fp4-pool-slots", slots]
        out.append((f"w2+pool{pool:g}%", base, pool, 0.0))
        for tau in args.taus:
            out.append((f"w2+pool{pool:g}%+gate{tau:g}", base + ["--gate-tau", tau], pool, tau))
    return out


def run_setting(args, flags, work):
    common = ["--model", args.model, "--device", args.device, *flags, *shlex.split(args.extra)]
    logits_file = work / "logits.f32"
    start = time.time()
    score = json.loads(moet(args.moet, "score", *common, "--text-file", args.text, "--max-tokens", args.max_tokens,
                            "--decode-steps", "--logits-out", logits_file))
    logits = np.fromfile(logits_file, dtype=np.float32).reshape(-1, score["vocab"]).astype(np.float64)
    logits_file.unlink()
    scored = time.time()
    lines = moet(args.moet, "generate", *common, "--prompts-file", args.prompts, "--max-prompts", args.max_prompts,
                 "--max-tokens", args.greedy_tokens, "--json").splitlines()
    outputs = [json.loads(line) for line in lines]
    return score, logits, outputs, {"score": round(scored - start, 2), "generate": round(time.time() - scored, 2)}


def evaluate(args, write):
    probe = moet(args.moet, "score", "--model", args.model, "--device", args.device, *shlex.split(args.extra),
                 "--text-file", args.text, "--max-tokens", 2, "--decode-steps", "--fp4-pool-slots", 1 << 30)
    total = json.loads(probe)["fp4"]["experts_total"]
    results, refs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, flags, pool, tau in settings(args, total):
            score, logits, outputs, seconds = run_setting(args, flags, pathlib.Path(tmp))
            greedy = [o["output_ids"] for o in outputs]
            if label in ("native", "fp4", "w2"):
                refs[label] = (logits, greedy)
            r = {"setting": label, "pool_percent": pool, "tau": tau, "flags": " ".join(map(str, flags)),
                 "perplexity": score["perplexity"],
                 "tokens_scored": score["tokens"] - 1, "seconds": seconds,
                 "decode_tokens_per_s": float(np.mean([o["decode_tokens_per_s"] for o in outputs]))}
            for ref in ("native", "fp4"):
                if ref in refs:
                    r["vs_" + ref] = {**compare(refs[ref][0], logits),
                                      "greedy_match": greedy_match(greedy, refs[ref][1])}
            if "fp4" in score:
                f = score["fp4"]
                r["fp4_tier"] = {k: f[k] for k in ("coverage", "hit_rate", "gated_fraction", "gate_replays",
                                                   "promotions", "forced_promotions", "experts_total")}
            results.append(r)
            print(json.dumps(r), flush=True)
            write(results, None)
    gate = predictor(refs["w2"][0], refs["fp4"][0], args.taus)
    write(results, gate)
    return results, gate


def write_reports(args, results, gate):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"model": args.model, "device": args.device, "tokens": args.max_tokens,
              "greedy_tokens": args.greedy_tokens, "settings": results}
    if gate is not None:
        report["gate_predictor"] = gate
    (out / "fp4_gate.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"| setting | perplexity | KL vs native | top-1 vs native | greedy vs native (of {args.greedy_tokens}) "
             f"| KL vs fp4 | top-1 vs fp4 | greedy vs fp4 | gated steps | FP4 hit rate | decode tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        n, f, t = r.get("vs_native", {}), r.get("vs_fp4", {}), r.get("fp4_tier", {})
        cell = lambda d, k, fmt: format(d[k], fmt) if k in d else "-"
        lines.append(f"| {r['setting']} | {r['perplexity']:.3f} | {cell(n, 'kl_mean', '.5f')} | "
                     f"{cell(n, 'top1_agreement', '.3f')} | {cell(n, 'greedy_match', '.1f')} | "
                     f"{cell(f, 'kl_mean', '.5f')} | {cell(f, 'top1_agreement', '.3f')} | "
                     f"{cell(f, 'greedy_match', '.1f')} | {cell(t, 'gated_fraction', '.3f')} | "
                     f"{cell(t, 'hit_rate', '.3f')} | {r['decode_tokens_per_s']:.1f} |")
    if gate is not None:
        lines += ["", f"Gate as a predictor of W2 top-1 != FP4 top-1 ({gate['w2_fp4_top1_differ']} of "
                      f"{gate['positions']} positions):", "",
                  "| signal | AUROC | tau | fired | precision | recall |", "|---|---|---|---|---|---|"]
        for name in ("maxprob", "margin"):
            for a in gate[name]["at_tau"]:
                lines.append(f"| {name} | {gate[name]['auroc']:.3f} | {a['tau']:g} | {a['fired_fraction']:.3f} | "
                             f"{a['precision']:.3f} | {a['recall']:.3f} |")
    (out / "fp4_gate.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (top1, gated) = plt.subplots(1, 2, figsize=(9, 3.5))
        w2 = next((r for r in results if r["setting"] == "w2" and "vs_fp4" in r), None)
        for pool in sorted({r["pool_percent"] for r in results if r["pool_percent"] is not None}):
            rows = sorted((r for r in results if r["pool_percent"] == pool and "vs_fp4" in r), key=lambda r: r["tau"])
            taus = [r["tau"] for r in rows]
            top1.plot(taus, [r["vs_fp4"]["top1_agreement"] for r in rows], marker="o", label=f"pool {pool:g}%")
            gated.plot(taus, [r["fp4_tier"]["gated_fraction"] for r in rows], marker="o", label=f"pool {pool:g}%")
        if w2 is not None:
            top1.axhline(w2["vs_fp4"]["top1_agreement"], color="grey", linestyle="--", label="w2, no tier")
        top1.set_xlabel("gate tau (0: no gate)")
        top1.set_ylabel("top-1 agreement with all-FP4")
        top1.legend(fontsize=7)
        gated.set_xlabel("gate tau")
        gated.set_ylabel("gated steps")
        fig.suptitle(f"{args.model} ({args.device})", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "fp4_gate.png", dpi=120)
        plt.close(fig)
    except ImportError:
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", required=True, help="held-out text to score")
    parser.add_argument("--prompts", required=True, help="prompts separated by blank lines")
    parser.add_argument("--out", required=True)
    parser.add_argument("--moet", default="build/moet")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where moet computes")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--greedy-tokens", type=int, default=32)
    parser.add_argument("--max-prompts", type=int, default=32)
    parser.add_argument("--pools", default="10,25,50", help="FP4 pool sizes, percent of the routed experts")
    parser.add_argument("--taus", default="0.3,0.5,0.7", help="gate thresholds")
    parser.add_argument("--extra", default="", help="more moet flags for every run (e.g. --threads 2)")
    args = parser.parse_args()
    args.pools = [float(p) for p in args.pools.split(",")]
    args.taus = [float(t) for t in args.taus.split(",")]
    evaluate(args, lambda results, gate: write_reports(args, results, gate))


if __name__ == "__main__":
    main()

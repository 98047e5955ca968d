"""Quality harness: how much each routed-expert format costs a model, measured with moet itself.

For every format (bf16 = the checkpoint, fp8, mxfp4, nvfp4, w2 with each zero mode, w2-asym) the
routed experts of the model are replaced by their quantize-then-dequantize values (`moet dequant`,
the reference quantizers) and stored as F32 in a copy of the checkpoint; everything else is left
as shipped. Each copy is scored teacher-forced on a held-out text (`moet score --experts native
--logits-out`) and continued greedily from a set of prompts (`moet generate --experts native`).
Reported per format: perplexity, mean and p99 KL(bf16 || format) over positions, top-1 agreement
with bf16, mean exact-match length of the greedy continuations, and the mean sign bias of the
expert tensors from `moet quantize-report` next to it. Writes JSON + Markdown (+ a PNG when
matplotlib is installed).

Usage: python3 tools/quality/eval_quality.py --model models/tiny --text FILE --prompts FILE
         --out DIR [--moet build/moet] [--device cpu|cuda] [--max-tokens N] [--greedy-tokens N]
         [--max-prompts N]
Score at most the model's training context (--max-tokens; models/tiny was trained on 1024).
"""
import argparse
import json
import pathlib
import shutil
import subprocess
import tempfile

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, for safetensors.numpy)
import numpy as np
from safetensors.numpy import load_file, save_file

FORMATS = [("bf16", None, None), ("fp8", "fp8", None), ("mxfp4", "mxfp4", None), ("nvfp4", "nvfp4", None),
           ("w2-auto", "w2", "auto"), ("w2-sign", "w2", "sign"), ("w2-alt", "w2", "alt"), ("w2-asym", "w2-asym", "auto")]


def moet(binary, *args):
    result = subprocess.run([binary, "--log-level", "error", *map(str, args)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"moet {' '.join(map(str, args))}: {result.stderr.strip()}")
    return result.stdout


def expert_names(model_dir):
    """Routed-expert weight names of every shard, by shard file."""
    by_file = {}
    for path in sorted(pathlib.Path(model_dir).glob("*.safetensors")):
        for name in load_file(str(path)):
            if ".experts." in name and name.endswith(".weight"):
                by_file.setdefault(path.name, []).append(name)
    return by_file


def quantized_copy(binary, model_dir, fmt, zero_mode, work):
    """A copy of the checkpoint whose routed experts hold the format's dequantized values (F32)."""
    out = work / "model"
    shutil.copytree(model_dir, out)
    for file, names in expert_names(model_dir).items():
        tensors = load_file(str(out / file))
        for name in names:
            raw = work / "t.f32"
            args = ["dequant", "--model", model_dir, "--tensor", name, "--format", fmt, "--out", raw]
            if zero_mode:
                args += ["--zero-mode", zero_mode]
            moet(binary, *args)
            tensors[name] = np.fromfile(raw, dtype=np.float32).reshape(tensors[name].shape)
        save_file(tensors, str(out / file), metadata={"format": "pt"})
    return out


def kl_stats(ref_logits, logits):
    ref = ref_logits - ref_logits.max(axis=1, keepdims=True)
    cur = logits - logits.max(axis=1, keepdims=True)
    ref_lp = ref - np.log(np.exp(ref).sum(axis=1, keepdims=True))
    cur_lp = cur - np.log(np.exp(cur).sum(axis=1, keepdims=True))
    kl = (np.exp(ref_lp) * (ref_lp - cur_lp)).sum(axis=1)
    top1 = (ref_logits.argmax(axis=1) == logits.argmax(axis=1)).mean()
    return float(kl.mean()), float(np.percentile(kl, 99)), float(top1)


def evaluate(args):
    prompts = [p for p in pathlib.Path(args.prompts).read_text().split("\n\n") if p.strip()][: args.max_prompts]
    results, ref_logits, ref_greedy = [], None, None
    for label, fmt, zero_mode in FORMATS:
        with tempfile.TemporaryDirectory() as tmp:
            work = pathlib.Path(tmp)
            model = pathlib.Path(args.model) if fmt is None else quantized_copy(args.moet, args.model, fmt, zero_mode, work)
            logits_file = work / "logits.f32"
            score = json.loads(moet(args.moet, "score", "--model", model, "--experts", "native", "--device",
                                    args.device, "--text-file", args.text, "--max-tokens", args.max_tokens,
                                    "--logits-out", logits_file))
            logits = np.fromfile(logits_file, dtype=np.float32).reshape(-1, score["vocab"]).astype(np.float64)
            greedy = [json.loads(moet(args.moet, "generate", "--model", model, "--experts", "native", "--device",
                                      args.device, "--prompt", p, "--max-tokens", args.greedy_tokens,
                                      "--json"))["output_ids"] for p in prompts]
        if ref_logits is None:
            ref_logits, ref_greedy = logits, greedy
        kl_mean, kl_p99, top1 = kl_stats(ref_logits, logits)
        match = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), len(r)) for g, r in zip(greedy, ref_greedy)]
        results.append({"format": label, "perplexity": score["perplexity"], "kl_mean": kl_mean, "kl_p99": kl_p99,
                        "top1_agreement": top1, "greedy_match_mean": float(np.mean(match)),
                        "greedy_tokens": args.greedy_tokens, "tokens_scored": score["tokens"] - 1})
        print(json.dumps(results[-1]))
    return results


def sign_bias(args):
    """The study tool's summary: mean sign bias of W2-sym vs W2-asym over the expert tensors."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "report.json"
        moet(args.moet, "quantize-report", "--model", args.model, "--json", path, "--quiet")
        return json.loads(path.read_text())["summary"]


def write_reports(args, results, bias):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.json").write_text(json.dumps({"model": args.model, "formats": results, "sign_bias": bias}, indent=1) + "\n")
    lines = ["| format | perplexity | KL mean | KL p99 | top-1 agree | greedy match (of %d) |" % args.greedy_tokens,
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['format']} | {r['perplexity']:.3f} | {r['kl_mean']:.5f} | {r['kl_p99']:.4f} | "
                     f"{r['top1_agreement']:.3f} | {r['greedy_match_mean']:.1f} |")
    (out / "quality.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.bar([r["format"] for r in results], [r["kl_mean"] for r in results])
        ax.set_ylabel("mean KL vs bf16")
        fig.tight_layout()
        fig.savefig(out / "quality.png", dpi=120)
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
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--greedy-tokens", type=int, default=32)
    parser.add_argument("--max-prompts", type=int, default=32)
    args = parser.parse_args()
    results = evaluate(args)
    write_reports(args, results, sign_bias(args))


if __name__ == "__main__":
    main()

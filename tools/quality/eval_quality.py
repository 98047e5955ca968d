"""Quality harness: how much each routed-expert format costs a model, measured with moet itself.

For every format (bf16 = the checkpoint, fp8, mxfp4, nvfp4, w2 with each zero mode, w2-asym; with
--formats all also w2-opt and w2k, with --imatrix w2k-imatrix, w2-opt then weighted by it, and with
--layer-moments w2k-ldlq, W2K rounded by LDLQ against those second moments, and with
--expert-moments w2k-ldlq-expert, LDLQ against each expert's own where the file holds it and
the layer's otherwise, blended by --expert-moments-prior when given) the
routed experts of the model are replaced by their quantize-then-dequantize values (one `moet
dequant --all-experts` run per format: the reference quantizers) and stored as F32 in a copy of
the checkpoint; everything else is left as shipped. Each copy is scored teacher-forced on a
held-out text (`moet score --experts native --logits-out`) and continued greedily from a set of
prompts (one `moet generate --experts native --prompts-file` run: the model is loaded once).
Reported per format: perplexity, mean and p99 KL(bf16 || format) over positions, top-1 agreement
with bf16, mean exact-match length of the greedy continuations, and the mean sign bias of the
expert tensors from `moet quantize-report` next to it. Writes JSON + Markdown (+ a PNG when
matplotlib is installed), rewritten after every format so an interrupted run keeps what it has.
Needs only numpy (safetensors files are read and written here byte by byte; no ml_dtypes).

Usage: python3 tools/quality/eval_quality.py --model models/tiny --text FILE --prompts FILE
         --out DIR [--moet build/moet] [--device cpu|cuda] [--max-tokens N] [--greedy-tokens N]
         [--max-prompts N] [--threads N] [--work DIR] [--imatrix FILE] [--layer-moments FILE]
         [--expert-moments FILE [--expert-moments-prior N]] [--formats a,b,...]
Score at most the model's training context (--max-tokens; models/tiny was trained on 1024).
"""
import argparse
import json
import mmap
import os
import pathlib
import shutil
import struct
import subprocess
import tempfile
import time

import numpy as np

# (label, moet dequant --format, --zero-mode, more dequant arguments; "IMATRIX" is --imatrix's file,
# "LAYER_MOMENTS" --layer-moments', "EXPERT_MOMENTS" --expert-moments' with --expert-moments-prior)
FORMATS = [("bf16", None, None, []), ("fp8", "fp8", None, []), ("mxfp4", "mxfp4", None, []),
           ("nvfp4", "nvfp4", None, []), ("w2-auto", "w2", "auto", []), ("w2-sign", "w2", "sign", []),
           ("w2-alt", "w2", "alt", []), ("w2-asym", "w2-asym", "auto", []), ("w2-opt", "w2", "auto", ["--w2-quantizer", "opt", "IMATRIX"]),
           ("w2k", "w2k", None, []), ("w2k-imatrix", "w2k", None, ["IMATRIX"]),
           ("w2k-ldlq", "w2k", None, ["--w2k-quantizer", "ldlq", "LAYER_MOMENTS"]),
           ("w2k-ldlq-expert", "w2k", None, ["--w2k-quantizer", "ldlq", "LAYER_MOMENTS", "EXPERT_MOMENTS"])]
# The files a format runs without (w2-opt unweighted; w2k-ldlq-expert with an expert-moments file that
# holds every expert).
OPTIONAL_FILES = {"w2-opt": {"IMATRIX"}, "w2k-ldlq-expert": {"LAYER_MOMENTS"}}


# The formats of a run without --formats (issue 31's w2-opt and w2k run with --formats all or by name).
DEFAULT_FORMATS = "fp8,mxfp4,nvfp4,w2-auto,w2-sign,w2-alt,w2-asym"


def formats(args):
    """bf16 first, then --formats (all: every one); w2k-imatrix only with --imatrix (which w2-opt reads too,
    running unweighted without it), w2k-ldlq only with --layer-moments, w2k-ldlq-expert only with
    --expert-moments."""
    prior = ["--expert-moments-prior", args.expert_moments_prior] if args.expert_moments_prior is not None else []
    files = {"IMATRIX": ["--imatrix", args.imatrix] if args.imatrix else [],
             "LAYER_MOMENTS": ["--layer-moments", args.layer_moments] if args.layer_moments else [],
             "EXPERT_MOMENTS": ["--expert-moments", args.expert_moments, *prior] if args.expert_moments else []}
    chosen = []
    wanted = (args.formats or DEFAULT_FORMATS).split(",")
    for label, fmt, zero_mode, extra in FORMATS:
        if label != "bf16" and label not in wanted and wanted != ["all"]:
            continue
        if any(x in files and not files[x] and x not in OPTIONAL_FILES.get(label, ()) for x in extra):
            continue
        chosen.append((label, fmt, zero_mode, [a for x in extra for a in files.get(x, [x])]))
    return chosen


def moet(binary, *args):
    result = subprocess.run([binary, "--log-level", "error", *map(str, args)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"moet {' '.join(map(str, args))}: {result.stderr.strip()}")
    return result.stdout


class Safetensors:
    """A safetensors file, memory-mapped: header entries and each tensor's raw bytes."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (n,) = struct.unpack("<Q", self.map[:8])
        self.header = json.loads(self.map[8:8 + n])
        self.metadata = self.header.pop("__metadata__", None)
        self.base = 8 + n

    def raw(self, name):
        begin, end = self.header[name]["data_offsets"]
        return memoryview(self.map)[self.base + begin:self.base + end]


def write_safetensors(path, entries, metadata):
    """entries: (name, dtype, shape, bytes-like) in file order."""
    header, offset = {}, 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, data in entries:
            f.write(data)


def quantized_copy(args, fmt, zero_mode, work, extra=()):
    """A copy of the checkpoint whose routed experts hold the format's dequantized values (F32)."""
    experts_file = work / "experts.safetensors"
    dq = ["dequant", "--model", args.model, "--all-experts", "--format", fmt, "--out", experts_file, *extra]
    if zero_mode:
        dq += ["--zero-mode", zero_mode]
    if args.threads:
        dq += ["--threads", args.threads]
    moet(args.moet, *dq)
    return swap_experts(args, experts_file, work)


def swap_experts(args, experts_file, work):
    """A copy of args.model in work/model whose tensors named in experts_file take its values."""
    experts = Safetensors(experts_file)
    out = work / "model"
    out.mkdir()
    used = set()
    for path in sorted(pathlib.Path(args.model).iterdir()):
        if path.is_dir():
            continue
        if path.suffix != ".safetensors":
            shutil.copyfile(path, out / path.name)
            continue
        shard = Safetensors(path)
        entries = []
        for name, info in sorted(shard.header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            if name in experts.header:
                new = experts.header[name]
                if new["shape"] != info["shape"]:
                    raise RuntimeError(f"{name}: dequant shape {new['shape']} != checkpoint shape {info['shape']}")
                entries.append((name, new["dtype"], new["shape"], experts.raw(name)))
                used.add(name)
            else:
                entries.append((name, info["dtype"], info["shape"], shard.raw(name)))
        write_safetensors(out / path.name, entries, shard.metadata)
    missing = set(experts.header) - used
    if missing:
        raise RuntimeError(f"dequantized tensors not in any shard: {sorted(missing)[:3]}")
    return out


def kl_stats(ref_logits, logits):
    ref = ref_logits - ref_logits.max(axis=1, keepdims=True)
    cur = logits - logits.max(axis=1, keepdims=True)
    ref_lp = ref - np.log(np.exp(ref).sum(axis=1, keepdims=True))
    cur_lp = cur - np.log(np.exp(cur).sum(axis=1, keepdims=True))
    kl = (np.exp(ref_lp) * (ref_lp - cur_lp)).sum(axis=1)
    top1 = (ref_logits.argmax(axis=1) == logits.argmax(axis=1)).mean()
    return float(kl.mean()), float(np.percentile(kl, 99)), float(top1)


def evaluate(args, on_result=lambda results, timings: None):
    """Scores every format; on_result(results, timings) runs after each one (partial reports)."""
    results, timings, ref_logits, ref_greedy = [], {}, None, None
    for label, fmt, zero_mode, extra in formats(args):
        start = time.time()
        with tempfile.TemporaryDirectory(dir=args.work) as tmp:
            work = pathlib.Path(tmp)
            model = pathlib.Path(args.model) if fmt is None else quantized_copy(args, fmt, zero_mode, work, extra)
            copied = time.time()
            logits_file = work / "logits.f32"
            score = json.loads(moet(args.moet, "score", "--model", model, "--experts", "native", "--device",
                                    args.device, "--text-file", args.text, "--max-tokens", args.max_tokens,
                                    "--logits-out", logits_file))
            logits = np.fromfile(logits_file, dtype=np.float32).reshape(-1, score["vocab"]).astype(np.float64)
            scored = time.time()
            lines = moet(args.moet, "generate", "--model", model, "--experts", "native", "--device", args.device,
                         "--prompts-file", args.prompts, "--max-prompts", args.max_prompts, "--max-tokens",
                         args.greedy_tokens, "--json").splitlines()
            greedy = [json.loads(line)["output_ids"] for line in lines]
        if ref_logits is None:
            ref_logits, ref_greedy = logits, greedy
        kl_mean, kl_p99, top1 = kl_stats(ref_logits, logits)
        match = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), len(r)) for g, r in zip(greedy, ref_greedy)]
        results.append({"format": label, "perplexity": score["perplexity"], "kl_mean": kl_mean, "kl_p99": kl_p99,
                        "top1_agreement": top1, "greedy_match_mean": float(np.mean(match)),
                        "greedy_tokens": args.greedy_tokens, "tokens_scored": score["tokens"] - 1})
        timings[label] = {"quantized_copy": round(copied - start, 2), "score": round(scored - copied, 2),
                          "generate": round(time.time() - scored, 2), "prompts": len(greedy)}
        print(json.dumps(results[-1]), flush=True)
        print(f"  {label}: {json.dumps(timings[label])}", flush=True)
        on_result(results, timings)
    return results, timings


def sign_bias(args):
    """The study tool's summary: mean sign bias of W2-sym vs W2-asym over the expert tensors."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "report.json"
        moet(args.moet, "quantize-report", "--model", args.model, "--json", path, "--quiet")
        return json.loads(path.read_text())["summary"]


def write_reports(args, results, bias, timings=None):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"model": args.model, "formats": results, "sign_bias": bias}
    if timings is not None:
        report["seconds"] = timings
    (out / "quality.json").write_text(json.dumps(report, indent=1) + "\n")
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
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--greedy-tokens", type=int, default=32)
    parser.add_argument("--max-prompts", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0, help="moet dequant threads (0 = one per core)")
    parser.add_argument("--work", default=None, help="folder for the quantized model copies (default: the system's temp)")
    parser.add_argument("--imatrix", default=None, help="importance matrix (moet imatrix) for w2-opt and w2k-imatrix")
    parser.add_argument("--layer-moments", default=None,
                        help="layer moments (moet imatrix --layer-moments) for w2k-ldlq and w2k-ldlq-expert")
    parser.add_argument("--expert-moments", default=None,
                        help="expert moments (moet imatrix --expert-moments) for w2k-ldlq-expert")
    parser.add_argument("--expert-moments-prior", type=int, default=None,
                        help="w2k-ldlq-expert with --layer-moments: moet's --expert-moments-prior (default: moet's)")
    parser.add_argument("--formats", default="", help="comma-separated labels to run after bf16, or all "
                                                         f"(default: {DEFAULT_FORMATS})")
    args = parser.parse_args()
    if args.work:
        os.makedirs(args.work, exist_ok=True)
    results, timings = evaluate(args, lambda r, t: write_reports(args, r, None, t))
    start = time.time()
    bias = sign_bias(args)
    timings["sign_bias"] = round(time.time() - start, 2)
    print(f"  sign bias: {timings['sign_bias']} s", flush=True)
    write_reports(args, results, bias, timings)


if __name__ == "__main__":
    main()

"""The quality cost of each KV cache dtype, measured with `moet score` (docs/kv.md).

For every text and every --kv-cache-dtype, one `moet score` run teacher-forces the text in chunks
of --max-num-batched-tokens rows (so later chunks attend over keys an earlier chunk wrote into the
quantized cache) and, in the same run, over an FP32 cache: its report gives both perplexities,
the mean and largest KL(fp32 KV || dtype) over positions and the top-1 agreement. Writes the JSON
reports and a Markdown table.

Usage: python3 tools/quality/kv_cache_quality.py --model models/tiny --text FILE [--text FILE ...]
         --out FILE.json [--moet build/moet] [--dtypes bf16,fp8_e4m3,fp8_e5m2,nvfp4]
         [--max-tokens N] [--chunk N] [--experts native] [--device cpu] [--threads N]
"""
import argparse
import json
import pathlib
import subprocess


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", action="append", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--moet", default="build/moet")
    parser.add_argument("--dtypes", default="bf16,fp8_e4m3,fp8_e5m2,nvfp4")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--experts", default="native")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()

    rows = []
    for text in args.text:
        for dtype in args.dtypes.split(","):
            command = [args.moet, "score", "--model", args.model, "--text-file", text, "--max-tokens",
                       str(args.max_tokens), "--max-num-batched-tokens", str(args.chunk), "--experts", args.experts,
                       "--kv-cache-dtype", dtype, "--device", args.device, "--threads", str(args.threads)]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            report = json.loads(result.stdout)
            report.update({"text": text, "command": " ".join(command)})
            rows.append(report)
            print(f"{pathlib.Path(text).name} {dtype}: perplexity {report['perplexity']:.4f} "
                  f"(fp32 KV {report['fp32_kv_perplexity']:.4f}), KL {report['kld_vs_fp32_kv']:.5f}", flush=True)
    pathlib.Path(args.out).write_text(json.dumps({"model": args.model, "results": rows}, indent=2) + "\n")

    lines = ["| text | KV dtype | tokens | perplexity (fp32 KV) | change | KL mean | KL max | top-1 agree |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {pathlib.Path(r['text']).name} | {r['kv_cache_dtype']} | {r['tokens']} | "
                     f"{r['perplexity']:.3f} ({r['fp32_kv_perplexity']:.3f}) | {100 * r['perplexity_change']:+.2f}% | "
                     f"{r['kld_vs_fp32_kv']:.5f} | {r['max_kld_vs_fp32_kv']:.4f} | "
                     f"{r['top1_agreement_vs_fp32_kv']:.3f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

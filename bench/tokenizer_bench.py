#!/usr/bin/env python3
"""Encode throughput, moet vs HF `tokenizers`, one thread each, same machine, same run.

Writes the 1 MB mixed corpus of the golden tests to a temporary file, times HF `Tokenizer.encode`
on it (best of several runs, RAYON_NUM_THREADS=1), runs bench/tokenizer_encode_bench (Google
Benchmark) on the same file, and prints MB/s for both and the ratio moet/HF per family.
Usage: python3 bench/tokenizer_bench.py [BUILD_DIR/bench/tokenizer_encode_bench]
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
from tokenizer import corpus, oracles  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
NAMES = {"qwen3": "qwen3", "deepseek-v3": "deepseek_v3", "mixtral": "mixtral", "gpt-oss": "gpt_oss", "kimi-k2": "kimi_k2"}


def hf_mb_per_s(family, text, runs=5):
    tok = oracles.load(SHARED, family)
    tok.encode(text, add_special_tokens=False)  # warm the word cache like the C++ benchmark does
    best = min(_timed(lambda: tok.encode(text, add_special_tokens=False)) for _ in range(runs))
    return len(text.encode()) / best / 1e6


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    bench = sys.argv[1] if len(sys.argv) > 1 else str(REPO / "build" / "bench" / "tokenizer_encode_bench")
    text = corpus.mixed_text(SHARED)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
    env = dict(os.environ, MOET_BENCH_CORPUS=f.name, MOET_BENCH_DATA=str(SHARED))
    out = subprocess.run([bench, "--benchmark_format=json"], env=env, capture_output=True, text=True, check=True)
    moet = {b["name"].split("/")[1]: b["bytes_per_second"] / 1e6 for b in json.loads(out.stdout)["benchmarks"]}
    os.unlink(f.name)
    print(f"corpus: {len(text.encode()) / 1e6:.2f} MB mixed text, one thread")
    print(f"{'family':<12} {'moet MB/s':>10} {'HF MB/s':>10} {'ratio':>7}")
    for family, name in NAMES.items():
        hf = hf_mb_per_s(family, text)
        print(f"{family:<12} {moet[name]:>10.2f} {hf:>10.2f} {moet[name] / hf:>6.2f}x")


if __name__ == "__main__":
    main()

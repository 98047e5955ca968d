#!/usr/bin/env python3
"""A copy of data/corpus small enough to carry to the GPU machine for the study run.

The device tool carries at most 64 MiB with the working tree (about 31 MB of it tracked files),
so the corpus that travels with the CUDA binaries must stay under --budget-mb (default 20 MB,
train + validation + test). validation and test are copied byte for byte (whole; the quality
harness's held-out text is the start of test). train is re-compressed with `xz -9e` and, when
that is still too large, cut to its first K documents (whole documents; the corpus stores them in
hash order, so a prefix is an unbiased sample of every source). Writes OUT/stats.json with what
was kept.

  python3 tools/train/study_corpus.py            # data/corpus -> data/corpus-study
"""
import argparse
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def xz(lines, path):
    """Writes the lines through `xz -9e` into path; returns its size."""
    with open(path, "wb") as out:
        proc = subprocess.Popen(["xz", "-9e", "-T1", "-c"], stdin=subprocess.PIPE, stdout=out)
        for line in lines:
            proc.stdin.write(line)
        proc.stdin.close()
        if proc.wait() != 0:
            raise SystemExit("xz failed")
    return os.path.getsize(path)


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(ROOT, "data/corpus"))
    ap.add_argument("--out", default=os.path.join(ROOT, "data/corpus-study"))
    ap.add_argument("--budget-mb", type=float, default=20.0, help="train + validation + test, MB (10^6 bytes)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    fixed = 0
    for split in ("validation", "test"):
        shutil.copyfile(os.path.join(args.corpus, f"{split}.jsonl.xz"), os.path.join(args.out, f"{split}.jsonl.xz"))
        fixed += os.path.getsize(os.path.join(args.out, f"{split}.jsonl.xz"))
    budget = int(args.budget_mb * 1e6) - fixed
    lines = lzma.open(os.path.join(args.corpus, "train.jsonl.xz"), "rb").read().splitlines(keepends=True)
    path = os.path.join(args.out, "train.jsonl.xz")
    keep, t0 = len(lines), time.time()
    size = xz(lines, path)
    print(f"train: {len(lines)} documents -> {size:,} bytes with xz -9e ({time.time() - t0:.0f} s)", flush=True)
    while size > budget:
        # shrink the raw bytes in proportion to the excess, with a 1% margin
        raw = sum(map(len, lines[:keep]))
        target = raw * budget / size * 0.99
        acc = 0
        for i, line in enumerate(lines[:keep]):
            acc += len(line)
            if acc > target:
                keep = i
                break
        size = xz(lines[:keep], path)
        print(f"train: first {keep} documents -> {size:,} bytes", flush=True)
    kept = [json.loads(l) for l in lines[:keep]]
    by_source = {}
    for d in kept:
        s = by_source.setdefault(d["source"], [0, 0])
        s[0] += 1
        s[1] += len(d["text"].encode())
    stats = {"made_by": "tools/train/study_corpus.py", "from": os.path.relpath(args.corpus, ROOT),
             "train_documents": keep, "train_documents_of": len(lines),
             "train_text_bytes": sum(v[1] for v in by_source.values()),
             "train_by_source": by_source,
             "files": {f: {"bytes": os.path.getsize(os.path.join(args.out, f)), "sha256": sha256(os.path.join(args.out, f))}
                       for f in ("train.jsonl.xz", "validation.jsonl.xz", "test.jsonl.xz")}}
    stats["total_bytes"] = sum(v["bytes"] for v in stats["files"].values())
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    print(json.dumps({k: stats[k] for k in ("train_documents", "train_documents_of", "train_text_bytes", "total_bytes")}))


if __name__ == "__main__":
    main()

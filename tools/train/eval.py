#!/usr/bin/env python3
"""Per-source perplexity of a hub-format model folder on a corpus split, with transformers.

Every document is tokenized as [BOS] + ids and cut into windows of --seq-len tokens (no context
carried across windows); the loss is the mean next-token cross-entropy over all predicted tokens.
(train.py's evaluation instead slides fixed windows over the concatenated split, so its numbers
differ slightly.)

  python3 tools/train/eval.py models/tiny --split test
"""
import argparse
import collections
import json
import lzma
import math
import os
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--split", default="validation")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None, help="write the table here too")
    args = ap.parse_args()

    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    bos = json.load(open(os.path.join(args.model, "config.json"))).get("bos_token_id", 0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(args.device).eval()

    windows = []  # (source, ids)
    for line in lzma.open(os.path.join(args.corpus, f"{args.split}.jsonl.xz"), "rt", encoding="utf-8"):
        d = json.loads(line)
        ids = [bos] + tok.encode(d["text"], add_special_tokens=False).ids
        for i in range(0, len(ids) - 1, args.seq_len):
            w = ids[i:i + args.seq_len + 1]
            if len(w) >= 2:
                windows.append((d["source"], w))
    windows.sort(key=lambda w: len(w[1]))
    loss = collections.defaultdict(float)
    count = collections.defaultdict(int)
    t0 = time.time()
    with torch.no_grad():
        for i in range(0, len(windows), args.batch):
            chunk = windows[i:i + args.batch]
            n = max(len(w) for _, w in chunk)
            x = torch.zeros(len(chunk), n, dtype=torch.long)
            m = torch.zeros(len(chunk), n, dtype=torch.bool)
            for j, (_, w) in enumerate(chunk):
                x[j, :len(w)] = torch.tensor(w)
                m[j, :len(w)] = True
            x, m = x.to(args.device), m.to(args.device)
            logits = model(input_ids=x[:, :-1], attention_mask=m[:, :-1].long()).logits.float()
            ce = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
            ce = (ce * m[:, 1:]).sum(1)
            for j, (src, w) in enumerate(chunk):
                loss[src] += ce[j].item()
                count[src] += len(w) - 1
    rows = {s: {"tokens": count[s], "loss": loss[s] / count[s], "ppl": math.exp(loss[s] / count[s])}
            for s in sorted(count)}
    tl, tc = sum(loss.values()), sum(count.values())
    rows["ALL"] = {"tokens": tc, "loss": tl / tc, "ppl": math.exp(tl / tc)}
    print(f"{args.model} on {args.split} ({time.time() - t0:.0f}s)")
    print(f"{'source':12s} {'tokens':>8s} {'loss':>7s} {'ppl':>8s}")
    for s, r in rows.items():
        print(f"{s:12s} {r['tokens']:8d} {r['loss']:7.4f} {r['ppl']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Merges the sharded export of train.py (model-0000N-of-0000M.safetensors + index, written in
shards so each file fits the device tool's 16 MiB return limit) into one model.safetensors
(tensors sorted by name, metadata {"format": "pt"}) and copies the other export files.

  python3 tools/train/merge_shards.py EXPORT_DIR models/tiny
"""
import argparse
import json
import os
import shutil

from safetensors.torch import load_file, save_file

COPY = {"config.json": "config.json", "generation_config.json": "generation_config.json",
        "loss.png": "loss.png", "metrics.json": "train_metrics.json", "train.log": "train.log"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    args = ap.parse_args()
    idx_path = os.path.join(args.src, "model.safetensors.index.json")
    sd = {}
    if os.path.exists(idx_path):
        wm = json.load(open(idx_path))["weight_map"]
        for fn in sorted(set(wm.values())):
            sd.update(load_file(os.path.join(args.src, fn)))
        assert set(sd) == set(wm), "index and shards disagree"
    else:
        sd = load_file(os.path.join(args.src, "model.safetensors"))
    os.makedirs(args.dst, exist_ok=True)
    save_file(dict(sorted(sd.items())), os.path.join(args.dst, "model.safetensors"), metadata={"format": "pt"})
    for a, b in COPY.items():
        if os.path.exists(os.path.join(args.src, a)):
            shutil.copyfile(os.path.join(args.src, a), os.path.join(args.dst, b))
    total = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"{len(sd)} tensors, {total} bytes -> {os.path.join(args.dst, 'model.safetensors')}")


if __name__ == "__main__":
    main()

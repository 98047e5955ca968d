#!/usr/bin/env python3
"""Live parity of `moet generate --device cuda` with HF transformers on every fixture.

For each tests/fixtures/<name>: transformers (float32, CPU) computes the last-prompt logits and a
greedy continuation step by step; moet generates the same number of tokens on the GPU with
--json. Checks: moet's greedy ids equal transformers', transformers' equal the committed golden
(so the installed transformers still agrees with the one that wrote the fixtures), and the max
|logit| difference of transformers vs the golden. moet runs with --experts native (the goldens'
storage). A fixture transformers cannot load here (FP8 checkpoints need the `kernels` package,
absent from the GPU image) is recorded as skipped, not failed. Usage: parity_transformers.py MOET OUT.json
"""
import json
import pathlib
import subprocess
import sys

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[2]


def transformers_greedy(model, prompt, steps):
    ids = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        first = model(ids).logits[0, -1]
        logits = first
        for _ in range(steps):
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            logits = model(ids).logits[0, -1]
    return first, out


def main():
    moet, out_path = sys.argv[1], sys.argv[2]
    results, ok = {}, True
    for fixture in sorted((ROOT / "tests" / "fixtures").iterdir()):
        golden_path = fixture / "golden.json"
        if not golden_path.exists():
            continue
        golden = json.loads(golden_path.read_text())
        prompt, steps = golden["prompt_ids"], len(golden["greedy_ids"])
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.float32).eval()
            first, hf_ids = transformers_greedy(model, prompt, steps)
        except Exception as error:  # e.g. FP8 checkpoints need the `kernels` package the image lacks
            results[fixture.name] = {"skipped": f"transformers could not run it: {error}"[:400]}
            print(f"{fixture.name}: skipped (transformers: {type(error).__name__})")
            continue
        golden_diff = float((first - torch.tensor(golden["logits_last"])).abs().max())
        run = subprocess.run([moet, "generate", "--device", "cuda", "--model", str(fixture), "--block-size", "4", "--experts", "native",
                              "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", str(steps), "--json"],
                             capture_output=True, text=True)
        moet_ids = json.loads(run.stdout.strip().splitlines()[-1])["output_ids"] if run.returncode == 0 else None
        entry = {"moet_cuda_ids": moet_ids, "transformers_ids": hf_ids, "golden_ids": golden["greedy_ids"],
                 "moet_matches_transformers": moet_ids == hf_ids,
                 "transformers_matches_golden": hf_ids == golden["greedy_ids"],
                 "transformers_vs_golden_max_abs_logit_diff": golden_diff,
                 "moet_stderr_tail": run.stderr[-500:]}
        ok = ok and entry["moet_matches_transformers"] and entry["transformers_matches_golden"]
        results[fixture.name] = entry
        print(f"{fixture.name}: moet==transformers {entry['moet_matches_transformers']}, "
              f"transformers==golden {entry['transformers_matches_golden']} (logit diff {golden_diff:.2e})")
    results["transformers_version"] = transformers.__version__
    results["all_ok"] = ok
    pathlib.Path(out_path).write_text(json.dumps(results, indent=2) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

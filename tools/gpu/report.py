#!/usr/bin/env python3
"""Gathers one tools/gpu/run.sh results folder into a single JSON report on stdout.

Usage: report.py RESULTS_DIR COMMIT_FILE
"""
import json
import pathlib
import sys


def load(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main():
    out, commit_file = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    tests = load(out / "tests.json")
    summary = None
    if tests:
        summary = {"tests": tests.get("tests"), "failures": tests.get("failures"), "errors": tests.get("errors"),
                   "skipped": sum(1 for s in tests.get("testsuites", []) for t in s.get("testsuite", [])
                                  if t.get("result") == "SKIPPED"),
                   "failed": [f"{s['name']}.{t['name']}" for s in tests.get("testsuites", [])
                              for t in s.get("testsuite", []) if t.get("failures")]}
    report = {
        "commit": commit_file.read_text().strip() if commit_file.exists() else "unknown",
        "machine": (out / "machine.txt").read_text().strip() if (out / "machine.txt").exists() else "unknown",
        "steps": (out / "steps.txt").read_text().strip().splitlines() if (out / "steps.txt").exists() else [],
        "tests": summary,
        "parity": load(out / "parity.json"),
        "kernels": load(out / "kernels.json"),
        "ops": load(out / "ops.json"),
        "e2e": {p.stem: load(p) for p in sorted(out.glob("e2e_*.json"))},
        "timeline": {p.stem: load(p) for p in sorted(out.glob("timeline_*.json"))},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

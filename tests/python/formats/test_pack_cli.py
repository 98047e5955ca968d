"""`moet pack` and `moet quantize-report` end to end on the tiny random fixtures."""
import json

import pytest

FIXTURES = ["qwen3_moe", "deepseek_v3", "glm4_moe", "mixtral"]


@pytest.mark.parametrize("arch", FIXTURES)
def test_pack_builds_then_reuses_then_rebuilds_on_zero_mode(run_moet, repo, tmp_path, arch):
    model = repo / "tests" / "fixtures" / arch
    if not model.exists():
        pytest.skip(f"fixture {arch} not present")
    first = run_moet("pack", "--model", model, "--out", tmp_path, "--threads", 2)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("built"), first.stdout
    second = run_moet("pack", "--model", model, "--out", tmp_path)
    assert second.stdout.startswith("up to date"), second.stdout + second.stderr
    sidecar = json.loads((tmp_path / "experts-w2-rank0of1.json").read_text())
    assert sidecar["zero_mode"] == "auto" and sidecar["stride"] % 4096 == 0
    third = run_moet("--log-level", "info", "pack", "--model", model, "--out", tmp_path, "--zero-mode", "alt")
    assert third.stdout.startswith("built") and "zero_mode" in third.stderr, third.stdout + third.stderr
    fp4 = run_moet("pack", "--model", model, "--out", tmp_path, "--format", "fp4", "--world", 2, "--rank", 1)
    assert fp4.returncode == 0 and (tmp_path / "experts-fp4-rank1of2.pack").exists(), fp4.stderr


def test_quantize_report_writes_csv_and_json(run_moet, repo, tmp_path):
    model = repo / "tests" / "fixtures" / "deepseek_v3"
    if not model.exists():
        pytest.skip("fixture deepseek_v3 not present")
    r = run_moet("quantize-report", "--model", model, "--csv", tmp_path / "r.csv", "--json", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["tensors"] == len(report["tensors"]) > 0
    assert all(sum(t["histogram"]) > 0 for t in report["tensors"])
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert lines[0].startswith("tensor,zero_mode,bias_sym") and len(lines) == len(report["tensors"]) + 1

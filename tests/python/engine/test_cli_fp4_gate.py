"""The FP4 tier and the confidence gate through `moet generate` / `moet bench` on models/tiny (CPU):
tau 1 with room for every expert gives the --experts fp4 output, tau 0 without manager the W2
output; the --json outputs carry the tier's and the gate's KPIs; the FP4 pack is built once and
reused; bad flags fail with one line naming the flag."""
import json
import pathlib

import pytest

TINY = pathlib.Path(__file__).resolve().parents[3] / "models" / "tiny"
FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
PROMPT = "3,140,277,414,551,688"
EVERY_EXPERT_AT_TAU_ONE = ["--fp4-pool-slots", 48, "--gate-tau", 1, "--gate-rounds", 8, "--gate-budget", 1000,
                           "--fp4-promote-per-step", 0]


def generate(run_moet, *extra):
    result = run_moet("generate", "--model", TINY, "--prompt-ids", PROMPT, "--max-tokens", 12, "--json",
                      "--threads", 2, *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_tau_one_with_room_for_every_expert_gives_the_fp4_output(run_moet):
    fp4 = generate(run_moet, "--experts", "fp4")
    w2 = generate(run_moet)
    assert fp4["output_ids"] != w2["output_ids"], "the formats must differ for the test to mean anything"
    gated = generate(run_moet, *EVERY_EXPERT_AT_TAU_ONE)
    assert gated["output_ids"] == fp4["output_ids"]
    k = gated["fp4"]
    assert k["judged_steps"] == 12 and k["gated_steps"] == 12 and k["gated_fraction"] == 1.0
    assert k["gate_replays"] > 0 and k["forced_promotions"] > 0 and k["promotions"] == 0
    assert k["tau"] == 1.0 and k["experts_total"] == 48 and 0 < k["coverage"] <= 1
    assert "fp4" not in w2


def test_tau_zero_without_manager_gives_the_w2_output(run_moet):
    w2 = generate(run_moet)
    quiet = generate(run_moet, "--fp4-pool-slots", 8, "--fp4-promote-per-step", 0)
    assert quiet["output_ids"] == w2["output_ids"]
    assert quiet["fp4"]["judged_steps"] == 0 and quiet["fp4"]["coverage"] == 0


def test_manager_fills_the_pool_and_reports(run_moet):
    k = generate(run_moet, "--fp4-pool-slots", 8, "--fp4-promote-per-step", 2)["fp4"]
    assert 0 < k["promotions"] <= 2 * 12
    assert k["experts_held"] <= 8 and k["hit_rate"] > 0 and k["promotions_per_s"] > 0


def test_the_kpi_line_is_logged_every_n_steps(run_moet):
    result = run_moet("--log-level", "info", "generate", "--model", TINY, "--prompt-ids", PROMPT, "--max-tokens", 12,
                      "--threads", 2, "--fp4-pool-slots", 8, "--gate-tau", 0.5, "--kpi-every", 4)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "fp4 tier: 4 steps" in line]
    assert len(lines) == 2, result.stderr  # after steps 4 and 8 (of 12)
    assert "FP4 hit rate" in lines[0] and "steps gated" in lines[0] and "gate tau 0.500" in lines[0]


def test_fp4_pack_is_built_once_then_reused(run_moet, tmp_path):
    args = ["--pack-dir", tmp_path, "--fp4-pool-slots", 8, "--fp4-store", "pack"]
    first = run_moet("--log-level", "info", "generate", "--model", TINY, "--prompt-ids", PROMPT, "--max-tokens", 3,
                     *args)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "experts-fp4-rank0of1.pack").exists() and (tmp_path / "experts-w2-rank0of1.pack").exists()
    second = run_moet("--log-level", "info", "generate", "--model", TINY, "--prompt-ids", PROMPT, "--max-tokens", 3,
                      *args)
    assert second.returncode == 0, second.stderr
    assert "reusing fp4 pack" in second.stderr
    assert first.stdout == second.stdout


def test_bench_json_has_the_fp4_kpis(run_moet, tmp_path):
    out = tmp_path / "bench.json"
    result = run_moet("bench", "--config", FIXTURES / "qwen3_moe" / "config.json", "--prompt-tokens", 5,
                      "--decode-tokens", 4, "--copy-gib", 0.01, "--threads", 2, "--json-out", out,
                      "--fp4-pool-slots", 4, "--gate-tau", 1)
    assert result.returncode == 0, result.stderr
    k = json.loads(out.read_text())["fp4"]
    assert k["judged_steps"] == 4 and k["gated_steps"] == 4 and k["tau"] == 1


@pytest.mark.parametrize("args, message", [
    (["--fp4-pool-slots", 8, "--gate-tau", 1.5], "--gate-tau must be in [0, 1]"),
    (["--fp4-pool-slots", 8, "--gate-tau", -0.1], "--gate-tau must be in [0, 1]"),
    (["--gate-tau", 0.5], "give --fp4-pool-gb or --fp4-pool-slots"),
    (["--gate-signal", "margin"], "give --fp4-pool-gb or --fp4-pool-slots"),
    (["--fp4-pool-slots", 2], "at least 4 slots"),
    (["--fp4-pool-gb", 0.00001], "at least 4 slots"),
    (["--fp4-pool-gb", "lots"], "--fp4-pool-gb: 'lots' is neither a size in GiB nor auto"),
    (["--experts", "fp4", "--fp4-pool-slots", 8], "the FP4 tier sits over W2 experts"),
    (["--fp4-pool-slots", 8, "--fp4-store", "pack"], "--fp4-store pack reads experts-fp4-*.pack: give --pack-dir"),
    (["--fp4-pool-gb", "auto", "--expert-cache-gb", "auto"], "size one of them"),
    (["--fp4-pool-slots", 8, "--gate-tau-file", "/nonexistent/tau"], "--gate-tau-file /nonexistent/tau"),
])
def test_bad_flags_fail_with_one_line(run_moet, args, message):
    result = run_moet("--log-level", "error", "generate", "--model", TINY, "--prompt-ids", PROMPT, "--max-tokens", 2,
                      *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr

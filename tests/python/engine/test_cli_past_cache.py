"""Past the expert cache through `moet generate` / `moet bench` on models/tiny (CPU): exclusive
tiering, experts computed on the host (--cpu-experts on / auto, and every expert on the host without
a cache) and next-layer prefetch give the resident model's greedy output token for token; the
--json outputs carry their KPIs; the KPI line says what each did; combinations that make no sense
fail with one line naming the flag."""
import json
import pathlib

import pytest

TINY = pathlib.Path(__file__).resolve().parents[3] / "models" / "tiny"
FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
PROMPT = "3,140,277,414,551,688"
GOLDEN = json.loads((FIXTURES / "tiny_golden.json").read_text())
CACHE = ["--expert-cache-slots", 12]  # 25% of models/tiny's 48 routed experts


def generate(run_moet, *extra):
    result = run_moet("generate", "--model", TINY, "--prompt-ids", PROMPT, "--max-tokens", 16, "--json",
                      "--threads", 2, *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def resident(run_moet):
    return generate(run_moet)["output_ids"]


def test_exclusive_tiering_gives_the_resident_output(run_moet, resident):
    out = generate(run_moet, *CACHE, "--expert-tiering", "exclusive")
    assert out["output_ids"] == resident
    e = out["experts"]
    assert e["written_back_rows"] > 0 and e["written_back_rows"] == e["fetched_rows"], "every fetch evicts"
    assert e["host_pairs"] == 0


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_host_experts_give_the_resident_output(run_moet, resident, mode):
    out = generate(run_moet, *CACHE, "--cpu-experts", mode)
    assert out["output_ids"] == resident
    e = out["experts"]
    assert e["host_pairs"] > 0 and 0 < e["host_item_fraction"] < 1
    if mode == "auto":
        assert e["chose_host"] + e["chose_fetch"] > 0 and e["chose_skip"] == 0
        assert e["costs"]["host_fixed_ms"] + e["costs"]["host_row_ms"] > 0 and e["costs"]["fetch_ms"] > 0
    else:
        assert e["chose_host"] == 0 and e["replayed_steps"] == 0


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=["code", "english"])
def test_host_experts_continue_the_golden_prompts_as_resident(run_moet, case):
    ids = ",".join(map(str, case["prompt_ids"]))
    steps = len(case["greedy_ids"])
    want = run_moet("generate", "--model", TINY, "--prompt-ids", ids, "--max-tokens", steps, "--json")
    got = run_moet("generate", "--model", TINY, "--prompt-ids", ids, "--max-tokens", steps, "--json", *CACHE,
                   "--cpu-experts", "on", "--expert-tiering", "exclusive")
    assert want.returncode == 0 and got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["output_ids"] == json.loads(want.stdout)["output_ids"]


def test_every_expert_on_the_host_without_a_cache(run_moet, resident):
    out = generate(run_moet, "--cpu-experts", "on")
    assert out["output_ids"] == resident
    e = out["experts"]
    assert e["host_item_fraction"] == 1.0 and e["fetched_rows"] == 0 and e["coverage"] == 0


def test_prefetch_gives_the_resident_output_and_its_hit_rate(run_moet, resident):
    out = generate(run_moet, *CACHE, "--expert-prefetch", "next-layer")
    assert out["output_ids"] == resident
    e = out["experts"]
    assert 0 <= e["prefetch_hit_rate"] <= 1 and e["predicted_routed"] > 0 and e["prefetched_rows"] > 0


def test_the_kpi_line_says_what_each_mode_did(run_moet):
    result = run_moet("--log-level", "info", "generate", "--model", TINY, "--prompt-ids", PROMPT, "--max-tokens", 12,
                      "--threads", 2, *CACHE, "--expert-tiering", "exclusive", "--cpu-experts", "auto",
                      "--expert-prefetch", "next-layer", "--kpi-every", 4)
    assert result.returncode == 0, result.stderr
    assert "expert costs: fetch" in result.stderr
    lines = [line for line in result.stderr.splitlines() if "experts: 4 steps" in line]
    assert len(lines) == 2, result.stderr
    assert "next-layer prediction hit rate" in lines[0] and "misses:" in lines[0]


def test_bench_json_has_the_kpis(run_moet, tmp_path):
    out = tmp_path / "bench.json"
    result = run_moet("bench", "--config", FIXTURES / "qwen3_moe" / "config.json", "--prompt-tokens", 5,
                      "--decode-tokens", 4, "--copy-gib", 0.01, "--threads", 2, "--json-out", out,
                      "--expert-cache-slots", 8, "--expert-tiering", "exclusive", "--cpu-experts", "on")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    prefill = report["experts_prefill"]  # the decode pass may find everything promoted already
    assert prefill["host_pairs"] > 0 and prefill["promoted_rows"] > 0 and prefill["written_back_rows"] > 0
    assert {"host_pairs", "written_back_rows", "promoted_rows", "costs"} <= report["experts"].keys()


@pytest.mark.parametrize("flags, says", [
    (["--expert-tiering", "exclusive"], "--expert-tiering exclusive needs the expert cache"),
    (["--expert-tiering", "exclusive", "--expert-cache-gb", "auto"], "not auto"),
    (["--expert-tiering", "exclusive", "--expert-cache-slots", 12, "--expert-store", "pack", "--pack-dir", "PACK"],
     "the pack store keeps no row in RAM"),
    (["--cpu-experts", "auto"], "--cpu-experts auto chooses between the expert cache and the host"),
    (["--expert-prefetch", "next-layer"], "--expert-prefetch next-layer loads into the expert cache"),
    (["--expert-cache-slots", 12, "--cpu-expert-threads", 2], "are for --cpu-experts on or auto"),
])
def test_what_makes_no_sense_is_refused(run_moet, tmp_path, flags, says):
    flags = [tmp_path if f == "PACK" else f for f in flags]
    result = run_moet("generate", "--model", TINY, "--prompt-ids", PROMPT, "--max-tokens", 2, *flags)
    assert result.returncode != 0
    assert says in result.stderr, result.stderr
    assert len([line for line in result.stderr.splitlines() if line.strip()]) <= 2, result.stderr

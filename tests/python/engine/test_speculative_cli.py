"""--speculative-config on `moet generate` and `moet bench`, and the MTP layer in `moet inspect`:
greedy output with MTP drafts (k = 1, 2, 3) equals the output without them on models/tiny and equals
the transformers golden on the fixtures with an MTP layer (deepseek_v3, deepseek_v3_fp8, and GLM-5's
glm_moe_dsa, whose MTP layer runs its own DSA indexer; with an fp32 KV cache as its golden), ngram
drafts leave the qwen3_moe fixture's golden unchanged, --json reports the acceptance length, bench
reports the step costs, and bad configurations fail with one clear line naming the flag."""
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures"
TINY = REPO / "models" / "tiny"
PROMPT = "def read_rows(path, offsets, stride):\n    rows = []\n    with open(path, \"rb\") as f:\n"


def mtp(k):
    return json.dumps({"method": "mtp", "num_speculative_tokens": k})


def generate(run_moet, model, *extra):
    result = run_moet("generate", "--model", model, "--json", "--experts", "native", "--threads", 2, *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_tiny_greedy_output_is_unchanged_and_acceptance_is_reported(run_moet):
    plain = generate(run_moet, TINY, "--prompt", PROMPT, "--max-tokens", 32)
    assert "acceptance_length" not in plain
    for k in (1, 2, 3):
        out = generate(run_moet, TINY, "--prompt", PROMPT, "--max-tokens", 32, "--speculative-config", mtp(k))
        assert out["output_ids"] == plain["output_ids"], k
        assert 1.0 < out["acceptance_length"] <= k + 1
        assert len(out["acceptance_rate_per_position"]) == k
        assert out["accepted_tokens"] <= out["draft_tokens"]


def test_fixture_mtp_and_ngram_keep_the_golden(run_moet):
    ngram = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2})
    cases = [(name, mtp(k)) for name in ("deepseek_v3", "deepseek_v3_fp8", "glm_moe_dsa") for k in (1, 2, 3)]
    for name, config in cases + [("qwen3_moe", ngram)]:
        golden = json.loads((FIXTURES / name / "golden.json").read_text())
        out = generate(run_moet, FIXTURES / name, "--prompt-ids", ",".join(map(str, golden["prompt_ids"])),
                       "--max-tokens", len(golden["greedy_ids"]), "--speculative-config", config,
                       *(("--kv-cache-dtype", "fp32") if name == "glm_moe_dsa" else ()))
        assert out["output_ids"] == golden["greedy_ids"], name


@pytest.mark.parametrize("config,message", [
    ('{"method":"eagle","num_speculative_tokens":2}', "unknown method 'eagle'"),
    ('{"method":"mtp","num_speculative_tokens":0}', "'num_speculative_tokens' must be an integer >= 1"),
    ('{"method":"mtp"}', "'num_speculative_tokens' is required"),
    ("{nope", "not a JSON object"),
])
def test_bad_configs_fail_with_one_line(run_moet, config, message):
    result = run_moet("generate", "--model", TINY, "--prompt-ids", "1,2,3", "--speculative-config", config)
    assert result.returncode == 1
    assert "--speculative-config" in result.stderr and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_mtp_needs_an_mtp_layer(run_moet):
    for name in ("qwen3_moe", "deepseek_v3_plainq"):
        result = run_moet("generate", "--model", FIXTURES / name, "--prompt-ids", "3,4,5",
                          "--speculative-config", mtp(1))
        assert result.returncode == 1
        assert "has no MTP layer" in result.stderr and "use method ngram" in result.stderr, result.stderr


def test_inspect_shows_the_mtp_layer(run_moet):
    out = run_moet("inspect", "--model", TINY).stdout
    assert "MTP:          1 layer(s) from model.layers.4" in out
    out = run_moet("inspect", "--model", FIXTURES / "deepseek_v3_plainq").stdout
    assert "config.json says 1 layer(s), but the checkpoint has no tensors for them" in out


def test_bench_reports_step_costs(run_moet, tmp_path):
    out = tmp_path / "bench.json"
    result = run_moet("bench", "--config", FIXTURES / "deepseek_v3" / "config.json", "--prompt-tokens", 5,
                      "--decode-tokens", 6, "--copy-gib", 0.01, "--threads", 2, "--json-out", out,
                      "--speculative-config", mtp(2))
    assert result.returncode == 0, result.stderr
    spec = json.loads(out.read_text())["speculative"]
    assert spec["method"] == "mtp" and spec["num_speculative_tokens"] == 2
    assert list(spec["verify_step_us"]) == ["2", "3"] and min(spec["verify_step_us"].values()) > 0
    assert spec["draft_step_us"] > 0 and min(spec["verify_cost_ratio"].values()) > 0
    assert spec["decode_step_us_row_invariant"] > 0
    projected = spec["decode_tokens_per_s_at_acceptance_length"]
    assert list(projected) == ["1", "2", "3"] and projected["3"] == pytest.approx(3 * projected["1"])

"""`moet bench` on the CPU with random weights of a tiny config: the report's fields, the per-op
profile (--profile: a table on stderr and "profile" in the JSON, shares summing to 1), and the
--cuda-graphs flag being accepted (it only matters with --device cuda)."""
import json
import pathlib

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"


def bench(run_moet, tmp_path, *extra):
    out = tmp_path / "bench.json"
    result = run_moet("bench", "--config", FIXTURES / "qwen3_moe" / "config.json", "--prompt-tokens", 5,
                      "--decode-tokens", 4, "--copy-gib", 0.01, "--threads", 2, "--json-out", out, *extra)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report == json.loads(result.stdout)
    return report, result.stderr


def test_bench_report(run_moet, tmp_path):
    report, _ = bench(run_moet, tmp_path)
    assert report["decode_steps"] == 4
    assert report["decode_tokens_per_s"] > 0 and report["prefill_tokens_per_s"] > 0
    assert report["cuda_graphs"] == "off"  # the CPU has no graphs
    assert report["bytes_per_decode_token"] > 0 and report["decode_fraction_of_copy"] > 0
    assert report["load_seconds"] > 0
    assert "profile" not in report


def test_bench_profile(run_moet, tmp_path):
    report, stderr = bench(run_moet, tmp_path, "--profile", "--cuda-graphs", "off")
    profile = report["profile"]
    assert profile["steps"] == 4
    ops = {op["op"]: op for op in profile["ops"]}
    assert ops["attention"]["calls_per_step"] == 3  # one per layer
    assert ops["matmul[n=512,k=64]"]["calls_per_step"] == 1  # the LM head
    assert ops["moe_experts"]["calls_per_step"] == 2
    assert abs(sum(op["share"] for op in profile["ops"]) - 1.0) < 1e-9
    assert abs(sum(op["us_per_step"] for op in profile["ops"]) - profile["total_us_per_step"]) < 1e-6
    assert "per-op profile" in stderr and "sum of ops" in stderr and "moe_experts" in stderr


def test_cuda_graphs_flag_is_validated(run_moet, tmp_path):
    result = run_moet("bench", "--config", FIXTURES / "qwen3_moe" / "config.json", "--cuda-graphs", "maybe")
    assert result.returncode != 0
    assert "--cuda-graphs" in result.stderr


def test_bench_batch(run_moet, tmp_path):
    one, _ = bench(run_moet, tmp_path)
    three, _ = bench(run_moet, tmp_path, "--batch", 3, "--profile")
    assert one["batch"] == 1 and three["batch"] == 3
    # A step of three tokens reaches more experts than a step of one, and each token's share of
    # the step's bytes is smaller.
    assert three["bytes_per_decode_step"] > one["bytes_per_decode_step"] == one["bytes_per_decode_token"]
    assert three["bytes_per_decode_token"] < one["bytes_per_decode_token"]
    assert three["decode_tokens_per_s"] > 0 and three["decode_steps"] == 4
    ops = {op["op"]: op for op in three["profile"]["ops"]}
    assert ops["attention"]["calls_per_step"] == 3  # one per layer, whatever the batch


def test_bench_batch_is_range_checked(run_moet, tmp_path):
    for batch in (0, 1025):
        result = run_moet("bench", "--config", FIXTURES / "qwen3_moe" / "config.json", "--batch", batch)
        assert result.returncode != 0
        assert "--batch" in result.stderr

"""The quality harness end to end on models/tiny (CPU): every format is scored and compared with
BF16, the numbers are self-consistent, and the W2-sym vs W2-asym comparison is the one
docs/quality.md records for this text."""
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[3]


def test_harness_on_tiny_model(moet_bin, tmp_path):
    out = tmp_path / "quality"
    subprocess.run([sys.executable, REPO / "tools/quality/eval_quality.py", "--model", REPO / "models/tiny",
                    "--text", REPO / "tests/fixtures/score_text.txt", "--prompts",
                    REPO / "tests/fixtures/quality_prompts.txt", "--out", out, "--moet", moet_bin,
                    "--greedy-tokens", "8", "--max-prompts", "8"], check=True, timeout=600)
    report = json.loads((out / "quality.json").read_text())
    rows = {r["format"]: r for r in report["formats"]}
    assert set(rows) == {"bf16", "fp8", "mxfp4", "nvfp4", "w2-auto", "w2-sign", "w2-alt", "w2-asym"}
    assert rows["bf16"]["kl_mean"] == 0 and rows["bf16"]["top1_agreement"] == 1 and rows["bf16"]["greedy_match_mean"] == 8
    for r in rows.values():
        assert r["kl_mean"] >= 0 and r["kl_p99"] >= 0 and 0 <= r["top1_agreement"] <= 1
    # more bits, closer to BF16
    assert rows["fp8"]["kl_mean"] < rows["nvfp4"]["kl_mean"] < rows["w2-auto"]["kl_mean"]
    assert rows["mxfp4"]["kl_mean"] < rows["w2-auto"]["kl_mean"]
    # the harness's dequantized W2 copy scores like the engine's own W2 kernels
    engine = json.loads(subprocess.run([moet_bin, "score", "--model", REPO / "models/tiny", "--text-file",
                                        REPO / "tests/fixtures/score_text.txt", "--experts", "w2"],
                                       capture_output=True, text=True, check=True).stdout)
    assert abs(engine["perplexity"] - rows["w2-auto"]["perplexity"]) < 1e-5 * engine["perplexity"]
    # Recorded finding (docs/quality.md): on this text the tiny model does NOT show the sign-bias
    # advantage; W2-asym's mean KL is lower than W2-sym's. If this flips, update docs/quality.md.
    assert rows["w2-asym"]["kl_mean"] < rows["w2-auto"]["kl_mean"]
    assert report["sign_bias"]["mean_abs_bias_sym"] < report["sign_bias"]["mean_abs_bias_asym"]

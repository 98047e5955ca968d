"""--kv-cache-dtype end to end on the CPU: `moet score` with a quantized cache, chunked
(--max-num-batched-tokens) so later chunks read it, reports the FP32-KV run's perplexity and its
KL divergence from it; nvfp4 is refused for a GQA model and any dtype but fp32 on --device cuda
(until its kernels have run on a GPU), each with one line naming the flag."""
import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures"
TINY = REPO / "models" / "tiny"


def one_line_error(result):
    assert result.returncode != 0
    lines = [l for l in result.stderr.splitlines() if l.startswith("moet: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_score_reports_kld_against_the_fp32_cache(run_moet):
    args = ("score", "--model", TINY, "--text-file", REPO / "tests" / "fixtures" / "score_text.txt",
            "--max-tokens", 160, "--max-num-batched-tokens", 48, "--experts", "native")
    fp8 = json.loads(run_moet(*args, "--kv-cache-dtype", "fp8").stdout)
    fp32 = json.loads(run_moet(*args, "--kv-cache-dtype", "fp32").stdout)
    assert fp8["kv_cache_dtype"] == "fp8_e4m3" and fp8["max_num_batched_tokens"] == 48
    assert fp8["fp32_kv_perplexity"] == fp32["perplexity"]  # the same chunks over an FP32 cache
    assert "kld_vs_fp32_kv" not in fp32
    assert 0 < fp8["kld_vs_fp32_kv"] < 0.03  # 0.008 on this text (docs/kv.md has longer ones)
    assert abs(fp8["perplexity_change"]) < 0.02
    assert fp8["top1_agreement_vs_fp32_kv"] > 0.9


def test_nvfp4_is_refused_for_gqa_models(run_moet):
    line = one_line_error(run_moet("generate", "--model", FIXTURES / "qwen3_moe", "--prompt-ids", "1,2,3",
                                   "--kv-cache-dtype", "nvfp4"))
    assert "--kv-cache-dtype nvfp4" in line and "GQA" in line


def test_quantized_caches_reach_cuda(run_moet):
    # Past the option checks to the device itself: here (no GPU) opening it is the one-line error.
    line = one_line_error(run_moet("generate", "--model", FIXTURES / "deepseek_v3", "--prompt-ids", "1,2,3",
                                   "--device", "cuda", "--kv-cache-dtype", "bf16"))
    assert "no CUDA GPU is visible" in line or "built without CUDA" in line, line

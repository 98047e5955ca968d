"""The bundled default model (models/tiny): `moet generate` continues a code prompt and an English
prompt exactly as transformers does (tests/fixtures/tiny_golden.json, made by
tools/fixtures/tiny_golden.py), both from token ids and from text through moet's tokenizer."""
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
GOLDEN = json.loads((REPO / "tests" / "fixtures" / "tiny_golden.json").read_text())
MODEL = REPO / "models" / "tiny"


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=["code", "english"])
def test_greedy_matches_transformers(run_moet, case):
    ids = ",".join(map(str, case["prompt_ids"]))
    result = run_moet("generate", "--model", MODEL, "--prompt-ids", ids, "--experts", "native",
                      "--max-tokens", len(case["greedy_ids"]), "--json", "--kv-cache-dtype", "fp32")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["output_ids"] == case["greedy_ids"]
    assert out["text"] == case["text"]


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=["code", "english"])
def test_text_prompt_is_tokenized_like_hf(run_moet, case):
    result = run_moet("generate", "--model", MODEL, "--prompt", case["prompt"], "--experts", "native",
                      "--max-tokens", 4, "--json", "--kv-cache-dtype", "fp32")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["prompt_ids"] == case["prompt_ids"]
    assert out["output_ids"] == case["greedy_ids"][:4]


def test_default_w2_experts_stream_text(run_moet):
    result = run_moet("generate", "--model", MODEL, "--prompt", GOLDEN["cases"][0]["prompt"], "--max-tokens", 16)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) > 0
    assert "decode" in result.stderr


def test_score_matches_transformers_nll_and_writes_logits(run_moet, tmp_path):
    golden = GOLDEN["score"]
    logits = tmp_path / "logits.f32"
    result = run_moet("score", "--model", MODEL, "--text-file", REPO / golden["text_file"], "--experts", "native",
                      "--logits-out", logits, "--kv-cache-dtype", "fp32")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tokens"] == golden["tokens"]
    assert abs(report["mean_nll"] - golden["mean_nll"]) < 1e-4
    assert logits.stat().st_size == 4 * (golden["tokens"] - 1) * report["vocab"]
    # W2 experts cost some likelihood on a real model, but not much.
    w2 = json.loads(run_moet("score", "--model", MODEL, "--text-file", REPO / golden["text_file"],
                             "--kv-cache-dtype", "fp32").stdout)
    assert w2["experts"] == "w2"
    assert golden["mean_nll"] < w2["mean_nll"] < golden["mean_nll"] + 0.5


def test_score_rejects_a_missing_file(run_moet):
    result = run_moet("score", "--model", MODEL, "--text-file", "/nonexistent.txt")
    assert result.returncode != 0
    assert "/nonexistent.txt: cannot open" in result.stderr

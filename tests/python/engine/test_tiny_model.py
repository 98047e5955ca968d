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
                      "--max-tokens", len(case["greedy_ids"]), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["output_ids"] == case["greedy_ids"]
    assert out["text"] == case["text"]


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=["code", "english"])
def test_text_prompt_is_tokenized_like_hf(run_moet, case):
    result = run_moet("generate", "--model", MODEL, "--prompt", case["prompt"], "--experts", "native",
                      "--max-tokens", 4, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["prompt_ids"] == case["prompt_ids"]
    assert out["output_ids"] == case["greedy_ids"][:4]


def test_default_w2_experts_stream_text(run_moet):
    result = run_moet("generate", "--model", MODEL, "--prompt", GOLDEN["cases"][0]["prompt"], "--max-tokens", 16)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) > 0
    assert "decode" in result.stderr

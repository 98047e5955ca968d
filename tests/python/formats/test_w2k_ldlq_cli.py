"""W2K's LDLQ quantizer end to end on models/tiny (CPU): `moet imatrix --layer-moments` writes the
documented file (each layer's matrices the mean over its routed tokens, as format_study.py's
--shared-moments averages the per-expert ones), `moet dequant --w2k-quantizer ldlq` gives exactly the
numpy original's values (tools/quality/format_study.py e8p_ldlq), the engine scores like that
dequantization, packs record the file's hash (a changed file rebuilds them), and bad flag
combinations and another model's file give one-line errors."""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools" / "quality"))
import eval_quality  # noqa: E402  (the model-copy and KL helpers)
import format_study  # noqa: E402  (the numpy LDLQ)

TINY = REPO / "models" / "tiny"
TEXT = REPO / "tests" / "fixtures" / "score_text.txt"
LDLQ = ["--w2k-quantizer", "ldlq"]


@pytest.fixture(scope="module")
def moments(moet_bin, tmp_path_factory):
    """(layer moments, per-expert second moments) of models/tiny on the CI text (no expert at its layer's
    average: the per-expert file's token-weighted mean is then exactly the layer's)."""
    d = tmp_path_factory.mktemp("moments")
    subprocess.run([moet_bin, "--log-level", "warn", "imatrix", "--model", TINY, "--text-file", TEXT, "--out",
                    d / "tiny.imatrix", "--context-tokens", "128", "--min-tokens", "1", "--second-moments", d / "experts.moments",
                    "--layer-moments", d / "tiny.moments"], capture_output=True, text=True, check=True)
    return d / "tiny.moments", d / "experts.moments"


def test_layer_moments_file(moments):
    path, per_expert = moments
    config = json.loads((TINY / "config.json").read_text())
    st = eval_quality.Safetensors(path)
    assert st.metadata["format"] == "moet-layer-moments-v1"
    layers = range(config["first_k_dense_replace"], config["num_hidden_layers"])
    shapes = {f"layers.{l}.{what}": [k, k] for l in layers
              for what, k in (("gate_up_in", config["hidden_size"]), ("down_in", config["moe_intermediate_size"]))}
    assert {name: info["shape"] for name, info in st.header.items()} == shapes
    mine = format_study.load_imatrix(path)
    shared = format_study.layer_shared(format_study.load_imatrix(per_expert), per_expert)
    for l in layers:
        for what in ("gate_up_in", "down_in"):
            want = shared[f"layers.{l}.experts.0.{what}"]
            assert np.allclose(mine[f"layers.{l}.{what}"], want, rtol=1e-5, atol=1e-7 * np.abs(want).max())


@pytest.mark.parametrize("tensor, layer, what", [("model.layers.1.mlp.experts.3.up_proj.weight", 1, "gate_up_in"),
                                                 ("model.layers.3.mlp.experts.9.down_proj.weight", 3, "down_in")])
def test_dequant_equals_the_numpy_original(run_moet, moments, tmp_path, tensor, layer, what):
    path, _ = moments
    r = run_moet("dequant", "--model", TINY, "--tensor", tensor, "--format", "w2k", *LDLQ, "--layer-moments", path,
                 "--out", tmp_path / "q.f32")
    assert r.returncode == 0, r.stderr
    W = next(w for name, _, _, _, w in format_study.load_experts(TINY) if name == tensor)
    H = format_study.load_imatrix(path)[f"layers.{layer}.{what}"]
    want = format_study.e8p_ldlq(W, H, format_study.e5m3_values()).astype(np.float32)
    got = np.fromfile(tmp_path / "q.f32", dtype=np.float32).reshape(W.shape)
    assert np.array_equal(got, want), f"{(got != want).sum()} of {got.size} values differ"


def score(run_moet, model, logits, *extra):
    r = run_moet("--log-level", "warn", "score", "--model", model, "--text-file", TEXT, "--logits-out", logits, *extra)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    return s, np.fromfile(logits, dtype=np.float32).reshape(-1, s["vocab"]).astype(np.float64)


def test_engine_scores_like_the_dequantization(run_moet, moments, tmp_path):
    path, _ = moments
    engine, _ = score(run_moet, TINY, tmp_path / "engine.f32", "--experts", "w2k", *LDLQ, "--layer-moments", path,
                      "--pack-dir", tmp_path / "packs")
    dq = run_moet("dequant", "--model", TINY, "--all-experts", "--format", "w2k", *LDLQ, "--layer-moments", path,
                  "--threads", 2, "--out", tmp_path / "experts.safetensors")
    assert dq.returncode == 0, dq.stderr

    class Args:
        model = TINY

    copy = eval_quality.swap_experts(Args, tmp_path / "experts.safetensors", tmp_path)
    reference, _ = score(run_moet, copy, tmp_path / "ref.f32", "--experts", "native")
    assert abs(engine["perplexity"] - reference["perplexity"]) < 1e-5 * reference["perplexity"]


def test_pack_records_the_layer_moments(run_moet, moet_bin, moments, tmp_path):
    path, _ = moments
    args = ["pack", "--model", TINY, "--out", tmp_path, "--format", "w2k", *LDLQ]
    first = run_moet(*args, "--layer-moments", path)
    assert first.returncode == 0 and first.stdout.startswith("built"), first.stderr
    sidecar = json.loads((tmp_path / "experts-w2k-rank0of1.json").read_text())
    assert sidecar["w2k_quantizer"] == "ldlq" and len(sidecar["layer_moments"]) == 16
    again = run_moet(*args, "--layer-moments", path)
    assert again.stdout.startswith("up to date"), again.stdout + again.stderr
    other = tmp_path / "other.moments"
    subprocess.run([moet_bin, "--log-level", "warn", "imatrix", "--model", TINY, "--text-file", TEXT, "--out",
                    tmp_path / "other.imatrix", "--layer-moments", other, "--max-tokens", "64"],
                   check=True, capture_output=True)
    rebuilt = run_moet("--log-level", "info", *args, "--layer-moments", other)
    assert rebuilt.stdout.startswith("built") and "'layer_moments'" in rebuilt.stderr, rebuilt.stdout + rebuilt.stderr


@pytest.mark.parametrize("args, message", [
    (["--experts", "w2k", *LDLQ], "--w2k-quantizer ldlq rounds against the layers' input second moments"),
    (["--experts", "w2k", "--layer-moments", "x.moments"], "--layer-moments is read by --w2k-quantizer ldlq only"),
    (["--experts", "w2", *LDLQ, "--layer-moments", "x.moments"], "--w2k-quantizer ldlq is for the w2k format, not w2"),
    (["--experts", "w2k", *LDLQ, "--layer-moments", "x.moments", "--imatrix", "x.imatrix"],
     "not w2k with --w2k-quantizer ldlq"),
])
def test_bad_combinations(run_moet, args, message):
    r = run_moet("score", "--model", TINY, "--text-file", TEXT, *args)
    assert r.returncode == 1 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_another_models_file_is_refused(run_moet, moments, tmp_path):
    path, per_expert = moments
    r = run_moet("dequant", "--model", REPO / "tests/fixtures/qwen3_moe", "--all-experts", "--format", "w2k", *LDLQ,
                 "--layer-moments", path, "--out", tmp_path / "x.safetensors")
    assert r.returncode == 1 and f"layer moments {path} were made for another model" in r.stderr, r.stderr
    r = run_moet("pack", "--model", REPO / "tests/fixtures/qwen3_moe", "--out", tmp_path, "--format", "w2k", *LDLQ,
                 "--layer-moments", path)
    assert r.returncode == 1 and "were made for another model" in r.stderr, r.stderr
    r = run_moet("score", "--model", TINY, "--text-file", TEXT, "--experts", "w2k", *LDLQ, "--layer-moments", per_expert)
    assert r.returncode == 1 and "is not a moet layer-moments file" in r.stderr and r.stderr.count("\n") == 1, r.stderr

"""W2K's LDLQ quantizer end to end on models/tiny (CPU): `moet imatrix --layer-moments` writes the
documented file (each layer's matrices the mean over its routed tokens, as format_study.py's
--shared-moments averages the per-expert ones) and `--expert-moments F --expert-moments-top N` each
layer's N hottest experts' own matrices (the same as for every expert); `moet dequant
--w2k-quantizer ldlq` gives exactly the numpy original's values (tools/quality/format_study.py
e8p_ldlq) against the layer's H or the expert's own, experts without their own take the layer's, the
bytes are the same for any thread count; the engine scores like that dequantization, packs record
the files' hashes (a changed file rebuilds them), and bad flag combinations and another model's
files give one-line errors."""
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
    """(layer moments, per-expert second moments of every expert) of models/tiny on the CI text (no
    expert at its layer's average: the per-expert file's token-weighted mean is then exactly the
    layer's)."""
    d = tmp_path_factory.mktemp("moments")
    subprocess.run([moet_bin, "--log-level", "warn", "imatrix", "--model", TINY, "--text-file", TEXT, "--out",
                    d / "tiny.imatrix", "--context-tokens", "128", "--min-tokens", "1", "--expert-moments", d / "experts.moments",
                    "--layer-moments", d / "tiny.moments"], capture_output=True, text=True, check=True)
    return d / "tiny.moments", d / "experts.moments"


@pytest.fixture(scope="module")
def top4(moet_bin, tmp_path_factory):
    """Per-expert second moments of each layer's 4 hottest experts (of 16), as `moments` measures them."""
    d = tmp_path_factory.mktemp("top4")
    subprocess.run([moet_bin, "--log-level", "warn", "imatrix", "--model", TINY, "--text-file", TEXT, "--out",
                    d / "tiny.imatrix", "--context-tokens", "128", "--min-tokens", "1", "--expert-moments",
                    d / "top4.moments", "--expert-moments-top", "4"], capture_output=True, text=True, check=True)
    return d / "top4.moments"


def expert_tokens(path):
    st = eval_quality.Safetensors(path)
    return {name: np.frombuffer(st.raw(name), dtype=np.int32) for name, info in st.header.items() if info["dtype"] == "I32"}


def test_top_expert_moments_file(moments, top4):
    _, every = moments
    assert eval_quality.Safetensors(top4).metadata["format"] == "moet-imatrix-second-moments-v1"
    counts = expert_tokens(every)
    assert {k: list(v) for k, v in expert_tokens(top4).items()} == {k: list(v) for k, v in counts.items()}
    mine, all_experts = format_study.load_imatrix(top4), format_study.load_imatrix(every)
    for name, n in counts.items():
        layer = name.split(".")[1]
        held = sorted(e for e in range(16) if f"layers.{layer}.experts.{e}.down_in" in mine)
        assert len(held) == 4 and min(n[held]) >= max(np.delete(n, held)), (layer, held, n)
        for e in held:
            for what in ("gate_up_in", "down_in"):
                key = f"layers.{layer}.experts.{e}.{what}"
                assert np.array_equal(mine[key], all_experts[key]), key
    assert len(mine) == 3 * 4 * 2


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


@pytest.mark.parametrize("tensor, layer, expert, what", [
    ("model.layers.1.mlp.experts.3.up_proj.weight", 1, 3, "gate_up_in"),
    ("model.layers.3.mlp.experts.9.down_proj.weight", 3, 9, "down_in")])
@pytest.mark.parametrize("own", [False, True], ids=["layer-H", "expert-H"])
def test_dequant_equals_the_numpy_original(run_moet, moments, tmp_path, tensor, layer, expert, what, own):
    layers, experts = moments
    flag, path = ("--expert-moments", experts) if own else ("--layer-moments", layers)
    r = run_moet("dequant", "--model", TINY, "--tensor", tensor, "--format", "w2k", *LDLQ, flag, path,
                 "--out", tmp_path / "q.f32")
    assert r.returncode == 0, r.stderr
    W = next(w for name, _, _, _, w in format_study.load_experts(TINY) if name == tensor)
    H = format_study.load_imatrix(path)[f"layers.{layer}.experts.{expert}.{what}" if own else f"layers.{layer}.{what}"]
    want = format_study.e8p_ldlq(W, H, format_study.e5m3_values()).astype(np.float32)
    got = np.fromfile(tmp_path / "q.f32", dtype=np.float32).reshape(W.shape)
    assert np.array_equal(got, want), f"{(got != want).sum()} of {got.size} values differ"


def dequant_all(run_moet, out, *args):
    r = run_moet("dequant", "--model", TINY, "--all-experts", "--format", "w2k", *LDLQ, *args, "--out", out)
    assert r.returncode == 0, r.stderr
    return eval_quality.Safetensors(out)


def test_hottest_own_rest_layer_any_threads(run_moet, moments, top4, tmp_path):
    layers, every = moments
    layer_only = dequant_all(run_moet, tmp_path / "layer.st", "--layer-moments", layers)
    own_only = dequant_all(run_moet, tmp_path / "own.st", "--expert-moments", every)
    top = ["--layer-moments", layers, "--expert-moments", top4]
    mixed = dequant_all(run_moet, tmp_path / "mixed.st", *top, "--expert-moments-prior", 0, "--threads", 2)
    one_thread = dequant_all(run_moet, tmp_path / "one.st", *top, "--expert-moments-prior", 0, "--threads", 1)
    blended = dequant_all(run_moet, tmp_path / "blended.st", *top)  # the default prior
    held = set(n.rsplit(".", 1)[0] for n in format_study.load_imatrix(top4))  # layers.L.experts.e
    mains = [n for n in mixed.header if int(n.split(".")[2]) < 4]  # the MTP layer keeps the reference quantizer
    for name in mixed.header:
        assert mixed.raw(name) == one_thread.raw(name), name
    for name in mains:
        layer, expert = name.split(".")[2], name.split(".")[5]
        own = f"layers.{layer}.experts.{expert}" in held
        assert mixed.raw(name) == (own_only if own else layer_only).raw(name), name
        assert (blended.raw(name) != mixed.raw(name)) == own, name
    assert sum(mixed.raw(n) != layer_only.raw(n) for n in mains) == 3 * 4 * 3


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


@pytest.mark.parametrize("kind", ["layer", "expert"])
def test_pack_records_the_moments(run_moet, moet_bin, moments, top4, tmp_path, kind):
    layers, _ = moments
    args = ["pack", "--model", TINY, "--out", tmp_path, "--format", "w2k", *LDLQ]
    files = {"layer": ["--layer-moments", layers], "expert": ["--layer-moments", layers, "--expert-moments", top4]}
    first = run_moet(*args, *files[kind])
    assert first.returncode == 0 and first.stdout.startswith("built"), first.stderr
    sidecar = json.loads((tmp_path / "experts-w2k-rank0of1.json").read_text())
    assert sidecar["w2k_quantizer"] == "ldlq" and len(sidecar["layer_moments"]) == 16
    assert (len(sidecar["expert_moments"]) == 16 and sidecar["expert_moments_prior"] == 1024) if kind == "expert" \
        else "expert_moments" not in sidecar, sidecar
    again = run_moet(*args, *files[kind])
    assert again.stdout.startswith("up to date"), again.stdout + again.stderr
    other = tmp_path / "other.moments"
    made = ["--layer-moments", other] if kind == "layer" else ["--expert-moments", other, "--expert-moments-top", "4"]
    subprocess.run([moet_bin, "--log-level", "warn", "imatrix", "--model", TINY, "--text-file", TEXT, "--out",
                    tmp_path / "other.imatrix", *made, "--max-tokens", "64"], check=True, capture_output=True)
    changed = ["--layer-moments", other] if kind == "layer" else ["--layer-moments", layers, "--expert-moments", other]
    rebuilt = run_moet("--log-level", "info", *args, *changed)
    assert rebuilt.stdout.startswith("built") and f"'{kind}_moments'" in rebuilt.stderr, rebuilt.stdout + rebuilt.stderr
    if kind == "expert":
        prior = run_moet("--log-level", "info", *args, *changed, "--expert-moments-prior", "64")
        assert prior.stdout.startswith("built") and "'expert_moments_prior'" in prior.stderr, prior.stderr


@pytest.mark.parametrize("args, message", [
    (["--experts", "w2k", *LDLQ], "--w2k-quantizer ldlq rounds against the layers' input second moments"),
    (["--experts", "w2k", "--layer-moments", "x.moments"], "--layer-moments is read by --w2k-quantizer ldlq only"),
    (["--experts", "w2", *LDLQ, "--layer-moments", "x.moments"], "--w2k-quantizer ldlq is for the w2k format, not w2"),
    (["--experts", "w2k", *LDLQ, "--layer-moments", "x.moments", "--imatrix", "x.imatrix"],
     "not w2k with --w2k-quantizer ldlq"),
    (["--experts", "w2k", "--expert-moments", "x.moments"], "--expert-moments is read by --w2k-quantizer ldlq only"),
    (["--experts", "w2k", *LDLQ, "--expert-moments", "x.moments", "--expert-moments-prior", "8"],
     "--expert-moments-prior blends each expert's own H with its layer's: give --layer-moments and --expert-moments"),
    (["--experts", "w2k", *LDLQ, "--layer-moments", "x.moments", "--expert-moments-prior", "8"],
     "--expert-moments-prior blends each expert's own H with its layer's"),
])
def test_bad_combinations(run_moet, args, message):
    r = run_moet("score", "--model", TINY, "--text-file", TEXT, *args)
    assert r.returncode == 1 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_imatrix_top_needs_the_file(run_moet, tmp_path):
    r = run_moet("imatrix", "--model", TINY, "--text-file", TEXT, "--out", tmp_path / "x.imatrix",
                 "--expert-moments-top", "4")
    assert r.returncode == 1 and "--expert-moments-top chooses the experts of --expert-moments F" in r.stderr \
        and r.stderr.count("\n") == 1, r.stderr


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
    r = run_moet("score", "--model", TINY, "--text-file", TEXT, "--experts", "w2k", *LDLQ, "--expert-moments", path)
    assert r.returncode == 1 and "is not a moet expert-moments file" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = run_moet("dequant", "--model", REPO / "tests/fixtures/qwen3_moe", "--all-experts", "--format", "w2k", *LDLQ,
                 "--expert-moments", per_expert, "--out", tmp_path / "x.safetensors")
    assert r.returncode == 1 and f"expert moments {per_expert} were made for another model" in r.stderr, r.stderr


def test_hottest_experts_alone_are_refused(run_moet, top4, tmp_path):
    r = run_moet("dequant", "--model", TINY, "--all-experts", "--format", "w2k", *LDLQ, "--expert-moments", top4,
                 "--out", tmp_path / "x.safetensors")
    assert r.returncode == 1 and f"expert moments {top4} hold no matrices for layer 1 expert" in r.stderr \
        and "give --layer-moments F" in r.stderr and r.stderr.count("\n") == 1, r.stderr

"""`moet dequant --all-experts`: one safetensors file with every routed-expert weight of a model
(MoE layers and MTP layers) equals the per-tensor `moet dequant --tensor` outputs byte for byte,
for every format, source format and thread count; what the quality harness relies on."""
import json
import pathlib
import re
import struct

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures"
FORMATS = ["source", "bf16", "fp8", "mxfp4", "nvfp4", "w2", "w2-asym"]
EXPERT = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)}; no numpy dtype needed."""
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def checkpoint_experts(model):
    """Routed-expert weight names and shapes of a checkpoint, from its safetensors headers."""
    names = {}
    for path in pathlib.Path(model).glob("*.safetensors"):
        data = path.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        for k, v in json.loads(data[8:8 + n]).items():
            if EXPERT.search(k):
                names[k] = v["shape"]
    return names


def all_experts(run_moet, model, out, fmt, *extra):
    r = run_moet("dequant", "--model", model, "--all-experts", "--format", fmt, "--out", out, *extra)
    assert r.returncode == 0, r.stderr
    return read_safetensors(out)


def per_tensor(run_moet, tmp_path, model, name, fmt, *extra):
    out = tmp_path / "one.f32"
    r = run_moet("dequant", "--model", model, "--tensor", name, "--format", fmt, "--out", out, *extra)
    assert r.returncode == 0, r.stderr
    return out.read_bytes()


@pytest.mark.parametrize("fmt", FORMATS)
def test_tiny_model_every_tensor_equals_per_tensor_runs(run_moet, tmp_path, fmt):
    model = REPO / "models" / "tiny"
    got = all_experts(run_moet, model, tmp_path / "all.safetensors", fmt, "--threads", 3)
    expected = checkpoint_experts(model)
    assert set(got) == set(expected)  # 3 MoE layers + the MTP layer (layers.4) x 16 experts x 3
    assert len(got) == 192 and any(".layers.4." in k for k in got)
    names = sorted(got) if fmt in ("w2", "fp8") else sorted(got)[::17]
    for name in names:
        dtype, shape, raw = got[name]
        assert dtype == "F32" and shape == expected[name]
        assert raw == per_tensor(run_moet, tmp_path, model, name, fmt), name


@pytest.mark.parametrize("fixture", ["deepseek_v3", "deepseek_v3_fp8", "qwen3_moe", "qwen3_moe_nvfp4", "mixtral",
                                     "mixtral_mxfp4", "glm4_moe"])
@pytest.mark.parametrize("fmt,zero_mode", [("w2", "alt"), ("nvfp4", "auto"), ("mxfp4", "auto")])
def test_fixtures_sources_and_layouts(run_moet, tmp_path, fixture, fmt, zero_mode):
    model = FIXTURES / fixture
    got = all_experts(run_moet, model, tmp_path / "all.safetensors", fmt, "--zero-mode", zero_mode)
    shapes = checkpoint_experts(model)
    assert set(got) == set(shapes)
    for name in sorted(got)[::5]:
        dtype, shape, raw = got[name]
        assert dtype == "F32" and len(shape) == 2 and len(raw) == 4 * shape[0] * shape[1]
        assert raw == per_tensor(run_moet, tmp_path, model, name, fmt, "--zero-mode", zero_mode), name


def test_same_bytes_for_any_thread_count(run_moet, tmp_path):
    model = FIXTURES / "qwen3_moe"  # three shards
    files = [tmp_path / f"t{n}.safetensors" for n in (1, 2, 5)]
    for n, out in zip((1, 2, 5), files):
        all_experts(run_moet, model, out, "w2-asym", "--threads", n)
    assert files[0].read_bytes() == files[1].read_bytes() == files[2].read_bytes()


def test_bad_uses_fail_with_one_line(run_moet, tmp_path):
    model = FIXTURES / "mixtral"
    out = tmp_path / "x"
    r = run_moet("dequant", "--model", model, "--all-experts", "--tensor", "lm_head.weight", "--format", "w2", "--out", out)
    assert r.returncode == 1 and "--all-experts takes no --tensor" in r.stderr
    r = run_moet("dequant", "--model", model, "--format", "w2", "--out", out)
    assert r.returncode == 1 and "--tensor NAME or --all-experts" in r.stderr
    r = run_moet("dequant", "--model", model, "--all-experts", "--format", "int3", "--out", out)
    assert r.returncode == 1 and "unknown format 'int3'" in r.stderr
    assert not out.exists()

"""Bit-exact golden tests of moet's expert formats against the numpy + ml_dtypes oracle.

A checkpoint with one tensor per source format (BF16, F16, F32, FP8 e4m3 128x128 blocks, NVFP4,
MXFP4 in both hub layouts) is written here; `moet dequant` output must equal the oracle byte
for byte for W2 (every zero mode), MXFP4 and the float64 reference quantizers. Inputs include
+-0, subnormals, all-zero blocks, +-Inf (saturation) and partial FP8 blocks; NaN is an error.
"""
import sys
import pathlib

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import oracle  # noqa: E402

N, K = 160, 320  # partial 128x128 FP8 blocks in both dimensions


def base_values(rng, n=N, k=K):
    """float32-exact values spanning many binades, with +-0, subnormals and all-zero blocks."""
    v = rng.standard_normal((n, k)) * np.exp2(rng.integers(-12, 4, size=(n, k // 32))).repeat(32, 1)
    v[rng.random((n, k)) < 0.08] = 0.0
    v[rng.random((n, k)) < 0.04] = -0.0
    v[3, 64:96] = 0.0  # an all-zero block
    v[5, :32] = rng.choice([1e-39, -3e-40, 2e-41], size=32)  # f32/bf16 subnormals
    return v.astype(np.float32).astype(np.float64)


def make_sources(rng):
    v = base_values(rng)
    bf = v.astype(ml_dtypes.bfloat16)
    bf[7, 10] = np.inf
    bf[8, 40] = -np.inf
    f16 = (v * 2.0 ** 6).astype(np.float16)
    f16[9, :32] = np.float16(3e-7) * np.arange(32)  # f16 subnormals
    codes8, scale_inv = oracle.fp8_block_quantize(v)
    nv_codes, nv_scales, nv_global = oracle.nvfp4_quantize(v)
    mx_codes = rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)
    mx_codes[2, :16] = 0  # an all-zero MXFP4 block
    mx_scales = rng.integers(100, 140, size=(N, K // 32), dtype=np.uint8)
    mx_scales[4, 0] = 0
    plus_zero = np.where(v == 0, 0.0, v).astype(ml_dtypes.bfloat16)  # every zero +0 (30%)
    plus_zero[rng.random((N, K)) < 0.25] = 0.0
    tensors = {
        "bf16.weight": bf, "f16.weight": f16, "f32.weight": v.astype(np.float32),
        "fp8.weight": codes8.view(oracle.E4M3), "fp8.weight_scale_inv": scale_inv,
        "nvfp4.weight": nv_codes, "nvfp4.weight_scale": nv_scales.view(oracle.E4M3),
        "nvfp4.weight_scale_2": np.array(nv_global, dtype=np.float32),
        "mxfp4.weight": mx_codes, "mxfp4.weight_scale": mx_scales,
        "gptoss_blocks": mx_codes.reshape(N, K // 32, 16), "gptoss_scales": mx_scales,
        "pluszero.weight": plus_zero,
    }
    sources = {
        "bf16.weight": {"format": "bf16", "values": bf.astype(np.float64)},
        "f16.weight": {"format": "f16", "values": f16.astype(np.float64)},
        "f32.weight": {"format": "f32", "values": v},
        "fp8.weight": {"format": "fp8", "codes": codes8, "scale_inv": scale_inv},
        "nvfp4.weight": {"format": "nvfp4", "codes": nv_codes, "scales": nv_scales, "global": nv_global},
        "mxfp4.weight": {"format": "mxfp4", "codes": mx_codes, "scales": mx_scales},
        "gptoss_blocks": {"format": "mxfp4", "codes": mx_codes, "scales": mx_scales},
        "pluszero.weight": {"format": "bf16", "values": plus_zero.astype(np.float64)},
    }
    return tensors, sources


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("formats_ckpt")
    tensors, sources = make_sources(np.random.default_rng(1234))
    oracle.write_checkpoint(directory, tensors)
    return directory, sources


def dequant(run_moet, tmp_path, model, tensor, fmt, zero_mode="auto"):
    out = tmp_path / f"{tensor}.{fmt}.{zero_mode}.f32"
    r = run_moet("dequant", "--model", model, "--tensor", tensor, "--format", fmt, "--zero-mode", zero_mode,
                 "--threads", 2, "--out", out)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype="<f4").reshape(N, K)


def assert_bytes_equal(got, want):
    want = np.asarray(want, dtype=np.float32)
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert diff.size == 0, f"{diff.size} differ; first at {np.unravel_index(diff[0], got.shape)}: " \
                           f"moet {got.flat[diff[0]]!r} oracle {want.flat[diff[0]]!r}"


SOURCES = ["bf16.weight", "f16.weight", "f32.weight", "fp8.weight", "nvfp4.weight", "mxfp4.weight",
           "gptoss_blocks", "pluszero.weight"]


@pytest.mark.parametrize("tensor", SOURCES)
def test_source_values_exact(run_moet, tmp_path, checkpoint, tensor):
    model, sources = checkpoint
    got = dequant(run_moet, tmp_path, model, tensor, "source")
    assert_bytes_equal(got, oracle.decode_source(sources[tensor]).astype(np.float32))


@pytest.mark.parametrize("zero_mode", ["auto", "sign", "alt"])
@pytest.mark.parametrize("tensor", SOURCES)
def test_w2_matches_oracle(run_moet, tmp_path, checkpoint, tensor, zero_mode):
    model, sources = checkpoint
    got = dequant(run_moet, tmp_path, model, tensor, "w2", zero_mode)
    assert_bytes_equal(got, oracle.w2_dequant(sources[tensor], zero_mode))


@pytest.mark.parametrize("tensor", SOURCES)
def test_mxfp4_matches_oracle(run_moet, tmp_path, checkpoint, tensor):
    model, sources = checkpoint
    assert_bytes_equal(dequant(run_moet, tmp_path, model, tensor, "mxfp4"), oracle.mxfp4_dequant(sources[tensor]))


@pytest.mark.parametrize("tensor", ["bf16.weight", "f32.weight", "fp8.weight", "nvfp4.weight"])
def test_reference_quantizers_match_oracle(run_moet, tmp_path, checkpoint, tensor):
    model, sources = checkpoint
    v = oracle.decode_source(sources[tensor])
    codes, scale_inv = oracle.fp8_block_quantize(v)
    fp8 = oracle.decode_source({"format": "fp8", "codes": codes, "scale_inv": scale_inv})
    assert_bytes_equal(dequant(run_moet, tmp_path, model, tensor, "fp8"), fp8.astype(np.float32))
    nv_codes, nv_scales, g = oracle.nvfp4_quantize(v)
    nv = oracle.decode_source({"format": "nvfp4", "codes": nv_codes, "scales": nv_scales, "global": g})
    assert_bytes_equal(dequant(run_moet, tmp_path, model, tensor, "nvfp4"), nv.astype(np.float32))
    if tensor in ("bf16.weight", "f32.weight"):  # float32-exact values: ml_dtypes' cast is exact RNE
        want = v.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
        assert_bytes_equal(dequant(run_moet, tmp_path, model, tensor, "bf16"), want)


def test_pluszero_checkpoint_resolves_to_alt(checkpoint):
    _, sources = checkpoint
    v = oracle.decode_source(sources["pluszero.weight"])
    assert oracle.resolve_zero_mode(v, "auto") == "alt"
    assert oracle.resolve_zero_mode(oracle.decode_source(sources["bf16.weight"]), "auto") == "sign"


@pytest.mark.parametrize("tensor", ["bf16.weight", "fp8.weight", "pluszero.weight"])
def test_w2_asym_matches_oracle(run_moet, tmp_path, checkpoint, tensor):
    model, sources = checkpoint
    assert_bytes_equal(dequant(run_moet, tmp_path, model, tensor, "w2-asym"), oracle.asym_dequant(sources[tensor], "auto"))


def test_nan_source_is_an_error(run_moet, tmp_path):
    v = np.ones((4, 64), dtype=np.float32)
    v[2, 17] = np.nan
    oracle.write_checkpoint(tmp_path, {"nan.weight": v})
    r = run_moet("dequant", "--model", tmp_path, "--tensor", "nan.weight", "--format", "w2", "--out", tmp_path / "o")
    assert r.returncode == 1 and "NaN" in r.stderr and "nan.weight" in r.stderr, r.stderr


def test_oracle_rounding_agrees_with_ml_dtypes_on_float32_inputs():
    """The oracle's exact rounding equals ml_dtypes' casts where those are single roundings."""
    y = np.random.default_rng(5).standard_normal(200000).astype(np.float32) * 64
    y = np.concatenate([y, np.float32([0.25, 0.75, 2.5, 3.5, 5, -0.0, 464, 1e-3, 3e-3])]).astype(np.float64)
    e2m1 = np.clip(y, -6, 6).astype(oracle.E2M1).astype(np.float64)
    assert np.array_equal(oracle.to_e2m1(y), e2m1)
    assert np.array_equal(np.signbit(oracle.to_e2m1(y)), np.signbit(e2m1))
    e4m3 = np.clip(y, -448, 448).astype(oracle.E4M3).view(np.uint8)
    assert np.array_equal(oracle.to_e4m3(y), e4m3)

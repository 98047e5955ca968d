"""Independent numpy + ml_dtypes reference of moet's expert formats (docs/formats.md).

Everything is float64 until the final float32 dequantized output, which is what `moet dequant`
writes; W2 and MXFP4 outputs determine codes and scales exactly, so equal float32 bytes mean
equal quantized bytes.
"""
import json
import struct

import ml_dtypes
import numpy as np

E2M1 = ml_dtypes.float4_e2m1fn
E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu
GRID = np.array([-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


# ---- sources -------------------------------------------------------------------------------
def nibbles_unpack(packed):
    """[N, K/2] bytes -> [N, K] nibbles, low nibble = even column."""
    out = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = packed & 0xF
    out[:, 1::2] = packed >> 4
    return out


def nibbles_pack(nibbles):
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).astype(np.uint8)


def e2m1_decode(nibbles):
    return nibbles.astype(np.uint8).view(E2M1).astype(np.float64)


def decode_source(src):
    """Exact float64 values of a source dict {format, data, ...}."""
    fmt = src["format"]
    if fmt in ("bf16", "f16", "f32"):
        return src["values"].astype(np.float64)
    if fmt == "fp8":
        codes = src["codes"].view(E4M3).astype(np.float64)
        s = np.repeat(np.repeat(src["scale_inv"].astype(np.float64), 128, 0), 128, 1)
        return codes * s[: codes.shape[0], : codes.shape[1]]
    vals = e2m1_decode(nibbles_unpack(src["codes"]))
    if fmt == "nvfp4":
        scale = src["scales"].view(E4M3).astype(np.float64) * np.float64(src["global"])
        return vals * np.repeat(scale, 16, 1)
    if fmt == "mxfp4":
        return vals * np.repeat(src["scales"].view(E8M0).astype(np.float64), 32, 1)
    raise ValueError(fmt)


# ---- the reference pipeline ----------------------------------------------------------------
def block_amax(v, size):
    a = np.abs(v.reshape(v.shape[0], -1, size))
    return np.where(np.isfinite(a), a, 0).max(axis=2)


def mx_exponents(v):
    amax = block_amax(v, 32)
    with np.errstate(divide="ignore"):
        e = np.rint(np.log2(amax / 6.0))
    e = np.where(amax > 0, e, -127)
    return np.clip(e, -127, 127).astype(np.int64)


def round_exact(y, mant_bits, min_exp, max_value):
    """Round-to-nearest-even of float64 y onto a minifloat grid, saturating; sign of zero kept.

    ml_dtypes casts float64 through float32 (double rounding: 3.49999994 -> 3.5 -> 4 in e4m3), so
    the oracle rounds exactly here (np.frexp / np.rint are exact) and uses ml_dtypes only to
    encode values that are already representable.
    """
    a = np.abs(y)
    with np.errstate(divide="ignore", invalid="ignore"):
        _, ex = np.frexp(a)
        e = np.maximum(ex.astype(np.int64) - 1, min_exp)
        q = np.exp2((e - mant_bits).astype(np.float64))
        r = np.where(np.isinf(a), max_value, np.minimum(np.rint(a / q) * q, max_value))
    return np.copysign(np.where(a == 0, 0.0, r), y)


def to_e2m1(y):
    """RNE to e2m1, saturating at 6, sign of zero kept: returns the float64 e2m1 values."""
    return round_exact(y, 1, 0, 6.0)


def to_e4m3(y):
    """RNE to e4m3fn, saturating at 448: returns the uint8 codes."""
    return round_exact(y, 3, -6, 448.0).astype(E4M3).view(np.uint8)


def mxfp4(src):
    """(e2m1 values [N, K], block exponents [N, K/32], exact source values)."""
    v = decode_source(src)
    if src["format"] == "mxfp4":
        exps = src["scales"].astype(np.int64) - 127
    else:
        exps = mx_exponents(v)
    y = v / np.repeat(np.exp2(exps.astype(np.float64)), 32, 1)
    return to_e2m1(y), exps, v


def resolve_zero_mode(v, mode):
    if mode != "auto":
        return mode
    zeros = v == 0
    neg = int(np.count_nonzero(zeros & np.signbit(v)))
    total = int(np.count_nonzero(zeros))
    minority = min(neg, total - neg)
    return "alt" if total > 0 and minority * 20 < total else "sign"


def signed_e2m1(src, mode):
    """e2m1 values with exact zeros signed per the zero mode (+0 even k, -0 odd k in alt)."""
    q, exps, v = mxfp4(src)
    if resolve_zero_mode(v, mode) == "alt":
        k = np.arange(v.shape[1])[None, :].repeat(v.shape[0], 0)
        q = np.where(v == 0, np.where(k % 2 == 1, -0.0, 0.0), q)
    return q, exps


def expand(exps):
    return np.repeat(np.exp2(exps.astype(np.float64)), 32, 1)


def w2_dequant(src, mode):
    q, exps = signed_e2m1(src, mode)
    level = np.where(np.abs(q) >= 3, 4.0, 1.0) * np.where(np.signbit(q), -1.0, 1.0)
    return (level * expand(exps)).astype(np.float32)


def mxfp4_dequant(src):
    q, exps, _ = mxfp4(src)
    return (q * expand(exps)).astype(np.float32)


def fp8_block_quantize(v):
    n, k = v.shape
    codes = np.zeros((n, k), dtype=np.uint8)
    scale_inv = np.zeros(((n + 127) // 128, (k + 127) // 128), dtype=np.float32)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            blk = v[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            a = np.abs(blk)
            amax = np.where(np.isfinite(a), a, 0).max()
            s = np.float32(amax / 448.0) if amax > 0 else np.float32(1.0)
            scale_inv[i, j] = s
            codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = to_e4m3(blk / np.float64(s))
    return codes, scale_inv


def nvfp4_quantize(v):
    a = np.abs(v)
    amax = np.where(np.isfinite(a), a, 0).max()
    g = np.float32(amax / (448.0 * 6.0)) if amax > 0 else np.float32(1.0)
    sb = to_e4m3(block_amax(v, 16) / (6.0 * np.float64(g)))
    scale = np.repeat(sb.view(E4M3).astype(np.float64) * np.float64(g), 16, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale > 0, to_e2m1(v / scale), np.where(np.signbit(v), -0.0, 0.0))
    nib = q.astype(E2M1).view(np.uint8)
    return nibbles_pack(nib), sb, g


def asym_dequant(src, mode):
    """The W2-asym codebook: 4 e2m1-grid levels by exact 1-D DP over the e2m1 histogram."""
    q, exps = signed_e2m1(src, mode)
    pts = [(val, float(np.count_nonzero(q == val))) for val in GRID]
    pts = [(val, w) for val, w in pts if w > 0]
    n = len(pts)
    w = np.concatenate([[0], np.cumsum([p[1] for p in pts])])
    s = np.concatenate([[0], np.cumsum([p[1] * p[0] for p in pts])])
    sq = np.concatenate([[0], np.cumsum([p[1] * p[0] * p[0] for p in pts])])

    def best(i, j):
        costs = [(sq[j] - sq[i]) - 2 * g * (s[j] - s[i]) + g * g * (w[j] - w[i]) for g in GRID]
        idx = int(np.argmin(costs))  # first minimum = lowest level on a tie
        return costs[idx], GRID[idx]

    clusters = min(4, n)
    inf = float("inf")
    cost = [[inf] * (n + 1) for _ in range(clusters + 1)]
    split = [[0] * (n + 1) for _ in range(clusters + 1)]
    cost[0][0] = 0.0
    for c in range(1, clusters + 1):
        for j in range(c, n + 1):
            for i in range(c - 1, j):
                cand = cost[c - 1][i] + best(i, j)[0]
                if cand < cost[c][j]:
                    cost[c][j], split[c][j] = cand, i
    level_of = {}
    j = n
    for c in range(clusters, 0, -1):
        i = split[c][j]
        for p in range(i, j):
            level_of[pts[p][0]] = best(i, j)[1]
        j = i
    levels = np.vectorize(lambda x: level_of[x])(q)
    return (levels * expand(exps)).astype(np.float32)


# ---- checkpoint writing ----------------------------------------------------------------------
DTYPE_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(ml_dtypes.bfloat16): "BF16",
               np.dtype(E4M3): "F8_E4M3", np.dtype(np.uint8): "U8"}


def write_checkpoint(directory, tensors):
    """tensors: {name: numpy array}; writes model.safetensors + a minimal config.json."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": DTYPE_NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))

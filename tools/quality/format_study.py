"""Format study for issue 31: candidate 2-bit expert formats at <= 2.25 bits per weight on a real model.

Every routed-expert weight of the model's MoE layers is quantized by each candidate (numpy, float64,
optionally weighted by an importance matrix from `moet imatrix`), and per tensor the relative RMSE
sqrt(sum (w - q)^2 / sum w^2) and the importance-weighted one sqrt(sum_k imp_k (w - q)^2 / sum_k imp_k w^2)
are measured. With --kld, the finalists' dequantized experts are swapped into a copy of the model
(tools/quality/eval_quality.py does the swap) and scored teacher-forced with `moet score` against the
unquantized model: KL mean / p99, top-1 agreement, perplexity. With --second-moments (a file from
`moet imatrix --expert-moments`: each expert's input H = E[x x^T]), the candidates that round by
LDLQ (tools/quality/ldlq.py) run, and every format's proxy error tr((W-Q) H (W-Q)^T) / tr(W H W^T)
(the relative mean square of the expert's output error on those inputs) is measured too.
--shared-moments quantizes with each layer's mean H instead (what a full-size model could collect);
--expert-diagonal then gives it each expert's own diagonal (from --imatrix): H_e = D_e^1/2 C D_e^1/2,
C the layer's correlation matrix.

Candidates (bits per weight exact for any K multiple of 32 unless a row factor is named):
  w2            moet's W2: {+-1, +-4} x 2^e per 32, e = round(log2(amax / 6))            2.25
  w2-opt        W2 with e in e0-2..e0+1 chosen by the (weighted) error                     2.25
  sym-r<R>-f32  {+-1, +-R} x an unconstrained float scale per 32 (ideal: bounds the 8-bit scales)
  sym-r<R>-e5m3 {+-1, +-R} x an 8-bit scale per 32: 5 exponent bits, 3 mantissa bits     2.25
  sel4-e5m1     {+-1, +-R_g} x (5+1)-bit scale, 2 bits choose R_g in {2, 2.5, 3.25, 4.5}  2.25
  b16-row       16-weight blocks, 4-bit scales (1..15) x a float16 row factor             2.25 + 16/K
  ks-row        32-weight blocks, 4-bit scales + 1 bit choosing the grid {-4,-1,1,4} or the
                non-uniform {-4,-1.5,0.5,3}, float16 row factor (IQ2_KS-like)              2.156 + 16/K
  e8-16         8-dim vectors, a 2^16-point E8 lattice ball codebook (16 bits / 8 weights) x the
                8-bit e5m3 scale per 32                                                    2.25
  d4-8          4-dim vectors, the 256 smallest points of the shifted D4 lattice x e5m3 / 32 2.25
  e8p           the E8P codebook of W2K (formats/w2k.h; this search tries 13 scales, f = 0.25 ..
                1.45, where the implemented quantizer tries f = 0.75 .. 1.75)               2.25
  e8p-ldlq      W2K's format (E8P x e5m3 per 32, the same bits) rounded by BlockLDLQ: blocks of 8
                columns in order, each the nearest E8P codeword (weighted by diag of the block's D) to
                its target plus the feedback of the earlier blocks' errors; H damped by 1% of its
                mean diagonal; the scale per 32 chosen among e8p's 13 by the exact loss       2.25
  w2-gptq       W2's format rounded by scalar LDLQ (GPTQ), exponent chosen as in w2-opt    2.25
  *-rht         the same after a fixed random-sign Hadamard rotation of every 32 columns (the
                activations would be rotated alike at run time)

Usage: python3 tools/quality/format_study.py --model models/tiny --imatrix F [--formats a,b,..]
         [--second-moments F [--shared-moments [--expert-diagonal]]] [--kld --text FILE --moet build/moet] --out DIR
"""
import argparse
import json
import pathlib
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import eval_quality  # noqa: E402  (the model-copy and KL helpers)
import ldlq  # noqa: E402


# ---------------------------------------------------------------- model and imatrix

def bf16_to_f64(raw, shape):
    u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
    return u.view(np.float32).reshape(shape).astype(np.float64)


def load_experts(model):
    """[(name, layer, expert, kind, W float64 [N, K])] for the routed experts of the main layers."""
    config = json.loads((pathlib.Path(model) / "config.json").read_text())
    layers = config["num_hidden_layers"]
    out = []
    for path in sorted(pathlib.Path(model).glob("*.safetensors")):
        st = eval_quality.Safetensors(path)
        for name, info in st.header.items():
            parts = name.split(".")
            if ".experts." not in name or int(parts[2]) >= layers:
                continue
            kind = parts[-2].split("_")[0]  # gate | up | down
            assert info["dtype"] == "BF16", name
            out.append((name, int(parts[2]), int(parts[5]), kind, bf16_to_f64(st.raw(name), info["shape"])))
    return sorted(out, key=lambda t: (t[1], t[2], t[3]))


def load_imatrix(path):
    """The F32 tensors of an imatrix (vectors) or second-moments file (matrices) by name."""
    st = eval_quality.Safetensors(path)
    return {name: np.frombuffer(st.raw(name), dtype=np.float32).astype(np.float64).reshape(info["shape"])
            for name, info in st.header.items() if info["dtype"] == "F32"}


def layer_shared(moments, path, imatrix=None):
    """Every expert's H replaced by its layer's mean over the routed tokens (sum_e n_e H_e / sum_e n_e,
    n_e from the file's expert_tokens): the one matrix per layer a full-size model could afford. With
    an imatrix, each expert's diagonal D_e from it around the layer's correlations C:
    H_e = D_e^1/2 C D_e^1/2."""
    st = eval_quality.Safetensors(path)
    out = {}
    for name, info in st.header.items():
        if info["dtype"] != "I32":
            continue
        layer = name.split(".")[1]
        n = np.frombuffer(st.raw(name), dtype=np.int32).astype(np.float64)
        for what in ("gate_up_in", "down_in"):
            keys = [f"layers.{layer}.experts.{e}.{what}" for e in range(len(n))]
            mean = sum(w * moments[k] for w, k in zip(n, keys)) / n.sum()
            out.update({k: mean for k in keys})
            if imatrix is not None:
                root = np.sqrt(np.diag(mean))
                C = mean / np.outer(root, root)
                out.update({k: C * np.outer(np.sqrt(imatrix[k]), np.sqrt(imatrix[k])) for k in keys})
    return out


def importance_of(imatrix, layer, expert, kind, cols):
    """The expert's entry for the weight's input (a vector, or H from a second-moments file)."""
    if imatrix is None:
        return np.ones(cols)
    return imatrix[f"layers.{layer}.experts.{expert}.{'down_in' if kind == 'down' else 'gate_up_in'}"]


# ---------------------------------------------------------------- scale grids

def e5m3_values():
    """Positive values of an 8-bit scale (1 + m/8) * 2^(e - 24), e in 1..31, m in 0..7 (e = 0: zero)."""
    e, m = np.meshgrid(np.arange(1, 32), np.arange(8), indexing="ij")
    return np.sort(((1 + m / 8.0) * 2.0 ** (e - 24)).ravel())


def e5m1_values():
    e, m = np.meshgrid(np.arange(1, 32), np.arange(2), indexing="ij")
    return np.sort(((1 + m / 2.0) * 2.0 ** (e - 24)).ravel())


def nearest_codes(y, levels):
    """Index of the nearest level (levels sorted) for every y."""
    mids = (levels[1:] + levels[:-1]) / 2
    return np.searchsorted(mids, y)


def blocks(W, size):
    return W.reshape(W.shape[0], -1, size)


def scalar_search(W, imp, grids, scales, size=32):
    """Per block of `size`, the (grid, scale) among `grids` (level arrays) and `scales` (sorted
    representable values, or None = continuous) minimising sum imp (w - s * level)^2 with nearest
    levels. Returns the dequantized W."""
    V = blocks(W, size)
    I = np.broadcast_to(blocks(imp[None, :].repeat(W.shape[0], 0), size), V.shape)
    amax = np.abs(V).max(axis=2, keepdims=True)
    best_err = np.full(V.shape[:2] + (1,), np.inf)
    best_q = np.zeros_like(V)
    for levels in grids:
        levels = np.asarray(levels, dtype=np.float64)
        top = np.abs(levels).max()
        # candidate scales: amax / top times factors 0.45..1.25 (a fine sweep), then snapped
        for f in np.linspace(0.45, 1.25, 41):
            s = amax / top * f
            if scales is not None:
                idx = np.clip(np.searchsorted(scales, s), 1, len(scales) - 1)
                lo, hi = scales[idx - 1], scales[idx]
                cands = [lo, hi]
            else:
                cands = [s]
            for sc in cands:
                sc = np.where(sc > 0, sc, 1e-30)
                q = sc * levels[nearest_codes(V / sc, levels)]
                if scales is None:  # refit the continuous scale by weighted least squares
                    lv = q / sc
                    num = (I * V * lv).sum(axis=2, keepdims=True)
                    den = (I * lv * lv).sum(axis=2, keepdims=True)
                    sc = np.where(den > 0, num / np.where(den > 0, den, 1), sc)
                    q = sc * lv
                err = (I * (V - q) ** 2).sum(axis=2, keepdims=True)
                better = err < best_err
                best_err = np.where(better, err, best_err)
                best_q = np.where(better, q, best_q)
    return best_q.reshape(W.shape)


def w2_exponent(amax):
    """W2's scale exponent for blocks of absolute maximum amax: round(log2(amax / 6))."""
    with np.errstate(divide="ignore"):
        m, e = np.frexp(amax / 6.0)  # amax/6 = m 2^e, m in [.5, 1)
    return np.where(amax > 0, (e - 1) + (2 * m >= np.sqrt(2)), -127)


def w2_round(y):
    """The nearest of {-4, -1, 1, 4} to every y."""
    return np.sign(y + (y == 0) * 1e-300) * np.where(np.abs(y) > 2.5, 4.0, 1.0)


def w2_reference(W):
    V = blocks(W, 32)
    exp = w2_exponent(np.abs(V).max(axis=2, keepdims=True))
    s = 2.0 ** exp
    return (w2_round(V / s) * s).reshape(W.shape), exp


def w2_opt(W, imp):
    V = blocks(W, 32)
    I = np.broadcast_to(blocks(imp[None, :].repeat(W.shape[0], 0), 32), V.shape)
    _, exp = w2_reference(W)
    best_err, best_q = None, None
    for d in (-2, -1, 0, 1):
        s = 2.0 ** (exp + d)
        q = w2_round(V / s) * s
        err = (I * (V - q) ** 2).sum(axis=2, keepdims=True)
        if best_err is None:
            best_err, best_q = err, q
        else:
            better = err < best_err
            best_err, best_q = np.where(better, err, best_err), np.where(better, q, best_q)
    return best_q.reshape(W.shape)


def row_factor_search(W, imp, size, levels, scale_bits, extra_grids=None):
    """Blocks of `size` with unsigned integer scales 1..2^scale_bits - 1 times a float16 row factor
    d = row amax / (top * (2^bits - 1)) times a few trial factors; best per row by weighted error."""
    levels_list = [np.asarray(g, dtype=np.float64) for g in [levels] + list(extra_grids or [])]
    top = max(np.abs(g).max() for g in levels_list)
    qmax = 2 ** scale_bits - 1
    row_amax = np.abs(W).max(axis=1, keepdims=True)
    best_err = np.full((W.shape[0], 1), np.inf)
    best_q = np.zeros_like(W)
    for f in (0.8, 0.9, 1.0, 1.1):
        d = (row_amax / (top * qmax) * f).astype(np.float16).astype(np.float64)
        d = np.where(d > 0, d, 1e-30)
        scales = d[:, :, None] * np.arange(1, qmax + 1)[None, None, :]  # per row
        # per-row representable scales: search per block among them, rows processed together
        V = blocks(W, size)
        I = np.broadcast_to(blocks(imp[None, :].repeat(W.shape[0], 0), size), V.shape)
        b_err = np.full(V.shape[:2] + (1,), np.inf)
        b_q = np.zeros_like(V)
        for j in range(qmax):
            sc = scales[:, :, j:j + 1]
            for g in levels_list:
                q = sc * g[nearest_codes(V / sc, g)]
                err = (I * (V - q) ** 2).sum(axis=2, keepdims=True)
                better = err < b_err
                b_err, b_q = np.where(better, err, b_err), np.where(better, q, b_q)
        err = b_err.sum(axis=1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_q = np.where(better, b_q.reshape(W.shape), best_q)
    return best_q


# ---------------------------------------------------------------- vector codebooks

def e8_ball(count=1 << 16):
    """The `count` E8 lattice points (D8 u D8 + 1/2) nearest the origin, ties broken by a fixed order."""
    r = np.arange(-3, 4)
    pts = []
    # integer points of D8 with norm^2 <= 12 (coordinates in -3..3, even sum)
    grid = np.array(np.meshgrid(*([r] * 8), indexing="ij")).reshape(8, -1).T
    n2 = (grid ** 2).sum(1)
    keep = (n2 <= 12) & (grid.sum(1) % 2 == 0)
    pts.append(grid[keep].astype(np.float64))
    h = np.arange(-3.5, 4.0, 1.0)
    h = h[np.abs(h) <= 3.5]
    hg = np.array(np.meshgrid(*([np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5])] * 8), indexing="ij")).reshape(8, -1).T
    n2h = (hg ** 2).sum(1)
    keep = (n2h <= 12) & (np.round(hg.sum(1)) % 2 == 0)
    pts.append(hg[keep])
    P = np.concatenate(pts)
    n2 = (P ** 2).sum(1)
    order = np.lexsort(tuple(P.T[::-1]) + (n2,))
    return P[order[:count]]


def d4_ball(count=256):
    """The `count` points of the shifted D4 lattice D4 + (1/2, 1/2, 1/2, 1/2) nearest the origin."""
    r = np.arange(-3.5, 4.0, 1.0)
    g = np.array(np.meshgrid(*([r] * 4), indexing="ij")).reshape(4, -1).T
    keep = np.round(g.sum(1) - 2) % 2 == 0
    P = g[keep]
    n2 = (P ** 2).sum(1)
    order = np.lexsort(tuple(P.T[::-1]) + (n2,))
    return P[order[:count]]


def vector_search(W, imp, book, scales, size=32, chunk=4096):
    """Blocks of `size` share a scale from `scales`; each dim-d vector takes the codeword minimising
    sum imp (w - s c)^2. Scales tried: amax / max|c| x 0.35..1.1, snapped down and up."""
    dim = book.shape[1]
    V = blocks(W, size)
    I = np.broadcast_to(blocks(imp[None, :].repeat(W.shape[0], 0), size), V.shape)
    nb = V.shape[0] * V.shape[1]
    Vf = V.reshape(nb, size)
    If = np.ascontiguousarray(I.reshape(nb, size))
    amax = np.abs(Vf).max(1, keepdims=True)
    top = np.abs(book).max()
    B = book.T.astype(np.float32)           # [dim, C]
    B2 = (book ** 2).T.astype(np.float32)   # [dim, C]
    best_err = np.full((nb, 1), np.inf)
    best_q = np.zeros_like(Vf)
    for f in np.linspace(0.25, 1.45, 13):
        s = amax / top * f
        idx = np.clip(np.searchsorted(scales, s), 1, len(scales) - 1)
        for sc in (scales[idx - 1],):
            sc = np.where(sc > 0, sc, 1e-30)
            Y = (Vf / sc).reshape(-1, dim)     # [nb * size/dim, dim]
            Wt = If.reshape(-1, dim)
            Q = np.empty_like(Y)
            for b in range(0, len(Y), chunk):
                y, w = Y[b:b + chunk].astype(np.float32), Wt[b:b + chunk].astype(np.float32)
                score = (w * w * 0 + w) @ B2 - 2 * (w * y) @ B  # sum w c^2 - 2 sum w y c
                Q[b:b + chunk] = book[score.argmin(1)]
            q = Q.reshape(nb, size) * sc
            err = (If * (Vf - q) ** 2).sum(1, keepdims=True)
            better = err < best_err
            best_err, best_q = np.where(better, err, best_err), np.where(better, q, best_q)
    return best_q.reshape(W.shape)


def e8p_table():
    """The 256 abs patterns of the E8P-like codebook: vectors of {1/2, 3/2, 5/2, 7/2}^8 in order of
    (norm^2, lexicographic), the first 256 (every pattern of norm^2 <= 10 and 29 of norm^2 12)."""
    vals = np.array([0.5, 1.5, 2.5, 3.5])
    g = np.array(np.meshgrid(*([np.arange(4)] * 8), indexing="ij")).reshape(8, -1).T
    A = vals[g]
    order = np.lexsort(tuple(A.T[::-1]) + ((A ** 2).sum(1),))
    return A[order[:256]]


def e8p_nearest(Y, Wt, A):
    """Exact weighted nearest codeword of {s * a + t : a in A, s in {+-1}^8 with an even sum of s * a,
    t = +-1/4 (all coordinates)} for each row of Y [n, 8] with weights Wt [n, 8]."""
    parity = (np.round(A.sum(1)) % 2).astype(np.int64)  # negatives must have this parity
    best_err = np.full(len(Y), np.inf)
    best = np.zeros_like(Y)
    for t in (0.25, -0.25):
        Z = Y - t
        neg = Z < 0
        aZ = np.abs(Z)
        # sum w (|z| - a)^2 = sum w z^2 - 2 (w |z|) . a + w . a^2
        err = (Wt * aZ ** 2).sum(1, keepdims=True) - 2 * (Wt * aZ) @ A.T + Wt @ (A ** 2).T
        wrong = (neg.sum(1, keepdims=True) + parity[None, :]) % 2 == 1
        flip = (4 * (Wt * aZ)[:, None, :] * A[None, :, :])          # [n, 256, 8]
        err = err + np.where(wrong, flip.min(2), 0.0)
        j = err.argmin(1)
        e = err[np.arange(len(Y)), j]
        a = A[j]
        s = np.where(neg, -1.0, 1.0)
        w = wrong[np.arange(len(Y)), j]
        k = flip[np.arange(len(Y)), j].argmin(1)
        s[np.arange(len(Y))[w], k[w]] *= -1
        c = s * a + t
        better = e < best_err
        best_err = np.where(better, e, best_err)
        best[better] = c[better]
    return best


def e8p_scales(amax, scales, A):
    """The 13 e5m3 scales tried for blocks of absolute maximum amax: amax / max|c| x 0.25..1.45,
    each snapped down to a representable value."""
    for f in np.linspace(0.25, 1.45, 13):
        idx = np.clip(np.searchsorted(scales, amax / (A.max() + 0.25) * f), 1, len(scales) - 1)
        yield np.where(scales[idx - 1] > 0, scales[idx - 1], 1e-30)


def e8p_search(W, imp, scales, size=32, chunk=2048):
    """Blocks of 32 share an e5m3 scale; each 8-vector is the weighted-nearest E8P codeword."""
    A = e8p_table()
    V = blocks(W, size)
    nb = V.shape[0] * V.shape[1]
    Vf = V.reshape(nb, size)
    If = np.broadcast_to(blocks(imp[None, :].repeat(W.shape[0], 0), size), V.shape).reshape(nb, size)
    amax = np.abs(Vf).max(1, keepdims=True)
    best_err = np.full((nb, 1), np.inf)
    best_q = np.zeros_like(Vf)
    for sc in e8p_scales(amax, scales, A):
        Y, Wt = (Vf / sc).reshape(-1, 8), If.reshape(-1, 8)
        Q = np.concatenate([e8p_nearest(Y[b:b + chunk], Wt[b:b + chunk], A) for b in range(0, len(Y), chunk)])
        q = Q.reshape(nb, size) * sc
        err = (If * (Vf - q) ** 2).sum(1, keepdims=True)
        better = err < best_err
        best_err, best_q = np.where(better, err, best_err), np.where(better, q, best_q)
    return best_q.reshape(W.shape)


def e8p_ldlq(W, H, scales):
    """W2K's format rounded by BlockLDLQ (blocks of 8, a scale per 32)."""
    A = e8p_table()
    return ldlq.ldlq(W, ldlq.damp(H), 8, 32, lambda X: e8p_scales(np.abs(X).max(1, keepdims=True), scales, A),
                     lambda X, s, d: e8p_nearest(X / s, np.broadcast_to(d, X.shape), A) * s)


def w2_gptq(W, H):
    """W2's format rounded by scalar LDLQ (GPTQ); the exponent per 32 among w2-opt's four."""
    def exponents(X):
        e0 = w2_exponent(np.abs(X).max(1, keepdims=True))
        return [2.0 ** (e0 + d) for d in (-2, -1, 0, 1)]
    return ldlq.ldlq(W, ldlq.damp(H), 1, 32, exponents, lambda X, s, d: w2_round(X / s) * s)


# ---------------------------------------------------------------- rotation

def rht_matrix(seed=31):
    H = np.array([[1.0]])
    while H.shape[0] < 32:
        H = np.block([[H, H], [H, -H]])
    signs = np.where(np.random.default_rng(seed).random(32) < 0.5, -1.0, 1.0)
    return (H * signs[None, :]) / np.sqrt(32)  # orthogonal: x -> x @ R per 32 columns


def rotate(W, R):
    return (W.reshape(W.shape[0], -1, 32) @ R).reshape(W.shape)


def unrotate(W, R):
    return (W.reshape(W.shape[0], -1, 32) @ R.T).reshape(W.shape)


def rotated_importance(imp, R):
    """The diagonal of R^T diag(imp) R per block: the importance of rotated columns."""
    I = imp.reshape(-1, 32)
    return ((R ** 2).T[None, :, :] @ I[:, :, None]).reshape(-1)


# ---------------------------------------------------------------- the candidates

def candidates():
    e5m3, e5m1 = e5m3_values(), e5m1_values()
    sel = [np.array([-r, -1, 1, r]) for r in (2.0, 2.5, 3.25, 4.5)]
    F = {
        "w2": (2.25, lambda W, I: w2_reference(W)[0]),
        "w2-opt": (2.25, w2_opt),
        "sym-r4-f32": (None, lambda W, I: scalar_search(W, I, [np.array([-4, -1, 1, 4.0])], None)),
        "sym-r3-f32": (None, lambda W, I: scalar_search(W, I, [np.array([-3, -1, 1, 3.0])], None)),
        "sym-r3-e5m3": (2.25, lambda W, I: scalar_search(W, I, [np.array([-3, -1, 1, 3.0])], e5m3)),
        "sym-r2.5-e5m3": (2.25, lambda W, I: scalar_search(W, I, [np.array([-2.5, -1, 1, 2.5])], e5m3)),
        "sym-r3.5-e5m3": (2.25, lambda W, I: scalar_search(W, I, [np.array([-3.5, -1, 1, 3.5])], e5m3)),
        "sym-r4-e5m3": (2.25, lambda W, I: scalar_search(W, I, [np.array([-4, -1, 1, 4.0])], e5m3)),
        "sel4-e5m1": (2.25, lambda W, I: scalar_search(W, I, sel, e5m1)),
        "b16-row": ("2.25+16/K", lambda W, I: row_factor_search(W, I, 16, [-3, -1, 1, 3], 4)),
        "ks-row": ("2.156+16/K", lambda W, I: row_factor_search(W, I, 32, [-4, -1, 1, 4], 4, [[-4, -1.5, 0.5, 3]])),
        "d4-8": (2.25, lambda W, I: vector_search(W, I, d4_ball(256), e5m3)),
        "e8-16": (2.25, lambda W, I: vector_search(W, I, e8_ball(1 << 16), e5m3)),
        "e8p": (2.25, lambda W, I: e8p_search(W, I, e5m3)),
    }
    return F


# Candidates that need the second moments H: fmt -> (bits, fn(W, H)).
LDLQ_CANDIDATES = {
    "e8p-ldlq": (2.25, lambda W, H: e8p_ldlq(W, H, e5m3_values())),
    "w2-gptq": (2.25, w2_gptq),
}


def bits_of(fmt):
    return LDLQ_CANDIDATES[fmt][0] if fmt in LDLQ_CANDIDATES else candidates()[fmt.removesuffix("-rht")][0]


def quantize(fmt, W, imp, R, H):
    if fmt in LDLQ_CANDIDATES:
        if H is None:
            sys.exit(f"{fmt} needs --second-moments")
        return LDLQ_CANDIDATES[fmt][1](W, H)
    F = candidates()
    rot = fmt.endswith("-rht")
    base = fmt[:-4] if rot else fmt
    fn = F[base][1]
    if rot:
        return unrotate(fn(rotate(W, R), rotated_importance(imp, R)), R)
    return fn(W, imp)


def errors(W, Q, imp, H):
    """Relative RMSE, importance-weighted relative RMSE and (with H, else None) the proxy error."""
    d2 = (W - Q) ** 2
    rel = np.sqrt(d2.sum() / (W ** 2).sum())
    wrel = np.sqrt((d2 * imp[None, :]).sum() / ((W ** 2) * imp[None, :]).sum())
    return float(rel), float(wrel), None if H is None else ldlq.proxy_error(W, Q, H)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--imatrix", help="importance matrix (moet imatrix); without it every column weighs 1")
    p.add_argument("--formats", default="w2,w2-opt,sym-r3-f32,sym-r4-f32,sym-r3-e5m3,sym-r4-e5m3,sel4-e5m1,"
                                        "b16-row,ks-row,d4-8,e8-16")
    p.add_argument("--second-moments", help="input second moments (moet imatrix --second-moments): for the LDLQ "
                                            "candidates and the proxy error")
    p.add_argument("--shared-moments", action="store_true",
                   help="quantize with each layer's mean second moments (over the routed tokens; errors use the "
                        "expert's own)")
    p.add_argument("--expert-diagonal", action="store_true",
                   help="with --shared-moments: each expert's diagonal (--imatrix) around the layer's correlations")
    p.add_argument("--no-weights", action="store_true", help="quantize unweighted (the imatrix only measures)")
    p.add_argument("--max-tensors", type=int, default=0, help="RMSE on the first N tensors only (0 = all)")
    p.add_argument("--kld", action="store_true", help="score the formats' model copies with moet score")
    p.add_argument("--text", help="held-out text for --kld")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--moet", default="build/moet")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    experts = load_experts(args.model)
    if args.max_tensors:
        experts = experts[:args.max_tensors]
    imatrix = load_imatrix(args.imatrix) if args.imatrix else None
    moments = load_imatrix(args.second_moments) if args.second_moments else None
    quantize_moments = moments
    if args.shared_moments:
        quantize_moments = layer_shared(moments, args.second_moments, imatrix if args.expert_diagonal else None)
    R = rht_matrix()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"model": args.model, "imatrix": args.imatrix, "second_moments": args.second_moments,
              "shared_moments": args.shared_moments, "expert_diagonal": args.expert_diagonal,
              "weighted": not args.no_weights, "formats": {}}
    dequantized = {}
    for fmt in args.formats.split(","):
        start = time.time()
        rows, deq = [], {}
        for name, layer, expert, kind, W in experts:
            imp = importance_of(imatrix, layer, expert, kind, W.shape[1])
            H = None if moments is None else importance_of(moments, layer, expert, kind, W.shape[1])
            Hq = None if moments is None else importance_of(quantize_moments, layer, expert, kind, W.shape[1])
            Q = quantize(fmt, W, np.ones(W.shape[1]) if args.no_weights else imp, R, Hq)
            rows.append(errors(W, Q, imp, H))
            deq[name] = Q
        rel, wrel, proxy = zip(*rows)
        report["formats"][fmt] = {"bits": bits_of(fmt), "rel_rmse_mean": float(np.mean(rel)),
                                  "w_rel_rmse_mean": float(np.mean(wrel)), "seconds": round(time.time() - start, 1)}
        if moments is not None:
            report["formats"][fmt]["proxy_error_mean"] = float(np.mean(proxy))
        print(fmt, json.dumps(report["formats"][fmt]), flush=True)
        dequantized[fmt] = deq
    if args.kld:
        kld(args, dequantized, report)
    (out / "format_study.json").write_text(json.dumps(report, indent=1) + "\n")


def kld(args, dequantized, report):
    """Scores the unquantized model and every format's copy on the held-out text."""
    def score(model_dir, work):
        logits_file = work / "logits.f32"
        s = json.loads(eval_quality.moet(args.moet, "score", "--model", model_dir, "--experts", "native",
                                         "--text-file", args.text, "--max-tokens", args.max_tokens,
                                         "--logits-out", logits_file))
        return s, np.fromfile(logits_file, dtype=np.float32).reshape(-1, s["vocab"]).astype(np.float64)

    with tempfile.TemporaryDirectory() as tmp:
        ref_score, ref = score(args.model, pathlib.Path(tmp))
    report["bf16_perplexity"] = ref_score["perplexity"]
    for fmt, deq in dequantized.items():
        with tempfile.TemporaryDirectory() as tmp:
            work = pathlib.Path(tmp)
            model = copy_with_experts(args.model, deq, work)
            s, logits = score(model, work)
        kl_mean, kl_p99, top1 = eval_quality.kl_stats(ref, logits)
        report["formats"][fmt].update({"perplexity": s["perplexity"], "kl_mean": kl_mean, "kl_p99": kl_p99,
                                       "top1_agreement": top1})
        print(fmt, json.dumps(report["formats"][fmt]), flush=True)


def copy_with_experts(model, deq, work):
    """A copy of the model whose listed expert weights are the dequantized values (F32)."""
    experts = work / "experts.safetensors"
    entries = [(name, "F32", list(Q.shape), Q.astype(np.float32).tobytes()) for name, Q in deq.items()]
    eval_quality.write_safetensors(experts, entries, None)

    class Args:
        pass

    a = Args()
    a.model = model
    return eval_quality.swap_experts(a, experts, work)


if __name__ == "__main__":
    main()

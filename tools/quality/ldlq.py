"""Rounding that sees the inputs' correlations: (block) LDLQ, as in QuIP# (BlockLDLQ) and GPTQ.

For a weight W [N, K] (rows of K input columns) and the input second moments H = E[x x^T] [K, K],
the output error's mean square is tr((W - Q) H (W - Q)^T). Write H = U D U^T with U unit upper
block-triangular and D block-diagonal (blocks of g columns). Then for each row, with e = w - q,
e H e^T = sum_j f_j D_j f_j^T where f_j = e_j + sum_{i<j} e_i U_ij: rounding the blocks in order,
block j's target is x_j = w_j + sum_{i<j} e_i U_ij (the feedback of the earlier blocks' errors)
and its rounding error x_j - q_j is exactly f_j. With g = 1 this is GPTQ / LDLQ.

Quantizers here keep a scale per `group` columns (a multiple of g): for every row and group the
scale is chosen among the format's candidates by the group's exact share of the loss,
sum_j f_j D_j f_j^T, with the earlier groups fixed. The format supplies the candidates (from the
group's feedback-adjusted target) and the rounding of one block at a given scale.
"""
import numpy as np


def damp(H, fraction=0.01):
    """H + fraction * mean(diag H) * I (the inverse and the decomposition stay well conditioned)."""
    return H + fraction * np.mean(np.diag(H)) * np.eye(len(H))


def block_udu(H, g):
    """U (unit upper block-triangular) and D ([K/g, g, g]) with H = U blockdiag(D) U^T."""
    K = len(H)
    C = np.linalg.cholesky(H[::-1, ::-1])  # reversed: H = P C C^T P, P the reversal
    L, D = np.zeros_like(C), np.zeros((K // g, g, g))
    for b in range(0, K, g):
        Cb = C[b:b + g, b:b + g]
        L[:, b:b + g] = np.linalg.solve(Cb.T, C[:, b:b + g].T).T  # C[:, block] Cb^-1
        D[(K - b) // g - 1] = (Cb @ Cb.T)[::-1, ::-1]
    return L[::-1, ::-1], D


def ldlq(W, H, g, group, scale_candidates, round_block):
    """Q for W by block LDLQ. scale_candidates(X) -> list of [N, 1] scales for a group's targets X
    [N, group]; round_block(X, s, d) -> the format's values for targets X [N, g] at scales s, d the
    diagonal of the block's D (column weights)."""
    N, K = W.shape
    U, D = block_udu(H, g)
    E, Q = np.zeros_like(W), np.zeros_like(W)
    for c in range(0, K, group):
        base = W[:, c:c + group] + E[:, :c] @ U[:c, c:c + group]
        best_loss = np.full((N, 1), np.inf)
        for s in scale_candidates(base):
            e, q, loss = np.zeros((N, group)), np.zeros((N, group)), np.zeros((N, 1))
            for b in range(0, group, g):
                x = base[:, b:b + g] + e[:, :b] @ U[c:c + b, c + b:c + b + g]
                Dj = D[(c + b) // g]
                q[:, b:b + g] = round_block(x, s, np.diag(Dj))
                f = x - q[:, b:b + g]
                loss += np.einsum("ni,ij,nj->n", f, Dj, f)[:, None]
                e[:, b:b + g] = W[:, c + b:c + b + g] - q[:, b:b + g]
            better = loss < best_loss
            best_loss = np.where(better, loss, best_loss)
            Q[:, c:c + group] = np.where(better, q, Q[:, c:c + group])
            E[:, c:c + group] = np.where(better, e, E[:, c:c + group])
    return Q


def proxy_error(W, Q, H):
    """tr((W - Q) H (W - Q)^T) / tr(W H W^T): the relative mean square of the layer's output error."""
    E = W - Q
    return float(np.einsum("nk,kl,nl->", E, H, E) / np.einsum("nk,kl,nl->", W, H, W))

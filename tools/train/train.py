#!/usr/bin/env python3
"""Trains moet's self-made DeepSeek-V3-architecture MoE (issue 5, part 3) and exports it in hub format.

The model is transformers' own `DeepseekV3ForCausalLM` built from a `DeepseekV3Config`: MLA
attention (q/kv LoRA ranks, decoupled RoPE, interleaved like the hub checkpoints), a dense first
layer (first_k_dense_replace=1), MoE layers with one shared expert and sigmoid routing with
`e_score_correction_bias` and grouped top-k (n_group / topk_group), routed_scaling_factor.

Training (DeepSeek-V3 recipe, scaled down):
  * next-token loss + ONE multi-token-prediction (MTP) module trained on the next-next token
    (weight --mtp-weight, 0.3). The MTP module is
        x   = eh_proj(concat(enorm(embed(t_{i+1})), hnorm(h_i)))      eh_proj: [d, 2d]
        x   = DecoderLayer_L(x)             (same layer type as a MoE layer, index L = num_hidden_layers)
        p   = shared_head.head(shared_head.norm(x))                     predicts t_{i+2}
    where h_i is the main model's final hidden state AFTER the final norm (`model.norm`), what
    vLLM and SGLang feed their DeepSeek MTP modules. embed / head are shared with the main model
    during training and exported as copies, as DeepSeek-V3 checkpoints carry them.
  * aux-loss-free load balancing: forward hooks on every router count the tokens sent to each
    expert; after each optimizer step bias_e += gamma * sign(mean_load - load_e) (no gradient).
  * AdamW (fp32 master weights), bf16 autocast on CUDA, routers computed in fp32, routed experts
    through torch's grouped GEMM (bf16), warmup + cosine LR, gradient clipping.
  * seeded; the batch of step s depends only on (--seed, s), so a resumed run sees the same data.
    A checkpoint (--ckpt) holds model, MTP, optimizer, router biases, step, log; rerunning the
    same command resumes from it.

Export (--out): hub-format folder: config.json (model_type deepseek_v3, real-checkpoint style
rope_theta / rope_scaling, num_nextn_predict_layers=1), BF16 safetensors with the hub's tensor
names (per-expert `mlp.experts.E.{gate,up,down}_proj.weight`, `e_score_correction_bias` in F32,
the MTP layer as `model.layers.{L}.*`), sharded to --max-shard-mb with an index when larger,
generation_config.json, tokenizer files, loss curve PNG, metrics.json (log, evals, samples).
--verify reloads the folder with AutoModelForCausalLM and prints the max |logit difference| to
the training code (and checks the exported MTP tensors the same way).

  python3 tools/train/train.py --size tiny --out /tmp/tiny              # train + export + verify
  python3 tools/train/train.py --size tiny --steps 20 --device cpu ...   # CPU smoke test
"""
import argparse
import glob
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# ----------------------------------------------------------------------------- presets

PRESETS = {
    # <= 25 MB of BF16 weights including the MTP layer and its embed/head copies.
    "tiny": dict(
        model=dict(vocab_size=8192, hidden_size=192, intermediate_size=512, moe_intermediate_size=128,
                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                   n_shared_experts=1, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                   routed_scaling_factor=2.5, q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32,
                   qk_rope_head_dim=32, v_head_dim=32, first_k_dense_replace=1, max_position_embeddings=4096,
                   rope_theta=10000.0),
        train=dict(seq_len=1024, batch=64, lr=3e-3, min_lr_frac=0.1, warmup=150, steps=3000,
                   eval_every=250, ckpt_every=500),
        tokenizer="models/tiny",
    ),
    # A larger model for studies (quantization error vs. quality); not trained yet.
    "study": dict(
        model=dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, moe_intermediate_size=256,
                   num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                   n_shared_experts=1, n_routed_experts=64, num_experts_per_tok=6, n_group=8, topk_group=4,
                   routed_scaling_factor=2.5, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64,
                   qk_rope_head_dim=32, v_head_dim=64, first_k_dense_replace=1, max_position_embeddings=4096,
                   rope_theta=10000.0),
        train=dict(seq_len=1024, batch=64, lr=8e-4, min_lr_frac=0.1, warmup=150, steps=20000,
                   eval_every=1000, ckpt_every=1000),
        tokenizer="models/tiny",
    ),
}

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------- data

def load_split_tokens(corpus_dir, split, tokenizer_path, cache_dir, bos_id):
    """Token ids of one split: every document preceded by BOS (<|endoftext|>). Cached as .npy."""
    import hashlib
    import lzma
    h = hashlib.sha256(open(tokenizer_path, "rb").read())
    src = os.path.join(corpus_dir, f"{split}.jsonl.xz")
    h.update(str(os.path.getsize(src)).encode())
    cache = os.path.join(cache_dir, f"{split}-{h.hexdigest()[:12]}.npy")
    if os.path.exists(cache):
        return np.load(cache)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_path)
    texts = [json.loads(l)["text"] for l in lzma.open(src, "rt", encoding="utf-8")]
    chunks = []
    for i in range(0, len(texts), 2048):
        for enc in tok.encode_batch(texts[i:i + 2048], add_special_tokens=False):
            chunks.append(np.array([bos_id] + enc.ids, dtype=np.uint16))
    arr = np.concatenate(chunks)
    os.makedirs(cache_dir, exist_ok=True)
    np.save(cache, arr)
    return arr


def batch_for_step(tokens, step, batch, width, seed):
    """Random windows of `width` tokens; depends only on (seed, step)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, tokens.numel() - width, (batch,), generator=g).to(tokens.device)
    idx = starts[:, None] + torch.arange(width, device=tokens.device)[None, :]
    return tokens[idx].long()


# ----------------------------------------------------------------------------- model pieces

def grouped_mm(a, b, offs):
    fn = getattr(F, "grouped_mm", None)
    if fn is not None:
        return fn(a, b, offs=offs)
    return torch._grouped_mm(a, b, offs=offs)


def grouped_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Same math as transformers' DeepseekV3Experts (gate = first half of gate_up_proj), with
    the routed experts run as two bf16 grouped GEMMs. Used for training on CUDA only."""
    T, d = hidden_states.shape
    K = top_k_index.shape[1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tok = order // K
    offs = torch.cumsum(torch.bincount(flat, minlength=self.num_experts), 0).to(torch.int32)
    x = hidden_states[tok].to(torch.bfloat16)
    h = grouped_mm(x, self.gate_up_proj.to(torch.bfloat16).transpose(1, 2), offs)
    g, u = h.chunk(2, dim=-1)
    h = self.act_fn(g) * u
    y = grouped_mm(h, self.down_proj.to(torch.bfloat16).transpose(1, 2), offs)
    y = y.float() * top_k_weights.reshape(-1)[order].unsqueeze(-1).float()
    out = torch.empty_like(y)
    out[order] = y
    return out.view(T, K, d).sum(1).to(hidden_states.dtype)


def fp32_router(gate):
    """Runs a router outside autocast (its logits/sigmoid in fp32, as at inference)."""
    orig = gate.forward

    def fwd(hidden_states):
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            return orig(hidden_states.float())
    gate.forward = fwd


class SharedHead(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm


class MTPModule(nn.Module):
    """DeepSeek-V3 multi-token prediction module (depth 1); embed/head are passed in (shared)."""

    def __init__(self, config, layer_idx):
        super().__init__()
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            DeepseekV3DecoderLayer, DeepseekV3RMSNorm, DeepseekV3RotaryEmbedding)
        d = config.hidden_size
        self.enorm = DeepseekV3RMSNorm(d, eps=config.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(d, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.layer = DeepseekV3DecoderLayer(config, layer_idx)
        self.shared_head = SharedHead(DeepseekV3RMSNorm(d, eps=config.rms_norm_eps))
        self.rotary_emb = DeepseekV3RotaryEmbedding(config=config)

    def forward(self, h, next_ids, embed, head):
        """h: [B, T, d] main final hidden states (after model.norm) at positions 0..T-1;
        next_ids: [B, T] tokens at positions 1..T. Returns logits for tokens at 2..T+1."""
        B, T = next_ids.shape
        x = self.eh_proj(torch.cat([self.enorm(embed(next_ids)), self.hnorm(h)], dim=-1))
        pos = torch.arange(T, device=x.device)[None, :].expand(B, T)
        pe = self.rotary_emb(x, pos)
        x = self.layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
        if isinstance(x, tuple):
            x = x[0]
        return head(self.shared_head.norm(x))


def build_config(mcfg, attn="sdpa"):
    from transformers import DeepseekV3Config
    cfg = DeepseekV3Config(
        **{k: v for k, v in mcfg.items() if k != "rope_theta"},
        rope_theta=mcfg["rope_theta"], rope_scaling=None, hidden_act="silu", norm_topk_prob=True,
        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, rope_interleave=True,
        initializer_range=0.02, bos_token_id=0, eos_token_id=0, pad_token_id=0, num_nextn_predict_layers=1)
    cfg._attn_implementation = attn
    return cfg


def build_model(cfg, device, seed):
    from transformers import DeepseekV3ForCausalLM
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(cfg)
    mtp = MTPModule(cfg, cfg.num_hidden_layers)
    for m in mtp.modules():
        model._init_weights(m)
    model.to(device)
    mtp.to(device)
    return model, mtp


def routers(model, mtp):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    out = []
    for name, m in list(model.named_modules()) + [("mtp." + n, m) for n, m in mtp.named_modules()]:
        if isinstance(m, DeepseekV3TopkRouter):
            out.append((name, m))
    return out


# ----------------------------------------------------------------------------- export

def hub_state_dict(model, mtp, cfg):
    """BF16 tensors with the hub's names (per-expert), the MTP layer at index L."""
    L = cfg.num_hidden_layers
    I = cfg.moe_intermediate_size
    out = {}

    def put(name, t):
        t = t.detach().cpu()
        out[name] = t.float().contiguous() if name.endswith("e_score_correction_bias") else \
            t.to(torch.bfloat16).contiguous()

    def put_layer(prefix, sd):
        for k, v in sd.items():
            if k.endswith("mlp.experts.gate_up_proj"):
                base = prefix + k[: -len("gate_up_proj")]
                for e in range(v.shape[0]):
                    put(f"{base}{e}.gate_proj.weight", v[e, :I])
                    put(f"{base}{e}.up_proj.weight", v[e, I:])
            elif k.endswith("mlp.experts.down_proj"):
                base = prefix + k[: -len("down_proj")]
                for e in range(v.shape[0]):
                    put(f"{base}{e}.down_proj.weight", v[e])
            else:
                put(prefix + k, v)

    put_layer("", {k: v for k, v in model.state_dict().items()})
    sd = mtp.state_dict()
    p = f"model.layers.{L}."
    put(p + "enorm.weight", sd["enorm.weight"])
    put(p + "hnorm.weight", sd["hnorm.weight"])
    put(p + "eh_proj.weight", sd["eh_proj.weight"])
    put_layer(p, {k[len("layer."):]: v for k, v in sd.items() if k.startswith("layer.")})
    put(p + "shared_head.norm.weight", sd["shared_head.norm.weight"])
    put(p + "shared_head.head.weight", model.lm_head.weight)
    put(p + "embed_tokens.weight", model.model.embed_tokens.weight)
    return dict(sorted(out.items()))


def hub_config(cfg):
    """config.json in the style of the DeepSeek-V3 hub checkpoints."""
    c = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "n_shared_experts": cfg.n_shared_experts,
        "n_routed_experts": cfg.n_routed_experts,
        "ep_size": 1,
        "routed_scaling_factor": cfg.routed_scaling_factor,
        "kv_lora_rank": cfg.kv_lora_rank,
        "q_lora_rank": cfg.q_lora_rank,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "topk_method": "noaux_tc",
        "n_group": cfg.n_group,
        "topk_group": cfg.topk_group,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "moe_layer_freq": 1,
        "first_k_dense_replace": cfg.first_k_dense_replace,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "rms_norm_eps": cfg.rms_norm_eps,
        "use_cache": True,
        "tie_word_embeddings": False,
        "rope_theta": cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) else cfg.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "transformers_version": __import__("transformers").__version__,
    }
    return c


def save_export(out_dir, model, mtp, cfg, tokenizer_dir, max_shard_mb):
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    for f in glob.glob(os.path.join(out_dir, "model*.safetensors*")):
        os.remove(f)
    sd = hub_state_dict(model, mtp, cfg)
    total = sum(t.numel() * t.element_size() for t in sd.values())
    limit = int(max_shard_mb * (1 << 20))
    shards, cur, size = [], {}, 0
    for k, t in sd.items():
        n = t.numel() * t.element_size()
        if cur and size + n > limit:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = t
        size += n
    shards.append(cur)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    else:
        wm = {}
        for i, sh in enumerate(shards):
            fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(sh, os.path.join(out_dir, fn), metadata={"format": "pt"})
            wm.update({k: fn for k in sh})
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hub_config(cfg), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": [0, 2], "pad_token_id": 0, "do_sample": False,
                   "transformers_version": __import__("transformers").__version__}, f, indent=2)
        f.write("\n")
    if tokenizer_dir and os.path.abspath(tokenizer_dir) != os.path.abspath(out_dir):
        for fn in TOKENIZER_FILES:
            shutil.copy(os.path.join(tokenizer_dir, fn), os.path.join(out_dir, fn))
    return sd, total


def load_hub_tensors(folder):
    from safetensors.torch import load_file
    sd = {}
    for f in sorted(glob.glob(os.path.join(folder, "model*.safetensors"))):
        sd.update(load_file(f))
    return sd


# ----------------------------------------------------------------------------- training helpers

def lr_at(step, total, warmup, lr, min_frac, time_frac=0.0):
    """Warmup, then cosine decay to min_frac; with a time limit the decay follows whichever of the
    step count and the elapsed fraction of the limit (time_frac) is further along, so a run cut by
    --time-limit still ends annealed."""
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min(1.0, max((step - warmup) / max(1, total - warmup), time_frac))
    return lr * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def forward_losses(model, mtp, x, autocast_dtype):
    """x: [B, T+2] tokens. Returns (main_loss, mtp_loss)."""
    T = x.shape[1] - 2
    inp, tgt, nxt, tgt2 = x[:, :T], x[:, 1:T + 1], x[:, 1:T + 1], x[:, 2:T + 2]
    dev = x.device.type
    with torch.autocast(device_type=dev, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        h = model.model(input_ids=inp).last_hidden_state
        logits = model.lm_head(h)
        main = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.reshape(-1))
        mlog = mtp(h, nxt, model.model.embed_tokens, model.lm_head)
        mloss = F.cross_entropy(mlog.float().view(-1, mlog.shape[-1]), tgt2.reshape(-1))
    return main, mloss


@torch.no_grad()
def evaluate(model, mtp, tokens, seq_len, batch, autocast_dtype, max_windows=0):
    """Mean next-token / MTP loss over non-overlapping windows of a split."""
    model.eval()
    mtp.eval()
    width = seq_len + 2
    n = (tokens.numel() - 2) // seq_len
    if max_windows:
        n = min(n, max_windows)
    starts = torch.arange(n, device=tokens.device) * seq_len
    tot = tot2 = 0.0
    cnt = 0
    for i in range(0, n, batch):
        s = starts[i:i + batch]
        idx = s[:, None] + torch.arange(width, device=tokens.device)[None, :]
        x = tokens[idx].long()
        a, b = forward_losses(model, mtp, x, autocast_dtype)
        tot += a.item() * len(s)
        tot2 += b.item() * len(s)
        cnt += len(s)
    model.train()
    mtp.train()
    return tot / cnt, tot2 / cnt, cnt * seq_len


def plot_losses(logd, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tr = logd["train"]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in tr]
    ax[0].plot(steps, [r["loss"] for r in tr], label="train next-token", lw=0.8)
    ax[0].plot(steps, [r["mtp_loss"] for r in tr], label="train MTP (next-next)", lw=0.8, alpha=0.7)
    ev = logd["eval"]
    if ev:
        ax[0].plot([r["step"] for r in ev], [r["val_loss"] for r in ev], "o-", label="validation next-token")
        ax[0].plot([r["step"] for r in ev], [r["val_mtp_loss"] for r in ev], "s--", label="validation MTP")
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("cross-entropy (nats/token)")
    ax[0].set_ylim(bottom=max(0.0, min([r["loss"] for r in tr] + [9]) - 0.5), top=min(9.5, max(r["loss"] for r in tr) + 0.2))
    ax[0].legend()
    ax[0].grid(alpha=0.3)
    ax[0].set_title(logd.get("title", "training"))
    ax[1].plot(steps, [r["max_load"] for r in tr], lw=0.8)
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("max expert load / mean load (worst MoE layer)")
    ax[1].grid(alpha=0.3)
    ax[1].set_title("routing balance (aux-loss-free bias)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ----------------------------------------------------------------------------- verify

def set_eager_experts(*mods):
    """transformers' reference experts loop (fp32-safe on any device)."""
    for mod in mods:
        for m in mod.modules():
            c = getattr(m, "config", None)
            if c is not None and hasattr(c, "n_routed_experts"):
                c._experts_implementation = "eager"


@torch.no_grad()
def verify_export(out_dir, model, mtp, cfg, x, device):
    """Reload the export with transformers and compare logits with the training code."""
    from transformers import AutoModelForCausalLM
    import copy
    ref = copy.deepcopy(model).float().eval()
    rmtp = copy.deepcopy(mtp).float().eval()
    for m in (ref, rmtp):  # the values that went into the file (BF16; router bias stays F32)
        for p in m.parameters():  # buffers (router bias F32, rotary inv_freq) are not exported in BF16
            p.copy_(p.to(torch.bfloat16).float())
    # reference experts path = transformers' own (eager) path
    for m in list(ref.modules()) + list(rmtp.modules()):
        if "forward" in m.__dict__ and type(m).__name__ in ("DeepseekV3Experts", "DeepseekV3TopkRouter"):
            del m.forward
    res = {}
    loaded, info = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, output_loading_info=True)
    loaded.to(device).eval()
    set_eager_experts(ref, rmtp, loaded)
    res["missing_keys"] = sorted(info.get("missing_keys", []))
    res["unexpected_keys_count"] = len(info.get("unexpected_keys", []))
    res["unexpected_non_mtp"] = sorted(k for k in info.get("unexpected_keys", [])
                                       if not k.startswith(f"model.layers.{cfg.num_hidden_layers}."))
    inp = x[:, :-2]
    a = ref(input_ids=inp).logits
    b = loaded(input_ids=inp).logits
    res["max_abs_diff_logits_vs_bf16_rounded_training_model"] = (a - b).abs().max().item()
    c = model.eval()(input_ids=inp).logits.float()
    model.train()
    res["max_abs_diff_logits_vs_fp32_master_training_model"] = (c - b).abs().max().item()
    res["logits_abs_max"] = b.abs().max().item()
    # MTP: fresh module filled from the exported tensors vs the training module
    L = cfg.num_hidden_layers
    sd = load_hub_tensors(out_dir)
    p = f"model.layers.{L}."
    import copy as _copy
    m2 = MTPModule(_copy.deepcopy(cfg), L).to(device).float().eval()
    set_eager_experts(m2)
    st = {"enorm.weight": sd[p + "enorm.weight"], "hnorm.weight": sd[p + "hnorm.weight"],
          "eh_proj.weight": sd[p + "eh_proj.weight"], "shared_head.norm.weight": sd[p + "shared_head.norm.weight"]}
    E, I = cfg.n_routed_experts, cfg.moe_intermediate_size
    for k, v in sd.items():
        if not k.startswith(p) or ".experts." in k or k[len(p):] in ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                                                                     "shared_head.norm.weight", "shared_head.head.weight",
                                                                     "embed_tokens.weight"):
            continue
        st["layer." + k[len(p):]] = v
    pre = p + "mlp.experts."
    st["layer.mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([sd[f"{pre}{e}.gate_proj.weight"], sd[f"{pre}{e}.up_proj.weight"]], 0) for e in range(E)])
    st["layer.mlp.experts.down_proj"] = torch.stack([sd[f"{pre}{e}.down_proj.weight"] for e in range(E)])
    missing, unexpected = m2.load_state_dict({k: v.float() for k, v in st.items()}, strict=False)
    res["mtp_missing"] = [k for k in missing if "rotary" not in k]
    res["mtp_unexpected"] = list(unexpected)
    emb = nn.Embedding.from_pretrained(sd[p + "embed_tokens.weight"].float().to(device))
    head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False).to(device)
    head.weight.copy_(sd[p + "shared_head.head.weight"].float())
    hl = loaded.model(input_ids=inp).last_hidden_state
    ml = m2(hl, x[:, 1:-1], emb, head)
    hr = ref.model(input_ids=inp).last_hidden_state
    mr = rmtp(hr, x[:, 1:-1], ref.model.embed_tokens, ref.lm_head)
    res["max_abs_diff_mtp_logits"] = (ml - mr).abs().max().item()
    res["embed_copy_equal"] = bool(torch.equal(sd[p + "embed_tokens.weight"], sd["model.embed_tokens.weight"]))
    res["head_copy_equal"] = bool(torch.equal(sd[p + "shared_head.head.weight"], sd["lm_head.weight"]))
    return res, loaded


@torch.no_grad()
def greedy_samples(loaded, tokenizer_dir, device, prompts, n_new=60):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    out = []
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids.to(device)  # BOS is prepended
        g = loaded.generate(ids, max_new_tokens=n_new, do_sample=False)
        out.append({"prompt": p, "completion": tok.decode(g[0, ids.shape[1]:], skip_special_tokens=False)})
    return out


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--corpus", default=os.path.join(ROOT, "data/corpus"))
    ap.add_argument("--tokenizer", default=None, help="folder with tokenizer.json (default: the preset's)")
    ap.add_argument("--cache", default=os.path.join(ROOT, "data/tokens"))
    ap.add_argument("--out", required=True, help="export folder")
    ap.add_argument("--ckpt", default=None, help="checkpoint file (resumed from when it exists)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--eval-every", type=int, default=None)
    ap.add_argument("--ckpt-every", type=int, default=None)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--time-limit", type=float, default=0, help="stop training after this many seconds (0: none)")
    ap.add_argument("--max-shard-mb", type=float, default=15.0)
    ap.add_argument("--eval-windows", type=int, default=0, help="cap on windows of the periodic validation (0: whole split)")
    ap.add_argument("--final-eval-windows", type=int, default=0, help="cap on windows of the final validation/test evaluation (0: whole split)")
    ap.add_argument("--verify", action="store_true", help="reload the export with transformers and compare")
    ap.add_argument("--samples", action="store_true", help="greedy generations with the reloaded model")
    ap.add_argument("--shrink", action="store_true", help="tiny dims for a CPU smoke test (not a real preset)")
    args = ap.parse_args()

    preset = json.loads(json.dumps(PRESETS[args.size]))
    tcfg = preset["train"]
    for k in ("steps", "batch", "lr", "warmup", "eval_every", "ckpt_every"):
        if getattr(args, k) is not None:
            tcfg[k] = getattr(args, k)
    if args.seq_len is not None:
        tcfg["seq_len"] = args.seq_len
    if args.shrink:
        preset["model"].update(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, q_lora_rank=32,
                               kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16)
    tok_dir = args.tokenizer or os.path.join(ROOT, preset["tokenizer"])
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    amp = torch.bfloat16 if cuda else None
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    t0 = time.time()
    bos = 0
    train_tok = torch.from_numpy(load_split_tokens(args.corpus, "train", os.path.join(tok_dir, "tokenizer.json"),
                                                   args.cache, bos).astype(np.int32)).to(device)
    val_tok = torch.from_numpy(load_split_tokens(args.corpus, "validation", os.path.join(tok_dir, "tokenizer.json"),
                                                 args.cache, bos).astype(np.int32)).to(device)
    test_tok = torch.from_numpy(load_split_tokens(args.corpus, "test", os.path.join(tok_dir, "tokenizer.json"),
                                                  args.cache, bos).astype(np.int32)).to(device)
    log(f"tokens: train {train_tok.numel():,} validation {val_tok.numel():,} test {test_tok.numel():,} "
        f"({time.time() - t0:.1f}s)")

    cfg = build_config(preset["model"])
    model, mtp = build_model(cfg, device, args.seed)
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    log(f"model {args.size}: {n_main:,} params + MTP {n_mtp:,} (+ embed/head copies in the export)")
    rts = routers(model, mtp)
    if cuda:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Experts
        for m in list(model.modules()) + list(mtp.modules()):
            if isinstance(m, DeepseekV3Experts):
                m.forward = grouped_experts_forward.__get__(m)
        for _, g in rts:
            fp32_router(g)

    # aux-loss-free balancing: per-router expert counts collected by forward hooks
    E = cfg.n_routed_experts
    counts = torch.zeros(len(rts), E, device=device, dtype=torch.float32)
    state = {"collect": True}

    def make_hook(i):
        def hook(mod, inp, out):
            if state["collect"] and mod.training:
                counts[i] += torch.bincount(out[2].reshape(-1), minlength=E).float()
        return hook
    for i, (_, g) in enumerate(rts):
        g.register_forward_hook(make_hook(i))

    params = [p for p in list(model.parameters()) + list(mtp.parameters()) if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tcfg["lr"], betas=(0.9, 0.95), eps=1e-8, fused=cuda)

    logd = {"train": [], "eval": [], "size": args.size, "preset": preset, "args": vars(args),
            "title": f"moet {args.size} ({args.size} preset) training"}
    step = 0
    train_time = 0.0
    if args.ckpt and os.path.exists(args.ckpt):
        ck = torch.load(args.ckpt, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        mtp.load_state_dict(ck["mtp"])
        opt.load_state_dict(ck["opt"])
        step, logd, train_time = ck["step"], ck["log"], ck["train_time"]
        torch.set_rng_state(ck["rng"].cpu())
        log(f"resumed from {args.ckpt} at step {step}")

    def save_ckpt():
        if not args.ckpt:
            return
        tmp = args.ckpt + ".tmp"
        torch.save({"model": model.state_dict(), "mtp": mtp.state_dict(), "opt": opt.state_dict(), "step": step,
                    "log": logd, "train_time": train_time, "rng": torch.get_rng_state()}, tmp)
        os.replace(tmp, args.ckpt)

    T, B, total = tcfg["seq_len"], tcfg["batch"], tcfg["steps"]
    tokens_per_step = T * B
    log(f"training: {total} steps x {B} x {T} = {total * tokens_per_step / 1e6:.1f}M tokens, lr {tcfg['lr']}, "
        f"mtp weight {args.mtp_weight}, bias gamma {args.bias_gamma}, device {device}")
    model.train()
    mtp.train()
    t_start = time.time() - train_time
    stopped_early = False
    skipped = 0
    while step < total:
        if args.time_limit and time.time() - t_start > args.time_limit:
            log(f"time limit reached at step {step}")
            stopped_early = True
            break
        time_frac = (time.time() - t_start) / args.time_limit if args.time_limit else 0.0
        lr = lr_at(step, total, tcfg["warmup"], tcfg["lr"], tcfg["min_lr_frac"], time_frac)
        for gi in opt.param_groups:
            gi["lr"] = lr
        x = batch_for_step(train_tok, step, B, T + 2, args.seed)
        main_loss, mtp_loss = forward_losses(model, mtp, x, amp)
        loss = main_loss + args.mtp_weight * mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        if not torch.isfinite(gnorm):  # a non-finite loss or gradient: skip the update, keep the weights
            skipped += 1
            log(f"step {step}: non-finite loss/gradient, update skipped ({skipped} so far)")
            if skipped > 20:
                raise RuntimeError("more than 20 non-finite steps: training diverged")
        else:
            opt.step()
            with torch.no_grad():  # bias_e += gamma * sign(mean_load - load_e)
                for i, (_, g) in enumerate(rts):
                    c = counts[i]
                    g.e_score_correction_bias.add_(args.bias_gamma * torch.sign(c.mean() - c))
        step += 1
        if step % 10 == 0 or step == 1 or step == total:
            ml = (counts.max(1).values / counts.mean(1)).max().item()
            rec = {"step": step, "loss": main_loss.item(), "mtp_loss": mtp_loss.item(), "lr": lr,
                   "gnorm": gnorm.item(), "max_load": ml, "time": time.time() - t_start,
                   "tokens": step * tokens_per_step}
            logd["train"].append(rec)
            if step % 50 == 0 or step == 1 or step == total:
                log(f"step {step:6d} loss {rec['loss']:.4f} mtp {rec['mtp_loss']:.4f} lr {lr:.2e} "
                    f"gnorm {rec['gnorm']:.2f} maxload {ml:.2f} {rec['time']:.0f}s "
                    f"{step * tokens_per_step / max(rec['time'], 1e-9) / 1e3:.0f}k tok/s")
        counts.zero_()
        if step % tcfg["eval_every"] == 0 or step == total:
            vl, vm, _ = evaluate(model, mtp, val_tok, T, B, amp, args.eval_windows)
            logd["eval"].append({"step": step, "val_loss": vl, "val_mtp_loss": vm, "val_ppl": math.exp(vl),
                                 "time": time.time() - t_start})
            log(f"  eval step {step}: val loss {vl:.4f} ppl {math.exp(vl):.2f} mtp {vm:.4f}")
        if step % tcfg["ckpt_every"] == 0:
            train_time = time.time() - t_start
            save_ckpt()
    train_time = time.time() - t_start
    save_ckpt()

    # final evaluation on the whole validation and test splits
    vl, vm, vn = evaluate(model, mtp, val_tok, T, B, amp, args.final_eval_windows)
    tl, tm, tn = evaluate(model, mtp, test_tok, T, B, amp, args.final_eval_windows)
    final = {"steps": step, "tokens_seen": step * tokens_per_step, "train_time_s": train_time,
             "stopped_early": stopped_early,
             "train_loss_last50_mean": float(np.mean([r["loss"] for r in logd["train"][-5:]])),
             "val_loss": vl, "val_ppl": math.exp(vl), "val_mtp_loss": vm, "val_tokens": vn,
             "test_loss": tl, "test_ppl": math.exp(tl), "test_mtp_loss": tm, "test_tokens": tn,
             "bias_abs_max": max(g.e_score_correction_bias.abs().max().item() for _, g in rts)}
    logd["final"] = final
    log("final: " + json.dumps(final))

    sd, total_bytes = save_export(args.out, model, mtp, cfg, tok_dir, args.max_shard_mb)
    log(f"exported {len(sd)} tensors, {total_bytes / 1e6:.2f} MB to {args.out}")
    logd["export_bytes"] = total_bytes
    if args.verify:
        x = batch_for_step(val_tok, 0, 2, min(T, 256) + 2, args.seed)
        res, loaded = verify_export(args.out, model, mtp, cfg, x, device)
        logd["verify"] = res
        log("verify: " + json.dumps(res))
        if args.samples:
            prompts = ["def fibonacci(n):\n", "import os\n\ndef list_files(path):\n",
                       "The history of the English language", "A dictionary is"]
            logd["samples"] = greedy_samples(loaded, args.out, device, prompts)
            for s in logd["samples"]:
                log(f"--- prompt: {s['prompt']!r}\n{s['prompt']}{s['completion']}")
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(logd, f, indent=1)
    plot_losses(logd, os.path.join(args.out, "loss.png"))
    log(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()

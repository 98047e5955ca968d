"""HF `tokenizers` oracles for every tokenizer family in shared/data.

tokenizer.json families load directly (gpt-oss from its .gz). Kimi-K2 ships tiktoken ranks, which
`tokenizers` cannot read, so it is converted the way transformers' TikTokenConverter does: byte-level
vocabulary, merges implied by the ranks, the pat_str split regex (Oniguruma supports its `&&` class
intersections) and the special tokens of tokenizer_config.json, with <|reserved_token_N|> for the
unnamed reserved ids.
"""
import base64
import gzip
import json
import pathlib

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

FAMILIES = ["qwen3", "deepseek-v3", "mixtral", "gpt-oss", "kimi-k2"]

KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _kimi(folder):
    ranks = {}
    for line in (folder / "tiktoken.model").read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    table = _bytes_to_unicode()
    spell = lambda b: "".join(table[x] for x in b)  # noqa: E731
    merges = []
    for token, rank in ranks.items():
        local = [(token[:i], token[i:], rank) for i in range(1, len(token))
                 if token[:i] in ranks and token[i:] in ranks]
        merges.extend(sorted(local, key=lambda m: (ranks[m[0]], ranks[m[1]])))
    merges.sort(key=lambda m: m[2])
    tok = Tokenizer(models.BPE({spell(k): v for k, v in ranks.items()},
                               [(spell(a), spell(b)) for a, b, _ in merges], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(KIMI_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    declared = {int(k): v for k, v in config["added_tokens_decoder"].items()}
    base = len(ranks)
    for i in range(base, base + 256):
        spec = declared.get(i, {"content": f"<|reserved_token_{i}|>", "special": True})
        special = spec.get("special", True)
        token = AddedToken(spec["content"], special=special, normalized=False, lstrip=spec.get("lstrip", False),
                           rstrip=spec.get("rstrip", False), single_word=spec.get("single_word", False))
        (tok.add_special_tokens if special else tok.add_tokens)([token])
        assert tok.token_to_id(spec["content"]) == i
    return tok


def load(shared_data, family):
    folder = pathlib.Path(shared_data) / family
    if family == "kimi-k2":
        return _kimi(folder)
    if (folder / "tokenizer.json").exists():
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    return Tokenizer.from_str(gzip.open(folder / "tokenizer.json.gz", "rt", encoding="utf-8").read())

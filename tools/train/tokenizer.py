#!/usr/bin/env python3
"""Trains the byte-level BPE tokenizer of moet's self-trained models (issue 5, part 2).

Trained with HF `tokenizers` on the train split written by tools/train/corpus.py and saved in
hub format into --out (default models/tiny/):

  tokenizer.json          byte-level BPE (GPT-2 style pre-tokenizer regex, no unknown token);
                          a TemplateProcessing post-processor prepends the BOS token, as
                          DeepSeek-V3's tokenizer does
  tokenizer_config.json   bos/eos/pad/unk tokens, added tokens, a ChatML chat template
                          (add_generation_prompt supported)
  special_tokens_map.json

Special tokens (ids 0..4): <|endoftext|> (bos = eos = pad: the document separator of the
training stream), <|im_start|>, <|im_end|> (the end of a chat turn; generation_config.json
lists it as a second eos id), <think>, </think> (added, not special: they decode as text).
"""
import argparse
import json
import lzma
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>"]
BOS = EOS = PAD = "<|endoftext|>"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def iter_texts(path, limit_bytes):
    n = 0
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            n += len(text)
            yield text
            if limit_bytes and n >= limit_bytes:
                return


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--out", default="models/tiny")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--limit-mb", type=float, default=0, help="train on the first N MB only (0: all)")
    args = ap.parse_args()

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab - len(ADDED),  # the added tokens take the last ids
        min_frequency=2,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(iter_texts(os.path.join(args.corpus, "train.jsonl.xz"),
                                       int(args.limit_mb * (1 << 20))), trainer=trainer)
    tok.add_tokens(ADDED)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos_id)])
    assert tok.get_vocab_size() == args.vocab, tok.get_vocab_size()

    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"))

    added_decoder = {}
    for t in SPECIAL + ADDED:
        added_decoder[str(tok.token_to_id(t))] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": t in SPECIAL}
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": added_decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(args.out, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
                   "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}, f, indent=2)
        f.write("\n")

    ids = {t: tok.token_to_id(t) for t in SPECIAL + ADDED}
    print(f"vocab {tok.get_vocab_size()}, special/added ids {ids}")
    # bytes per token on the validation split
    nb = nt = 0
    for text in iter_texts(os.path.join(args.corpus, "validation.jsonl.xz"), 0):
        nb += len(text.encode("utf-8"))
        nt += len(tok.encode(text, add_special_tokens=False).ids)
    print(f"validation: {nb} bytes -> {nt} tokens, {nb / max(nt, 1):.2f} bytes/token")


if __name__ == "__main__":
    main()

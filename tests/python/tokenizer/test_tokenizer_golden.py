"""Golden tests: `moet tokenize --batch` against HF `tokenizers` for every tokenizer family.

For each family one moet process encodes the targeted cases plus 1 MB of mixed real text (in
64 KiB pieces, with and without special tokens), then decodes the oracle's id sequences and random
id sequences (with and without skip_special_tokens, and through the incremental detokenizer).
Every id sequence and every decoded string must be identical.
"""
import json
import random
import subprocess

import pytest

from . import corpus, oracles


def _run_batch(moet_bin, folder, tmp_path, items):
    path = tmp_path / "batch.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    proc = subprocess.run([moet_bin, "tokenize", "--model", str(folder), "--batch", str(path)],
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    lines = proc.stdout.decode("utf-8").split("\n")[:-1]
    assert len(lines) == len(items)
    return [json.loads(line) for line in lines]


def _random_ids(rng, vocab_size, special_ids):
    out = []
    for _ in range(rng.randint(1, 40)):
        r = rng.random()
        out.append(rng.choice(special_ids) if r < 0.1 and special_ids else
                   rng.randrange(0, min(vocab_size, 300)) if r < 0.4 else rng.randrange(0, vocab_size))
    return out


@pytest.mark.parametrize("family", oracles.FAMILIES)
def test_encode_decode_golden(family, moet_bin, shared_data, tmp_path):
    hf = oracles.load(shared_data, family)
    texts = corpus.cases() + corpus.chunks(corpus.mixed_text(shared_data), 1 << 16)
    expected = [(hf.encode(t, add_special_tokens=True).ids, hf.encode(t, add_special_tokens=False).ids)
                for t in texts]
    rng = random.Random(hash(family) & 0xFFFF)
    vocab_size = hf.get_vocab_size(with_added_tokens=True)
    special_ids = [hf.token_to_id(t.content) for t in hf.get_added_tokens_decoder().values() if t.special]
    id_lists = [ids for ids, _ in expected] + [_random_ids(rng, vocab_size, special_ids) for _ in range(300)]

    got = _run_batch(moet_bin, shared_data / family, tmp_path, texts + id_lists)
    mismatches = []
    for text, (with_special, plain), record in zip(texts, expected, got):
        for got_ids, want in ((record["ids"], with_special), (record["ids_plain"], plain)):
            if got_ids != want:
                i = next((k for k, (x, y) in enumerate(zip(got_ids, want)) if x != y), min(len(got_ids), len(want)))
                mismatches.append(f"encode {text[:40]!r} at id {i}: moet {got_ids[max(0, i - 2):i + 4]} "
                                  f"hf {want[max(0, i - 2):i + 4]}")
    for ids, record in zip(id_lists, got[len(texts):]):
        want = hf.decode(ids, skip_special_tokens=False)
        if record["text"] != want or record["stream"] != want:
            mismatches.append(f"decode {ids[:20]}: moet {record['text'][:60]!r} stream "
                              f"{record['stream'][:60]!r} hf {want[:60]!r}")
        if record["text_skip"] != hf.decode(ids, skip_special_tokens=True):
            mismatches.append(f"decode(skip) {ids[:20]}")
    assert not mismatches, f"{len(mismatches)} mismatches, first: " + "\n".join(mismatches[:8])

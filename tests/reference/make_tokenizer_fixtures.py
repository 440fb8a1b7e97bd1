#!/usr/bin/env python3
"""
make_tokenizer_fixtures.py — golden ids for cinfer's tokenizer
(src/tokenizer/, tested by tests/test-tokenizer.c), from Hugging Face
`tokenizers` (Tokenizer.from_file semantics, NOT AutoTokenizer).

Run on the GPU machine (python `tokenizers` installed):
    python3 tests/reference/make_tokenizer_fixtures.py SRCDIR OUTDIR
SRCDIR holds <name>/tokenizer.json[.gz] (+ tokenizer_config.json[.gz]) for
stories260k, llama2, qwen3, llama3, gemma3, and austen/*.txt.
Writes OUTDIR/<name>.json:
  {name, n_vocab, cases: [{hex, ids, ids_special, ids_plain, decoded,
   decoded_skip, roundtrip}], chapters: [{file, start, len, ids}],
   novels: [{file, n, fnv}]}
  - hex: the input bytes (some are invalid UTF-8; the reference text is
    bytes.decode("utf-8", "replace"), which cinfer must match)
  - ids: encode(text, add_special_tokens=False)
  - ids_special: encode(text, add_special_tokens=True)
  - ids_plain: encode with encode_special_tokens=True (specials as text)
  - decoded / decoded_skip: decode(ids_special, skip_special_tokens=False/True)
  - roundtrip: decode(ids) == text
  - chapters: byte ranges of ../shared/data/austen files with their ids
  - novels: id count and FNV-1a 64 (over the ids as little-endian uint32)
    of each whole novel, add_special_tokens=False
and OUTDIR/hf-throughput.json: single-thread encode MB/s of Pride and
Prejudice per tokenizer (RAYON_NUM_THREADS=1), plus OUTDIR/debug-ids.json
(full novel ids, for finding a first mismatch; not committed).
"""
import gzip
import json
import os
import shutil
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

NAMES = ["stories260k", "llama2", "qwen3", "llama3", "gemma3"]
NOVELS = ["pride-and-prejudice.txt", "persuasion.txt", "emma.txt", "mansfield-park.txt",
          "northanger-abbey.txt", "sense-and-sensibility.txt"]

SPECIALS = ("A<s>B</s> <unk> <|im_start|>user\nhi<|im_end|>\n<|endoftext|> "
            "<start_of_turn>model\nyo<end_of_turn>\n<|begin_of_text|><|eot_id|><bos><eos><pad> "
            "<think>\nz\n</think> <tool_call>{}</tool_call> <b>bold</b> <table><tr><td>x</td></tr></table> "
            "<|reserved_special_token_0|><unused0><mask>[multimodal]<start_of_image>")

CASES = [
    "Hello world", "", " ", "  ", "   ", "\t", "\n", "\n\n\n\n\n", " \n ", "a",
    "   leading", "trailing   ", " leading space", "  two leading", "x ", "x  ",
    "\t\ttabs\tand\nnewlines\n\n\nend\n", "CRLF\r\nline\r\n\r\nend\r", "\r\n\r\n",
    "  multiple   spaces   inside  ", "word\u00a0nbsp\u2009thin\u3000ideo\u2028ls\u2029ps\u0085nel",
    "\u200bzero\u200dwidth\ufeffbom \u180e mongolian",
    "👍🏽 👨‍👩‍👧‍👦 🇯🇵🇺🇸 ❤️ 🏳️‍🌈 😀😃😄",
    "日本語のテキスト、中文文本。한국어 텍스트 ｶﾀｶﾅ",
    "e\u0301 cafe\u0301 \u00c5 vs A\u030a, n\u0303 \u1e9b\u0323 \u0958",
    "\u01c4 \ufb01 \u2460 \u00b2 \u212b \u2126 \uff21\uff22",
    "1234567890 12 123 1234 12345 3.14159 1,000,000 \u0663\u0664\u0665 \u2155 2024-01-01T12:00:00Z",
    "def f(x):\n    return x**2  # comment\n\tif (a && b) { printf(\"%d\\n\", a); }\n",
    "<html><body><div class=\"x\">&amp; &lt;tag&gt;</div></body></html>",
    "Mixed CASE and 'contractions' don't I'M we'VE they'll she'd it's O'Neil",
    "\u00dcn\u00efc\u00f6d\u00e9 fa\u00e7ade na\u00efve r\u00e9sum\u00e9 \u2014 \u201cquotes\u201d \u2018single\u2019 \u2026 \u00ab guillemets \u00bb",
    "\u03a9\u2248\u00e7\u221a\u222b\u02dc\u00b5\u2264\u2265\u00f7 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea \u0939\u093f\u0928\u094d\u0926\u0940 \u0e44\u0e17\u0e22",
    "\x00\x01\x1f\x7f control \x0b\x0c",
    "\u2581 already has metaspace \u2581\u2581 and \u0120 byte level chars \u010a",
    "<0x41> literal <0xZZ> <0x0A>",
    "a" * 3000,
    "supercalifragilistic" * 50,
    "x" * 1000 + " " + "y" * 1000,
    "\U0001F600" * 200,
    "\u00e9" * 500,
    "!!!???...,,,;;;" * 20,
    " " * 100 + "end",
    "\n" * 50 + "end",
    "\t" * 40 + "end" + "\t" * 3,
    SPECIALS,
    "<s>", "</s>", "<|im_start|>", "<start_of_turn>", "<|begin_of_text|>",
    " <s> ", "text<s>", "<s>text", "<s><s></s>", "<|im_end|><|im_end|>",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
]
BYTE_CASES = [
    b"abc\xff\xfedef\xe4\xbd", b"\xc3(", b"\xed\xa0\x80 surrogate", b"\xf0\x9f\x98",
    b"\xe4\xbd\xa0\xe5\xa5", b"ok\x80\x80\x80ok", b"\xf4\x90\x80\x80 too big", b"\xc0\xaf overlong",
]


def fnv64(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for k in range(4):
            h ^= (i >> (8 * k)) & 0xff
            h = (h * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h


def chapters(path):
    data = open(path, "rb").read()
    starts, pos = [], 0
    for line in data.split(b"\n"):
        if line.startswith(b"Chapter ") or line.startswith(b"CHAPTER "):
            starts.append(pos)
        pos += len(line) + 1
    starts.append(len(data))
    return data, starts


def load(src, name, tmp):
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        p = os.path.join(src, name, f)
        if os.path.exists(p):
            shutil.copy(p, os.path.join(d, f))
        elif os.path.exists(p + ".gz"):
            with gzip.open(p + ".gz", "rb") as i, open(os.path.join(d, f), "wb") as o:
                shutil.copyfileobj(i, o)
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def main():
    src, out = sys.argv[1], sys.argv[2]
    tmp = "/tmp/tok-tmp" if len(sys.argv) < 4 else sys.argv[3]
    os.makedirs(out, exist_ok=True)
    austen = os.path.join(src, "austen")
    pp = open(os.path.join(austen, "pride-and-prejudice.txt"), encoding="utf-8").read()
    paras = [p for p in pp.split("\n\n")]
    throughput, debug = {}, {}
    for name in NAMES:
        tok = load(src, name, tmp)
        fx = {"name": name, "n_vocab": tok.get_vocab_size(with_added_tokens=True), "cases": [],
              "chapters": [], "novels": []}
        inputs = [c.encode("utf-8") for c in CASES] + BYTE_CASES
        for raw in inputs:
            text = raw.decode("utf-8", "replace")
            tok.encode_special_tokens = False
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_sp = tok.encode(text, add_special_tokens=True).ids
            tok.encode_special_tokens = True
            ids_plain = tok.encode(text, add_special_tokens=False).ids
            tok.encode_special_tokens = False
            dec = tok.decode(ids_sp, skip_special_tokens=False)
            dec_skip = tok.decode(ids_sp, skip_special_tokens=True)
            fx["cases"].append({"hex": raw.hex(), "ids": ids, "ids_special": ids_sp, "ids_plain": ids_plain,
                                "decoded": dec, "decoded_skip": dec_skip,
                                "roundtrip": tok.decode(ids, skip_special_tokens=False) == text})
        for fname, picks in (("persuasion.txt", (1, 2)), ("pride-and-prejudice.txt", (3,))):
            data, starts = chapters(os.path.join(austen, fname))
            for c in picks:
                a, b = starts[c - 1], starts[c]
                text = data[a:b].decode("utf-8")
                fx["chapters"].append({"file": fname, "start": a, "len": b - a,
                                       "ids": tok.encode(text, add_special_tokens=False).ids})
        debug[name] = {}
        for fname in NOVELS:
            text = open(os.path.join(austen, fname), encoding="utf-8").read()
            ids = tok.encode(text, add_special_tokens=False).ids
            fx["novels"].append({"file": fname, "n": len(ids), "fnv": fnv64(ids)})
            if fname == "pride-and-prejudice.txt":
                debug[name][fname] = ids
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(fx, f, ensure_ascii=False, separators=(",", ":"))
        # throughput: whole text in one call, best of 3; and paragraphs one by one
        nbytes = len(pp.encode("utf-8"))
        best = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            tok.encode(pp, add_special_tokens=False)
            best = min(best, time.perf_counter() - t0)
        best_p = 1e9
        for _ in range(2):
            t0 = time.perf_counter()
            for p in paras:
                tok.encode(p, add_special_tokens=False)
            best_p = min(best_p, time.perf_counter() - t0)
        throughput[name] = {"bytes": nbytes, "whole_s": best, "whole_MBps": nbytes / best / 1e6,
                            "paragraphs_s": best_p, "paragraphs_MBps": nbytes / best_p / 1e6,
                            "n_paragraphs": len(paras)}
        print(name, json.dumps(throughput[name]), flush=True)
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import tokenizers
    with open(os.path.join(out, "hf-throughput.json"), "w") as f:
        json.dump({"tokenizers": tokenizers.__version__, "cpu": cpu, "threads": 1, "results": throughput}, f, indent=1)
    with open(os.path.join(out, "debug-ids.json"), "w") as f:
        json.dump(debug, f, separators=(",", ":"))


if __name__ == "__main__":
    main()

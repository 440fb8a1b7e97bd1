#!/usr/bin/env python3
"""HF `tokenizers` encode throughput on Pride and Prejudice, measured exactly as
bench/bench-tokenizer.c measures cinfer: one thread, no BOS/EOS, the whole book
in one call (best of 3) and the book's blank-line paragraphs one call each
(best of 2). Usage: tokenizer-hf.py SHARED_DIR  (the ../shared layout)."""
import gzip, json, os, shutil, sys, tempfile, time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

shared = sys.argv[1]
paths = {"stories260k": os.path.join(shared, "models/stories260k/tokenizer.json")}
for n in ("llama2", "qwen3", "llama3", "gemma3"):
    paths[n] = os.path.join(shared, "tokenizers", n, "tokenizer.json")
text = open(os.path.join(shared, "data/austen/pride-and-prejudice.txt"), encoding="utf-8").read()
paras = text.split("\n\n")
nbytes = len(text.encode("utf-8"))
tmp = tempfile.mkdtemp()
for name, p in paths.items():
    if not os.path.exists(p):
        dst = os.path.join(tmp, name + ".json")
        with gzip.open(p + ".gz", "rb") as i, open(dst, "wb") as o:
            shutil.copyfileobj(i, o)
        p = dst
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(p)
    load = time.perf_counter() - t0
    whole = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        tok.encode(text, add_special_tokens=False)
        whole = min(whole, time.perf_counter() - t0)
    best_p = 1e9
    for _ in range(2):
        t0 = time.perf_counter()
        for q in paras:
            tok.encode(q, add_special_tokens=False)
        best_p = min(best_p, time.perf_counter() - t0)
    print(json.dumps({"name": name, "load_s": round(load, 4), "whole_MBps": round(nbytes / whole / 1e6, 2),
                      "paragraphs_MBps": round(nbytes / best_p / 1e6, 2)}), flush=True)

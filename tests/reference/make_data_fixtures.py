#!/usr/bin/env python3
"""Reference rows and perplexities for cinfer's data loading and scoring CLI
(issue 14, findings 7 and 9), computed with transformers / tokenizers /
PyTorch / NumPy, never with cinfer.

What it writes: tests/fixtures/score/cli-reference.json with
  * "chat_data": a chat template (tokenizer_config.json text), the lines of a
    .jsonl ({"messages"}, {"prompt","completion"}, {"tokens"}) and the ids
    mlx_lm's datasets produce from them: ChatDataset / CompletionsDataset call
    tokenizer.apply_chat_template(messages, tools=...) (transformers renders
    the template and tokenizes it without adding special tokens); {"tokens"}
    lines are taken as is. The ids are checked against tokenizers'
    Tokenizer.from_file(...).encode(rendered, add_special_tokens=False).
  * "perplexity": for stories260k and tests/fixtures/score/data.jsonl, rows
    cut by mlx_lm's load_data for several --seed / --shuffle / --sequence-length
    choices (np.random.seed(s); np.random.permutation(n), or file order for
    "none"), and PyTorch's float32 perplexity of those rows (definitions as in
    make_score_fixtures.py), with every per-position loss.

Runs on the GPU machine's CPU (CUDA_VISIBLE_DEVICES=), float32, deterministic.
Rerun, from the repo root here:
  mkdir -p .carry/data/stories260k
  cp ../shared/models/stories260k/{config.json,generation_config.json,model.safetensors,tokenizer.json,tokenizer_config.json} .carry/data/stories260k/
then one device call (carry [".carry/data"]):
  export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES= ; python3 tests/reference/make_data_fixtures.py
  --shared .carry/data --out $OUT/cli-reference.json
and copy the file to tests/fixtures/score/. (The committed file was made before load_data_rows
moved into make_score_fixtures.py; the rows are the same code, and case 0 equals reference.json's "data".)
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_score_fixtures import load, load_data_rows, ppl_case  # noqa: E402

TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant:{% endif %}")
TOKCFG = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "chat_template": TEMPLATE}
LINES = [
    {"messages": [{"role": "user", "content": "Once upon a time"},
                  {"role": "assistant", "content": "there was a cat."}]},
    {"prompt": "Lily said", "completion": "hello!"},
    {"tokens": [5, 6, 7]},
    {"messages": [{"role": "system", "content": "Tell a story."},
                  {"role": "user", "content": "A dog and a ball"},
                  {"role": "assistant", "content": "The dog ran to the big red ball. It was happy!"}]},
]


def chat_rows(stories):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    d = tempfile.mkdtemp()
    shutil.copy(os.path.join(stories, "tokenizer.json"), d)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(TOKCFG, f)
    hf = AutoTokenizer.from_pretrained(d)
    tk = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    per_line, mismatch = [], []
    for ln in LINES:
        if "tokens" in ln:
            per_line.append(list(ln["tokens"]))
            continue
        msgs = ln["messages"] if "messages" in ln else [
            {"role": "user", "content": ln["prompt"]}, {"role": "assistant", "content": ln["completion"]}]
        ids = hf.apply_chat_template(msgs, tools=None, tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = [int(x) for x in ids]
        text = hf.apply_chat_template(msgs, tokenize=False)
        alt = tk.encode(text, add_special_tokens=False).ids
        print("rendered %r -> %d ids" % (text, len(ids)))
        if ids != list(alt):  # recorded, not fatal: the device call is scarce
            print("WARNING: apply_chat_template ids %s != tokenizers encode %s" % (ids, alt))
            mismatch.append(dict(line=len(per_line), tokenizers_ids=list(alt)))
        per_line.append(ids)
    return dict(tokenizer_config=TOKCFG, lines=LINES, ids=per_line, tokenizers_mismatch=mismatch,
                notes="ids per line: transformers AutoTokenizer(tokenizer.json + tokenizer_config).apply_chat_template("
                      "messages, tokenize=True) as mlx_lm's ChatDataset/CompletionsDataset; {tokens} as is")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", required=True, help="folder holding stories260k/")
    ap.add_argument("--data", default="tests/fixtures/score/data.jsonl")
    ap.add_argument("--out", default="tests/fixtures/score/cli-reference.json")
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    import transformers
    stories = os.path.join(a.shared, "stories260k")
    ref = dict(generator="tests/reference/make_data_fixtures.py", torch=torch.__version__,
               transformers=transformers.__version__, numpy=np.__version__)
    ref["chat_data"] = chat_rows(stories)
    texts = [json.loads(x)["text"] for x in open(a.data) if x.strip()]
    m = load(stories)
    cases = []
    for L, num, seed, shuffle in [(64, 6, 123, "numpy"), (64, 6, 7, "numpy"), (48, 5, 123, "none"), (100, -1, 99, "numpy")]:
        rows = load_data_rows(os.path.join(stories, "tokenizer.json"), texts, L, num, seed, 2, shuffle)
        c = dict(seq_len=L, num_samples=num, seed=seed, shuffle=shuffle, rows=rows, **ppl_case(m, rows))
        print("ppl seq %d num %d seed %d %s: %d rows, %.6f +- %.6f" % (L, num, seed, shuffle, len(rows),
                                                                        c["perplexity"], c["standard_error"]))
        cases.append(c)
    ref["perplexity"] = cases
    with open(a.out, "w") as f:
        json.dump(ref, f)
    print("wrote", a.out, os.path.getsize(a.out))


if __name__ == "__main__":
    sys.exit(main())

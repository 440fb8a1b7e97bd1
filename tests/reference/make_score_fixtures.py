#!/usr/bin/env python3
"""Reference numbers for cinfer's scoring (issue 4): perplexity, KL statistics,
response log-probs and NumPy permutations, computed with PyTorch/transformers
and NumPy by the published definitions on fixed token rows.

What it is: for ../shared/models/stories260k and tiny fixtures in
tests/fixtures/models it feeds given token rows (ids in the fixture, so the
tokenizer does not matter for the score comparison) and writes
tests/fixtures/score/reference.json, which tests/test-score.c compares with.

Definitions (../shared/specs/perplexity.md, kl-divergence.md):
  * perplexity (mlx_lm.perplexity): logits = model(rows[:, :-1]) in float32,
    CE = logsumexp(logits) - logits[target] per position (float32), every
    position counted; mean / std (ddof 1) / ppl = exp(mean) /
    se = ppl * std / sqrt(N) in float64.
  * KL (llama.cpp --kl-divergence, every position of the rows): base and model
    log-softmax in float64 of the float32 logits; KLD = sum over
    log p_base > -16 of p_base (log p_base - log p_model); dp = p_model(tok) -
    p_base(tok); same top = argmax equality; statistics with llama.cpp's
    mean_and_uncertainty / covariance / percentile.
  * response log-probs: one unpadded forward of prompt+response, summed
    log-softmax (float32) of each response token given what precedes it.
  * permutations: np.random.seed(s); np.random.permutation(n).
Also writes stories260k-fq (a 4-bit fake-quantized float16 copy of stories260k,
the "quantized model" of the KL case) and data-rows: mlx_lm load_data on a small
jsonl of texts (tokenizers' encode with the post-processor, EOS appended).

Runs on the GPU machine's CPU in float32 (no TF32), deterministic (torch 2.11, transformers 5.17,
numpy 2.x there). tests/fixtures/score/mulberry32.json is not from here: it was written with node
running mlx-bun's packRows shuffle (src/eval/perplexity.ts), see its "generator" key.

Rerun, from the repo root here:
  mkdir -p .carry/score/stories260k
  cp ../shared/models/stories260k/{config.json,generation_config.json,model.safetensors,tokenizer.json,tokenizer_config.json} .carry/score/stories260k/
then one device call (carry [".carry/score"], ~20 s):
  set -o pipefail; export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES= ; mkdir -p /tmp/score &&
  cp tests/fixtures/score/data.jsonl /tmp/score/ && python3 tests/reference/make_score_fixtures.py
  --shared .carry/score --out /tmp/score --tar $OUT/score.tar.gz 2>&1 | tee $OUT/log.txt
and unpack: tar xzf <files_at>/score.tar.gz -C tests/fixtures   (the archive holds score/...)
Usage: make_score_fixtures.py --shared DIR_WITH_stories260k [--out tests/fixtures/score] [--tar FILE]
"""
import argparse
import json
import math
import os
import shutil
import sys
import tarfile

import numpy as np
import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.set_grad_enabled(False)
torch.use_deterministic_algorithms(True)
from transformers import AutoModelForCausalLM  # noqa: E402

FIX = "tests/fixtures/models"


def load(d):
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m


def logits(model, rows):
    ids = torch.tensor(rows, dtype=torch.long)
    return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.to(torch.float32)


def ppl_case(model, rows):
    rows = np.asarray(rows)
    lg = logits(model, rows[:, :-1])
    tgt = torch.tensor(rows[:, 1:], dtype=torch.long)
    ce = torch.logsumexp(lg, dim=-1) - torch.gather(lg, -1, tgt[..., None])[..., 0]
    ce = ce.numpy().astype(np.float64).reshape(-1)
    n = ce.size
    mean = ce.mean()
    std = ce.std(ddof=1)
    ppl = math.exp(mean)
    return dict(perplexity=ppl, standard_error=ppl * std / math.sqrt(n), mean_loss=mean, std_loss=std,
                tokens=int(n), nll=[float(x) for x in ce])


def mean_unc(s, s2, n):
    f = s / n
    v = s2 / n - f * f
    return f, (math.sqrt(v / (n - 1)) if v > 0 and n > 10 else 0.0)


def cov(a, b, ab, n):
    return 0.0 if n < 10 else (ab / n - (a / n) * (b / n)) / (n - 1)


def pct(v, f):
    if f <= 0:
        return float(v[0])
    if f >= 1:
        return float(v[-1])
    p = f * (len(v) - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * v[ip] + p * v[min(ip + 1, len(v) - 1)])


def kl_case(base, model, rows):
    rows = np.asarray(rows)
    lb = torch.log_softmax(logits(base, rows[:, :-1]).double(), -1).reshape(-1, base.config.vocab_size)
    lq = torch.log_softmax(logits(model, rows[:, :-1]).double(), -1).reshape(-1, model.config.vocab_size)
    tok = torch.tensor(rows[:, 1:].reshape(-1), dtype=torch.long)
    kld = torch.where(lb > -16, lb.exp() * (lb - lq), torch.zeros_like(lb)).sum(-1).numpy()
    nll = -lq.gather(-1, tok[:, None])[:, 0].numpy()
    nllb = -lb.gather(-1, tok[:, None])[:, 0].numpy()
    dp = np.exp(-nll) - np.exp(-nllb)
    same = (lq.argmax(-1) == lb.argmax(-1)).numpy()
    n = kld.size
    lq_m, uq = mean_unc(nll.sum(), (nll * nll).sum(), n)
    lb_m, ub = mean_unc(nllb.sum(), (nllb * nllb).sum(), n)
    c = cov(nll.sum(), nllb.sum(), (nll * nllb).sum(), n)
    o = dict(tokens=int(n))
    o["ppl_model"] = math.exp(lq_m); o["ppl_model_unc"] = o["ppl_model"] * uq
    o["ppl_base"] = math.exp(lb_m); o["ppl_base_unc"] = o["ppl_base"] * ub
    o["cor_ln_ppl"] = c / (uq * ub) if uq > 0 and ub > 0 else 0.0
    o["ln_ratio"] = lq_m - lb_m
    v = uq * uq + ub * ub - 2 * c
    o["ln_ratio_unc"] = math.sqrt(v) if v > 0 else 0.0
    o["ratio"] = math.exp(o["ln_ratio"]); o["ratio_unc"] = o["ratio"] * o["ln_ratio_unc"]
    o["diff"] = o["ppl_model"] - o["ppl_base"]
    v = o["ppl_model_unc"] ** 2 + o["ppl_base_unc"] ** 2 - 2 * o["ppl_model"] * o["ppl_base"] * c
    o["diff_unc"] = math.sqrt(v) if v > 0 else 0.0
    o["mean_kld"], o["kld_unc"] = mean_unc(kld.sum(), (kld * kld).sum(), n)
    o["mean_dp"], o["dp_unc"] = mean_unc(dp.sum(), (dp * dp).sum(), n)
    ms, mu = mean_unc((dp * dp).sum(), (dp ** 4).sum(), n)
    o["rms_dp"] = math.sqrt(ms); o["rms_dp_unc"] = 0.5 / o["rms_dp"] * mu if o["rms_dp"] > 0 else 0.0
    o["same_top"] = float(same.mean())
    o["same_top_unc"] = math.sqrt(o["same_top"] * (1 - o["same_top"]) / (n - 1))
    ks, ds = np.sort(kld), np.sort(dp)
    o["kld_q"] = [pct(ks, f) for f in [1, .999, .99, .95, .90, .5, .10, .05, .01, .001, 0]]
    o["dp_q"] = [pct(ds, f) for f in [1, .999, .99, .95, .90, .75, .5, .25, .10, .05, .01, .001, 0]]
    o["kld"] = [float(x) for x in kld]
    return o


def logprob_case(model, seqs):
    out = []
    for p, r in seqs:
        ids = p + r
        lg = logits(model, [ids[:-1]])[0]
        lp = torch.log_softmax(lg, -1)
        tl = [float(lp[len(p) - 1 + i, r[i]]) for i in range(len(r))]
        out.append(dict(prompt=p, response=r, sum=float(np.sum(np.asarray(tl, dtype=np.float64))), per_token=tl))
    return out


def fake_quant(src, dst):
    """4-bit symmetric per-row fake quantization of every matrix, stored as float16."""
    m = load(src)
    for name, p in m.named_parameters():
        if p.ndim == 2:
            s = p.abs().amax(1, keepdim=True).clamp_min(1e-8) / 7
            p.copy_(torch.round(p / s).clamp(-8, 7) * s)
    m = m.to(torch.float16)
    m.save_pretrained(dst, safe_serialization=True)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    cfg = json.load(open(os.path.join(dst, "config.json")))
    cfg["dtype"] = "float16"
    cfg.pop("torch_dtype", None)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    return load(dst)


def load_data_rows(tok_path, texts, L, num_samples, seed, eos, shuffle="numpy"):
    """mlx_lm load_data on text samples (stops at the end of the data);
    num_samples -1: every full row; shuffle "none": file order."""
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(tok_path)
    samples = []
    for t in texts:
        ids = tk.encode(t).ids
        if not ids or ids[-1] != eos:
            ids.append(eos)
        samples.append(ids)
    if shuffle == "numpy":
        np.random.seed(seed)
        perm = np.random.permutation(len(samples)).tolist()
    else:
        perm = list(range(len(samples)))
    want = L * num_samples if num_samples > 0 else sum(len(s) for s in samples)
    data, i = [], 0
    while len(data) < want and i < len(perm):
        data.extend(samples[perm[i]])
        i += 1
    n = len(data) // L if num_samples < 0 else min(len(data) // L, num_samples)
    return [data[r * L:(r + 1) * L] for r in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", required=True)
    ap.add_argument("--out", default="tests/fixtures/score")
    ap.add_argument("--tar", default=None)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ref = dict(generator="tests/reference/make_score_fixtures.py", torch=torch.__version__,
               numpy=np.__version__)
    import transformers
    ref["transformers"] = transformers.__version__

    # permutations
    perms = []
    for seed in [0, 1, 42, 123, 4294967295]:
        for n in [1, 2, 3, 7, 100, 1000, 65537]:
            np.random.seed(seed)
            p = np.random.permutation(n)
            perms.append(dict(seed=seed, n=n, head=[int(x) for x in p[:64]], tail=[int(x) for x in p[-16:]],
                              weighted=int(np.sum(p.astype(np.int64) * (np.arange(n, dtype=np.int64) + 1)))))
    ref["permutations"] = perms

    g = np.random.default_rng(7)
    stories = os.path.join(a.shared, "stories260k")
    ms = load(stories)
    # stories260k rows: real text tokenized, cut into rows
    texts = [json.loads(l)["text"] for l in open(os.path.join(a.out, "data.jsonl")) if l.strip()]
    drows = load_data_rows(os.path.join(stories, "tokenizer.json"), texts, 64, 6, 123, 2)
    ref["data"] = dict(seq_len=64, num_samples=6, seed=123, rows=drows)
    srows = drows[:4] if len(drows) >= 4 else None
    assert srows is not None, "data too short"

    ppl = []
    ppl.append(dict(model="stories260k", rows=srows, **ppl_case(ms, srows)))
    for name in ["llama-f32", "qwen2-bf16", "qwen3-f32"]:
        m = load(os.path.join(FIX, name))
        rows = g.integers(3, m.config.vocab_size, size=(3, 33)).tolist()
        ppl.append(dict(model=name, rows=rows, **ppl_case(m, rows)))
    ref["perplexity"] = ppl

    fq = fake_quant(stories, os.path.join(a.out, "stories260k-fq"))
    kl = [dict(base="stories260k", model="score/stories260k-fq", rows=srows, **kl_case(ms, fq, srows))]
    b, q = load(os.path.join(FIX, "llama-f32")), load(os.path.join(FIX, "llama-f16"))
    rows = g.integers(3, 256, size=(3, 40)).tolist()
    kl.append(dict(base="llama-f32", model="llama-f16", rows=rows, **kl_case(b, q, rows)))
    kl.append(dict(base="llama-f32", model="llama-f32", rows=rows, **kl_case(b, b, rows)))
    ref["kl"] = kl

    lp = []
    seqs = [(srows[0][:5], srows[0][5:17]), (srows[1][:30], srows[1][30:33]), (srows[2][:2], srows[2][2:50]),
            (srows[3][:1], srows[3][1:9])]
    lp.append(dict(model="stories260k", cases=logprob_case(ms, seqs)))
    m = load(os.path.join(FIX, "qwen2-f32"))
    seqs = []
    for np_, nr in [(3, 4), (10, 1), (1, 12), (6, 6)]:
        seqs.append((g.integers(3, 256, size=np_).tolist(), g.integers(3, 256, size=nr).tolist()))
    lp.append(dict(model="qwen2-f32", cases=logprob_case(m, seqs)))
    ref["logprobs"] = lp

    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump(ref, f)
    print("wrote", os.path.join(a.out, "reference.json"), os.path.getsize(os.path.join(a.out, "reference.json")))
    for k in ppl:
        print("ppl", k["model"], k["perplexity"], k["standard_error"])
    for k in kl:
        print("kl", k["base"], k["model"], k["mean_kld"], k["same_top"], k["ppl_base"], k["ppl_model"])
    if a.tar:
        with tarfile.open(a.tar, "w:gz") as t:
            t.add(a.out, arcname="score")
        print("packed", a.tar)


if __name__ == "__main__":
    sys.exit(main())

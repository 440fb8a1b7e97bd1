#!/usr/bin/env python3
"""score-compare.py — the scoring commands' results on CUDA against the CPU's
(tests/gpu/run.sh, issue 18). One PASS/FAIL line per statistic, with the
achieved difference next to its bar.

usage: score-compare.py ppl|kl|tsv|lp LABEL PREC CPU_FILE CUDA_FILE
  PREC: f32 (stories260k: f32 weights, the CUDA forward keeps f32 activations)
        bf16 (prose-13m: bf16 weights, CUDA's batched matmuls round the
        activations to bf16 for cuBLAS as transformers does; the CPU keeps f32)
  ppl:  `cinfer perplexity --json`;  kl: `cinfer kl --json` (every statistic);
  tsv:  `cinfer kl --per-token` files;  lp: `cinfer logprobs --json` lines.

Bars. The CUDA and CPU logits differ by the forward's activation precision
alone (the reduction is one definition, be_ref_score_row, checked to 1e-6 on
identical logits by test-backend-ops). Relative bars on quantities that are
means of per-token log-probs (perplexities, their ratio, mean log-prob sums)
follow the perplexity bars already in run.sh: 5e-7 f32, 1e-3 bf16.
KLD, delta-p and their spreads are differences of two models' probabilities,
so the same logit error is a larger part of them: they are held in absolute
terms at a fraction of their own scale (see TOL), and same-top may differ by
the argmax flips of near-ties that this error explains (at most 0.5% of
positions bf16, 0.1% f32).
"""
import json, sys

# (relative bar, absolute floor) per statistic and precision
TOL = {
    "f32": {"ppl": (5e-7, 0), "kld": (2e-3, 1e-7), "dp": (2e-3, 1e-7), "same": (0, 1e-3), "unc": (2e-3, 1e-7), "cor": (0, 1e-5)},
    "bf16": {"ppl": (1e-3, 0), "kld": (0.05, 2e-4), "dp": (0.05, 2e-4), "same": (0, 5e-3), "unc": (0.05, 2e-4), "cor": (0, 2e-3)},
}

fails = 0


def check(label, name, a, b, bar):
    """a: cpu, b: cuda; bar = (rel, abs): |a-b| <= max(rel*|a|, abs)"""
    global fails
    rel, ab = bar
    d = abs(a - b)
    lim = max(rel * abs(a), ab)
    ok = d <= lim or (a == b)
    if not ok:
        fails += 1
    print("%s %s %s: cuda %.9g vs cpu %.9g, |diff| %.2e (bar %.2e = max(%g x |cpu|, %g))"
          % ("PASS" if ok else "FAIL", label, name, b, a, d, lim, rel, ab))


def kind_of(key):
    if key.startswith("ppl_diff") or key in ("ppl_model", "ppl_base", "ppl_ratio", "ln_ppl_ratio"):
        return "ppl"
    if key == "cor_ln_ppl":
        return "cor"
    if key.startswith("same_top"):
        return "same"
    if "uncertainty" in key:
        return "unc"
    if "kld" in key:
        return "kld"
    return "dp"


def main():
    kind, label, prec, fa, fb = sys.argv[1:6]
    t = TOL[prec]
    if kind == "ppl":
        a, b = json.load(open(fa)), json.load(open(fb))
        if a["tokens"] != b["tokens"]:
            check(label, "tokens", a["tokens"], b["tokens"], (0, 0))
        for k in ("perplexity", "mean_loss", "standard_error"):
            check(label, k, a[k], b[k], t["ppl"] if k != "standard_error" else t["unc"])
    elif kind == "kl":
        a, b = json.load(open(fa)), json.load(open(fb))
        check(label, "tokens", a["tokens"], b["tokens"], (0, 0))
        for k, v in a.items():
            if k in ("tokens", "seconds", "peak_memory_gb"):
                continue
            if isinstance(v, dict):
                for q, x in v.items():
                    check(label, "%s[%s]" % (k, q), x, b[k][q], t["kld"] if k.startswith("kld") else t["dp"])
            else:
                bar = t[kind_of(k)]
                if k.startswith("ppl_diff"):   # a difference of perplexities: held to the perplexities' bar times their size
                    bar = (0, t["ppl"][0] * a["ppl_model"] * 2 + 1e-9)
                check(label, k, v, b[k], bar)
    elif kind == "tsv":
        ra = [l.split("\t") for l in open(fa).read().splitlines() if l and not l.startswith("row")]
        rb = [l.split("\t") for l in open(fb).read().splitlines() if l and not l.startswith("row")]
        check(label, "per-token rows", len(ra), len(rb), (0, 0))
        cols = {"kld": 3, "nll_model": 4, "nll_base": 5, "dp": 6}
        for name, c in cols.items():
            worst, scale = 0.0, 0.0
            for x, y in zip(ra, rb):
                worst = max(worst, abs(float(x[c]) - float(y[c])))
                scale = max(scale, abs(float(x[c])))
            print("INFO %s per-token %s: max |cuda - cpu| %.3e over %d positions (largest |cpu| %.3g)"
                  % (label, name, worst, len(ra), scale))
        flips = sum(1 for x, y in zip(ra, rb) if x[7] != y[7])
        check(label, "per-token same_top flips (fraction)", 0.0, flips / max(1, len(ra)), t["same"])
    elif kind == "lp":
        la = [json.loads(l) for l in open(fa) if l.strip()]
        lb = [json.loads(l) for l in open(fb) if l.strip()]
        check(label, "lines", len(la), len(lb), (0, 0))
        worst = 0.0
        for x, y in zip(la, lb):
            for k in x:
                if k.endswith("logprob"):
                    worst = max(worst, abs(x[k] - y[k]) / max(1e-30, abs(x[k])))
        check(label, "response log-prob sums, worst relative diff", 0.0, worst, (0, t["ppl"][0]))
    print("score-compare %s %s: %s" % (kind, label, "FAIL" if fails else "ok"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

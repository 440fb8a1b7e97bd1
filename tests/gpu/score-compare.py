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
identical logits by test-backend-ops; with the LM head folded into the score
op, prose-13m's bf16 head on CUDA, be_ops.score_head against the reference's
matmul and reduction within 1e-5 of |lse|, measured <= 1e-6). With R the relative bar of a mean
log-prob (run.sh's perplexity bars: 5e-7 f32, 1e-3 bf16):
  perplexities, PPL ratio, mean loss, response log-prob sums: R relative;
  ln PPL ratio (a difference of two mean nlls): 2R absolute; PPL(Q)-PPL(base): 2R * PPL;
  per-token nll, KLD, delta-p: N, K, D absolute (f32: 2e-5, 1e-5, 1e-5; bf16:
    0.05, 0.01, 0.02 -- the bf16 activations move a logit by up to ~1e-3 of
    the logit range, test-cuda-model: 1.23e-3, so an nll by up to ~2e-3 of it);
  mean KLD / delta-p, RMS delta-p and every percentile: K or D absolute -- a
    mean, a root mean square and an order statistic of per-token values move
    by at most the per-token values' largest move (1-Lipschitz in the max norm);
  uncertainties (a std / sqrt(n-1)): the same per-token bar / sqrt(n - 1), times
    the perplexity for the perplexities' (delta method), plus R of themselves;
  correlation of the nlls: 1e-5 f32, 2e-3 bf16 absolute;
  same top: flips of near-ties, at most 0.1% (f32) / 0.5% (bf16) of positions.
"""
import json, sys

PREC = {"f32": {"R": 5e-7, "N": 2e-5, "K": 1e-5, "D": 1e-5, "cor": 1e-5, "same": 1e-3},
        "bf16": {"R": 1e-3, "N": 0.05, "K": 0.01, "D": 0.02, "cor": 2e-3, "same": 5e-3}}

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
    print("%s %s %s: cuda %.9g vs cpu %.9g, |diff| %.2e (bar %.2e)" % ("PASS" if ok else "FAIL", label, name, b, a, d, lim))


def kl_bar(t, key, a):
    """the bar of one statistic of `cinfer kl --json` (see the module's comment)"""
    R, n = t["R"], max(2, a["tokens"])
    s = (n - 1) ** 0.5
    bars = {
        "ppl_model": (R, 0), "ppl_base": (R, 0), "ppl_ratio": (R, 0),
        "ln_ppl_ratio": (0, 2 * R), "ppl_diff": (0, 2 * R * a["ppl_model"]),
        "mean_kld": (0, t["K"]), "mean_dp": (0, t["D"]), "rms_dp": (0, t["D"]),
        "cor_ln_ppl": (0, t["cor"]), "same_top": (0, t["same"]), "same_top_uncertainty": (0, t["same"]),
        "kld_uncertainty": (R, t["K"] / s), "dp_uncertainty": (R, t["D"] / s), "rms_dp_uncertainty": (R, t["D"] / s),
        "ppl_model_uncertainty": (R, a["ppl_model"] * t["N"] / s), "ppl_base_uncertainty": (R, a["ppl_base"] * t["N"] / s),
        "ln_ppl_ratio_uncertainty": (R, 2 * t["N"] / s), "ppl_ratio_uncertainty": (R, 2 * a["ppl_ratio"] * t["N"] / s),
        "ppl_diff_uncertainty": (R, (a["ppl_model"] + a["ppl_base"]) * t["N"] / s),
    }
    return bars[key]


def main():
    kind, label, prec, fa, fb = sys.argv[1:6]
    t = PREC[prec]
    if kind == "ppl":
        a, b = json.load(open(fa)), json.load(open(fb))
        check(label, "tokens", a["tokens"], b["tokens"], (0, 0))
        s = (max(2, a["tokens"]) - 1) ** 0.5
        check(label, "perplexity", a["perplexity"], b["perplexity"], (t["R"], 0))
        check(label, "mean_loss", a["mean_loss"], b["mean_loss"], (t["R"], 0))
        check(label, "std_loss", a["std_loss"], b["std_loss"], (t["R"], t["N"]))
        check(label, "standard_error", a["standard_error"], b["standard_error"], (t["R"], a["perplexity"] * t["N"] / s))
    elif kind == "kl":
        a, b = json.load(open(fa)), json.load(open(fb))
        check(label, "tokens", a["tokens"], b["tokens"], (0, 0))
        for k, v in a.items():
            if k in ("tokens", "seconds", "peak_memory_gb"):
                continue
            if isinstance(v, dict):
                for q, x in v.items():
                    check(label, "%s[%s]" % (k, q), x, b[k][q], (0, t["K"] if k.startswith("kld") else t["D"]))
            else:
                check(label, k, v, b[k], kl_bar(t, k, a))
    elif kind == "tsv":
        ra = [l.split("\t") for l in open(fa).read().splitlines() if l and not l.startswith("row")]
        rb = [l.split("\t") for l in open(fb).read().splitlines() if l and not l.startswith("row")]
        check(label, "per-token rows", len(ra), len(rb), (0, 0))
        cols = {"kld": (3, "K"), "nll_model": (4, "N"), "nll_base": (5, "N"), "dp": (6, "D")}
        for name, (c, bk) in cols.items():
            worst, scale = 0.0, 0.0
            for x, y in zip(ra, rb):
                worst = max(worst, abs(float(x[c]) - float(y[c])))
                scale = max(scale, abs(float(x[c])))
            check(label, "per-token %s, largest |cuda - cpu| of %d (largest |cpu| %.3g)" % (name, len(ra), scale), 0.0, worst, (0, t[bk]))
        flips = sum(1 for x, y in zip(ra, rb) if x[7] != y[7])
        check(label, "per-token same_top flips (fraction)", 0.0, flips / max(1, len(ra)), (0, t["same"]))
    elif kind == "lp":
        la = [json.loads(l) for l in open(fa) if l.strip()]
        lb = [json.loads(l) for l in open(fb) if l.strip()]
        check(label, "lines", len(la), len(lb), (0, 0))
        worst = 0.0
        for x, y in zip(la, lb):
            for k in x:
                if k.endswith("logprob"):
                    worst = max(worst, abs(x[k] - y[k]) / max(1e-30, abs(x[k])))
        check(label, "response log-prob sums, worst relative diff", 0.0, worst, (0, t["R"]))
    print("score-compare %s %s: %s" % (kind, label, "FAIL" if fails else "ok"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

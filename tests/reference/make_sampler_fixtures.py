#!/usr/bin/python3
"""Analytic sampling distributions and RNG known answers for cinfer's sampler
(issue 14, finding 3), computed with NumPy from the definitions, not from
cinfer.

What it writes: tests/fixtures/sampler.json with
  * "cases": fixed logits (positive and negative), sampler parameters and a
    history, and the exact probability of every token after the logits
    processors Hugging Face transformers applies in generate(), in its order
    and with its rules:
      RepetitionPenaltyLogitsProcessor: every distinct token of the history
        (mlx-lm's repetition_context_size: only the last rep_last_n tokens;
        0 = all): logit < 0 -> logit * penalty, else logit / penalty;
      TemperatureLogitsWarper: logits / temp;
      TopKLogitsWarper: keep the top_k largest (ties: none here);
      TopPLogitsWarper: sort ascending, cumsum of softmax, drop the tokens
        whose cumulative mass <= 1 - top_p (keeps the smallest set whose mass
        reaches top_p);
      MinPLogitsWarper: softmax of what is left; drop p < min_p * max p;
    then the softmax of what remains. Each case asserts that no kept/dropped
    decision sits within 1e-3 of its threshold, so float32 arithmetic in the
    engine cannot flip one.
    "chi2_crit": the chi-square value with (kept - 1) degrees of freedom that
    a fair draw exceeds with probability 1e-3 (Wilson-Hilferty).
  * "rng": the generator the sampler documents (src/engine/sampler.c):
    xoshiro256** (Blackman & Vigna, reference C code) seeded with four
    splitmix64 outputs of the seed, unit doubles (x >> 11) * 2^-53. With 256
    equal logits (probability exactly 1/256 each, sums exact in float32) the
    sampled token is floor(u * 256): the first 32 tokens for a few seeds (seeds as
    decimal strings: 2^64 - 1 is beyond what JSON readers take as an integer).

Run here (NumPy only): /usr/bin/python3 tests/reference/make_sampler_fixtures.py
"""
import json
import math
import sys

import numpy as np

LOGITS = [2.0, 1.5, 1.2, 0.7, 0.3, 0.0, -0.4, -1.0, -1.7, -2.5]
HIST = [0, 7, 7, 2, 9]

# name, temp, top_k, top_p, min_p, rep_penalty, rep_last_n, history
CASES = [
    ("temp 1", 1.0, 0, 1.0, 0.0, 1.0, 0, []),
    ("temp 0.7", 0.7, 0, 1.0, 0.0, 1.0, 0, []),
    ("temp 1.6", 1.6, 0, 1.0, 0.0, 1.0, 0, []),
    ("top-k 4", 1.0, 4, 1.0, 0.0, 1.0, 0, []),
    ("top-p 0.65", 1.0, 0, 0.65, 0.0, 1.0, 0, []),
    ("min-p 0.15", 1.0, 0, 1.0, 0.15, 1.0, 0, []),
    ("temp 0.8 + top-k 6 + top-p 0.9", 0.8, 6, 0.9, 0.0, 1.0, 0, []),
    ("temp 1.3 + top-p 0.85 + min-p 0.1", 1.3, 0, 0.85, 0.1, 1.0, 0, []),
    ("top-k 5 + min-p 0.3", 1.0, 5, 1.0, 0.3, 1.0, 0, []),
    ("repetition penalty 1.5, whole history (positive and negative logits)", 1.0, 0, 1.0, 0.0, 1.5, 0, HIST),
    ("repetition penalty 1.5, window of the last 2 tokens", 1.0, 0, 1.0, 0.0, 1.5, 2, HIST),
    ("repetition penalty 2, window 3 + temp 0.9 + top-k 5", 0.9, 5, 1.0, 0.0, 2.0, 3, [1, 8, 3]),
]


def softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x[np.isfinite(x)])
    e = np.where(np.isfinite(x), np.exp(x - m), 0.0)
    return e / e.sum()


def margin(values, threshold, what):
    d = np.min(np.abs(np.asarray(values, dtype=np.float64) - threshold))
    if d < 1e-3:
        raise SystemExit("%s: a value sits %.2g from its threshold" % (what, d))


def processed(name, temp, top_k, top_p, min_p, pen, last_n, hist):
    z = np.array(LOGITS, dtype=np.float64)
    if pen != 1.0 and hist:
        window = hist[-last_n:] if last_n > 0 else hist
        for t in sorted(set(window)):
            z[t] = z[t] * pen if z[t] < 0 else z[t] / pen
    z = z / temp
    if top_k > 0:
        kth = np.sort(z)[::-1][top_k - 1]
        margin(z[z != kth], kth, name + " top-k")
        z = np.where(z < kth, -np.inf, z)
    if top_p < 1.0:
        order = np.argsort(z)             # ascending, as HF
        cum = np.cumsum(softmax(z)[order])
        margin(cum, 1 - top_p, name + " top-p")
        drop = order[cum <= 1 - top_p]
        z[drop] = -np.inf
    if min_p > 0:
        p = softmax(z)
        thr = min_p * p.max()
        margin(p[p > 0], thr, name + " min-p")
        z = np.where(p < thr, -np.inf, z)
    return softmax(z)


def chi2_crit(df, z=3.090232306167813):   # upper 1e-3 point of N(0, 1)
    a = 2.0 / (9.0 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


M64 = (1 << 64) - 1


def splitmix(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


def xoshiro_units(seed, n):
    st, s = seed & M64, []
    for _ in range(4):
        st, v = splitmix(st)
        s.append(v)
    out = []
    for _ in range(n):
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        out.append((result >> 11) * 2.0 ** -53)
    return out


def main():
    out = {"generator": "tests/reference/make_sampler_fixtures.py", "numpy": np.__version__, "logits": LOGITS, "cases": []}
    for c in CASES:
        name, temp, top_k, top_p, min_p, pen, last_n, hist = c
        p = processed(*c)
        kept = int(np.count_nonzero(p))
        out["cases"].append(dict(name=name, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, rep_penalty=pen,
                                 rep_last_n=last_n, history=hist, probs=[float(x) for x in p], kept=kept,
                                 chi2_crit=chi2_crit(kept - 1) if kept > 1 else 0.0))
        print("%-70s kept %2d  %s" % (name, kept, " ".join("%.4f" % x for x in p)))
    out["rng"] = [dict(seed=str(s), tokens=[int(u * 256) for u in xoshiro_units(s, 32)]) for s in [0, 1, 42, 2 ** 64 - 1]]
    with open("tests/fixtures/sampler.json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

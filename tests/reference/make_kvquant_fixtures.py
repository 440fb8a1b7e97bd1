#!/usr/bin/env python3
"""make_kvquant_fixtures.py -- mlx-lm's quantized KV cache (--kv-bits) on prose-13m, recomputed
independently with NumPy, for tests/test-kvquant-ref.c (issue 15, "Must be shown", first bullet).

NumPy only; runs here with /usr/bin/python3 in about a minute:

    /usr/bin/python3 tests/reference/make_kvquant_fixtures.py ../shared/models/prose-13m tests/fixtures/kvquant

What mlx-lm does (read from its source, ml-explore/mlx-lm; MLX itself does not run here):

  generate.py, maybe_quantize_kv_cache(prompt_cache, quantized_kv_start, kv_group_size, kv_bits):
      if kv_bits is None: return
      for e, c in enumerate(prompt_cache):
          if hasattr(c, "to_quantized") and c.offset >= quantized_kv_start:
              prompt_cache[e] = c.to_quantized(group_size=kv_group_size, bits=kv_bits)
    Only KVCache has to_quantized (RotatingKVCache raises; QuantizedKVCache has none, so a
    converted cache is never converted again).

  generate.py, generate_step(prompt, model, prefill_step_size=2048, kv_bits=None,
  kv_group_size=64, quantized_kv_start=0, ...):
    * prefill: while more than one prompt token is left, feed min(prefill_step_size,
      remaining - 1) tokens through model(...), then call maybe_quantize (quantize_cache_fn)
      -- so the check runs after every prefill chunk's model call;
    * the last prompt token is always held back and fed alone by the first _step();
    * _step(): logits = model(tokens)[:, -1, :]; quantize_cache_fn(prompt_cache) -- after the
      model call, before sampling; logprobs = logits - logsumexp(logits); sampler(logprobs)
      (greedy here: argmax);
    * decode: every later _step(y) is one model call followed by the same check.
    So the forward that brings the offset to >= quantized_kv_start attends over the unquantized
    cache (its own keys included); the conversion happens right after it, and every later read
    is quantized. The mlx_lm.generate CLI defaults --quantized-kv-start to 5000,
    generate_step itself to 0 (then the first prefill chunk still attends unquantized: the
    check runs after its model call).

  models/cache.py:
    * KVCache.to_quantized(group_size, bits): a QuantizedKVCache with the same offset whose
      keys/values are mx.quantize(self.keys / self.values) -- the whole filled buffer, each
      position quantized independently (groups run along head_dim), so converting late gives
      the same codes as quantizing every write.
    * QuantizedKVCache(group_size, bits).update_and_fetch(k, v): the incoming keys and values are
      mx.quantize'd (triples: packed uint32 codes, scales, biases, the scales/biases in the key
      dtype -- float32 here, cinfer's CPU KV dtype, as mx.quantize keeps for float32 input) and
      written at [prev, offset) BEFORE attention; it returns the triples [..., :offset, :]. A
      cache that is a QuantizedKVCache from the start (cinfer's quantized_kv_start = -1,
      scoring) therefore quantizes every chunk's K/V before any query of that chunk reads them.
    * make_mask: create_attention_mask(N, offset): None for N == 1, else "causal".

  models/base.py:
    * scaled_dot_product_attention(q, k, v, cache, scale, mask): when hasattr(cache, "bits")
      -> quantized_scaled_dot_product_attention; else mx.fast.scaled_dot_product_attention.
    * quantized_scaled_dot_product_attention(queries, q_keys, q_values, scale, mask, group_size,
      bits): queries *= scale (first, in the query dtype); for GQA queries reshaped to
      [B, n_kv, rep, L, D] and the triples given a broadcast axis; scores =
      mx.quantized_matmul(queries, *q_keys, transpose=True) (= queries @ dequant(K)^T);
      a "causal" mask becomes q_indices = arange(kL - qL, kL), mask = q[:, None] >= k[None],
      applied as where(mask, scores, finfo(dtype).min); softmax(precise=True) (float32);
      out = mx.quantized_matmul(scores, *q_values, transpose=False) (= p @ dequant(V)).

This port: float32 arithmetic throughout (cinfer's CPU path), weights widened from bf16;
codes by make_quant_fixtures.quantize with MLX's GPU rule (running max starts at 0, round half
away from zero; the port is checked bit for bit against MLX there), scales/biases kept float32;
dequant(x) = scale * q + bias in float32 and then plain float32 matmuls. MLX's quantized_matmul
sums scale * (x . q) + bias * sum(x) per group: the same value to float32 rounding.
Model: make_rotating_fixture.Llama (the float32 llama port already used for --max-kv-size), with
its attention hook routed as scaled_dot_product_attention routes it.

Checks the script makes (it exits 1 when one fails; the numbers go into reference.json "checks"):
  * the unquantized forward against transformers' float32 logits
    (tests/fixtures/models/prose13m-ref/logits.npy): max |diff| / logit range;
  * scoring is independent of the chunking: each scoring case fed in chunks of 5 tokens agrees
    with the whole-row feed to float32 rounding;
  * sensitivity: every case rerun with float64 arithmetic (the quantizer still sees the
    float32-rounded K/V): greedy tokens equal, and the log-prob / logit differences recorded,
    which is how far float32 rounding (code flips included) can move each case.

Inputs: the prompt ids are tests/fixtures/rotating/prose13m.json's 300-token prompt (cinfer
tokenize of Persuasion's first chapter; an input, not an expectation): the generation prompt is
its first 40 ids, the scoring rows ids[0:128], ids[128:256] and ids[172:300].

Output (OUT_DIR): reference.json and gen-<case>.npy (float32 [n_logit_steps][vocab]); format in
tests/reference/README.md, section "make_kvquant_fixtures.py".
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_quant_fixtures import dequant, quantize  # noqa: E402  (MLX's quantizer port, GPU rule)
from make_rotating_fixture import Llama  # noqa: E402  (the NumPy llama port)

PREFILL_STEP = 16
N_PROMPT = 40
N_GEN = 24
MID_START = 52          # reached by the forward of generation step 12 (offset 40 + 12)
GEN_CASES = [(b, g, s) for b in (8, 4, 2) for g in (32, 64) for s in (0, MID_START)]
SCORE_CASES = [(8, 64), (4, 64), (2, 64), (4, 32), (None, None)]
SCORE_ROWS = [(0, 128), (128, 256), (172, 300)]
CODE_CASES = [(8, 32, 0), (2, 64, 0)]   # the quantized cache after the prompt, code by code


def quant_triple(x, group, bits):
    """mx.quantize(x) along the last axis of x [H][T][D] -> (codes, scales, biases) [H][T][.]"""
    H, T, D = x.shape
    wq, s, b = quantize(x.reshape(H * T, D).astype(np.float32), bits, group, "gpu", False)
    return wq.reshape(H, T, -1), s.reshape(H, T, -1), b.reshape(H, T, -1)


def dequant_triple(t, group, bits):
    wq, s, b = t
    H, T = wq.shape[:2]
    return dequant(wq.reshape(H * T, -1), s.reshape(H * T, -1), b.reshape(H * T, -1), bits, group).reshape(H, T, -1)


def causal(offset, n):
    """create_attention_mask(N, offset): None for one query, else the causal rule as a bool array"""
    if n == 1:
        return None
    return np.arange(offset, offset + n)[:, None] >= np.arange(offset + n)[None]


class KVCache:
    """models/cache.py KVCache (the 256-step preallocation is storage only: kept as a concatenation)"""

    def __init__(self):
        self.keys = self.values = None
        self.offset = 0

    def update_and_fetch(self, k, v):
        self.keys = k if self.keys is None else np.concatenate([self.keys, k], axis=1)
        self.values = v if self.values is None else np.concatenate([self.values, v], axis=1)
        self.offset += k.shape[1]
        return self.keys, self.values

    def make_mask(self, n):
        return causal(self.offset, n)

    def to_quantized(self, group_size, bits):
        q = QuantizedKVCache(group_size, bits)
        q.offset = self.offset
        if self.keys is not None:
            q.keys = quant_triple(self.keys, group_size, bits)
            q.values = quant_triple(self.values, group_size, bits)
            q.dense = (self.keys, self.values)
        return q


class QuantizedKVCache:
    """models/cache.py QuantizedKVCache: incoming K/V quantized on write, triples returned"""

    def __init__(self, group_size, bits):
        self.group_size, self.bits = group_size, bits
        self.keys = self.values = self.dense = None
        self.offset = 0

    def update_and_fetch(self, k, v):
        # self.dense: the float32 K/V as written (not part of mlx-lm's cache: for the code-level fixture)
        self.dense = (k, v) if self.dense is None else tuple(np.concatenate([a, b], axis=1) for a, b in zip(self.dense, (k, v)))
        kq, vq = quant_triple(k, self.group_size, self.bits), quant_triple(v, self.group_size, self.bits)
        if self.keys is None:
            self.keys, self.values = kq, vq
        else:
            self.keys = tuple(np.concatenate([a, b], axis=1) for a, b in zip(self.keys, kq))
            self.values = tuple(np.concatenate([a, b], axis=1) for a, b in zip(self.values, vq))
        self.offset += k.shape[1]
        return self.keys, self.values

    def make_mask(self, n):
        return causal(self.offset, n)


class QLlama(Llama):
    """the llama port with models/base.py's scaled_dot_product_attention dispatch"""

    def attention(self, q, k, v, cache, mask):
        if not hasattr(cache, "bits"):
            return super().attention(q, k, v, cache, mask)
        Kt, Vt = cache.update_and_fetch(k, v)
        K = dequant_triple(Kt, cache.group_size, cache.bits).astype(self.dt)
        V = dequant_triple(Vt, cache.group_size, cache.bits).astype(self.dt)
        q = q * self.dt(self.hd ** -0.5)              # queries *= scale, first
        g = self.nh // self.nkv
        out = np.empty(q.shape, self.dt)
        for hh in range(self.nh):
            s = q[hh] @ K[hh // g].T                  # quantized_matmul(q, *K, transpose=True)
            if mask is not None:
                s = np.where(mask, s, np.finfo(self.dt).min)
            s = np.exp(s - s.max(-1, keepdims=True))  # softmax(precise=True)
            out[hh] = (s / s.sum(-1, keepdims=True)) @ V[hh // g]   # quantized_matmul(p, *V)
        return out


def logsumexp(x):
    m = x.max(-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[..., 0]


def prompt_cache(model, prompt, step, bits, group, start):
    """the per-layer caches after generate_step's prefill and its first _step (the whole prompt)"""
    caches = []
    generate(model, prompt, 1, step, bits, group, start, out_caches=caches)
    return caches


def generate(model, prompt, n_gen, step, bits, group, start, forced=None, out_caches=None):
    """generate_step with a greedy sampler (forced: feed these tokens instead of the argmax);
    start -1: QuantizedKVCache from the first write.
    Returns tokens, chosen log-probs, logsumexps, per-step logits and where the conversion happened
    (the generation step whose forward triggered it, -1 = a prefill chunk; None = never)."""
    n_layer = model.cfg["num_hidden_layers"]
    caches = [QuantizedKVCache(group, bits) if start == -1 else KVCache() for _ in range(n_layer)]
    conv = {"step": None, "offset": None}

    def maybe_quantize(at_step):
        if bits is None:
            return
        for e, c in enumerate(caches):
            if hasattr(c, "to_quantized") and c.offset >= start:
                caches[e] = c.to_quantized(group, bits)
                conv["step"], conv["offset"] = at_step, c.offset

    done = 0
    while len(prompt) - done > 1:
        k = min(step, len(prompt) - done - 1)
        model.forward(np.array(prompt[done:done + k]), caches)
        maybe_quantize(-1)
        done += k
    toks, lps, lses, logits, margins = [], [], [], [], []
    feed = prompt[-1]
    for i in range(n_gen):
        lg = model.forward(np.array([feed]), caches)
        maybe_quantize(i)
        lse = float(logsumexp(lg))
        t = int(np.argmax(lg))
        toks.append(t)
        lps.append(float(lg[t] - lse))
        margins.append(float(lg[t] - np.partition(lg, -2)[-2]))
        lses.append(lse)
        logits.append(lg.astype(np.float32))
        feed = t if forced is None else forced[i]
    conv["min_margin"], conv["margins"] = min(margins), margins
    if out_caches is not None:
        out_caches.extend(caches)
    return toks, lps, lses, np.stack(logits), conv


def score(model, row, bits, group, chunk=None):
    """mlx_lm.perplexity's position scores with a QuantizedKVCache from position 0 (bits None: a
    KVCache): row[:-1] fed (in chunks of `chunk` tokens, or at once), log p(row[p+1]) per p"""
    n_layer = model.cfg["num_hidden_layers"]
    caches = [KVCache() if bits is None else QuantizedKVCache(group, bits) for _ in range(n_layer)]
    ids = np.array(row[:-1])
    chunk = chunk or len(ids)
    lg = np.concatenate([model.forward(ids[a:a + chunk], caches, all_logits=True) for a in range(0, len(ids), chunk)])
    return (lg[np.arange(len(ids)), row[1:]] - logsumexp(lg)).tolist()


def case_name(bits, group, start):
    return "plain" if bits is None else "b%d-g%d-s%d" % (bits, group, start)


def main():
    mdir, out = sys.argv[1], sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    fx = os.path.join(here, "..", "fixtures")
    cfg = json.load(open(os.path.join(mdir, "config.json")))
    m32, m64 = QLlama(mdir, cfg, np.float32), QLlama(mdir, cfg, np.float64)
    ok = True
    checks = {}

    # the unquantized forward against transformers (float32)
    ref = json.load(open(os.path.join(fx, "models/prose13m-ref/reference.json")))
    tl = np.load(os.path.join(fx, "models/prose13m-ref/logits.npy"))
    mine = m32.forward(np.array(ref["tokens"]), [KVCache() for _ in range(cfg["num_hidden_layers"])], all_logits=True)
    e = float(np.abs(mine - tl).max() / (tl.max() - tl.min()))
    checks["forward_vs_transformers_rel_range"] = e
    print("unquantized forward vs transformers prose13m-ref/logits.npy: max |diff| / range = %.3g (bar 1e-4)" % e)
    ok &= e <= 1e-4

    ids = json.load(open(os.path.join(fx, "rotating/prose13m.json")))["cases"][1]["prompt"]
    prompt = ids[:N_PROMPT]
    os.makedirs(out, exist_ok=True)
    gen = []
    for bits, group, start in [(None, None, None)] + GEN_CASES:
        name = case_name(bits, group, start)
        toks, lps, lses, lg, conv = generate(m32, prompt, N_GEN, PREFILL_STEP, bits, group, start)
        t64, l64, _, g64, _ = generate(m64, prompt, N_GEN, PREFILL_STEP, bits, group, start)
        if bits is None:
            steps = [0, 12, 13, N_GEN - 1]            # the mid-start cases' steps, for comparison
        elif conv["step"] == -1:
            steps = [0, 1, N_GEN - 1]                 # converted in the prefill: step 0 reads quantized
        else:
            steps = [0, conv["step"], conv["step"] + 1, N_GEN - 1]
        f = "gen-%s.npy" % name
        np.save(os.path.join(out, f), np.ascontiguousarray(lg[steps], dtype="<f4"), allow_pickle=False)
        rng = float(lg[steps].max() - lg[steps].min())
        c = {"name": name, "kv_bits": bits, "kv_group_size": group, "quantized_kv_start": start,
             "converted_after_step": conv["step"], "conversion_offset": conv["offset"],
             "tokens": toks, "logprobs": lps, "logsumexp": lses, "logits_steps": steps, "logits_file": f,
             "logit_range": rng,
             "min_top2_margin": conv["min_margin"], "top2_margin": conv["margins"],
             "f64_tokens_equal": t64 == toks,
             "f64_logprob_diff": np.abs(np.array(l64) - np.array(lps)).tolist(),
             "f64_max_logprob_diff": float(np.abs(np.array(l64) - np.array(lps)).max()),
             "f64_max_logit_diff_rel_range": float(np.abs(g64[steps] - lg[steps]).max() / rng)}
        gen.append(c)
        print("%-12s conv after step %-4s offset %-4s min top-2 margin %.3f | f64: tokens %s, lp max %.2g median %.2g, "
              "logits %.2g of range" % (name, conv["step"], conv["offset"], conv["min_margin"],
                                        "equal" if t64 == toks else "DIFFER", c["f64_max_logprob_diff"],
                                        float(np.median(c["f64_logprob_diff"])), c["f64_max_logit_diff_rel_range"]),
              flush=True)
        ok &= t64 == toks

    # the quantized cases must differ from the plain one (else the fixture could not tell them apart)
    plain = gen[0]
    for c in gen[1:]:
        # the unquantized cache along this case's tokens: how far quantizing moves each step
        _, along, _, _, _ = generate(m32, prompt, N_GEN, PREFILL_STEP, None, None, None, forced=c["tokens"])
        lp = np.array(along)
        reads = [i for i in range(N_GEN) if i > c["converted_after_step"]]
        c["plain_logprobs_along"] = along
        c["median_effect_on_code_reads"] = float(np.median(np.abs(np.array(c["logprobs"])[reads] - lp[reads])))
        d = np.abs(np.array(c["logprobs"]) - np.array(plain["logprobs"]))
        c["max_logprob_diff_vs_plain"], c["median_logprob_diff_vs_plain"] = float(d.max()), float(np.median(d))
        c["tokens_equal_plain"] = c["tokens"] == plain["tokens"]

    # code level: the quantized cache after the prompt, codes/scales/biases and the float32 K/V they
    # were quantized from, stacked [layer][K, V][kv head] -> [layers * 2 * n_kv][T][width]
    codes = []
    for bits, group, start in CODE_CASES:
        caches = prompt_cache(m32, prompt, PREFILL_STEP, bits, group, start)
        name = case_name(bits, group, start)
        parts = {"dense": [], "codes": [], "scales": [], "biases": []}
        for c in caches:
            for kv in range(2):
                parts["dense"].append(c.dense[kv])
                for i, nm in enumerate(("codes", "scales", "biases")):
                    parts[nm].append((c.keys, c.values)[kv][i])
        files = {}
        for nm, arrs in parts.items():
            a = np.concatenate(arrs, axis=0)
            files[nm] = "cache-%s-%s.npy" % (name, nm)
            np.save(os.path.join(out, files[nm]), np.ascontiguousarray(a, dtype="<u4" if nm == "codes" else "<f4"),
                    allow_pickle=False)
        codes.append({"name": name, "kv_bits": bits, "kv_group_size": group, "quantized_kv_start": start,
                      "tokens": len(prompt), "files": files})
        print("code-level cache %s: %s" % (name, {k: list(np.load(os.path.join(out, f)).shape) for k, f in files.items()}))

    rows = [ids[a:b] for a, b in SCORE_ROWS]
    sc = []
    for bits, group in SCORE_CASES:
        name = "plain" if bits is None else "b%d-g%d" % (bits, group)
        lp = [score(m32, r, bits, group) for r in rows]
        lp5 = [score(m32, r, bits, group, chunk=5) for r in rows]
        l64 = [score(m64, r, bits, group) for r in rows]
        a5, a64 = np.abs(np.array(lp5) - np.array(lp)), np.abs(np.array(l64) - np.array(lp))
        c = {"name": name, "kv_bits": bits, "kv_group_size": group, "logprobs": lp,
             "chunk5_max_diff": float(a5.max()), "chunk5_median_diff": float(np.median(a5)),
             "f64_max_diff": float(a64.max()), "f64_median_diff": float(np.median(a64)),
             "mean_nll": float(-np.mean(lp))}
        sc.append(c)
        print("score %-7s mean nll %.5f | chunks of 5 vs whole row: max %.2g median %.2g | f64: max %.2g median %.2g" % (
            name, c["mean_nll"], a5.max(), np.median(a5), a64.max(), np.median(a64)), flush=True)
        # float32 rounding alone (the unquantized case) stays at rounding level everywhere; with codes, a
        # rounding-level change of K/V flips the odd code by one step, so only the median stays small
        ok &= (a5.max() <= 1e-4 and a64.max() <= 1e-4) if bits is None else (np.median(a5) <= 1e-4 and np.median(a64) <= 1e-4)
    for c in sc[:-1]:
        d = np.abs(np.array(c["logprobs"]) - np.array(sc[-1]["logprobs"]))
        c["max_diff_vs_plain"], c["median_diff_vs_plain"] = float(d.max()), float(np.median(d))
    checks["scoring_chunk5_max_diff"] = max(c["chunk5_max_diff"] for c in sc)
    checks["scoring_noise_max"] = max(max(c["chunk5_max_diff"], c["f64_max_diff"]) for c in sc)
    checks["scoring_noise_median_max"] = max(max(c["chunk5_median_diff"], c["f64_median_diff"]) for c in sc)
    checks["scoring_effect_median_min"] = min(c["median_diff_vs_plain"] for c in sc[:-1])
    checks["gen_noise_max"] = max(c["f64_max_logprob_diff"] for c in gen)
    checks["gen_noise_logit_rel_max"] = max(c["f64_max_logit_diff_rel_range"] for c in gen)
    checks["gen_min_top2_margin"] = min(c["min_top2_margin"] for c in gen)
    checks["gen_effect_median_min"] = min(c["median_effect_on_code_reads"] for c in gen[1:])

    json.dump({"generator": "tests/reference/make_kvquant_fixtures.py", "numpy": np.__version__,
               "model": "prose-13m",
               "reference": "numpy float32 port of mlx-lm's KVCache.to_quantized, QuantizedKVCache, "
                            "quantized_scaled_dot_product_attention and generate_step (maybe_quantize_kv_cache)",
               "prompt": prompt, "prefill_step_size": PREFILL_STEP, "n_gen": N_GEN, "checks": checks,
               "generation": gen, "cache_after_prompt": codes,
               "scoring": {"rows": rows, "note": "each row's first L-1 tokens fed from position 0 with a "
                           "QuantizedKVCache (plain: KVCache); logprobs[r][p] = log p(rows[r][p+1])",
                           "cases": sc}},
              open(os.path.join(out, "reference.json"), "w"), indent=1)
    print("checks:", json.dumps(checks), "->", "ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

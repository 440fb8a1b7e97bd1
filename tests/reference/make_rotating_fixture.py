#!/usr/bin/env python3
"""make_rotating_fixture.py -- mlx-lm's `--max-kv-size` generation on prose-13m,
recomputed independently with NumPy in float32, for tests/test-rotating.c.

What it reproduces (read from mlx-lm 0.32's source, not run: MLX does not run
here):
  * models/cache.py RotatingKVCache(max_size=N, keep=4): _update_concat for
    multi-token updates (temporal order, trim to max_size - 1, append),
    _update_in_place for single tokens (grow by step 256, trim to max_size,
    ring wrapping to keep), make_mask (N > 1: create_causal_mask over buffer
    indices with offset min(max_size - 1, offset) and window max_size, or
    "causal"; N == 1: no mask);
  * models/llama.py with the parameters cast to float32 (RMSNorm, rotate-half
    RoPE on the cache offset, GQA SDPA with softmax in float32, SwiGLU, tied
    head);
  * generate.py generate_step: the prompt minus its last token in steps of
    prefill_step_size, then the last token alone; greedy argmax; the yielded
    log-probs are logits - logsumexp(logits) (no logits processors here).

The keys and values are kept as buffers of real arrays (a literal port), not
as a mask over positions, so this checks cinfer's position-based rule from the
outside. Weights: the bf16 safetensors shards, widened to float32 (parsed
here: safetensors needs no package). Prompt ids are given (cinfer tokenize on
Persuasion's first chapter, an input, not an expectation).

Usage: python3 make_rotating_fixture.py MODEL_DIR OUT.json
"""
import json
import struct
import sys

import numpy as np


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = np.frombuffer(data[a:b], dtype=np.uint16 if t["dtype"] == "BF16" else np.float32)
        if t["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = raw.reshape(t["shape"]).astype(np.float32)
    return out


class RotatingKVCache:
    step = 256

    def __init__(self, max_size, keep):
        self.max_size, self.keep = max_size, keep
        self.keys = self.values = None
        self.offset = 0
        self._idx = 0

    def _trim(self, trim_size, v, append=None):
        parts = [v[:, :self.keep], v[:, trim_size + self.keep:]] if trim_size > 0 else [v]
        if append is not None:
            parts.append(append)
        return np.concatenate(parts, axis=1)

    def _temporal_order(self, v):
        if self._idx == v.shape[1]:
            return v
        if self._idx < self.offset:
            return np.concatenate([v[:, :self.keep], v[:, self._idx:], v[:, self.keep:self._idx]], axis=1)
        return v[:, :self._idx]

    def _update_concat(self, k, v):
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = self._temporal_order(self.keys)
            self.values = self._temporal_order(self.values)
            self._idx = self.keys.shape[1]
            trim = self._idx - self.max_size + 1
            self.keys = self._trim(trim, self.keys, k)
            self.values = self._trim(trim, self.values, v)
        self.offset += k.shape[1]
        self._idx = self.keys.shape[1]
        return self.keys, self.values

    def _update_in_place(self, k, v):
        prev = self.offset
        if self.keys is None or (prev >= self.keys.shape[1] and self.keys.shape[1] < self.max_size):
            new = min(self.step, self.max_size - prev)
            z = np.zeros((k.shape[0], new, k.shape[2]), k.dtype)
            self.keys = z.copy() if self.keys is None else np.concatenate([self.keys, z], axis=1)
            self.values = z.copy() if self.values is None else np.concatenate([self.values, z], axis=1)
            self._idx = prev
        trim = self.keys.shape[1] - self.max_size
        if trim > 0:
            self.keys = self._trim(trim, self.keys)
            self.values = self._trim(trim, self.values)
            self._idx = self.max_size
        if self._idx == self.max_size:
            self._idx = self.keep
        self.keys[:, self._idx:self._idx + 1] = k
        self.values[:, self._idx:self._idx + 1] = v
        self.offset += 1
        self._idx += 1
        if self.offset < self.max_size:
            return self.keys[:, :self.offset], self.values[:, :self.offset]
        return self.keys, self.values

    def update_and_fetch(self, k, v):
        return self._update_in_place(k, v) if k.shape[1] == 1 else self._update_concat(k, v)

    def make_mask(self, n):
        """boolean [n][keys] (True = visible) or None for no mask"""
        if n == 1:
            return None
        off = min(self.max_size - 1, self.offset)
        kl = off + n
        q = np.arange(off, off + n)[:, None]
        kk = np.arange(kl)[None]
        mask = q >= kk
        if off + n > self.max_size:
            mask &= q < kk + self.max_size
        return mask


class Llama:
    """models/llama.py in NumPy; dt is the arithmetic dtype (float32; make_kvquant_fixtures.py
    also runs it in float64 to measure how much float32 rounding moves its results).
    attention() is the hook for other caches: it writes k, v and attends."""
    def __init__(self, d, cfg, dt=np.float32):
        self.dt = dt
        self.w = {}
        for f in sorted(__import__("glob").glob(d + "/*.safetensors")):
            self.w.update({k: v.astype(dt) for k, v in load_safetensors(f).items()})
        self.cfg = cfg
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or cfg["hidden_size"] // self.nh
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
        self.inv = (1.0 / theta ** (np.arange(0, self.hd, 2, dtype=np.float32) / self.hd)).astype(np.float32).astype(dt)
        self.eps = cfg["rms_norm_eps"]

    def norm(self, x, w):
        return (x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w).astype(self.dt)

    def rope(self, x, off):  # x [heads][L][hd], rotate-half (nn.RoPE traditional=False)
        L = x.shape[1]
        ang = (np.arange(off, off + L, dtype=self.dt)[:, None] * self.inv[None]).astype(self.dt)
        c, s = np.cos(ang), np.sin(ang)
        h = self.hd // 2
        a, b = x[..., :h], x[..., h:]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1).astype(self.dt)

    def attention(self, q, k, v, cache, mask):
        """q [heads][L][hd], k/v [kv heads][L][hd]: the cache's keys and values after this
        write, attended as mx.fast.scaled_dot_product_attention (queries scaled first,
        softmax in the arithmetic dtype); mask boolean [L][keys] or None"""
        K, V = cache.update_and_fetch(k, v)
        g = self.nh // self.nkv
        out = np.empty(q.shape, self.dt)
        for hh in range(self.nh):
            s = (q[hh] * self.dt(self.hd ** -0.5)) @ K[hh // g].T
            if mask is not None:
                s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            out[hh] = (s / s.sum(-1, keepdims=True)) @ V[hh // g]
        return out

    def forward(self, ids, caches, all_logits=False):
        """logits (float64) of the last position [vocab], or of every position [L][vocab]"""
        x = self.w["model.embed_tokens.weight"][ids]
        L = len(ids)
        mask = caches[0].make_mask(L)
        for i, cache in enumerate(caches):
            p = "model.layers.%d." % i
            h = self.norm(x, self.w[p + "input_layernorm.weight"])
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).reshape(L, self.nh, self.hd).transpose(1, 0, 2)
            k = (h @ self.w[p + "self_attn.k_proj.weight"].T).reshape(L, self.nkv, self.hd).transpose(1, 0, 2)
            v = (h @ self.w[p + "self_attn.v_proj.weight"].T).reshape(L, self.nkv, self.hd).transpose(1, 0, 2)
            q, k = self.rope(q, cache.offset), self.rope(k, cache.offset)
            out = self.attention(q, k, v, cache, mask)
            x = x + out.transpose(1, 0, 2).reshape(L, -1) @ self.w[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, self.w[p + "post_attention_layernorm.weight"])
            a = h @ self.w[p + "mlp.gate_proj.weight"].T
            b = h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + ((a / (1 + np.exp(-a))) * b) @ self.w[p + "mlp.down_proj.weight"].T
        x = self.norm(x if all_logits else x[-1:], self.w["model.norm.weight"])
        head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        lg = (x @ head.T).astype(np.float64)
        return lg if all_logits else lg[0]


def generate(model, prompt, n_gen, max_kv, step):
    caches = [RotatingKVCache(max_kv, 4) for _ in range(model.cfg["num_hidden_layers"])]
    done = 0
    while len(prompt) - done > 1:
        k = min(step, len(prompt) - done - 1)
        model.forward(np.array(prompt[done:done + k]), caches)
        done += k
    logits = model.forward(np.array(prompt[-1:]), caches)
    toks, lps = [], []
    for _ in range(n_gen):
        lp = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
        t = int(np.argmax(logits))
        toks.append(t)
        lps.append(float(lp[t]))
        logits = model.forward(np.array([t]), caches)
    return toks, lps


def main():
    d, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(d + "/config.json"))
    model = Llama(d, cfg)
    ids = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else None
    cases = []
    for name, n_prompt, n_gen, max_kv, step in [("short prompt, window passed while generating", 40, 120, 64, 2048),
                                                ("long prompt in 3 prefill steps", 300, 60, 96, 128)]:
        prompt = ids[:n_prompt]
        toks, lps = generate(model, prompt, n_gen, max_kv, step)
        cases.append({"name": name, "prompt": prompt, "max_kv_size": max_kv, "prefill_step_size": step,
                      "tokens": toks, "logprobs": lps})
        print(name, toks[:12], file=sys.stderr)
    json.dump({"model": "prose-13m", "reference": "numpy float32 port of mlx-lm 0.32 RotatingKVCache(N, keep=4) "
               "+ llama + generate_step", "cases": cases}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()

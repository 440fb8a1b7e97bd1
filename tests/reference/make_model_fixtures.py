#!/usr/bin/env python3
"""Golden-logit fixtures for cinfer's model forward (issue 2, "Golden logits").

What it is: builds tiny random-weight Hugging Face models (llama, mistral,
qwen2, qwen3) with transformers, saves each as a model directory with a token
sequence and transformers' logits, and records transformers' logits for the
two real models in ../shared/models (stories260k, prose-13m) without copying
their weights.  The C tests (written separately) load these directories and
compare cinfer's logits with logits.npy.

Invariants:
  * Everything runs on the CPU in float32 (no TF32, no GPU), seeds fixed, so a
    rerun gives the same files bit for bit on the same software.
  * logits.npy is always transformers' float32 forward on the SAVED weights:
    for bf16/f16 cases the directory is reloaded with dtype=torch.float32, so
    the weights are the rounded values and the arithmetic is float32.
  * logits_native.npy (bf16/f16 cases only) is transformers computing in the
    weights' own dtype, cast to float32: compare with it only loosely.
  * Every fixture is reloaded from disk after writing and recomputed; the run
    fails (exit 1) if the reload disagrees.
  * .npy files are NumPy format v1.0, little-endian '<f4', C order,
    shape [len(tokens), vocab].

Runs on the GPU machine (PyTorch 2.11, transformers 5.17, tokenizers 0.23,
safetensors, numpy); see tests/reference/README.md for the exact command.
"""

import argparse
import copy
import json
import math
import os
import shutil
import sys
import tarfile
import traceback

import numpy as np
import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_grad_enabled(False)
torch.use_deterministic_algorithms(True)

import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ATTN = "eager"  # the textbook math; softmax is done in float32 by transformers

FAILURES = []


def fail(msg):
    print("FAIL: " + msg, flush=True)
    FAILURES.append(msg)


# --------------------------------------------------------------------------
# Tiny random-weight cases
# --------------------------------------------------------------------------

def base(**kw):
    d = dict(vocab_size=256, hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, rms_norm_eps=1e-5,
             bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
             hidden_act="silu")
    d.update(kw)
    return d


# name -> (config class, model class, config kwargs, weights dtype, n tokens,
#          seed, extra options, notes)
CASES = [
    ("llama-f32", LlamaConfig, LlamaForCausalLM,
     base(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     "float32", 14, 101, {},
     "llama, GQA 4 heads / 2 kv heads, head_dim 16, untied lm_head, f32"),
    ("llama-tied-bf16", LlamaConfig, LlamaForCausalLM,
     base(tie_word_embeddings=True,
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     "bfloat16", 14, 102, {},
     "llama, GQA 4/2, tie_word_embeddings=true (no lm_head.weight in the file), bf16 weights"),
    ("llama-f16", LlamaConfig, LlamaForCausalLM,
     base(num_key_value_heads=4,
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     "float16", 14, 103, {},
     "llama, kv heads == heads (4/4, no GQA), untied, f16 weights"),
    ("llama3-rope-f32", LlamaConfig, LlamaForCausalLM,
     base(num_attention_heads=2, num_key_value_heads=1, head_dim=32,
          rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                           "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 64}),
     "float32", 16, 104, {"legacy_rope": True, "eos_list": [2, 3]},
     "llama, GQA 2/1, head_dim 32, llama3 RoPE scaling (factor 8, low 1, high 4, "
     "original_max_position_embeddings 64, theta 500000). config.json rewritten to "
     "transformers-4 style: top-level rope_theta + rope_scaling, no rope_parameters. "
     "With head_dim 32 the 16 frequencies fall in all three llama3 regimes "
     "(kept, smoothed, divided by factor). generation_config.json eos_token_id is a list [2, 3]."),
    ("llama-linear-f32", LlamaConfig, LlamaForCausalLM,
     base(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
     "float32", 16, 105, {},
     "llama, GQA 4/2, linear RoPE scaling factor 4 (inv_freq / 4), transformers-5 "
     "style rope_parameters kept in config.json"),
    ("llama-sharded-f32", LlamaConfig, LlamaForCausalLM,
     base(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     "float32", 12, 106, {"shard": "100KB"},
     "llama, GQA 4/2, untied, f32, saved in several shards + model.safetensors.index.json"),
    ("mistral-f32", MistralConfig, MistralForCausalLM,
     base(vocab_size=300, sliding_window=None,
          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
     "float32", 14, 107, {},
     "mistral, GQA 4/2, sliding_window null, vocab 300 (not a power of 2), theta 1e6, untied, f32"),
    ("qwen2-f32", Qwen2Config, Qwen2ForCausalLM,
     base(tie_word_embeddings=True, rms_norm_eps=1e-6,
          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
     "float32", 14, 108, {},
     "qwen2, q/k/v projections with bias (random, non-zero), GQA 4/2, tied, theta 1e6, f32"),
    ("qwen2-bf16", Qwen2Config, Qwen2ForCausalLM,
     base(rms_norm_eps=1e-6,
          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
     "bfloat16", 14, 109, {},
     "qwen2, q/k/v bias, GQA 4/2, untied, bf16 weights"),
    ("qwen3-f32", Qwen3Config, Qwen3ForCausalLM,
     base(head_dim=32, rms_norm_eps=1e-6,
          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
     "float32", 14, 110, {},
     "qwen3, q_norm/k_norm RMSNorm over head_dim, explicit head_dim 32 != hidden/heads (16): "
     "q_proj 64->128, k/v 64->64, o_proj 128->64; GQA 4/2, untied, f32"),
    ("qwen3-bf16", Qwen3Config, Qwen3ForCausalLM,
     base(head_dim=32, tie_word_embeddings=True, rms_norm_eps=1e-6,
          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
     "bfloat16", 14, 111, {},
     "qwen3, q/k norm, head_dim 32, GQA 4/2, tied, bf16 weights"),
    # issue 14: long rows (GEMM attention on the CPU, flash attention on CUDA: head_dim 64, L >= 16)
    # and sliding windows compared with transformers; logits_kv_f16.npy for the f16 KV cache
    ("llama-long-f32", LlamaConfig, LlamaForCausalLM,
     base(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
          tie_word_embeddings=True, max_position_embeddings=512,
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     "float32", 300, 112, {"kv_f16": True},
     "llama, 300 tokens, head_dim 64, GQA 2/1, tied, f32: long rows (GEMM / flash attention paths)"),
    ("mistral-window4-f32", MistralConfig, MistralForCausalLM,
     base(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
          tie_word_embeddings=True, sliding_window=4,
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     "float32", 40, 113, {"kv_f16": True, "window_matters": True},
     "mistral, sliding_window 4 over 40 tokens (each query sees itself and the 3 keys before), head_dim 64, "
     "GQA 2/1, tied, f32"),
    ("mistral-window-long-f32", MistralConfig, MistralForCausalLM,
     base(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
          tie_word_embeddings=True, sliding_window=64, max_position_embeddings=512,
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     "float32", 300, 114, {"kv_f16": True, "window_matters": True},
     "mistral, sliding_window 64 over 300 tokens, head_dim 64, GQA 2/1, tied, f32"),
]


def patch_kv_f16(on):
    """transformers' eager attention with K and V rounded to float16 (after RoPE,
    as a float16 KV cache stores them); queries and arithmetic stay float32."""
    import importlib
    for mod in ("llama", "mistral", "qwen2", "qwen3"):
        ml = importlib.import_module("transformers.models.%s.modeling_%s" % (mod, mod))
        if not hasattr(ml, "_cinfer_eager"):
            ml._cinfer_eager = ml.eager_attention_forward
        orig = ml._cinfer_eager
        if on:
            def f16(module, q, k, v, mask, _o=orig, **kw):
                return _o(module, q, k.to(torch.float16).to(torch.float32), v.to(torch.float16).to(torch.float32),
                          mask, **kw)
            ml.eager_attention_forward = f16
        else:
            ml.eager_attention_forward = orig


def init_weights(model, seed):
    """Large, visible random weights: norms 1 +- 0.2, biases non-zero."""
    g = torch.Generator().manual_seed(seed)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        shape = tuple(p.shape)
        if name.endswith("norm.weight"):
            v = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif name.endswith(".bias"):
            v = 0.2 * torch.randn(shape, generator=g)
        elif name.endswith("embed_tokens.weight"):
            v = 0.5 * torch.randn(shape, generator=g)
        elif name == "lm_head.weight":
            v = 0.3 * torch.randn(shape, generator=g)
        elif name.endswith("down_proj.weight"):
            v = 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("_proj.weight"):
            v = 0.15 * torch.randn(shape, generator=g)
        else:
            raise RuntimeError("no init rule for parameter " + name)
        p.copy_(v.to(p.dtype))
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), \
            "tied model does not share embed/lm_head"


def logits_of(model, tokens):
    ids = torch.tensor([tokens], dtype=torch.long)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return out.logits[0].to(torch.float32).cpu().numpy()


def save_npy(path, arr):
    a = np.ascontiguousarray(np.asarray(arr, dtype="<f4"))
    np.save(path, a, allow_pickle=False)
    with open(path, "rb") as f:
        magic = f.read(8)
    assert magic == b"\x93NUMPY\x01\x00", "unexpected .npy version in " + path


def rope_info(model):
    rot = getattr(model.model, "rotary_emb", None)
    if rot is None:
        return None, None
    inv = getattr(rot, "inv_freq", None)
    scale = getattr(rot, "attention_scaling", None)
    return (None if inv is None else [float(x) for x in inv.float().cpu().tolist()],
            None if scale is None else float(scale))


def llama3_inv_freq(theta, dim, factor, low, high, old):
    inv = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float64) / dim))
    lw, hw = old / low, old / high
    out = []
    for f in inv:
        wl = 2 * math.pi / f
        if wl < hw:
            out.append(f)
        elif wl > lw:
            out.append(f / factor)
        else:
            s = (old / wl - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return np.array(out)


def edit_json(path, fn):
    with open(path) as f:
        d = json.load(f)
    d = fn(d)
    with open(path, "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
        f.write("\n")


def list_safetensors(d):
    from safetensors import safe_open
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), framework="pt") as f:
                for k in f.keys():
                    t = f.get_slice(k)
                    out[k] = (fn, str(t.get_dtype()), list(t.get_shape()))
    return out


def make_tiny(root, case):
    name, cfg_cls, model_cls, cfg_kw, wdt, ntok, seed, opts, notes = case
    print("\n=== %s ===" % name, flush=True)
    d = os.path.join(root, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    dt = DTYPES[wdt]

    torch.manual_seed(seed)
    cfg = cfg_cls(**cfg_kw)
    try:
        cfg._attn_implementation = ATTN
    except Exception as e:  # the in-memory model then uses the default kernel
        print("note: could not select %s attention: %s" % (ATTN, e))
    model = model_cls(cfg).to(torch.float32).eval()
    init_weights(model, seed)
    if dt != torch.float32:  # round the weights, keep float32 arithmetic
        for _, p in model.named_parameters():
            p.copy_(p.to(dt).to(torch.float32))

    rs = np.random.RandomState(seed)
    tokens = [1] + [int(x) for x in rs.randint(3, cfg.vocab_size, size=ntok - 1)]
    tokens[7] = tokens[3]  # a repeated id
    ref_mem = logits_of(model, tokens)
    inv_freq, attn_scale = rope_info(model)

    # the RoPE frequencies transformers uses must follow the formula of the case
    rp = cfg_kw["rope_parameters"]
    hd = cfg_kw.get("head_dim", cfg_kw["hidden_size"] // cfg_kw["num_attention_heads"])
    if rp["rope_type"] == "llama3":
        want = llama3_inv_freq(rp["rope_theta"], hd, rp["factor"], rp["low_freq_factor"],
                               rp["high_freq_factor"], rp["original_max_position_embeddings"])
    else:
        want = 1.0 / (rp["rope_theta"] ** (np.arange(0, hd, 2).astype(np.float64) / hd))
        if rp["rope_type"] == "linear":
            want = want / rp["factor"]
    got = np.array(inv_freq)
    err = float(np.max(np.abs(got - want) / want))
    print("%s inv_freq (%d) vs formula: max rel err %.3g; attention_scaling %s"
          % (rp["rope_type"], len(got), err, attn_scale))
    if err > 1e-5 or (attn_scale is not None and attn_scale != 1.0):
        fail("%s: inv_freq does not follow the %s formula (rel err %g)" % (name, rp["rope_type"], err))

    # save
    save_model = model if dt == torch.float32 else copy.deepcopy(model).to(dt)
    kw = {}
    if "shard" in opts:
        kw["max_shard_size"] = opts["shard"]
    save_model.save_pretrained(d, **kw)
    if save_model is not model:
        del save_model

    # post-edit config.json
    def fix_cfg(c):
        c["dtype"] = wdt
        c.pop("torch_dtype", None)
        for k in [k for k in c if k.startswith("_attn_implementation")]:
            c.pop(k)
        if opts.get("legacy_rope"):
            rp = dict(c.pop("rope_parameters"))
            c["rope_theta"] = float(rp.pop("rope_theta"))
            c["rope_scaling"] = rp
        return c
    edit_json(os.path.join(d, "config.json"), fix_cfg)
    gpath = os.path.join(d, "generation_config.json")
    if not os.path.exists(gpath):
        print("note: save_pretrained wrote no generation_config.json; writing one")
        with open(gpath, "w") as f:
            json.dump({"bos_token_id": 1, "eos_token_id": 2}, f, indent=2)
    if "eos_list" in opts:
        def fix_gen(g):
            g["eos_token_id"] = opts["eos_list"]
            return g
        edit_json(gpath, fix_gen)

    # check what was written
    tensors = list_safetensors(d)
    shards = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    print("files:", sorted(os.listdir(d)))
    for k, v in sorted(tensors.items()):
        print("  %-48s %-26s %-5s %s" % (k, v[0], v[1], v[2]))
    bad = [k for k, v in tensors.items() if v[1] != {"float32": "F32", "bfloat16": "BF16",
                                                      "float16": "F16"}[wdt]]
    if bad:
        fail("%s: tensors not in %s: %s" % (name, wdt, bad))
    tied = cfg_kw.get("tie_word_embeddings", False)
    if tied and "lm_head.weight" in tensors:
        fail("%s: tied model saved lm_head.weight" % name)
    if not tied and "lm_head.weight" not in tensors:
        fail("%s: untied model has no lm_head.weight" % name)
    if "shard" in opts:
        if len(shards) < 2 or not os.path.exists(os.path.join(d, "model.safetensors.index.json")):
            fail("%s: expected 2+ shards with an index, got %s" % (name, shards))
    elif shards != ["model.safetensors"]:
        fail("%s: expected one model.safetensors, got %s" % (name, shards))

    # reload from disk: float32 arithmetic on the saved (rounded) weights
    m32 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation=ATTN).eval()
    logits = logits_of(m32, tokens)
    inv2, _ = rope_info(m32)
    if inv_freq is not None and inv2 is not None:
        e = float(np.max(np.abs(np.array(inv2) - np.array(inv_freq)) / np.array(inv_freq)))
        if e > 1e-6:
            fail("%s: reloaded config gives different inv_freq (max diff %g)" % (name, e))
    rng = float(logits.max() - logits.min())
    if opts.get("kv_f16"):
        patch_kv_f16(True)
        try:
            kvh = logits_of(m32, tokens)
        finally:
            patch_kv_f16(False)
        e = float(np.max(np.abs(kvh - logits)))
        print("f16 KV logits vs f32 KV: max diff %.4g = %.3g of range" % (e, e / rng))
        if not 0 < e < 1e-2 * rng:
            fail("%s: f16-KV logits differ from f32 by %g (patch not applied, or too far)" % (name, e))
        save_npy(os.path.join(d, "logits_kv_f16.npy"), kvh)
    if opts.get("window_matters"):
        sw = m32.config.sliding_window  # the mask is built from the config at each call
        m32.config.sliding_window = None
        full = logits_of(m32, tokens)
        m32.config.sliding_window = sw
        e = float(np.max(np.abs(full - logits)))
        print("sliding window vs none: max diff %.4g = %.3g of range" % (e, e / rng))
        if e < 1e-2 * rng:
            fail("%s: the sliding window changes the logits by only %g" % (name, e))
    diff = float(np.max(np.abs(logits - ref_mem)))
    print("logits [%d x %d]: min %.4f max %.4f range %.4f max|logit| %.4f; reload vs in-memory max diff %.3g"
          % (logits.shape[0], logits.shape[1], logits.min(), logits.max(), rng,
             np.abs(logits).max(), diff))
    if diff > 1e-5 * rng:
        fail("%s: reloaded model disagrees with the in-memory model (%g)" % (name, diff))
    if rng < 4.0:
        fail("%s: logit range only %.3f" % (name, rng))
    save_npy(os.path.join(d, "logits.npy"), logits)

    ref = {
        "name": name,
        "model_type": cfg.model_type,
        "weights_dtype": wdt,
        "tokens": tokens,
        "notes": notes,
        "logit_min": float(logits.min()),
        "logit_max": float(logits.max()),
        "logit_range": rng,
        "max_abs_logit": float(np.abs(logits).max()),
        "rope_inv_freq": inv_freq,
        "rope_attention_scaling": attn_scale,
        "argmax": [int(x) for x in logits.argmax(axis=1)],
    }
    if dt != torch.float32:
        mn = AutoModelForCausalLM.from_pretrained(d, dtype=dt, attn_implementation=ATTN).eval()
        pdt = {p.dtype for p in mn.parameters()}
        if pdt != {dt}:
            fail("%s: native model params are %s" % (name, pdt))
        nat = logits_of(mn, tokens)
        save_npy(os.path.join(d, "logits_native.npy"), nat)
        nd = float(np.max(np.abs(nat - logits)))
        print("native %s logits vs f32: max diff %.4g = %.3g of range" % (wdt, nd, nd / rng))
        ref["native_max_abs_diff"] = nd
        ref["native_max_abs_diff_rel_range"] = nd / rng
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=2)
        f.write("\n")
    return ref


# --------------------------------------------------------------------------
# Real-weight references (weights stay in ../shared/models)
# --------------------------------------------------------------------------

REAL = [
    # name, shared subdir, dtype, prompt, second prompt, greedy tokens
    ("stories260k-ref", "stories260k", "float32", "Once upon a time",
     "Lily and Ben were best friends. They liked to play in the park with their big red ball.", 60),
    ("prose13m-ref", "prose-13m", "bfloat16", "It is a truth universally acknowledged",
     "Mr. Darcy", 30),
]

STORY_README = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
                "in the park. One day, she saw a big, red ball. She wanted to play with it, but it "
                "was too high.")
PROSE_README = "that the people of the United States have not been able to meet with them."


def make_real(root, shared, spec):
    from tokenizers import Tokenizer
    name, sub, wdt, prompt, prompt2, ngreedy = spec
    print("\n=== %s ===" % name, flush=True)
    src = os.path.join(shared, sub)
    d = os.path.join(root, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    tok = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
    e1 = tok.encode(prompt, add_special_tokens=False)
    e2 = tok.encode(prompt2, add_special_tokens=False)
    tokens = [1] + list(e1.ids)
    tokens2 = [1] + list(e2.ids)
    print("prompt ids:", e1.ids, e1.tokens)
    print("prompt2 ids:", e2.ids, e2.tokens)

    m32 = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation=ATTN).eval()
    logits = logits_of(m32, tokens)
    logits2 = logits_of(m32, tokens2)
    save_npy(os.path.join(d, "logits.npy"), logits)
    save_npy(os.path.join(d, "logits2.npy"), logits2)
    rng = float(logits.max() - logits.min())
    print("logits [%d x %d]: min %.4f max %.4f range %.4f"
          % (logits.shape[0], logits.shape[1], logits.min(), logits.max(), rng))
    last = logits[-1]
    top5 = [int(i) for i in np.argsort(-last, kind="stable")[:5]]
    print("top5 after prompt:", top5, [tok.id_to_token(i) for i in top5])

    inp = torch.tensor([[1]], dtype=torch.long)
    gen = m32.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                       max_new_tokens=ngreedy, pad_token_id=0)
    greedy = [int(x) for x in gen[0, 1:].tolist()]
    text = tok.decode(greedy, skip_special_tokens=True)
    print("greedy from BOS (%d tokens): %r" % (len(greedy), text))

    inp = torch.tensor([tokens], dtype=torch.long)
    gen = m32.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                       max_new_tokens=ngreedy, pad_token_id=0)
    greedy_p = [int(x) for x in gen[0, len(tokens):].tolist()]
    text_p = tok.decode(greedy_p, skip_special_tokens=True)
    print("greedy after prompt (%d tokens): %r" % (len(greedy_p), text_p))

    if sub == "stories260k" and not (text.startswith(STORY_README) or STORY_README.startswith(text)):
        print("note: greedy text differs from ../shared/README.md's story")
    if sub == "prose-13m" and not text_p.startswith(PROSE_README):
        print("note: greedy-after-prompt text differs from ../shared/README.md's")

    ref = {
        "name": name,
        "model_type": m32.config.model_type,
        "weights_dtype": wdt,
        "model_dir": "../shared/models/" + sub,
        "prompt": prompt,
        "prompt_ids": list(e1.ids),
        "prompt_pieces": list(e1.tokens),
        "tokens": tokens,
        "prompt2": prompt2,
        "prompt2_ids": list(e2.ids),
        "prompt2_pieces": list(e2.tokens),
        "tokens2": tokens2,
        "logit_min": float(logits.min()),
        "logit_max": float(logits.max()),
        "logit_range": rng,
        "max_abs_logit": float(np.abs(logits).max()),
        "top5_last": top5,
        "top5_last_pieces": [tok.id_to_token(i) for i in top5],
        "argmax": [int(x) for x in logits.argmax(axis=1)],
        "greedy_prompt_tokens": [1],
        "greedy": greedy,
        "greedy_text": text,
        "greedy_after_prompt": greedy_p,
        "greedy_after_prompt_text": text_p,
        "notes": ("Weights are not copied: load model_dir. tokens = [BOS=1] + tokenizers."
                  "Tokenizer.from_file(tokenizer.json).encode(prompt, add_special_tokens=False).ids; "
                  "tokens2 likewise for prompt2. logits.npy / logits2.npy: transformers %s, float32 "
                  "arithmetic (dtype=torch.float32 on the %s weights), eager attention, all positions. "
                  "greedy: model.generate(do_sample=False, max_new_tokens=%d) from [BOS] in float32, "
                  "new ids only (stops early only at eos); greedy_after_prompt: the same from tokens."
                  % (transformers.__version__, wdt, ngreedy)),
    }
    if wdt != "float32":
        mn = AutoModelForCausalLM.from_pretrained(src, dtype=DTYPES[wdt], attn_implementation=ATTN).eval()
        nat = logits_of(mn, tokens)
        save_npy(os.path.join(d, "logits_native.npy"), nat)
        nd = float(np.max(np.abs(nat - logits)))
        print("native %s vs f32: max diff %.4g = %.3g of range" % (wdt, nd, nd / rng))
        ref["native_max_abs_diff"] = nd
        ref["native_max_abs_diff_rel_range"] = nd / rng
        ref["notes"] += " logits_native.npy: the same model loaded in %s, computed in %s, cast to float32." \
            % (wdt, wdt)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=2)
        f.write("\n")
    return ref


# --------------------------------------------------------------------------
# Final self-consistency pass: reload every directory and the .npy files
# --------------------------------------------------------------------------

def verify_all(root, shared):
    print("\n=== verify: reload every fixture from disk ===", flush=True)
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if not os.path.isdir(d):
            continue
        with open(os.path.join(d, "reference.json")) as f:
            ref = json.load(f)
        mdir = d if "model_dir" not in ref else os.path.join(shared, os.path.basename(ref["model_dir"]))
        want = np.load(os.path.join(d, "logits.npy"))
        if want.dtype != np.dtype("<f4") or not want.flags["C_CONTIGUOUS"] or want.ndim != 2:
            fail("%s: logits.npy is %s %s" % (name, want.dtype, want.shape))
        m = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation=ATTN).eval()
        if want.shape != (len(ref["tokens"]), m.config.vocab_size):
            fail("%s: logits.npy shape %s" % (name, want.shape))
        got = logits_of(m, ref["tokens"])
        e = float(np.max(np.abs(got - want)))
        rng = float(want.max() - want.min())
        print("%-20s %-8s %-9s tokens %2d vocab %3d range %8.4f  max|logit| %8.4f  recompute diff %.3g"
              % (name, ref["model_type"], ref["weights_dtype"], len(ref["tokens"]),
                 want.shape[1], rng, float(np.abs(want).max()), e))
        if e > 1e-5 * rng:
            fail("%s: recomputed logits differ by %g" % (name, e))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/models", help="fixture root to write")
    ap.add_argument("--shared", default="../shared/models",
                    help="folder holding stories260k/ and prose-13m/")
    ap.add_argument("--tar", default=None, help="also pack the fixture root into this .tar.gz")
    ap.add_argument("--only", default=None, help="comma-separated case names")
    a = ap.parse_args()

    print("torch", torch.__version__, "transformers", transformers.__version__,
          "numpy", np.__version__, flush=True)
    os.makedirs(a.out, exist_ok=True)
    only = set(a.only.split(",")) if a.only else None
    index = []
    for case in CASES:
        if only and case[0] not in only:
            continue
        try:
            r = make_tiny(a.out, case)
            index.append({k: r[k] for k in ("name", "model_type", "weights_dtype", "logit_range")})
        except Exception:
            traceback.print_exc()
            fail("%s: exception" % case[0])
    for spec in REAL:
        if only and spec[0] not in only:
            continue
        try:
            r = make_real(a.out, a.shared, spec)
            index.append({k: r[k] for k in ("name", "model_type", "weights_dtype", "logit_range")})
        except Exception:
            traceback.print_exc()
            fail("%s: exception" % spec[0])
    with open(os.path.join(a.out, "index.json"), "w") as f:
        json.dump({"generator": "tests/reference/make_model_fixtures.py",
                   "torch": torch.__version__, "transformers": transformers.__version__,
                   "cases": index}, f, indent=2)
        f.write("\n")
    try:
        verify_all(a.out, a.shared)
    except Exception:
        traceback.print_exc()
        fail("verify: exception")

    total = 0
    for dp, _, fns in os.walk(a.out):
        total += sum(os.path.getsize(os.path.join(dp, fn)) for fn in fns)
    print("\nfixture bytes: %d" % total)
    if a.tar:
        with tarfile.open(a.tar, "w:gz") as t:
            t.add(a.out, arcname="models")
        print("packed", a.tar, os.path.getsize(a.tar), "bytes")
    if FAILURES:
        print("\n%d FAILURES:\n  %s" % (len(FAILURES), "\n  ".join(FAILURES)))
        return 1
    print("\nall fixtures OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

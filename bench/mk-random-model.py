#!/usr/bin/python3
"""mk-random-model.py — write a random-weight Hugging Face model directory of a real shape.

For speed benchmarks only: the weights are uniform noise (std ~0.02), the shape is what matters.
The directory holds config.json, generation_config.json and one model.safetensors whose header is
written by hand (8-byte little-endian header length, JSON header, raw little-endian data), so only
numpy is needed. Tensors are generated and written in chunks, so memory stays at a few tens of MB
whatever the model size. No tokenizer files: benchmarks feed token ids.

usage: mk-random-model.py SHAPE DTYPE OUT_DIR [--seed N] [--std S] [--repeat]
  --repeat: one random block of 64 MiB written over and over (an 8B model in seconds, not minutes;
            the weights repeat, which no speed measurement can see)
  SHAPE: tinyllama-1.1b | llama-3.2-1b | qwen2.5-0.5b | tiny
  DTYPE: bf16 | f16 | f32
Idempotent: if OUT_DIR/model.safetensors exists with the expected size, nothing is rewritten.
"""
import argparse
import json
import os
import sys

import numpy as np

SHAPES = {
    # model_type, hidden, layers, heads, kv heads, ffn, vocab, tied, rope theta, extras
    "tinyllama-1.1b": dict(model_type="llama", hidden=2048, layers=22, heads=32, kv=4, ffn=5632,
                           vocab=32000, tied=False, theta=10000.0, max_pos=2048, bos=1, eos=2),
    "llama-3.2-1b": dict(model_type="llama", hidden=2048, layers=16, heads=32, kv=8, ffn=8192,
                         vocab=128256, tied=True, theta=500000.0, max_pos=131072, bos=128000,
                         eos=[128001, 128008, 128009],
                         rope_scaling={"factor": 32.0, "high_freq_factor": 4.0,
                                       "low_freq_factor": 1.0,
                                       "original_max_position_embeddings": 8192,
                                       "rope_type": "llama3"}),
    "llama-3-8b": dict(model_type="llama", hidden=4096, layers=32, heads=32, kv=8, ffn=14336,
                       vocab=128256, tied=False, theta=500000.0, max_pos=8192, bos=128000, eos=128001),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden=896, layers=24, heads=14, kv=2, ffn=4864,
                         vocab=151936, tied=True, theta=1000000.0, max_pos=32768, bos=151643,
                         eos=151645, qkv_bias=True),
    "tiny": dict(model_type="llama", hidden=256, layers=2, heads=8, kv=4, ffn=768, vocab=1024,
                 tied=False, theta=10000.0, max_pos=2048, bos=1, eos=2),
}
DTYPES = {"bf16": ("BF16", 2, "bfloat16"), "f16": ("F16", 2, "float16"),
          "f32": ("F32", 4, "float32")}


def tensor_list(s):
    """[(name, shape, is_norm)] in HF Llama naming."""
    h, hd = s["hidden"], s["hidden"] // s["heads"]
    q, kv = s["heads"] * hd, s["kv"] * hd
    out = [("model.embed_tokens.weight", (s["vocab"], h), False)]
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,), True),
                (p + "self_attn.q_proj.weight", (q, h), False),
                (p + "self_attn.k_proj.weight", (kv, h), False),
                (p + "self_attn.v_proj.weight", (kv, h), False)]
        if s.get("qkv_bias"):
            out += [(p + "self_attn.q_proj.bias", (q,), False),
                    (p + "self_attn.k_proj.bias", (kv,), False),
                    (p + "self_attn.v_proj.bias", (kv,), False)]
        out += [(p + "self_attn.o_proj.weight", (h, q), False),
                (p + "post_attention_layernorm.weight", (h,), True),
                (p + "mlp.gate_proj.weight", (s["ffn"], h), False),
                (p + "mlp.up_proj.weight", (s["ffn"], h), False),
                (p + "mlp.down_proj.weight", (h, s["ffn"]), False)]
    out.append(("model.norm.weight", (h,), True))
    if not s["tied"]:
        out.append(("lm_head.weight", (s["vocab"], h), False))
    return out


def encode(x, dtype):
    """float32 array -> bytes in the stored dtype (bf16: round to nearest even)."""
    if dtype == "f32":
        return x.astype("<f4").tobytes()
    if dtype == "f16":
        return x.astype("<f2").tobytes()
    u = x.astype("<f4").view("<u4")
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


def config(shape, s, dtype):
    hd = s["hidden"] // s["heads"]
    c = {
        "architectures": ["Qwen2ForCausalLM" if s["model_type"] == "qwen2" else "LlamaForCausalLM"],
        "model_type": s["model_type"], "hidden_size": s["hidden"],
        "intermediate_size": s["ffn"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv"], "head_dim": hd,
        "vocab_size": s["vocab"], "max_position_embeddings": s["max_pos"],
        "rms_norm_eps": 1e-5, "rope_theta": s["theta"], "hidden_act": "silu",
        "tie_word_embeddings": s["tied"], "bos_token_id": s["bos"], "eos_token_id": s["eos"],
        "torch_dtype": DTYPES[dtype][2], "attention_bias": bool(s.get("qkv_bias")),
        "_cinfer_random_shape": shape,
    }
    if "rope_scaling" in s:
        c["rope_scaling"] = s["rope_scaling"]
    return c


def main(argv):
    ap = argparse.ArgumentParser(description="random-weight HF model dir of a real shape")
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("dtype", choices=sorted(DTYPES))
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--repeat", action="store_true")
    a_ = ap.parse_args(argv)
    shape, dtype, out, seed, std = a_.shape, a_.dtype, a_.out, a_.seed, a_.std
    s = SHAPES[shape]
    st_name, esize, _ = DTYPES[dtype]
    tensors = tensor_list(s)
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shp, _ in tensors:
        n = int(np.prod(shp)) * esize
        header[name] = {"dtype": st_name, "shape": list(shp), "data_offsets": [off, off + n]}
        off += n
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    total = 8 + len(hjson) + off
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "model.safetensors")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config(shape, s, dtype), f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": s["bos"], "eos_token_id": s["eos"], "do_sample": False}, f,
                  indent=2)
    if os.path.exists(path) and os.path.getsize(path) == total:
        print(f"{path}: exists ({total} bytes)")
        return 0
    rng = np.random.default_rng(seed)
    a = std * np.sqrt(3.0)
    chunk = 1 << 22
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(len(hjson).to_bytes(8, "little"))
        f.write(hjson)
        block = encode(rng.uniform(-a, a, 32 << 20).astype(np.float32), dtype) if a_.repeat else None
        for name, shp, is_norm in tensors:
            n = int(np.prod(shp))
            if block is not None and not is_norm:
                nb = n * esize
                for i in range(0, nb, len(block)):
                    f.write(block[: min(len(block), nb - i)])
                continue
            for i in range(0, n, chunk):
                m = min(chunk, n - i)
                if is_norm:
                    x = np.ones(m, dtype=np.float32)
                else:
                    x = rng.uniform(-a, a, m).astype(np.float32)
                f.write(encode(x, dtype))
    os.replace(tmp, path)
    n_params = sum(int(np.prod(shp)) for _, shp, _ in tensors)
    print(json.dumps({"out": out, "shape": shape, "dtype": dtype, "params": n_params,
                      "bytes": total}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

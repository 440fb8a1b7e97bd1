#!/usr/bin/python3
"""hf-to-gguf.py — write a llama GGUF from a Hugging Face llama model directory, same weights, so that
cinfer and llama.cpp score the same model (bench/bench-perplexity.sh).

Uses llama.cpp's own gguf-py (from the node-llama-cpp source, $LLAMA_PEER_DIR/src/gguf-py) and numpy
only: the safetensors header is parsed by hand and tensors are memory-mapped. As llama.cpp's
convert_hf_to_gguf.py does for llama, q_proj/k_proj rows are permuted from HF's rotate-half RoPE
layout to GGUF's interleaved one, and 1-D tensors (norms) are stored as F32. Matrices keep their
dtype (F32, F16; BF16 as raw BF16).

Vocabulary: --spm-vocab sentencepiece_vocab.json ({"pieces", "scores"}) or --vocab-gguf FILE (copies
the tokenizer.ggml.* keys of a vocab-only GGUF, e.g. ggml-vocab-llama-spm.gguf for Llama 2).

usage: hf-to-gguf.py HF_DIR OUT.gguf (--spm-vocab FILE | --vocab-gguf FILE)
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

PEER = os.environ.get("LLAMA_PEER_DIR", os.path.expanduser("~/.cache/llama-cpp-peer"))
sys.path.insert(0, os.path.join(PEER, "src", "gguf-py"))
import gguf  # noqa: E402


def tensors(d):
    files = [f for f in sorted(os.listdir(d)) if f.endswith(".safetensors")]
    out = {}
    for f in files:
        p = os.path.join(d, f)
        with open(p, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
        base = 8 + n
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            dt = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[t["dtype"]]
            arr = np.memmap(p, dtype=dt, mode="r", offset=base + a, shape=tuple(t["shape"]))
            out[name] = (arr, t["dtype"])
    return out


def permute(w, n_head):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--spm-vocab")
    ap.add_argument("--vocab-gguf")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.hf_dir, "config.json")))
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or H // nh
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(H)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_rope_dimension_count(hd)
    if hd != H // nh:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if a.spm_vocab:
        v = json.load(open(a.spm_vocab))
        toks = v["pieces"]
        types = []
        for i, t in enumerate(toks):
            if t == "<unk>":
                types.append(gguf.TokenType.UNKNOWN)
            elif t in ("<s>", "</s>"):
                types.append(gguf.TokenType.CONTROL)
            elif t.startswith("<0x") and t.endswith(">") and len(t) == 6:
                types.append(gguf.TokenType.BYTE)
            else:
                types.append(gguf.TokenType.NORMAL)
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores([float(s) for s in v["scores"]])
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
    else:
        r = gguf.GGUFReader(a.vocab_gguf)
        f = r.fields
        toks = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data]
        scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
        types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
        w.add_tokenizer_model(bytes(f["tokenizer.ggml.model"].parts[-1]).decode())
        w.add_token_list(toks)
        w.add_token_scores(scores)
        w.add_token_types(types)
        for k, fn in [("tokenizer.ggml.bos_token_id", w.add_bos_token_id), ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
                      ("tokenizer.ggml.unknown_token_id", w.add_unk_token_id)]:
            if k in f:
                fn(int(f[k].parts[-1][0]))
        w.add_add_bos_token(True)
    T = tensors(a.hf_dir)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
           "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, (arr, dt) in T.items():
        if name in names:
            gn = names[name]
        else:
            parts = name.split(".")   # model.layers.N.<mod>.<sub>.weight
            key = ".".join(parts[3:-1])
            gn = "blk.%s.%s.weight" % (parts[2], per[key])
            if key == "self_attn.q_proj":
                arr = permute(np.asarray(arr), nh)
            elif key == "self_attn.k_proj":
                arr = permute(np.asarray(arr), nkv)
        if arr.ndim == 1:
            arr = (np.asarray(arr).astype(np.uint32) << 16).view(np.float32) if dt == "BF16" else np.asarray(arr, dtype=np.float32)
            w.add_tensor(gn, arr)
        elif dt == "BF16":
            w.add_tensor(gn, arr, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(gn, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", a.out, os.path.getsize(a.out), "bytes")


if __name__ == "__main__":
    main()

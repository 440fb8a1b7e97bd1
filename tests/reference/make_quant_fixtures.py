#!/usr/bin/env python3
"""make_quant_fixtures.py — references for MLX affine-quantized weights (issue 11).

Runs on the GPU machine (NumPy + PyTorch + transformers, on its CPU, float32).
Writes into --out (the layout of tests/fixtures/quant/):

  gpu/<case>_{wq,scales,biases}.npy   NumPy port of MLX's Metal/CUDA quantizer
        (running max starts at 0; round half away from zero; codes from the
        unrounded f32 scale/bias; scale/bias then rounded to the weight dtype)
        on model.layers.0.mlp.down_proj.weight of prose-13m (bf16) and on
        ../shared/reference/mlx/quantize/synth_w.npy (f32). The same port with
        the CPU rule (true max, rint) is first checked bit for bit against the
        MLX 0.32.1 triples there, so the port's arithmetic and packing are
        MLX's; only the rounding rule is switched for the gpu files.
  mixed36/{reference.json,logits.npy,logits2.npy}  prose-13m-mlx-mixed-3-6 (as
        mlx-lm wrote it) dequantized with NumPy (s*q + b in float32), loaded
        into transformers' LlamaForCausalLM in float32 (eager attention):
        logits of `tokens` and `tokens2` and the greedy continuation.
  convert/{cases.json,logits2.npy}  prose-13m quantized by the GPU-rule port at
        each (bits, group) of cases.json (embedding + every linear layer, as
        mlx_lm.convert -q), dequantized, transformers float32 logits of
        tokens2, stacked [n_cases * len(tokens2), vocab].

Usage: make_quant_fixtures.py --carry DIR --out DIR  (DIR holds prose-13m/,
prose-13m-mlx-mixed-3-6/ and quantize/ from ../shared).
"""
import argparse, json, os, struct, sys, time
import numpy as np

TOKENS = [1, 739, 338, 263, 8760, 4946, 635, 24084, 3192]      # [BOS] + "It is a truth universally acknowledged"
TOKENS2 = [1, 3237, 29889, 7335, 1270]                          # [BOS] + "Mr. Darcy"
CONVERT_CASES = [(2, 64), (3, 64), (4, 64), (5, 64), (6, 64), (8, 64), (4, 32), (4, 128)]
GPU_CASES = [("prose", 3, 32), ("prose", 4, 64), ("prose", 2, 64), ("prose", 5, 32), ("prose", 6, 64), ("prose", 8, 128),
             ("synth", 4, 64), ("synth", 6, 128), ("synth", 2, 32), ("synth", 3, 64), ("synth", 5, 128), ("synth", 8, 32)]
LINEAR = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def read_st(path):
    with open(path, "rb") as f:
        buf = f.read()
    hl = struct.unpack("<Q", buf[:8])[0]
    hdr = json.loads(buf[8:8 + hl])
    base = 8 + hl
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        raw = buf[base + b:base + e]
        dt = v["dtype"]
        if dt == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F32":
            a = np.frombuffer(raw, "<f4").astype(np.float32)
        elif dt == "F16":
            a = np.frombuffer(raw, "<f2").astype(np.float32)
        elif dt == "U32":
            a = np.frombuffer(raw, "<u4").copy()
        else:
            raise SystemExit("unexpected dtype %s" % dt)
        out[k] = (a.reshape(v["shape"]), dt)
    return out


def read_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    t = {}
    for f in files:
        t.update(read_st(os.path.join(d, f)))
    return t


def to_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def rnd(x, rule):
    x = np.asarray(x, dtype=np.float32)
    if rule == "cpu":
        return np.rint(x).astype(np.float32)          # ties to even, as std::rint
    x64 = x.astype(np.float64)                         # half away from zero (Metal round), exact in f64
    return np.where(x64 >= 0, np.floor(x64 + 0.5), -np.floor(-x64 + 0.5)).astype(np.float32)


def pack(q, bits):
    rows, cols = q.shape
    b = ((q[:, :, None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8).reshape(rows, cols * bits)
    return np.ascontiguousarray(np.packbits(b, axis=-1, bitorder="little")).view("<u4")


def unpack(wq, bits, cols):
    rows = wq.shape[0]
    by = np.ascontiguousarray(wq).view(np.uint8)
    b = np.unpackbits(by, axis=-1, bitorder="little").reshape(rows, cols, bits).astype(np.uint32)
    return (b << np.arange(bits, dtype=np.uint32)).sum(-1).astype(np.uint32)


def quantize(w, bits, group, rule, bf16):
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    n = np.float32(2 ** bits - 1)
    g = w.reshape(rows, cols // group, group)
    mx = g.max(-1)
    if rule == "gpu":
        mx = np.maximum(mx, np.float32(0))
    mn = g.min(-1)
    s0 = np.maximum((mx - mn) / n, np.float32(1e-7)).astype(np.float32)
    side = np.abs(mn) > np.abs(mx)
    scale = np.where(side, s0, -s0).astype(np.float32)
    edge = np.where(side, mn, mx).astype(np.float32)
    q0 = rnd(edge / scale, rule)
    zero = q0 == 0
    scale = np.where(zero, scale, edge / np.where(zero, np.float32(1), q0)).astype(np.float32)
    bias = np.where(zero, np.float32(0), edge).astype(np.float32)
    q = rnd((g - bias[..., None]) / scale[..., None], rule)
    q = np.clip(q, 0, n).astype(np.uint32).reshape(rows, cols)
    if bf16:
        scale, bias = to_bf16(scale), to_bf16(bias)
    return pack(q, bits), scale, bias


def dequant(wq, scales, biases, bits, group):
    rows = wq.shape[0]
    cols = wq.shape[1] * 32 // bits
    q = unpack(wq, bits, cols).astype(np.float32).reshape(rows, cols // group, group)
    s = np.asarray(scales, np.float32)[..., None]
    b = np.asarray(biases, np.float32)[..., None]
    return (s * q + b).astype(np.float32).reshape(rows, cols)


def save(path, a):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, np.ascontiguousarray(a), allow_pickle=False)


def port_checks(carry, out):
    ok = True
    qd = os.path.join(carry, "quantize")
    dense = read_dir(os.path.join(carry, "prose-13m"))
    prose = dense["model.layers.0.mlp.down_proj.weight"][0]
    synth = np.load(os.path.join(qd, "synth_w.npy")).astype(np.float32)
    for name, w, bits, group, bf in [("prose_b4_g64", prose, 4, 64, True), ("prose_b3_g32", prose, 3, 32, True),
                                     ("synth_b4_g64", synth, 4, 64, False), ("synth_b6_g128", synth, 6, 128, False)]:
        wq, s, b = quantize(w, bits, group, "cpu", bf)
        r = [np.load(os.path.join(qd, "%s_%s.npy" % (name, x))) for x in ("wq", "scales", "biases")]
        same = np.array_equal(wq, r[0]) and np.array_equal(s, r[1].astype(np.float32)) and np.array_equal(b, r[2].astype(np.float32))
        dq = dequant(r[0], r[1], r[2], bits, group)
        print("port, cpu rule, %s vs MLX: %s (codes differing %d)" % (name, "bit for bit" if same else "DIFFERS",
              int((unpack(wq, bits, w.shape[1]) != unpack(r[0], bits, w.shape[1])).sum())), flush=True)
        print("   unpack/dequant of the MLX triple vs mx.dequantize: max |diff| %.3g" %
              float(np.abs(dq - np.load(os.path.join(qd, name + "_dequant.npy"))).max()), flush=True)
        ok = ok and same
    for src, bits, group in GPU_CASES:
        w, bf = (prose, True) if src == "prose" else (synth, False)
        wq, s, b = quantize(w, bits, group, "gpu", bf)
        name = "%s_b%d_g%d" % (src, bits, group)
        save(os.path.join(out, "gpu", name + "_wq.npy"), wq.astype("<u4"))
        save(os.path.join(out, "gpu", name + "_scales.npy"), s.astype("<f4"))
        save(os.path.join(out, "gpu", name + "_biases.npy"), b.astype("<f4"))
        wc, _, _ = quantize(w, bits, group, "cpu", bf)
        print("gpu rule %s: %d codes differ from the cpu rule" % (name, int((unpack(wq, bits, w.shape[1]) != unpack(wc, bits, w.shape[1])).sum())))
    return ok, dense


def torch_model(cfg_dict, sd):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    c = {k: v for k, v in cfg_dict.items() if k not in ("quantization", "quantization_config")}
    cfg = LlamaConfig.from_dict(c)
    cfg._attn_implementation = "eager"
    m = LlamaForCausalLM(cfg).to(torch.float32).eval()
    missing, unexpected = m.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise SystemExit("state dict mismatch: missing %s unexpected %s" % (missing, unexpected))
    if "lm_head.weight" in missing:
        m.lm_head.weight = m.model.embed_tokens.weight
    return m


def logits(m, tokens):
    import torch
    with torch.no_grad():
        ids = torch.tensor([tokens], dtype=torch.long)
        return m(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].to(torch.float32).numpy()


def dequant_model(t, quant):
    sd = {}
    for k, (a, dt) in t.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        if dt == "U32":
            p = k[:-len(".weight")]
            e = quant.get(p, {}) if isinstance(quant.get(p), dict) else {}
            bits, group = e.get("bits", quant["bits"]), e.get("group_size", quant["group_size"])
            a = dequant(a, t[p + ".scales"][0], t[p + ".biases"][0], bits, group)
        sd[k] = a.astype(np.float32)
    return sd


def mixed(carry, out):
    import torch
    d = os.path.join(carry, "prose-13m-mlx-mixed-3-6")
    cfg = json.load(open(os.path.join(d, "config.json")))
    sd = dequant_model(read_dir(d), cfg["quantization"])
    m = torch_model(cfg, sd)
    l1, l2 = logits(m, TOKENS), logits(m, TOKENS2)
    o = os.path.join(out, "mixed36")
    save(os.path.join(o, "logits.npy"), l1.astype("<f4"))
    save(os.path.join(o, "logits2.npy"), l2.astype("<f4"))
    inp = torch.tensor([TOKENS], dtype=torch.long)
    gen = m.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False, max_new_tokens=30, pad_token_id=0)
    greedy = [int(x) for x in gen[0, len(TOKENS):].tolist()]
    ref = {"name": "prose13m-mixed36-ref", "model_dir": "../shared/models/prose-13m-mlx-mixed-3-6",
           "weights_dtype": "mlx affine 3/6-bit g64 (mixed_3_6)", "tokens": TOKENS, "tokens2": TOKENS2,
           "logit_range": float(l1.max() - l1.min()), "greedy_after_prompt": greedy,
           "notes": "NumPy dequantization (s*q + b in float32, bf16 scales/biases widened) of every U32 tensor with its "
                    ".scales/.biases, then transformers LlamaForCausalLM float32, eager attention, tied head; greedy: "
                    "generate(do_sample=False, max_new_tokens=30) from tokens. Script: tests/reference/make_quant_fixtures.py"}
    json.dump(ref, open(os.path.join(o, "reference.json"), "w"), indent=1)
    print("mixed36: logits range %.3f, greedy %s" % (ref["logit_range"], greedy[:10]), flush=True)


def convert_cases(carry, out, dense):
    cfg = json.load(open(os.path.join(carry, "prose-13m", "config.json")))
    L = cfg["num_hidden_layers"]
    rows = []
    for bits, group in CONVERT_CASES:
        sd = {}
        for k, (a, dt) in dense.items():
            p = k[:-len(".weight")] if k.endswith(".weight") else None
            quant = a.ndim == 2 and p is not None and (p == "model.embed_tokens" or any(p.endswith(x) for x in LINEAR)) \
                and a.shape[1] % group == 0
            if quant:
                wq, s, b = quantize(a, bits, group, "gpu", dt == "BF16")
                a = dequant(wq, s, b, bits, group)
            sd[k] = a.astype(np.float32)
        m = torch_model(cfg, sd)
        lg = logits(m, TOKENS2)
        rows.append(lg)
        print("convert case b%d g%d: logits range %.3f argmax %s" % (bits, group, float(lg.max() - lg.min()),
              [int(x) for x in lg.argmax(1)]), flush=True)
    o = os.path.join(out, "convert")
    save(os.path.join(o, "logits2.npy"), np.concatenate(rows, 0).astype("<f4"))
    json.dump({"cases": [{"bits": b, "group_size": g} for b, g in CONVERT_CASES], "tokens2": TOKENS2, "rounding": "gpu",
               "layers": L, "notes": "prose-13m, embedding + q/k/v/o/gate/up/down quantized with the GPU-rule NumPy port, "
                                     "bf16 scales/biases, dequantized s*q+b in f32, transformers float32 eager; rows: case-major"},
              open(os.path.join(o, "cases.json"), "w"), indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--carry", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    t0 = time.time()
    ok, dense = port_checks(a.carry, a.out)
    mixed(a.carry, a.out)
    convert_cases(a.carry, a.out, dense)
    print("done in %.1f s; port %s" % (time.time() - t0, "matches MLX" if ok else "DOES NOT MATCH MLX"), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

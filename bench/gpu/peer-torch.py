#!/usr/bin/env python3
"""peer-torch.py — the PyTorch + transformers peer for bench/gpu/bench-cuda.c.

Builds the model class of the config.json that bench-cuda wrote (LlamaForCausalLM,
Gemma3ForCausalLM; same shape, bf16, random init directly on the GPU) and measures, as
bench-cuda does:
  prefill: one forward over P random tokens (use_cache=False, logits_to_keep=1), median of 5
           after a warm-up;
  decode:  generate() greedy, G new tokens after a 128-token prompt (min_new_tokens=G so no
           early stop); decode tok/s = (G - 1) / (t(G tokens) - t(1 token)), which removes
           the prompt's prefill; median of 3 after a warm-up.
MODE eager: the default dynamic cache, no compilation. MODE static: cache_implementation=
"static" (transformers compiles the decode step itself; the warm-up pays for that and its
time is printed). Prints one JSON line per measurement.

MODE kv: the bytes of transformers' own cache (DynamicCache, which keeps a sliding layer's
window) after a prefill of P tokens, against every layer kept whole.

MODE batch: the serving peer (issue 19): B prompts of P random tokens decoded together by generate()
(greedy, dynamic cache, no compilation); aggregate tok/s = B (G - 1) / (t(G tokens) - t(1 token)).

usage: peer-torch.py MODEL_DIR eager|static|kv [P=2048] [G=128]
       peer-torch.py MODEL_DIR batch P G B
       peer-torch.py table RESULTS.jsonl      (Markdown table of bench-cuda + peer lines)
"""
import json
import statistics
import sys
import time


def timed(fn, sync):
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def run(model_dir, mode, P, G, B=1):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(model_dir)
    shape = model_dir.rstrip("/").split("/")[-1]
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg).eval()
    torch.cuda.synchronize()
    t_init = time.perf_counter() - t0
    sync = torch.cuda.synchronize
    V = cfg.vocab_size
    ids = torch.randint(0, V, (1, P), device="cuda")
    out = {"engine": f"torch-{mode}", "shape": shape, "torch": torch.__version__, "init_s": round(t_init, 1)}
    with torch.inference_mode():
        if mode == "kv":
            out = model(ids, use_cache=True, logits_to_keep=1)
            cache, held = out.past_key_values, 0
            for layer in getattr(cache, "layers", []):
                for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                    if t is not None:
                        held += t.numel() * t.element_size()
            hd = getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
            whole = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * hd * P * 2
            out = {"engine": "torch-kv", "shape": shape, "context": P, "kv_held": held, "kv_whole": whole,
                   "torch": torch.__version__}
            import transformers
            out["transformers"] = transformers.__version__
            print(json.dumps(out), flush=True)
            return
        if mode == "eager":
            f = lambda: model(ids, use_cache=False, logits_to_keep=1)
            f()
            tp = statistics.median(timed(f, sync) for _ in range(5))
            out.update(prefill_tokens=P, prefill_tok_s=round(P / tp, 1))
        prompt = ids[:, :128]
        if mode == "batch":
            prompt = torch.randint(0, V, (B, P), device="cuda")
        mask = torch.ones_like(prompt)
        kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0)
        if mode == "static":
            kw["cache_implementation"] = "static"
        gen = lambda n: model.generate(prompt, max_new_tokens=n, min_new_tokens=n, **kw)
        tw = timed(lambda: gen(G), sync)
        gen(1)
        tg = statistics.median(timed(lambda: gen(G), sync) for _ in range(3))
        t1 = statistics.median(timed(lambda: gen(1), sync) for _ in range(3))
        out.update(decode_tok_s=round((G - 1) / (tg - t1), 2), warmup_s=round(tw, 1))
        if mode == "batch":
            out.update(batch=B, prompt_tokens=P, aggregate_tok_s=round(B * (G - 1) / (tg - t1), 1))
    import transformers
    out["transformers"] = transformers.__version__
    print(json.dumps(out), flush=True)


def table(path):
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    by = {}
    kv = [r for r in rows if r.get("mode") == "kv_bytes" or r.get("engine") == "torch-kv"]
    for r in rows:
        if "shape" in r and "mode" not in r and r.get("engine") != "torch-kv":
            by.setdefault(r["shape"], {})[r["engine"]] = r
    print("| shape | engine | prefill tok/s (2048) | prefill TFLOP/s (% of cuBLAS) | decode tok/s | decode GB/s (% of copy BW) |")
    print("|---|---|---|---|---|---|")
    for shape, e in by.items():
        c = e.get("cinfer", {})
        flops, step = c.get("flops_prefill"), c.get("step_bytes")
        gemm, copy = c.get("gemm_tflops"), c.get("copy_gbs")
        for name in ("cinfer", "torch-eager", "torch-static"):
            r = e.get(name)
            if not r:
                print(f"| {shape} | {name} | not measured | | | |")
                continue
            pre = r.get("prefill_tok_s")
            dec = r.get("decode_tok_s")
            tf = flops * pre / r.get("prefill_tokens", 2048) / 1e12 if pre and flops else None
            gbs = step * dec / 1e9 if dec and step else None
            print(f"| {shape} | {name} | {pre if pre else '—'} | "
                  f"{f'{tf:.0f} ({100 * tf / gemm:.0f}%)' if tf and gemm else '—'} | {dec if dec else '—'} | "
                  f"{f'{gbs:.0f} ({100 * gbs / copy:.0f}%)' if gbs and copy else '—'} |")
    for shape, e in by.items():
        c = e.get("cinfer", {})
        if c:
            print(f"\n{shape}: ceilings measured in the same run: copy {c['copy_gbs']:.0f} GB/s, "
                  f"cuBLAS bf16 GEMM {c['gemm_tflops']:.0f} TFLOP/s; weights per token {c['step_bytes'] / 1e9:.2f} GB")
    for r in kv:
        name = "cinfer (f16 pages)" if r["engine"] == "cinfer" else "transformers DynamicCache (bf16)"
        print(f"KV at {r['context']} tokens, {name}: {r['kv_held'] / 1e9:.3f} GB held vs {r['kv_whole'] / 1e9:.3f} GB "
              f"with every layer whole ({100 * r['kv_held'] / r['kv_whole']:.1f}%)")


if __name__ == "__main__":
    if sys.argv[1] == "table":
        table(sys.argv[2])
    else:
        run(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2048,
            int(sys.argv[4]) if len(sys.argv) > 4 else 128, int(sys.argv[5]) if len(sys.argv) > 5 else 1)

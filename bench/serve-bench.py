#!/usr/bin/python3
"""serve-bench.py — serving speed of an OpenAI-compatible server (cinfer serve, llama-server) at several
numbers of concurrent streams: aggregate decode tok/s, time to first token, inter-token latency p50/p99.

Each of N client threads sends one streaming /v1/completions request at the same moment: a prompt of
--prompt-len random token ids (distinct per stream, so no prompt is shared and prefix caches do not help),
--max-tokens greedy tokens with ignore_eos. A token is one SSE chunk (both servers send one per token).
  aggregate tok/s = all streams' tokens / (last token's time - first request's send time)
  all decoding    = tokens arriving while every stream is decoding (after the last stream's first token, up to
                    the first stream's last token) / that window: the steady decode rate at N streams
  TTFT            = first chunk's arrival - the request's send time (queueing + prefill included)
  ITL             = gaps between consecutive chunks of a stream, pooled over streams
Python stdlib only; threads block on sockets, so the GIL adds little at these rates.

usage: serve-bench.py --url http://127.0.0.1:8080 [--streams 1,8,32,64] [--max-tokens 32] [--prompt-len 32]
                      [--vocab 32000] [--model ID] [--label NAME] [--temperature 0] [--top-p 1]
prints one markdown table row per stream count.
"""
import argparse
import http.client
import json
import random
import threading
import time
import urllib.parse


def one_stream(url, body, out):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    data = json.dumps(body)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", data, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    times = []
    if resp.status != 200:
        out.update(error=f"HTTP {resp.status}: {resp.read()[:200]!r}")
        return
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        j = json.loads(line[6:])
        ch = j.get("choices") or []
        if ch and ch[0].get("text"):
            times.append(time.perf_counter())
    conn.close()
    out.update(t0=t0, times=times)


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run(args, n):
    rng = random.Random(1000 + n)
    outs = [{} for _ in range(n)]
    threads = []
    for i in range(n):
        prompt = [rng.randrange(3, args.vocab) for _ in range(args.prompt_len)]
        body = dict(model=args.model, prompt=prompt, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, stream=True,
                    ignore_eos=True)
        threads.append(threading.Thread(target=one_stream, args=(args.url, body, outs[i])))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errs = [o["error"] for o in outs if "error" in o]
    if errs:
        raise SystemExit(f"{len(errs)} failed: {errs[0]}")
    start = min(o["t0"] for o in outs)
    end = max(o["times"][-1] for o in outs if o["times"])
    toks = sum(len(o["times"]) for o in outs)
    ttft = [o["times"][0] - o["t0"] for o in outs if o["times"]]
    itl = [b - a for o in outs for a, b in zip(o["times"], o["times"][1:])]
    # steady state: the window in which every stream is decoding (from the last first token to the first last token)
    lo = max(o["times"][0] for o in outs if o["times"])
    hi = min(o["times"][-1] for o in outs if o["times"])
    inwin = sum(1 for o in outs for t in o["times"] if lo < t <= hi)
    steady = inwin / (hi - lo) if hi > lo else float("nan")
    return dict(streams=n, tokens=toks, tps=toks / (end - start), steady=steady, ttft_p50=pct(ttft, 50), ttft_p99=pct(ttft, 99),
                itl_p50=pct(itl, 50), itl_p99=pct(itl, 99), wall=end - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", default="1,8,32,64")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--model", default="default_model")
    ap.add_argument("--label", default="server")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    ap.add_argument("--top-p", type=float, default=1.0)
    args = ap.parse_args()
    run(args, 1)   # warm-up
    print("| server | streams | tokens | aggregate tok/s | all decoding, tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | wall (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for n in [int(x) for x in args.streams.split(",")]:
        r = run(args, n)
        print(f"| {args.label} | {n} | {r['tokens']} | {r['tps']:.1f} | {r['steady']:.1f} | {1e3 * r['ttft_p50']:.0f} / {1e3 * r['ttft_p99']:.0f} "
              f"| {1e3 * r['itl_p50']:.1f} / {1e3 * r['itl_p99']:.1f} | {r['wall']:.1f} |", flush=True)


if __name__ == "__main__":
    main()

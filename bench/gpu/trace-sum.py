# trace-sum.py FILE [SM GHz] — bench-cuda BENCH_TRACE's block timeline (bench/gpu/trace.sh; cuda.cuh's CU_TRACE) as
# kernel instances: for each, when its first block started and first passed the wait on the kernel before, relative
# to the previous instance's last block end; the blocks' prologue (ring GEMV: x, digits) and work after it (median over
# blocks, clock64 at the SM clock), the spread of their ends; then averages by position in a layer
import sys, statistics as st
ROPE, ATTN = 0xfff0, 0xfff1
ev = []
for line in open(sys.argv[1]):
    t, ck, tag = map(int, line.split())
    ev.append((t, ck, tag & 7, (tag >> 3) & 0x1fff, tag >> 16))
ev.sort()
inst, cur = [], {}
for t, ck, e, blk, kind in ev:
    c = cur.get(kind)
    if c is None or (e == 0 and blk in c["b"]):
        c = {"kind": kind, "b": {}}
        cur[kind] = c
        inst.append(c)
    c["b"].setdefault(blk, {})[e] = (t, ck)
ghz = float(sys.argv[2]) if len(sys.argv) > 2 else 1.98
def name(kind):
    return "rope" if kind == ROPE else "attn" if kind == ATTN else "%s k%d" % ("glu" if kind & 1 else "mat", (kind >> 1) * 32)
prev_end, rows = None, []
for c in sorted(inst, key=lambda c: max(x[3][0] for x in c["b"].values() if 3 in x)):
    b = [x for x in c["b"].values() if 0 in x and 1 in x and 3 in x]
    if not b: continue
    t0 = min(x[0][0] for x in b); tw = min(x[1][0] for x in b); tw1 = max(x[1][0] for x in b)
    te0 = min(x[3][0] for x in b); te = max(x[3][0] for x in b)
    pro = st.median(((x[2][1] if 2 in x else x[1][1]) - x[1][1]) / ghz / 1000 for x in b)
    work = st.median((x[3][1] - (x[2][1] if 2 in x else x[1][1])) / ghz / 1000 for x in b)
    tail = st.median((x[3][1] - x[4][1]) / ghz / 1000 for x in b) if all(4 in x for x in b) else 0.0
    rows.append(dict(name=name(c["kind"]), n=len(b), start=(t0 - prev_end) / 1000 if prev_end else 0,
                     wait=(tw - prev_end) / 1000 if prev_end else 0, wspread=(tw1 - tw) / 1000, pro=pro, work=work,
                     espread=(te - te0) / 1000, total=(te - tw) / 1000, tail=tail))
    prev_end = te
print("inst kernel     blocks | start  wait (us after the previous end) | wait spread | prologue work (median us) | end spread | wait->end")
for i, r in enumerate(rows[:40]):
    print("%4d %-10s %4d | %7.2f %7.2f | %5.2f | %5.2f %6.2f | %5.2f | %6.2f" % (i, r["name"], r["n"], r["start"], r["wait"], r["wspread"],
          r["pro"], r["work"], r["espread"], r["total"]))
# a layer: the instances from a q/k/v GEMV to the down projection (the first layer of the trace left out); the rope
# kernel is absent where the decode attention takes the rope (CINFER_CUDA_ROPE_FUSE): its row reads 0
pat = ["mat", "rope", "attn", "mat", "glu", "mat"]
zero = dict(wait=0.0, pro=0.0, work=0.0, tail=0.0, espread=0.0, total=0.0)
lay, i = [], 1
while i + len(pat) - 1 <= len(rows):
    for p in (pat, pat[:1] + pat[2:]):
        seg = rows[i:i + len(p)]
        if [r["name"].split()[0] for r in seg] == p:
            lay.append(seg if len(p) == len(pat) else seg[:1] + [zero] + seg[1:])
            i += len(p)
            break
    else:
        i += 1
names = ["qkv", "rope", "attn", "o", "gate/up", "down"]
print("averages over %d layers (us):" % len(lay))
tot = 0
for j in range(len(pat)):
    f = lambda key: st.mean(l[j][key] for l in lay)
    tot += f("wait") + f("total")
    print("  %-8s wait-after-prev %6.2f  prologue %5.2f  work %6.2f (of which the last part %5.2f)  end spread %5.2f  wait->end %6.2f" % (
          names[j], f("wait"), f("pro"), f("work"), f("tail"), f("espread"), f("total")))
print("  a layer: %.2f us" % tot)

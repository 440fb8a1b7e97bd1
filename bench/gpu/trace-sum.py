# trace-sum.py FILE [GB of each GEMV, comma-separated, in step order of a layer] — bench-cuda BENCH_TRACE's ring GEMV
# timeline (bench/gpu/trace.sh) as kernel instances: for each, when its first block started and passed the wait on
# the kernel before, relative to the previous instance's last block end; the blocks' prologue (x, digits) and
# streaming times (median over blocks, clock64 at the SM clock), the spread of their ends; then averages by position
import sys, statistics as st
ev = []
for line in open(sys.argv[1]):
    t, ck, tag = map(int, line.split())
    ev.append((t, ck, tag & 3, (tag >> 2) & 1, (tag >> 3) & 0x1fff, tag >> 16))
ev.sort()
inst, cur = [], {}
for t, ck, e, glu, blk, k32 in ev:
    kind = (glu, k32)
    c = cur.get(kind)
    if c is None or (e == 0 and blk in c["b"]):
        c = {"kind": kind, "b": {}, "order": len(inst)}
        cur[kind] = c
        inst.append(c)
    c["b"].setdefault(blk, {})[e] = (t, ck)
ghz = float(sys.argv[2]) if len(sys.argv) > 2 else 1.98
prev_end, rows = None, []
for c in inst:
    b = c["b"].values()
    full = [x for x in b if len(x) == 4]
    t0 = min(x[0][0] for x in b if 0 in x); tw = min(x[1][0] for x in full); tw1 = max(x[1][0] for x in full)
    te0 = min(x[3][0] for x in full); te = max(x[3][0] for x in full)
    pro = st.median((x[2][1] - x[1][1]) / ghz / 1000 for x in full)
    strm = st.median((x[3][1] - x[2][1]) / ghz / 1000 for x in full)
    r = dict(kind=c["kind"], n=len(full), start=(t0 - prev_end) / 1000 if prev_end else 0, wait=(tw - prev_end) / 1000 if prev_end else 0,
             wspread=(tw1 - tw) / 1000, pro=pro, strm=strm, espread=(te - te0) / 1000, total=(te - tw) / 1000)
    rows.append(r)
    prev_end = te
print("inst kind(glu,k) blocks | start wait (us after the previous end) | wait spread | prologue stream (median us) | end spread | wait->end")
for i, r in enumerate(rows):
    print("%4d %d,%5d %4d | %7.2f %7.2f | %5.2f | %5.2f %6.2f | %5.2f | %6.2f" % (i, r["kind"][0], r["kind"][1] * 32, r["n"], r["start"], r["wait"],
          r["wspread"], r["pro"], r["strm"], r["espread"], r["total"]))
# a layer: 4 instances (q/k/v, o, gate/up, down; the first layer of the trace left out); averages over the layers
lay, i = [], 1
while i + 4 <= len(rows):
    ks = [rows[i + j]["kind"] for j in range(4)]
    if [x[0] for x in ks] == [0, 0, 1, 0] and ks[0][1] == ks[1][1] == ks[2][1] and ks[3][1] > ks[2][1]:
        lay.append(rows[i:i + 4])
        i += 4
    else:
        i += 1
names = ["qkv", "o", "gate/up", "down"]
print("averages over %d layers:" % len(lay))
for j in range(4):
    f = lambda key: st.mean(l[j][key] for l in lay)
    print("  %-8s wait-after-prev %6.2f  prologue %5.2f  stream %6.2f  end spread %5.2f  wait->end %6.2f" % (names[j], f("wait"), f("pro"),
          f("strm"), f("espread"), f("total")))

# ncu-sum.py CSV: sums an `ncu --csv --metrics gpu__time_duration.sum` listing (e.g. one decode step under
# --graph-profiling node, bench-cuda BENCH_AGG_PROFILE=1) by kernel name: count, total us, share; then the first 40 kernels
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = None
tot = collections.OrderedDict()
cnt = collections.Counter()
seq = []
for r in rows:
    if hdr is None:
        if "Kernel Name" in r: hdr = {k: i for i, k in enumerate(r)}
        continue
    if len(r) < len(hdr) or r[hdr["Metric Name"]] != "gpu__time_duration.sum": continue
    name = r[hdr["Kernel Name"]][:90]
    unit = r[hdr["Metric Unit"]]
    v = float(r[hdr["Metric Value"]].replace(",", ""))
    us = v / 1000 if unit in ("nsecond", "ns") else v * 1000 if unit in ("msecond", "ms") else v
    tot[name] = tot.get(name, 0) + us
    cnt[name] += 1
    seq.append((name, us))
s = sum(tot.values())
print("kernels %d, sum of durations %.1f us" % (len(seq), s))
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
    print("%9.1f us %5.1f%% %5d x  %s" % (v, 100 * v / s, cnt[k], k))
print("first 40 kernels of the step:")
for n, us in seq[:40]: print("  %8.1f  %s" % (us, n))

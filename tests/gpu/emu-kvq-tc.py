#!/usr/bin/env python3
"""Host emulation of k_kvq_tc's operand layout (src/backend/cuda/kvquant.cu), lane by lane: one warp's run
of 16 keys, the m16n8k16 fragments as the PTX ISA gives them ("Matrix fragments for mma.m16n8k16": A a0/a1
row r cols 2c,2c+1, a2/a3 row r+8, a4..a7 cols +8; B b0 rows 2c,2c+1 col r, b1 rows 2c+8,2c+9; C d0,d1 row r
cols 2c,2c+1, d2,d3 row r+8), the kernel's index expressions for the query's dims, the codes' bytes, the
byte permutes, PACK's rows and its shuffles, and the merge's dim map, compared with the direct sums
s[h][k] = sum_g ks * (q . codes) + kb * sum q and o[h][d] = sum_k p[h][k] * (vs * code + vb).
Values are kept exact (float64; the 16-bit split is emulated as bf16 rounding), so a layout error shows
as an O(1) difference, a correct layout as ~1e-12. Run: /usr/bin/python3 tests/gpu/emu-kvq-tc.py (tests/run.sh
does; a PASS/FAIL line a shape, exit 1 on a mismatch); --bug adds a deliberate dim-map error, to see the check fail."""
import sys
import numpy as np

def bf16(x):
    """round float64 -> bf16 (nearest even), as float64"""
    f = int(np.float32(x).view(np.uint32))
    f = (f + 0x7FFF + ((f >> 16) & 1)) & 0xFFFF0000
    return float(np.uint32(f).view(np.float32))

def split3(v):
    h = bf16(v); m = bf16(v - h); return h, m, v - h - m   # lo kept exact: the check is the layout

def mma(A_lanes, B_lanes):
    """A_lanes[lane] = 8 values (a0..a7), B_lanes[lane] = 4 values (b0..b3): C per lane (4)"""
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        r, c = lane >> 2, lane & 3
        a = A_lanes[lane]
        A[r, 2*c], A[r, 2*c+1], A[r+8, 2*c], A[r+8, 2*c+1] = a[0], a[1], a[2], a[3]
        A[r, 2*c+8], A[r, 2*c+9], A[r+8, 2*c+8], A[r+8, 2*c+9] = a[4], a[5], a[6], a[7]
        b = B_lanes[lane]
        B[2*c, r], B[2*c+1, r], B[2*c+8, r], B[2*c+9, r] = b
    C = A @ B
    out = []
    for lane in range(32):
        r, c = lane >> 2, lane & 3
        out.append(np.array([C[r, 2*c], C[r, 2*c+1], C[r+8, 2*c], C[r+8, 2*c+1]]))
    return out

def a_frag(v, pack, lo_rows):
    """A values (a0..a7 as mma() takes them) of v[4] (cols 2c, 2c+1, 2c+8, 2c+9): mma_a_split / kq_a_pack;
    returns (first product, second product or None)"""
    h, m, l = zip(*[split3(x) for x in v])
    if pack:
        if lo_rows: return [l[0], l[1], 0, 0, l[2], l[3], 0, 0], None
        return [h[0], h[1], m[0], m[1], h[2], h[3], m[2], m[3]], None
    return [h[0], h[1], m[0], m[1], h[2], h[3], m[2], m[3]], [l[0], l[1], 0, 0, l[2], l[3], 0, 0]

def run(HD, BITS, GROUP, g, pack, bug, rng):
    NG, KS, NT, WG, VB = HD // GROUP, HD // 16, HD // 8, GROUP // 8, GROUP // 16
    q = rng.standard_normal((g, HD))
    kc = rng.integers(0, 1 << BITS, (16, HD)); vc = rng.integers(0, 1 << BITS, (16, HD))
    ks, kb, vs, vb = (rng.standard_normal((16, NG)) for _ in range(4))
    p = rng.random((g, 16))
    def row_bytes(codes):   # MLX packing: 4-bit two codes a byte (low nibble first), 8-bit a byte each
        if BITS == 8: return codes.astype(np.uint32)
        return (codes[:, 0::2] | codes[:, 1::2] << 4).astype(np.uint32)
    kbytes, vbytes = row_bytes(kc), row_bytes(vc)
    word_at = lambda rb, kk, b: int(rb[kk, b]) | int(rb[kk, b+1]) << 8 | int(rb[kk, b+2]) << 16 | int(rb[kk, b+3]) << 24
    word = lambda rb, kk, w: word_at(rb, kk, 4*w)
    def perm(x, y, sel):
        b = [(x >> 8*i) & 255 for i in range(4)] + [(y >> 8*i) & 255 for i in range(4)]
        return sum(b[(sel >> 4*i) & 7] << 8*i for i in range(4))
    def nib(x, y, sel):   # kq_bf2_nib: (lo pair, hi pair) as value pairs
        v = perm(x, y, sel)
        return (v & 15, v >> 16 & 15), (v >> 4 & 15, v >> 20 & 15)
    lanes = range(32)
    hr = [(l >> 2) & 3 if pack else l >> 2 for l in lanes]
    lo = [pack and (l >> 2) >= 4 for l in lanes]
    # QK: the query's A operands and sums
    aq = [[None] * KS for _ in lanes]; aql = [[None] * KS for _ in lanes]; qsum = np.zeros((32, NG))
    for l in lanes:
        r, c = l >> 2, l & 3
        for kstep in range(KS):
            qv = []
            for t in range(4):
                d = 16*kstep + (2*c + (t & 1)*8 + (t >> 1) if BITS == 4 else 4*c + t)
                qv.append(q[hr[l], d] if hr[l] < g else 0.0)
            # qsum over the quad (the kernel's shuffles): all 4 values of all 4 c lanes of the step
            aq[l][kstep], aql[l][kstep] = a_frag(qv, pack, lo[l])
    for l in lanes:
        if hr[l] < g:
            for gi in range(NG): qsum[l, gi] = q[hr[l], gi*GROUP:(gi+1)*GROUP].sum()
    sacc = [[[np.zeros(4) for _ in range(2)] for _ in range(NG)] for _ in lanes]
    for nt in range(2):
        for kstep in range(KS):
            B = []
            for l in lanes:
                r, c = l >> 2, l & 3
                kk = nt*8 + r
                if BITS == 4:
                    b0, b1 = nib(word(kbytes, kk, 2*kstep), word(kbytes, kk, 2*kstep+1), c | (4 + c) << 8)
                else:   # word c of the step, each byte under 2^23's exponent by a permute (kq_bf2_w8)
                    w = word(kbytes, kk, 4*kstep + c)
                    f = [float(np.uint32(perm(w, 0x4B, 0x4550 | i)).view(np.float32)) - 8388608.0 for i in range(4)]
                    b0, b1 = (f[0], f[1]), (f[2], f[3])
                B.append([b0[0], b0[1], b1[0], b1[1]])
            C = mma([aq[l][kstep] for l in lanes], B)
            if not pack:
                C2 = mma([aql[l][kstep] for l in lanes], B)
                C = [C[l] + C2[l] for l in lanes]
            for l in lanes: sacc[l][16*kstep // GROUP][nt] += C[l]
    x = np.zeros((32, 4))
    part = np.zeros((32, 4))
    for l in lanes:
        c = l & 3
        for t2 in range(4):
            nt, e = t2 >> 1, t2 & 1; kk = nt*8 + 2*c + e
            part[l, t2] = sum(ks[kk, gi] * (sacc[l][gi][nt][e] + sacc[l][gi][nt][e+2]) for gi in range(NG))
    for l in lanes:
        c = l & 3
        for t2 in range(4):
            kk = (t2 >> 1)*8 + 2*c + (t2 & 1)
            v = part[l, t2] + (part[l ^ 16, t2] if pack else 0.0)
            x[l, t2] = v + sum(kb[kk, gi] * qsum[l, gi] for gi in range(NG))
    err_s = 0.0
    ref_s = np.array([[sum(ks[k, gi] * (q[h, gi*GROUP:(gi+1)*GROUP] @ kc[k, gi*GROUP:(gi+1)*GROUP]) + kb[k, gi] * q[h, gi*GROUP:(gi+1)*GROUP].sum()
                       for gi in range(NG)) for k in range(16)] for h in range(g)])
    for l in lanes:
        if hr[l] < g:
            c = l & 3
            for t2 in range(4):
                err_s = max(err_s, abs(x[l, t2] - ref_s[hr[l], (t2 >> 1)*8 + 2*c + (t2 & 1)]))
    # P V
    o = [[np.zeros(4) for _ in range(NT)] for _ in lanes]
    ob = np.zeros((32, NG))
    for gi in range(NG):
        ap, apl = [], []
        for l in lanes:
            c = l & 3
            ps = []
            for t2 in range(4):
                kk = (t2 >> 1)*8 + 2*c + (t2 & 1)
                pv = p[hr[l], kk] if hr[l] < g else 0.0
                ps.append(pv * vs[kk, gi]); ob[l, gi] += pv * vb[kk, gi]
            a1, a2 = a_frag(ps, pack, lo[l]); ap.append(a1); apl.append(a2)
        tiles = []
        if BITS == 4:
            for j in range(WG // 2):
                sel = 0x0400 | (j & 3) * 0x0101
                B0, B1 = [], []
                for l in lanes:
                    r, c = l >> 2, l & 3
                    vw = []
                    for k in range(4):
                        kk = 2*c + (k & 1) + (k >> 1)*8
                        off = gi*GROUP//2 + r*VB + (4 * (j >> 2) if VB == 8 else 0)   # the word of byte j
                        wv = sum(int(vbytes[kk, off + i]) << 8*i for i in range(min(VB, 4)))
                        vw.append(wv)
                    b0l, b0h = nib(vw[0], vw[1], sel); b1l, b1h = nib(vw[2], vw[3], sel)
                    B0.append([b0l[0], b0l[1], b1l[0], b1l[1]]); B1.append([b0h[0], b0h[1], b1h[0], b1h[1]])
                tiles += [(gi*WG + 2*j, B0), (gi*WG + 2*j + 1, B1)]
        else:   # tile wt: byte wt of the lane's WG bytes of each key (byte gi*G + r*WG on), a permute a code
            for wt in range(WG):
                Bw = []
                for l in lanes:
                    r, c = l >> 2, l & 3
                    cd = []
                    for k in range(4):
                        kk = 2*c + (k & 1) + (k >> 1)*8
                        wv = word_at(vbytes, kk, gi*GROUP + r*WG + 4*(wt >> 2))
                        cd.append(float(np.uint32(perm(wv, 0x4B, 0x4550 | (wt & 3))).view(np.float32)) - 8388608.0)
                    Bw.append(cd)
                tiles.append((gi*WG + wt, Bw))
        for w, Bw in tiles:
            C = mma(ap, Bw)
            if not pack:
                C2 = mma(apl, Bw); C = [C[l] + C2[l] for l in lanes]
            for l in lanes: o[l][w] += C[l]
    # quad sums of ob (the kernel's shuffles)
    obq = np.zeros((32, NG))
    for l in lanes:
        for gi in range(NG): obq[l, gi] = sum(ob[(l & ~3) | cc, gi] for cc in range(4))
    if pack:
        fold = [[np.zeros(4) for _ in range(NT)] for _ in lanes]
        for l in lanes:
            for w in range(NT):
                for e in range(2):
                    s_m = o[l][w][e] + o[l][w][e+2]; s_p = o[l ^ 16][w][e] + o[l ^ 16][w][e+2]
                    fold[l][w][e] = s_m + s_p
        o = fold
    out = np.full((g, HD), np.nan)
    for l in lanes:
        r, c = l >> 2, l & 3
        if r < g:
            for w in range(NT):
                for e in range(2):
                    j = 2*c + e
                    d = w // WG * GROUP + j * WG + w % WG
                    if bug and w == 1 and j == 0: d = (d + 1) % HD
                    out[r, d] = o[l][w][e] + o[l][w][e+2] + obq[l, w // WG]
    ref_o = np.array([[sum(p[h, k] * (vs[k, d // GROUP] * vc[k, d] + vb[k, d // GROUP]) for k in range(16)) for d in range(HD)] for h in range(g)])
    err_o = np.nanmax(np.abs(out - ref_o)) if not np.isnan(out).any() else np.inf
    return err_s, err_o

def main():
    bug = "--bug" in sys.argv
    rng = np.random.default_rng(1)
    worst, bad = 0.0, 0
    for HD, GROUPS in ((64, (32, 64)), (128, (32, 64, 128))):
        for BITS in (4, 8):
            for GROUP in GROUPS:
                for g, pack in ((4, True), (2, True), (1, True), (4, False), (8, False), (3, False)):
                    es, eo = run(HD, BITS, GROUP, g, pack, bug, rng)
                    worst = max(worst, es, eo)
                    bad += not (es < 1e-9 and eo < 1e-9)
                    print("%s k_kvq_tc layout head_dim %d %d-bit group %d g %d pack %d: scores err %.2e, P V err %.2e (bound 1e-9)"
                          % ("PASS" if es < 1e-9 and eo < 1e-9 else "FAIL", HD, BITS, GROUP, g, pack, es, eo))
    print("# worst %.2e" % worst)
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())

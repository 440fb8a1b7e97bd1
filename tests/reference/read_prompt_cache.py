#!/usr/bin/env python3
"""Reads a prompt-cache file the way mlx-lm's load_prompt_cache does (mlx_lm/models/cache.py,
0.32: mx.load(file, return_metadata=True); tree_unflatten of the arrays and of the metadata;
[meta_state, user_metadata, class_names]; Class.from_state(state, meta_state)), with no
package but the standard library, and checks what mlx-lm relies on:
  - tensors named "L.0" / "L.1" for L = 0..n_layers-1 and nothing else, shapes [1, H, T, D],
    a float dtype mlx loads (F32, F16, BF16), keys and values of one layer alike;
  - metadata keys "0.L" (KVCache: "") or "0.L.0".."0.L.3" (RotatingKVCache: keep, max_size,
    offset, _idx, integers), "1.*" strings, "2.L" the class name for every layer;
  - KVCache offset (= T) or RotatingKVCache offset equal to the expected token count.
usage: read_prompt_cache.py FILE CLASS TOKENS   (exit 0 when the file passes)"""
import json
import struct
import sys


def main():
    path, cls, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    b = open(path, "rb").read()
    (n,) = struct.unpack("<Q", b[:8])
    hdr = json.loads(b[8 : 8 + n])
    meta = hdr.pop("__metadata__", {})
    data = b[8 + n :]
    assert all(isinstance(v, str) for v in meta.values()), "metadata values must be strings"
    # tree_unflatten of the metadata: top-level indices 0, 1, 2
    groups = {"0": {}, "1": {}, "2": {}}
    for k, v in meta.items():
        top, _, rest = k.partition(".")
        assert top in groups and rest, f"metadata key {k!r} is not 0.*, 1.* or 2.*"
        groups[top][rest] = v
    classes = groups["2"]
    layers = sorted(int(k) for k in classes)
    assert layers == list(range(len(layers))) and layers, "2.L must name every layer 0..N-1"
    names = set(hdr)
    assert names == {f"{l}.{i}" for l in layers for i in (0, 1)}, f"tensor names {sorted(names)[:6]}..."
    for l in layers:
        assert classes[str(l)] == cls, f"layer {l} is {classes[str(l)]}, expected {cls}"
        k, v = hdr[f"{l}.0"], hdr[f"{l}.1"]
        for t in (k, v):
            assert t["dtype"] in ("F32", "F16", "BF16"), t["dtype"]
            assert len(t["shape"]) == 4 and t["shape"][0] == 1, t["shape"]
            s, e = t["data_offsets"]
            size = {"F32": 4, "F16": 2, "BF16": 2}[t["dtype"]]
            assert e - s == size * t["shape"][0] * t["shape"][1] * t["shape"][2] * t["shape"][3] and e <= len(data)
        assert k["shape"][:3] == v["shape"][:3] and k["dtype"] == v["dtype"]
        T = k["shape"][2]
        if cls == "KVCache":
            assert groups["0"].get(str(l)) == "", "KVCache meta_state must be ''"
            assert T == tokens, f"KVCache offset {T} != {tokens}"
        else:
            keep, max_size, offset, idx = (int(groups["0"][f"{l}.{j}"]) for j in range(4))
            assert offset == tokens and 0 <= keep <= idx <= T <= offset, (keep, max_size, offset, idx, T)
    print(f"ok: {len(layers)} {cls} layers, {tokens} tokens, user keys {sorted(groups['1'])}")


if __name__ == "__main__":
    main()

#!/bin/bash
# A guard-free reference tree for tools/ab_decode.py: revision <rev>'s kdispatch with the page
# guard removed from the row pointers, the latent loads' masks and the scores' mask.
# ab-noguard.* (session 9) used the tree of c65a53b made this way (its latent stage 1 still
# took its row pointers from _row_ptrs).
#   bash bench/results/nvidia-h200/session9/make_noguard.sh <rev> .exp/ab-noguard
set -euo pipefail
rev=${1:-HEAD}; dst=${2:-.exp/ab-noguard}
rm -rf "$dst" && mkdir -p "$dst" && git archive "$rev" kdispatch | tar -x -C "$dst"
python3 - "$dst/kdispatch/kernels/decode_attention" <<'PY'
import sys
d = sys.argv[1]
lat = open(f"{d}/latent.py").read()  # from 3d14c8b the latent loads are masked by page
lat = lat.replace("mask=readable[:, None]", "mask=in_range[:, None]")
open(f"{d}/latent.py", "w").write(lat)
p = f"{d}/kernels.py"
s = open(p).read()
a = '    return tl.where(readable, X + (page64 * stride_p + in_page * stride_t + head), KZ)'
b = '''    pg = tl.load(bt_row + (offs_n // PAGE) * stride_btp, mask=in_range, other=-1)
    valid = (in_range & (pg >= 0) & (pg < num_blocks))[None, :]'''
assert a in s and b in s, "the guard's code moved: edit this script"
s = s.replace(a, '    return X + (page64 * stride_p + in_page * stride_t + head)  # AB: no guard')
s = s.replace(b, '    valid = in_range[None, :]  # AB: no guard')
open(p, 'w').write(s)
PY
echo "guard-free tree of $rev in $dst"

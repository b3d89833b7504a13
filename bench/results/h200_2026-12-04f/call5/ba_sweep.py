import functools
import json

import torch

from lamixer.kernels import block_attention as ba
from lamixer.tools.bench import do_bench

H, D = 16, 128
T, B = 4096, 8
x = [torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(3)]
do = torch.randn_like(x[2])
for w, s, tile in [(4, 2, 64), (4, 1, 64), (4, 3, 64), (8, 2, 64), (8, 1, 64), (4, 2, 32), (8, 2, 128), (4, 2, 64)]:
    ba.WARPS, ba.STAGES = w, s
    ba._tile = lambda q, v, t=tile: t
    call = functools.partial(ba.block_attention, *x, D**-0.5, 128)
    with torch.no_grad():
        fwd = do_bench(call)
    o = call()
    bwd_only = do_bench(lambda: ba._backward(*[t.detach() for t in x], do, D**-0.5, 128, None))
    print(json.dumps(dict(warps=w, stages=s, tile=tile, fwd_us=round(fwd*1e3, 1), bwd_op_us=round(bwd_only*1e3, 1))), flush=True)

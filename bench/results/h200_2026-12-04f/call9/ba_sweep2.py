import json

import torch

from lamixer.kernels import block_attention as ba
from lamixer.runtime.scan import _block_attention
from lamixer.tools.bench import do_bench
from lamixer.tools.check import rel_rms

H, D, T, B = 16, 128, 4096, 8
x = [torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
do = torch.randn_like(x[2])
ref = _block_attention(*x, 128, D**-0.5)
for cfg in [(64, 64, 4, 2), (64, 64, 4, 1), (128, 64, 8, 1), (128, 64, 8, 2), (128, 128, 8, 1), (64, 64, 4, 2)]:
    ba.LAUNCH["fwd"] = cfg
    o = ba.block_attention(*x, D**-0.5, 128)
    us = do_bench(lambda: ba.block_attention(*x, D**-0.5, 128)) * 1e3
    bwd = do_bench(lambda: ba._backward(*x, do, D**-0.5, 128, None)) * 1e3
    print(json.dumps(dict(fwd=cfg, fwd_us=round(us, 1), backward_us=round(bwd, 1), err=round(rel_rms(o.float(), ref.float()), 5))), flush=True)

"""gated_deltaproduct's decode step, lamixer's or FLA's (argv[1]: ours | fla), called and replayed from a CUDA graph
at B = 1, 64, 256: (us called, us replayed) per batch."""
import json
import sys

import torch

import lamixer
from lamixer.tools import bench
from lamixer.tools.check import random_call
from lamixer.tools.peers import COMPETITORS, peer_call

who = sys.argv[1]
m = lamixer.load("gated_deltaproduct")
out = {}
for B in (1, 64, 256):
    tensors, states = random_call(m, B=B, T=1, H=16, size=128, dtype=torch.bfloat16, device="cuda", distinct=False)
    h0 = states[0].float()

    def fn():
        if who == "fla":
            return peer_call(COMPETITORS["gated_deltaproduct"]["decode"], tensors, h0)
        return m(**tensors, initial_state=h0, output_final_state=True, backend="triton")

    with torch.no_grad():
        out[B] = (round(bench.wall_us(fn), 1), round(bench.wall_us(bench.graphed(fn)), 1))
    print(who, B, out[B], flush=True)
print(json.dumps({who: out}))

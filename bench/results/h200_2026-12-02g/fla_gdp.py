"""FLA's gated_deltaproduct decode step (its fused recurrent kernel through lamixer.tools.fla_adapters), eager and
replayed from a CUDA graph at B = 1 and 64, then a layer built: the calls that faulted in `lamixer bench` after
lamixer's own step, run alone."""
import torch

import lamixer
from lamixer.layer import Layer
from lamixer.tools import bench
from lamixer.tools.check import random_call
from lamixer.tools.peers import COMPETITORS, peer_call

m = lamixer.load("gated_deltaproduct")
for B in (1, 64):
    tensors, states = random_call(m, B=B, T=1, H=16, size=128, dtype=torch.bfloat16, device="cuda", distinct=False)
    h0 = states[0].float()

    def fn():
        return peer_call(COMPETITORS["gated_deltaproduct"]["decode"], tensors, h0)

    with torch.no_grad():
        print(B, "eager", bench.wall_us(fn), flush=True)
        replay = bench.graphed(fn)
        print(B, "replay", bench.wall_us(replay), flush=True)
        torch.cuda.synchronize()
        print(B, "after", torch.randn(1000, device="cuda").sum().item(), flush=True)
layer = Layer(m, 2048, 16, backend="triton").to(device="cuda", dtype=torch.bfloat16)
print("layer ok", flush=True)

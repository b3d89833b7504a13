import torch, lamixer
from lamixer.tools import bench
from lamixer.tools.check import random_call
from lamixer.tools.peers import COMPETITORS, peer_call
from lamixer.layer import Layer
m = lamixer.load("gated_deltaproduct")
for B in (1, 64):
    tensors, states = random_call(m, B=B, T=1, H=16, size=128, dtype=torch.bfloat16, device="cuda", distinct=False)
    h0 = states[0].float()
    fn = lambda: peer_call(COMPETITORS["gated_deltaproduct"]["decode"], tensors, h0)
    with torch.no_grad():
        print(B, "eager", bench.wall_us(fn), flush=True)
        r = bench.graphed(fn)
        print(B, "replay", bench.wall_us(r), flush=True)
        torch.cuda.synchronize()
        x = torch.randn(1000, device="cuda").sum().item()
        print(B, "after", x, flush=True)
layer = Layer(m, 2048, 16, backend="triton").to(device="cuda", dtype=torch.bfloat16)
print("layer ok", flush=True)

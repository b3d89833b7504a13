import sys, json, torch, lamixer
from lamixer.tools import bench
from lamixer.tools.check import random_call
from lamixer.tools.peers import COMPETITORS, peer_call
who = sys.argv[1]
m = lamixer.load("gated_deltaproduct")
out = {}
for B in (1, 64, 256):
    tensors, states = random_call(m, B=B, T=1, H=16, size=128, dtype=torch.bfloat16, device="cuda", distinct=False)
    h0 = states[0].float()
    if who == "fla":
        fn = lambda: peer_call(COMPETITORS["gated_deltaproduct"]["decode"], tensors, h0)
    else:
        fn = lambda: m(**tensors, initial_state=h0, output_final_state=True, backend="triton")
    with torch.no_grad():
        out[B] = (round(bench.wall_us(fn), 1), round(bench.wall_us(bench.graphed(fn)), 1))
    print(who, B, out[B], flush=True)
print(json.dumps({who: out}))

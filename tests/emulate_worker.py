"""Run one spec's bf16 forward and backward on the triton backend under lamixer.tools.emulate, print the errors as JSON.

    python emulate_worker.py SPEC B T H D GATE

A process of its own: the patch is global to the interpreter of the process that applies it.
"""
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import lamixer  # noqa: E402
from lamixer.backends import triton as tb  # noqa: E402
from lamixer.kernels import additive, delta  # noqa: E402
from lamixer.tools import emulate  # noqa: E402
from lamixer.tools.check import forward_backward, random_call, rel_rms  # noqa: E402

spec, B, T, H, D, gate = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
emulate.bf16_like_gpu()
seen = set()
def spying(run):
    def spy(ops, dtype, config, **rendered):  # the dtype the chunk kernels run in (rendered: the decay they were rendered for)
        seen.add(str(dtype))
        return run(ops, dtype, config, **rendered)

    return spy


tb.CHUNK_SCANS.update({additive.FAMILY: spying(additive.scan), delta.FAMILY: spying(delta.scan)})
m = lamixer.load(spec)
tensors, states = random_call(m, B=B, T=T, H=H, size=D, gate=gate, dtype=torch.bfloat16, seed=T, distinct=False)
states = tuple(s.float() for s in states)
got = forward_backward(m, tensors, states, "triton")
ref = forward_backward(m, {k: v.double() for k, v in tensors.items()}, tuple(s.double() for s in states), "torch")
print(json.dumps(dict(dtypes=sorted(seen), errors={k: rel_rms(got[k], ref[k]) for k in ref})))

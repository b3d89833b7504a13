"""Compiles, without running, every Triton kernel the given specs launch, for an H200 (sm_90), on a machine with no GPU
(bench/sm90.py: Triton's compiler and ptxas behind a driver that names the target; tests/test_gpu_compile.py starts
it in a process of its own, where no kernel module was imported for the interpreter).

    python compile_worker.py RESULTS DTYPE D SPEC [SPEC ...]

RESULTS gets one row per compiled kernel (spec, dtype, kernel, shared memory in bytes, warps, stages, loads left
synchronous in its loops) for inputs of
DTYPE (bfloat16, float32) and head dims D, or the error that stopped a spec, and the limit a block's shared memory
has.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import sm90  # noqa: E402  (before triton: it unsets TRITON_INTERPRET)
import torch  # noqa: E402

if __name__ == "__main__":
    rows = sm90.compile_specs(sys.argv[4:], (getattr(torch, sys.argv[2]),), D=int(sys.argv[3]))
    with open(sys.argv[1], "w") as f:
        json.dump(dict(rows=rows, shared_limit=sm90.SHARED_LIMIT), f, indent=1)

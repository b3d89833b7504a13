"""Compiles, without running, every Triton kernel the given specs launch, for an H200 (sm_90), on a machine with no GPU.

    python compile_worker.py RESULTS SPEC [SPEC ...]

The CPU interpreter runs the kernels' Python, not Triton's compiler: it misses what only compilation checks (block
pointer offsets must be 32-bit, loop variables take their bounds' types) and what only the hardware limits (shared
memory per block). Here Triton's own compiler, ptxas included (shipped with triton), builds each kernel for
sm_90: the active driver is replaced by one that names that target, and every launch becomes a compile-only
warmup. Each spec runs forward and backward through the chunk kernels (bf16 and float32 inputs, K = V = 128, the
benchmark's head dims, lengths past one chunk), and forward without gradients on a short input (the recurrent
kernel); the
launches get no data, so their results are not looked at. RESULTS gets one row per compiled kernel: its name,
the inputs' dtype, shared memory in bytes, warps and stages, or the spec's error.
"""
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)  # before triton: kernels are compiled, not interpreted

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

import lamixer  # noqa: E402
from lamixer.check import forward_backward, random_call  # noqa: E402


class H200:
    """The driver a launch asks for its device, stream and target: an sm_90 device that is never used."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


def main(out: str, specs: list[str]) -> None:
    driver.set_active(H200())
    rows: list[dict] = []
    spec_name = dtype_name = None
    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        rows.append(dict(spec=spec_name, dtype=dtype_name, kernel=self.__name__, shared=kernel.metadata.shared,
                         warps=kernel.metadata.num_warps, stages=kernel.metadata.num_stages))  # fmt: skip

    JITFunction.run = compile_only
    for spec in specs:
        for dtype in (torch.bfloat16, torch.float32):
            spec_name, dtype_name = os.path.basename(spec), str(dtype).removeprefix("torch.")
            try:
                m = lamixer.load(spec)
                tensors, states = random_call(m, B=1, T=150, H=2, size=128, dtype=dtype, distinct=False, seed=0)
                forward_backward(m, tensors, tuple(s.float() for s in states), "triton")
                short, states = random_call(m, B=1, T=5, H=2, size=128, dtype=dtype, distinct=False, seed=0)
                with torch.no_grad():
                    m(**short, initial_state=tuple(s.float() for s in states) or None, output_final_state=True, backend="triton")
            except Exception as e:  # the test reports it with the spec's name
                rows.append(dict(spec=spec_name, dtype=dtype_name, error=f"{type(e).__name__}: {e}"[:2000]))
    with open(out, "w") as f:
        json.dump(dict(triton=triton.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

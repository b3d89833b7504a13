"""Registers and spills of the recurrent kernel per state block, compiled for a GPU on this machine (no GPU needed).

    python bench/recurrent_registers.py [--arch 90] [--rules additive:key,delta:key,additive:scalar] [--K 16,32,64,128,256]

Triton compiles each (BK, BV, num_warps) for the target and its ptxas reports the registers a thread
uses and any spills; lamixer/kernels/recurrent.py's WARPS and WIDEST tables take, per BK, the
blocks with no spills and few registers for every rule and decay kind. (A [64, 64] block at 4 warps
takes 255 registers and spills while [64, 32] at 2 warps takes 80 to 96: Triton's layouts for the
reductions over K differ by shape, so the table is measured rather than derived.)
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU target, not the interpreter

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from lamixer.render import kernel_cache as triton_backend  # noqa: E402


def _arg_type(name: str) -> str:
    if name != "T" and (name.isupper() or name.startswith(("NORM_", "USE_"))):  # H, K, .., NORM_Q0, USE_AT: the constexprs
        return "constexpr"
    if name in ("g", "qs", "h0", "ht", "af", "cf"):
        return "*fp32"
    if name == "cu_seqlens":
        return "*i64"
    if name in ("T", "o_stride_r") or name.startswith("s"):
        return "i32"
    return "*bf16"  # queries, a, b, c, o: bf16 inputs, as decoding calls it


def compile_kernel(rule: str, decay: str, reads: str, K: int, BV: int, warps: int, arch: int = 90, finished: bool = False):
    """The compiled kernel (Triton's CompiledKernel, its asm holding ptx and cubin) for bf16 inputs, H = 16, V = 256;
    finished: with the key-side operands as Gated DeltaNet's decode step gives them (l2norm of every query, a and
    c, a per-token scalar on a, a per-head factor on c)."""
    mod = triton_backend.kernels("recurrent", rule=rule, decay=decay, reads=reads, acc="float32")
    fn = getattr(mod, f"{mod.NAME}_kernel")
    names = fn.arg_names
    flags = {n: finished and n in ("NORM_A", "NORM_C", "USE_AT", "USE_CF") or (finished and n.startswith("NORM_Q"))
             for n in names if n.startswith(("NORM_", "USE_"))}  # fmt: skip
    values = dict(flags, H=16, K=K, V=256, BK=K, BV=BV, USE_QS=True, IS_VARLEN=False)
    src = ASTSource(fn=fn, signature={n: _arg_type(n) for n in names}, constexprs={(names.index(k),): v for k, v in values.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps))


def registers(kernel, arch: int = 90) -> tuple[int, int]:
    """(registers a thread, bytes spilled) as ptxas -v reports them for the kernel's PTX."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        out = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}a", ptx, "-o", ptx + ".cubin"], capture_output=True, text=True).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = re.search(r"(\d+) bytes spill stores", out)
    return regs, int(spills.group(1)) if spills else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--rules", default="additive:key,delta:key,additive:scalar")
    ap.add_argument("--K", default="16,32,64,128,256")
    args = ap.parse_args()
    for pair in args.rules.split(","):
        rule, decay = pair.split(":")
        for K in (int(k) for k in args.K.split(",")):
            cells = []
            for BV in (16, 32, 64):
                for warps in (1, 2, 4, 8):
                    per_thread = K * BV // (32 * warps)
                    if not 2 <= per_thread <= 128:
                        continue
                    regs, spills = registers(compile_kernel(rule, decay, "after", K, BV, warps, args.arch), args.arch)
                    cells.append(f"BV{BV}/w{warps}:{regs}" + (f"+spill{spills}" if spills else ""))
            print(f"{rule} {decay} K={K}: " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()

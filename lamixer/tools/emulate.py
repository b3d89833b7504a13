"""Triton's CPU interpreter computing bfloat16 and float32 dots as an NVIDIA GPU does, for checking kernels' precision
without one.

Triton 3.6's interpreter holds bfloat16 as raw 16-bit integers: a dot of bfloat16 operands multiplies the integers,
and a cast from float32 truncates where a GPU rounds to nearest. It also ignores a float32 dot's input_precision,
computing every one exactly. So the triton backend runs bfloat16 calls in float32 under it, and a kernel's bf16
rounding is never seen on a CPU (gla's d(log decay) from bf16 strips: 2.1e-2 relative on the H200, 3.7e-3 under
the interpreter).

bf16_like_gpu() patches the interpreter (once, in this process) so that:
- dots of bfloat16 operands multiply their values, accumulating in float32;
- float32 -> bfloat16 casts round to nearest even;
- elementwise arithmetic on bfloat16 operands computes on their values, its result rounded to bfloat16;
- float32 dots round their operands as input_precision says: tf32 (10-bit mantissas), tf32x3 and bf16x3 (a value
  split into a high and a low part, three products), bf16x6 (three parts, six products), ieee exact.
After it (lamixer.backends.triton.bf16_interpreted()), the triton backend runs bfloat16 calls in bfloat16 under the interpreter, and float32 dots at the
precision the GPU would use (LAMIXER_ACC_PRECISION included).

It is measured against the H200: gla at commit 8cec813 (bf16 strips), B = 1, T = 1024, H = 2, D = 128, bf16 inputs
against float64: this interpreter o 3.29e-3, dq 3.28e-3, dk 3.31e-3, dv 3.68e-3, dg 2.07e-2; the H200 at B = 4,
T = 8192, H = 16 o 3.31e-3, dq 3.31e-3, dk 3.32e-3, dv 3.71e-3, dg 2.08e-2.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

_PARTS = {"tf32": ("tf32", 1, 0), "tf32x3": ("tf32", 2, 1), "bf16x3": ("bf16", 2, 1), "bf16x6": ("bf16", 3, 2)}  # format, parts, max i+j


def _to_bf16_bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _round(x: np.ndarray, fmt: str) -> np.ndarray:
    """x (float32) rounded to bf16 (to nearest even) or tf32 (10 mantissa bits, to nearest, ties away: cvt.rna)."""
    if fmt == "bf16":
        return _bf16_value(_to_bf16_bits(x))
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(1 << 12)) & np.uint32(0xFFFFE000)).view(np.float32)


def _split(x: np.ndarray, fmt: str, parts: int) -> list[np.ndarray]:
    out, rest = [], x.astype(np.float32)
    for _ in range(parts):
        p = _round(rest, fmt)
        out.append(p)
        rest = (rest - p).astype(np.float32)
    return out


def dot(a: np.ndarray, b: np.ndarray, precision: str) -> np.ndarray:
    """a @ b (float32) as the GPU's float32 dot at `precision` computes it."""
    if precision not in _PARTS:
        return np.matmul(a, b, dtype=np.float32)
    fmt, parts, reach = _PARTS[precision]
    xa, xb = _split(a, fmt, parts), _split(b, fmt, parts)
    out = np.zeros(a.shape[:-1] + b.shape[-1:], dtype=np.float32)
    for s in range(reach, -1, -1):  # the small products first, as the GPU adds them
        for i in range(s + 1):
            if i < parts and s - i < parts:
                out += np.matmul(xa[i], xb[s - i], dtype=np.float32)
    return out


def bf16_like_gpu() -> None:
    """Patch Triton's interpreter as the module says; idempotent."""
    import triton.language as tl
    from triton.runtime import interpreter as I

    builder = I.InterpreterBuilder
    if getattr(builder, "BF16_LIKE_GPU", False):
        return

    def value(h) -> np.ndarray:
        return _bf16_value(h.data) if h.dtype.scalar == tl.bfloat16 else h.data

    original_dot, original_cast, original_fp_to_fp = builder.create_dot, builder.cast_impl, builder.create_fp_to_fp

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if tl.bfloat16 in (a.dtype.scalar, b.dtype.scalar):
            return I.TensorHandle(np.matmul(value(a), value(b), dtype=np.float32) + d.data, d.dtype.scalar)
        if a.dtype.scalar == tl.float32 and d.data.dtype == np.float32:
            mode = str(getattr(input_precision, "name", input_precision)).lower()
            return I.TensorHandle(dot(a.data, b.data, mode) + d.data, d.dtype.scalar)
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return I.TensorHandle(_to_bf16_bits(src.data), tl.bfloat16)
        return original_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return I.TensorHandle(_to_bf16_bits(src.data), tl.bfloat16)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    def allow_gpu_modes(b) -> None:  # the interpreter allows tf32, tf32x3 and ieee only
        modes = tuple(dict.fromkeys((*b.options.allowed_dot_input_precisions, *_PARTS, "ieee")))
        b.options = dataclasses.replace(b.options, allowed_dot_input_precisions=modes)

    original_init = builder.__init__

    def __init__(self) -> None:
        original_init(self)
        allow_gpu_modes(self)

    builder.__init__ = __init__
    allow_gpu_modes(I.interpreter_builder)
    original_binary, original_unary, original_ternary = builder.binary_op, builder.unary_op, builder.ternary_op

    def rounded(out: np.ndarray):  # an elementwise result on bfloat16 operands: rounded, as the GPU's bf16 op
        if out.dtype == np.bool_:  # a comparison: as the interpreter returns one on bf16 operands
            return I.TensorHandle(out.astype(np.uint16), tl.bfloat16)
        return I.TensorHandle(_to_bf16_bits(out), tl.bfloat16)

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar == tl.bfloat16:
            return rounded(op(value(lhs), value(rhs)))
        return original_binary(self, lhs, rhs, op)

    def unary_op(self, arg, op):
        if arg.dtype.scalar == tl.bfloat16:
            return rounded(op(value(arg)))
        return original_unary(self, arg, op)

    def ternary_op(self, lhs, rhs, other, op):
        if other.dtype.scalar == tl.bfloat16 and op is not np.where:  # a select moves bits: as it is
            return rounded(op(value(lhs), value(rhs), value(other)))
        return original_ternary(self, lhs, rhs, other, op)

    def create_fma(self, x, y, z):
        if z.dtype.scalar == tl.bfloat16:
            return rounded(value(x) * value(y) + value(z))
        return I.TensorHandle(x.data * y.data + z.data, z.dtype.scalar)

    builder.binary_op, builder.unary_op, builder.ternary_op, builder.create_fma = binary_op, unary_op, ternary_op, create_fma
    builder.create_dot, builder.cast_impl, builder.create_fp_to_fp = create_dot, cast_impl, create_fp_to_fp
    builder.create_fp_trunc = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder.BF16_LIKE_GPU = True



class OutOfBounds(RuntimeError):
    """A kernel's load or store reached memory outside every tensor it was given."""


def check_bounds() -> None:
    """Patch the interpreter (once, in this process) so that every unmasked load and store must fall inside one of the
    launch's tensor arguments, else OutOfBounds names the kernel and the address: on a GPU such an access reads
    another allocation's memory or faults ("an illegal memory access"), which poisons the CUDA context of the
    process; the interpreter would read or write the host's memory silently."""
    from triton.runtime import interpreter as I

    executor = I.GridExecutor
    if getattr(executor, "BOUNDS_CHECKED", False):
        return
    state: dict = {"ranges": [], "kernel": ""}
    original_init, original_call = executor._init_args_hst, executor.__call__

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = original_init(self, args_dev, kwargs)
        ranges = []
        for arg in [*args_hst, *kwargs_hst.values()]:
            if isinstance(arg, torch.Tensor) and arg.numel():
                extent = sum((n - 1) * abs(st) for n, st in zip(arg.shape, arg.stride())) + 1
                ranges.append((arg.data_ptr(), arg.data_ptr() + extent * arg.element_size()))
        state["ranges"] = sorted(ranges)
        return args_hst, kwargs_hst

    def __call__(self, *args, **kwargs):
        state["kernel"] = getattr(self.fn, "__name__", str(self.fn))
        return original_call(self, *args, **kwargs)

    def check(ptrs, mask, what):
        addresses = np.asarray(ptrs.data, dtype=np.uint64)[np.asarray(mask.data, dtype=bool)]
        if not addresses.size:
            return
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        inside = np.zeros(addresses.shape, dtype=bool)
        for lo, hi in state["ranges"]:
            inside |= (addresses >= lo) & (addresses + size <= hi)
        if not inside.all():
            bad = int(addresses[~inside][0])
            raise OutOfBounds(f"{state['kernel']}: a {what} of {(~inside).sum()} element(s) outside its tensors, first at {bad:#x}")

    builder = I.InterpreterBuilder
    original_load, original_store = builder.create_masked_load, builder.create_masked_store

    def create_masked_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
        check(ptrs, mask, "load")
        return original_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_modifier, eviction_policy):
        check(ptrs, mask, "store")
        return original_store(self, ptrs, value, mask, cache_modifier, eviction_policy)

    executor._init_args_hst, executor.__call__ = _init_args_hst, __call__
    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
    executor.BOUNDS_CHECKED = True

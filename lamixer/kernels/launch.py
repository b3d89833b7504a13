"""What every kernel family's host code shares: capability checks, chunk indexing, dot precisions, launch helpers."""
from __future__ import annotations

import functools
import os

import torch

# the custom ops' namespace: lamixer's own, or, in a package that carries a copy of this folder, the package's, so both
# register their ops in one process
NAMESPACE = "lamixer" if __package__ == "lamixer.kernels" else __package__.replace(".", "_")
ACC_NAMES = {torch.float32: "float32", torch.float64: "float64"}  # state and accumulator precision, as templates name it


def pow2(n: int, lo: int = 16) -> int:
    """The next power of two at least n and lo (Triton block shapes are powers of two, dots at least 16)."""
    return max(lo, 1 << (max(n, 1) - 1).bit_length())


MAX_HEAD_DIM = 256  # a whole key (or value) row of the state sits in one program's registers


def state_value_block(BW: int, V: int, walks: int, device: torch.device) -> int:
    """The value block of a sequential state pass (scan_delta's, chunk_additive's walks) run as `walks` programs
    (sequence x head, times key blocks where a pass splits the key dim) per value block: the configuration's BW (V's
    power of two at most), halved while the halved block's grid still fits one wave of the device's multiprocessors,
    down to 32 (the narrowest these passes were run at on a GPU). Each program walks every
    chunk in turn: where programs are fewer than multiprocessors, a narrower block shortens each step of that path on
    an idle device, where they are more, it only adds programs (bench/results/NOTES.md, "the strengths' backward,
    timed", and "2026-12-04 (fourth)")."""
    BW = min(BW, pow2(V))
    if device.type != "cuda":
        return BW
    sms = multiprocessors(device)
    while BW > 32 and walks * cdiv(V, BW // 2) <= sms:
        BW //= 2
    return BW


def multiprocessors(device: torch.device) -> int:
    """The device's streaming multiprocessors (a CUDA GPU's; 1 for any other device)."""
    if device.type != "cuda":
        return 1
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def launch_problems(device: torch.device) -> list[str]:
    """Why Triton cannot launch kernels on tensors of this device (empty when it can): CUDA tensors; CPU ones under
    TRITON_INTERPRET=1 or a driver set for them (bench/sm90.py's compile-only one)."""
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return []
    from triton.runtime import driver

    try:
        if driver.active.get_active_torch_device().type == device.type:
            return []
    except RuntimeError:  # no driver at all: no GPU
        pass
    return [f"the inputs are on {device}, and the kernels run on CUDA tensors (on the CPU under TRITON_INTERPRET=1)"]


def chunks(cu_seqlens: torch.Tensor | None, B: int, T: int, BT: int) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
    """(number of chunks, chunk_indices [chunks, 2] = (sequence, chunk within it), chunk_offsets [N + 1] = each
    sequence's first chunk); the two tensors only for packed sequences."""
    if cu_seqlens is None:
        return B * cdiv(T, BT), None, None
    n = (cu_seqlens[1:] - cu_seqlens[:-1] + BT - 1) // BT
    offsets = torch.cat([n.new_zeros(1), n.cumsum(0)])
    total = int(offsets[-1])
    seq = torch.repeat_interleave(torch.arange(len(n), device=n.device), n, output_size=total)
    within = torch.arange(total, device=n.device) - offsets[:-1][seq]
    return total, torch.stack([seq, within], 1).to(torch.int32).contiguous(), offsets.to(torch.int32)


PRECISION = "ieee"  # float32 inputs keep float32 dots (tf32 would cost ~3e-4 relative); half types ignore it


def run_scan_op(op, eager, forward, args: tuple, differentiable: tuple, n: int = 2) -> tuple[torch.Tensor, ...]:
    """The first n outputs (o, final state, ..) of a scan's kernels: through the custom op `op` when torch.compile
    traces, through `eager` (an autograd.Function doing the same without the op's dispatch, returning those n) when
    one of `differentiable` needs a gradient, else straight to `forward` (the op's implementation)."""
    if torch.compiler.is_compiling():
        return op(*args)[:n]
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in differentiable):
        return eager.apply(*args)
    return forward(*args)[:n]


def state_key_block(K: int) -> int:
    """The key block of the sequential state passes (chunk_additive's walks, scan_delta's state pass): the state as
    at most four [BK, BV] blocks (K <= 256)."""
    return min(64, pow2(K))


def state_stages(work: torch.dtype, K: int, token_decay: bool = True) -> int:
    """The sequential state passes' pipeline stages, whatever the configuration's: three for 2-byte intermediates (each
    stage fewer roughly doubles a pass's time), four where the pass loads no per-token decay (token_decay false: its
    loads are the key and value tiles alone, and a fourth stage shortens a long sequence's walk by up to a fifth
    forward and by a thirteenth in reverse: chunk_additive's walks; scan_delta's passes were slower at four),
    two for float32 ones; above K = 128 one fewer, as more would not fit a Hopper block's shared memory
    (bench/results/NOTES.md, "Where the kernels' defaults come from")."""
    stages = (3 if token_decay else 4) if work.itemsize == 2 else 2
    return stages if K <= 128 else stages - 1


ACC_PRECISIONS = ("tf32x3", "bf16x3", "bf16x6", "tf32", "ieee")  # Triton 3.6's for float32 dots on NVIDIA


def bf16_interpreted() -> bool:
    """Whether kernels run under the CPU interpreter as patched by lamixer.emulate.bf16_like_gpu(): bfloat16 dots
    and casts, and float32 dots' input precision, as on the GPU."""
    import sys

    module = sys.modules.get("triton.runtime.interpreter")
    return module is not None and getattr(module.InterpreterBuilder, "BF16_LIKE_GPU", False)


def acc_precision(acc: torch.dtype, default: str = "tf32x3") -> str:
    """How float32 intermediates enter the tensor cores: `default` (tf32x3: about float32's precision), unless
    LAMIXER_ACC_PRECISION names another of ACC_PRECISIONS (for measuring, e.g. bf16x3: three bfloat16 products,
    about 16 bits, fewer registers); float64 and the CPU interpreter (unless bf16_interpreted()) take ieee."""
    if acc == torch.float64 or (os.environ.get("TRITON_INTERPRET") == "1" and not bf16_interpreted()):
        return "ieee"
    mode = os.environ.get("LAMIXER_ACC_PRECISION", default)
    if mode not in ACC_PRECISIONS:
        raise ValueError(f"LAMIXER_ACC_PRECISION={mode!r}: expected one of {', '.join(ACC_PRECISIONS)}")
    return mode


def launch_args(c) -> dict:
    """A configuration's (kernels.config.Config) warps and stages as launch arguments."""
    return dict(num_warps=c.num_warps, num_stages=c.num_stages)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def diagonal_span(dtype: torch.dtype) -> float:
    """The most log decay (nats, along any key) a diagonal strip block may hold for its scores to be one dot of
    q exp(E - P) and a exp(P - B) in the inputs' dtype (chunk_additive's scores_fwd and strips_bwd, scan_delta's
    strips under a per-key decay): the factors then lie within e^-30..e^30 (1e-13..1e13) of q and a, far inside
    bfloat16's and float32's normal range; float16's (6e-5..65504) leaves about e^4 around inputs of order 1..100.
    Blocks of stronger decay take the exact per-column loop."""
    return 4.0 if dtype == torch.float16 else 30.0

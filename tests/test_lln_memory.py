"""What lln's forward keeps for its backward on the chunk kernels: the per-chunk states, the scan's output (the read-out's
division takes it) and small per-token and per-sequence values; its feature maps, their statistics' work and the block
attention are recomputed in the backward (lamixer/runtime/recompute.py), not kept."""
import pytest
import torch

import lamixer
from lamixer.backends import triton as triton_backend
from lamixer.backends.binding import bind
from lamixer.tools.check import compare, random_call

B, T, H, D = 2, 130, 2, 16


def saved_storages(fn) -> tuple[object, dict[int, int]]:
    """fn()'s result and {storage address: bytes} of every storage its autograd graph saved."""
    seen: dict[int, int] = {}

    def pack(t):
        seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, seen


def chunks(m, tensors) -> int:
    """How many chunks the kernels cut the call into (its configuration's chunk length)."""
    call = bind(m.compiled, (), tensors, None, None, None)
    return B * -(-T // triton_backend.chunk_config(m.compiled.plan.groups[0], call, torch.float32).BT)


def lln_call(dtype=torch.float32):
    m = lamixer.load("lln")
    tensors, _ = random_call(m, B=B, T=T, H=H, size=D, dtype=dtype, initial_state=False, distinct=False)
    return m, {k: v.requires_grad_() for k, v in tensors.items()}


def test_lln_forward_keeps_states_and_output_only():
    m, tensors = lln_call()
    (o, *_), seen = saved_storages(lambda: m(**tensors, backend="triton"))
    inputs = {t.untyped_storage().data_ptr() for t in tensors.values()}
    kept = sum(n for p, n in seen.items() if p not in inputs)
    f32 = 4
    states = (chunks(m, tensors) + B) * H * D * (D + 1) * f32  # S and z entering each chunk, the initial ones (zeros)
    output = B * T * H * (D + 1) * f32  # the scan's output and its normaliser's, which the division keeps
    # a feature map kept would add B * T * H * D * 4 bytes (0.94 of `output`), the block attention about three times that
    assert kept <= states + output + 64, f"{kept / (B * T * H):.1f} bytes per token and head kept"
    o.sum().backward()  # what was not kept is recomputed: the backward runs
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in tensors.values())


def test_outer_saved_tensor_hooks_still_see_what_is_kept():
    """A caller's own hooks (offloading, say) pack what the scan keeps, the rebuilt operands apart, and the gradients
    are those of a call without them."""
    m, tensors = lln_call(torch.float64)
    do = torch.randn(B, T, H, D, dtype=torch.float64)
    plain = torch.autograd.grad(m(**tensors, backend="triton")[0], list(tensors.values()), do)
    packed = []

    def pack(t):
        packed.append(tuple(t.shape))
        return t.clone()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o = m(**tensors, backend="triton")[0]
    hooked = torch.autograd.grad(o, list(tensors.values()), do)
    assert (chunks(m, tensors), H, D, D) in packed  # the kernels' per-chunk states
    for a, b in zip(plain, hooked):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_recomputed_feature_maps_give_the_same_gradients(backend):
    """With the feature maps and block attention recomputed in the backward, every output, final state and gradient
    is the interpreter's (float64, packed sequences of odd lengths, initial states)."""
    m = lamixer.load("lln")
    cu = [0, 37, 50, 101]
    tensors, states = random_call(m, H=H, size=D, dtype=torch.float64, cu_seqlens=cu, distinct=True)
    found = compare(m, backend, tensors, states, cu_seqlens=cu)
    assert found.worst < 1e-9, found.errors

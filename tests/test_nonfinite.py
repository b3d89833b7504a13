"""Causality for non-finite values: a NaN or inf at a later token never reaches an earlier output.

The token by token recurrence is causal whatever the values; the chunked scan multiplies a later token's keys and
values by the zero weights of earlier rows, where 0 * inf = NaN, unless it selects instead (runtime/scan.py, and the
Triton chunk kernels' templates/causal.jinja). Specs with whole-input statistics see every token by definition and
are left out.
"""
import os

import pytest
import torch

import lamixer
from lamixer.tools.check import random_call, rel_rms

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples", "specs")
CAUSAL = [n for n in lamixer.shipped_specs() if not lamixer.load(n).compiled.classification.stats]
CAUSAL += [os.path.join(EXAMPLES, f) for f in sorted(os.listdir(EXAMPLES))]
BLOCKS = "mixer blocks\ndims K, V\ninput q[K], k[K], v[V]\nout o = block_attention(q, k, v, size = 16)\n"
T, AT = 40, 30  # one chunk of 64 holds them all
VALUES = [float("nan"), float("inf"), float("-inf")]


def _allowed(value: float, domain: tuple[float, float]) -> bool:
    """Whether a call takes `value` for an input of this domain: NaN lies in every one (runtime/call.py), an infinity
    outside it is refused by the call's domain check (tests/test_call_checks.py)."""
    return value != value or domain[0] <= value <= domain[1]


def _earlier_outputs_unchanged(mixer, backend: str, T: int = T, at: int = AT):
    tensors, states = random_call(mixer, B=2, T=T, H=2, seed=0)
    h0 = states if len(states) > 1 else states[0] if states else None
    clean, _ = mixer(**tensors, initial_state=h0, backend=backend)
    for op in mixer.compiled.graph.operands:
        if op.kind != "input":
            continue
        lo, hi = op.domain
        for value in VALUES:
            if not _allowed(value, op.domain):
                continue
            poisoned = dict(tensors)
            poisoned[op.name] = tensors[op.name].clone()
            poisoned[op.name][1, at] = value
            o, _ = mixer(**poisoned, initial_state=h0, backend=backend)
            assert torch.equal(o[:, :at], clean[:, :at]), f"{mixer.name}: {op.name} = {value} at token {at} changed earlier outputs"
            assert torch.equal(o[0], clean[0]), f"{mixer.name}: {op.name} = {value} in one batch row changed another"


@pytest.mark.parametrize("spec", CAUSAL, ids=[os.path.basename(s) for s in CAUSAL])
def test_a_later_non_finite_input_leaves_earlier_outputs_alone(spec):
    """Found: a NaN or inf key or value at a later token made every earlier output of its chunk NaN (torch backend)."""
    _earlier_outputs_unchanged(lamixer.load(spec), "torch")


def test_block_attention_is_causal_for_non_finite_values():
    _earlier_outputs_unchanged(lamixer.loads(BLOCKS), "torch")


@pytest.mark.parametrize("spec", ["gla", "deltanet", "rwkv6"])
def test_outputs_from_a_non_finite_input_on_are_not_finite(spec):
    """What the selection hides from earlier rows still reaches the rows at and after it: no silent finite answer."""
    mixer = lamixer.load(spec)
    tensors, states = random_call(mixer, B=1, T=T, H=2, seed=0)
    tensors["v"] = tensors["v"].clone()
    tensors["v"][0, AT] = float("nan")
    o, state = mixer(**tensors, backend="torch", output_final_state=True)
    assert o[:, AT:].isnan().any(-1).all()
    assert state.isnan().any()


def test_the_interpreter_is_causal_too():
    _earlier_outputs_unchanged(lamixer.load("gated_deltanet"), "interpret", T=12, at=9)


# the Triton chunk kernels (interpreted), a spec per template and decay kind
NORMALISED = """mixer normalised
dims K, V
input q[K], k[K], v[V], g[] in (-inf, 0)
state S[K, V], z[K]
let phi_q = elu(q) + 1
let phi_k = elu(k) + 1
S = exp(g) * S + outer(phi_k, v)
z = exp(g) * z + phi_k
out o = (phi_q @ S) / (phi_q @ z + 1)
"""
TRITON = {
    "linear_attn": "additive, no decay: the dense scores",
    "simple_gla_bonus.lam": "additive, a scalar decay, a read before the write: the dense scores",
    "gla": "additive, a decay along the key dim: the strips",
    "rwkv6": "additive, a decay along the key dim, a read before the decay: the strips",
    "value_gated.lam": "additive, a decay along the value dim: the strips turned",
    "normalised": "additive with a normaliser (the chunk kernels' ones)",
    "deltanet": "the delta rule, no decay",
    "gated_deltanet": "the delta rule, a scalar decay",
    "kda": "the delta rule, a decay along the key dim",
}
TOKENS = (30, 17, 0, 33)  # where an input turns non-finite: rotated over the heads and inputs


def _load(spec: str):
    if spec == "normalised":
        return lamixer.loads(NORMALISED)
    return lamixer.load(os.path.join(EXAMPLES, spec) if spec.endswith(".lam") else spec)


def _chunked(mixer, backend: str, tensors: dict, states, cu_seqlens):
    """Outputs and final states (a tuple) of a call whose inputs want gradients: the Triton backend then runs the
    chunk kernels (the recurrent kernel serves inference on short sequences)."""
    leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, device=states[0].device)
    o, s = mixer(**leaves, initial_state=states if len(states) > 1 else states[0], output_final_state=True, cu_seqlens=cu,
                 backend=backend)  # fmt: skip
    return o.detach(), tuple(x.detach() for x in (s if isinstance(s, tuple) else (s,)))


def _poison(x: torch.Tensor, i: int, domain, row: int, first: int, end: int) -> dict[int, int]:
    """Input number i non-finite in place at one token per head: NaN, inf, -inf on heads 0, 1, 2, as its domain allows,
    in batch row `row` between tokens first and end; returns {head: token}."""
    at = {}
    for h, value in enumerate(VALUES):
        if _allowed(value, domain):
            at[h] = first + TOKENS[(h + i) % len(TOKENS)] % (end - first)
            x[row, at[h], h] = value
    return at


def _earlier_rows_unchanged(o, clean_o, at: dict[int, int], row: int, first: int, end: int) -> bool:
    for h, value in enumerate(VALUES):
        t = at.get(h, end)
        earlier, before = o[row, first:t, h], clean_o[row, first:t, h]
        # a -inf log decay is floored to the strongest finite one, which may turn a strip of the scores onto its
        # exact per-column path (additive/strips.jinja): earlier rows of that strip then round differently
        if h in at and value == float("-inf") and earlier.numel():
            if not rel_rms(earlier, before) < 1e-13:
                return False
        elif not torch.equal(earlier, before):
            return False
    return True


def _non_finite_as_the_recurrence(o, ref_o, at: dict[int, int], row: int) -> bool:
    """Every output the token by token interpreter gives non-finite is non-finite (no silent finite answer), and no
    other, but for the token's own row: a read before the decay sees its own NaN log decay through the chunk's
    exclusive sums, B - g (as in the torch backend)."""
    bad, ref_bad, own = ~o.isfinite(), ~ref_o.isfinite(), torch.zeros_like(o, dtype=torch.bool)
    for h, t in at.items():
        own[row, t, h] = True
    return not (ref_bad & ~bad).any() and not (bad & ~ref_bad & ~own).any()


def _triton_is_causal(mixer, cu_seqlens=None):
    """Each input in turn non-finite at one token per head of one batch row (one packed sequence): that row's
    (sequence's) earlier outputs stay the clean call's bit for bit, the other rows' (sequences') outputs and final
    states too, and the outputs and final state entries not finite are the token by token interpreter's."""
    tensors, states = random_call(mixer, B=2, T=T, H=len(VALUES), size=16, seed=0, cu_seqlens=cu_seqlens)
    row, first, end = (1, 0, T) if cu_seqlens is None else (0, cu_seqlens[1], cu_seqlens[2])
    clean_o, clean_s = _chunked(mixer, "triton", tensors, states, cu_seqlens)
    for i, op in enumerate(op for op in mixer.compiled.graph.operands if op.kind == "input"):
        x = tensors[op.name].clone()
        at = _poison(x, i, op.domain, row, first, end)
        poisoned = {**tensors, op.name: x}
        o, s = _chunked(mixer, "triton", poisoned, states, cu_seqlens)
        ref_o, ref_s = _chunked(mixer, "interpret", poisoned, states, cu_seqlens)
        what = f"{mixer.name}: {op.name} non-finite at {at}"
        assert _earlier_rows_unchanged(o, clean_o, at, row, first, end), f"{what} changed earlier outputs"
        if cu_seqlens is None:
            others = [(o[0], clean_o[0])] + [(y[0], c[0]) for y, c in zip(s, clean_s)]
        else:
            others = [(o[:, :first], clean_o[:, :first]), (o[:, end:], clean_o[:, end:])]
            others += [(y[n], c[n]) for y, c in zip(s, clean_s) for n in range(len(cu_seqlens) - 1) if n != 1]
        assert all(torch.equal(y, c) for y, c in others), f"{what} in one sequence changed another"
        assert _non_finite_as_the_recurrence(o, ref_o, at, row), f"{what}: outputs not finite other than the interpreter's"
        assert all(torch.equal(y.isfinite(), ref.isfinite()) for y, ref in zip(s, ref_s)), f"{what}: final states not finite other than the interpreter's"


@pytest.mark.parametrize("spec", list(TRITON), ids=list(TRITON))
def test_the_triton_chunk_kernels_are_causal_for_non_finite_values(spec):
    """Found: the chunk kernels' products over a chunk's tokens weighed a later NaN or inf by the zero weight of an
    earlier row (0 * inf = NaN), in the outputs' scores and the delta rule's triangular solve."""
    _triton_is_causal(_load(spec))


@pytest.mark.parametrize("spec", ["gla", "gated_deltanet"])
def test_a_non_finite_value_stays_in_its_packed_sequence(spec):
    _triton_is_causal(_load(spec), cu_seqlens=[0, 9, 31, T])

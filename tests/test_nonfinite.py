"""Causality for non-finite values: a NaN or inf at a later token never reaches an earlier output.

The token by token recurrence is causal whatever the values; the chunked scan multiplies a later token's keys and
values by the zero weights of earlier rows, where 0 * inf = NaN, unless it selects instead (runtime/scan.py).
Specs with whole-input statistics see every token by definition and are left out.
"""
import os

import pytest
import torch

import lamixer
from lamixer.tools.check import random_call

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples", "specs")
CAUSAL = [n for n in lamixer.shipped_specs() if not lamixer.load(n).compiled.classification.stats]
CAUSAL += [os.path.join(EXAMPLES, f) for f in sorted(os.listdir(EXAMPLES))]
BLOCKS = "mixer blocks\ndims K, V\ninput q[K], k[K], v[V]\nout o = block_attention(q, k, v, size = 16)\n"
T, AT = 40, 30  # one chunk of 64 holds them all
VALUES = [float("nan"), float("inf"), float("-inf")]


def _earlier_outputs_unchanged(mixer, backend: str, T: int = T, at: int = AT):
    tensors, states = random_call(mixer, B=2, T=T, H=2, seed=0)
    h0 = states if len(states) > 1 else states[0] if states else None
    clean, _ = mixer(**tensors, initial_state=h0, backend=backend)
    for op in mixer.compiled.graph.operands:
        if op.kind != "input":
            continue
        lo, hi = op.domain
        for value in VALUES:
            if not lo <= value <= hi:  # refused by the call's domain check (tests/test_call_checks.py)
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

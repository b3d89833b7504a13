"""The benchmark's table of peers (lamixer/tools/competitors.json): data that names real inputs, called as it says."""
import sys
import types

import torch

import lamixer
from lamixer.tools import bench


def test_every_peer_names_a_shipped_spec_and_its_inputs():
    assert bench.COMPETITORS
    for name, entry in bench.COMPETITORS.items():
        inputs = set(lamixer.load(name).inputs)
        for when in ("chunk", "decode"):
            call = entry[when]
            assert ":" in call["fn"], (name, when)
            named = [a for a in call["args"]] + [v for v in call.get("kwargs", {}).values() if isinstance(v, str)]
            assert {a.partition(":")[0] for a in named} <= inputs, (name, when, named)


def test_a_peer_is_called_with_the_tensors_its_entry_names(monkeypatch):
    module = types.ModuleType("peer_module")
    module.op = lambda *args, **kwargs: (args, kwargs)
    monkeypatch.setitem(sys.modules, "peer_module", module)
    t = {"q": torch.ones(2), "g": torch.ones(2, dtype=torch.bfloat16)}
    args, kwargs = bench.peer_call({"fn": "peer_module:op", "args": ["q", "g:float32"], "kwargs": {"flag": True, "gk": "g"}}, t, h0="h0")
    assert args[0] is t["q"] and args[1].dtype == torch.float32
    assert kwargs == {"flag": True, "gk": t["g"], "initial_state": "h0", "output_final_state": True}

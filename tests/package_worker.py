"""Runs compiled packages where lamixer cannot be imported (tests/test_package.py starts it).

    python package_worker.py CASES RESULTS

CASES (torch.save'd by the test) names the folders to import from, the mixer calls and the layers;
RESULTS gets their outputs, final states and gradients. Importing lamixer or a compile-time dependency
raises here, so a package that reaches for one fails.
"""
import importlib
import importlib.abc
import importlib.machinery
import os
import sys

BLOCKED = {"lamixer", "lark", "networkx", "jinja2", "click", "rich"}


class Blocker(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the blocked modules (torch probes for some with find_spec) and fails to load them, unless torch itself
    imports one (torch.compile's partitioner imports networkx, its code generation jinja2: torch's own dependencies)."""

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in BLOCKED or _importer_in(("torch", top)):  # torch, or the module's own package once torch let it in
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        raise ImportError(f"{spec.name} may not be imported by a compiled package")

    def exec_module(self, module):
        raise AssertionError("unreachable")


def _importer_in(packages) -> bool:
    """Whether the code asking for the import (the first frame outside the import machinery) is in one of these
    packages."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib") or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    return frame is not None and any(f"{os.sep}{p}{os.sep}" in frame.f_code.co_filename for p in packages)


sys.meta_path.insert(0, Blocker())
try:
    import lamixer  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the import blocker does not block lamixer")

import torch  # noqa: E402


def run_mixer(case: dict) -> dict:
    before = set(sys.modules)
    fn = getattr(importlib.import_module(case["module"]), case["function"])
    fusing = case.get("fuse", False)
    if fusing:  # the CPU stands in for a GPU, torch.compile's aot_eager backend for inductor
        from torch._dynamo.utils import counters

        fuse = importlib.import_module(case["module"].rsplit(".", 1)[0] + ".runtime.fuse")
        fuse.DEVICES, fuse.BACKEND = ("cpu",), "aot_eager"
        counters.clear()
    grad = case.get("grad", True)  # without: inference, where short sequences run on the recurrent kernel
    for _ in range(2 if fusing else 1):  # fused: a signature's first call runs unfused, the second compiled
        leaves = {k: v.clone().requires_grad_(grad) for k, v in case["tensors"].items()}
        h0 = [s.clone().requires_grad_(grad) for s in case["states"]]
        o, finals = fn(*leaves.values(), initial_state=h0[0] if len(h0) == 1 else tuple(h0), output_final_state=True,
                       cu_seqlens=case["cu_seqlens"], scale=case["scale"], backend=case["backend"])  # fmt: skip
        finals = list(finals) if isinstance(finals, tuple) else [finals]
        grads = []
        if grad:
            loss = (o.double() * case["do"]).sum() + sum((f.double() * d).sum() for f, d in zip(finals, case["dfinals"]))
            grads = list(torch.autograd.grad(loss, [*leaves.values(), *h0], allow_unused=True))
    # the rendered kernel modules this call loaded (their host modules, lamixer/kernels' copies, are named otherwise)
    kernels = sorted(m for m in set(sys.modules) - before if ".kernels." in m and m.rpartition(".")[2].startswith(("chunk_", "scan_", "recurrent_")))
    fused = False
    if fusing:
        fused = counters["stats"]["unique_graphs"] > 0
        fuse.DEVICES, fuse.BACKEND = ("cuda",), "inductor"
    return {"o": o.detach(), "finals": [f.detach() for f in finals], "grads": grads, "kernels": kernels, "fused": fused}


def run_layer(case: dict) -> dict:
    Layer = importlib.import_module(case["module"]).Layer
    torch.manual_seed(0)
    fresh = Layer(16, 2, **case["options"]).double()
    same_init = list(fresh.state_dict()) == list(case["state_dict"]) and all(torch.equal(v, case["state_dict"][k]) for k, v in fresh.state_dict().items())
    torch.manual_seed(1)
    layer = Layer(16, 2, **case["options"]).double()
    layer.load_state_dict(case["state_dict"])
    out = {"same_init": same_init, "y": layer(case["x"]), "y_packed": layer(case["x_packed"], cu_seqlens=case["cu_seqlens"])}
    if layer.stateful:
        _, state = layer(case["x"], return_state=True)
        out["y_step"], _ = layer.step(case["x_t"], state)
    return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def main(cases_file: str, results_file: str) -> None:
    cases = torch.load(cases_file, weights_only=True)
    sys.path[:0] = cases["path"]
    results = {"mixers": {key: run_mixer(case) for key, case in cases["mixers"].items()},
               "layers": {key: run_layer(case) for key, case in cases["layers"].items()}}  # fmt: skip
    torch.save(results, results_file)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""lamixer compile: every shipped spec as a Python package that runs without lamixer.

Each spec is compiled on its own (a standalone package) and, once more, all together (the shared
layout generated/ uses). One subprocess, where importing lamixer or a compile-time dependency raises
(tests/package_worker.py), imports them: each mixer runs the random float64 calls the interpreter
runs here (outputs, final states, every gradient; packed sequences too), each Layer is built from
the same seed as lamixer.Layer, loads its state dict and runs the same inputs, and a few specs run
on their Triton kernels (under TRITON_INTERPRET=1 on the CPU), training on each chunk family and
inferring on the recurrent kernel, bit for bit as lamixer's triton backend runs them.
"""
import contextlib
import importlib.util
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import mutated_spec, typed_spec
from test_layers import SMALL

import lamixer
from lamixer.backends.binding import bind
from lamixer.backends.triton import direct_operands
from lamixer.emit import source
from lamixer.emit.mixer_module import MODULE_NAMES
from lamixer.emit.package import package_name
from lamixer.emit.scans_module import modules as configs
from lamixer.emit.write import write
from lamixer.runtime import ops
from lamixer.tools.check import random_call, rel_rms

SPECS = lamixer.shipped_specs()
WORKER = Path(__file__).resolve().parent / "package_worker.py"
CALLS = {"T=24": (None, None), "packed 5+19, scale 0.3": ([0, 5, 24], 0.3)}
# training on each kernel family (gsa: a value-dim decay chained into a key-dim one; a scalar decay; the delta rule) and
# inference on the recurrent kernel; no two cases share a kernel module, so each loads its own
TRITON_CASES = [("gsa", True), ("simple_gla", True), ("deltanet", True), ("gated_deltanet", False), ("gsa", False), ("lln", True)]


def _interpret_case(m, seed: int, cu, scale, dtype=torch.float64, T: int = 24):
    tensors, states = random_call(m, B=2, T=T, seed=seed, cu_seqlens=cu, dtype=dtype)
    if not m.compiled.graph.uses_scale:
        scale = None
    gen = torch.Generator().manual_seed(seed + 1)
    B, T = (1, cu[-1]) if cu else (2, T)
    sizes = {d: int(next(t for op, t in zip(m.compiled.graph.operands, tensors.values()) if d in op.dims).shape[-1]) for d in m.compiled.graph.dims}
    out = m.compiled.graph.dims_of(m.compiled.graph.output)
    do = torch.randn(B, T, 2, *[sizes[d] for d in out], generator=gen, dtype=torch.float64)
    dfinals = [torch.randn(s.shape, generator=gen, dtype=torch.float64) for s in states]
    return {"tensors": tensors, "states": list(states), "cu_seqlens": None if cu is None else torch.tensor(cu), "scale": scale, "do": do,
            "dfinals": dfinals}  # fmt: skip


def _reference(m, case, backend="interpret", grad=True):
    leaves = {k: v.clone().requires_grad_(grad) for k, v in case["tensors"].items()}
    h0 = [s.clone().requires_grad_(grad) for s in case["states"]]
    o, finals = m(**leaves, initial_state=h0[0] if len(h0) == 1 else tuple(h0), output_final_state=True, cu_seqlens=case["cu_seqlens"],
                  scale=case["scale"], backend=backend)  # fmt: skip
    finals = list(finals) if isinstance(finals, tuple) else [finals]
    if not grad:
        return {"o": o, "finals": finals, "grads": []}
    loss = (o.double() * case["do"]).sum() + sum((f.double() * d).sum() for f, d in zip(finals, case["dfinals"]))
    return {"o": o, "finals": finals, "grads": list(torch.autograd.grad(loss, [*leaves.values(), *h0], allow_unused=True))}


def _errors(got, ref) -> dict[str, float]:
    errors = {"o": rel_rms(got["o"], ref["o"])}
    errors.update({f"final {i}": rel_rms(a, b) for i, (a, b) in enumerate(zip(got["finals"], ref["finals"]))})
    errors.update({f"grad {i}": rel_rms(a, b) for i, (a, b) in enumerate(zip(got["grads"], ref["grads"]))})
    return errors


@contextlib.contextmanager
def one_thread():
    """On a loaded machine torch's thread pool makes these tiny calls (float64 depthwise convolutions above all)
    hundreds of times slower than one thread does."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Compile, run everything in one blocked subprocess (one thread on both sides); return (the references, the results)."""
    with one_thread():
        return _run(tmp_path_factory)


def _run(tmp_path_factory):
    root = tmp_path_factory.mktemp("compiled")
    standalone, shared = root / "standalone", root / "shared" / "mixers"
    for name in SPECS:
        write([lamixer.load(name).compiled], standalone)  # `lamixer compile NAME -o standalone`
    write([lamixer.load(name).compiled for name in SPECS], shared)  # `lamixer compile --all -o shared/mixers`
    mixers, layers, refs = {}, {}, {}
    for i, name in enumerate(SPECS):
        m, pkg = lamixer.load(name), package_name(name)
        for j, (label, (cu, scale)) in enumerate(CALLS.items()):
            case = _interpret_case(m, 10 * i + j, cu, scale)
            refs[name, label] = _reference(m, case)
            for layout, module in (("standalone", pkg), ("shared", f"mixers.{pkg}")):
                mixers[f"{name}|{label}|{layout}"] = {**case, "module": module, "function": name, "backend": "torch"}
        torch.manual_seed(0)
        layer = lamixer.Layer(name, 16, 2, **SMALL.get(name, {})).double()
        initial = {k: v.clone() for k, v in layer.state_dict().items()}  # before training-mode calls move running estimates
        gen = torch.Generator().manual_seed(i)
        x, x_packed, x_t = (torch.randn(*shape, generator=gen, dtype=torch.float64) for shape in ((2, 9, 16), (1, 12, 16), (2, 16)))
        cu = torch.tensor([0, 5, 12])
        ref = {"y": layer(x), "y_packed": layer(x_packed, cu_seqlens=cu)}
        if layer.stateful:
            ref["y_step"] = layer.step(x_t, layer(x, return_state=True)[1])[0]
        refs[name, "layer"] = {k: v.detach() for k, v in ref.items()}
        layers[name] = {"module": pkg, "options": SMALL.get(name, {}), "state_dict": initial, "x": x, "x_packed": x_packed,
                        "x_t": x_t, "cu_seqlens": cu}  # fmt: skip
    # the Triton paths: float32 kernels (the interpreter on the CPU), against lamixer's triton backend and the interpreter
    for name, grad in TRITON_CASES:
        m = lamixer.load(name)
        case = _interpret_case(m, 99, None, None, dtype=torch.float32)
        refs[name, "triton", grad] = _reference(m, case, "triton", grad)
        refs[name, "triton interpret", grad] = _reference(m, case, grad=grad)
        mixers[f"triton|{name}|{grad}"] = {**case, "module": f"mixers.{package_name(name)}", "function": name, "backend": "triton", "grad": grad}
    # the per-token work fused by torch.compile (runtime/fuse.py), the CPU standing in for a GPU
    m = lamixer.load("lln")
    case = _interpret_case(m, 98, None, None, dtype=torch.float32)
    refs["lln", "fused"] = _reference(m, case, "triton")
    mixers["fused|lln"] = {**case, "module": f"mixers.{package_name('lln')}", "function": "lln", "backend": "triton", "grad": True, "fuse": True}
    # and a one-token decoding step's (rwkv7: its sub-steps' operands, a bonus) around the recurrent kernel
    m = lamixer.load("rwkv7")
    case = _interpret_case(m, 97, None, None, dtype=torch.float32, T=1)
    refs["rwkv7", "fused decode"] = _reference(m, case, "triton", grad=False)
    mixers["fused|rwkv7|decode"] = {**case, "module": f"mixers.{package_name('rwkv7')}", "function": "rwkv7", "backend": "triton", "grad": False, "fuse": True}

    cases_file, results_file = root / "cases.pt", root / "results.pt"
    torch.save({"path": [str(standalone), str(shared.parent)], "mixers": mixers, "layers": layers}, cases_file)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-W", "error::SyntaxWarning", str(WORKER), str(cases_file), str(results_file)],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return refs, torch.load(results_file, weights_only=True)


@pytest.mark.parametrize("name", SPECS)
def test_mixer_matches_the_interpreter(run, name):
    refs, results = run
    for label in CALLS:
        got = results["mixers"][f"{name}|{label}|standalone"]
        errors = _errors(got, refs[name, label])
        assert max(errors.values()) < 1e-12, (label, errors)
        shared = results["mixers"][f"{name}|{label}|shared"]  # the same code, imported from the shared layout
        assert all(torch.equal(a, b) for a, b in zip([got["o"], *got["finals"]], [shared["o"], *shared["finals"]])), label
        assert got["kernels"] == [], "the torch fallback loaded Triton kernels"


@pytest.mark.parametrize("name", SPECS)
def test_layer_matches_lamixer_layer(run, name):
    refs, results = run
    got, ref = results["layers"][name], refs[name, "layer"]
    assert got["same_init"], "one seed should give lamixer.Layer's parameters, under its names and in its order"
    assert sorted(got) == sorted(["same_init", *ref])
    for key in ref:
        assert rel_rms(got[key], ref[key]) < 1e-13, key


@pytest.mark.parametrize("name, grad", TRITON_CASES)
def test_triton_paths_run_lamixers_kernels(run, name, grad):
    refs, results = run
    got = results["mixers"][f"triton|{name}|{grad}"]
    c = lamixer.load(name).compiled
    want = [k for k in configs(c) if k.startswith("recurrent_") != grad]  # training: the chunk kernels; inference: the recurrent one
    assert got["kernels"] == sorted(f"mixers.kernels.{k}" for k in want)
    same = _errors(got, refs[name, "triton", grad])  # the same kernels as lamixer's triton backend, bit for bit
    # but where lamixer's kernels finish key-side operands themselves (the recurrent kernel's l2norms and a token's
    # scalars, a delta rule's decode; the delta chunk kernels' query l2norm), which the package computes in torch
    # before them: float32 rounding apart. So is o where the chunk kernels take a query's per-head factor, which the
    # package applies to q in torch (the additive output kernel weighs o's rows by it instead)
    tensors, states = random_call(lamixer.load(name), T=4, H=2, seed=0)
    call = bind(c, (), tensors, None, states[0] if len(states) == 1 else states, None)
    operands = direct_operands(c, call, finished=not grad).values()
    finished = any(d.norm or d.token for d in operands)
    if grad and any(d.scaled for d in operands):
        assert same.pop("o") < 1e-6, same
    assert max(same.values()) < 1e-6 if finished else max(same.values()) == 0, same
    interp = _errors(got, refs[name, "triton interpret", grad])  # float32 against the float64 interpreter
    assert max(interp.values()) < 1e-4, interp


def test_static_align_is_ops_align():
    dims = ("K", "V", "M")
    x = {d: n for d, n in zip(dims, (2, 3, 4))}
    for n in range(4):
        for want in itertools.permutations(dims, n):
            for k in range(len(want) + 1):
                for have in itertools.permutations(want, k):
                    if [d for d in want if d in have] != list(have) and len(have) > 2:
                        continue
                    t = torch.randn(5, 1, 3, *[x[d] for d in have])
                    got = eval(source.align("t", have, want), {"t": t})  # the emitted expression
                    assert torch.equal(got, ops.align(t, have, want)), (have, want)


AWKWARD = '''mixer import "a title with a back\\\\slash and \\\\N"
dims K, B
input torch[K], call[K], lambda[B], scan[K] in (-inf, 0), id[]
param dtype[H, K]
state F[K, B]

F = exp(scan) * F + outer(call * dtype * id, lambda)
let T = max(torch, 0.5 * torch)
out ops = scale * T @ F

layer
  option self = 1, nn = 2
  size K = hidden * self / H, B = nn * 4
  proj torch, call, lambda, scan, id
  map scan = logsigmoid(scan)
  param dtype = normal(0, 0.1)
'''


def test_names_python_or_the_generated_code_use_are_renamed(tmp_path):
    """Identifiers from a spec that are keywords, builtins or names the generated code uses still compile and run."""
    m = lamixer.loads(AWKWARD, "awkward.lam")
    write([m.compiled], tmp_path)
    assert (tmp_path / "import_" / "mixer.py").is_file()
    sys.path.insert(0, str(tmp_path))
    try:
        pkg = __import__("import_")
        tensors, states = random_call(m, seed=3)
        args = [tensors[n] for n in ("torch", "call", "lambda", "scan")]  # `lambda` only by position; builtins' names by keyword
        o, final = pkg.import_(*args, id=tensors["id"], dtype=tensors["dtype"], initial_state=states[0], output_final_state=True)
        ref, ref_final = m(**tensors, initial_state=states[0], output_final_state=True, backend="interpret")
        assert rel_rms(o, ref) < 1e-12 and rel_rms(final, ref_final) < 1e-12
        torch.manual_seed(0)
        a = lamixer.Layer(m, 16, 2).double()
        torch.manual_seed(0)
        b = pkg.Layer(16, 2).double()
        x = torch.randn(2, 5, 16, dtype=torch.float64)
        assert torch.equal(a(x), b(x))
        with pytest.raises(pkg.ArgumentError, match="argument 'lambda'"):
            pkg.import_(*[x[..., 0] if k == "lambda" else x for k, x in tensors.items()])
    finally:
        sys.path.remove(str(tmp_path))
        for key in [k for k in sys.modules if k == "import_" or k.startswith("import_.")]:
            del sys.modules[key]


FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "0")) // 10 or 60, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])  # fmt: skip


@contextlib.contextmanager
def compiled_package(mixer, root: Path):
    """`lamixer compile` of mixer into root, imported under a name of its own (then forgotten)."""
    write([mixer.compiled], root)
    name = f"fuzzed_{root.name}"
    spec = importlib.util.spec_from_file_location(name, root / package_name(mixer.name) / "__init__.py")
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    try:
        spec.loader.exec_module(pkg)
        yield pkg
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def test_a_package_checks_a_repeated_signature_once_and_its_values_always(tmp_path, monkeypatch):
    """A package's mixer keeps what the checks of a valid call found for the next call of its signature, as lamixer does
    (runtime/call.py), and still checks every call's cu_seqlens and scale."""
    m = lamixer.load("rwkv6")  # inputs and a per-head param
    with compiled_package(m, tmp_path) as pkg, one_thread():
        fn, module = pkg.rwkv6, sys.modules[pkg.__name__ + ".mixer"]
        checks = []
        monkeypatch.setattr(module, "check", lambda *a: checks.append(1) or pkg.runtime.call.check(*a))
        tensors, states = random_call(m, T=7, seed=0, cu_seqlens=[0, 3, 7])
        kwargs = dict(initial_state=states[0], output_final_state=True, cu_seqlens=torch.tensor([0, 3, 7]), backend="torch")
        first, again = fn(*tensors.values(), **kwargs), fn(*tensors.values(), **kwargs)
        assert len(checks) == 1 and len(module.BINDINGS) == 1 and all(torch.equal(a, b) for a, b in zip(first, again))
        want = m(**tensors, **kwargs)
        assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(again, want))
        for bad, match in (({"cu_seqlens": torch.tensor([0, 5, 3])}, "cu_seqlens"), ({"scale": float("nan")}, "scale")):
            with pytest.raises(pkg.ArgumentError, match=match):
                fn(*tensors.values(), **{**kwargs, **bad})
        with pytest.raises(pkg.ArgumentError, match="'k'"):  # another signature: every check
            fn(*[x[..., :-1] if name == "k" else x for name, x in tensors.items()], **kwargs)


@FUZZ
@given(typed_spec(), st.booleans())
def test_random_typed_mixers_compile_to_packages_that_agree(tmp_path_factory, text, packed):
    """The fuzzer's typed random mixers (tests/test_fuzz.py): each that compiles becomes a package whose mixer computes
    what lamixer's torch backend computes (NaN where it gives NaN), or refuses the call as it does."""
    try:
        mixer = lamixer.loads(text, "typed.lam")
    except lamixer.SpecError:
        return
    with compiled_package(mixer, tmp_path_factory.mktemp("typed")) as pkg:
        _agree(mixer, getattr(pkg, mixer.name), pkg.ArgumentError, packed)


@FUZZ
@given(mutated_spec())
def test_mutated_shipped_specs_compile_to_packages_that_agree(tmp_path_factory, text):
    """Mutations of the shipped specs (tests/test_fuzz.py), layer sections included: each that compiles becomes a package
    whose mixer agrees with the torch backend and whose Layer, from the same seed, has lamixer.Layer's parameters and output
    (or refuses the sizes as it does)."""
    try:
        mixer = lamixer.loads(text, "mutated.lam")
    except lamixer.SpecError:
        return
    with compiled_package(mixer, tmp_path_factory.mktemp("mutated")) as pkg:
        _agree(mixer, getattr(pkg, src_name(mixer)), pkg.ArgumentError, False)
        if mixer.compiled.graph.layer is None:
            return
        with one_thread():
            layers = []
            for make in (lambda: lamixer.Layer(mixer, 16, 2), lambda: pkg.Layer(16, 2)):
                torch.manual_seed(0)
                try:
                    layers.append(make().double())
                except (lamixer.ArgumentError, pkg.ArgumentError) as e:
                    layers.append(str(e))
            a, b = layers
            if isinstance(a, str) or isinstance(b, str):
                assert a == b
                return
            assert list(a.state_dict()) == list(b.state_dict()) and all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
            x = torch.randn(1, 5, 16, dtype=torch.float64)
            try:
                want = a(x)
            except lamixer.ArgumentError as e:  # the mixer may refuse its default scale for these sizes
                with pytest.raises(pkg.ArgumentError, match=re.escape(str(e))):
                    b(x)
                return
            assert torch.allclose(b(x), want, rtol=1e-12, atol=1e-12, equal_nan=True)


def src_name(mixer) -> str:
    """The mixer function's name in its package."""
    return source.Names(MODULE_NAMES).claim(mixer.name)


def _agree(mixer, fn, error, packed) -> None:
    with one_thread():
        cu = [0, 2, 6] if packed else None
        tensors, states = random_call(mixer, B=1, T=6, H=2, size=3, cu_seqlens=cu)
        kwargs = dict(initial_state=states[0] if len(states) == 1 else states, output_final_state=True,
                      cu_seqlens=None if cu is None else torch.tensor(cu))  # fmt: skip
        try:
            want = mixer(**tensors, backend="torch", **kwargs)
        except lamixer.ArgumentError as e:
            with pytest.raises(error) as info:
                fn(*tensors.values(), backend="torch", **kwargs)
            assert str(info.value) == str(e)
            return
        got = fn(*tensors.values(), backend="torch", **kwargs)
        for a, b in zip([got[0], *(got[1] if isinstance(got[1], tuple) else [got[1]])], [want[0], *(want[1] if isinstance(want[1], tuple) else [want[1]])]):
            assert a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)


NUMBERS = """mixer numbers
dims K, V
input q[K], k[K], v[V], g[K] in (-inf, 0), s[]
state S[K, V]
S = exp(g) * S + outer(k * s, v)
out o = scale * q @ S
layer
  option a = 2, lo = 0.5
  size K = hidden / H, V = hidden / H
  proj q, k, v
  map g = max(-exp(q), -2) * lo + (a * 3 - 7)
  map s = 1
"""


def test_layer_numbers_combine_as_lamixer_combines_them(tmp_path):
    """Numbers in a layer section (options, literals, the two combined) keep the layer's dtype, as in lamixer.Layer:
    a number meeting a number is a 0-d float64 tensor, which never promotes a float32 projection."""
    mixer = lamixer.loads(NUMBERS, "numbers.lam")
    with compiled_package(mixer, tmp_path) as pkg, one_thread():
        for dtype in (torch.float32, torch.float64):
            torch.manual_seed(0)
            a = lamixer.Layer(mixer, 16, 2).to(dtype)
            torch.manual_seed(0)
            b = pkg.Layer(16, 2).to(dtype)
            x = torch.randn(2, 5, 16, dtype=dtype)
            y = b(x)
            assert y.dtype == dtype and torch.equal(y, a(x))


def test_package_fuses_the_per_token_work(run):
    """A package runs its chunk kernels' per-token work, and a decoding step's around the recurrent kernel, under
    torch.compile where runtime/fuse.py fuses (here the CPU with the aot_eager backend): the same results as lamixer's
    unfused triton backend, bit for bit."""
    refs, results = run
    for key, ref in (("fused|lln", ("lln", "fused")), ("fused|rwkv7|decode", ("rwkv7", "fused decode"))):
        got = results["mixers"][key]
        assert got["fused"], key
        errors = _errors(got, refs[ref])
        assert max(errors.values()) == 0, (key, errors)


CHECKED = """mixer checked
dims K, V
input q[K], k[K], v[V], g[K] in (-inf, 0), a[]
state S[K, V]
S = exp(g) * (1 - a) * S + outer(k, v)
out o = q @ S
"""


def test_a_package_checks_domains_and_decay_factors_as_lamixer_does(tmp_path):
    """The package's signature carries each input's declared domain (the compiled spec's own), and a decay factor the
    data decides is checked positive before its log is taken: the same ArgumentError as lamixer's, not NaN."""
    m = lamixer.loads(CHECKED, "checked.lam")
    with compiled_package(m, tmp_path) as pkg, one_thread():
        signature = sys.modules[pkg.__name__ + ".mixer"].SIGNATURE
        assert [(op.name, op.domain) for op in signature.operands] == [(op.name, op.domain) for op in m.compiled.signature.operands]
        assert signature.operands[3].domain == (-float("inf"), 0.0)
        readme = (tmp_path / "checked" / "README.md").read_text()
        assert "(`g` in (-inf, 0))" in readme and "decay factor whose log the scans take is checked positive" in readme
        tensors, _ = random_call(m, B=1, T=5, H=2, size=3)
        tensors["a"] = torch.rand_like(tensors["a"]) / 2
        assert torch.allclose(pkg.checked(*tensors.values(), backend="torch")[0], m(**tensors, backend="torch")[0], rtol=1e-12, atol=0)
        for name, index, value, match in (("g", (0, 2, 1, 0), 0.5, "declared domain"), ("a", (0, 3, 1), 1.5, "decay factor of state 'S'")):
            bad = {**tensors, name: tensors[name].clone()}
            bad[name][index] = value
            with pytest.raises(lamixer.ArgumentError, match=match) as want:
                m(**bad, backend="torch")
            with pytest.raises(pkg.ArgumentError) as got:
                pkg.checked(*bad.values(), backend="torch")
            assert str(got.value) == str(want.value)

"""The package's structure: no import cycle, host code that packages can copy whole, one kernel plan read by all."""
import ast
import json
import sys
from pathlib import Path

import networkx as nx
import pytest
from click.testing import CliRunner

import lamixer
from lamixer.tools.cli import main

ROOT = Path(lamixer.__file__).parent
EXAMPLES = sorted((Path(__file__).parent.parent / "examples" / "specs").glob("*.lam"))


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, modules) -> set[str]:
    """The lamixer modules a file imports (inside functions too); `from pkg import sub` counts as sub."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return {m for m in found if m in modules and m != name}


def test_no_import_cycle_among_lamixer_modules():
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        graph.add_edges_from((name, dep) for dep in _imports(name, path, modules))
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, cycles


def test_kernel_host_code_imports_only_what_packages_carry():
    """lamixer/kernels/*.py (but loader.py, which packages write themselves) is copied whole into compiled packages:
    it may import the standard library, torch, triton, lamixer's runtime and its own folder, nothing else."""
    modules = _modules()
    allowed_third_party = {"torch", "triton"}
    for p in sorted((ROOT / "kernels").glob("*.py")):
        if p.name == "loader.py":
            continue
        name = f"lamixer.kernels.{p.stem}" if p.stem != "__init__" else "lamixer.kernels"
        for dep in _imports(name, p, modules):
            assert dep.startswith(("lamixer.runtime", "lamixer.kernels")) and dep != "lamixer.kernels.loader" or dep == "lamixer.kernels.loader", (p.name, dep)
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                top = (node.names[0].name if isinstance(node, ast.Import) else node.module).split(".")[0]
                assert top in sys.stdlib_module_names or top in allowed_third_party or top == "__future__", (p.name, top)


def test_module_names_have_no_twins():
    """One concern per file, each named for it: no two modules of the package share a name."""
    stems = [p.stem for p in ROOT.rglob("*.py") if p.stem != "__init__"]
    stems.remove("errors")  # lamixer/errors.py is the spec side of runtime/errors.py: SpecError built on its LamixerError
    assert sorted(stems) == sorted(set(stems)), sorted(s for s in set(stems) if stems.count(s) > 1)


def _explain_json(spec: str) -> dict:
    result = CliRunner().invoke(main, ["explain", spec, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("spec", [*lamixer.shipped_specs(), *map(str, EXAMPLES)])
def test_explain_json_prints_the_kernel_plan(spec):
    plan = _explain_json(spec)
    compiled = lamixer.load(spec).compiled
    assert plan["spec"] == compiled.name and plan["scans"]
    assert sorted(st for s in plan["scans"] for st in s["states"]) == sorted(compiled.graph.states)
    for s in plan["scans"]:
        assert s["family"] in ("additive", "delta") and s["decay"]["kind"] in ("none", "scalar", "key", "value")
        assert s["read"] in ("before", "mid", "after") or isinstance(s["read"], list)
        train = s["kernels"]["train"]
        assert train is None and s["missing"] or train["module"] == s["config_key"] and train["kernels"]
        decode = s["kernels"]["decode"]
        assert decode is None and s["missing"] or decode["template"] == "recurrent"


def test_the_plan_names_what_each_shipped_spec_runs_on():
    """The decisions the backends read, for specs whose answers are known from their papers."""
    def scans(name):
        return {tuple(s["states"]): s for s in _explain_json(name)["scans"]}

    (gla,) = scans("gla").values()
    assert gla["decay"] == {"kind": "key", "axis": "K", "constant": False} and gla["config_key"] == "chunk_additive_key_after"
    (retnet,) = scans("retnet").values()
    assert retnet["decay"]["kind"] == "scalar" and retnet["decay"]["constant"]
    (rwkv6,) = scans("rwkv6").values()
    assert rwkv6["read"] == "before"
    lln = scans("lln")[("S", "z")]
    assert lln["normaliser"] == "z" and lln["config_key"] == "chunk_additive_none_after_ones"
    gsa = scans("gsa")
    assert gsa[("Kt",)]["decay"]["kind"] == "value" and gsa[("Vt",)]["decay"]["kind"] == "key"
    (gdn,) = scans("gated_deltanet").values()
    assert gdn["family"] == "delta" and gdn["kernels"]["train"]["template"] == "scan_delta"
    # the recurrent kernel finishes l2norm(k) times beta and -l2norm(k); the chunk kernels take plain inputs only
    assert gdn["finished"]["decode"]["write key"] == {"input": "k", "l2norm": True, "factor": None, "token": "beta", "negate": False}
    assert gdn["finished"]["decode"]["erase key"]["negate"] and "write key" not in gdn["finished"]["train"]


def test_explain_json_on_a_users_file(tmp_path):
    spec = tmp_path / "mine.lam"
    spec.write_text("mixer mine\ndims K, V\ninput q[K], k[K], v[V], g[] in (-inf, 0)\nstate S[K, V]\nS = exp(g) * S + outer(k, v)\nout o = q @ S\n")
    (scan,) = _explain_json(str(spec))["scans"]
    assert scan["decay"]["kind"] == "scalar" and scan["config_key"] == "chunk_additive_scalar_after"

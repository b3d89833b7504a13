"""generated/ is what the compiler makes of the shipped specs: any change to generated code shows as a diff."""
import ast
import sys
from pathlib import Path

import lamixer
from lamixer.backends.triton import unsupported
from lamixer.emit.package import runtime_files
from lamixer.emit.write import write

GENERATED = Path(__file__).resolve().parent.parent / "generated"
REGENERATE = "lamixer compile --all -o generated"
HAND_WRITTEN = {"README.md"}


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_generated_code_is_up_to_date(tmp_path):
    write([lamixer.load(n).compiled for n in lamixer.shipped_specs()], tmp_path / "generated")
    fresh = _files(tmp_path / "generated")
    kept = {k: v for k, v in _files(GENERATED).items() if k not in HAND_WRITTEN}
    assert sorted(kept) == sorted(fresh), f"generated/ holds other files than the compiler writes; regenerate: {REGENERATE}"
    for name, text in fresh.items():
        assert kept[name] == text, f"generated/{name} differs from the compiler's output; review and regenerate: {REGENERATE}"


def test_each_additive_kernel_file_defines_its_named_kernels():
    from lamixer.kernels.additive import kernel_names

    files = {p.stem: p for p in (GENERATED / "kernels").glob("*_additive_*.py") if not p.stem.startswith("recurrent")}
    # every configuration the shipped specs classify into, once: gsa's first state decays along the value dim,
    # lln's scan with its normaliser (_ones) and retnet's per-head constant decay
    assert sorted(files) == ["chunk_additive_constant_after", "chunk_additive_key_after", "chunk_additive_key_before", "chunk_additive_none_after",
                             "chunk_additive_none_after_ones", "chunk_additive_scalar_after", "chunk_additive_value_after"]  # fmt: skip
    for stem, path in files.items():
        names = {f.name for f in ast.parse(path.read_text()).body if isinstance(f, ast.FunctionDef)}
        prefix = stem.replace("_ones", "") + "_ones" * stem.endswith("_ones")
        assert names == {f"{prefix}_float32_{k}" for k in kernel_names(stem.split("_")[2])}, path


def test_each_delta_kernel_file_defines_its_named_kernels():
    from lamixer.kernels.delta import kernel_names

    files = list((GENERATED / "kernels").glob("scan_delta_*.py"))
    assert len(files) == 4  # deltanet (no decay), gated_deltanet and gated_deltaproduct (scalar), kda (per-key), rwkv7 (per-key, erase before)
    for path in files:
        names = {f.name for f in ast.parse(path.read_text()).body if isinstance(f, ast.FunctionDef)}
        assert names == {f"{path.stem}_float32_{k}" for k in kernel_names(path.stem.split("_")[2])}, path


def test_each_recurrent_kernel_file_defines_its_kernel():
    files = list((GENERATED / "kernels").glob("recurrent_*.py"))
    assert len(files) == 9  # additive with each decay (key: read before or after), delta with no, scalar and per-key decay (and erase before)
    for path in files:
        names = {f.name for f in ast.parse(path.read_text()).body if isinstance(f, ast.FunctionDef)}
        assert names == {path.stem + "_float32_kernel"}, path


def test_the_shared_runtime_is_lamixers_own_verbatim():
    for name, text in runtime_files().items():
        assert (GENERATED / "runtime" / name).read_text() == text


def test_every_shipped_spec_has_its_package():
    for name in lamixer.shipped_specs():
        pkg = GENERATED / name
        assert {"__init__.py", "mixer.py", "layer.py", "README.md"} <= {p.name for p in pkg.iterdir()}
        readme = (pkg / "README.md").read_text()
        assert readme.startswith(f"# {name}: ") and "## API" in readme and "## What it runs" in readme
        mixer = (pkg / "mixer.py").read_text()
        assert f"\ndef {name}(" in mixer and "\ndef forward(call, scan" in mixer
        if unsupported(lamixer.load(name).compiled):  # no Triton template yet: the package runs on torch alone
            assert "from . import scans" not in mixer and not (pkg / "scans.py").exists()
            continue
        # every spec with kernels reaches them (a chunk family and the recurrent kernel) only through scans.py
        assert "from . import scans" in mixer and (pkg / "scans.py").is_file()
        assert "kernels/`" in readme and "`recurrent_" in readme and ("`chunk_additive_" in readme or "`scan_" in readme)


def test_the_runtime_imports_only_torch_and_the_standard_library():
    allowed = {"torch", "__future__", *sys.stdlib_module_names}
    for name, text in runtime_files().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 1 or node.module.split(".")[0] in allowed, (name, node.module)
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] in allowed for a in node.names), (name, [a.name for a in node.names])

"""generated/ is what the compiler makes of the shipped specs: any change to generated code shows as a diff."""
from pathlib import Path

import pytest

import lamixer
from lamixer.generate import write_kernels

GENERATED = Path(__file__).resolve().parent.parent / "generated"
REGENERATE = 'for s in $(python -c "import lamixer; print(*lamixer.shipped_specs())"); do lamixer compile $s -o generated; done'


@pytest.mark.parametrize("name", lamixer.shipped_specs())
def test_generated_code_is_up_to_date(name, tmp_path):
    fresh = {p.name: p.read_text() for p in write_kernels(lamixer.load(name).compiled, tmp_path)}
    kept = {p.name: p.read_text() for p in (GENERATED / name).iterdir()}
    assert sorted(kept) == sorted(fresh), f"generated/{name} holds other files; regenerate: {REGENERATE}"
    for file, text in fresh.items():
        assert kept[file] == text, f"generated/{name}/{file} differs from the compiler's output; review and regenerate: {REGENERATE}"


def test_compiled_kernels_are_valid_python_naming_each_kernel():
    import ast

    for path in GENERATED.glob("*/scan_additive_*.py"):
        tree = ast.parse(path.read_text())
        names = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
        stem = path.stem + "_float32"
        assert names == {f"{stem}_fwd_kernel", f"{stem}_bwd_kernel_dq", f"{stem}_bwd_kernel_dab"}, path

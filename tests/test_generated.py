"""generated/ is what the compiler makes of the shipped specs: any change to generated code shows as a diff."""
import ast
from pathlib import Path

import lamixer
from lamixer.generate import write

GENERATED = Path(__file__).resolve().parent.parent / "generated"
REGENERATE = "lamixer compile --all -o generated"


def test_generated_code_is_up_to_date(tmp_path):
    write([lamixer.load(n).compiled for n in lamixer.shipped_specs()], tmp_path)
    fresh = {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    kept = {str(p.relative_to(GENERATED)): p.read_text() for p in GENERATED.rglob("*") if p.is_file() and p != GENERATED / "README.md"}
    assert sorted(kept) == sorted(fresh), f"generated/ holds other files than the compiler writes; regenerate: {REGENERATE}"
    for name, text in fresh.items():
        assert kept[name] == text, f"generated/{name} differs from the compiler's output; review and regenerate: {REGENERATE}"


def test_each_kernel_file_defines_its_three_named_kernels():
    files = list((GENERATED / "kernels").glob("scan_additive_*.py"))
    assert len(files) == 5  # every configuration the shipped specs classify into, once
    for path in files:
        tree = ast.parse(path.read_text())
        names = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
        stem = path.stem + "_float32"
        assert names == {f"{stem}_fwd_kernel", f"{stem}_bwd_kernel_dq", f"{stem}_bwd_kernel_dab"}, path


def test_each_recurrent_kernel_file_defines_its_kernel():
    files = list((GENERATED / "kernels").glob("recurrent_*.py"))
    assert len(files) == 7  # additive with each decay (key: read before or after), delta with none and scalar decay
    for path in files:
        names = {f.name for f in ast.parse(path.read_text()).body if isinstance(f, ast.FunctionDef)}
        assert names == {path.stem + "_float32_kernel"}, path


def test_every_shipped_spec_has_its_readme_naming_its_kernels():
    for name in lamixer.shipped_specs():
        text = (GENERATED / name / "README.md").read_text()
        assert f"# {name}: generated code" in text and ("kernels/scan_additive_" in text or "No Triton chunk kernels" in text)
        assert "kernels/recurrent_" in text

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


def test_each_additive_kernel_file_defines_its_named_kernels():
    from lamixer.backends.triton import kernel_names

    files = {p.stem: p for p in (GENERATED / "kernels").glob("*_additive_*.py") if not p.stem.startswith("recurrent")}
    # every configuration the shipped specs classify into, once: gsa's value-dim decay on scan_additive
    assert sorted(files) == ["chunk_additive_key_after", "chunk_additive_key_before", "chunk_additive_none_after",
                             "chunk_additive_scalar_after", "scan_additive_value_after"]  # fmt: skip
    for stem, path in files.items():
        names = {f.name for f in ast.parse(path.read_text()).body if isinstance(f, ast.FunctionDef)}
        assert names == {f"{stem}_float32_{k}" for k in kernel_names(stem.split("_")[2])}, path


def test_each_delta_kernel_file_defines_its_named_kernels():
    from lamixer.backends.triton_delta import KERNELS

    files = list((GENERATED / "kernels").glob("scan_delta_*.py"))
    assert len(files) == 2  # deltanet (no decay) and gated_deltanet (scalar decay)
    for path in files:
        names = {f.name for f in ast.parse(path.read_text()).body if isinstance(f, ast.FunctionDef)}
        assert names == {f"{path.stem}_float32_{k}" for k in KERNELS}, path


def test_each_recurrent_kernel_file_defines_its_kernel():
    files = list((GENERATED / "kernels").glob("recurrent_*.py"))
    assert len(files) == 7  # additive with each decay (key: read before or after), delta with none and scalar decay
    for path in files:
        names = {f.name for f in ast.parse(path.read_text()).body if isinstance(f, ast.FunctionDef)}
        assert names == {path.stem + "_float32_kernel"}, path


def test_every_shipped_spec_has_its_readme_naming_its_kernels():
    for name in lamixer.shipped_specs():
        text = (GENERATED / name / "README.md").read_text()
        assert f"# {name}: generated code" in text and ("kernels/chunk_additive_" in text or "kernels/scan_additive_" in text
                                                         or "kernels/scan_delta_" in text or "No Triton chunk kernels" in text)  # fmt: skip
        assert "kernels/recurrent_" in text

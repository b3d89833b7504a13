"""How `lamixer compile` puts its output in place: whole packages replaced by renames, nothing stale left in them, a compile
cut short leaving the old package, and nothing replaced that lamixer did not write unless forced."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lamixer
from lamixer.api import shipped_source
from lamixer.emit.package import files
from lamixer.emit.write import OutputError, write

LINEAR = shipped_source("linear_attn")
WITHOUT_LAYER = LINEAR.split("\nlayer\n")[0] + "\n"  # the same spec after its layer section was deleted
assert WITHOUT_LAYER != LINEAR


def compiled(text: str = LINEAR):
    return lamixer.loads(text, "linear_attn.lam").compiled


def tree(root: Path) -> dict[str, str]:
    """Every file under root (relative path -> text), bytecode caches aside."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_recompiling_replaces_the_package_as_a_whole(tmp_path):
    written = write([compiled()], tmp_path)
    assert (tmp_path / "linear_attn" / "layer.py").is_file() and all(p.is_file() for p in written)
    (tmp_path / "linear_attn" / "runtime" / "gone.py").write_text("# a runtime module of an older lamixer\n")
    write([compiled(WITHOUT_LAYER)], tmp_path)
    assert tree(tmp_path) == files([compiled(WITHOUT_LAYER)], shared=False)  # exactly the new output: layer.py and gone.py gone
    assert os.listdir(tmp_path) == ["linear_attn"]  # no temporary folder left


def test_a_compile_cut_short_leaves_the_old_package(tmp_path, monkeypatch):
    write([compiled()], tmp_path)
    before = tree(tmp_path)
    done = []
    real = Path.write_text

    def interrupted(self, *args, **kwargs):
        done.append(self)
        if len(done) > 3:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write([compiled(WITHOUT_LAYER)], tmp_path)
    monkeypatch.undo()
    assert tree(tmp_path) == before and os.listdir(tmp_path) == ["linear_attn"]


KILLED = """
import os, sys
from pathlib import Path

import lamixer
from lamixer.emit.write import write

written, real = [], Path.write_text


def killed(self, *args, **kwargs):  # the process killed while writing: nothing of its own runs after
    written.append(self)
    if len(written) > int(sys.argv[2]):
        os._exit(9)
    return real(self, *args, **kwargs)


Path.write_text = killed
write([lamixer.loads(sys.stdin.read(), "linear_attn.lam").compiled], sys.argv[1])
"""


def test_a_killed_compile_leaves_the_old_package_importable(tmp_path):
    write([compiled()], tmp_path)
    before = tree(tmp_path / "linear_attn")
    run = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path), "5"], input=WITHOUT_LAYER, text=True, capture_output=True)
    assert run.returncode == 9, run.stderr
    assert tree(tmp_path / "linear_attn") == before
    spec = importlib.util.spec_from_file_location("killed_compile", tmp_path / "linear_attn" / "__init__.py")
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["killed_compile"] = pkg
    try:
        spec.loader.exec_module(pkg)
        assert callable(pkg.linear_attn) and pkg.Layer
    finally:
        for key in [k for k in sys.modules if k == "killed_compile" or k.startswith("killed_compile.")]:
            del sys.modules[key]


def test_what_lamixer_did_not_write_is_replaced_only_when_forced(tmp_path):
    mine = tmp_path / "linear_attn"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=str(mine)) as e:
        write([compiled()], tmp_path)
    assert isinstance(e.value, lamixer.LamixerError) and "--force" in str(e.value)
    assert tree(tmp_path) == {"linear_attn/notes.txt": "mine"}
    write([compiled()], tmp_path, force=True)
    assert tree(tmp_path) == files([compiled()], shared=False)


def test_a_file_in_the_way_is_replaced_only_when_forced(tmp_path):
    (tmp_path / "linear_attn").write_text("a file")
    with pytest.raises(OutputError, match="linear_attn"):
        write([compiled()], tmp_path)
    write([compiled()], tmp_path, force=True)
    assert (tmp_path / "linear_attn" / "__init__.py").is_file()


def test_another_specs_package_is_not_replaced(tmp_path):
    write([lamixer.loads(LINEAR.replace("mixer linear_attn", "mixer other_attn"), "other_attn.lam").compiled], tmp_path)
    (tmp_path / "other_attn").rename(tmp_path / "linear_attn")
    before = tree(tmp_path)
    with pytest.raises(OutputError, match="'linear_attn'"):
        write([compiled()], tmp_path)
    assert tree(tmp_path) == before


def test_the_output_folder_must_be_a_folder(tmp_path):
    (tmp_path / "out").write_text("a file")
    for force in (False, True):
        with pytest.raises(OutputError, match="not a folder"):
            write([compiled()], tmp_path / "out", force=force)


SPECS = ["linear_attn", "retnet"]


def test_the_shared_layout_replaces_its_entries_and_keeps_the_rest(tmp_path):
    """--all: each package, runtime/, kernels/ and __init__.py replaced whole; a hand-written README (generated/ has one)
    and folders lamixer did not write stay."""
    root = tmp_path / "mixers"
    specs = [lamixer.load(n).compiled for n in SPECS]
    write(specs, root)
    (root / "README.md").write_text("hand-written\n")
    (root / "other").mkdir()
    (root / "other" / "keep.py").write_text("kept = True\n")
    for stale in ("runtime/old.py", "kernels/chunk_additive_gone.py", "retnet/layer_old.py"):
        (root / stale).write_text("# stale\n")
    write(specs, root)
    expected = files(specs, shared=True, top="mixers")
    assert tree(root) == {**expected, "README.md": "hand-written\n", "other/keep.py": "kept = True\n"}
    assert sorted(os.listdir(root)) == sorted(["README.md", "other", "__init__.py", "runtime", "kernels", *SPECS])


@pytest.mark.parametrize("foreign", ["runtime", "__init__.py"])
def test_the_shared_layout_refuses_folders_beside_an_init_that_is_not_its_own(tmp_path, foreign):
    root = tmp_path / "mixers"
    root.mkdir()
    if foreign == "runtime":
        (root / "runtime").mkdir()
        (root / "runtime" / "mine.py").write_text("# mine\n")
    else:
        (root / "__init__.py").write_text('"""my package"""\n')
    before = tree(root)
    with pytest.raises(OutputError, match=str(root / foreign)):
        write([lamixer.load(n).compiled for n in SPECS], root)
    assert tree(root) == before

"""What `lamixer compile` writes: a standalone package per spec, or several sharing their runtime (lamixer/emit/package.py).

Nothing is written in place: the whole output goes to a temporary folder beside the target first, then each top-level entry
it writes (a package folder; in the shared layout also runtime/, kernels/ and the top __init__.py) is moved into place by
renames, replacing the old entry as a whole. So a compile cut short leaves each entry old or new, never half written, and no
file of an earlier compile survives in a folder lamixer writes. Entries lamixer did not write (a hand-written README beside
the packages, other folders) are left alone, and an entry in the way that lamixer did not write is replaced only when forced.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from ..passes.pipeline import Compiled
from ..runtime.errors import LamixerError
from .package import SHARED, files, package_name

STAGING = ".lamixer-compile-"  # the temporary folder's prefix: hidden, and no Python package name
FORCE = "; `lamixer compile --force` (write(..., force=True)) replaces it"


class OutputError(LamixerError):
    """`lamixer compile` cannot write where it was asked to, or would replace what it did not write: the message names the path."""


def write(specs: list[Compiled], out_dir: str | Path, force: bool = False) -> list[Path]:
    """Write the packages of `specs` into out_dir (one spec: standalone; several: sharing runtime/ and kernels/); return
    the files written. Refuses (OutputError) to replace an entry that is not lamixer's for these specs unless `force`."""
    root = Path(out_dir)
    top = root.resolve().name if root.resolve().name.isidentifier() else "DIR"  # what the shared layout is imported as
    out = files(specs, shared=len(specs) > 1, top=top)
    if root.exists() and not root.is_dir():
        raise OutputError(f"{root} is not a folder")
    if not force:
        names = {package_name(c.name): c.name for c in specs}
        for entry in _entries(out):
            _check_ours(root, entry, out, names)
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=root))
    except OSError as e:
        raise OutputError(f"cannot write into {root}: {e}") from e
    try:
        _stage(staging / "new", out)
        (staging / "old").mkdir()
        for entry in _entries(out):
            _swap(staging / "new" / entry, root / entry, staging / "old" / entry)
    except OSError as e:
        raise OutputError(f"cannot write into {root}: {e}") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # the new files not moved in (after a failure), the old ones moved out
    return [root / rel for rel in out]


def _entries(out: dict[str, str]) -> list[str]:
    """The top-level names the output writes, in order: the packages, then the shared folders, the top __init__.py last."""
    return list(dict.fromkeys(PurePosixPath(rel).parts[0] for rel in out))


def _stage(folder: Path, out: dict[str, str]) -> None:
    for rel, text in out.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _swap(new: Path, target: Path, aside: Path) -> None:
    """target replaced by new: a file by one rename (atomic); a folder by two, the old one moved aside first (no rename
    replaces a folder that has files), and moved back should the second fail."""
    if new.is_file() and target.is_file() and not target.is_symlink():
        os.replace(new, target)
        return
    present = target.exists() or target.is_symlink()
    if present:
        os.rename(target, aside)
    try:
        os.rename(new, target)
    except OSError:
        if present:
            os.rename(aside, target)
        raise


def _check_ours(root: Path, entry: str, out: dict[str, str], names: dict[str, str]) -> None:
    """Raise OutputError when root/entry exists and is not what lamixer writes there for these specs: a package folder of
    the same spec, or, in the shared layout, runtime/, kernels/ and __init__.py of a layout lamixer wrote."""
    target = root / entry
    if not (target.exists() or target.is_symlink()):
        return
    if entry == "__init__.py":
        if target.is_file() and not target.is_symlink() and _head(_text(target)) == _head(out[entry]):
            return
        raise OutputError(f"{target} is not the __init__.py of mixers lamixer compiled" + FORCE)
    if target.is_symlink() or not target.is_dir():
        raise OutputError(f"{target} is in the way and not a folder lamixer wrote" + FORCE)
    if entry in SHARED and "__init__.py" in out:
        if _head(_text(root / "__init__.py")) == _head(out["__init__.py"]):
            return
        raise OutputError(f"{target} is not the {entry}/ of mixers lamixer compiled (no __init__.py of theirs beside it)" + FORCE)
    old, new = _text(target / "__init__.py"), out[f"{entry}/__init__.py"]
    if not (_head(old) == _head(new) and _tail(old) == _tail(new)):
        raise OutputError(f"{target} is not a package lamixer compiled from a spec named {names[entry]!r}" + FORCE)


# How lamixer's files say who wrote them, in their first line (lamixer/emit/package.py): a package's __init__.py
# '"""gla: <title>; compiled by lamixer (see README.md).', the shared layout's '"""Mixers compiled by lamixer: <names>.'.
# The first line's head names the spec (or says it is the shared layout); its tail, after the title, says lamixer wrote it.


def _head(text: str) -> str:
    return text.partition("\n")[0].partition(": ")[0]


def _tail(text: str) -> str:
    return text.partition("\n")[0].rpartition("; ")[2]


def _text(path: Path) -> str:
    """The file's text, or "" when it cannot be read as text (missing, a folder, other bytes): then it is not lamixer's."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return ""

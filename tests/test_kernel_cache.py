"""The rendered-kernel cache: where it lives, and that a cache which cannot be read or written costs a warning, never a call."""
import os
import sys
import warnings

import pytest
import torch

import lamixer
from lamixer.render import kernel_cache, templates
from lamixer.tools.check import random_call

KERNEL = ("recurrent", {"rule": "additive", "decay": "none", "reads": "after", "acc": "float32"})


def kernel_file() -> str:
    """The file name the rendered-kernel cache keeps KERNEL under."""
    family, config = KERNEL
    return f"{family}_{templates.digest(templates.render(family, **config))}.py"


def load_kernel():
    family, config = KERNEL
    return kernel_cache.kernels(family, **config)


@pytest.fixture
def fresh_kernels(tmp_path, monkeypatch):
    """A private kernel cache, nothing imported from it yet and no fallback folder made."""
    monkeypatch.setenv("LAMIXER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_cache, "_fallback", None, raising=False)
    kernel_cache.kernels.cache_clear()
    yield tmp_path / "cache"
    kernel_cache.kernels.cache_clear()


def test_kernel_cache_honours_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("LAMIXER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert kernel_cache.cache_dir() == tmp_path / "xdg" / "lamixer" / "kernels"
    monkeypatch.setenv("LAMIXER_CACHE", str(tmp_path / "mine"))
    assert kernel_cache.cache_dir() == tmp_path / "mine" / "kernels"


def test_a_kernel_file_that_is_not_utf8_is_rewritten(fresh_kernels):
    (fresh_kernels / "kernels").mkdir(parents=True)
    path = fresh_kernels / "kernels" / kernel_file()
    path.write_bytes(b"\xff\xfe not a kernel \x80")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = load_kernel()
    assert module.__file__ == str(path) and path.read_text() == templates.render(KERNEL[0], **KERNEL[1])


def break_kernel_path(cache):
    (cache / "kernels" / kernel_file()).mkdir(parents=True)


def break_cache_root(cache):
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("LAMIXER_CACHE names this file")


def break_writes(cache, monkeypatch):
    """A cache folder no file can be created in (as a read-only one; chmod does not stop root, so simulated)."""
    real = kernel_cache.tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and str(dir).startswith(str(cache)):
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(kernel_cache.tempfile, "mkstemp", refuse)


@pytest.mark.parametrize("breakage", ["kernel path is a folder", "LAMIXER_CACHE is a file", "cache folder refuses writes"])
def test_an_unusable_kernel_cache_falls_back_to_a_folder_of_the_process(fresh_kernels, monkeypatch, breakage):
    if breakage == "kernel path is a folder":
        break_kernel_path(fresh_kernels)
    elif breakage == "LAMIXER_CACHE is a file":
        break_cache_root(fresh_kernels)
    else:
        break_writes(fresh_kernels, monkeypatch)
    with pytest.warns(UserWarning, match="kernel cache") as caught:
        module = load_kernel()
        other = kernel_cache.kernels("recurrent", rule="additive", decay="scalar", reads="after", acc="float32")
    assert len([w for w in caught if "kernel cache" in str(w.message)]) == 1  # one warning for the process, not one per kernel
    assert os.path.dirname(module.__file__) == str(kernel_cache._fallback)
    # a cache folder that works but for one kernel's path keeps the others
    assert os.path.dirname(other.__file__) == str(fresh_kernels / "kernels" if breakage == "kernel path is a folder" else kernel_cache._fallback)
    assert hasattr(module, "recurrent_additive_none_after_float32_kernel")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_kernel_cache_falls_back(fresh_kernels):
    folder = fresh_kernels / "kernels"
    folder.mkdir(parents=True)
    folder.chmod(0o555)
    try:
        with pytest.warns(UserWarning, match="kernel cache"):
            assert hasattr(load_kernel(), "recurrent_additive_none_after_float32_kernel")
    finally:
        folder.chmod(0o755)


def test_a_triton_call_survives_a_cache_root_that_is_a_file(fresh_kernels):
    break_cache_root(fresh_kernels)
    m = lamixer.load("linear_attn")
    tensors, _ = random_call(m, T=12, H=2, size=16, dtype=torch.float32, seed=0)
    with pytest.warns(UserWarning, match="kernel cache"):
        o, _ = m(**tensors, backend="triton")
    ref, _ = m(**tensors, backend="interpret")
    assert (o - ref).norm() / ref.norm() < 1e-5

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("LAMIXER_CHECK_BOUNDS") == "1":  # every kernel access inside its tensors (lamixer.tools.emulate.check_bounds)
    from lamixer.tools import emulate

    emulate.check_bounds()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE_SPECS = os.path.join(REPO, "examples", "specs")


@pytest.fixture(scope="session")
def example_specs() -> list[str]:
    return sorted(os.path.join(EXAMPLE_SPECS, f) for f in os.listdir(EXAMPLE_SPECS) if f.endswith(".lam"))


GPU_COMPILE = "test_gpu_compile.py"


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name != GPU_COMPILE)  # first (stable: the others keep their order)


@pytest.fixture(scope="session")
def sm90_compilation(request, tmp_path_factory, example_specs):
    """The sm_90 compilation tests/test_gpu_compile.py checks (tests/compile_worker.py), in worker processes of its
    own. The test comes first: run by `make test`'s parallel workers (pytest-xdist, --dist worksteal), it holds one
    of them while the compilation's processes take, at the lowest priority, the CPU the other tests leave idle, and
    the others take over its share of the tests."""
    from compile_worker import Compilation, kernel_specs

    alone = all(item.path.name == GPU_COMPILE for item in request.session.items)
    compilation = Compilation(kernel_specs(example_specs), tmp_path_factory.mktemp("sm90"), nice=0 if alone else 19)
    yield compilation
    compilation.stop()


class _Poisoned:
    """torch as the kernels' host code sees it in tests: every float tensor it allocates with torch.empty or
    torch.empty_like starts as NaN, so an element a kernel should write and does not fails every comparison."""

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def empty(self, *args, **kwargs):
        return _nan(self._torch.empty(*args, **kwargs))

    def empty_like(self, *args, **kwargs):
        return _nan(self._torch.empty_like(*args, **kwargs))


def _nan(x):
    return x.fill_(float("nan")) if x.is_floating_point() and x.numel() else x


@pytest.fixture(autouse=True, scope="session")
def poisoned_kernel_outputs():
    import torch

    from lamixer.kernels import additive, delta, recurrent

    for module in (additive, delta, recurrent):
        module.torch = _Poisoned(torch)
    yield
    for module in (additive, delta, recurrent):
        module.torch = torch


@pytest.fixture
def tuning_cache(tmp_path, monkeypatch):
    """A private cache folder (LAMIXER_CACHE), the tuning cache read afresh and no configuration remembered."""
    from lamixer.tuning import choose, config_cache

    monkeypatch.setenv("LAMIXER_CACHE", str(tmp_path))
    config_cache._memo.clear()
    choose.forget()
    yield tmp_path
    config_cache._memo.clear()
    choose.forget()

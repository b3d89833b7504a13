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

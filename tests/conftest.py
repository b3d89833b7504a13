import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE_SPECS = os.path.join(REPO, "examples", "specs")


@pytest.fixture(scope="session")
def example_specs() -> list[str]:
    return sorted(os.path.join(EXAMPLE_SPECS, f) for f in os.listdir(EXAMPLE_SPECS) if f.endswith(".lam"))

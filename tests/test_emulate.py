"""lamixer.tools.emulate: the CPU interpreter computing bf16 and float32 dots as the GPU does.

Its dot modes against float64 products, and bf16 kernels run under it: d(log decay), whose error the H200 showed
(gla: 2.1e-2 from bf16 strips) and the plain interpreter could not (it runs bf16 calls in float32)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lamixer.tools import emulate

WORKER = Path(__file__).resolve().parent / "emulate_worker.py"


@pytest.mark.parametrize("mode, low, high", [
    ("ieee", 0, 1e-6),
    ("tf32", 1e-4, 1e-3),  # 10 mantissa bits (2.9e-4)
    ("tf32x3", 0, 1e-6),
    ("bf16x3", 1e-6, 2e-5),  # two 8-bit parts: about 16 bits (4.4e-6)
    ("bf16x6", 0, 1e-6),
])  # fmt: skip
def test_dot_modes_round_as_the_gpu_does(mode, low, high):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 32)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    err = np.sqrt(np.mean((emulate.dot(a, b, mode) - exact) ** 2) / np.mean(exact**2))
    assert low <= err < high, f"{mode}: {err:.2e}"


def test_rounding_to_bf16_is_to_nearest_even():
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-12, -(1 + 2**-8 + 2**-12)], dtype=np.float32)
    assert emulate._bf16_value(emulate._to_bf16_bits(x)).tolist() == [1.0, 1 + 2**-6, 1 + 2**-7, -(1 + 2**-7)]


@pytest.mark.parametrize("spec, shape, gate", [
    ("gla", (1, 200, 2, 64), "normal"),  # dg 2.3e-3; 1.8e-2 with the strips' dots on bf16 operands (H200: 2.1e-2)
    ("gated_deltanet", (2, 63, 4, 64), "strong"),  # dg 4.3e-3; 2.3e-2 with da's state term scaled after its product
    ("kda", (2, 63, 4, 64), "strong"),  # dg 3.1e-3, every intermediate in bf16 (earlier forms of the kernels: 1.4e-2)
    ("retnet", (2, 100, 4, 64), "normal"),  # the constant-decay kernels; o 2.5e-3 (2.7e-3 with q scaled before its dots)
])  # fmt: skip
def test_bf16_kernels_under_emulation(spec, shape, gate):
    """bf16 kernels, run in bf16 as on the GPU: d(log decay), a suffix sum of terms that cancel, stays near the other
    gradients only while its terms are rounded alike (the numbers: the templates' headers)."""
    out = subprocess.run([sys.executable, str(WORKER), spec, *map(str, shape), gate], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["dtypes"] == ["torch.bfloat16"]
    bad = {k: f"{v:.2e}" for k, v in res["errors"].items() if not v < 1e-2}
    assert not bad, bad
    assert res["errors"].get("dg", 0.0) < 7e-3, res["errors"]  # (retnet's decay is no input: no dg)


BOUNDS = """
import sys
import torch
import triton
import triton.language as tl
from lamixer.tools import emulate

emulate.check_bounds()


@triton.jit
def copy(x, y, n, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y + o, tl.load(x + o, mask=o < n), mask=o < n)


x, y = torch.arange(16.0)[:8], torch.zeros(1024)[512:520]  # x[8] is memory, but not x's; y lies far from it
copy[(1,)](x, y, 8, N=16)  # masked to the tensors: fine
assert torch.equal(x, y)
try:
    copy[(1,)](x, y, 9, N=16)  # one element past both
except Exception as e:
    print(type(e.__cause__ or e).__name__, e)
    sys.exit(0)
sys.exit(1)
"""


def test_an_access_outside_the_kernels_tensors_is_caught():
    out = subprocess.run([sys.executable, "-c", BOUNDS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "OutOfBounds" in out.stdout and "copy: a load of 1 element(s) outside its tensors" in out.stdout


NARROW = """
import sys
import torch
import lamixer
from lamixer.tools import emulate
from lamixer.kernels.config import Config
from lamixer.tuning.search import configured
from lamixer.tools.check import compare, random_call

emulate.check_bounds()
m = lamixer.load("gated_deltanet")
# one sequence: a block reaching past a sequence is caught at the tensors' end, the last sequence's (a second adds no check)
tensors, states = random_call(m, B=1, T=70, H=2, size=64, gate="normal", dtype=torch.float32, seed=1, distinct=False)
for config in sys.argv[1:]:
    call = configured(m, {"scan_delta": Config(*map(int, config.split(",")))})
    print(config, compare(m, "triton", tensors, states, call=call).worst)
"""


def test_narrow_delta_blocks_stay_inside_their_tensors():
    """The configurations that raised an illegal memory access on the H200 (16- and 32-wide value blocks, 32-row key
    blocks; bench/results/NOTES.md) read and write only their tensors here, and compute the right values: the fault
    was the compiled code's (compute-sanitizer: the output kernel's 16-wide bf16 dot addressed shared memory out of
    range; kernels/delta.py CHUNK_BLOCK)."""
    configs = ["64,16,64,4,1,16,16,8", "64,32,64,4,1,32,32,8", "64,64,32,4,1,32,0,8", "32,128,32,8,2,16,32,4"]
    out = subprocess.run([sys.executable, "-c", NARROW, *configs], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    worst = {line.split()[0]: float(line.split()[1]) for line in out.stdout.strip().splitlines()}
    assert list(worst) == configs and all(w < 1e-4 for w in worst.values()), worst

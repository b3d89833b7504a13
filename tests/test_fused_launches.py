"""What a fused forward launches on an H200, as inductor writes it (bench/fused_sm90.py, no GPU needed): each launch
costs host time that a forward of short kernels waits for, so the counts are held here. In a process of its own: the
tool stands in for a CUDA runtime inside torch."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def launches(specs: str) -> dict[str, tuple[int, int]]:
    """{spec: (inductor's launches, lamixer ops)} of each spec's fused forward at the bench's shape."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "fused_sm90.py"), "--specs", specs], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return {name: (int(k), int(o)) for name, k, o in re.findall(r"^(\S+): (\d+) inductor launches, (\d+) lamixer ops$", out.stdout, re.M)}


def test_the_fused_forwards_launch_what_their_work_needs():
    """lln: two launches per whole-input std (a split Welford reduction: seven when each token's moments were
    combined in a second stage), three for the max per batch and head with its feature map, one for the other feature
    map; the chunk scan and block attention. deltanet (no per-token work: it runs unfused, each op a launch): its
    operands go to its kernels as the caller gave them, the strength included (a conversion each way before), so
    nothing but its op. rwkv7 and gated_deltaproduct (two writes a token): the sub-steps' operands assembled in torch,
    but a per-key log decay at one sub-step goes to the kernels as the caller gave it (rwkv7's was a float32 copy) and
    the kernels finish a query's scale and l2norm (each was a pass of its own); rwkv7's four kernels make its removal
    key's l2norm, the sub-steps' operands and the bonus, gated_deltaproduct's five its keys' l2norms and its operands."""
    found = launches("lln,deltanet,rwkv7,gated_deltaproduct")
    assert found["lln"] == (9, 2), found
    assert found["deltanet"] == (0, 1), found
    assert found["rwkv7"] == (4, 1), found
    assert found["gated_deltaproduct"] == (5, 1), found

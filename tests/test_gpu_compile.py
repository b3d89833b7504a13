"""Every generated Triton kernel compiles for the H200 (sm_90) with the default configurations, for bf16 and
float32 inputs, on this machine without a GPU (tests/compile_worker.py, bench/sm90.py: Triton's compiler and ptxas,
launches turned into compile-only warmups).

The interpreter the other tests run kernels under does not compile them: a kernel it runs correctly can still be
refused by the compiler (a block pointer given a 64-bit offset: the loop over chunks took its bound's int64 type)
or by the hardware (more shared memory than a block may have: the delta rule's reverse pass at three stages on
float32 inputs, 327680 bytes)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import lamixer

WORKER = Path(__file__).resolve().parent / "compile_worker.py"
SHARED_LIMIT = 232448  # bytes of shared memory one block may use on sm_90 (227 KB; bench/sm90.py has it too)


def test_every_kernel_compiles_for_the_h200(tmp_path, example_specs):
    specs = [str(p) for p in sorted(Path(lamixer.__file__).parent.joinpath("specs").glob("*.lam"))] + example_specs
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")  # compiled here, not found in an earlier run's cache
    env["LAMIXER_CACHE"] = str(tmp_path / "lamixer")  # the default configurations, no tuned ones
    runs = {dtype: (tmp_path / f"{dtype}.json") for dtype in ("bfloat16", "float32")}  # one process each, side by side
    logs = {dtype: open(tmp_path / f"{dtype}.log", "w") for dtype in runs}
    procs = {dtype: subprocess.Popen([sys.executable, str(WORKER), str(out), dtype, *specs], env=env, stdout=logs[dtype],
                                     stderr=subprocess.STDOUT) for dtype, out in runs.items()}  # fmt: skip
    rows = []
    for dtype, proc in procs.items():
        proc.wait(timeout=1200)
        logs[dtype].close()
        assert proc.returncode == 0, (tmp_path / f"{dtype}.log").read_text()[-3000:]
        rows += json.loads(runs[dtype].read_text())["rows"]
    errors = [f"{r['spec']} ({r['dtype']}): {r['error']}" for r in rows if "error" in r]
    assert not errors, "\n".join(errors)
    kernels = {r["kernel"] for r in rows}
    for family, stages in {"chunk_additive": ("state_fwd", "output_fwd", "state_bwd", "grads_bwd", "scores_fwd", "strips_bwd"),
                           "scan_delta": ("prepare_kernel", "state_kernel", "output_kernel", "bwd_dv_kernel", "bwd_dh_kernel", "bwd_grad_kernel"),
                           "scan_additive": ("fwd_kernel",), "recurrent": ("kernel",)}.items():  # fmt: skip
        for stage in stages:
            assert any(k.startswith(family) and k.endswith(stage) for k in kernels), f"no {family} {stage} compiled"
    assert {r["spec"] for r in rows} == {os.path.basename(s) for s in specs}
    big = [f"{r['kernel']} ({r['spec']}, {r['dtype']}): {r['shared']} bytes" for r in rows if r["shared"] > SHARED_LIMIT]
    assert not big, "more shared memory than an sm_90 block has: " + ", ".join(big)

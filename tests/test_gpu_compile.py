"""Every generated Triton kernel compiles for the H200 (sm_90) with the default configurations, for bf16 and
float32 inputs, at head dims of 128 and 256, on this machine without a GPU (tests/compile_worker.py, bench/sm90.py:
Triton's compiler, launches turned into compile-only warmups): to machine code through ptxas for bf16 at 128, the
benchmark's inputs; through every Triton pass and the shared-memory allocation for the others.

The interpreter the other tests run kernels under does not compile them: a kernel it runs correctly can still be
refused by the compiler (a block pointer given a 64-bit offset: the loop over chunks took its bound's int64 type)
or by the hardware (more shared memory than a block may have: the delta rule's reverse pass at three stages on
float32 inputs, 327680 bytes; at head dims of 256, 245760 at two stages on float32 and three on bf16;
chunk_additive's gradient kernel at head dims of 256 and 64-token chunks, 245760 to 393216).

The compilation runs in processes of its own (conftest.py's sm90_compilation fixture); this test runs first and waits
for it, while `make test`'s other parallel workers run the other tests."""
import os

from compile_worker import DTYPES, HEAD_DIMS, MACHINE_CODE

import lamixer


def test_every_kernel_compiles_for_the_h200(sm90_compilation):
    rows, limit = sm90_compilation.result(timeout=1800)
    errors = [f"{r['spec']} ({r['dtype']}): {r['error']}" for r in rows if "error" in r]
    assert not errors, "\n".join(errors)
    # the check spec compiled both ways: the lowered way allocates the shared memory a full compilation does
    dtype, D, spec = sm90_compilation.check
    both = {way: sorted((r["kernel"], r["shared"]) for r in rows if r["spec"] == os.path.basename(spec) and r["dtype"] == f"{dtype}, D = {D}"
                        and r["machine_code"] == way) for way in (True, False)}  # fmt: skip
    assert both[True] and both[True] == both[False], both
    rows = [r for r in rows if r["machine_code"] == (r["dtype"] == "{}, D = {}".format(*MACHINE_CODE))]  # the check's lowered rows left out
    kernels = {r["kernel"] for r in rows}
    for family, stages in {"chunk_additive": ("state_fwd", "cumsum_fwd", "output_fwd", "state_bwd", "grads_bwd", "scores_fwd", "strips_bwd",
                                              "decay_bwd"),
                           "chunk_additive_value": ("state_fwd", "output_fwd", "strips_bwd", "grads_bwd"),
                           "scan_delta": ("prepare_kernel", "state_kernel", "output_kernel", "bwd_dv_kernel", "bwd_dh_kernel", "bwd_grad_kernel"),
                           "recurrent": ("kernel",), "block_attention": ("fwd_kernel", "dq_kernel", "dkv_kernel")}.items():  # fmt: skip
        for stage in stages:
            assert any(k.startswith(family) and k.endswith(stage) for k in kernels), f"no {family} {stage} compiled"
    # every spec compiled kernels at every dtype and head dim
    expected = {(os.path.basename(s), f"{dtype}, D = {D}") for s in sm90_compilation.specs for dtype in DTYPES for D in HEAD_DIMS}
    assert {(r["spec"], r["dtype"]) for r in rows} == expected
    big = [f"{r['kernel']} ({r['spec']}, {r['dtype']}): {r['shared']} bytes" for r in rows if r["shared"] > limit]
    assert not big, "more shared memory than an sm_90 block has: " + ", ".join(big)
    # the sequential state passes are latency-bound: every load of their loops must be one the pipeliner makes
    # asynchronous or the template issues an iteration ahead (a load initialising a dot's accumulator, or one feeding
    # no dot, is neither: the delta state pass took 325 us a call that way on the H200, 217 without; kda's 880, 800
    # without). Under a decay the delta rule's reverse pass also reads the state at segment ends, in a branch
    shipped = {f"{n}.lam" for n in lamixer.shipped_specs()}
    passes = ("state_kernel", "bwd_dh_kernel", "state_fwd", "state_bwd")
    stalled = [f"{r['kernel']} ({r['spec']}, {r['dtype']}): {r['loop_loads']}" for r in rows
               if "error" not in r and r["spec"] in shipped and r["kernel"].endswith(passes) and r["loop_loads"]
               and r["dtype"] == "bfloat16, D = 128" and not (r["kernel"].endswith("bwd_dh_kernel") and "_none_" not in r["kernel"])]  # fmt: skip
    assert not stalled, "loads left synchronous in a sequential pass: " + ", ".join(stalled)

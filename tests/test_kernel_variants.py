"""bench/kernel_variants.py under the interpreter: its overrides and edits reach the kernels, and a variant that changes
the results without being marked an ablation fails the run."""
import json
import os
import subprocess
import sys

TOOL = os.path.join(os.path.dirname(__file__), "..", "bench", "kernel_variants.py")
WEIGH = ["b_ud = b_u * b_eR[:, None]", "b_ud = b_u", "state_kernel"]  # the state pass's values left unweighed


def _run(tmp_path, variants, *args):
    path = tmp_path / "variants.json"
    path.write_text(json.dumps(variants))
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, TOOL, "--variants", str(path), *args], capture_output=True, text=True, timeout=600, env=env)


def test_variants_that_keep_the_results_pass_and_ablations_are_told_apart(tmp_path):
    out = _run(tmp_path, [["base", {}, []], ["one grad stage", {"bwd_grad_kernel": {"num_stages": 1}}, []],
                          ["unweighed (wrong)", {}, [WEIGH]]])  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    errors = {line[:40].strip(): float(line[40:]) for line in out.stdout.splitlines()}
    assert errors["base"] == errors["one grad stage"] == 0.0
    assert errors["unweighed (wrong)"] > 1e-2  # the edit reached the kernel


def test_a_variant_that_changes_the_results_fails(tmp_path):
    out = _run(tmp_path, [["unweighed", {}, [WEIGH]]])
    assert out.returncode != 0 and "results changed" in out.stderr


def test_an_edit_that_finds_nothing_fails(tmp_path):
    out = _run(tmp_path, [["missing", {}, [["no such line", "", "state_kernel"]]]])
    assert out.returncode != 0 and "0 occurrences" in out.stderr


def test_the_additive_kernels_take_overrides_and_edits(tmp_path):
    """--family additive: a launch override leaves the results, an edit of the output kernel's source reaches it."""
    chunk_part = ["b_o += tl.dot(b_A.to(b_b.dtype), b_b, input_precision=PRECISION)", "pass", "output_fwd"]
    out = _run(tmp_path, [["base", {}, []], ["reverse walk at 4 stages", {"state_bwd": {"num_stages": 4}}, []],
                          ["no chunk part (wrong)", {}, [chunk_part]]], "--family", "additive", "--decay", "constant")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    errors = {line[:40].strip(): float(line[40:]) for line in out.stdout.splitlines()}
    assert errors["base"] == errors["reverse walk at 4 stages"] == 0.0 and errors["no chunk part (wrong)"] > 1e-2

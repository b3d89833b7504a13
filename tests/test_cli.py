"""The command line, through click's runner (a real process where one matters: imports, the environment)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

import lamixer
from lamixer.tools import cli
from lamixer.tools.cli import main

REPO = Path(__file__).parent.parent
WIDE = {"COLUMNS": "200"}  # rich wraps tables at 80 columns where output is not a terminal


def run(*args, env=None):
    result = CliRunner(env={**WIDE, **(env or {})}).invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info  # no traceback, ever
    return result.exit_code, result.output


def run_process(*args, env=None, drop=()):
    """lamixer ARGS as its own process (python -m, so it runs this checkout): (exit status, stdout, stderr)."""
    environ = {k: v for k, v in os.environ.items() if k not in drop} | WIDE | (env or {})
    p = subprocess.run([sys.executable, "-m", "lamixer.tools.cli", *args], capture_output=True, text=True, env=environ, cwd=REPO, timeout=300)
    return p.returncode, p.stdout, p.stderr


def commands():
    return sorted(main.commands)


def test_list_shows_every_shipped_spec_with_its_classification():
    code, out = run("list")
    assert code == 0
    for name in lamixer.shipped_specs():
        assert name in out
    assert "slot-softmax" in out and "delta" in out and "read before update" in out


def test_explain_prints_classification_and_plan(tmp_path):
    code, out = run("explain", "gated_deltanet", "--graph", str(tmp_path / "g.json"))
    assert code == 0, out
    assert "delta write, scalar decay" in out and "plan:" in out and "log decay g" in out and "scale:  K ^ -0.5" in out
    graph = json.loads((tmp_path / "g.json").read_text())
    assert any(node["op"] == "state_in" for node in graph["nodes"])


def test_explain_names_block_attentions_kernels():
    code, out = run("explain", "lln")
    assert code == 0, out
    assert "block attention (line 22): block_attention_{fwd_kernel, dq_kernel, dkv_kernel}" in out


def test_explain_draws_png(tmp_path):
    code, out = run("explain", "gsa", "--graph", str(tmp_path / "g.png"))
    assert code == 0, out
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_check_passes_on_a_shipped_spec():
    code, out = run("check", "simple_gla")
    assert code == 0, out
    assert "ok" in out and "MISMATCH" not in out and "inference T=37" in out  # the recurrent kernel too
    assert "13 checks: 13 ok, 0 failed, 0 skipped" in out  # torch 5, triton 5 + 3 inference


def test_check_reports_a_located_error_for_a_broken_spec(tmp_path):
    bad = tmp_path / "bad.lam"
    bad.write_text("mixer bad\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(kk, v)\nout o = q @ S\n")
    code, out = run("check", str(bad))
    assert code == 2
    assert "bad.lam:5:15" in out and "unknown name 'kk'" in out


def test_check_needs_a_spec():
    code, out = run("check")
    assert code != 0 and "--all" in out


def test_new_writes_a_spec_that_loads(tmp_path):
    target = tmp_path / "my_gla.lam"
    code, out = run("new", "my_gla", "--from", "gla", "-o", str(target))
    assert code == 0, out
    m = lamixer.load(str(target))
    assert m.name == "my_gla" and m.inputs == ["q", "k", "v", "g"]
    code, out = run("new", "my_gla", "--from", "gla", "-o", str(target))
    assert code != 0 and "exists" in out
    code, out = run("new", "9bad", "--from", "gla", "-o", str(tmp_path / "x.lam"))
    assert code != 0


def test_bench_and_autotune_need_a_gpu():
    code, out = run("bench", "gla")
    assert code != 0 and "GPU" in out
    code, out = run("autotune", "gla")
    assert code != 0 and "GPU" in out


def test_memory_floor_counts_inputs_and_outputs_once():
    import torch

    from lamixer.tools.bench import floors

    tensors = {"q": torch.empty(2, 8, 4, 16, dtype=torch.bfloat16), "g": torch.empty(2, 8, 4, dtype=torch.float32)}
    fwd, fb = floors(tensors, out_numel=2 * 8 * 4 * 16, bandwidth=1e9)
    ins, out = 2 * 8 * 4 * 16 * 2 + 2 * 8 * 4 * 4, 2 * 8 * 4 * 16 * 2
    assert abs(fwd - 1e3 * (ins + out) / 1e9) < 1e-12 and abs(fb - 1e3 * 2 * (ins + out) / 1e9) < 1e-12


def test_compile_writes_packages(tmp_path):
    two_reads = tmp_path / "two_reads.lam"  # no chunk template covers two reads of one state; the recurrent kernel does
    two_reads.write_text("mixer two_reads\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S + k @ S\n")
    code, out = run("compile", "rwkv6", "deltanet", str(two_reads), "-o", str(tmp_path / "shared"))  # several: runtime and kernels shared
    assert code == 0, out
    shared = tmp_path / "shared"
    kernels = ["__init__.py", "additive.py", "block_attention.py", "chunk_additive_key_before.py", "config.py", "delta.py", "launch.py", "loader.py", "recurrent.py",
               "recurrent_additive_key_before.py", "recurrent_additive_none_after_after.py", "recurrent_delta_none_after.py", "scan_delta_none_after.py"]  # fmt: skip
    assert sorted(p.name for p in (shared / "kernels").iterdir()) == kernels
    assert {"__init__.py", "runtime", "rwkv6", "deltanet", "two_reads"} <= {p.name for p in shared.iterdir()}
    assert "`chunk_additive_key_before.py`" in (shared / "rwkv6" / "README.md").read_text()
    deltanet = (shared / "deltanet" / "README.md").read_text()
    assert "`scan_delta_none_after.py`" in deltanet and "`recurrent_delta_none_after.py`" in deltanet
    two = (shared / "two_reads" / "README.md").read_text()
    assert "`recurrent_additive_none_after_after.py`" in two and "every other call runs on the torch fallback" in two
    assert all((shared / name / "scans.py").is_file() for name in ("rwkv6", "deltanet", "two_reads"))
    code, out = run("compile", "gla", "-o", str(tmp_path / "one"))  # one: standalone
    assert code == 0, out
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["gla"]
    assert {"runtime", "kernels", "scans.py", "mixer.py", "layer.py"} <= {p.name for p in (tmp_path / "one" / "gla").iterdir()}
    code, out = run("compile", "-o", str(tmp_path))
    assert code != 0 and "--all" in out


def test_bench_saves_its_rows_as_it_goes(monkeypatch):
    """lamixer bench's run hands the result so far to save() after every row (the CLI writes it, atomically), so a
    run cut short by a time limit keeps what it measured. The timing itself is stubbed: there is no GPU here."""
    import torch

    from lamixer.tools import bench

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "BT_TOTAL", 32)
    monkeypatch.setattr(bench, "H", 2)
    monkeypatch.setattr(bench, "D", 8)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: 1e12)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stub")
    monkeypatch.setattr(bench, "_time", lambda op, fn, do, extra, leaves=(): dict(op=op, **extra, fwd_ms=1.0, fwdbwd_ms=2.0))
    saved = []
    res = bench.run([lamixer.load("gla"), lamixer.load("deltanet")], [16, 32], {"sdpa"}, decode=False, log=lambda row: None,
                    save=lambda r: saved.append([row["op"] for row in r["rows"]]))  # fmt: skip
    ops = ["lamixer gla", "lamixer deltanet", "sdpa causal"] * 2
    assert [row["op"] for row in res["rows"]] == ops and saved == [ops[:i] for i in range(1, 7)]
    assert [row["T"] for row in res["rows"]] == [16, 16, 16, 32, 32, 32]


# lamixer bench against a user's own kernel (--peer): described as FLA's peers are, checked, then timed

NAIVE_PEER = """
import torch

SEEN = []  # whether q held no gradient each time the peer was called: every timed backward writes fresh ones


def naive_gla(q, k, v, g, scale=None):
    \"\"\"GLA token by token, head first ([B, H, T, D]), returning (o, final state) as FLA's ops do.\"\"\"
    SEEN.append(q.grad is None)
    B, H, T, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = q.new_zeros(B, H, K, v.shape[-1], dtype=torch.float32)
    out = []
    for t in range(T):
        S = S * g[:, :, t].float().exp()[..., None] + k[:, :, t].float()[..., None] * v[:, :, t].float()[..., None, :]
        out.append(scale * (q[:, :, t].float()[..., None, :] @ S)[..., 0, :])
    return torch.stack(out, 2).to(q.dtype), S
"""

TORCH_PEER = """
import lamixer


def torch_gla(q, k, v, gk):
    return lamixer.load("gla")(q, k, v, gk, backend="torch")[0]
"""


@pytest.fixture
def cpu_bench(monkeypatch):
    """lamixer bench on the CPU at a tiny size, its timing real (wall time; the kernels under TRITON_INTERPRET)."""
    from lamixer.tools import bench

    for name, value in (("DEVICE", "cpu"), ("BT_TOTAL", 32), ("H", 2), ("D", 8), ("copy_bandwidth", lambda: 1e12)):
        monkeypatch.setattr(bench, name, value)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stub")
    return bench


def test_bench_checks_a_peer_from_a_file_then_times_it(cpu_bench, tmp_path, monkeypatch):
    """A spec file against a naive loop in a file of the user's, head first: its output and every gradient agree with
    lamixer's before it is timed, each timed call finds no gradient accumulated, and the ratios land in lamixer's row."""
    spec = tmp_path / "my_gla.lam"
    spec.write_text(lamixer.api.shipped_source("gla").replace("mixer gla ", "mixer my_gla "))
    (tmp_path / "naive.py").write_text(NAIVE_PEER)
    (tmp_path / "mapping.json").write_text(json.dumps({"args": ["q", "k", "v", "g"], "layout": "bhtd"}))  # as competitors.json writes one
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the command runs; bench.DEVICE keeps it on the CPU
    code, out = run("bench", str(spec), "--vs", "sdpa", "--lengths", "16", "--no-decode", "--out", str(tmp_path / "res"),
                    "--peer", f"{tmp_path / 'naive.py'}:naive_gla", "--peer-args", str(tmp_path / "mapping.json"), "--peer-layout", "bhtd")  # fmt: skip
    assert code == 0, out
    res = json.loads((tmp_path / "res" / "bench_my_gla.json").read_text())
    ours, theirs = res["rows"][:2]
    assert theirs["op"] == "peer naive_gla" and res["peer"]["layout"] == "bhtd"
    assert set(theirs["vs_lamixer"]) == {"o", "dq", "dk", "dv", "dg"} and max(theirs["vs_lamixer"].values()) < 2e-2
    assert theirs["fwd_ms"] > 0 and theirs["fwdbwd_ms"] > 0 and "fwd_vs_peer" in ours and "fwdbwd_vs_peer" in ours
    seen = sys.modules[cpu_bench.peers.resolve(f"{tmp_path / 'naive.py'}:naive_gla").__module__].SEEN
    assert len(seen) > 6 and all(seen)
    assert "peer naive_gla" in out and "peer vs lamixer" in out


def test_bench_says_which_specs_get_no_fla_row(cpu_bench, tmp_path, monkeypatch):
    spec = tmp_path / "my_gla.lam"
    spec.write_text(lamixer.api.shipped_source("gla").replace("mixer gla ", "mixer my_gla "))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for importable, said in ((True, "my_gla has no FLA peer"), (False, "flash-linear-attention is not importable")):
        monkeypatch.setattr(cpu_bench, "fla_available", lambda importable=importable: importable)
        code, out = run("bench", str(spec), "--vs", "fla", "--lengths", "16", "--no-decode", "--out", str(tmp_path / "res"))
        assert code == 0 and f"note: {said}" in out, out
    code, out = run("bench", str(spec), "--vs", "sdpa", "--lengths", "16", "--no-decode", "--out", str(tmp_path / "res"))
    assert code == 0 and "note:" not in out, out


def test_bench_does_not_time_a_peer_that_disagrees(cpu_bench, tmp_path):
    (tmp_path / "naive.py").write_text(NAIVE_PEER)
    entry = {"fn": f"{tmp_path / 'naive.py'}:naive_gla", "kwargs": {"scale": 1.0}, "layout": "bhtd"}  # not the spec's scale
    res = cpu_bench.run([lamixer.load("gla")], [16], set(), decode=False, log=lambda row: None, peer=entry)
    ours, theirs = res["rows"]
    assert "disagrees with lamixer" in theirs["error"] and "fwd_ms" not in theirs and "fwd_vs_peer" not in ours
    assert theirs["vs_lamixer"]["o"] > 0.5


def test_bench_calls_an_importable_peer_as_its_mapping_says(cpu_bench, tmp_path, monkeypatch):
    """MODULE:FUNCTION from the user's path, with a keyword in the mapping (the torch backend under another name)."""
    (tmp_path / "my_kernels.py").write_text(TORCH_PEER)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = {"fn": "my_kernels:torch_gla", **cpu_bench.peers.mapping("q, k, v, gk=g", ["q", "k", "v", "g"])}
    res = cpu_bench.run([lamixer.load("gla")], [16], set(), decode=False, log=lambda row: None, peer=entry)
    theirs = res["rows"][1]
    assert "error" not in theirs and max(theirs["vs_lamixer"].values()) < 1e-2 and theirs["fwdbwd_ms"] > 0


@pytest.mark.parametrize("args, option, message", [
    (["--peer", "no_such_module_here:fn"], "--peer", "No module named 'no_such_module_here'"),
    (["--peer", "os:no_such_function"], "--peer", "os has no 'no_such_function'"),
    (["--peer", "os.path"], "--peer", "write MODULE:FUNCTION"),
    (["--peer", "os:sep"], "--peer", "not callable"),
    (["--peer", "missing_dir/peer.py:f"], "--peer", "no such file"),
    (["--peer", "broken.py:f"], "--peer", "importing broken.py raised SyntaxError"),
    (["--peer", "os:getcwd", "--peer-args", "q,k,w"], "--peer-args", "'w' is none of the spec's inputs (q, k, v, g)"),
    (["--peer", "os:getcwd", "--peer-args", "q,k:int8"], "--peer-args", "the dtype must be one of"),
    (["--peer", "os:getcwd", "--peer-args", "{not json"], "--peer-args", "not valid JSON"),
    (["--peer", "os:getcwd", "--peer-args", '{"args": ["q"], "extra": 1}'], "--peer-args", "unknown key(s) extra"),
    (["--peer", "os:getcwd", "--peer-args", "q,gk=g,scale=0.5.1"], "--peer-args", "neither an input's name nor a JSON"),
    (["--peer", "os:getcwd", "--peer-args", '{"layout": "bhtd"}', "--peer-layout", "bthd"], "--peer-layout", "the mapping says"),
])  # fmt: skip
def test_a_bad_peer_is_a_usage_error_naming_its_option(tmp_path, monkeypatch, args, option, message):
    """Checked before anything runs (here, before the missing GPU is noticed), on a spec file as on a shipped name."""
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "my_gla.lam").write_text(lamixer.api.shipped_source("gla"))
    monkeypatch.chdir(tmp_path)
    code, out = run("bench", "my_gla.lam", *args)
    assert code == 2 and f"Invalid value for '{option}'" in out and message in out, out
    assert "Traceback" not in out


def test_peer_options_without_a_peer_are_a_usage_error():
    code, out = run("bench", "gla", "--peer-args", "q,k,v,g")
    assert code == 2 and "describe a --peer" in out


def test_the_peer_tolerance_default_is_the_benchmarks():
    from lamixer.tools import bench

    default = next(p.default for p in cli.bench.params if p.name == "peer_tolerance")
    assert default == bench.TOLERANCE


# conventions: -h, choices, lowercase documented options, exit statuses


@pytest.mark.parametrize("command", [None, *sorted(main.commands)])
def test_every_command_answers_dash_h(command):
    code, out = run(*([command] if command else []), "-h")
    assert code == 0 and out.startswith("Usage: ") and "-h, --help" in out


def test_every_option_is_lowercase_and_documented():
    for name, command in main.commands.items():
        for p in command.params:
            if isinstance(p, click.Option):
                assert all(o == o.lower() for o in p.opts + p.secondary_opts), (name, p.opts)
                assert p.help, (name, p.opts)


def test_options_with_fixed_values_are_choices():
    choices = {(c, p.name): p.type.choices for c, cmd in main.commands.items() for p in cmd.params if isinstance(p.type, click.Choice)}
    assert set(choices[("check", "backends")]) == {"torch", "triton"} and set(choices[("check", "device")]) == {"cpu", "cuda"}
    assert set(choices[("bench", "vs")]) == {"fla", "sdpa"} and set(choices[("autotune", "dtype")]) == {"bf16", "fp16", "fp32"}


def test_a_mistyped_backend_is_a_usage_error_naming_the_choices():
    code, out = run("check", "--backend", "trition", "gla")
    assert code == 2 and "'trition' is not one of 'torch', 'triton'" in out


@pytest.mark.parametrize("args", [["--T", "0"], ["-t", "-5"], ["--length", "0"], ["--B", "0"], ["--batch", "-1"], ["--H", "0"], ["--heads", "0"],
                                  ["--size", "0"], ["--limit", "0"]])  # fmt: skip
def test_autotune_sizes_must_be_positive(args):
    code, out = run("autotune", "gla", *args)
    assert code == 2 and "x>=1" in out


def test_autotune_understands_its_old_spellings():
    ctx = cli.autotune.make_context("autotune", ["gla", "--B", "2", "--T", "64", "--H", "3"])
    assert (ctx.params["batch"], ctx.params["length"], ctx.params["heads"]) == (2, 64, 3)
    ctx = cli.bench.make_context("bench", ["gla", "--Ts", "64,128", "--vs", "sdpa"])
    assert ctx.params["lengths"] == (64, 128) and ctx.params["vs"] == ("sdpa",)


@pytest.mark.parametrize("args", [["--lengths", "0"], ["--Ts", "64,x"], ["--vs", "fla,flash"]])
def test_bench_lists_are_checked(args):
    code, out = run("bench", "gla", *args)
    assert code == 2 and "Invalid value" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_check_device_without_cuda_or_unknown_is_a_usage_error():
    code, out = run("check", "--device", "cuda", "gla")
    assert code == 2 and "no CUDA device" in out
    code, out = run("check", "--device", "nonsense", "gla")
    assert code == 2 and "'nonsense' is not one of 'cpu', 'cuda'" in out


def test_a_failed_check_exits_with_1(monkeypatch):
    monkeypatch.setattr(cli, "CHECK_TOLERANCE", -1.0)  # every error is above it
    code, out = run("check", "--quick", "--backend", "torch", "linear_attn")
    assert code == 1 and "1 check: 0 ok, 1 failed, 0 skipped" in out and "MISMATCH" in out and "Error: 1 check failed" in out


def test_check_counts_what_it_could_not_check_and_fails(tmp_path):
    two_reads = tmp_path / "two_reads.lam"  # no chunk template covers two reads of one state; the recurrent kernel does
    two_reads.write_text("mixer two_reads\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S + k @ S\n")
    code, out = run("check", "--quick", "--backend", "triton", str(two_reads))
    assert code == 1 and "2 checks: 1 ok, 0 failed, 1 skipped" in out and "chunk kernels not available" in out
    # by default triton checks only the specs it has kernels for, and says which it left to torch (a vector state read
    # whole has no Triton template)
    hgrn = tmp_path / "hgrn.lam"
    hgrn.write_text("mixer hgrn\ndims V\ninput i[V], g[V] in (-inf, 0)\nstate hs[V]\nhs = exp(g) * hs + (1 - exp(g)) * i\nout o = hs\n")
    code, out = run("check", "--quick", str(hgrn))
    assert code == 0 and "triton: no kernels yet for hgrn" in out and "0 failed, 0 skipped" in out


def test_check_where_triton_cannot_run_exits_non_zero():
    """No GPU and no TRITON_INTERPRET: every Triton row is skipped, and that is no success. A process of its own: whether
    Triton interprets is fixed when its kernels are first defined."""
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    code, out, err = run_process("check", "--quick", "--backend", "triton", "gla", drop=("TRITON_INTERPRET",))
    assert code == 1 and "2 checks: 0 ok, 0 failed, 2 skipped" in out, out + err
    assert "Traceback" not in err and "Error: 2 checks skipped" in err


# paths and files that cannot be used: one line, no traceback


def test_new_from_a_binary_file_is_a_clean_error(tmp_path):
    binary = tmp_path / "blob.lam"
    binary.write_bytes(bytes(range(256)))
    code, out = run("new", "x", "--from", str(binary), "-o", str(tmp_path / "x.lam"))
    assert code == 2 and "cannot read" in out and not (tmp_path / "x.lam").exists()


def test_new_from_a_spec_whose_header_has_a_tab(tmp_path):
    tabbed = tmp_path / "tabbed.lam"
    tabbed.write_text(lamixer.api.shipped_source("gla").replace("mixer gla", "mixer\tgla", 1))
    code, out = run("new", "mine", "--from", str(tabbed), "-o", str(tmp_path / "mine.lam"))
    assert code == 0, out
    assert lamixer.load(str(tmp_path / "mine.lam")).name == "mine"


def test_new_into_a_missing_folder_is_a_clean_error(tmp_path):
    code, out = run("new", "x", "--from", "gla", "-o", str(tmp_path / "missing" / "x.lam"))
    assert code == 1 and "cannot write" in out and "No such file or directory" in out


def test_explain_graph_into_a_missing_folder_is_a_clean_error(tmp_path):
    code, out = run("explain", "gla", "--graph", str(tmp_path / "missing" / "g.json"))
    assert code == 1 and "cannot write" in out
    code, out = run("explain", "gla", "--graph", str(tmp_path / "g.txt"))
    assert code == 2 and ".json" in out


def test_compile_where_it_cannot_write_is_a_clean_error(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("a file, not a folder")
    code, out = run("compile", "gla", "-o", str(tmp_path / "file" / "out"))
    assert code == 1 and "Error: " in out and str(tmp_path / "file") in out

    def refused(specs, out_dir, force=False):  # a read-only folder (root, who runs the tests here, may write anywhere)
        raise PermissionError(13, "Permission denied", str(out_dir))

    monkeypatch.setattr("lamixer.emit.write.write", refused)
    code, out = run("compile", "gla", "-o", str(tmp_path / "ro"))
    assert code == 1 and "Permission denied" in out


def test_compile_replaces_what_it_did_not_write_only_with_force(tmp_path):
    (tmp_path / "gla").mkdir()
    (tmp_path / "gla" / "notes.txt").write_text("mine")
    code, out = run("compile", "gla", "-o", str(tmp_path))
    assert code == 1 and "--force" in out and (tmp_path / "gla" / "notes.txt").exists()
    code, out = run("compile", "gla", "-o", str(tmp_path), "--force")
    assert code == 0, out
    assert not (tmp_path / "gla" / "notes.txt").exists() and (tmp_path / "gla" / "mixer.py").is_file()


# what a user sees: terminal width, start-up time, the Makefile


def test_tables_fit_the_width_columns_gives(tmp_path):
    code, out = run("list", env={"COLUMNS": "70"})
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 70
    names = {line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")} - {""}
    assert names == set(lamixer.shipped_specs())  # each spec's name whole, on one line


HELP_WITHOUT_TORCH = """
import sys, time
start = time.perf_counter()
from lamixer.tools.cli import main
for args in (["--help"], *([c, "-h"] for c in sorted(main.commands)), ["check", "--backend", "trition", "gla"]):
    try:
        main(args)
    except SystemExit:
        pass
print("SECONDS", time.perf_counter() - start, file=sys.stderr)
print("TORCH", "torch" in sys.modules, file=sys.stderr)
"""


def test_help_and_usage_errors_do_not_import_torch():
    p = subprocess.run([sys.executable, "-c", HELP_WITHOUT_TORCH], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "TORCH False" in p.stderr, p.stderr
    start = time.perf_counter()
    code, out, err = run_process("--help")
    assert code == 0 and "Commands:" in out and time.perf_counter() - start < 3  # torch alone takes about 1.5 s to import


def test_import_lamixer_is_lazy_and_keeps_its_names():
    p = subprocess.run([sys.executable, "-c", "import sys, lamixer; print('torch' in sys.modules); lamixer.Layer, lamixer.load; print('torch' in sys.modules)"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert p.stdout.split() == ["False", "True"], p.stderr
    assert set(lamixer.__all__) <= set(dir(lamixer)) and lamixer.shipped_specs is lamixer.api.shipped_specs


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_installs_no_dev_extras(tmp_path):
    def dry(target):
        venv = tmp_path / target  # a venv that is not there: make lists every step
        return subprocess.run(["make", "-n", target, f"VENV={venv}"], capture_output=True, text=True, cwd=REPO, check=True).stdout

    demo, test = dry("demo"), dry("test")
    assert "pip install" in demo and "[dev]" not in demo and "lamixer check --all --quick" in demo
    assert '".[dev]"' in test
    assert 'PINS := torch==2.13.0 "triton==3.6.*" "numpy<2.4"' in (REPO / "Makefile").read_text()

"""The command line, through click's runner."""
import json

from click.testing import CliRunner

import lamixer
from lamixer.tools.cli import main


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


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


def test_explain_draws_png(tmp_path):
    code, out = run("explain", "gsa", "--graph", str(tmp_path / "g.png"))
    assert code == 0, out
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_check_passes_on_a_shipped_spec():
    code, out = run("check", "simple_gla")
    assert code == 0, out
    assert "ok" in out and "MISMATCH" not in out and "inference T=37" in out  # the recurrent kernel too


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
    kernels = ["__init__.py", "additive.py", "chunk_additive_key_before.py", "config.py", "delta.py", "launch.py", "loader.py", "recurrent.py",
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

"""The autotuner's cache and search, exercised under the Triton interpreter (its timings mean nothing here)."""
import json
import warnings
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import lamixer
from lamixer.kernels import additive, delta
from lamixer.kernels.config import Config, default_config, delta_default_config
from lamixer.tuning import choose, search, space
from lamixer.tuning import config_cache as at


@pytest.fixture(autouse=True)
def private_cache(tuning_cache):
    return tuning_cache


def group_config(name_or_mixer, B, T, H, K, V, dtype=torch.float32):
    """The configuration the triton backend launches a spec's first scan group with at this shape."""
    m = lamixer.load(name_or_mixer) if isinstance(name_or_mixer, str) else name_or_mixer
    return choose.choose(m.compiled.plan.groups[0], dtype, B, T, H, K, V, torch.device("cpu"))


def test_store_and_lookup_round_trip(private_cache):
    c = Config(32, 64, 32, 8, 2)
    key = at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(4, 8192, 16, 128, 128))
    path = at.store(key, c, {"x": 1.0})
    assert at.lookup(key) == c and at.lookup(key + "other") is None
    assert not list(path.parent.glob("*.tmp"))  # written through a temporary file and a rename
    assert json.loads(path.read_text())["version"] == at.CACHE_VERSION


@pytest.mark.parametrize("content", ["{not json", '{"version": 0, "entries": {}}', '["a list"]'])
def test_a_corrupt_or_stale_cache_is_ignored_with_a_warning(private_cache, content):
    at.cache_file().write_text(content)
    with pytest.warns(UserWarning, match="ignoring the autotune cache"):
        assert at.lookup("anything") is None


def test_gpu_runs_and_the_interpreter_keep_separate_caches(private_cache, monkeypatch):
    """Timings under Triton's interpreter mean nothing for a GPU: its entries go to a file of their own."""
    assert at.cache_file() == private_cache / "autotune-interpreter.json"  # tests run under the interpreter (conftest.py)
    monkeypatch.delenv("TRITON_INTERPRET")
    c, key = Config(32, 64, 32, 8, 2), at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(4, 8192, 16, 128, 128))
    assert at.store(key, c, {}) == private_cache / "autotune.json" and at.lookup(key) == c
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert at.lookup(key) is None


def test_autotune_interpret_leaves_the_gpu_cache_alone(private_cache):
    """`lamixer autotune --interpret` exercises the search on the CPU; what it stores is not for GPU runs to read."""
    from click.testing import CliRunner

    from lamixer.tools.cli import main

    args = ["autotune", "simple_gla", "--interpret", "--batch", "1", "--length", "24", "--heads", "2", "--size", "16", "--dtype", "fp32", "--limit", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert not (private_cache / "autotune.json").exists()
    assert "autotune-interpreter.json" in " ".join(result.output.split())  # where it says it saved the winner


VARIANT = """mixer my_variant "A scalar gate with a silu feature map: a variant no shipped list holds"
dims K, V
input q[K], k[K], v[V], g[] in (-inf, 0)
state S[K, V]
S = exp(g) * S + outer(k, v)
out o = silu(q) @ S
"""


def test_autotune_tunes_a_spec_file(private_cache, tmp_path):
    """`lamixer autotune FILE.lam`: the user's own spec is searched like a shipped one, and what it stores (in the
    interpreter's file of the private cache, never the GPU's) is what the spec's later calls at that shape launch with."""
    from click.testing import CliRunner

    from lamixer.tools.cli import main

    spec = tmp_path / "my_variant.lam"
    spec.write_text(VARIANT)
    args = ["autotune", str(spec), "--interpret", "--batch", "1", "--length", "24", "--heads", "2", "--size", "16", "--dtype", "fp32", "--limit", "2"]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "my_variant: B=1 T=24 H=2" in result.output and not (private_cache / "autotune.json").exists()
    entries = json.loads((private_cache / "autotune-interpreter.json").read_text())["entries"]
    assert len(entries) == 1
    (key, entry), = entries.items()
    assert key.split("|")[2] == choose.entry_hashes(lamixer.load(str(spec)).compiled.plan.groups[0])[0]
    assert group_config(str(spec), 1, 24, 2, 16, 16) == Config.from_list(entry["config"])


def test_a_search_stops_when_its_budget_is_spent(monkeypatch):
    """--budget: no candidate starts after the budget is spent, but the first always runs (and is stored)."""
    clock = iter(range(0, 1000, 10))  # every reading of the search's clock 10 s after the last
    monkeypatch.setattr(search, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    monkeypatch.setattr(search, "_time", lambda fn, device: 1.0)
    trials, keys = search.tune(lamixer.load("simple_gla"), 1, 24, 2, 16, torch.float32, "cpu", budget_s=15.0)
    assert len(trials) == 2 and at.lookup(keys[0]) == trials[0].config


def test_without_an_entry_the_default_is_used_at_once():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = group_config("gla", 2, 100, 4, 64, 64)
    assert c == default_config("key", 64, 64)


def test_shape_buckets_share_entries():
    assert at.shape_bucket(4, 8000, 16, 128, 128) == at.shape_bucket(4, 8192, 16, 128, 128)
    assert at.shape_bucket(4, 8192, 16, 128, 128) != at.shape_bucket(4, 8192, 16, 64, 128)


def test_a_shape_without_an_entry_takes_the_nearest_tuned_one_of_the_same_kernels():
    tuned, far = Config(32, 64, 32, 8, 2), Config(64, 32, 32, 4, 1)
    at.store(at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(4, 8192, 16, 128, 128)), tuned, {})
    at.store(at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(1, 512, 1, 128, 128)), far, {})
    assert at.lookup(at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(2, 16384, 16, 128, 128))) == tuned
    assert at.lookup(at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(1, 256, 2, 128, 128))) == far
    for other in (at.entry_key("gpu2", "abc", torch.bfloat16, at.shape_bucket(4, 8192, 16, 128, 128)),  # another GPU,
                  at.entry_key("gpu", "abd", torch.bfloat16, at.shape_bucket(4, 8192, 16, 128, 128)),  # other kernels,
                  at.entry_key("gpu", "abc", torch.float32, at.shape_bucket(4, 8192, 16, 128, 128)),  # dtype,
                  at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(4, 8192, 16, 64, 128))):  # head dims
        assert at.lookup(other) is None


@pytest.mark.parametrize("template, decay", [(additive.FAMILY, "none"), (additive.FAMILY, "scalar"), (additive.FAMILY, "key"),
                                             (additive.FAMILY, "value"), (delta.FAMILY, "none"), (delta.FAMILY, "key")])  # fmt: skip
def test_a_search_cut_short_tries_single_changes_from_the_default_first(template, decay):
    candidates = space.SPACES[template](decay, 128, 128)
    assert candidates[0] == choose.DEFAULTS[template](decay, 128, 128) and len(set(candidates)) == len(candidates)
    changed = [sum(a != b for a, b in zip(c.as_list(), candidates[0].as_list())) for c in candidates[1:]]
    assert changed == sorted(changed) and changed[0] < changed[-1]


def test_tune_checks_times_and_stores_the_fastest(monkeypatch):
    def three(decay, K, V):  # the default and two one-setting changes of it, the first with a chunk that is no power of two
        default = default_config(decay, K, V)
        return [default, replace(default, BT=48), replace(default, BT=32)]

    monkeypatch.setitem(space.SPACES, additive.FAMILY, three)
    m = lamixer.load("simple_gla")
    seen = []
    trials, keys = search.tune(m, 1, 40, 2, 16, torch.float32, "cpu", on_trial=seen.append)
    assert len(trials) == len(seen) == 3
    assert trials[1].ms is None and trials[1].note  # failed to run: recorded, never timed
    assert all(t.error < 1e-3 and t.ms > 0 for t in (trials[0], trials[2]))
    best = min((t for t in trials if t.ms is not None), key=lambda t: t.ms)
    assert len(keys) == 1 and at.lookup(keys[0]) == best.config
    assert group_config(m, 1, 40, 2, 16, 16) == best.config


def test_a_limited_search_combines_the_changes_that_pay(monkeypatch):
    """Coordinate descent: after a one-setting change beats the default, the search tries that change's neighbours
    before the default's other ones, so two changes that each pay are found together within a short limit; a second
    search starts from the stored winner."""
    tried = []
    real = search.configured

    def spy(mixer, configs):
        tried.append(configs[additive.FAMILY])
        return real(mixer, configs)

    def fake_time(fn, device):  # three stages and four gradient warps each save time; nothing else matters
        c = tried[-1]
        return 10.0 - 2 * (c.num_stages == 3) - (c.warps_grad == 4)

    monkeypatch.setattr(search, "configured", spy)
    monkeypatch.setattr(search, "_time", fake_time)
    m = lamixer.load("simple_gla")
    trials, keys = search.tune(m, 1, 24, 2, 16, torch.float32, "cpu", limit=8)
    best = at.lookup(keys[0])
    assert len(trials) == 8 and (best.num_stages, best.warps_grad) == (3, 4) and min(t.ms for t in trials) == 7.0
    again, _ = search.tune(m, 1, 24, 2, 16, torch.float32, "cpu", limit=1)
    assert again[0].config == best


def test_tune_refuses_specs_without_kernels():
    two_reads = lamixer.loads("mixer two_reads\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S + k @ S\n")
    with pytest.raises(ValueError, match="no Triton template"):
        search.tune(two_reads, 1, 8, 1, 16, torch.float32, "cpu")


TWO_FAMILIES = """mixer delta_then_gla
dims K, V
input q[K], k[K], v[V], beta[] in (0, 1), g[K] in (-inf, 0)
state S[K, V], R[K, V]
S = S + outer(beta * k, v - k @ S)
R = exp(g) * R + outer(k, v)
out o = q @ S + q @ R
"""


def test_tuning_a_spec_of_two_families_touches_only_the_one_it_searched(monkeypatch):
    """A delta-rule scan (scan_delta), then a key-dim decay one (chunk_additive). The search is the first family's;
    the other scan runs on its own default meanwhile and its cache entry is left alone."""
    m = lamixer.loads(TWO_FAMILIES)
    family, candidates = search.search_space(m, 16)
    assert family == delta.FAMILY and candidates[0] == delta_default_config("none", 16, 16)
    seen = []
    real = choose.choose

    def spy(group, *args):
        config = real(group, *args)
        seen.append((group.train.template, group.decay.kind, config))
        return config

    monkeypatch.setattr(choose, "choose", spy)
    trials, keys = search.tune(m, 1, 24, 2, 16, torch.float32, "cpu", limit=2)
    assert len(trials) == 2 and seen and all((t, d, c) == (additive.FAMILY, "key", default_config("key", 16, 16)) for t, d, c in seen)
    delta_group = m.compiled.plan.groups[0]
    assert keys == [at.entry_key(at.device_name(torch.device("cpu")), choose.entry_hashes(delta_group)[0], torch.float32,
                                 at.shape_bucket(1, 24, 2, 16, 16))]  # fmt: skip


def test_a_fault_that_loses_the_gpu_context_stops_the_search(monkeypatch):
    """After an illegal memory access every later launch of the process fails: the search stops at the candidate that
    faulted (the fastest one found before it is already stored)."""
    default = default_config("scalar", 16, 16)
    three = [default, replace(default, BT=32), replace(default, BV=32)]
    monkeypatch.setitem(space.SPACES, additive.FAMILY, lambda decay, K, V: three)
    real = additive.run_chunk_scan

    def faulting(*args):
        if Config.from_list(args[9]) == three[1]:
            raise RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")
        return real(*args)

    monkeypatch.setattr(additive, "run_chunk_scan", faulting)
    trials, keys = search.tune(lamixer.load("simple_gla"), 1, 40, 2, 16, torch.float32, "cpu")
    assert [t.config for t in trials] == three[:2]
    assert trials[1].ms is None and "search stopped" in trials[1].note
    assert at.lookup(keys[0]) == three[0]


def test_shipped_configurations_key_on_current_kernels():
    """Every entry in lamixer/tuning/configs names a kernel source some shipped spec renders now: an entry left behind by a
    template change would never be found again."""
    from importlib import resources

    current = set()
    for name in lamixer.shipped_specs():
        for group in lamixer.load(name).compiled.plan.groups:  # what the specs train on, normalisers' forms included
            current.update(choose.entry_hashes(group))
    shipped = [f for f in resources.files("lamixer").joinpath("tuning/configs").iterdir() if f.name.endswith(".json")]
    assert shipped
    for f in shipped:
        data = json.loads(f.read_text())
        assert data["version"] == at.CACHE_VERSION, f.name
        for key in data["entries"]:
            device, stack, source, dtype, bucket = key.split("|")
            assert source in current and stack.startswith("triton "), f"{f.name}: {key} (bench/rekey_tuned.py carries entries over a source change)"


def test_tuned_entries_key_on_the_compiler_stack(private_cache):
    """An entry timed under other Triton or torch versions is not taken: the same source may compile to other code."""
    bucket = at.shape_bucket(4, 8192, 16, 128, 128)
    at.store(at.entry_key("gpu", "abc", torch.bfloat16, bucket, stack="triton 0.0.1, torch 0.1.0"), Config(32, 64, 32, 8, 2), {})
    assert at.lookup(at.entry_key("gpu", "abc", torch.bfloat16, bucket)) is None
    assert at.versions() in at.entry_key("gpu", "abc", torch.bfloat16, bucket)


def test_kernels_carrying_a_normaliser_are_searched_with_wide_output_blocks():
    """lln's scan carries its normaliser: 32-wide output blocks faulted on the H200 (kernels/additive.py ONES_BLOCK),
    so its search space has none, and a plain scan's keeps them."""
    family, candidates = search.search_space(lamixer.load("lln"), 128)
    assert family == additive.FAMILY and candidates and min(c.BV for c in candidates) == additive.ONES_BLOCK
    assert min(c.BV for c in search.search_space(lamixer.load("linear_attn"), 128)[1]) < additive.ONES_BLOCK


def test_a_configuration_stored_under_its_entry_keys_is_what_the_spec_s_next_call_launches(monkeypatch):
    """How bench/defaults_vs_tuned.py times a configuration as a user's call runs it: stored under the shape's entry
    keys once the mixer has run with its default, then, the chosen configurations forgotten, read by the next call
    of the same signature (which remembers its choices per signature: they must not outlive the forgetting)."""
    from lamixer.tools.check import random_call

    m = lamixer.load("simple_gla")
    group = m.compiled.plan.groups[0]
    default = choose.default(group, 16, 16)
    launched = []
    real = choose.choose
    monkeypatch.setattr(choose, "choose", lambda *args: launched.append(real(*args)) or launched[-1])
    tensors, _ = random_call(m, B=1, T=40, H=2, size=16, dtype=torch.float32, initial_state=False, distinct=False)
    tensors = {k: v.requires_grad_() for k, v in tensors.items()}
    m(**tensors, backend="triton")  # training: the chunk kernels
    assert launched == [default]
    wanted = replace(default, BT=32)
    keys = search.entry_keys(m, group.train.template, 1, 40, 2, 16, torch.float32, "cpu")
    assert len(keys) == 1
    for key in keys:
        at.store(key, wanted, {})
    choose.forget()
    launched.clear()
    lamixer.load("simple_gla")(**tensors, backend="triton")  # the same compiled spec, so the same per-signature memo
    assert launched == [wanted]
    assert search.entry_keys(m, delta.FAMILY, 1, 40, 2, 16, torch.float32, "cpu") == []  # no group on that template

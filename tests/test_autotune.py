"""The autotuner's cache and search, exercised under the Triton interpreter (its timings mean nothing here)."""
import json
import warnings
from dataclasses import replace

import pytest
import torch

import lamixer
from lamixer.backends import triton as tb
from lamixer.tuning import autotune as at


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMIXER_CACHE", str(tmp_path))
    at._memo.clear()
    tb._chosen.clear()
    yield tmp_path
    at._memo.clear()
    tb._chosen.clear()


def test_store_and_lookup_round_trip(private_cache):
    c = at.Config(32, 64, 32, 8, 2)
    key = at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(4, 8192, 16, 128, 128))
    path = at.store(key, c, {"x": 1.0})
    assert at.lookup(key) == c and at.lookup(key + "other") is None
    assert not list(path.parent.glob("*.tmp"))  # written through a temporary file and a rename
    assert json.loads(path.read_text())["version"] == at.CACHE_VERSION


@pytest.mark.parametrize("content", ["{not json", '{"version": 0, "entries": {}}', '["a list"]'])
def test_a_corrupt_or_stale_cache_is_ignored_with_a_warning(private_cache, content):
    (private_cache / "autotune.json").write_text(content)
    with pytest.warns(UserWarning, match="ignoring the autotune cache"):
        assert at.lookup("anything") is None


def test_without_an_entry_the_default_is_used_at_once():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = tb.scan_config("key", "after", "float32", torch.float32, 2, 100, 4, 64, 64, torch.device("cpu"))
    assert c == at.default_config("key", 64, 64)


def test_shape_buckets_share_entries():
    assert at.shape_bucket(4, 8000, 16, 128, 128) == at.shape_bucket(4, 8192, 16, 128, 128)
    assert at.shape_bucket(4, 8192, 16, 128, 128) != at.shape_bucket(4, 8192, 16, 64, 128)


def test_a_shape_without_an_entry_takes_the_nearest_tuned_one_of_the_same_kernels():
    tuned, far = at.Config(32, 64, 32, 8, 2), at.Config(64, 32, 32, 4, 1)
    at.store(at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(4, 8192, 16, 128, 128)), tuned, {})
    at.store(at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(1, 512, 1, 128, 128)), far, {})
    assert at.lookup(at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(2, 16384, 16, 128, 128))) == tuned
    assert at.lookup(at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(1, 256, 2, 128, 128))) == far
    for other in (at.entry_key("gpu2", "abc", torch.bfloat16, at.shape_bucket(4, 8192, 16, 128, 128)),  # another GPU,
                  at.entry_key("gpu", "abd", torch.bfloat16, at.shape_bucket(4, 8192, 16, 128, 128)),  # other kernels,
                  at.entry_key("gpu", "abc", torch.float32, at.shape_bucket(4, 8192, 16, 128, 128)),  # dtype,
                  at.entry_key("gpu", "abc", torch.bfloat16, at.shape_bucket(4, 8192, 16, 64, 128))):  # head dims
        assert at.lookup(other) is None


@pytest.mark.parametrize("family, decay", [(at, "none"), (at, "scalar"), (at, "key"), (at, "value"), (tb.triton_delta, "none"), (tb.triton_delta, "key")])
def test_a_search_cut_short_tries_single_changes_from_the_default_first(family, decay):
    space = family.candidates(decay, 128, 128)
    assert space[0] == family.default_config(decay, 128, 128) and len(set(space)) == len(space)
    changed = [sum(a != b for a, b in zip(c.as_list(), space[0].as_list())) for c in space[1:]]
    assert changed == sorted(changed) and changed[0] < changed[-1]


def test_tune_checks_times_and_stores_the_fastest(monkeypatch):
    def space(decay, K, V):  # the default and two one-setting changes of it, the first with a chunk that is no power of two
        default = at.default_config(decay, K, V)
        return [default, replace(default, BT=48), replace(default, BT=32)]

    monkeypatch.setattr(at, "candidates", space)
    m = lamixer.load("simple_gla")
    seen = []
    trials, keys = at.tune(m, 1, 40, 2, 16, torch.float32, "cpu", on_trial=seen.append)
    assert len(trials) == len(seen) == 3
    assert trials[1].ms is None and trials[1].note  # failed to run: recorded, never timed
    assert all(t.error < 1e-3 and t.ms > 0 for t in (trials[0], trials[2]))
    best = min((t for t in trials if t.ms is not None), key=lambda t: t.ms)
    assert len(keys) == 1 and at.lookup(keys[0]) == best.config
    assert tb.scan_config("scalar", "after", "float32", torch.float32, 1, 40, 2, 16, 16, torch.device("cpu")) == best.config


def test_a_limited_search_combines_the_changes_that_pay(monkeypatch):
    """Coordinate descent: after a one-setting change beats the default, the search tries that change's neighbours
    before the default's other ones, so two changes that each pay are found together within a short limit; a second
    search starts from the stored winner."""
    def fake_time(fn, device):  # three stages and four gradient warps each save time; nothing else matters
        c = tb.CONFIG_OVERRIDE
        return 10.0 - 2 * (c.num_stages == 3) - (c.warps_grad == 4)

    monkeypatch.setattr(at, "_time", fake_time)
    m = lamixer.load("simple_gla")
    trials, keys = at.tune(m, 1, 24, 2, 16, torch.float32, "cpu", limit=8)
    best = at.lookup(keys[0])
    assert len(trials) == 8 and (best.num_stages, best.warps_grad) == (3, 4) and min(t.ms for t in trials) == 7.0
    again, _ = at.tune(m, 1, 24, 2, 16, torch.float32, "cpu", limit=1)
    assert again[0].config == best


def test_tune_refuses_specs_without_kernels():
    two_reads = lamixer.loads("mixer two_reads\ndims K, V\ninput q[K], k[K], v[V]\nstate S[K, V]\nS = S + outer(k, v)\nout o = q @ S + k @ S\n")
    with pytest.raises(ValueError, match="no Triton template"):
        at.tune(two_reads, 1, 8, 1, 16, torch.float32, "cpu")


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
    family, space = at.search_space(m, 16)
    assert family == tb.triton_delta.FAMILY and space[0] == tb.triton_delta.default_config("none", 16, 16)
    seen = []
    real = tb.scan_config

    def spy(decay, *args, **kwargs):
        config = real(decay, *args, **kwargs)
        seen.append((decay, config))
        return config

    monkeypatch.setattr(tb, "scan_config", spy)
    trials, keys = at.tune(m, 1, 24, 2, 16, torch.float32, "cpu", limit=2)
    assert len(trials) == 2 and seen and all(d == "key" and c == at.default_config("key", 16, 16) for d, c in seen)
    delta_scan = m.compiled.classification.scans[0]
    assert keys == [at.entry_key(at.device_name(torch.device("cpu")), tb.triton_delta.kernel_hash(*tb.triton_delta.template_config(delta_scan), "float32"),
                                 torch.float32, at.shape_bucket(1, 24, 2, 16, 16))]  # fmt: skip


def test_a_fault_that_loses_the_gpu_context_stops_the_search(monkeypatch):
    """After an illegal memory access every later launch of the process fails: the search stops at the candidate that
    faulted (the fastest one found before it is already stored)."""
    default = at.default_config("scalar", 16, 16)
    space = [default, replace(default, BT=32), replace(default, BV=32)]
    monkeypatch.setattr(at, "candidates", lambda decay, K, V: space)
    real = tb.run_chunk_scan

    def faulting(*args):
        if tb.CONFIG_OVERRIDE == space[1]:
            raise RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")
        return real(*args)

    monkeypatch.setattr(tb, "run_chunk_scan", faulting)
    trials, keys = at.tune(lamixer.load("simple_gla"), 1, 40, 2, 16, torch.float32, "cpu")
    assert [t.config for t in trials] == space[:2]
    assert trials[1].ms is None and "search stopped" in trials[1].note
    assert at.lookup(keys[0]) == space[0]


def test_shipped_configurations_key_on_current_kernels():
    """Every entry in lamixer/tuning/configs names a kernel source some shipped spec renders now: an entry left behind by a
    template change would never be found again."""
    from importlib import resources

    from lamixer.emit.scans_module import chunk_modules, kernel_module

    current = set()
    for name in lamixer.shipped_specs():
        for module in chunk_modules(lamixer.load(name).compiled):  # what the specs train on, normalisers' forms included
            current.add(tb._digest(kernel_module(module)))
    shipped = [f for f in resources.files("lamixer").joinpath("configs").iterdir() if f.name.endswith(".json")]
    assert shipped
    for f in shipped:
        data = json.loads(f.read_text())
        assert data["version"] == at.CACHE_VERSION, f.name
        for key in data["entries"]:
            assert key.split("|")[1] in current, f"{f.name}: {key}"


def test_kernels_carrying_a_normaliser_are_searched_with_wide_output_blocks():
    """lln's scan carries its normaliser: 32-wide output blocks faulted on the H200 (backends/triton.py ONES_BLOCK),
    so its search space has none, and a plain scan's keeps them."""
    family, space = at.search_space(lamixer.load("lln"), 128)
    assert family == tb.FAMILY and space and min(c.BV for c in space) == tb.ONES_BLOCK
    assert min(c.BV for c in at.search_space(lamixer.load("linear_attn"), 128)[1]) < tb.ONES_BLOCK

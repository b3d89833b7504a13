"""examples/mqar.py: the MQAR data generator, and the tiny configuration learning recall on the CPU; examples/mqar_zoology.py: Zoology's data builder."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mqar.py"


@pytest.fixture(scope="module")
def mqar():
    spec = importlib.util.spec_from_file_location("mqar_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("batch, seq_len, pairs, vocab, queries", [(16, 64, 4, 64, None), (8, 40, 8, 50, 3), (4, 256, 16, 2048, None), (3, 12, 4, 20, 4)])
def test_generator(mqar, batch, seq_len, pairs, vocab, queries):
    x, y = mqar.mqar_batch(batch, seq_len, pairs, vocab, torch.Generator().manual_seed(1), num_queries=queries)
    q = pairs if queries is None else queries
    half = vocab // 2
    assert x.shape == y.shape == (batch, seq_len) and x.dtype == y.dtype == torch.int64
    assert x.min() >= 0 and x.max() < vocab
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        keys, values = row_x[0 : 2 * pairs : 2], row_x[1 : 2 * pairs : 2]
        assert all(1 <= k < half for k in keys) and len(set(keys)) == pairs  # keys: distinct, from the lower half
        assert all(half <= v < vocab for v in values) and len(set(values)) == pairs  # values: distinct, upper half
        value_of = dict(zip(keys, values))
        assert all(t == -100 for t in row_y[: 2 * pairs])  # no target inside the context
        repeated = [t for t in range(2 * pairs, seq_len) if row_x[t] in value_of]
        targeted = [t for t in range(seq_len) if row_y[t] != -100]
        # targets exactly at the repeated keys, each that key's value; the key appeared earlier (no leakage)
        assert repeated == targeted and len(targeted) == q
        for t in targeted:
            assert row_y[t] == value_of[row_x[t]]
            assert row_x[t] in row_x[:t]
        assert len({row_x[t] for t in targeted}) == q  # each queried key once


def test_generator_is_seeded(mqar):
    a = mqar.mqar_batch(4, 32, 4, 32, torch.Generator().manual_seed(7))
    b = mqar.mqar_batch(4, 32, 4, 32, torch.Generator().manual_seed(7))
    c = mqar.mqar_batch(4, 32, 4, 32, torch.Generator().manual_seed(8))
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and not torch.equal(a[0], c[0])


def test_generator_rejects_impossible_sizes(mqar):
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="seq_len"):
        mqar.mqar_batch(2, 10, 4, 64, g)  # 4 pairs and 4 queries need 12 tokens
    with pytest.raises(ValueError, match="vocab"):
        mqar.mqar_batch(2, 64, 8, 16, g)  # 8 distinct keys need 9 tokens in the lower half


def test_equal_state_sizes(mqar):
    """Every default spec gets heads x (d_model / heads)^2 numbers of state per layer."""
    import lamixer

    for spec in mqar.DEFAULT_SPECS.split(","):
        layer = lamixer.Layer(spec, 64, 2, **mqar.equal_state_options(spec, 64, 2))
        assert mqar.state_size(layer) == 2 * 32 * 32, spec


def test_tiny_configuration_learns(mqar, tmp_path):
    """The tiny configuration on the CPU (seeded, so deterministic): recall far above chance (1/32)."""
    threads = torch.get_num_threads()
    out = tmp_path / "mqar.json"
    try:
        rows = mqar.main(["--tiny", "--device", "cpu", "--threads", "2", "--seed", "0", "--out", str(out)])
    finally:  # main() sets the thread count for the process; put back what the other tests run with
        torch.set_num_threads(threads)
    chance = 1 / 32
    by_spec = {r["spec"]: r for r in rows}
    assert set(by_spec) == {"deltanet", "linear_attn"}
    assert by_spec["deltanet"]["accuracy"] > 0.5  # measured 0.90
    assert by_spec["linear_attn"]["accuracy"] > 4 * chance  # measured 0.24
    record = json.loads(out.read_text())
    assert record["config"]["tiny"] and record["machine"]["torch"] == torch.__version__
    assert [r["spec"] for r in record["results"]] == ["deltanet", "linear_attn"]
    assert record["results"][0]["state_size"] == record["results"][1]["state_size"] == 2 * 32 * 32


def test_merge_keeps_each_specs_best_run_and_every_rate(mqar, tmp_path, capsys):
    def record(lr, rows, **config):
        base = dict(specs="", tiny=False, steps=10, d_model=8, layers=1, heads=1, seq_len=16, num_kv_pairs=2, vocab=8, batch=2, lr=str(lr),
                    eval_sequences=4, backend="auto", seed=0)  # fmt: skip
        row = dict(state_size=64, params=100, tokens_per_s=1.0, options={}, sizes={})
        return {"task": "mqar", "config": {**base, **config}, "machine": {}, "command": f"mqar.py --lr {lr}", "chance": 0.25,
                "results": [{**row, "spec": s, "lr": lr, "accuracy": a, "sweep": {str(lr): a}} for s, a in rows]}  # fmt: skip

    paths = []
    for i, rec in enumerate([record(1e-3, [("gla", 0.2), ("deltanet", 0.9)]), record(5e-3, [("gla", 0.5)])]):
        paths.append(str(tmp_path / f"r{i}.json"))
        Path(paths[-1]).write_text(json.dumps(rec))
    rows = mqar.main(["--merge", *paths, "--out", str(tmp_path / "merged.json")])
    best = {r["spec"]: r for r in rows}
    assert best["gla"]["lr"] == 5e-3 and best["gla"]["sweep"] == {"0.001": 0.2, "0.005": 0.5} and best["deltanet"]["accuracy"] == 0.9
    assert json.loads((tmp_path / "merged.json").read_text())["config"]["lr"] == "0.001,0.005"
    Path(paths[1]).write_text(json.dumps(record(5e-3, [("gla", 0.5)], steps=20)))
    with pytest.raises(SystemExit, match="steps"):
        mqar.main(["--merge", *paths])
    (tmp_path / "bad.json").write_text("[1, 2]")
    for bad in (str(tmp_path / "bad.json"), str(tmp_path / "missing.json")):
        with pytest.raises(SystemExit, match="--merge: .*(bad|missing).json"):
            mqar.main(["--merge", bad])


ZOOLOGY = Path(__file__).resolve().parent.parent / "examples" / "mqar_zoology.py"


@pytest.fixture(scope="module")
def zoology():
    spec = importlib.util.spec_from_file_location("mqar_zoology_example", ZOOLOGY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("batch, seq_len, pairs, vocab", [(32, 64, 8, 256), (4, 512, 64, 8192), (16, 16, 4, 12)])
def test_zoology_batch_scores_exactly_the_queries(zoology, batch, seq_len, pairs, vocab):
    x, y = zoology.zoology_batch(batch, seq_len, pairs, vocab, torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (batch, seq_len) and x.min() >= 0 and x.max() < vocab
    half, n = vocab // 2, pairs
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        keys, values = row_x[0 : 2 * n : 2], row_x[1 : 2 * n : 2]
        assert len(set(keys)) == n and all(1 <= k < half for k in keys)
        assert len(set(values)) == n and all(half <= v < vocab for v in values)
        scored = [t for t in range(seq_len) if row_y[t] != -100]
        # n scored positions, all after the context at even offsets (Zoology's query slots), never the last position
        assert len(scored) == n and all(t >= 2 * n and (t - 2 * n) % 2 == 0 and t < seq_len - 1 for t in scored)
        # each key queried once, its target the value it was paired with
        assert sorted(row_x[t] for t in scored) == sorted(keys)
        assert all(row_y[t] == dict(zip(keys, values))[row_x[t]] for t in scored)


def test_zoology_gaps_follow_the_power_law(zoology):
    """power_a = 0.01 puts queries nearer the context than a uniform draw (power_a = 1) does."""
    def mean_query_position(power_a):
        _, y = zoology.zoology_batch(64, 512, 16, 8192, torch.Generator().manual_seed(5), power_a=power_a)
        return (y != -100).nonzero()[:, 1].float().mean().item()

    near, uniform = mean_query_position(0.01), mean_query_position(1.0)
    assert near < 0.75 * uniform and 200 < uniform < 340  # uniform over 32 .. 510: about 271


def test_zoology_best_run_per_width(zoology):
    rows = [dict(spec="gla", d_model=64, lr=1e-3, accuracy=0.2), dict(spec="gla", d_model=64, lr=1e-2, accuracy=0.5),
            dict(spec="gla", d_model=128, lr=1e-3, accuracy=0.7), dict(spec="deltanet", d_model=64, lr=1e-3, accuracy=0.9)]  # fmt: skip
    best = zoology.best_per_spec(rows)
    assert best["gla"]["64"]["lr"] == 1e-2 and best["gla"]["128"]["accuracy"] == 0.7 and best["deltanet"]["64"]["accuracy"] == 0.9

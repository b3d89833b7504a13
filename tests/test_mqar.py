"""examples/mqar.py: the MQAR data generator, and the tiny configuration learning recall on the CPU; examples/mqar_zoology.py: Zoology's
data builder and training mixture, its model (causal, tied head, Zoology's layout), its accuracy and its loss positions."""
import importlib.util
import json
import sys
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
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


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


def test_zoology_mixture_is_zoologys(zoology):
    """The default training mixture and test set are Zoology's (original_mqar_configs.py); a segment's sequences are fixed by
    its seed, cut into batches in order, the last one short."""
    args = zoology.parse_args([])
    train = [(s.seq_len, s.num_kv_pairs, s.sequences) for s in args.train_segments]
    assert train == [(64, 4, 100_000), (128, 8, 20_000), (256, 16, 20_000), (256, 32, 20_000), (256, 64, 20_000)]
    test = [(s.seq_len, s.num_kv_pairs, s.sequences) for s in args.test_segments]
    assert test == [(64, 4, 1000), (64, 8, 1000), (64, 16, 1000), (128, 32, 1000), (256, 64, 1000), (512, 128, 1000), (1024, 256, 1000)]
    assert (args.vocab, args.batch, args.test_batch, args.epochs, args.lr_list) == (8192, 256, 32, 32, [1e-3, 3.16e-3, 1e-2, 3.16e-2])
    seg = zoology.Segment.parse("16:2:10")
    a = zoology.segment_batches(seg, 4, 32, 5, torch.device("cpu"), 0.01)
    b = zoology.segment_batches(seg, 4, 32, 5, torch.device("cpu"), 0.01)
    assert [x.shape[0] for x, _ in a] == [4, 4, 2] and all(torch.equal(u[0], v[0]) for u, v in zip(a, b))
    for bad in ("16:2", "15:2:10", "16:5:10", "16:2:0"):
        with pytest.raises(SystemExit, match="segment"):
            zoology.Segment.parse(bad)


@pytest.mark.parametrize("spec, layout, mixers", [("gated_deltanet", "hybrid", ["BaseConv", "Layer"]), ("mamba2", "stack", ["Layer", "Layer"])])
def test_zoology_model_is_causal_with_a_tied_head(zoology, spec, layout, mixers):
    """Zoology's layout for the spec; the head is the embedding; a change at position t moves no output before t."""
    args = zoology.parse_args(["--tiny", "--vocab", "64"])
    torch.manual_seed(0)
    model, options, heads = zoology.build_model(spec, 32, args)
    model.eval()
    assert [type(b.mixer).__name__ for b in model.blocks] == mixers and model.head.weight is model.embed.weight
    assert (layout == "hybrid") == isinstance(model.blocks[0].norm1, torch.nn.LayerNorm)
    assert heads == (2 if spec == "gated_deltanet" else 1) and options == ({"head_dim": 16, "expand_v": 2} if layout == "hybrid" else {"expand": 2, "d_state": 16})
    x = torch.randint(64, (2, 24))
    x2 = x.clone()
    x2[:, 11] = (x2[:, 11] + 1) % 64
    with torch.no_grad():
        h, h2 = model.hidden(x), model.hidden(x2)
    assert torch.equal(h[:, :11], h2[:, :11]) and not torch.allclose(h[:, 11:], h2[:, 11:])


def test_zoology_accuracy_is_the_mean_over_sequences(zoology, monkeypatch):
    """Zoology's valid/accuracy averages each sequence's fraction of right queries over the sequences of all test segments."""
    g = torch.Generator().manual_seed(2)
    short, long_ = zoology.Segment(16, 2, 3), zoology.Segment(32, 4, 3)
    test = [(short, [zoology.zoology_batch(3, 16, 2, 64, g)]), (long_, [zoology.zoology_batch(3, 32, 4, 64, g)])]

    def right_when_even(model, x, y):  # a model that answers exactly the queries whose value is even
        target = y[y != -100]
        logits = torch.zeros(target.shape[0], 64)
        logits[torch.arange(target.shape[0]), torch.where(target % 2 == 0, target, (target + 1) % 64)] = 1.0
        return logits, target

    monkeypatch.setattr(zoology, "query_logits", right_when_even)
    accuracy, per = zoology.evaluate(torch.nn.Linear(1, 1), test)
    expect = {}
    for seg, [(_, y)] in test:
        expect[seg.name] = [((row[row != -100] % 2) == 0).double().mean().item() for row in y]
    assert per == pytest.approx({k: sum(v) / len(v) for k, v in expect.items()})
    assert accuracy == pytest.approx(sum(expect["16/2"] + expect["32/4"]) / 6)


def test_zoology_query_loss_is_the_causal_lm_loss(zoology):
    """The script scores the logits at query positions against the value; LamixerForCausalLM's own loss, given the value as the
    next token's label, is the same number: the targets sit where the model predicts them."""
    args = zoology.parse_args(["--tiny", "--model", "hf", "--vocab", "64", "--specs", "deltanet"])
    torch.manual_seed(0)
    model, _, _ = zoology.build_model("deltanet", 16, args)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as Zoology's head
    x, y = zoology.zoology_batch(3, 32, 4, 64, torch.Generator().manual_seed(4))
    logits, target = zoology.query_logits(model, x, y)
    labels = torch.full_like(y, -100)
    labels[:, 1:] = y[:, :-1]  # the value is the label of the token after the query
    own = model(input_ids=x, labels=labels, use_cache=False).loss
    assert torch.nn.functional.cross_entropy(logits, target).item() == pytest.approx(own.item(), rel=1e-5)


@pytest.mark.parametrize("data", ["--fixed", "--fresh"])
def test_zoology_run_end_to_end(zoology, tmp_path, data):
    """One short run writes its per-epoch history; the JSON holds the configuration and each spec's best run."""
    threads = torch.get_num_threads()
    out = tmp_path / "z.json"
    try:
        record = zoology.main(["--specs", "deltanet", "--d-models", "16", "--lrs", "1e-2", "--train", "16:2:16,32:4:8", "--test", "16:2:8",
                               "--vocab", "64", "--epochs", "2", "--batch", "8", "--test-batch", "8", "--threads", "1", "--out", str(out), data])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    saved = json.loads(out.read_text())
    [run] = saved["results"]
    assert run["steps"] == 3 * run["epochs"] and [h["epoch"] for h in run["history"]] == list(range(1, run["epochs"] + 1))
    assert saved["best"]["deltanet"]["16"]["accuracy"] == run["accuracy"] == record["results"][0]["accuracy"]
    assert set(run["per_segment"]) == {"16/2"} and saved["config"]["train"] == "16:2:16,32:4:8" and saved["config"]["fresh"] == (data == "--fresh")

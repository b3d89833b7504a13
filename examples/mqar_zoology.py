"""Multi-query associative recall by the Zoology protocol, with lamixer.hf.LamixerForCausalLM.

Zoology (Arora et al., 2023) builds each sequence as `num_kv_pairs` key-value pairs (keys from
1 .. vocab/2 - 1, values from vocab/2 .. vocab - 1, each distinct within the sequence), then the
queries: every key once, in random order, at even offsets after the context, the gaps drawn from a
power law that favours queries near the context (power_a = 0.01). Every other position holds a
random token of the whole vocabulary (so a filler can equal a key; it is not scored). The target
of a query position is its key's value, the next token; every other target is ignored. The model
sweeps d_model and the learning rate; a spec's result is its best run at each width.

    python examples/mqar_zoology.py                       # sequence 512, 64 pairs, d_model 64..256 (a GPU)
    python examples/mqar_zoology.py --tiny                # seq 64, 4 pairs: about 3 minutes on one CPU thread
    python examples/mqar_zoology.py --specs gla,deltanet --d-models 128 --lrs 1e-3,1e-2 --out mqar.json

The model is LamixerForCausalLM: pre-norm blocks of the spec's layer, no positional embedding, and by
default no MLP, as Zoology's MQAR models (`--mlp model` keeps the model's SwiGLU MLPs); the loss is the
cross-entropy at the query positions. Each spec's layer options give it heads x (d_model/heads)^2 numbers of state per
layer (as examples/mqar.py does); `--set SPEC.OPTION=VALUE` changes one layer option of one spec.
`--data uniform` trains on examples/mqar.py's sequences instead (queries anywhere after the
context, filler never a key), to compare the two protocols with everything else equal.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/mqar.py: its data builder and state sizing
import mqar  # noqa: E402

import lamixer  # noqa: E402

IGNORE = -100
# Zoology's MQAR figures: sequence 512 with 64 pairs, vocab 8192, 2 layers, d_model 64..256 (and up), a learning-rate sweep
FULL = dict(specs="gla,gated_deltanet,mamba2,deltanet", d_models="64,128,256", lrs="3e-4,1e-3,3e-3,1e-2", seq_len=512, num_kv_pairs=64,
            vocab=8192, layers=2, heads=2, steps=4000, batch=64, eval_sequences=1000)  # fmt: skip
TINY = dict(specs="gated_deltanet,deltanet", d_models="64", lrs="3e-3", seq_len=64, num_kv_pairs=4, vocab=64, layers=2, heads=2, steps=600,
            batch=32, eval_sequences=256)  # fmt: skip


# ---- data ----
def zoology_batch(batch: int, seq_len: int, num_kv_pairs: int, vocab: int, generator: torch.Generator, power_a: float = 0.01,
                  random_fill: bool = True) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(inputs, targets), both [batch, seq_len] int64: targets[b, t] is what the model must predict after inputs[b, :t+1]
    (the value of the key at a query position), IGNORE elsewhere.

    Context: k_1 v_1 .. k_n v_n at 0 .. 2n-1. Queries: each key once, in random order, at 2n + 2 * gap, the n gaps drawn
    without replacement from 0 .. (seq_len - 2n) / 2 - 1 with probability proportional to (gap + 1)^(power_a - 1).
    Everything else is uniform over the vocabulary, or token 0 (never a key or value) without random_fill."""
    n = num_kv_pairs
    half = vocab // 2
    space = (seq_len - 2 * n) // 2
    if seq_len % 2 or n < 1 or space < n:
        raise ValueError(f"need an even seq_len >= 4 * num_kv_pairs and num_kv_pairs >= 1, got {seq_len} and {n}")
    if n > half - 1:
        raise ValueError(f"vocab {vocab} is too small for {n} distinct keys")
    g = generator
    on = dict(generator=g, device=g.device)
    keys = torch.rand(batch, half - 1, **on).argsort(dim=1)[:, :n] + 1
    values = torch.rand(batch, vocab - half, **on).argsort(dim=1)[:, :n] + half
    inputs = torch.randint(vocab, (batch, seq_len), **on) if random_fill else torch.zeros(batch, seq_len, dtype=torch.int64, device=g.device)
    inputs[:, 0 : 2 * n : 2] = keys
    inputs[:, 1 : 2 * n : 2] = values
    weight = torch.arange(1, space + 1, device=g.device, dtype=torch.float64) ** (power_a - 1)
    gaps = torch.multinomial(weight.expand(batch, space), n, replacement=False, generator=g)  # key i's query at gap i
    where = 2 * n + 2 * gaps
    inputs.scatter_(1, where, keys)
    targets = torch.full((batch, seq_len), IGNORE, dtype=torch.int64, device=g.device)
    targets.scatter_(1, where, values)
    return inputs, targets


def batch_of(cfg: argparse.Namespace, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if cfg.data == "uniform":
        return mqar.mqar_batch(batch, cfg.seq_len, cfg.num_kv_pairs, cfg.vocab, generator)
    return zoology_batch(batch, cfg.seq_len, cfg.num_kv_pairs, cfg.vocab, generator, cfg.power_a, cfg.non_queries == "random")


# ---- model ----
class NoMLP(nn.Module):
    """A block's MLP left out: the block adds nothing after its mixer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def spec_key(spec: str) -> str:
    """How --set and --fill name a spec: a shipped spec by its name, a .lam file by its stem."""
    return Path(spec).stem if spec.endswith(".lam") else spec


def build_model(spec: str, d_model: int, cfg: argparse.Namespace) -> tuple[nn.Module, dict]:
    import transformers  # noqa: F401  (first: lamixer registers its classes as transformers finishes importing)

    from lamixer.hf import LamixerConfig, LamixerForCausalLM

    options = {**mqar.equal_state_options(spec, d_model, cfg.heads), **cfg.overrides.get(spec_key(spec), {})}
    config = LamixerConfig(spec=spec, vocab_size=cfg.vocab, hidden_size=d_model, num_heads=cfg.heads, num_layers=cfg.layers,
                           layer_options=options, backend=cfg.backend, use_cache=False)  # fmt: skip
    if cfg.model == "example":
        model = mqar.LM(spec, cfg.vocab, d_model, cfg.layers, cfg.heads, options, cfg.backend)
        blocks = model.blocks
    else:
        model = LamixerForCausalLM(config)
        blocks = model.model.layers
    if cfg.mlp == "none":
        for block in blocks:
            block.mlp = NoMLP()
    for layer in mixer_layers(model):
        fill_params(layer, cfg.fills.get(spec_key(spec), {}))
    if cfg.init == "torch" and cfg.model == "hf":  # the Linears around the mixers at PyTorch's default (the mixers' own are already)
        for block in blocks:
            for m in block.mlp.modules():
                if isinstance(m, nn.Linear):
                    m.reset_parameters()
        model.lm_head.reset_parameters()
    return model, options


@torch.no_grad()
def fill_params(layer: lamixer.Layer, fills: dict) -> None:
    """Set named parameters of a layer (as named_parameters() names them, e.g. params.A_log, proj.g.1.bias) to a constant."""
    named = dict(layer.named_parameters())
    for name, value in fills.items():
        if name not in named:
            raise SystemExit(f"--fill: the layer has no parameter {name!r} (it has {', '.join(named)})")
        named[name].fill_(value)


def logits_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) if isinstance(model, mqar.LM) else model(input_ids=x, use_cache=False).logits


def mixer_layers(model: nn.Module) -> list[lamixer.Layer]:
    return [m for m in model.modules() if isinstance(m, lamixer.Layer)]


# ---- training ----
@torch.no_grad()
def evaluate(model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Recall accuracy: the fraction of query positions whose argmax is the key's value."""
    model.eval()
    correct = total = 0
    for x, y in data:
        pred = logits_of(model, x).argmax(-1)
        mask = y != IGNORE
        correct += int((pred[mask] == y[mask]).sum())
        total += int(mask.sum())
    model.train()
    return correct / total


def train_one(spec: str, d_model: int, lr: float, cfg: argparse.Namespace, device: torch.device) -> dict:
    """One run: a fresh model of this width trained at peak rate lr on fresh batches; its row of the table."""
    torch.manual_seed(cfg.seed)
    model, options = build_model(spec, d_model, cfg)
    model.to(device)
    layer = mixer_layers(model)[0]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, cfg.beta2))
    train_gen = torch.Generator(device).manual_seed(cfg.seed)
    eval_gen = torch.Generator(device).manual_seed(cfg.seed + 1_000_003)
    eval_batch = min(cfg.batch, cfg.eval_sequences)
    eval_data = [batch_of(cfg, eval_batch, eval_gen) for _ in range(max(1, cfg.eval_sequences // eval_batch))]
    warmup = max(1, int(cfg.warmup * cfg.steps))
    start = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = mqar.lr_at(step, cfg.steps, lr, warmup)
        x, y = batch_of(cfg, cfg.batch, train_gen)
        logits = logits_of(model, x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE)  # targets aligned with inputs
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if cfg.log_every and (step + 1) % cfg.log_every == 0:
            print(f"    step {step + 1}/{cfg.steps} loss {loss.item():.3f}", flush=True)
    mqar.sync(device)
    seconds = time.perf_counter() - start
    accuracy = evaluate(model, eval_data)
    row = {"spec": spec, "d_model": d_model, "lr": lr, "accuracy": accuracy, "final_loss": loss.item(), "options": options,
           "state_size": mqar.state_size(layer), "params": sum(p.numel() for p in model.parameters()), "train_seconds": seconds}  # fmt: skip
    print(f"  {spec} d_model {d_model} lr {lr:g}: accuracy {accuracy:.3f}, loss {row['final_loss']:.3f}, {seconds:.0f} s", flush=True)
    return row


def best_per_spec(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """{spec: {d_model: its best run}}: Zoology reports each width's best learning rate."""
    best: dict[str, dict[str, dict]] = {}
    for r in rows:
        at = best.setdefault(r["spec"], {})
        key = str(r["d_model"])
        if key not in at or r["accuracy"] > at[key]["accuracy"]:
            at[key] = r
    return best


def print_best(best: dict[str, dict[str, dict]]) -> None:
    widths = sorted({int(w) for runs in best.values() for w in runs})
    print("best accuracy per spec (learning rate) at d_model " + ", ".join(map(str, widths)))
    for spec, runs in best.items():
        cells = [f"{runs[str(w)]['accuracy']:.3f} ({runs[str(w)]['lr']:g})" if str(w) in runs else "-" for w in widths]
        print(f"  {spec:<16} " + "  ".join(f"{c:>16}" for c in cells))


# ---- command line ----
def parse_overrides(items: list[str]) -> dict[str, dict]:
    """[gla.gate_normalizer=1] -> {"gla": {"gate_normalizer": 1}} (numbers as int where whole); the spec ends at the first dot."""
    out: dict[str, dict] = {}
    for item in items:
        name, _, value = item.partition("=")
        spec, _, option = name.partition(".")
        if not (spec and option and value):
            raise SystemExit(f"{item!r}: expected SPEC.NAME=VALUE")
        number = float(value)
        out.setdefault(spec, {})[option] = int(number) if number.is_integer() else number
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a small configuration for a CPU: " + ", ".join(f"{k}={v}" for k, v in TINY.items()))
    p.add_argument("--specs", help=f"comma-separated shipped specs or .lam paths (full: {FULL['specs']})")
    p.add_argument("--d-models", help=f"comma-separated model widths (full: {FULL['d_models']})")
    p.add_argument("--lrs", help=f"comma-separated peak learning rates (full: {FULL['lrs']})")
    p.add_argument("--seq-len", type=int, help=f"sequence length (full: {FULL['seq_len']})")
    p.add_argument("--num-kv-pairs", type=int, help=f"key-value pairs, each queried once (full: {FULL['num_kv_pairs']})")
    p.add_argument("--vocab", type=int, help=f"vocabulary: keys from the lower half, values from the upper (full: {FULL['vocab']})")
    p.add_argument("--layers", type=int, help=f"blocks (full: {FULL['layers']})")
    p.add_argument("--heads", type=int, help=f"heads per mixer (full: {FULL['heads']})")
    p.add_argument("--steps", type=int, help=f"training steps, each a fresh batch (full: {FULL['steps']})")
    p.add_argument("--batch", type=int, help=f"sequences per step (full: {FULL['batch']})")
    p.add_argument("--eval-sequences", type=int, help=f"held-out sequences (full: {FULL['eval_sequences']})")
    p.add_argument("--data", choices=["zoology", "uniform"], default="zoology", help="zoology: power-law query gaps, any filler; "
                   "uniform: examples/mqar.py's sequences")  # fmt: skip
    p.add_argument("--power-a", type=float, default=0.01, help="Zoology's power law of the query gaps (1: uniform)")
    p.add_argument("--non-queries", choices=["random", "zero"], default="random", help="what fills the positions that are "
                   "neither pairs nor queries: random tokens (Zoology's default) or token 0 (its random_non_queries=False)")
    p.add_argument("--mlp", choices=["model", "none"], default="none", help="each block's MLP: the model's own (the hf model's SwiGLU, "
                   "examples/mqar.py's GELU), or none (Zoology's MQAR models)")  # fmt: skip
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SPEC.OPTION=VALUE", help="a layer option of one spec")
    p.add_argument("--model", choices=["hf", "example"], default="hf", help="hf: LamixerForCausalLM; example: examples/mqar.py's LM "
                   "(a GELU MLP with biases, PyTorch's default initialisation)")  # fmt: skip
    p.add_argument("--init", choices=["model", "torch"], default="model", help="the hf model's MLP and LM head: its normal(0, 0.02), or "
                   "PyTorch's default for a Linear (uniform, std 1/sqrt(3 fan_in))")  # fmt: skip
    p.add_argument("--fill", dest="fills", action="append", default=[], metavar="SPEC.PARAM=VALUE", help="start a layer parameter "
                   "of one spec at a constant (its name in Layer.named_parameters(), e.g. mamba2.params.A_log=0)")  # fmt: skip
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.999, help="AdamW's second-moment decay")
    p.add_argument("--warmup", type=float, default=0.1, help="linear warm-up, a fraction of the steps; then cosine to lr/10")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--log-every", type=int, default=0, help="print the loss every N steps (0: never)")
    p.add_argument("--out", help="write the configuration and every run (spec, d_model, lr, accuracy) to this JSON file")
    args = p.parse_args(argv)
    for key, value in (TINY if args.tiny else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.spec_list = [s.strip() for s in args.specs.split(",") if s.strip()]
    args.d_model_list = [int(x) for x in str(args.d_models).split(",")]
    args.lr_list = [float(x) for x in str(args.lrs).split(",")]
    args.overrides = parse_overrides(args.overrides)
    args.fills = parse_overrides(args.fills)
    if any(d % args.heads for d in args.d_model_list):
        p.error(f"every d_model must be a multiple of --heads {args.heads}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    config = {k: v for k, v in vars(args).items() if k not in ("spec_list", "d_model_list", "lr_list", "out", "threads", "log_every")}
    print("MQAR (Zoology protocol) on " + str(device) + ": " + ", ".join(f"{k}={v}" for k, v in config.items()), flush=True)
    record = {"task": "mqar_zoology", "config": config, "machine": mqar.device_info(device), "chance": 1 / (args.vocab - args.vocab // 2),
              "results": []}  # fmt: skip
    for spec in args.spec_list:
        for d_model in args.d_model_list:
            for lr in args.lr_list:
                record["results"].append(train_one(spec, d_model, lr, args, device))
                record["best"] = best_per_spec(record["results"])
                if args.out:  # after every run, so a run cut short keeps what it finished
                    Path(args.out).write_text(json.dumps(record, indent=2))
    print_best(record["best"])
    return record


if __name__ == "__main__":
    main()

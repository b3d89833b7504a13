"""Multi-query associative recall (MQAR) with lamixer layers as the token mixers.

MQAR (Arora et al., 2023, "Zoology") asks a language model to look values up by key: a sequence
starts with `num_kv_pairs` key-value token pairs (keys and values drawn from disjoint halves of the
vocabulary), then keys come back at random later positions among filler tokens, and at each
repeated key the model must predict that key's value. Only those positions carry a target; every
other target is -100 (ignored). Sequences are generated on the fly.

Each spec trains the same small language model, token embedding -> `layers` x (RMSNorm ->
lamixer.Layer residual -> RMSNorm -> MLP residual) -> RMSNorm -> LM head, with the Layer options
chosen so that every spec holds the same recurrent state per layer (heads x key dim x value dim =
d_model^2 / heads), with AdamW and a linear-warmup cosine schedule at each given peak learning rate
(the best run counts, as in Zoology's sweeps). The table gives each spec's state size, parameter count,
recall accuracy on held-out sequences, the learning rate it came from and training throughput.

    python examples/mqar.py                         # the full configuration (a GPU: a few minutes)
    python examples/mqar.py --tiny                  # a small one for a CPU (about half a minute)
    python examples/mqar.py --specs gla,deltanet --steps 2000 --out mqar.json

On CUDA the layers' backend "auto" runs the generated Triton kernels (chunkwise for training, the
recurrent kernel for short inference calls); on a CPU the torch backend.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import lamixer

DEFAULT_SPECS = "gla,gated_deltanet,deltanet,retnet,simple_gla,mamba2,linear_attn"
TINY_SPECS = "deltanet,linear_attn"
IGNORE = -100

# the full configuration (for a GPU) and the tiny one (for two CPU cores); the CLI overrides either
# lr: the peak learning rates each spec trains at; its row is its best (Zoology's protocol: mixers differ in the
# rate they learn recall at; at --tiny gla reached 0.03 at 1e-2 and 0.22 at 1e-3, deltanet learns at 1e-2). The full
# configuration trains at 1e-3 (on the H200 gla reached 0.033 there and 0.006 at 5e-3); --lr 1e-3,5e-3 sweeps
FULL = dict(steps=1500, d_model=128, layers=2, heads=2, seq_len=256, num_kv_pairs=16, vocab=512, batch=256, lr="1e-3", eval_sequences=1024)
TINY = dict(steps=200, d_model=64, layers=2, heads=2, seq_len=64, num_kv_pairs=4, vocab=64, batch=32, lr="1e-2", eval_sequences=256)


# ---- data ----
def mqar_batch(
    batch: int, seq_len: int, num_kv_pairs: int, vocab: int, generator: torch.Generator, num_queries: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of MQAR sequences: (inputs [batch, seq_len], targets [batch, seq_len]), int64 on the generator's device.

    Positions 0 .. 2n-1 hold the pairs k_1 v_1 ... k_n v_n (n = num_kv_pairs, keys distinct from
    1 .. vocab/2 - 1, values distinct from vocab/2 .. vocab - 1). The rest is filler drawn from the
    whole vocabulary but never one of the sequence's keys, except at `num_queries` (default n)
    distinct random positions, each holding a distinct key of the context. The target at such a
    position is that key's value (the model predicts the next token, so the value is what follows the
    key); every other target is -100. So a key after the context always is a query, and a query's key
    always appeared, with its value, before it.
    """
    n = num_kv_pairs
    q = n if num_queries is None else num_queries
    half = vocab // 2
    if n < 1 or not 1 <= q <= n:
        raise ValueError(f"need num_kv_pairs >= 1 and 1 <= num_queries <= num_kv_pairs, got {n} and {q}")
    if n > half - 1 or n > vocab - half:
        raise ValueError(f"vocab {vocab} is too small for {n} distinct keys and values")
    if seq_len < 2 * n + q:
        raise ValueError(f"seq_len {seq_len} is too short for {n} pairs and {q} queries (needs {2 * n + q})")
    g = generator
    on = dict(generator=g, device=g.device)  # drawn where the generator lives (a GPU's: no host work per step)
    keys = torch.rand(batch, half - 1, **on).argsort(dim=1)[:, :n] + 1  # distinct, from 1 .. half-1
    values = torch.rand(batch, vocab - half, **on).argsort(dim=1)[:, :n] + half  # distinct, from half .. vocab-1
    # filler: uniform over the vocabulary minus this row's keys (redraw the few that hit a key)
    filler = torch.randint(vocab, (batch, seq_len), **on)
    while True:
        hit = (filler[:, :, None] == keys[:, None, :]).any(-1)
        if not hit.any():
            break
        filler[hit] = torch.randint(vocab, (int(hit.sum()),), **on)
    inputs = filler
    inputs[:, 0 : 2 * n : 2] = keys
    inputs[:, 1 : 2 * n : 2] = values
    targets = torch.full((batch, seq_len), IGNORE, dtype=torch.int64, device=g.device)
    # queries: q of the keys, in random order, at q distinct random positions after the context
    which = torch.rand(batch, n, **on).argsort(dim=1)[:, :q]
    where = torch.rand(batch, seq_len - 2 * n, **on).argsort(dim=1)[:, :q] + 2 * n
    inputs.scatter_(1, where, keys.gather(1, which))
    targets.scatter_(1, where, values.gather(1, which))
    return inputs, targets


# ---- model ----
class Block(nn.Module):
    def __init__(self, spec: str, d_model: int, heads: int, options: dict, backend: str):
        super().__init__()
        self.norm1 = nn.RMSNorm(d_model, eps=1e-5)
        self.mixer = lamixer.Layer(spec, d_model, heads, backend=backend, **options)
        self.norm2 = nn.RMSNorm(d_model, eps=1e-5)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LM(nn.Module):
    def __init__(self, spec: str, vocab: int, d_model: int, layers: int, heads: int, options: dict, backend: str = "auto"):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(spec, d_model, heads, options, backend) for _ in range(layers))
        self.norm = nn.RMSNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, vocab, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def state_size(layer: lamixer.Layer) -> int:
    """Numbers in one sequence's recurrent state of the layer (all its states, all heads)."""
    return sum(s.numel() for s in layer.initial_state(1, device="meta").mixer)


def mixer_backend(layer: lamixer.Layer, device: torch.device) -> str:
    """The backend the layer's mixer runs on: what "auto" picks (Triton on CUDA where the templates cover the spec)."""
    if layer.backend != "auto":
        return layer.backend
    if device.type != "cuda":
        return "torch"
    from lamixer.backends import triton as triton_backend

    return "torch" if triton_backend.unsupported(layer.mixer.compiled, layer.sizes) else "triton"


def equal_state_options(spec: str, d_model: int, heads: int) -> dict:
    """Layer options that give the spec heads x (d_model/heads)^2 numbers of state per layer.

    Works from the option names a spec's layer section declares: expand_k / expand_v -> 1 (key and
    value dim d_model/heads), head_dim -> d_model/heads with expand_v 1 (Gated DeltaNet), Mamba-2's
    d_state -> d_model/(heads * expand) (its value dim is d_model * expand / heads), GSA's slots M ->
    half the head dim (two states, K x M and M x V). A spec with none of these keeps its defaults."""
    dk = d_model // heads
    probe = lamixer.Layer(spec, d_model, heads)
    have = probe.options
    opts: dict = {}
    for name in ("expand_k", "expand_v"):
        if name in have:
            opts[name] = 1
    if "head_dim" in have:
        opts["head_dim"] = dk
    if "d_state" in have:
        opts["d_state"] = max(1, dk // int(have.get("expand", 1)))
    if "M" in have:
        opts["M"] = max(1, dk // 2)
    return opts


# ---- training ----
def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))  # cosine down to lr / 10


@torch.no_grad()
def evaluate(model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], device) -> float:
    """Recall accuracy: the fraction of query positions where the argmax is the key's value."""
    model.eval()
    correct = total = 0
    for x, y in data:
        x, y = x.to(device), y.to(device)
        pred = model(x).argmax(-1)
        mask = y != IGNORE
        correct += int((pred[mask] == y[mask]).sum())
        total += int(mask.sum())
    model.train()
    return correct / total


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_best(spec: str, cfg: argparse.Namespace, device: torch.device, log=print) -> dict:
    """Train one spec's model at each learning rate of cfg.lrs; return the best run's row, with every rate's accuracy."""
    runs = [train_one(spec, cfg, device, lr, log) for lr in cfg.lrs]
    best = max(runs, key=lambda r: r["accuracy"])
    return {**best, "sweep": {str(r["lr"]): r["accuracy"] for r in runs}}


def train_one(spec: str, cfg: argparse.Namespace, device: torch.device, lr: float, log=print) -> dict:
    """Train one spec's model on fresh batches at peak learning rate lr; return its row of the table."""
    torch.manual_seed(cfg.seed)
    options = equal_state_options(spec, cfg.d_model, cfg.heads)
    model = LM(spec, cfg.vocab, cfg.d_model, cfg.layers, cfg.heads, options, cfg.backend).to(device)
    layer = model.blocks[0].mixer
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))
    train_gen = torch.Generator(device).manual_seed(cfg.seed)  # batches drawn on the training device
    eval_gen = torch.Generator(device).manual_seed(cfg.seed + 1_000_003)  # held out: another stream than training's
    eval_batch = min(cfg.batch, cfg.eval_sequences)
    eval_data = [mqar_batch(eval_batch, cfg.seq_len, cfg.num_kv_pairs, cfg.vocab, eval_gen) for _ in range(max(1, cfg.eval_sequences // eval_batch))]
    warmup = max(1, cfg.steps // 10)
    skip = min(5, cfg.steps // 5)  # throughput leaves out the first steps (Triton compiles, allocator warm-up)
    log(f"{spec} at lr {lr:g}: options {options}, sizes {layer.sizes}, state/layer {state_size(layer)}, params {params:,}, mixer backend {mixer_backend(layer, device)}")
    losses: list[float] = []
    sync(device)
    start = timed_from = time.perf_counter()
    for step in range(cfg.steps):
        if step == skip:
            sync(device)
            timed_from = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, lr, warmup)
        x, y = mqar_batch(cfg.batch, cfg.seq_len, cfg.num_kv_pairs, cfg.vocab, train_gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % max(1, cfg.steps // 10) == 0 or step + 1 == cfg.steps:
            losses.append(loss.item())
            log(f"  step {step + 1:5d}/{cfg.steps}  loss {losses[-1]:.4f}  lr {opt.param_groups[0]['lr']:.2e}")
    sync(device)
    end = time.perf_counter()
    timed_steps = cfg.steps - skip
    tokens_per_s = timed_steps * cfg.batch * cfg.seq_len / (end - timed_from) if timed_steps > 0 else float("nan")
    accuracy = evaluate(model, eval_data, device)
    log(f"  {spec} at lr {lr:g}: recall accuracy {accuracy:.3f}, {tokens_per_s:,.0f} training tokens/s")
    return {
        "spec": spec,
        "lr": lr,
        "mixer_backend": mixer_backend(layer, device),
        "options": options,
        "sizes": dict(layer.sizes),
        "state_size": state_size(layer),
        "params": params,
        "accuracy": accuracy,
        "final_loss": losses[-1] if losses else float("nan"),
        "tokens_per_s": tokens_per_s,
        "train_seconds": end - start,
    }


def print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for name in ("spec", "state/layer", "params", "accuracy", "lr", "tokens/s", "options"):
        table.add_column(name, justify="left" if name in ("spec", "options") else "right")
    for r in rows:
        opts = ", ".join(f"{k}={v}" for k, v in r["options"].items())
        lr = f"{r['lr']:g}" + (" of " + ", ".join(f"{float(k):g}: {a:.3f}" for k, a in r["sweep"].items()) if len(r.get("sweep", {})) > 1 else "")
        table.add_row(r["spec"], f"{r['state_size']:,}", f"{r['params']:,}", f"{r['accuracy']:.3f}", lr, f"{r['tokens_per_s']:,.0f}", opts)
    Console().print(table)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--specs", default=None, help=f"comma-separated shipped specs or .lam paths (default {DEFAULT_SPECS}; with --tiny {TINY_SPECS})")
    p.add_argument("--tiny", action="store_true", help="a small configuration for a CPU: " + ", ".join(f"{k}={v}" for k, v in TINY.items()))
    p.add_argument("--steps", type=int, help=f"training steps (full {FULL['steps']})")
    p.add_argument("--d-model", type=int, help=f"model width (full {FULL['d_model']})")
    p.add_argument("--layers", type=int, help=f"blocks (full {FULL['layers']})")
    p.add_argument("--heads", type=int, help=f"heads per mixer (full {FULL['heads']}); state per layer = d_model^2 / heads")
    p.add_argument("--seq-len", type=int, help=f"sequence length (full {FULL['seq_len']})")
    p.add_argument("--num-kv-pairs", type=int, help=f"key-value pairs per sequence, each queried once (full {FULL['num_kv_pairs']})")
    p.add_argument("--vocab", type=int, help=f"vocabulary size: keys and values from its halves (full {FULL['vocab']})")
    p.add_argument("--batch", type=int, help=f"sequences per step (full {FULL['batch']})")
    p.add_argument("--lr", help=f"comma-separated peak learning rates, each spec's row its best run (full {FULL['lr']})")
    p.add_argument("--eval-sequences", type=int, help=f"held-out sequences for the accuracy (full {FULL['eval_sequences']})")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"], help="the layers' lamixer backend")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--out", default=None, help="write the table, the configuration and the machine to this JSON file")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="train nothing: print the table of saved runs (--out files of one configuration, "
                   "e.g. one per learning rate), each spec's best run, and write it to --out")  # fmt: skip
    args = p.parse_args(argv)
    if args.merge:
        return args
    base = TINY if args.tiny else FULL
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.specs is None:
        args.specs = TINY_SPECS if args.tiny else DEFAULT_SPECS
    try:
        args.lrs = [float(x) for x in str(args.lr).split(",") if x.strip()]
    except ValueError:
        p.error(f"--lr {args.lr!r}: expected comma-separated numbers")
    if not args.lrs or any(not 0 < x < 1 for x in args.lrs):
        p.error(f"--lr {args.lr!r}: learning rates must lie in (0, 1)")
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} must be a multiple of --heads {args.heads}")
    return args


def device_info(device: torch.device) -> dict:
    info = {"device": str(device), "torch": torch.__version__, "lamixer": lamixer.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}  # fmt: skip
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        import triton

        info["triton"] = triton.__version__
    return info


def merge(paths: list[str]) -> dict:
    """Saved runs of one configuration (learning rates and specs aside) as one record: each spec's best run, with every
    rate's accuracy in its sweep; the record keeps each file's command and machine."""
    records = []
    for path in paths:
        try:
            with open(path) as f:
                record = json.load(f)
            if record.get("task") != "mqar" or not isinstance(record.get("results"), list):
                raise ValueError("not a saved MQAR run (--out of examples/mqar.py)")
        except (OSError, ValueError, AttributeError) as e:
            raise SystemExit(f"--merge: {path}: {e}") from None
        records.append(record)
    same = ("steps", "d_model", "layers", "heads", "seq_len", "num_kv_pairs", "vocab", "batch", "eval_sequences", "seed")
    first = records[0]["config"]
    for path, r in zip(paths, records):
        differ = [k for k in same if r["config"].get(k) != first.get(k)]
        if differ:
            raise SystemExit(f"--merge: {path} differs from {paths[0]} in {', '.join(differ)}")
    best: dict[str, dict] = {}
    for r in records:
        for row in r["results"]:
            sweep = {**best.get(row["spec"], {}).get("sweep", {}), **row.get("sweep", {str(row["lr"]): row["accuracy"]})}
            keep = row if row["spec"] not in best or row["accuracy"] > best[row["spec"]]["accuracy"] else best[row["spec"]]
            best[row["spec"]] = {**keep, "sweep": dict(sorted(sweep.items(), key=lambda kv: float(kv[0])))}
    config = {**first, "lr": ",".join(sorted({str(k) for row in best.values() for k in row["sweep"]}, key=float))}
    return {"task": "mqar", "config": config, "merged": [{"file": os.path.basename(p), "command": r["command"], "machine": r["machine"]}
            for p, r in zip(paths, records)], "chance": records[0]["chance"], "results": list(best.values())}  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.merge:
        record = merge(args.merge)
        c = record["config"]
        print_table(record["results"], f"MQAR: {c['num_kv_pairs']} pairs, seq {c['seq_len']}, vocab {c['vocab']}, d_model {c['d_model']} x {c['layers']} layers, "
                    f"{c['heads']} heads, {c['steps']} steps of {c['batch']} (merged: {', '.join(os.path.basename(p) for p in args.merge)})")  # fmt: skip
        if args.out:
            with open(args.out, "w") as f:
                json.dump(record, f, indent=2)
        return record["results"]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    specs = [s.strip() for s in args.specs.split(",") if s.strip()]
    config = {k: getattr(args, k) for k in ("specs", "tiny", "steps", "d_model", "layers", "heads", "seq_len", "num_kv_pairs", "vocab", "batch", "lr",
                                             "eval_sequences", "backend", "seed")}  # fmt: skip
    print(f"MQAR on {device}: " + ", ".join(f"{k}={v}" for k, v in config.items() if k != "specs"))
    print(f"chance for a value token: 1/{args.vocab - args.vocab // 2} = {1 / (args.vocab - args.vocab // 2):.4f}")
    record = {"task": "mqar", "config": config, "machine": device_info(device), "command": " ".join([os.path.basename(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
              "chance": 1 / (args.vocab - args.vocab // 2), "results": []}  # fmt: skip
    rows = record["results"]
    for spec in specs:
        rows.append(train_best(spec, args, device))
        if args.out:  # after every spec, so a run cut short keeps what it finished
            with open(args.out, "w") as f:
                json.dump(record, f, indent=2)
    title = (f"MQAR: {args.num_kv_pairs} pairs, seq {args.seq_len}, vocab {args.vocab}, d_model {args.d_model} x {args.layers} layers, "
             f"{args.heads} heads, {args.steps} steps of {args.batch} ({device})")  # fmt: skip
    print_table(rows, title)
    if args.out:
        print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()

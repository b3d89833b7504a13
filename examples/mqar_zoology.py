"""Multi-query associative recall by Zoology's protocol (Arora et al., 2023), with lamixer layers as the mixers.

This follows Zoology's MQAR sweep for the linear-attention layers (zoology/experiments/mqar_example_configs/
original_mqar_configs.py, zoology/experiments/models_repo.py, zoology/model.py, zoology/train.py):

- Data: each sequence is `n` key-value pairs k_1 v_1 .. k_n v_n (keys distinct from 1 .. vocab/2 - 1, values
  distinct from vocab/2 .. vocab - 1), then every key once, in random order, at even offsets 2n + 2 gap, the
  gaps drawn without replacement with probability proportional to (gap + 1)^(power_a - 1), power_a = 0.01.
  Every other position is a uniform token of the whole vocabulary. The target at a query is its key's value
  (the next token); no other position is scored. Training is a fixed MIXTURE of segments, visited in order
  every epoch without shuffling: 100,000 sequences of length 64 with 4 pairs, then 20,000 each of 128/8,
  256/16, 256/32 and 256/64. The test set is 1,000 sequences each of 64/4, 64/8, 64/16, 128/32, 256/64,
  512/128 and 1024/256; the accuracy is the mean over test sequences of each sequence's fraction of correct
  queries, and training stops early once it exceeds 0.99.
- Model: token embedding (normal(0, 0.02)) -> 2 blocks -> LayerNorm -> an LM head TIED to the embedding. For
  attention-like layers (gla, gated_deltanet, deltanet, any .lam file) the two blocks are a BaseConv (a
  depthwise causal convolution of width 3 times a linear map of the input, plus the input) and then the
  spec's layer, each a pre-LayerNorm residual block whose MLP is the identity (which adds the normalised
  stream to itself), with embedding dropout 0.1; every Linear starts at normal(0, 0.02) with zero bias. For
  mamba2 both blocks are the spec's layer behind an RMSNorm (Zoology's Mamba2Block), head dim 64.
- Layer sizes as Zoology's: 2 heads; gla with its default key/value expansion (0.5, 1) and no convolution of
  its own; gated_deltanet with head dim d_model/2 and value expansion 2; deltanet with key and value dim
  d_model/2; mamba2 with expand 2, head dim 64, d_state 16 (Zoology sweeps 8, 16, 24).
- Training: AdamW over all parameters (weight decay 0.1, betas (0.9, 0.999)), no warm-up, the rate cosine-
  annealed to 0 over the epochs (stepped once per epoch), no gradient clipping, batches of 256 (tests of 32),
  32 epochs, peak rates 1e-3, 3.2e-3, 1e-2, 3.2e-2; a spec's result at a width is its best rate.

    python examples/mqar_zoology.py                       # the full sweep (a GPU; see docs/mqar.md for its cost)
    python examples/mqar_zoology.py --tiny                # a reduced mixture on a CPU (15 to 25 minutes a spec, one thread)
    python examples/mqar_zoology.py --specs gla --d-models 128 --lrs 1e-2 --epochs 4 --out gla.json

Ablations: `--no-tie` (an untied LM head), `--layout stack` (every block the spec's layer, no BaseConv),
`--model hf` (lamixer.hf.LamixerForCausalLM: RMSNorm blocks of the spec's layer with SwiGLU MLPs unless
`--mlp none`, tied unless `--no-tie`), `--set SPEC.OPTION=VALUE` (a layer option), `--fill SPEC.PARAM=VALUE`
(start a layer parameter at a constant), `--train`/`--test` (other segments, SEQ:PAIRS:SEQUENCES), `--fresh` (every
training batch drawn anew rather than from a fixed set: --tiny's default, since a reduced fixed set is memorised).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/mqar.py: device info and state sizing
import mqar  # noqa: E402

import lamixer  # noqa: E402

IGNORE = -100
ZOOLOGY_TRAIN = "64:4:100000,128:8:20000,256:16:20000,256:32:20000,256:64:20000"
ZOOLOGY_TEST = "64:4:1000,64:8:1000,64:16:1000,128:32:1000,256:64:1000,512:128:1000,1024:256:1000"
FULL = dict(specs="gla,gated_deltanet,mamba2,deltanet", d_models="64,128,256", lrs="1e-3,3.16e-3,1e-2,3.16e-2", train=ZOOLOGY_TRAIN,
            test=ZOOLOGY_TEST, vocab=8192, epochs=32, batch=256, test_batch=32, fresh=False)  # fmt: skip
# the CPU check: Zoology's vocabulary, model and optimiser, the mixture cut to its two shortest segments
TINY = dict(specs="gated_deltanet,deltanet", d_models="64", lrs="1e-2", train="64:4:6400,128:8:1280", test="64:4:256,64:8:256,128:16:256",
            vocab=8192, epochs=10, batch=256, test_batch=64, fresh=True)  # fmt: skip
MAMBA_HEAD_DIM = 64  # Zoology's Mamba2 (headdim=64, expand=2)


# ---- data ----
@dataclass(frozen=True)
class Segment:
    """SEQ:PAIRS:SEQUENCES, one of Zoology's MQARConfig entries."""

    seq_len: int
    num_kv_pairs: int
    sequences: int

    @classmethod
    def parse(cls, text: str) -> Segment:
        try:
            seq_len, pairs, sequences = (int(x) for x in text.split(":"))
        except ValueError:
            raise SystemExit(f"segment {text!r}: expected SEQ:PAIRS:SEQUENCES, e.g. 64:4:100000") from None
        if seq_len % 2 or pairs < 1 or 4 * pairs > seq_len or sequences < 1:
            raise SystemExit(f"segment {text!r}: needs an even length of at least 4 x pairs and at least one sequence")
        return cls(seq_len, pairs, sequences)

    @property
    def name(self) -> str:
        return f"{self.seq_len}/{self.num_kv_pairs}"


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


Batches = list[tuple[torch.Tensor, torch.Tensor]]


def batch_sizes(segment: Segment, batch: int) -> list[int]:
    """A segment's sequences cut into batches in order, the last one short."""
    return [min(batch, segment.sequences - start) for start in range(0, segment.sequences, batch)]


def segment_batches(segment: Segment, batch: int, vocab: int, seed: int, device: torch.device, power_a: float) -> Batches:
    """A segment's fixed sequences, drawn once from their own seeded stream, in batches."""
    g = torch.Generator(device).manual_seed(seed)
    return [zoology_batch(b, segment.seq_len, segment.num_kv_pairs, vocab, g, power_a) for b in batch_sizes(segment, batch)]


def dataset(segments: list[Segment], batch: int, vocab: int, seed: int, device: torch.device, power_a: float) -> list[tuple[Segment, Batches]]:
    """Every segment's batches; each segment has its own seed, so adding one leaves the others' sequences as they were."""
    return [(s, segment_batches(s, batch, vocab, seed + 7919 * i, device, power_a)) for i, s in enumerate(segments)]


# ---- model ----
class BaseConv(nn.Module):
    """Zoology's BaseConv with a short kernel: y = conv(u) * proj(u) + u, conv depthwise and causal. It gives the next
    layer each token's predecessors, which binding a key to the value after it needs."""

    def __init__(self, d_model: int, kernel: int = 3):
        super().__init__()
        self.projection = nn.Linear(d_model, d_model)
        self.conv = nn.Conv1d(d_model, d_model, kernel, groups=d_model, padding=kernel - 1)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        conv = self.conv(u.transpose(1, 2))[..., : u.shape[1]].transpose(1, 2)
        return conv * self.projection(u) + u


class Block(nn.Module):
    """A pre-norm residual block, r + mixer(norm(r)). Zoology's TransformerBlock with an identity MLP hands the next block
    norm2(r) as its hidden state, and the next block adds that to the residual: r + norm2(r), written out here."""

    def __init__(self, mixer: nn.Module, d_model: int, norm: str):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model) if norm == "layer" else nn.RMSNorm(d_model, eps=1e-5)
        self.mixer = mixer
        self.norm2 = nn.LayerNorm(d_model) if norm == "layer" else None

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        r = r + self.mixer(self.norm1(r))
        return r if self.norm2 is None else r + self.norm2(r)


class ZoologyLM(nn.Module):
    """Zoology's LanguageModel: embedding -> (dropout) -> blocks -> LayerNorm -> head, the head tied to the embedding unless untied."""

    def __init__(self, vocab: int, d_model: int, mixers: list[nn.Module], norm: str, embed_dropout: float, tie: bool):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.dropout = nn.Dropout(embed_dropout)
        self.blocks = nn.ModuleList(Block(m, d_model, norm) for m in mixers)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        r = self.dropout(self.embed(tokens))
        for block in self.blocks:
            r = block(r)
        return self.norm(r)


@dataclass(frozen=True)
class Sizing:
    """How Zoology builds a spec's model: its blocks' layout and the spec layer's heads and options at a width."""

    layout: str  # "hybrid": BaseConv then the spec's layer (LayerNorm blocks); "stack": the spec's layer in every block (RMSNorm)
    heads: int
    options: dict


def zoology_sizing(spec: str, d_model: int) -> Sizing:
    """Zoology's models_repo.py settings for the specs it has (by the spec's name); any other spec as its attention-like
    layers: 2 heads and the spec's defaults, after a BaseConv."""
    key = spec_key(spec)
    if key == "mamba2":  # add_mamba2: Mamba2Block x 2, expand 2, headdim 64, d_state 8/16/24 (16 here)
        return Sizing("stack", max(1, 2 * d_model // MAMBA_HEAD_DIM), {"expand": 2, "d_state": 16})
    if key == "gated_deltanet":  # add_gated_delta_net: num_heads 2, head_dim d_model / 2, expand_v 2, conv 4
        return Sizing("hybrid", 2, {"head_dim": d_model // 2, "expand_v": 2})
    return Sizing("hybrid", 2, {})  # add_delta_net: expand_k = expand_v = 1; add_gla: FLA's (0.5, 1), no conv: the specs' defaults


def spec_key(spec: str) -> str:
    """How --set and --fill name a spec: a shipped spec by its name, a .lam file by its stem."""
    return Path(spec).stem if spec.endswith(".lam") else spec


def build_model(spec: str, d_model: int, cfg: argparse.Namespace) -> tuple[nn.Module, dict, int]:
    """(model, the spec layer's options, its heads) for one run."""
    sizing = zoology_sizing(spec, d_model)
    options = {**sizing.options, **cfg.overrides.get(spec_key(spec), {})}
    layout = cfg.layout or sizing.layout
    if cfg.model == "hf":
        model = hf_model(spec, d_model, sizing.heads, options, cfg)
    else:
        def layer() -> lamixer.Layer:
            return lamixer.Layer(spec, d_model, sizing.heads, backend=cfg.backend, **options)

        mixers = [BaseConv(d_model) if layout == "hybrid" and i % 2 == 0 else layer() for i in range(cfg.layers)]
        model = ZoologyLM(cfg.vocab, d_model, mixers, "layer" if layout == "hybrid" else "rms", 0.1 if layout == "hybrid" else 0.0, cfg.tie)
        zoology_init(model, layout)
    for layer in mixer_layers(model):
        fill_params(layer, cfg.fills.get(spec_key(spec), {}))
    return model, options, sizing.heads


def hf_model(spec: str, d_model: int, heads: int, options: dict, cfg: argparse.Namespace) -> nn.Module:
    import transformers  # noqa: F401  (first: lamixer registers its classes as transformers finishes importing)

    from lamixer.hf import LamixerConfig, LamixerForCausalLM

    config = LamixerConfig(spec=spec, vocab_size=cfg.vocab, hidden_size=d_model, num_heads=heads, num_layers=cfg.layers, layer_options=options,
                           backend=cfg.backend, use_cache=False, tie_word_embeddings=cfg.tie)  # fmt: skip
    model = LamixerForCausalLM(config)
    if cfg.mlp == "none":
        for block in model.model.layers:
            block.mlp = NoMLP()
    return model


class NoMLP(nn.Module):
    """A block's MLP left out: the block adds nothing after its mixer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


@torch.no_grad()
def zoology_init(model: ZoologyLM, layout: str) -> None:
    """zoology.model._init_weights: the embedding at normal(0, 0.02); in LayerNorm-block models every Linear (the layers'
    own included) at normal(0, 0.02) with zero bias; in Mamba blocks only the biases zeroed and the output projections
    scaled by 1/sqrt(layers) (convolutions and the spec's own parameters keep their initialisation)."""
    nn.init.normal_(model.embed.weight, std=0.02)
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear) or m is model.head:
            continue
        if layout == "hybrid":
            nn.init.normal_(m.weight, std=0.02)
        elif name.endswith("o_proj"):
            m.weight /= math.sqrt(len(model.blocks))
        if m.bias is not None:
            nn.init.zeros_(m.bias)


@torch.no_grad()
def fill_params(layer: lamixer.Layer, fills: dict) -> None:
    """Set named parameters of a layer (as named_parameters() names them, e.g. params.A_log, proj.g.1.bias) to a constant."""
    named = dict(layer.named_parameters())
    for name, value in fills.items():
        if name not in named:
            raise SystemExit(f"--fill: the layer has no parameter {name!r} (it has {', '.join(named)})")
        named[name].fill_(value)


def mixer_layers(model: nn.Module) -> list[lamixer.Layer]:
    return [m for m in model.modules() if isinstance(m, lamixer.Layer)]


def query_logits(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [queries, vocab], targets [queries]) at the scored positions only: the loss and the accuracy read nothing
    else, and the LM head over every position would be most of the work (a vocabulary of 8192 against d_model 128)."""
    mask = y != IGNORE
    if isinstance(model, ZoologyLM):
        return model.head(model.hidden(x)[mask]), y[mask]
    h = model.model(input_ids=x, use_cache=False).last_hidden_state
    return model.lm_head(h[mask]), y[mask]


# ---- training ----
@torch.no_grad()
def evaluate(model: nn.Module, test: list[tuple[Segment, Batches]]) -> tuple[float, dict[str, float]]:
    """Zoology's valid/accuracy: the mean over test sequences of each one's fraction of correct queries; and the same per segment."""
    model.eval()
    per: dict[str, float] = {}
    total = count = 0.0
    for segment, batches in test:
        seg_sum = seg_n = 0.0
        for x, y in batches:
            logits, target = query_logits(model, x, y)
            right = (logits.argmax(-1) == target).to(torch.float64)
            rows = (y != IGNORE).nonzero()[:, 0]  # each query's sequence
            per_seq = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device).index_add_(0, rows, right) / segment.num_kv_pairs
            seg_sum += float(per_seq.sum())
            seg_n += x.shape[0]
        per[segment.name] = seg_sum / seg_n
        total += seg_sum
        count += seg_n
    model.train()
    return total / count, per


def training_batches(cfg: argparse.Namespace, device: torch.device):
    """A function giving one epoch's batches: the segments in order, each in its batches. Zoology's are a fixed set of
    sequences, the same every epoch; with cfg.fresh every batch is drawn anew (a small set is otherwise memorised)."""
    if not cfg.fresh:
        fixed = dataset(cfg.train_segments, cfg.batch, cfg.vocab, cfg.seed, device, cfg.power_a)
        return lambda: (b for _, batches in fixed for b in batches)
    g = torch.Generator(device).manual_seed(cfg.seed)
    return lambda: (zoology_batch(b, s.seq_len, s.num_kv_pairs, cfg.vocab, g, cfg.power_a) for s in cfg.train_segments for b in batch_sizes(s, cfg.batch))


def train_one(spec: str, d_model: int, lr: float, cfg: argparse.Namespace, device: torch.device) -> dict:
    """One run: a fresh model trained at peak rate lr over the epochs (or until the test accuracy passes cfg.stop_at)."""
    torch.manual_seed(cfg.seed)
    model, options, heads = build_model(spec, d_model, cfg)
    model.to(device)
    layer = mixer_layers(model)[0]
    epoch_batches = training_batches(cfg, device)
    test = dataset(cfg.test_segments, cfg.test_batch, cfg.vocab, cfg.seed + 1_000_003, device, cfg.power_a)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs, eta_min=0.0)  # stepped once per epoch, as Zoology's
    history: list[dict] = []
    start = time.perf_counter()
    steps = 0
    for epoch in range(cfg.epochs):
        losses = []
        for x, y in epoch_batches():
            logits, target = query_logits(model, x, y)
            loss = F.cross_entropy(logits.float(), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            steps += 1
        accuracy, per = evaluate(model, test)
        history.append({"epoch": epoch + 1, "steps": steps, "train_loss": float(torch.stack(losses).mean()), "accuracy": accuracy, "per_segment": per})
        print(f"    epoch {epoch + 1}/{cfg.epochs} ({steps} steps, {time.perf_counter() - start:.0f} s): train loss {history[-1]['train_loss']:.3f}, "
              f"test accuracy {accuracy:.3f} (" + ", ".join(f"{k} {v:.3f}" for k, v in per.items()) + ")", flush=True)  # fmt: skip
        if accuracy > cfg.stop_at:
            break
        sched.step()
    mqar.sync(device)
    row = {"spec": spec, "d_model": d_model, "lr": lr, "accuracy": history[-1]["accuracy"], "per_segment": history[-1]["per_segment"],
           "final_loss": history[-1]["train_loss"], "epochs": len(history), "steps": steps, "heads": heads, "options": options,
           "state_size": mqar.state_size(layer), "params": sum(p.numel() for p in model.parameters()),
           "train_seconds": time.perf_counter() - start, "history": history}  # fmt: skip
    print(f"  {spec} d_model {d_model} lr {lr:g}: accuracy {row['accuracy']:.3f} after {steps} steps, {row['train_seconds']:.0f} s", flush=True)
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
    print("best test accuracy per spec (learning rate) at d_model " + ", ".join(map(str, widths)))
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
    p.add_argument("--tiny", action="store_true", help="a reduced run for a CPU: " + ", ".join(f"{k}={v}" for k, v in TINY.items()))
    p.add_argument("--specs", help=f"comma-separated shipped specs or .lam paths (full: {FULL['specs']})")
    p.add_argument("--d-models", help=f"comma-separated model widths (full: {FULL['d_models']})")
    p.add_argument("--lrs", help=f"comma-separated peak learning rates (full: {FULL['lrs']})")
    p.add_argument("--train", help=f"training segments SEQ:PAIRS:SEQUENCES, visited in order each epoch (full: {FULL['train']})")
    p.add_argument("--test", help=f"test segments SEQ:PAIRS:SEQUENCES (full: {FULL['test']})")
    p.add_argument("--vocab", type=int, help=f"vocabulary: keys from the lower half, values from the upper (full: {FULL['vocab']})")
    p.add_argument("--epochs", type=int, help=f"passes over the training segments (full: {FULL['epochs']})")
    p.add_argument("--batch", type=int, help=f"training sequences per step (full: {FULL['batch']})")
    p.add_argument("--test-batch", type=int, help=f"test sequences per forward (full: {FULL['test_batch']})")
    p.add_argument("--fresh", action="store_true", default=None, help="draw every training batch anew instead of Zoology's fixed "
                   "set (a reduced set is memorised rather than learned; default with --tiny)")  # fmt: skip
    p.add_argument("--fixed", dest="fresh", action="store_false", help="Zoology's fixed training set (the default without --tiny)")
    p.add_argument("--layers", type=int, default=2, help="blocks (in the hybrid layout they alternate BaseConv, spec layer)")
    p.add_argument("--power-a", type=float, default=0.01, help="Zoology's power law of the query gaps (1: uniform)")
    p.add_argument("--stop-at", type=float, default=0.99, help="stop once the test accuracy passes this (Zoology's early stopping)")
    p.add_argument("--model", choices=["zoology", "hf"], default="zoology", help="zoology: Zoology's LanguageModel around the "
                   "spec's layer; hf: lamixer.hf.LamixerForCausalLM (RMSNorm blocks of the spec's layer, SwiGLU MLPs)")  # fmt: skip
    p.add_argument("--layout", choices=["hybrid", "stack"], default=None, help="zoology model: BaseConv then the spec's layer, or the "
                   "spec's layer in every block (default: Zoology's for the spec)")  # fmt: skip
    p.add_argument("--no-tie", dest="tie", action="store_false", help="an LM head of its own instead of the embedding's transpose")
    p.add_argument("--mlp", choices=["model", "none"], default="model", help="hf model: its SwiGLU MLPs, or none")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SPEC.OPTION=VALUE", help="a layer option of one spec")
    p.add_argument("--fill", dest="fills", action="append", default=[], metavar="SPEC.PARAM=VALUE", help="start a layer parameter "
                   "of one spec at a constant (its name in Layer.named_parameters(), e.g. mamba2.params.A_log=0)")  # fmt: skip
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", help="write the configuration and every run (its per-epoch history included) to this JSON file")
    args = p.parse_args(argv)
    for key, value in (TINY if args.tiny else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.spec_list = [s.strip() for s in args.specs.split(",") if s.strip()]
    args.d_model_list = [int(x) for x in str(args.d_models).split(",")]
    args.lr_list = [float(x) for x in str(args.lrs).split(",")]
    args.train_segments = [Segment.parse(s) for s in args.train.split(",") if s.strip()]
    args.test_segments = [Segment.parse(s) for s in args.test.split(",") if s.strip()]
    args.overrides = parse_overrides(args.overrides)
    args.fills = parse_overrides(args.fills)
    if args.epochs < 1 or args.batch < 1 or args.test_batch < 1:
        p.error("--epochs, --batch and --test-batch must be at least 1")
    too_many = [s.name for s in args.train_segments + args.test_segments if s.num_kv_pairs > args.vocab // 2 - 1]
    if too_many:
        p.error(f"--vocab {args.vocab} has too few keys for segments {', '.join(too_many)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    skip = ("spec_list", "d_model_list", "lr_list", "train_segments", "test_segments", "out", "threads")
    config = {k: v for k, v in vars(args).items() if k not in skip}
    print("MQAR (Zoology protocol) on " + str(device) + ": " + ", ".join(f"{k}={v}" for k, v in config.items()), flush=True)
    record = {"task": "mqar_zoology", "config": config, "machine": mqar.device_info(device), "chance": 1 / (args.vocab - args.vocab // 2),
              "results": [], "best": {}}  # fmt: skip
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

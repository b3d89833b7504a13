"""A small language model of lamixer layers, trained with data and context parallelism under torchrun.

The model: token embedding -> `layers` x (RMSNorm -> lamixer.Layer residual -> RMSNorm -> MLP residual)
-> RMSNorm -> LM head. The processes form a grid of `--dp` data-parallel groups of `--cp` ranks each
(dp * cp = the world size): a data-parallel group's ranks share one batch of sequences and each holds a
contiguous slice of their time axis (lamixer.Layer(..., context_parallel=group)); the gradient is
averaged over all ranks by DistributedDataParallel (or FSDP2 with --fsdp), with each rank's loss scaled
so that the average is the data-parallel groups' mean of their batch's mean token loss.

The data: `--text FILE` (bytes, vocab 256), or by default a synthetic language drawn from a fixed random
Markov chain (each token has a few likely successors), whose loss falls towards the chain's entropy.
`--packed` packs documents of random lengths into one row (cu_seqlens), documents crossing the ranks'
slices; no token predicts the next document's first.

    torchrun --nproc_per_node 2 examples/train_lm.py --cp 2                 # one sequence over 2 ranks (CPU: gloo)
    torchrun --nproc_per_node 4 examples/train_lm.py --dp 2 --cp 2 --packed
    torchrun --nproc_per_node 2 examples/train_lm.py --cp 2 --fsdp          # parameters sharded (FSDP2)
    python examples/train_lm.py --steps 50                                  # one process

On CUDA (NCCL) the layers run the generated Triton kernels; on a CPU (gloo) the torch backend. Rank 0
shows a progress bar and writes the loss curve to `--plot`.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import lamixer

IGNORE = -100


# ---- model ----
class Block(nn.Module):
    def __init__(self, spec: str, d_model: int, heads: int, group, backend: str, **options):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.mixer = lamixer.Layer(spec, d_model, heads, backend=backend, context_parallel=group, **options)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.SiLU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, cu: torch.Tensor | None) -> torch.Tensor:
        x = x + self.mixer(self.norm1(x), cu_seqlens=cu)
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, spec: str, heads: int, group, backend: str, **options):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(spec, d_model, heads, group, backend, **options) for _ in range(layers))
        self.norm = nn.RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, cu: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cu)
        return self.head(self.norm(x))


# ---- data ----
class MarkovText:
    """A fixed random Markov chain over `vocab` tokens: each token has `fanout` successors with random weights."""

    def __init__(self, vocab: int, fanout: int = 4, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.next = torch.randint(vocab, (vocab, fanout), generator=gen)
        self.weights = torch.rand(vocab, fanout, generator=gen) ** 3
        self.weights /= self.weights.sum(1, keepdim=True)
        self.vocab = vocab

    def entropy(self) -> float:
        """The chain's conditional entropy per token (nats) under a uniform token distribution, roughly the floor."""
        return float(-(self.weights * self.weights.clamp_min(1e-12).log()).sum(1).mean())

    def sample(self, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
        out = torch.empty(batch, length, dtype=torch.int64)
        out[:, 0] = torch.randint(self.vocab, (batch,), generator=gen)
        for t in range(1, length):
            pick = torch.multinomial(self.weights[out[:, t - 1]], 1, generator=gen)[:, 0]
            out[:, t] = self.next[out[:, t - 1], pick]
        return out


class ByteText:
    """Windows of a file's bytes."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            self.data = torch.tensor(list(f.read()), dtype=torch.int64)
        self.vocab = 256

    def entropy(self) -> float:
        return float("nan")

    def sample(self, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
        starts = torch.randint(len(self.data) - length, (batch,), generator=gen)
        return torch.stack([self.data[s : s + length] for s in starts.tolist()])


def batch(source, cfg: argparse.Namespace, step: int, dp_index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One data-parallel group's batch (the same on its ranks): (inputs [B, T], labels [B, T], packed offsets or None)."""
    gen = torch.Generator().manual_seed(1000 * step + dp_index)
    if not cfg.packed:
        tokens = source.sample(cfg.batch, cfg.seq_len + 1, gen)
        return tokens[:, :-1], tokens[:, 1:], None
    lengths, total = [], cfg.batch * cfg.seq_len  # documents of random lengths packed into one row
    while sum(lengths) < total:
        lengths.append(min(int(torch.randint(8, 2 * cfg.seq_len, (1,), generator=gen)), total - sum(lengths)))
    docs = [source.sample(1, n + 1, gen)[0] for n in lengths]
    inputs = torch.cat([d[:-1] for d in docs])[None]
    labels = torch.cat([d[1:] for d in docs])[None]
    return inputs, labels, torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])


# ---- training ----
def setup(cfg: argparse.Namespace):
    """(device, rank, world, dp index, cp index, this rank's context-parallel group or None)."""
    if "WORLD_SIZE" not in os.environ:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return device, 0, 1, 0, 0, None
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cp = cfg.cp
    dp = cfg.dp or world // cp
    if dp * cp != world:
        raise SystemExit(f"--dp {dp} times --cp {cp} must be the world size {world}")
    # context-parallel groups of consecutive ranks (on one host, the fastest links); every rank makes every group
    groups = [dist.new_group(list(range(d * cp, (d + 1) * cp))) for d in range(dp)]
    group = groups[rank // cp] if cp > 1 else None
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"), rank, world, rank // cp, rank % cp, group


def train(cfg: argparse.Namespace) -> None:
    device, rank, world, dp_index, cp_index, group = setup(cfg)
    cp = cfg.cp if group is not None else 1
    torch.manual_seed(cfg.seed)
    source = ByteText(cfg.text) if cfg.text else MarkovText(cfg.vocab)
    options = dict(kv.split("=") for kv in cfg.option)
    model = LanguageModel(source.vocab, cfg.d_model, cfg.layers, cfg.spec, cfg.heads, group, cfg.backend,
                          **{k: float(v) for k, v in options.items()}).to(device)  # fmt: skip
    ddp = model
    if world > 1 and cfg.fsdp:  # FSDP2: each block's parameters sharded over all ranks, gathered for its forward
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif world > 1:
        ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s / cfg.steps, 1))))
    losses = []
    progress = _progress(rank, cfg.steps)
    began = time.perf_counter()
    for step in range(cfg.steps):
        inputs, labels, cu = batch(source, cfg, step, dp_index)
        if cu is not None:  # no token predicts the next document's first
            labels[0, cu[1:-1] - 1] = IGNORE
        counted = int((labels != IGNORE).sum())
        T = inputs.shape[1]
        lo, hi = cp_index * T // cp, (cp_index + 1) * T // cp  # this rank's slice of the time axis
        inputs, labels = inputs[:, lo:hi].to(device), labels[:, lo:hi].to(device)
        with torch.autocast(device.type, torch.bfloat16, enabled=cfg.bf16):
            logits = ddp(inputs, None if cu is None else cu.to(device))
        nll = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")
        # DDP (and FSDP) average over all dp * cp ranks; the cp ranks' losses add up to their group's mean token loss
        (nll / counted * cp).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        opt.zero_grad(set_to_none=True)
        mean = nll.detach() / counted
        if world > 1:
            dist.all_reduce(mean)  # sum over all ranks: each group's mean, times dp groups
            mean /= world // cp
        losses.append(float(mean))
        if progress is not None:
            progress.update(progress.task_ids[0], advance=1, description=f"loss {losses[-1]:.3f}")
    if progress is not None:
        progress.stop()
    if rank == 0:
        tokens = cfg.steps * (world // cp) * cfg.batch * cfg.seq_len
        print(f"{cfg.spec}: {cfg.steps} steps, dp {world // cp} x cp {cp}, final loss {sum(losses[-10:]) / len(losses[-10:]):.3f} "
              f"(floor ~{source.entropy():.3f}), {tokens / (time.perf_counter() - began):,.0f} tokens/s")  # fmt: skip
        _plot(losses, cfg, world // cp, cp, source.entropy())
    if world > 1:
        dist.destroy_process_group()


def _progress(rank: int, steps: int):
    if rank != 0:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    progress.add_task("loss ...", total=steps)
    progress.start()
    return progress


def _plot(losses: list[float], cfg: argparse.Namespace, dp: int, cp: int, floor: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(1, len(losses) + 1), losses, label=f"{cfg.spec}, dp {dp} x cp {cp}")
    if math.isfinite(floor):
        ax.axhline(floor, color="gray", linestyle="--", label="the chain's entropy (about the floor)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(cfg.plot, dpi=120)
    print(f"loss curve: {cfg.plot}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--spec", default="gated_deltanet", help="the layers' lamixer spec")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE", help="a layer option, e.g. head_dim=32 (repeatable)")
    p.add_argument("--dp", type=int, default=0, help="data-parallel groups (0: the world size over --cp)")
    p.add_argument("--cp", type=int, default=1, help="ranks each sequence's time axis is split over")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=64, help="the synthetic language's tokens")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=4, help="sequences per data-parallel group and step")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--packed", action="store_true", help="pack documents of random lengths into one row (cu_seqlens)")
    p.add_argument("--text", help="train on this file's bytes instead of the synthetic language")
    p.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    p.add_argument("--fsdp", action="store_true", help="shard the parameters with FSDP2 (fully_shard) instead of DistributedDataParallel")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (CUDA)")
    p.add_argument("--plot", default="train_lm_loss.png", help="where rank 0 writes the loss curve")
    p.add_argument("--seed", type=int, default=0)
    cfg = p.parse_args(argv)
    if cfg.spec == "gated_deltanet" and not any(o.startswith("head_dim=") for o in cfg.option):
        cfg.option += ["head_dim=32", "expand_v=1"]  # its layer's default (256) is for large models
    return cfg


if __name__ == "__main__":
    train(parse_args())

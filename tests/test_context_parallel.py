"""Context parallelism (lamixer/parallel) on the CPU with gloo: 2 and 3 processes, each holding an uneven slice of
the time axis, against one process holding the whole sequence, in float64: outputs, final states and every
gradient (inputs, params, initial states; a param's and an initial state's summed over the ranks) to 1e-10
relative. Mixers on the torch backend and on the interpreted Triton kernels, packed sequences crossing rank
boundaries, a stack of layers under DistributedDataParallel, and errors raised on every rank."""
import datetime
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lamixer
from lamixer.tools.check import random_call

TOL = 1e-10
SLICES = {2: [7, 12], 3: [6, 2, 11]}  # the 2-token rank is shorter than lln's blocks (K = 5): they reach two ranks back
PACKED = {2: [[0, 4, 9, 19], [0, 3, 19]], 3: [[0, 4, 7, 19], [0, 6, 13, 19], [0, 3, 19]]}  # every kind of crossing


# ---- what each process runs ----
def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))


def _summed(x: torch.Tensor | None, like: torch.Tensor, group) -> torch.Tensor:
    """A gradient summed over the ranks (None: this rank's share is zero)."""
    g = torch.zeros_like(like) if x is None else x.clone()
    dist.all_reduce(g, group=group)
    return g


def _mixer_case(group, name: str, backend: str, cu: list[int] | None) -> dict[str, float]:
    """Relative errors of one context-parallel call of `name` against one process (outputs, final states, grads)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    lengths = SLICES[world]
    mixer = lamixer.load(name)
    tensors, states = random_call(mixer, B=2, T=sum(lengths), H=2, size=5, seed=1, cu_seqlens=cu)
    cu_t = None if cu is None else torch.tensor(cu)
    gen = torch.Generator().manual_seed(2)
    whole = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    h0 = [s.clone().requires_grad_() for s in states]
    # one process on the torch backend: the Triton kernels match it to float64 rounding (test_triton_backend.py), and
    # their interpreter is slow
    o, finals = mixer(**whole, initial_state=tuple(h0), output_final_state=True, backend="torch", cu_seqlens=cu_t)
    finals = finals if isinstance(finals, tuple) else (finals,)
    w_o = torch.randn(o.shape, generator=gen, dtype=o.dtype)
    w_f = [torch.randn(f.shape, generator=gen, dtype=f.dtype) for f in finals]
    shares = torch.rand(world, generator=gen, dtype=torch.float64)  # each rank's part of the final states' loss
    ((o * w_o).sum() + sum((f * w).sum() for f, w in zip(finals, w_f))).backward()

    start, stop = sum(lengths[:rank]), sum(lengths[: rank + 1])
    kinds = {op.name: op.kind for op in mixer.compiled.graph.operands}
    local = {k: (v[:, start:stop] if kinds[k] == "input" else v).clone().requires_grad_() for k, v in tensors.items()}
    h0_local = [s.clone().requires_grad_() for s in states]
    o_l, finals_l = mixer(**local, initial_state=tuple(h0_local), output_final_state=True, backend=backend, cu_seqlens=cu_t,
                          context_parallel=group)  # fmt: skip
    finals_l = finals_l if isinstance(finals_l, tuple) else (finals_l,)
    share = shares[rank] / shares.sum()
    ((o_l * w_o[:, start:stop]).sum() + sum((f * w * share).sum() for f, w in zip(finals_l, w_f))).backward()

    errors = {"o": _rel(o_l.detach(), o[:, start:stop].detach())}
    errors.update({f"final {i}": _rel(f.detach(), g.detach()) for i, (f, g) in enumerate(zip(finals_l, finals))})
    for k, x in local.items():
        want = whole[k].grad
        got = _summed(x.grad, x, group) if kinds[k] == "param" else x.grad
        errors[f"d{k}"] = _rel(got, want if kinds[k] == "param" else want[:, start:stop])
    errors.update({f"dh0 {i}": _rel(_summed(x.grad, x, group), h.grad) for i, (x, h) in enumerate(zip(h0_local, h0))})
    return errors


def _inference_case(group, name: str, backend: str) -> dict[str, float]:
    """An inference call (no gradient: the triton backend runs the recurrent kernel) against one process."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    lengths = SLICES[world]
    mixer = lamixer.load(name)
    tensors, states = random_call(mixer, B=2, T=sum(lengths), H=2, size=5, seed=4)
    start, stop = sum(lengths[:rank]), sum(lengths[: rank + 1])
    kinds = {op.name: op.kind for op in mixer.compiled.graph.operands}
    with torch.no_grad():
        o, finals = mixer(**tensors, initial_state=states, output_final_state=True, backend="torch")
        local = {k: v[:, start:stop] if kinds[k] == "input" else v for k, v in tensors.items()}
        o_l, finals_l = mixer(**local, initial_state=states, output_final_state=True, backend=backend, context_parallel=group)
    finals, finals_l = (f if isinstance(f, tuple) else (f,) for f in (finals, finals_l))
    return {"o": _rel(o_l, o[:, start:stop]), **{f"final {i}": _rel(a, b) for i, (a, b) in enumerate(zip(finals_l, finals))}}


class _Stack(torch.nn.Module):
    """Layers with residual connections."""

    def __init__(self, names: list[str], group):
        super().__init__()
        torch.manual_seed(0)
        options = {"gated_deltanet": {"head_dim": 8, "expand_v": 1}, "mamba2": {"d_state": 8}}
        self.layers = torch.nn.ModuleList(lamixer.Layer(n, 16, 2, backend="torch", context_parallel=group, **options.get(n, {})) for n in names)

    def forward(self, x: torch.Tensor, cu: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x, cu_seqlens=cu)
        return x


def _layers_case(group, names: list[str], cu: list[int] | None, sharded: bool = False) -> dict[str, float]:
    """A stack of layers under DistributedDataParallel (sharded: FSDP2's fully_shard) over the default group with
    context parallelism over `group`, against the same stack in one process: outputs, input and parameter gradients."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    lengths = SLICES[world]
    one = _Stack(names, None).double()
    model = _Stack(names, group).double()
    model.load_state_dict(one.state_dict())
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        ddp = fully_shard(model)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    cu_t = None if cu is None else torch.tensor(cu)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1 if cu is not None else 2, sum(lengths), 16, generator=gen, dtype=torch.float64)
    w = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    xw = x.clone().requires_grad_()
    y = one(xw, cu_t)
    (y * w).sum().backward()
    start, stop = sum(lengths[:rank]), sum(lengths[: rank + 1])
    xl = x[:, start:stop].clone().requires_grad_()
    yl = ddp(xl, cu_t)
    # DDP and FSDP average the ranks' gradients, and each rank's is its share of the sequence's: the loss times the
    # group's size
    ((yl * w[:, start:stop]).sum() * world).backward()
    errors = {"y": _rel(yl.detach(), y[:, start:stop].detach()), "dx": _rel(xl.grad / world, xw.grad[:, start:stop])}
    for (n, p), q in zip(model.named_parameters(), one.parameters()):
        errors[f"d{n}"] = _rel(p.grad.full_tensor() if sharded else p.grad, q.grad)
    return errors


def _errors_case(group) -> None:
    """A bad argument on one rank raises on every rank (none waits in a collective)."""
    rank = dist.get_rank(group)
    mixer = lamixer.load("gla")
    tensors, _ = random_call(mixer, B=1, T=6, H=2, size=4, seed=0, initial_state=False)
    q, k, v, g = (tensors[n] for n in ("q", "k", "v", "g"))
    bad = [
        ((q, k[..., :3] if rank == 1 else k, v, g), {}, "k" if rank == 1 else "context_parallel"),  # one rank's shapes
        ((q, k, v, g), {"cu_seqlens": torch.tensor([0, 2 + rank, 12])}, "cu_seqlens"),  # offsets that differ between ranks
        ((q, k, v, g), {"cu_seqlens": torch.tensor([0, 5, 13])}, "cu_seqlens"),  # offsets past the ranks' tokens
        ((q, k, v, g), {"backend": "interpret"}, "backend"),
        (tuple(x[:, :0] if rank == 0 else x for x in (q, k, v, g)), {}, "context_parallel"),  # a rank without tokens
    ]
    for args, kwargs, argument in bad:
        with pytest.raises(lamixer.ArgumentError) as e:
            mixer(*args, context_parallel=group, **kwargs)
        assert e.value.argument == argument, (argument, str(e.value))
    with pytest.raises(lamixer.ArgumentError, match="ProcessGroup"):
        mixer(q, k, v, g, context_parallel="group")


def _worker(rank: int, world: int, path: str, cases: list, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    group = dist.new_group(list(range(world)))  # its own communicator, apart from DDP's default group
    lines = []
    try:
        for kind, *args in cases:
            began = time.perf_counter()
            if kind == "errors":
                _errors_case(group)
                continue
            errors = {"mixer": _mixer_case, "inference": _inference_case, "layers": _layers_case}[kind](group, *args)
            worst = max(errors, key=errors.get)
            lines.append(f"{kind} {args}: worst {worst} {errors[worst]:.1e} ({time.perf_counter() - began:.1f} s)")
            assert errors[worst] < TOL, (kind, args, {k: e for k, e in errors.items() if e >= TOL})
        dist.destroy_process_group()
    finally:
        if rank == 0:
            with open(out, "w") as f:
                f.write("\n".join(lines))
    os._exit(0)  # done: skip the interpreter's teardown (seconds of it on two shared cores)


def _launch(world: int, cases: list, timeout: float = 300) -> str:
    """Run the cases on `world` processes; a failure in any raises here, as does one still running after timeout."""
    folder = tempfile.mkdtemp()
    path, out = os.path.join(folder, "rendezvous"), os.path.join(folder, "report")
    # processes forked from one server that has imported torch and lamixer once, not each importing them afresh
    mp.set_forkserver_preload(["torch", "torch.distributed", "lamixer.api", "lamixer.layer", __name__])
    ctx = mp.start_processes(_worker, args=(world, path, cases, out), nprocs=world, join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=0.1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"context-parallel processes still running after {timeout} s: {cases}")
    report = open(out).read() if os.path.exists(out) else ""
    print(report)
    return report


# ---- the tests ----
def test_every_shipped_mixer_two_ranks_torch():
    """Every family (additive under each decay kind, delta, chained, statistics and block attention, several writes
    per token), unpacked, 2 ranks."""
    _launch(2, [("mixer", name, "torch", None) for name in lamixer.shipped_specs()])


def test_packed_sequences_across_three_ranks():
    """Packed sequences that cross rank boundaries, start at one, or span every rank; 3 ranks, one shorter than a
    block of lln's block attention."""
    specs = ["gla", "gsa", "lln", "gated_deltanet", "rwkv6", "mamba2"]
    _launch(3, [("mixer", name, "torch", cu) for name in specs for cu in PACKED[3]] + [("mixer", "kda", "torch", None)])


def test_interpreted_triton_kernels_two_ranks():
    """The chunk kernels (additive with a decay along the keys and with a normaliser, the delta rule) under
    TRITON_INTERPRET=1, unpacked and packed; the recurrent kernel (inference)."""
    cases = [("mixer", name, "triton", None) for name in ("gla", "lln", "gated_deltanet")]
    cases += [("mixer", "gated_deltanet", "triton", PACKED[2][0]), ("mixer", "simple_gla", "triton", PACKED[2][1])]
    _launch(2, cases + [("inference", "deltanet", "triton"), ("inference", "rwkv6", "triton")])


def test_layers_under_ddp_equal_one_process():
    """Convolutions (gated_deltanet, mamba2), a token shift (rwkv6) and rotary positions (retnet) take the previous
    ranks' tokens; DistributedDataParallel over the same processes, unpacked and packed; FSDP2 (fully_shard); and
    errors on every rank."""
    stack = ["gated_deltanet", "rwkv6", "retnet", "mamba2"]
    _launch(2, [("layers", stack, None), ("layers", stack, PACKED[2][0]), ("layers", ["gla", "lln"], None, True), ("errors",)])

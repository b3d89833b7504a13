"""The `lamixer` command: a thin layer over the Python API."""
from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ..api import SPEC_SUFFIX, Mixer, load, shipped_source, shipped_specs
from ..errors import LamixerError
from . import explain as explain_mod

console = Console(width=None if sys.stdout.isatty() else 160)

# float64 against the float64 interpreter: anything above this is a bug, not rounding
CHECK_TOLERANCE = 1e-7


def _load(spec: str) -> Mixer:
    try:
        return load(spec)
    except LamixerError as e:
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False, soft_wrap=True)
        sys.exit(2)


@click.group()
@click.version_option(package_name="lamixer")
def main() -> None:
    """lamixer: compile linear-attention token mixers from declarative specs."""


@main.command("list")
def list_cmd() -> None:
    """The shipped specs and how each is classified."""
    table = Table(title="shipped specs")
    for col in ("name", "inputs", "states", "rule", "decay", "composition", "extras"):
        table.add_column(col)
    for name in shipped_specs():
        row = explain_mod.summary(load(name).compiled)
        table.add_row(*row.values())
    console.print(table)


@main.command()
@click.argument("spec")
@click.option("--graph", "graph_file", type=click.Path(dir_okay=False), help="Draw the IR to FILE (.png, .svg, .pdf or .json).")
@click.option("--json", "as_json", is_flag=True, help="Print the kernel plan as JSON instead of the report.")
def explain(spec: str, graph_file: str | None, as_json: bool) -> None:
    """Show SPEC's classified IR and its kernel plan."""
    m = _load(spec)
    if as_json:
        import json

        click.echo(json.dumps(explain_mod.plan_json(m.compiled), indent=1))
    else:
        for line in explain_mod.report(m.compiled):
            click.echo(line)
    if graph_file:
        if not graph_file.endswith((".png", ".svg", ".pdf", ".json")):
            raise click.BadParameter("use a .png, .svg, .pdf or .json file", param_hint="--graph")
        explain_mod.draw(m.compiled, graph_file)
        click.echo(f"\ngraph written to {graph_file}", err=as_json)


CASES = [  # (label, T, gate, initial state, packed sequences)
    ("T=1", 1, "normal", True, None),
    ("T=37 strong gates", 37, "strong", True, None),
    ("T=130 weak gates", 130, "weak", True, None),
    ("T=100 no state", 100, "normal", False, None),
    ("varlen 5+32+23", None, "normal", True, [0, 5, 37, 60]),
]
INFERENCE_CASES = [  # without gradients, where the triton backend runs the recurrent kernel
    ("inference T=1", 1, "normal", True, None),
    ("inference T=37 strong gates", 37, "strong", True, None),
    ("inference varlen 5+32+23", None, "weak", False, [0, 5, 37, 60]),
]


@main.command()
@click.argument("specs", nargs=-1)
@click.option("--all", "all_specs", is_flag=True, help="Check every shipped spec.")
@click.option("--backend", "backends", multiple=True, help="Backend(s) to check against the interpreter (default: every one available here).")
@click.option("--seed", default=0, show_default=True)
@click.option("--device", default=None, help="Where the random inputs live (default: cuda when visible and not under TRITON_INTERPRET, else cpu).")
def check(specs: tuple[str, ...], all_specs: bool, backends: tuple[str, ...], seed: int, device: str | None) -> None:
    """Run backends against the interpreter on random float64 inputs: outputs, final states, all gradients."""
    from ..backends import triton as triton_backend
    from .check import compare, random_call

    names = list(specs) + (shipped_specs() if all_specs else [])
    if not names:
        raise click.UsageError("name a spec (or a spec file), or pass --all")
    mixers = [_load(n) for n in names]
    if device is None:
        import os

        import torch

        device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    if not backends:
        backends = ("torch", "triton") if _triton_runs_here() else ("torch",)
    table = Table(title=f"relative RMS error against the interpreter (float64; fail above {CHECK_TOLERANCE:g})")
    for col in ("spec", "backend", "case", "output", "final states", "gradients", "worst grad", "verdict"):
        table.add_column(col)
    failed = False
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("checking", total=len(mixers) * len(backends) * len(CASES) + len(mixers) * ("triton" in backends) * len(INFERENCE_CASES))
        for m in mixers:
            for backend in backends:
                if backend == "triton":
                    failed |= _check_inference(m, seed, device, table, progress, task)
                missing = triton_backend.unsupported(m.compiled) if backend == "triton" else []
                if missing:
                    table.add_row(m.name, backend, "-", "-", "-", "-", "-", f"[yellow]chunk kernels not available: {'; '.join(missing)}[/yellow]")
                    progress.advance(task, len(CASES))
                    continue
                for label, T, gate, init, cu in CASES:
                    progress.update(task, description=f"{m.name} / {backend} / {label}")
                    tensors, states = random_call(m, T=T or 1, gate=gate, seed=seed, initial_state=init, cu_seqlens=cu, device=device)
                    try:
                        c = compare(m, backend, tensors, states, cu_seqlens=cu, seed=seed)
                    except LamixerError as e:
                        table.add_row(m.name, backend, label, "-", "-", "-", "-", f"[yellow]skipped: {e}[/yellow]")
                        progress.advance(task)
                        continue
                    grads = {k: v for k, v in c.errors.items() if k.startswith("d")}
                    states_err = max((v for k, v in c.errors.items() if k.startswith("state")), default=0.0)
                    worst_grad = max(grads, key=grads.get) if grads else "-"
                    ok = c.worst < CHECK_TOLERANCE
                    failed |= not ok
                    table.add_row(m.name, backend, label, f"{c.errors['o']:.1e}", f"{states_err:.1e}",
                                  f"{max(grads.values(), default=0.0):.1e}", worst_grad,
                                  "[green]ok[/green]" if ok else "[red]MISMATCH[/red]")  # fmt: skip
                    progress.advance(task)
    console.print(table)
    if failed:
        console.print("[red]mismatch against the interpreter[/red]")
        sys.exit(1)


def _check_inference(m: Mixer, seed: int, device: str, table, progress, task) -> bool:
    """The triton backend without gradients (the recurrent kernel) against the interpreter; True when it failed."""
    from .check import compare_inference, random_call

    failed = False
    for label, T, gate, init, cu in INFERENCE_CASES:
        progress.update(task, description=f"{m.name} / triton / {label}")
        tensors, states = random_call(m, T=T or 1, gate=gate, seed=seed, initial_state=init, cu_seqlens=cu, device=device)
        try:
            c = compare_inference(m, "triton", tensors, states, cu_seqlens=cu)
        except LamixerError as e:
            table.add_row(m.name, "triton", label, "-", "-", "-", "-", f"[yellow]skipped: {e}[/yellow]")
            progress.advance(task)
            continue
        states_err = max((v for k, v in c.errors.items() if k.startswith("state")), default=0.0)
        ok = c.worst < CHECK_TOLERANCE
        failed |= not ok
        table.add_row(m.name, "triton", label, f"{c.errors['o']:.1e}", f"{states_err:.1e}", "-", "-",
                      "[green]ok[/green]" if ok else "[red]MISMATCH[/red]")  # fmt: skip
        progress.advance(task)
    return failed


def _triton_runs_here() -> bool:
    import os

    import torch

    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


@main.command()
@click.argument("spec")
@click.option("--B", "B", default=4, show_default=True)
@click.option("--T", "T", default=8192, show_default=True)
@click.option("--H", "H", default=16, show_default=True)
@click.option("--size", default=128, show_default=True, help="Every feature dim (K, V, ...).")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option("--limit", type=int, default=None, help="Try at most this many candidates.")
@click.option("--interpret", is_flag=True, help="Run under Triton's CPU interpreter (checks the machinery; its times mean nothing).")
def autotune(spec: str, B: int, T: int, H: int, size: int, dtype: str, limit: int | None, interpret: bool) -> None:
    """Search kernel configurations for SPEC on this GPU; each is checked against the torch backend, then timed."""
    import os

    import torch

    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        raise click.ClickException("autotune times kernels on a GPU and none is visible (use --interpret to exercise it on the CPU)")
    from ..tuning import config_cache as tuning_cache
    from ..tuning import search

    m = _load(spec)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    table = Table(title=f"{m.name}: B={B} T={T} H={H} dims={size} {dtype} on {tuning_cache.device_name(torch.device('cuda' if not interpret else 'cpu'))}")
    for col in ("config", "rel. error", "fwd+bwd ms", "note"):
        table.add_column(col)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("autotuning", total=min(limit or 10**9, len(search.search_space(m, size)[1])))

        def on_trial(t):
            progress.advance(task)
            row = (search.describe(t.config), "-" if t.error is None else f"{t.error:.1e}", "-" if t.ms is None else f"{t.ms:.3f}", t.note)
            table.add_row(*row)
            progress.console.print("  ".join(row), highlight=False)  # as it goes: the fastest so far is already stored

        try:
            trials, keys = search.tune(m, B, T, H, size, torch_dtype, "cpu" if interpret else "cuda", limit, on_trial)
        except ValueError as e:
            raise click.ClickException(f"{m.name} has no Triton kernels to tune: {e}") from None
    console.print(table)
    if not keys:
        raise click.ClickException("no candidate was both correct and runnable")
    best = min((t for t in trials if t.ms is not None), key=lambda t: t.ms)
    console.print(f"best: {search.describe(best.config)} ({best.ms:.3f} ms); saved to {tuning_cache.cache_file()}")


@main.command()
@click.argument("specs", nargs=-1, required=True)
@click.option("--vs", default="fla,sdpa", show_default=True, help="Competitors: fla (when importable), sdpa.")
@click.option("--Ts", "Ts", default="2048,4096,8192,16384", show_default=True, help="Sequence lengths (B*T = 32768).")
@click.option("--decode/--no-decode", default=True, show_default=True, help="Also time a one-token decode step at B = 1, 64, 256.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), help="Save a plot of time against T.")
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=click.Path(file_okay=False))
def bench(specs: tuple[str, ...], vs: str, Ts: str, decode: bool, plot_file: str | None, out_dir: str) -> None:
    """Time SPECS' Triton kernels against FLA and SDPA on this GPU (forward, forward+backward, memory, decode)."""
    import json
    import os

    import torch

    from ..backends import triton as triton_backend
    from . import bench as bench_mod

    if not torch.cuda.is_available():
        raise click.ClickException("bench times kernels on a GPU and none is visible")
    mixers = [_load(s) for s in specs]
    for m in mixers:
        missing = triton_backend.unsupported(m.compiled)
        if missing:
            raise click.ClickException(f"{m.name} has no Triton kernels yet: {'; '.join(missing)}")
    lengths = [int(t) for t in Ts.split(",")]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"bench_{'_'.join(m.name for m in mixers)}.json")

    def save(res: dict) -> None:  # after every row (atomically): a run cut short keeps what it measured
        with open(path + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(path + ".tmp", path)

    res = bench_mod.run(mixers, lengths, set(vs.split(",")), decode, log=lambda row: console.print(row), save=save)
    table = Table(title=f"{res['device']}: B*T = 32768, H = 16, D = 128, bf16 (median ms)")
    for col in ("op", "T", "fwd", "fwd+bwd", "peak GiB", "vs FLA fwd / fwd+bwd", "fwd vs floor"):
        table.add_column(col)
    for r in res["rows"]:
        if "T" in r:
            ratio = f"{r.get('fwd_vs_fla', '-')} / {r.get('fwdbwd_vs_fla', '-')}" if r["op"].startswith("lamixer") else ""
            table.add_row(r["op"], str(r["T"]), str(r.get("fwd_ms", r.get("error", "-"))), str(r.get("fwdbwd_ms", "-")),
                          str(r.get("peak_GiB", "-")), ratio, str(r.get("fwd_vs_floor", "")))  # fmt: skip
    console.print(table)
    if plot_file:
        bench_mod.plot(res, plot_file)
    console.print(f"results in {path}" + (f", plot in {plot_file}" if plot_file else ""))


@main.command("compile")
@click.argument("specs", nargs=-1)
@click.option("--all", "all_specs", is_flag=True, help="Compile every shipped spec.")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to write into.")
def compile_cmd(specs: tuple[str, ...], all_specs: bool, out_dir: str) -> None:
    """Write each of SPECS as a Python package, OUT_DIR/<name>/, that imports only torch and triton.

    One spec gives a standalone package (its own runtime/ and kernels/); several share one runtime/ and
    kernels/ at OUT_DIR level, so OUT_DIR becomes a package too (generated/ is --all)."""
    from ..emit.write import write

    names = list(specs) + (shipped_specs() if all_specs else [])
    if not names:
        raise click.UsageError("name a spec (or a spec file), or pass --all")
    for path in write([_load(n).compiled for n in names], out_dir):
        click.echo(f"wrote {path}")


@main.command()
@click.argument("name")
@click.option("--from", "base", default="linear_attn", show_default=True, help="The shipped spec or spec file to start from.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help=f"Where to write (default NAME{SPEC_SUFFIX}).")
def new(name: str, base: str, output: str | None) -> None:
    """Start a new spec NAME from an existing one."""
    import re

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise click.BadParameter("a spec name is a letter or underscore followed by letters, digits and underscores", param_hint="NAME")
    text = shipped_source(base) if base in shipped_specs() else None
    if text is None:
        path = Path(base)
        if not path.is_file():
            raise click.BadParameter(f"{base!r} is neither a shipped spec nor a file", param_hint="--from")
        text = path.read_text()
    _load(base)  # the starting point must itself be valid
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("mixer "))
    lines[head] = f'mixer {name} "{name}: a variant of {load(base).name}"'
    out = Path(output or f"{name}{SPEC_SUFFIX}")
    if out.exists():
        raise click.ClickException(f"{out} exists; not overwriting it")
    out.write_text("\n".join(lines) + "\n")
    load(str(out))
    click.echo(f"wrote {out}: edit it, then `lamixer check {out}` and `lamixer explain {out}`")


if __name__ == "__main__":
    main()

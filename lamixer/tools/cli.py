"""The `lamixer` command: a thin layer over the Python API.

torch, rich and the compiler load inside the commands that use them, so `lamixer --help` (or `-h`) and a mistyped
option answer at once. Every error is click's one style, `Error: ...` on stderr: exit status 2 for what was asked
wrongly (an option's value, a spec that does not compile), 1 for what went wrong doing it (a check that failed or
was skipped, no GPU for a command that times one, a path that cannot be written, a package not overwritten).
"""
from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import click

from ..errors import LamixerError

if TYPE_CHECKING:
    from rich.console import Console

    from ..api import Mixer

CONTEXT = {"help_option_names": ["-h", "--help"]}
# autotune's and bench's sizes were spelled --B, --T, --H and --Ts: still understood (click maps the old names
# onto the new as it parses), no longer shown
OLD_SPELLINGS = {"B": "batch", "T": "length", "H": "heads", "Ts": "lengths"}
RENAMED = {**CONTEXT, "token_normalize_func": lambda name: OLD_SPELLINGS.get(name, name)}
POSITIVE = click.IntRange(min=1)

# float64 against the float64 interpreter: anything above this is a bug, not rounding
CHECK_TOLERANCE = 1e-7


class BadSpec(click.ClickException):
    """A spec that does not load is the user's input gone wrong (exit status 2, as a usage error), but its message
    already points at the spec's own line: click's usage line above it would only be noise."""

    exit_code = 2


class CommaChoice(click.Choice):
    """A comma-separated list of choices ("fla,sdpa"), each checked as click.Choice checks one; "" is none."""

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        return tuple(super(CommaChoice, self).convert(v.strip(), param, ctx) for v in value.split(",") if v.strip())


class PositiveInts(click.ParamType):
    """A comma-separated list of positive integers ("2048,4096")."""

    name = "n,n,..."

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            out = tuple(int(v) for v in value.split(","))
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of integers", param, ctx)
        if min(out) < 1:
            self.fail(f"{value!r}: every value must be at least 1", param, ctx)
        return out


def _console() -> Console:
    """A console as wide as the terminal, or as COLUMNS says (rich's default: 80 where output is not a terminal)."""
    from rich.console import Console

    return Console()


def _table(title: str, columns: tuple[str, ...], whole_first: bool = True):
    """A rich table; whole_first: its first column (what each row is: a spec, an op, a configuration) is never cut or
    wrapped, where at 80 columns rich would shorten it to an ellipsis and a row could no longer be told from its
    neighbours. A table too wide for that at 80 columns gives it up (the check table: rich would cut its errors'
    exponents instead)."""
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, no_wrap=whole_first and i == 0)
    return table


def _load(spec: str) -> Mixer:
    from ..api import load

    try:
        return load(spec)
    except LamixerError as e:
        raise BadSpec(str(e)) from None


def _spec_names(specs: tuple[str, ...], all_specs: bool) -> list[str]:
    from ..api import shipped_specs

    names = list(specs) + (shipped_specs() if all_specs else [])
    if not names:
        raise click.UsageError("name a spec (or a spec file), or pass --all")
    return names


@contextmanager
def _writes_to(option: str) -> Iterator[None]:
    """Writing where an option points: a folder that is missing or refuses writes ends the command with one line
    naming the path (as `lamixer compile`'s own OutputError does), not a traceback."""
    try:
        yield
    except OSError as e:
        where = e.filename or option
        raise click.ClickException(f"cannot write {where}: {e.strerror or e}") from None


@contextmanager
def _needs_matplotlib(what: str) -> Iterator[None]:
    try:
        yield
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        raise click.ClickException(f"{what} needs matplotlib: pip install 'lamixer[plot]'") from None


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="lamixer")
def main() -> None:
    """lamixer: compile linear-attention token mixers from declarative specs."""


@main.command("list")
def list_cmd() -> None:
    """The shipped specs and how each is classified."""
    from ..api import load, shipped_specs
    from . import explain as explain_mod

    table = _table("shipped specs", ("name", "inputs", "states", "rule", "decay", "composition", "extras"))
    for name in shipped_specs():
        table.add_row(*explain_mod.summary(load(name).compiled).values())
    _console().print(table)


@main.command()
@click.argument("spec")
@click.option("--graph", "graph_file", type=click.Path(dir_okay=False), help="Draw the IR to FILE (.png, .svg, .pdf or .json).")
@click.option("--json", "as_json", is_flag=True, help="Print the kernel plan as JSON instead of the report.")
def explain(spec: str, graph_file: str | None, as_json: bool) -> None:
    """Show SPEC's classified IR and its kernel plan."""
    from . import explain as explain_mod

    if graph_file and not graph_file.endswith((".png", ".svg", ".pdf", ".json")):
        raise click.BadParameter("use a .png, .svg, .pdf or .json file", param_hint=["--graph"])
    m = _load(spec)
    if graph_file:  # drawn first: a path it cannot write fails before the report is printed
        with _writes_to("--graph"), _needs_matplotlib("drawing a .png, .svg or .pdf (or use .json)"):
            explain_mod.draw(m.compiled, graph_file)
    if as_json:
        import json

        click.echo(json.dumps(explain_mod.plan_json(m.compiled), indent=1))
    else:
        for line in explain_mod.report(m.compiled):
            click.echo(line)
    if graph_file:
        click.echo(f"\ngraph written to {graph_file}", err=as_json)


class Case(NamedTuple):
    label: str
    T: int | None  # None: the packed sequences' total
    gate: str
    initial_state: bool
    cu_seqlens: list[int] | None


CASES = [
    Case("T=1", 1, "normal", True, None),
    Case("T=37 strong gates", 37, "strong", True, None),
    Case("T=130 weak gates", 130, "weak", True, None),
    Case("T=100 no state", 100, "normal", False, None),
    Case("varlen 5+32+23", None, "normal", True, [0, 5, 37, 60]),
]
INFERENCE_CASES = [  # without gradients, where the triton backend runs the recurrent kernel
    Case("inference T=1", 1, "normal", True, None),
    Case("inference T=37 strong gates", 37, "strong", True, None),
    Case("inference varlen 5+32+23", None, "weak", False, [0, 5, 37, 60]),
]
# --quick: packed sequences of odd lengths over several chunks with initial states, and a recurrent-kernel pass
QUICK_CASES = [CASES[-1]]
QUICK_INFERENCE_CASES = [INFERENCE_CASES[1]]


class Row(NamedTuple):
    case: str
    cells: tuple[str, str, str, str]  # output, final states, gradients, worst gradient
    verdict: str  # "ok", "failed" or "skipped"
    why: str = ""  # a skip's reason
    count: int = 1  # the checks the row stands for

    def styled_verdict(self):
        from rich.text import Text  # plain text, not markup: a reason may hold brackets

        if self.verdict == "skipped":
            return Text(f"skipped: {self.why}", style="yellow")
        return Text("ok", style="green") if self.verdict == "ok" else Text("MISMATCH", style="red")


NOTHING = ("-", "-", "-", "-")


@main.command()
@click.argument("specs", nargs=-1)
@click.option("--all", "all_specs", is_flag=True, help="Check every shipped spec.")
@click.option("--backend", "backends", type=click.Choice(["torch", "triton"]), multiple=True,
              help="A backend to check against the interpreter; repeat for both (default: torch, and triton where it runs: "
                   "on a GPU or under TRITON_INTERPRET=1, for the specs it has kernels for).")  # fmt: skip
@click.option("--seed", default=0, show_default=True, help="Seed of the random inputs and cotangents.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Where the random inputs live (default: cuda when visible and not under TRITON_INTERPRET, else cpu).")  # fmt: skip
@click.option("--quick", is_flag=True, help="One case with gradients (packed sequences) per spec and backend, and one without on triton, instead of 5 and 3.")
def check(specs: tuple[str, ...], all_specs: bool, backends: tuple[str, ...], seed: int, device: str | None, quick: bool) -> None:
    """Run backends against the interpreter on random float64 inputs: outputs, final states, all gradients.

    Exits with status 1 when any check failed or was skipped."""
    from rich.progress import Progress

    from ..backends import triton as triton_backend

    device = _device(device)
    mixers = [_load(n) for n in _spec_names(specs, all_specs)]
    # by default triton checks the specs it has kernels for, as backend="auto" would run them; asked for, it checks all
    chosen = tuple(dict.fromkeys(backends))  # each once
    backends = chosen or (("torch", "triton") if _triton_runs_here() else ("torch",))
    runs = [(m, b) for m in mixers for b in backends if chosen or b != "triton" or not triton_backend.unsupported(m.compiled)]
    left_out = [m.name for m in mixers if (m, "triton") not in runs and "triton" in backends]
    cases, inference = (QUICK_CASES, QUICK_INFERENCE_CASES) if quick else (CASES, INFERENCE_CASES)
    table = _table(f"relative RMS error against the interpreter (float64; fail above {CHECK_TOLERANCE:g})",
                   ("spec", "backend", "case", "output", "final states", "gradients", "worst grad", "verdict"), whole_first=False)  # fmt: skip
    tally: Counter[str] = Counter()
    console = _console()
    with Progress(console=console, transient=True) as progress:
        total = sum(len(cases) + (b == "triton") * len(inference) for _, b in runs)
        task = progress.add_task("checking", total=total)

        def note(text: str) -> None:
            progress.update(task, description=text)

        for m, backend in runs:
            for row in _spec_rows(m, backend, cases, inference if backend == "triton" else [], seed, device, note):
                table.add_row(m.name, backend, row.case, *row.cells, row.styled_verdict())
                tally[row.verdict] += row.count
                progress.advance(task, row.count)
    console.print(table)
    if left_out:
        click.echo(f"triton: no kernels yet for {', '.join(left_out)} (backend=\"auto\" runs them on torch; --backend triton checks them)")
    click.echo(f"{_checks(sum(tally.values()))}: {tally['ok']} ok, {tally['failed']} failed, {tally['skipped']} skipped")
    if tally["failed"]:
        raise click.ClickException(f"{_checks(tally['failed'])} failed: the backend disagrees with the interpreter")
    if tally["skipped"]:
        raise click.ClickException(f"{_checks(tally['skipped'])} skipped (the table says why): not everything was checked")


def _checks(n: int) -> str:
    return f"{n} check" + ("s" if n != 1 else "")


def _device(choice: str | None) -> str:
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter("torch sees no CUDA device here", param_hint=["--device"])
    if choice is not None:
        return choice
    return "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def _triton_runs_here() -> bool:
    import torch

    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def _spec_rows(m: Mixer, backend: str, cases: list[Case], inference: list[Case], seed: int, device: str, note: Callable[[str], None]) -> Iterator[Row]:
    """m on backend, case by case: the inference cases first (given on triton only: the recurrent kernel), then the
    training cases, which on triton need chunk kernels that cover the spec."""
    from ..backends import triton as triton_backend

    for case in inference:
        note(f"{m.name} / {backend} / {case.label}")
        yield _row(_inference_cells, m, backend, case, seed, device)
    missing = triton_backend.unsupported(m.compiled) if backend == "triton" else []
    if missing:
        yield Row("-", NOTHING, "skipped", f"chunk kernels not available: {'; '.join(missing)}", len(cases))
        return
    for case in cases:
        note(f"{m.name} / {backend} / {case.label}")
        yield _row(_training_cells, m, backend, case, seed, device)


def _row(measure, m: Mixer, backend: str, case: Case, seed: int, device: str) -> Row:
    """One case's row: measure gives the cells and the worst error; a backend that cannot run the call (a
    LamixerError) skips it."""
    from .check import random_call

    tensors, states = random_call(m, T=case.T or 1, gate=case.gate, seed=seed, initial_state=case.initial_state, cu_seqlens=case.cu_seqlens, device=device)
    try:
        cells, worst = measure(m, backend, tensors, states, case, seed)
    except LamixerError as e:
        return Row(case.label, NOTHING, "skipped", str(e))
    return Row(case.label, cells, "ok" if worst < CHECK_TOLERANCE else "failed")


def _training_cells(m: Mixer, backend: str, tensors, states, case: Case, seed: int):
    from .check import compare

    c = compare(m, backend, tensors, states, cu_seqlens=case.cu_seqlens, seed=seed)
    grads = {k: v for k, v in c.errors.items() if k.startswith("d")}
    worst_grad = max(grads, key=grads.get) if grads else "-"
    return (f"{c.errors['o']:.1e}", f"{_states_error(c.errors):.1e}", f"{max(grads.values(), default=0.0):.1e}", worst_grad), c.worst


def _inference_cells(m: Mixer, backend: str, tensors, states, case: Case, seed: int):
    from .check import compare_inference

    c = compare_inference(m, backend, tensors, states, cu_seqlens=case.cu_seqlens)
    return (f"{c.errors['o']:.1e}", f"{_states_error(c.errors):.1e}", "-", "-"), c.worst


def _states_error(errors: dict[str, float]) -> float:
    return max((v for k, v in errors.items() if k.startswith("state")), default=0.0)


@main.command(context_settings=RENAMED)
@click.argument("spec")
@click.option("-b", "--batch", type=POSITIVE, default=4, show_default=True, help="Batch size of the timed call.")
@click.option("-t", "--length", type=POSITIVE, default=8192, show_default=True, help="Sequence length of the timed call.")
@click.option("--heads", type=POSITIVE, default=16, show_default=True, help="Heads of the timed call.")
@click.option("--size", type=POSITIVE, default=128, show_default=True, help="Every feature dim (K, V, ...).")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True, help="The inputs' dtype.")
@click.option("--limit", type=POSITIVE, default=None, help="Try at most this many candidates.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Start no candidate after this many seconds (the fastest so far is already stored).")  # fmt: skip
@click.option("--interpret", is_flag=True, help="Run under Triton's CPU interpreter (checks the machinery; its times mean nothing).")
def autotune(spec: str, batch: int, length: int, heads: int, size: int, dtype: str, limit: int | None, budget: float | None, interpret: bool) -> None:
    """Search kernel configurations for SPEC (a shipped name or a .lam file) on this GPU; each is checked against the
    torch backend, then timed. The fastest is stored for this GPU, the kernels' source and the shape: later calls of
    any spec whose kernels render the same source launch with it."""
    import torch

    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        raise click.ClickException("autotune times kernels on a GPU and none is visible (use --interpret to exercise it on the CPU)")
    from rich.progress import Progress

    from ..tuning import config_cache as tuning_cache
    from ..tuning import search

    m = _load(spec)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    device = "cpu" if interpret else "cuda"
    title = f"{m.name}: B={batch} T={length} H={heads} dims={size} {dtype} on {tuning_cache.device_name(torch.device(device))}"
    table = _table(title, ("config", "rel. error", "fwd+bwd ms", "note"))
    console = _console()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("autotuning", total=min(limit or 10**9, len(search.search_space(m, size)[1])))

        def on_trial(t):
            progress.advance(task)
            row = (search.describe(t.config), "-" if t.error is None else f"{t.error:.1e}", "-" if t.ms is None else f"{t.ms:.3f}", t.note)
            table.add_row(*row)
            progress.console.print("  ".join(row), highlight=False)  # as it goes: the fastest so far is already stored

        try:
            trials, keys = search.tune(m, batch, length, heads, size, torch_dtype, device, limit, on_trial, budget)
        except ValueError as e:
            raise click.ClickException(f"{m.name} has no Triton kernels to tune: {e}") from None
        except LamixerError as e:
            raise click.ClickException(str(e)) from None
    console.print(table)
    if not keys:
        raise click.ClickException("no candidate was both correct and runnable")
    best = min((t for t in trials if t.ms is not None), key=lambda t: t.ms)
    click.echo(f"best: {search.describe(best.config)} ({best.ms:.3f} ms); saved to {tuning_cache.cache_file()}")


@main.command(context_settings=RENAMED)
@click.argument("specs", nargs=-1, required=True)
@click.option("--vs", type=CommaChoice(["fla", "sdpa"]), default="fla,sdpa", show_default=True, help="Competitors, comma-separated: fla (when importable), sdpa.")
@click.option("--peer", "peer_fn", metavar="MODULE:FUNCTION",
              help="Your own kernel to time beside each spec: MODULE:FUNCTION (importable) or PATH/TO/FILE.py:FUNCTION, called on "
                   "the spec's inputs as --peer-args says; checked against lamixer first (output and every gradient), not timed if "
                   "it disagrees.")  # fmt: skip
@click.option("--peer-args", "peer_args", metavar="MAPPING",
              help="How the spec's inputs map onto --peer's arguments, as lamixer/tools/competitors.json describes FLA's: a JSON "
                   'object (or a .json file) like {"args": ["q", "k", "v", "g:float32"], "kwargs": {"normalize": false}}, or a list '
                   "like q,k,v,gk=g,normalize=false (default: every input, positional, in the spec's order).")  # fmt: skip
@click.option("--peer-layout", type=click.Choice(["bthd", "bhtd"]), default=None,
              help="The layout --peer takes its per-token inputs and returns its output in: bthd, lamixer's [B, T, H, D] (the "
                   "default), or bhtd, head first.")  # fmt: skip
@click.option("--peer-tolerance", type=click.FloatRange(min=0, min_open=True), default=5e-2, show_default=True,
              help="The largest relative error against lamixer (output or a gradient, bf16) at which a peer (--peer, or FLA's) "
                   "still counts as computing what the spec does, and is timed.")  # fmt: skip
@click.option("--lengths", type=PositiveInts(), default="2048,4096,8192,16384", show_default=True, help="Sequence lengths, comma-separated (B*T = 32768).")
@click.option("--decode/--no-decode", default=True, show_default=True, help="Also time a one-token decode step at B = 1, 64, 256.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), help="Save a plot of time against T.")
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=click.Path(file_okay=False), help="Folder for the results' JSON.")
def bench(specs: tuple[str, ...], vs: tuple[str, ...], peer_fn: str | None, peer_args: str | None, peer_layout: str | None, peer_tolerance: float,
          lengths: tuple[int, ...], decode: bool, plot_file: str | None, out_dir: str) -> None:  # fmt: skip
    """Time SPECS' Triton kernels against FLA, SDPA and your own kernel on this GPU (forward, forward+backward, memory,
    decode). A spec is a shipped name or a .lam file."""
    import torch

    from ..backends import triton as triton_backend
    from . import bench as bench_mod

    mixers = [_load(s) for s in specs]
    peer = _peer(mixers, peer_fn, peer_args, peer_layout)  # usage errors first, then what this machine lacks
    if not torch.cuda.is_available():
        raise click.ClickException("bench times kernels on a GPU and none is visible")
    for m in mixers:
        missing = triton_backend.unsupported(m.compiled)
        if missing:
            raise click.ClickException(f"{m.name} has no Triton kernels yet: {'; '.join(missing)}")
    with _writes_to("--out"):
        os.makedirs(out_dir, exist_ok=True)
    for line in bench_mod.without_fla(mixers) if "fla" in vs else ():
        click.echo(f"note: {line}", err=True)
    path = os.path.join(out_dir, f"bench_{'_'.join(m.name for m in mixers)}.json")
    console = _console()
    res = bench_mod.run(mixers, list(lengths), set(vs), decode, log=lambda row: console.print(row), save=lambda res: _save_json(res, path),
                        peer=peer, tolerance=peer_tolerance)  # fmt: skip
    console.print(_bench_table(res))
    if plot_file:
        with _writes_to("--plot"), _needs_matplotlib("--plot"):
            bench_mod.plot(res, plot_file)
    click.echo(f"results in {path}" + (f", plot in {plot_file}" if plot_file else ""))


PEER_OPTIONS = {"peer": "--peer", "peer_args": "--peer-args"}  # the option an ArgumentError of tools/peers.py is about


def _peer(mixers: list[Mixer], target: str | None, mapping: str | None, layout: str | None) -> dict | None:
    """The user's peer as an entry of lamixer/tools/peers.py's format, its function imported and its mapping checked
    against every spec's inputs; a usage error naming the option at fault."""
    from . import peers

    if target is None:
        if mapping is not None or layout is not None:
            raise click.UsageError("--peer-args and --peer-layout describe a --peer: name one")
        return None
    try:
        peers.resolve(target)
        entries = [peers.mapping(mapping, m.inputs) for m in mixers]
    except LamixerError as e:
        raise click.BadParameter(str(e).partition(": ")[2], param_hint=[PEER_OPTIONS.get(getattr(e, "argument", ""), "--peer")]) from None
    entry = {"fn": target, **entries[0]}
    if layout is not None:
        if entry.get("layout", layout) != layout:
            raise click.BadParameter(f"the mapping says layout {entry['layout']!r}", param_hint=["--peer-layout"])
        entry["layout"] = layout
    return entry


def _bench_table(res: dict):
    """The run's rows: times, memory, ratios to each peer, and a peer's agreement with lamixer."""
    peer = res.get("peer")
    columns = ["op", "T", "fwd", "fwd+bwd", "peak GiB", "vs FLA fwd / fwd+bwd"]
    columns += ["vs peer fwd / fwd+bwd / memory", "peer vs lamixer (worst)"] if peer else []
    table = _table(f"{res['device']}: B*T = 32768, H = 16, D = 128, bf16 (median ms)", (*columns, "fwd vs floor"))
    for r in res["rows"]:
        if "T" not in r:
            continue
        ours = r["op"].startswith("lamixer")
        cells = [r["op"], str(r["T"]), str(r.get("fwd_ms", r.get("error", "-"))), str(r.get("fwdbwd_ms", "-")), str(r.get("peak_GiB", "-")),
                 f"{r.get('fwd_vs_fla', '-')} / {r.get('fwdbwd_vs_fla', '-')}" if ours else ""]  # fmt: skip
        if peer:
            cells.append(f"{r.get('fwd_vs_peer', '-')} / {r.get('fwdbwd_vs_peer', '-')} / {r.get('work_vs_peer', '-')}" if ours else "")
            errors = r.get("vs_lamixer")
            cells.append(f"{max(errors.values()):.1e} ({max(errors, key=errors.get)})" if errors else "")
        table.add_row(*cells, str(r.get("fwd_vs_floor", "")))
    return table


def _save_json(res: dict, path: str) -> None:
    """After every row, atomically: a run cut short keeps what it measured."""
    import json

    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
    os.replace(path + ".tmp", path)


@main.command("compile")
@click.argument("specs", nargs=-1)
@click.option("--all", "all_specs", is_flag=True, help="Compile every shipped spec.")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to write into.")
@click.option("--force", is_flag=True, help="Overwrite what is in the way, even another package.")
def compile_cmd(specs: tuple[str, ...], all_specs: bool, out_dir: str, force: bool) -> None:
    """Write each of SPECS as a Python package, OUTPUT/<name>/, that imports only torch and triton.

    One spec gives a standalone package (its own runtime/ and kernels/); several share one runtime/ and
    kernels/ at OUTPUT level, so OUTPUT becomes a package too (generated/ is --all)."""
    from ..emit.write import write

    compiled = [_load(n).compiled for n in _spec_names(specs, all_specs)]
    with _writes_to("-o/--output"):  # write() names most of these itself (an OutputError); an OSError it let through too
        try:
            paths = write(compiled, out_dir, force=force)
        except LamixerError as e:  # a folder it cannot write, or an entry in the way that it did not write
            raise click.ClickException(str(e)) from None
    for path in paths:
        click.echo(f"wrote {path}")


@main.command()
@click.argument("name")
@click.option("--from", "base", default="linear_attn", show_default=True, help="The shipped spec or spec file to start from.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Where to write (default NAME.lam).")
def new(name: str, base: str, output: str | None) -> None:
    """Start a new spec NAME from an existing one."""
    from ..api import SPEC_SUFFIX, shipped_source, shipped_specs

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise click.BadParameter("a spec name is a letter or underscore followed by letters, digits and underscores", param_hint="NAME")
    start = _load(base)  # the starting point must itself be valid (and text: load says where it is not)
    lines = (shipped_source(base) if base in shipped_specs() else Path(base).read_text()).splitlines()
    head = next((i for i, line in enumerate(lines) if re.match(r"\s*mixer\s", line)), None)  # any blank after the keyword, a tab too
    if head is None:
        raise click.BadParameter(f"{base} has no `mixer NAME` line to rename", param_hint=["--from"])
    lines[head] = f'mixer {name} "{name}: a variant of {start.name}"'
    out = Path(output or f"{name}{SPEC_SUFFIX}")
    if out.exists():
        raise click.ClickException(f"{out} exists; not overwriting it")
    with _writes_to("-o/--output"):
        out.write_text("\n".join(lines) + "\n")
    _load(str(out))
    click.echo(f"wrote {out}: edit it, then `lamixer check {out}` and `lamixer explain {out}`")


if __name__ == "__main__":
    main()

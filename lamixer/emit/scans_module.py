"""A package's Triton wiring: its rendered kernels, their host code, and scans.py, the one module that calls them.

The kernels are rendered exactly as lamixer's triton backend renders them, from the kernel plan's
templates and arguments, float32 accumulation only (a package runs float64 calls on its torch
fallback). Their host code is lamixer/kernels/*.py copied whole, every module but loader.py, whose
package form (written here) imports the modules rendered beside it instead of rendering templates.
"""
from __future__ import annotations

from importlib import resources

from ..kernels import additive, delta
from ..kernels.recurrent import MAX_T
from ..passes.kernel_plan import Kernels
from ..passes.pipeline import Compiled
from . import source as src

ACC = "float32"
OWN_LOADER = "loader.py"  # the one host module a package writes itself
# the chunk templates' host entry points and default configurations, as a package's scans.py names them
CHUNK_ENTRIES = {additive.FAMILY: ("additive.scan", "config.default_config"), delta.FAMILY: ("delta.scan", "config.delta_default_config")}


def unsupported(compiled: Compiled) -> list[str]:
    """Why the chunk templates cannot run a spec's scans (empty when they can): the kernel plan's reasons."""
    return [r for g in compiled.plan.groups for r in g.missing]


def modules(compiled: Compiled) -> dict[str, Kernels]:
    """The rendered kernel modules a spec runs on, by module name: its chunk kernels (when every group has them), then
    its recurrent ones (when every group has one)."""
    groups = compiled.plan.groups
    train = {} if unsupported(compiled) else {g.train.module: g.train for g in groups}
    decode = {} if not groups or any(g.decode is None for g in groups) else {g.decode.module: g.decode for g in groups}
    return {**dict(sorted(train.items())), **dict(sorted(decode.items()))}


def kernel_module(kernels: Kernels) -> str:
    """The source of one rendered kernel module."""
    from ..render.templates import render

    return render(kernels.template, **kernels.render_args(ACC))


def host_files() -> dict[str, str]:
    """<kernels>/*.py besides the rendered modules: lamixer/kernels' host modules whole, and the package's loader."""
    root = resources.files("lamixer").joinpath("kernels")
    out = {f.name: f.read_text() for f in sorted(root.iterdir(), key=lambda f: f.name) if f.name.endswith(".py") and f.name != OWN_LOADER}
    out["__init__.py"] = '"""Triton kernels rendered by lamixer (one module per configuration) and their host code."""\n'
    out[OWN_LOADER] = f'''"""Where the host code beside this file finds its rendered kernels: the modules `lamixer compile` rendered here,
one per template and configuration, {ACC} accumulation only."""
import importlib


def kernels(family: str, acc: str, **config):
    """The rendered kernel module of one configuration: <family>_<config values>.py beside this file."""
    if acc != {src.text(ACC)}:
        raise ValueError(f"these kernels accumulate in {ACC}, not {{acc}}")
    name = "_".join([family, *(k if v is True else v for k, v in config.items())])
    module = importlib.import_module(f".{{name}}", __package__)
    module.NAME = f"{{name}}_{{acc}}"
    return module
'''
    return out


def _groups_literal(compiled: Compiled) -> list[str]:
    """GROUPS: per scan group of the plan, what choose() needs to launch its chunk kernels."""
    lines = ["# per scan group of the kernel plan, in order: (chunk kernels' host entry, their default configuration, decay kind,",
             "# key dim, value widths side by side (a dim's name, or 1 for a vector state's column), whether they carry the group's normaliser)",
             "GROUPS = ("]  # fmt: skip
    for g in compiled.plan.groups:
        entry, default = CHUNK_ENTRIES[g.train.template] if g.train else ("None", "None")
        if g.rendered_decay is not None:  # told the decay its kernels were rendered for (backends/triton.py: chunk_scan)
            entry = f"functools.partial({entry}, decay={src.text(g.rendered_decay)})"
        widths = tuple(1 if d is None else d for st, d in zip(g.states, g.value_dims) if st != g.normaliser)
        lines.append(f"    ({entry}, {default}, {src.text(g.decay.kind)}, {src.text(g.key_dim)}, {widths!r}, {g.normaliser is not None}),")
    return lines + [")"]


def scans_module(compiled: Compiled, runtime: str, kernels: str) -> str:
    """<package>/scans.py. kernels: the kernel package's module path from it (".kernels" or "..kernels")."""
    names = list(modules(compiled))
    chunk = [n for n in names if not n.startswith("recurrent")]
    rec = [n for n in names if n.startswith("recurrent")]
    where = kernels.lstrip(".")
    missing = unsupported(compiled)
    trains = f"{', '.join(chunk)} for training and long sequences" if chunk else f"no chunk kernels ({'; '.join(missing)})"
    about = (f"The kernels in {where}/ are rendered from lamixer's templates for this spec's kernel plan and run as lamixer's "
             f"triton backend runs them: {trains}; {', '.join(rec)} for inference on sequences of at most {MAX_T} tokens "
             f"(decoding). Their host code is lamixer's, copied whole into {where}/.")  # fmt: skip
    m = src.Module(f"""{src.doc(compiled.name)}'s scans on the generated Triton kernels: the package's one point of contact with them.

{src.wrap(src.doc(about))}
""", runtime)  # fmt: skip
    for name in ("functools", "os", "torch"):
        m.use(name)
    entries = {CHUNK_ENTRIES[g.train.template][0].split(".")[0] for g in compiled.plan.groups if g.train}
    for name in sorted({"launch", "recurrent"} | entries | ({"config"} if entries else set())):
        m.use(kernels, name)
    m.use(runtime + ".call", "pick_backend")
    m.use(runtime + ".call", "remember")
    m.use(runtime + ".scan", "torch_scan")
    m.use(runtime + ".scan", "STATES_IN_PLACE")
    if compiled.signature.blocks:
        m.use(kernels, "block_attention")
    key_dims = list(dict.fromkeys(g.key_dim for g in compiled.plan.groups))
    checks = list(dict.fromkeys((g.states[0], d) for g in compiled.plan.groups for d in (g.key_dim, *g.value_dims) if d is not None))
    m.write(
        f"CHUNK_MISSING = ({''.join(src.text(r) + ', ' for r in missing).rstrip(' ')})  # why the chunk kernels cannot run this spec"
        if missing else "CHUNK_MISSING = ()  # the chunk kernels run every scan of this spec",
        f"DECODES = {bool(rec)}  # whether every scan group has a recurrent kernel",
        *_groups_literal(compiled),
        "",
        "",
        "def serves(call) -> bool:",
        '    """Whether the recurrent kernel runs this call\'s scans: no gradient is asked for, no sequence is longer than',
        '    recurrent.MAX_T and every key dim fits a program\'s registers (float32 calls and narrower)."""',
        "    if not DECODES or call.longest > recurrent.MAX_T or call.compute_dtype == torch.float64:",
        "        return False",
        "    if torch.is_grad_enabled() and (any(t.requires_grad for t in call.inputs.values())",
        "                                    or any(s.requires_grad for s in call.initial_state.values())):  # fmt: skip",
        "        return False",
        f"    return {' and '.join(f'call.sizes[{src.text(d)}] <= launch.MAX_HEAD_DIM' for d in key_dims) or 'True'}",
        "",
        "",
        "def unsupported(call) -> list[str]:",
        '    """Why the chunk kernels cannot run this call (empty when they can)."""',
        "    reasons = list(CHUNK_MISSING)",
        "    if call.compute_dtype == torch.float64:",
        '        reasons.append("the kernels here accumulate in float32; float64 calls run on the torch fallback")',
        f"    for state, dim in [{', '.join(f'({src.text(s)}, {src.text(d)})' for s, d in checks)}]:",
        "        if call.sizes[dim] > launch.MAX_HEAD_DIM:",
        '            reasons.append(f"state {state}: {dim} = {call.sizes[dim]} is above the kernels\' {launch.MAX_HEAD_DIM}")',
        "    return reasons",
        "",
        "",
        "def choose(call, backend):",
        '    """Per scan group, (scan function for scan_group, whether it carries the group\'s normaliser): the recurrent kernel',
        "    for inference on short sequences, else the chunk kernels with their default configuration, in the inputs' dtype",
        '    when it is bf16 or fp16, else in float32; torch_scan when backend "auto" finds they cannot run the call (or no',
        '    GPU); an ArgumentError when backend "triton" insists. Worked out once per call signature."""',
        "    in_place = STATES_IN_PLACE.get()  # a graphed decoder's states, updated in place by the recurrent kernel",
        '    key = ("scan", backend, torch.is_grad_enabled(), call.longest <= recurrent.MAX_T, os.environ.get("TRITON_INTERPRET") == "1", in_place)',
        "    found = None if call.memo is None else call.memo.get(key)",
        "    if found is None:",
        "        found = _choose(call, backend, in_place)",
        "        if call.memo is not None:",
        "            remember(call.memo, key, found)",
        "    return found",
        "",
        "",
        "def _choose(call, backend, in_place):",
        "    decoding = serves(call)",
        "    missing = ([] if decoding else unsupported(call)) + (launch.launch_problems(call.device) if backend == \"triton\" else [])",
        f"    if pick_backend({src.text(compiled.name)}, backend, call, missing) == \"torch\":",
        "        return [(torch_scan, False)] * len(GROUPS)",
        "    dtype = call.out_dtype if call.out_dtype in (torch.bfloat16, torch.float16) else call.compute_dtype",
        '    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1" and not launch.bf16_interpreted():',
        "        dtype = torch.float32  # Triton 3.6's CPU interpreter multiplies bf16 dot operands as raw bits (lamixer.tools.emulate)",
        "    if decoding:",
        "        return [(functools.partial(recurrent.scan, dtype=dtype, in_place=in_place), False)] * len(GROUPS)",
        "    out = []",
        "    for run, default, decay, key_dim, widths, carries in GROUPS:",
        "        V = sum(call.sizes[w] if isinstance(w, str) else w for w in widths)",
        "        out.append((functools.partial(run, dtype=dtype, config=default(decay, call.sizes[key_dim], V)), carries))",
        "    return out",
        "",
        "",
        "def fused(scans, call) -> bool:",
        '    """Whether runtime/fuse.py compiles this call\'s per-token work on a GPU: around the chunk kernels choose() picked,',
        '    or around the recurrent kernel in a one-token decoding step (whose work unfused is one small kernel per operation)."""',
        "    kernels = [run.func for run, _ in scans if isinstance(run, functools.partial)]",
        "    return any(f is not recurrent.scan for f in kernels) or (call.longest == 1 and recurrent.scan in kernels)",
        *(["",
           "",
           "def attention(scans):",
           '    """Block attention\'s kernel (kernels/block_attention.py) when choose() picked the Triton kernels, else None (torch\'s',
           '    SDPA)."""',
           "    return block_attention.block_attention if any(run is not torch_scan for run, _ in scans) else None"]
          if compiled.signature.blocks else []),
    )
    return m.text()

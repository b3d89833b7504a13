"""Carry the shipped tuned entries (lamixer/tuning/configs/*.json) over a change of the kernel sources.

    python bench/rekey_tuned.py OLD_COMMIT [--write]

An entry keys on the hash of the source it was tuned on, so any template edit leaves it unfound
(tests/test_autotune.py::test_shipped_configurations_key_on_current_kernels fails). This renders every shipped
spec's training kernels at OLD_COMMIT (a temporary git worktree) and here, pairs the hashes by (spec, scan group,
form), and prints (with --write: applies) the entries' new keys. The configurations themselves were timed on the old
code: re-keying keeps a good starting point, it does not re-tune; an entry whose kernels this commit no longer
renders is dropped and named.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "lamixer" / "tuning" / "configs"

# run in a child process at either commit: {"spec/group/form": source hash}
HASHES = """
import json, lamixer
from lamixer.tuning import choose
out = {}
for name in lamixer.shipped_specs():
    for g, group in enumerate(lamixer.load(name).compiled.plan.groups):
        for f, h in enumerate(choose.entry_hashes(group)):
            out[f"{name}/{g}/{f}"] = h
print(json.dumps(out))
"""


def hashes_at(src: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run([sys.executable, "-c", HASHES], env=env, cwd=src, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", help="the commit the shipped entries were keyed at")
    ap.add_argument("--write", action="store_true", help="rewrite the configuration files (default: print only)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["git", "worktree", "add", "--detach", tmp, args.old], cwd=ROOT, check=True, capture_output=True)
        try:
            old = hashes_at(Path(tmp))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tmp], cwd=ROOT, check=True)
    new = hashes_at(ROOT)
    moves = {old[k]: new[k] for k in old.keys() & new.keys()}
    for f in sorted(CONFIGS.glob("*.json")):
        data = json.loads(f.read_text())
        entries = {}
        for key, value in data["entries"].items():
            device, stack, source, dtype, bucket = key.split("|")
            if source not in moves:
                print(f"{f.name}: {key}: no kernel of {args.old} with this source is rendered now; dropped")
                continue
            entries["|".join((device, stack, moves[source], dtype, bucket))] = value
            print(f"{f.name}: {source} -> {moves[source]}")
        if args.write:
            data["entries"] = entries
            f.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()

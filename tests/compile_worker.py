"""Compiling, without running, every Triton kernel given specs launch, for an H200 (sm_90), on a machine with no GPU
(bench/sm90.py: Triton's compiler and ptxas behind a driver that names the target): the worker processes and the pool
tests/test_gpu_compile.py runs them in.

    python compile_worker.py NICENESS MACHINE_CODE

reads jobs from stdin, one a line, as JSON: [DTYPE, D, SPEC] (bfloat16 or float32 inputs, head dims, a spec's path),
and answers each with one line of JSON on stdout: its rows (spec, dtype, kernel, shared memory in bytes, warps, stages,
loads left synchronous in its loops; or the error that stopped the spec) and the limit a block's shared memory has.
Whatever else the compilation prints goes to stderr.

Only the benchmark's inputs (bf16, head dims 128: MACHINE_CODE 1) are compiled to machine code, through ptxas; the
other dtypes and head dims stop at the shared-memory allocation whose limits they are compiled for (bench/sm90.py:
compile_only), at a tenth of the time (every way to machine code took 33 CPU-minutes on a 2-core machine, most of the
test suite's time). The lowered way also compiles the first spec at bf16 and head dims 128 (`check`), which the
test compares with the machine-code way's allocation.

The pool (`Compilation`) starts its workers in processes of their own, where no kernel module was imported for the
interpreter, each compiling one way, with one Triton cache per way: a kernel two specs launch alike (the same rendered
source, constants and argument types) is compiled once, by the first worker to reach it, and read from the cache by
the others. The jobs are dealt in runs of one dtype and head dim, a run to each worker, so that workers seldom compile
the same kernel at once; one that finishes its runs takes the last jobs of the longest run left of its own way.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

DTYPES = ("bfloat16", "float32")
# the benchmark's head dims and the widest the kernels take (256: the largest tiles, where the defaults change)
HEAD_DIMS = (128, 256)
MACHINE_CODE = ("bfloat16", 128)  # the one (dtype, head dims) compiled through ptxas
MAX_WORKERS = 4  # each holds torch, Triton and LLVM (about 1 GB)


def kernel_specs(examples: list[str]) -> list[str]:
    """The shipped specs, then the given ones, that run on Triton templates (each scan group's kernels named)."""
    import lamixer
    from lamixer.backends.triton import unsupported

    specs = [str(p) for p in sorted(Path(lamixer.__file__).parent.joinpath("specs").glob("*.lam"))] + examples
    return [s for s in specs if not unsupported(lamixer.load(s).compiled)]


class Compilation:
    """Every spec compiled at each of DTYPES x HEAD_DIMS by worker processes, in the background until `result()`.

    nice: the workers' niceness; a compilation begun beside other tests leaves them the CPU they use."""

    def __init__(self, specs: list[str], folder: Path, nice: int = 0):
        self.specs, self.folder = specs, folder
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["LAMIXER_CACHE"] = str(folder / "lamixer")  # the default configurations, no tuned ones
        full = [[(dtype, D, spec) for spec in specs] for dtype in DTYPES for D in HEAD_DIMS if (dtype, D) == MACHINE_CODE]
        lowered = [[(dtype, D, spec) for spec in specs] for dtype in DTYPES for D in HEAD_DIMS if (dtype, D) != MACHINE_CODE]
        self.check = (*MACHINE_CODE, specs[0])  # compiled both ways
        lowered[0].insert(0, self.check)
        # half the workers each way (at least one): the one run through ptxas takes about as long as the three others
        count = max(2, min(MAX_WORKERS, len(os.sched_getaffinity(0))))
        self._queues, self._ways = [], []
        for machine_code, runs, n in ((True, full, count // 2), (False, lowered, count - count // 2)):
            self._queues += [[job for run in runs[i * len(runs) // n : (i + 1) * len(runs) // n] for job in run] for i in range(n)]
            self._ways += [machine_code] * n
        self._lock = threading.Lock()
        self.answers: list[dict] = []
        self._workers = []
        for i, machine_code in enumerate(self._ways):
            log = open(folder / f"worker{i}.log", "w")
            # compiled here, not found in an earlier run's cache, nor in the other way's (Triton's key does not tell them apart)
            env["TRITON_CACHE_DIR"] = str(folder / ("triton" if machine_code else "triton-lowered"))
            proc = subprocess.Popen([sys.executable, __file__, str(nice), str(int(machine_code))], env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, text=True)  # fmt: skip
            thread = threading.Thread(target=self._serve, args=(i, proc), daemon=True)
            self._workers.append((proc, log, thread))
            thread.start()

    def _next(self, i: int) -> tuple | None:
        """Worker i's next job: the front of its own queue, else the back of the longest queue left of its way."""
        with self._lock:
            if self._queues[i]:
                return self._queues[i].pop(0)
            longest = max((q for q, way in zip(self._queues, self._ways) if way == self._ways[i]), key=len)
            return longest.pop() if longest else None

    def _serve(self, i: int, proc: subprocess.Popen) -> None:
        while (job := self._next(i)) is not None:
            try:
                proc.stdin.write(json.dumps(job) + "\n")
                proc.stdin.flush()
                answer = json.loads(proc.stdout.readline() or "null")
            except (OSError, ValueError):  # stopped, or the worker died
                answer = None
            if answer is None:
                dtype, D, spec = job
                log = (self.folder / f"worker{i}.log").read_text()[-3000:]
                answer = dict(rows=[dict(spec=os.path.basename(spec), dtype=dtype, error=f"worker {i} exited:\n{log}")], shared_limit=None)
            with self._lock:
                self.answers.append(dict(answer, D=job[1], machine_code=self._ways[i]))
            if answer["shared_limit"] is None:
                return
        proc.stdin.close()

    def result(self, timeout: float) -> tuple[list[dict], int]:
        """Every job's rows, their dtype given with the head dims ("bfloat16, D = 128") and whether they were compiled
        to machine code, and the shared-memory limit; waits for the workers (an AssertionError after timeout seconds)."""
        deadline = time.monotonic() + timeout
        for _, _, thread in self._workers:
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), f"the sm_90 compilation still running after {timeout} s (logs: {self.folder})"
        left = [job for queue in self._queues for job in queue]
        assert not left, f"{len(left)} jobs left when every worker had exited: {left[:3]}"
        rows = [dict(r, dtype=f"{r['dtype']}, D = {a['D']}", machine_code=a["machine_code"]) for a in self.answers for r in a["rows"]]
        limits = {a["shared_limit"] for a in self.answers} - {None}
        return rows, min(limits, default=0)

    def stop(self) -> None:
        for proc, log, thread in self._workers:
            proc.kill()
            proc.wait()
            thread.join()
            log.close()


def _work() -> None:
    os.nice(int(sys.argv[1]))
    machine_code = sys.argv[2] == "1"
    answers = os.fdopen(os.dup(1), "w")  # stdout: the answers alone
    os.dup2(2, 1)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import sm90  # before triton: it unsets TRITON_INTERPRET
    import torch

    for line in sys.stdin:
        dtype, D, spec = json.loads(line)
        rows = sm90.compile_specs([spec], (getattr(torch, dtype),), D=D, machine_code=machine_code)
        answers.write(json.dumps(dict(rows=rows, shared_limit=sm90.SHARED_LIMIT)) + "\n")
        answers.flush()


if __name__ == "__main__":
    _work()

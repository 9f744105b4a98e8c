"""The tier simulation on several TP ranks (gloo processes on one CPU), for the cross-rank tests.

Every rank runs :class:`runtime_sim.Sim` with the **same** host seed (SGLang's replicated
schedulers make the same cache decisions on every rank) and its **own** device seed, so on each
rank the simulated side-stream packs complete at different times. The demotion engine's
agreement (``demotion.agree_all``, one all-reduce MIN on the gloo group) must keep every rank's
cache identical anyway: after each step the ranks exchange a hash of :meth:`Sim.digest` and any
rank-local failure, and all stop together at the first difference (no rank is left waiting in a
collective). A storage-balanced plan moves units between the ranks with the pool's real
all-to-all (``tp_transfer`` on the gloo group) on every store and load.

:func:`run_ranks` spawns the ranks once and runs a list of runs in them (one process start-up,
which dominates on 2 cores); each run is a dict ``name, cfg (Sim kwargs, tp_size default 2),
seed, n_ops`` and optionally ``mutation`` (a ``runtime_mutations`` name, undone after the run) and
``startup`` (also record ``verify.check_server_args`` for the plan with and without
overlap scheduling). It returns ``{run name: [(rank, status, detail), ...]}`` with status ``ok``
(detail: counters), ``fail`` (the step, seed and first difference) or ``error`` (a traceback).
"""

from __future__ import annotations

import hashlib
import os
import traceback
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

from tests.support.ports import free_port


def _startup(plan) -> dict:
    from dasc_runtime.verify import check_server_args
    from dasc_runtime.verify import DascRefusal

    out = {}
    for overlap in (True, False):
        try:
            check_server_args(SimpleNamespace(disable_overlap_schedule=not overlap), plan)
            out["overlap" if overlap else "no_overlap"] = "started"
        except DascRefusal as exc:
            out["overlap" if overlap else "no_overlap"] = str(exc)
    return out


def _one_run(rank: int, world: int, tmp: Path, run: dict, vetoes: list) -> tuple:
    import torch.distributed as dist

    from tests.support import runtime_mutations
    from tests.support.runtime_sim import Sim

    cfg = dict(run["cfg"])
    tp = cfg.pop("tp_size", 2)
    seed, n_ops = run["seed"], run["n_ops"]
    undo = runtime_mutations.apply(run["mutation"]) if run.get("mutation") else (lambda: None)
    try:
        sim = Sim(tmp / f"{run['name']}-rank{rank}", seed=seed, device_seed=seed * 31 + 7 + rank, tp_rank=rank % tp,
                  tp_size=tp, check_content_every=25, **cfg)
        sim.comp.demotions.tp_cpu_group = dist.group.WORLD
        vetoes[:] = [0, 0]
        for i in range(n_ops):
            err = None
            try:
                sim.step(i)
            except AssertionError as exc:
                err = f"rank {rank}: {exc}"
            got = [None] * world
            dist.all_gather_object(got, (err, hashlib.sha1(repr(sim.digest()).encode()).hexdigest()))
            errors = [e for e, _ in got if e]
            if errors:
                return "fail", f"step {i} (seed {seed}): {errors[0]}"
            if any(d != got[0][1] for _, d in got):
                bad = [r for r, (_, d) in enumerate(got) if d != got[0][1]]
                return "fail", (f"step {i} (seed {seed}): TP ranks {bad} disagree with rank 0 on the cache "
                                f"(tiers, values, pending demotions, free slots or counters)")
        c = sim.comp.counters
        detail = {"committed": c.demotions_committed, "started": c.demotions_started, "sync": c.demotions_sync,
                  "restore_compressed": sim.stats["restore_compressed"], "restore_dense": sim.stats["restore_dense"],
                  "agreements": vetoes[0], "vetoed": vetoes[1],
                  "device_ran": sim.device.ran if sim.device is not None else 0,
                  "storage": sim.layout.storage is not None, "n_kept": sim.layout.n_kept, "width": sim.layout.width}
        if run.get("startup"):
            detail["startup"] = _startup(sim.plan)
        return "ok", detail
    finally:
        undo()


def _rank(rank: int, world: int, port: int, tmp: str, runs: list, q) -> None:
    import torch
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
        import dasc_runtime.demotion as dem

        agreed = dem.agree_all
        vetoes = [0, 0]                 # agreements run; candidates complete here but not on every rank

        def counting_agree_all(flags, group=None):
            out = agreed(flags, group)
            vetoes[0] += 1
            vetoes[1] += sum(1 for a, b in zip(flags, out) if a and not b)
            return out
        dem.agree_all = counting_agree_all
        for run in runs:
            try:
                status, detail = _one_run(rank, world, Path(tmp), run, vetoes)
            except Exception:
                status, detail = "error", traceback.format_exc()[-3000:]
            q.put((run["name"], rank, status, detail))
            dist.barrier()
        dist.destroy_process_group()
    except Exception:  # pragma: no cover - reported to the parent
        q.put(("*", rank, "error", traceback.format_exc()[-3000:]))


def run_ranks(world: int, tmp, runs: list, *, timeout: float = 600) -> dict:
    """Spawn ``world`` gloo ranks and run ``runs`` in them (see module docstring)."""
    import queue
    import time

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, str(tmp), runs, q)) for r in range(world)]
    for p in procs:
        p.start()
    want = world * len(runs)
    out: dict = {run["name"]: [] for run in runs}
    deadline = time.monotonic() + timeout
    got = 0
    try:
        while got < want and time.monotonic() < deadline:
            try:
                name, rank, status, detail = q.get(timeout=1.0)
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and q.empty():
                    break
                continue
            got += 1
            for key in (runs and [r["name"] for r in runs] if name == "*" else [name]):
                out[key].append((rank, status, detail))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for name, res in out.items():
        seen = {r for r, *_ in res}
        res += [(r, "error", f"rank {r} reported nothing for run {name} (exit code {procs[r].exitcode})")
                for r in range(world) if r not in seen]
        res.sort(key=lambda x: x[0])
    return out

"""Weight updates re-check the plan (issue 13 item 8): SGLang's own ``SchedulerWeightUpdaterManager``
update paths with dasc's hook, on a cache of SGLang's classes (``runtime_sim.Sim``).

The model runner is a stand-in holding the decay tensors under SGLang's names (all the fingerprint
reads); its "weight update" overwrites them, as the real loaders do.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.support import runtime_fixtures as F
from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]


def _model(tensors):
    """An ``nn.Module`` whose parameters are ``model.layers.{l}.linear_attn.{A_log, dt_bias}``."""
    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.layers = torch.nn.ModuleList([torch.nn.Module() for _ in range(4)])
    for name, t in tensors:
        layer = int(name.split(".")[2])
        mod = root.model.layers[layer]
        if not hasattr(mod, "linear_attn"):
            mod.linear_attn = torch.nn.Module()
        mod.linear_attn.register_parameter(name.rsplit(".", 1)[1], torch.nn.Parameter(t.clone(), requires_grad=False))
    return root


class _Worker:
    """``TpModelWorker`` stand-in: each update path writes ``self.next`` (name -> tensor) into the model.

    It answers both releases' manager: 0.5.17 calls ``tp_worker.update_weights_from_*(recv_req)``; 0.5.23
    calls the target runner's ``weight_updater`` (``weight_update_runners()``), whose
    ``end_weight_update(run_post_load=True)`` finalizes weights that arrived without a load call.
    """

    def __init__(self, model):
        self.model_runner = SimpleNamespace(model=model, load_config=SimpleNamespace(load_format="auto"),
                                            server_args=SimpleNamespace(load_format="auto"), weight_updater=self)
        self.next = {}
        self.ok = True
        self.calls = 0

    def _update(self, *args, **kwargs):
        self.calls += 1
        params = dict(self.model_runner.model.named_parameters())
        for name, t in self.next.items():
            params[name].data.copy_(t)
        return (True, "Succeeded to update model weights.") if self.ok else (False, "simulated load error")

    update_weights_from_disk = update_weights_from_distributed = _update
    update_weights_from_tensor = update_weights_from_ipc = load_weights_from_distributed = _update

    # 0.5.23's runner-level API
    def weight_update_runners(self):
        return [("target", self.model_runner)]

    def receive_weights_from_distributed(self, **_):
        return {}

    def deserialize_own_rank(self, serialized):
        return []

    def begin_weight_update(self):
        return None

    def end_weight_update(self, run_post_load: bool):
        if run_post_load:
            self._update()


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A two-tier cache holding compressed and dense checkpoints and one pending demotion, the
    scheduler's weight-update manager with dasc's hook, and the plan as installed."""
    from tests.support.runtime_sim import Sim

    from dasc_runtime.installed import INSTALLED

    served = SimpleNamespace(flush_ok=True)

    torch.set_num_threads(1)
    monkeypatch.setattr(torch.distributed, "barrier", lambda *a, **k: None)   # the tensor / IPC paths' TP barrier
    sim = Sim(tmp_path, streams=False, mamba_size=8, compressed_slots=3, watermark=0)
    INSTALLED.plan = sim.plan
    for seq in ([11, 12, 13], [21, 22], [31, 32, 33], [41, 42]):
        sim.rng.choice = lambda xs, _s=seq: _s
        sim.admit(k=1)
        sim.rng.randrange = lambda k: k - 1
        sim.finish()
    del sim.rng.choice, sim.rng.randrange
    assert sim.comp.book.counts() == {"dense": 1, "compressed": 3}
    sim.comp.evict_node(sim.comp._oldest("compressed"))              # room for one demotion
    sim.comp.demote_async(sim.comp._oldest("dense"))                 # pending until the next maintain
    assert len(sim.comp.pending) == 1
    worker = _Worker(_model(F.gdn_decay_tensors()))
    flushes = []

    def flush_cache(empty_cache=True):                              # Scheduler.flush_cache on an idle server
        flushes.append(empty_cache)
        if not served.flush_ok:                                     # requests still running: refused
            return False
        sim.cache.reset()
        sim.pool.clear()
        sim.alloc.clear()
        return True

    served.__dict__.update(sim=sim, worker=worker, manager=sim.S.weight_manager(worker, flush_cache), flushes=flushes)
    return served


def _requests(served, flush_cache: bool) -> dict:
    """A request per weight-replacing method of the installed release (``tests/support/sglang_steps.py``)."""
    return served.sim.S.update_requests(flush_cache)


def _update(served, method: str, *, flush_cache: bool):
    from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager

    from dasc_runtime.weight_updates import around_weight_update

    original = getattr(SchedulerWeightUpdaterManager, method)
    served.sim.S.before_update(served.manager, method)
    return around_weight_update(original, served.manager, _requests(served, flush_cache)[method])


def test_same_decay_values_without_flush_drop_the_compressed_tier_and_verify(served):
    sim = served.sim
    out = _update(served, "update_weights_from_disk", flush_cache=False)
    assert out.success and served.worker.calls == 1 and served.flushes == []
    assert out.message == ("Succeeded to update model weights.; dasc: the updated weights match the plan's decay "
                           "fingerprint (6 tensors); 2 compressed checkpoints of the old weights dropped")
    # the demotion was cancelled (its node stays dense, unpinned), no compressed checkpoint is left
    assert not sim.comp.pending and sim.comp.book.counts() == {"dense": 1, "compressed": 0}
    assert sim.dpool.available_size() == sim.C and sim.comp.policy.compressed_tier
    sim.check(0, content=True)
    sim.admit(k=1)                                  # the compressed tier still takes new states
    sim.finish()
    assert sim.comp.book.counts()["compressed"] >= 1


def test_changed_decay_values_turn_the_compressed_tier_off(served):
    from dasc_runtime.installed import INSTALLED, status_line

    sim = served.sim
    served.worker.next = {"model.layers.1.linear_attn.A_log": torch.log(torch.tensor([0.5, 3.0, 5.0, 0.05]))}
    out = _update(served, "update_weights_from_tensor", flush_cache=True)
    assert out.success and served.flushes == [False]                 # SGLang's own flush (torch_empty_cache)
    assert out.message.startswith("Succeeded to update model weights.; dasc: compressed tier off after the weight "
                                  "update (the cache was flushed): decay tensors of the served weights")
    assert out.message.endswith("restart with a plan compiled from the new weights to compress again")
    assert INSTALLED.compressed_off is not None and not sim.comp.policy.compressed_tier
    assert "dasc compressed tier: off (the updated weights no longer match the plan)" in status_line()
    # serving goes on with SGLang's dense cache: nothing is packed or demoted any more
    c = sim.comp.counters
    before = (c.inserts_compressed, c.demotions_sync, c.demotions_started)
    for i in range(300):
        sim.step(i)
    assert (c.inserts_compressed, c.demotions_sync, c.demotions_started) == before and sim.stats["demote"] > 0
    assert sim.comp.book.counts()["compressed"] == 0 and sim.stats["restore_dense"] > 0


def test_every_update_path_is_checked(served):
    from dasc_runtime.sglang_api import api

    methods = list(_requests(served, False))
    assert methods == list(api().WEIGHT_UPDATE_METHODS)          # every hooked path, no more, no fewer
    for method in methods:
        calls = served.worker.calls
        out = _update(served, method, flush_cache=False)
        assert served.worker.calls == calls + 1, method           # SGLang's own path replaced the weights
        assert out.success and "dasc: the updated weights match the plan's decay fingerprint" in out.message, method
    assert served.worker.calls == len(methods)


def test_an_update_whose_flush_is_refused_is_still_rechecked(served):
    """0.5.23 replaces the weights, then reports the update failed when the cache flush is refused; the
    compressed checkpoints of the old weights must go anyway (0.5.17 asserts the flush instead)."""
    served.flush_ok = False
    served.worker.next = {"model.layers.1.linear_attn.A_log": torch.log(torch.tensor([0.5, 3.0, 5.0, 0.05]))}
    try:
        out = _update(served, "update_weights_from_disk", flush_cache=True)
    except AssertionError as exc:
        assert "Cache flush failed after updating weights" in str(exc)      # 0.5.17: the update never returns
        pytest.skip("this SGLang release asserts the flush after a weight update (no reply to check)")
    assert not out.success and out.message.startswith("Weights were updated, but the cache was not flushed")
    assert "dasc: compressed tier off after the weight update (2 compressed checkpoints of the old weights " \
           "dropped" in out.message
    assert served.sim.comp.book.counts()["compressed"] == 0 and not served.sim.comp.policy.compressed_tier


def test_a_failed_update_is_left_as_sglang_reported_it(served):
    served.worker.ok = False
    out = _update(served, "update_weights_from_disk", flush_cache=False)
    assert not out.success and out.message == "simulated load error"
    assert served.sim.comp.book.counts()["compressed"] == 2 and len(served.sim.comp.pending) == 1


def test_the_plugin_hook_passes_through_without_a_plan(served, monkeypatch):
    from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager

    from dasc_runtime.plugin import around_weight_update

    monkeypatch.delenv("DASC_PLAN", raising=False)
    out = around_weight_update(SchedulerWeightUpdaterManager.update_weights_from_disk, served.manager,
                               _requests(served, False)["update_weights_from_disk"])
    assert out.message == "Succeeded to update model weights."
    assert served.sim.comp.book.counts()["compressed"] == 2

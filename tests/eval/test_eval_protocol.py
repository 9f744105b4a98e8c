"""The cached-prefix protocol's arms on real (tiny) transformers models: dense, nr, wr, Random."""

from __future__ import annotations

import copy

import pytest
import torch

from dasc_compile.eval.arms import (arm_cache, keep_grids, plan_kept_units, random_kept_units, replay_window,
                                    scratch_replay, RANDOM_SEEDS)
from dasc_compile.eval.hf_compat import conv_state, recurrent_state
from dasc_compile.schema import load_plan
from tests.support.tiny_models import compile_for

pytestmark = pytest.mark.transformers_range

PREFIX = [(7 * i + 3) % 251 for i in range(80)]
SUFFIX = [(11 * i + 5) % 251 for i in range(20)]


def _prefix_cache(em, prefix=PREFIX):
    cache = em.new_cache()
    em.forward(prefix, cache)
    return cache


@pytest.fixture(scope="module")
def gdn_plan(gdn_dir, tmp_path_factory):
    return load_plan(compile_for(gdn_dir, 16, tmp_path_factory.mktemp("p") / "gdn16.dasc"), verify_kernels=False)


@pytest.fixture(scope="module")
def kda_plan(kda_dir, tmp_path_factory):
    return load_plan(compile_for(kda_dir, 64, tmp_path_factory.mktemp("p") / "kda64.dasc"), verify_kernels=False)


@pytest.fixture(scope="module")
def mamba2_plan(mamba2_dir, tmp_path_factory):      # Nemotron-H: 6 of 8 heads kept, W_replay 32
    return load_plan(compile_for(mamba2_dir, 32, tmp_path_factory.mktemp("p") / "m32.dasc"), verify_kernels=False)


@pytest.fixture(scope="module")
def falcon_plan(falcon_dir, tmp_path_factory):      # Falcon-H1: 2 of 8 heads kept, W_replay 16
    return load_plan(compile_for(falcon_dir, 16, tmp_path_factory.mktemp("p") / "f16.dasc"), verify_kernels=False)


@pytest.fixture(scope="module")
def qwen35_plan(qwen35_dir, tmp_path_factory):
    return load_plan(compile_for(qwen35_dir, 16, tmp_path_factory.mktemp("p") / "q16.dasc"), verify_kernels=False)


#: every family, and Falcon-H1, whose cache layers hold attention KV and a Mamba2 state together
FAMILIES = ["gdn", "kda", "mamba2", "falcon"]


@pytest.mark.parametrize("which", FAMILIES + ["qwen3_5"])
def test_dense_equals_full_prompt_forward(which, request):
    em = request.getfixturevalue(f"{which.replace('qwen3_5', 'qwen35')}_model")
    if which == "qwen3_5":
        assert type(em.model).__name__ == "Qwen3_5ForCausalLM" and em.layer_ids == [0, 2]
    full = em.forward(PREFIX + SUFFIX, em.new_cache())
    cache = arm_cache(em, _prefix_cache(em), PREFIX, "dense", None)
    split = em.forward(SUFFIX, cache)
    assert torch.allclose(split, full[len(PREFIX):], atol=1e-4, rtol=1e-4), (split - full[len(PREFIX):]).abs().max()
    # the prefix changes the suffix: the check is not passing on a model that ignores its state
    assert not torch.allclose(em.forward(SUFFIX, em.new_cache()), full[len(PREFIX):], atol=1e-3)


@pytest.mark.parametrize("which", FAMILIES)
def test_nr_with_keep_all_plan_equals_dense(which, request, tmp_path):
    em, d = (request.getfixturevalue(f"{which}_model"), request.getfixturevalue(f"{which}_dir"))
    plan = load_plan(compile_for(d, 0, tmp_path / "all.dasc"), verify_kernels=False)   # H_s > 0: every unit kept
    assert plan.totals.n_kept == plan.totals.n_units
    grids = keep_grids(plan_kept_units(plan), em.num_heads, em.units_per_head)
    pc = _prefix_cache(em)
    dense = em.forward(SUFFIX, arm_cache(em, pc, PREFIX, "dense", None))
    nr = em.forward(SUFFIX, arm_cache(em, pc, PREFIX, "nr", grids))
    assert torch.equal(dense, nr)


def _unit_view(state, em):
    """[H, units_per_head, ...] view of a key-major state [1, H, d_k, d_v]."""
    s = state[0]
    return s.reshape(em.num_heads, 1, -1) if em.units_per_head == 1 else s


def _hand_scratch(em, window):
    """Scratch replay built independently: run the first n_p - W tokens, zero every linear layer's recurrent and
    conv state in place, run the window. Unlike ``arms.scratch_replay`` it calls no cache ``reset`` and leaves
    transformers' bookkeeping (token counts, previous-state flags) as the run left it, so the window runs at
    positions n_p - W .. n_p - 1 whatever release counts tokens where (5.25 counts them in the linear layers,
    and a reset zeroed that count: the replay's attention layers then saw positions from 0). A zero conv state
    read as the previous one pads the window as a fresh start does; a zero recurrent state is the zero start."""
    cache = em.new_cache()
    em.forward(PREFIX[:len(PREFIX) - window], cache)
    for lid in em.layer_ids:
        recurrent_state(cache.layers[lid]).zero_()
        conv_state(cache.layers[lid]).zero_()
    em.forward(PREFIX[len(PREFIX) - window:], cache)
    return cache


@pytest.mark.parametrize("which", FAMILIES + ["qwen35"])
def test_wr_changes_only_local_units_and_equals_hand_built_replay(which, request):
    em, plan = request.getfixturevalue(f"{which}_model"), request.getfixturevalue(f"{which}_plan")
    assert 0 < plan.totals.n_kept < plan.totals.n_units
    grids = keep_grids(plan_kept_units(plan), em.num_heads, em.units_per_head)
    window = replay_window(plan, len(PREFIX))
    assert 4 <= window < len(PREFIX)
    pc = _prefix_cache(em)
    # the replay ran at positions n_p - W .. n_p - 1: the scratch stands where the prefix does (5.25 keeps the
    # cache's length in linear layers, which a reset zeroed: the scratch then stood at W)
    assert int(scratch_replay(em, pc, PREFIX, window).get_seq_length()) == len(PREFIX)
    before = copy.deepcopy(pc)
    wr = arm_cache(em, pc, PREFIX, "wr", grids, window)
    hand = _hand_scratch(em, window)
    changed = []
    for lid, grid in zip(em.layer_ids, grids):
        got = _unit_view(recurrent_state(wr.layers[lid]), em)
        old = _unit_view(recurrent_state(before.layers[lid]), em)
        ref = _unit_view(recurrent_state(hand.layers[lid]), em)
        assert torch.equal(got[grid], old[grid])                          # global units: exactly as stored
        assert torch.allclose(got[~grid], ref[~grid], atol=1e-5, rtol=1e-4)   # local units: the scratch replay
        changed.append(not torch.allclose(got[~grid], old[~grid], atol=1e-4))
        assert torch.equal(conv_state(wr.layers[lid]), conv_state(before.layers[lid]))
    # and they did change (a Mamba2 first layer sees only the tokens: its local units forgot the tokens
    # before the window, so there they agree to ~1e-7)
    assert any(changed)
    assert em.attention_layer_ids
    for lid in em.attention_layer_ids:                                   # full-attention KV untouched
        assert torch.equal(wr.layers[lid].keys, before.layers[lid].keys)
        assert wr.layers[lid].keys.shape[-2] == len(PREFIX)
    # the prefix checkpoint itself is not modified by applying an arm
    for lid in em.layer_ids:
        assert torch.equal(recurrent_state(pc.layers[lid]), recurrent_state(before.layers[lid]))


@pytest.mark.parametrize("which", FAMILIES)
def test_nr_zeroes_exactly_the_local_units(which, request):
    em, plan = request.getfixturevalue(f"{which}_model"), request.getfixturevalue(f"{which}_plan")
    grids = keep_grids(plan_kept_units(plan), em.num_heads, em.units_per_head)
    pc = _prefix_cache(em)
    nr = arm_cache(em, pc, PREFIX, "nr", grids)
    for lid, grid in zip(em.layer_ids, grids):
        got, old = _unit_view(recurrent_state(nr.layers[lid]), em), _unit_view(recurrent_state(pc.layers[lid]), em)
        assert torch.equal(got[grid], old[grid])
        assert torch.count_nonzero(got[~grid]) == 0
        assert torch.count_nonzero(old[~grid]) > 0


def test_random_masks_are_count_matched_and_equal_compiled_random_plans(gdn_dir, kda_plan, kda_dir, tmp_path):
    plan = kda_plan
    draws = {s: random_kept_units(plan, s) for s in RANDOM_SEEDS}
    for s, kept in draws.items():
        assert [len(k) for k in kept] == [lp.n_kept for lp in plan.layers]
        assert all(len(set(k)) == len(k) and all(0 <= u < lp.n_units for u in k) for k, lp in zip(kept, plan.layers))
    assert len({tuple(map(tuple, k)) for k in draws.values()}) == len(RANDOM_SEEDS)   # five different masks
    compiled = load_plan(compile_for(kda_dir, 64, tmp_path / "r.dasc", random_seed=2027), verify_kernels=False)
    assert plan_kept_units(compiled) == draws[2027]


@pytest.mark.parametrize("which", FAMILIES)
def test_arms_batched_as_rows_equal_arms_run_alone(which, request):
    """run_prompt runs the arms as rows of one batch: each row must equal that arm run by itself
    (teacher-forced logits and free-running tokens), the wr row included. For Mamba2 on transformers
    5.12 every batched token after the prefix is one step (``EvalModel.max_chunk``)."""
    from dasc_compile.eval.hf_compat import stack_caches
    from dasc_compile.eval.protocol import run_arm, run_rows

    em, plan = request.getfixturevalue(f"{which}_model"), request.getfixturevalue(f"{which}_plan")
    grids = keep_grids(plan_kept_units(plan), em.num_heads, em.units_per_head)
    rnd = keep_grids(random_kept_units(plan, 1234), em.num_heads, em.units_per_head)
    window = replay_window(plan, len(PREFIX))
    pc = _prefix_cache(em)
    tail = [3, 1, 4, 1, 5]
    jobs = [("nr", grids, 0), ("wr", grids, window), ("nr", rnd, 0)]
    caches = [arm_cache(em, pc, PREFIX, a, g, w) for a, g, w in jobs]
    logits, gens = run_rows(em, stack_caches(caches, em.layer_ids, em.attention_layer_ids), 3, SUFFIX, tail, 5, True)
    for j, (a, g, w) in enumerate(jobs):
        alone, gen = run_arm(em, arm_cache(em, pc, PREFIX, a, g, w), SUFFIX, tail, 5, True)
        assert torch.allclose(logits[j], alone, atol=1e-4, rtol=1e-4), (logits[j] - alone).abs().max()
        assert gens[j] == gen
    assert not torch.allclose(logits[0], logits[2], atol=1e-3)              # the rows held different arms

"""``dasc eval`` on models without attention layers (every mixer recurrent): transformers' forwards ask
the cache for its length, which only an attention layer knows, so the adapter runs them with explicit
positions and masks (``hf_compat.attention_free_kwargs``, transformers >= 5.17) and refuses them, in one
line, below that. Such a model is the control in which the recurrent state alone must carry the prefix."""

from __future__ import annotations

import pytest
import torch

from dasc_compile.errors import DascInputError
from dasc_compile.eval.arms import arm_cache, keep_grids, plan_kept_units, replay_window
from dasc_compile.eval.hf_compat import MIN_TRANSFORMERS_ATTENTION_FREE, recurrent_state, transformers_version
from dasc_compile.schema import load_plan
from tests.support.tiny_models import compile_for, write_gdn, write_kda

pytestmark = pytest.mark.transformers_range

LINEAR = ("linear_attention",) * 3
PREFIX = [(7 * i + 3) % 251 for i in range(80)]
SUFFIX = [(11 * i + 5) % 251 for i in range(20)]


def _supported() -> bool:
    return transformers_version() >= MIN_TRANSFORMERS_ATTENTION_FREE


@pytest.fixture(scope="module", params=["gdn", "kda"])
def model_dir(request, tmp_path_factory):
    if request.param == "kda" and transformers_version() < (5, 17):
        pytest.skip("no kimi_linear model below transformers 5.17")
    write = write_gdn if request.param == "gdn" else write_kda
    return write(tmp_path_factory.mktemp(request.param) / "model", layer_types=LINEAR)


@pytest.fixture(scope="module")
def em(model_dir):
    if not _supported():
        pytest.skip("attention-free models need transformers >= 5.17 (the refusal is tested below)")
    from dasc_compile.eval.models import load_eval_model

    return load_eval_model(model_dir)


def test_cached_forward_equals_uncached_forward(em):
    assert em.attention_layer_ids == [] and em.layer_ids == [0, 1, 2]
    ids = torch.tensor([PREFIX + SUFFIX])
    ref = em.model(input_ids=ids, use_cache=False).logits[0].float()
    cache = em.new_cache()
    got = torch.cat([em.forward(PREFIX, cache), em.forward(SUFFIX[:1], cache), em.forward(SUFFIX[1:], cache)])
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), (got - ref).abs().max()
    # the state carries the prefix: without it the suffix reads differently
    assert not torch.allclose(em.forward(SUFFIX, em.new_cache()), ref[len(PREFIX):], atol=1e-3)


def test_arms_on_an_attention_free_model(em, model_dir, tmp_path):
    plan = load_plan(compile_for(model_dir, 16, tmp_path / "w16.dasc"), verify_kernels=False)
    assert 0 < plan.totals.n_kept < plan.totals.n_units
    grids = keep_grids(plan_kept_units(plan), em.num_heads, em.units_per_head)
    pc = em.new_cache()
    em.forward(PREFIX, pc)
    dense = em.forward(SUFFIX, arm_cache(em, pc, PREFIX, "dense", None))
    nr_cache = arm_cache(em, pc, PREFIX, "nr", grids)
    for lid, grid in zip(em.layer_ids, grids):
        state = recurrent_state(nr_cache.layers[lid])[0]
        view = state.reshape(em.num_heads, 1, -1) if em.units_per_head == 1 else state
        assert torch.count_nonzero(view[~grid]) == 0
    nr = em.forward(SUFFIX, nr_cache)
    window = replay_window(plan, len(PREFIX))
    wr = em.forward(SUFFIX, arm_cache(em, pc, PREFIX, "wr", grids, window))
    # the omitted units matter here (no attention to fall back on), and the replay brings back some of them
    assert not torch.allclose(nr, dense, atol=1e-4)
    assert (wr - dense).abs().mean() < (nr - dense).abs().mean()


def test_below_the_release_that_runs_them_it_is_one_line(model_dir):
    if _supported():
        pytest.skip("this transformers runs attention-free models (>= 5.17)")
    from dasc_compile.eval.models import load_eval_model

    with pytest.raises(DascInputError, match=r"without attention layers .*needs transformers >= 5\.17"):
        load_eval_model(model_dir)

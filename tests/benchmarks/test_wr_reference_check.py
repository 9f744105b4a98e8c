"""benchmarks/wr_reference_check.py: the CPU replay that checks a device run of dasc-wr (issue 15 (b)).

A dump built from `dasc eval`'s own wr arm (in SGLang's state layout) must agree with zero error; the
same dump with the local units left at zero (dasc-nr) or taken from the full prefix (dense) must not.
"""

import json

import pytest
import torch

from benchmarks import wr_reference_check as wrc
from benchmarks.h200 import smoke_model as sm
from dasc_compile.compiler import compile_plan
from dasc_compile.eval.arms import arm_cache
from dasc_compile.eval.hf_compat import recurrent_state
from dasc_compile.eval.models import load_eval_model
from dasc_compile.errors import DascInputError
from dasc_compile.policy import Policy

# it reads transformers' linear-attention cache (a tensor in 5.12, a dict by 5.24): run at both ends of the range
pytestmark = pytest.mark.transformers_range


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("wrc")
    cfg = json.loads(wrc.TINY_CONFIG.read_text())
    cfg.update(hidden_size=128, intermediate_size=256, moe_intermediate_size=64, shared_expert_intermediate_size=64,
               num_experts=2, num_experts_per_tok=1, vocab_size=512, head_dim=32, num_attention_heads=4,
               linear_key_head_dim=32, linear_value_head_dim=32)
    (d / "cfg.json").write_text(json.dumps(cfg))
    ckpt = sm.write_checkpoint(str(d / "cfg.json"), str(d / "m"))
    plan, _ = compile_plan(ckpt, Policy(w_max=64, load_policy="wr"), d / "plan", with_kernels=False)
    c = json.loads((ckpt / "config.json").read_text())
    c["dasc_tokenizer"] = "bytes"
    (ckpt / "config.json").write_text(json.dumps(c))
    return load_eval_model(ckpt), plan


def _dump(em, plan, ids, window, local_from):
    grids = wrc.grids_of(em, plan)
    pre = em.new_cache()
    em.forward(ids, pre)
    src = {"wr": arm_cache(em, pre, ids, "wr", grids, window=window), "nr": arm_cache(em, pre, ids, "nr", grids),
           "dense": pre}[local_from]
    hf = torch.stack([recurrent_state(src.layers[l])[0].float() for l in em.layer_ids])     # [L, H, dk, dv]
    mask = torch.stack([g.view(-1, 1, 1).expand(-1, *hf.shape[-2:]) for g in grids])       # [L, H, dk, dv]
    den = torch.stack([recurrent_state(pre.layers[l])[0].float() for l in em.layer_ids])
    after = torch.where(mask, den, hf).transpose(-1, -2)                                   # SGLang [L, H, dv, dk]
    return {"after": after.unsqueeze(1), "kept_mask": mask.transpose(-1, -2), "windows": [window], "n_p": [len(ids)],
            "rids": ["r"], "ids": [ids], "check": {}, "before_kept_equal": [True]}


def test_eval_wr_state_agrees_and_nr_or_dense_states_do_not(small):
    em, plan = small
    ids = [(7 * i + 3) % 500 for i in range(96)]
    w = min(len(ids), plan.refresh.w_replay_cap)
    pre = wrc.Prefixes(em)
    (good,) = wrc.state_rows(em, plan, pre, _dump(em, plan, ids, w, "wr"))
    assert good["local_rel"] == pytest.approx(0.0, abs=1e-6) and good["global_rel"] == pytest.approx(0.0, abs=1e-6)
    assert good["agrees"] and good["ref_wr_vs_dense_local_rel"] > 0.05
    (nr,) = wrc.state_rows(em, plan, pre, _dump(em, plan, ids, w, "nr"))
    assert nr["local_rel"] == pytest.approx(1.0, abs=1e-6) and not nr["agrees"]
    (dense,) = wrc.state_rows(em, plan, pre, _dump(em, plan, ids, w, "dense"))
    assert dense["local_rel"] > 0.5 and not dense["agrees"]          # deeper layers tell dense from the replay


def test_dump_from_another_plan_is_refused(small):
    em, plan = small
    d = _dump(em, plan, list(range(70)), 64, "wr")
    d["kept_mask"] = ~d["kept_mask"]
    with pytest.raises(DascInputError, match="global units differ"):
        wrc.state_rows(em, plan, wrc.Prefixes(em), d)


def test_logit_row_compares_on_sglang_ids():
    ref = torch.log_softmax(torch.tensor([0.0, 1.0, 2.0, 3.0]), -1)
    top = [[float(ref[3]) + 0.1, 3], [float(ref[2]) - 0.3, 2]]
    r = wrc.logit_row(top, ref)
    assert r["max_abs"] == pytest.approx(0.3, abs=1e-6) and r["mean_abs"] == pytest.approx(0.2, abs=1e-6) and r["top1_equal"]


def test_missing_dumps_are_an_error_and_nothing_is_written(tmp_path, capsys):
    res = tmp_path / "run"
    res.mkdir()
    (res / "client.json").write_text("[]")
    (res / "plans.txt").write_text("")
    (res / "reference_check.json").write_text("KEEP")
    assert wrc.main([str(res)]) == 2
    assert "no dumps-wr-w*.tar.gz" in capsys.readouterr().err
    assert (res / "reference_check.json").read_text() == "KEEP"

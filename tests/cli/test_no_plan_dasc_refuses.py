"""No plan that dasc itself would later refuse (issue 13, "done when"): every plan ``dasc compile`` writes,
over a grid of families, TP sizes, balance modes, INT8, extreme cutoffs, random masks and pool budgets,
loads through the one plan reader (``dasc inspect``'s and the runtime's) with its kernel module; a setting
it cannot serve is refused at compile time with one line instead.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch

from tests.support.clihelp import assert_one_error, dasc, write_ckpt

GDN = {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4,
       "full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
       "linear_key_head_dim": 4, "linear_value_head_dim": 4, "linear_conv_kernel_dim": 4}
KDA = {"model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "num_hidden_layers": 3,
       "linear_attn_config": {"kda_layers": [1, 3], "full_attn_layers": [2], "num_heads": 4, "head_dim": 2,
                              "short_conv_kernel_size": 4}}
K3 = json.loads(json.dumps(KDA))
K3["linear_attn_config"]["gate_lower_bound"] = -5.0


def _decays(gen, n_heads, per_head, layers, prefix, attn):
    out = {}
    for i in layers:
        a = torch.empty(n_heads, dtype=torch.float64).uniform_(-4, 3, generator=gen)
        d = torch.empty(n_heads * per_head, dtype=torch.float64).uniform_(-6, 6, generator=gen)
        out[f"{prefix}{i}.{attn}.A_log"] = (a if attn == "linear_attn" else a.reshape(1, 1, -1, 1)).float()
        out[f"{prefix}{i}.{attn}.dt_bias"] = d.float()
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    gen = torch.Generator().manual_seed(13)
    return {
        "gdn": write_ckpt(root / "gdn", GDN, _decays(gen, 4, 1, [0, 2], "model.layers.", "linear_attn")),
        "kda": write_ckpt(root / "kda", KDA, _decays(gen, 4, 2, [0, 2], "model.layers.", "self_attn")),
        "k3": write_ckpt(root / "k3", K3, _decays(gen, 4, 2, [0, 2], "model.layers.", "self_attn")),
    }


GRID = list(itertools.product(["gdn", "kda", "k3"], [1, 2, 4], ["off", "storage", "hybrid"], [False, True],
                              [0, 1, 4, 16, 10**6], [None, 7], [None, 10**9, 10**3]))
CASES = random.Random(13).sample(GRID, 60)   # a fixed sample of the 1620 combinations, printed in the test ids


@pytest.mark.parametrize("model, tp, balance, int8, wmax, seed, budget", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_every_written_plan_loads(models, tmp_path, model, tp, balance, int8, wmax, seed, budget):
    from dasc_compile.schema import load_plan

    args = ["compile", models[model], "--wmax", wmax, "--tp", tp, "--balance", balance,
            "--int8" if int8 else "--no-int8", "--out", tmp_path / "plan"]
    args += ["--random-seed", seed] if seed is not None else []
    args += ["--pool-budget", budget] if budget is not None else []
    r = dasc(*args)
    if r.code == 0:
        plan = load_plan(tmp_path / "plan")      # the reader the runtime and inspect use, kernel file included
        assert plan.policy.tp_size == tp and plan.totals.n_units > 0
        assert dasc("inspect", tmp_path / "plan", "--json").code == 0
        assert all(ln.startswith("warning: ") for ln in r.err_lines), r.err
    else:
        assert_one_error(r)                      # refused up front (e.g. TP 4 over 2 key heads, a tiny budget)
        assert not (tmp_path / "plan").exists()


def test_an_inconsistent_compiler_result_is_not_written(models, tmp_path, monkeypatch):
    # a planted compiler bug (an offset off by one) must end as an internal error before anything is written
    import dasc_compile.compiler as comp

    real = comp.build_plan

    def buggy(*a, **k):
        plan = real(*a, **k)
        layers = [plan.layers[0], plan.layers[1].model_copy(update={"offset": plan.layers[1].offset + 1})]
        return plan.model_copy(update={"layers": layers})

    monkeypatch.setattr(comp, "build_plan", buggy)
    r = dasc("compile", models["kda"], "--wmax", 4, "--out", tmp_path / "plan")
    line = assert_one_error(r, "internal error", "fails its own consistency check", "'layers[1].offset'", code=1)
    assert "nothing was written" in line and list(tmp_path.iterdir()) == []

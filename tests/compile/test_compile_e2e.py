"""End to end: small hand-made checkpoints per family -> compile -> plan figures equal hand-computed values;
determinism; CLI exit status and no half-written plan on bad input."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from dasc_compile.schema import load_plan
from dasc_compile.cli import app
from dasc_compile.compiler import compile_plan
from dasc_compile.errors import DascInputError
from dasc_compile.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
LN2 = math.log(2.0)


def write_ckpt(d: Path, config: dict, tensors: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(d / "model.safetensors"), metadata={"dasc_provenance": "hand-made test values"})
    return d


def small_gdn(d: Path) -> Path:
    # 4 layers, interval 2 -> GDN layers 0 and 2; H_k = 1, H_v = 2, d_k = d_v = 4, K = 4
    cfg = {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4,
           "full_attention_interval": 2, "linear_num_key_heads": 1, "linear_num_value_heads": 2,
           "linear_key_head_dim": 4, "linear_value_head_dim": 4, "linear_conv_kernel_dim": 4}
    f64 = torch.float64
    t = {
        # layer 0: H = [9.97, 99.66] tokens; layer 2: H = [99.66, 99.66]
        "model.layers.0.linear_attn.A_log": torch.tensor([0.0, math.log(0.1)], dtype=f64).float(),
        "model.layers.0.linear_attn.dt_bias": torch.tensor([0.3, 0.3]).float(),
        "model.layers.2.linear_attn.A_log": torch.tensor([math.log(0.1)] * 2).float(),
        "model.layers.2.linear_attn.dt_bias": torch.tensor([0.3, 0.3]).float(),
        "model.layers.1.self_attn.q_proj.weight": torch.zeros(2, 2, dtype=torch.bfloat16),
    }
    return write_ckpt(d, cfg, t)


def small_kda(d: Path) -> Path:
    # 2 layers: layer 0 KDA (1-indexed kda_layers [1]), layer 1 full attention; H = 2, d = 2
    cfg = {"model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "num_hidden_layers": 2,
           "linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2], "num_heads": 2, "head_dim": 2,
                                  "short_conv_kernel_size": 4}}
    t = {
        "model.layers.0.self_attn.A_log": torch.zeros(1, 1, 2, 1),
        # a_s = -0.3: softplus(0) -> H 9.97; softplus(4.7) -> H 1.467; softplus(-3.3) -> H 190.8
        "model.layers.0.self_attn.dt_bias": torch.tensor([0.3, 5.0, -3.0, 0.3]),
    }
    return write_ckpt(d, cfg, t)


def test_gdn_plan_matches_hand_computation(tmp_path):
    plan, path = compile_plan(small_gdn(tmp_path / "gdn"), Policy(w_max=16), tmp_path / "out")
    assert [lp.layer_id for lp in plan.layers] == [0, 2]
    assert [lp.kept_units for lp in plan.layers] == [[1], [0, 1]]
    assert [lp.offset for lp in plan.layers] == [0, 1]
    t = plan.totals
    assert (t.n_units, t.n_kept, t.r_max) == (4, 3, 2)
    assert t.c_temp_ragged == pytest.approx(4 / 3) and t.c_temp_padded == pytest.approx(1.0)
    assert t.layout_gain == pytest.approx(2 / 1.5)
    # unit = [4, 4] fp32 = 64 B; dense layer = 128 B; conv = (2*1*4 + 2*4) * 3 * 2 B = 96 B per layer
    assert (t.unit_bytes, t.bytes_temporal_dense, t.bytes_conv) == (64, 256, 192)
    assert (t.bytes_dense_checkpoint, t.bytes_compressed_checkpoint) == (448, 384)
    assert t.c_ckpt == pytest.approx(448 / 384)
    # Eq. 7: the only local unit has H = 9.97 -> next_pow2 = 16, clamp(16, 4, 16) = 16
    assert [lp.refresh_window for lp in plan.layers] == [16, 0] and plan.refresh.w_replay_cap == 16
    assert plan.policy.a_s == -0.3 and plan.model.provenance == "hand-made test values"
    assert load_plan(path) == plan


def test_kda_plan_matches_hand_computation(tmp_path):
    plan, _ = compile_plan(small_kda(tmp_path / "kda"), Policy(w_max=4), tmp_path / "out")
    (lp,) = plan.layers
    assert lp.kept_units == [0, 2, 3] and lp.n_units == 4 and lp.units_per_head == 2
    assert lp.horizon_quantiles.min == pytest.approx(-math.log(1e-3) / math.log1p(math.exp(4.7)), rel=1e-6)
    t = plan.totals
    # column = d_v fp32 = 8 B; dense layer = 2*2*2*4 = 32 B; conv = 3*2*2 channels * 3 * 2 B = 72 B
    assert (t.unit_bytes, t.bytes_temporal_dense, t.bytes_conv) == (8, 32, 72)
    assert t.c_ckpt == pytest.approx(104 / 96)
    assert lp.refresh_window == 4   # local unit H = 1.467 -> next_pow2 = 2 -> clamp to 4


def test_int8_bytes_and_random_baseline(tmp_path):
    ck = small_kda(tmp_path / "kda")
    plan, _ = compile_plan(ck, Policy(w_max=4, int8=True), tmp_path / "o1", with_kernels=False)
    assert plan.totals.unit_bytes == 2 + 4   # d_v int8 values + one fp32 scale per (layer, head, k)
    rnd, _ = compile_plan(ck, Policy(w_max=4, random_seed=1234), tmp_path / "o2", with_kernels=False)
    assert rnd.selection == "random" and rnd.layers[0].n_kept == 3


def test_same_inputs_give_byte_identical_plan(tmp_path):
    ck = small_gdn(tmp_path / "gdn")
    _, a = compile_plan(ck, Policy(w_max=16), tmp_path / "a")
    _, b = compile_plan(ck, Policy(w_max=16), tmp_path / "b")
    assert (a / "plan.json").read_bytes() == (b / "plan.json").read_bytes()
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))


def test_edited_plan_is_refused(tmp_path):
    _, path = compile_plan(small_gdn(tmp_path / "gdn"), Policy(w_max=16), tmp_path / "p")
    raw = json.loads((path / "plan.json").read_text())
    raw["layers"][0]["n_kept"] = 2
    (path / "plan.json").write_text(json.dumps(raw))
    with pytest.raises(DascInputError, match="content_hash"):
        load_plan(path)
    raw["schema_version"] = 999
    (path / "plan.json").write_text(json.dumps(raw))
    with pytest.raises(DascInputError, match="schema_version 999"):
        load_plan(path)


runner = CliRunner()


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_cli_compile_and_inspect(tmp_path):
    ck = small_gdn(tmp_path / "gdn")
    r = _cli("compile", ck, "--wmax", 16, "--out", tmp_path / "p")
    assert r.exit_code == 0, r.output
    assert "kept 3/4 units" in r.output
    r = _cli("inspect", tmp_path / "p" / "plan.json", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert isinstance(doc, dict)


@pytest.mark.parametrize("case", ["missing_model", "negative_wmax", "tp_not_dividing", "unknown_policy_key",
                                  "no_wmax"])
def test_cli_bad_input_exit_2_and_nothing_written(tmp_path, case):
    ck = small_gdn(tmp_path / "gdn")
    out = tmp_path / "plan_out"
    args = {"missing_model": ["compile", tmp_path / "nope", "--wmax", 16],
            "negative_wmax": ["compile", ck, "--wmax", -1],
            "tp_not_dividing": ["compile", ck, "--wmax", 16, "--tp", 3],
            "unknown_policy_key": ["compile", ck, "--policy", tmp_path / "p.yaml"],
            "no_wmax": ["compile", ck]}[case]
    (tmp_path / "p.yaml").write_text("w_max: 16\nbogus: 1\n")
    r = _cli(*args, "--out", out)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".plan_out")]


def test_checkout_shim_runs(tmp_path):
    ck = small_kda(tmp_path / "kda")
    r = subprocess.run([sys.executable, str(ROOT / "cli.py"), "compile", str(ck), "--wmax", "4", "--out",
                        str(tmp_path / "p"), "-q"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("plan.json")


def test_out_dir_holding_other_files_is_refused_and_kept(tmp_path):
    ck = small_gdn(tmp_path / "gdn")
    r = _cli("compile", ck, "--wmax", 16, "--out", ck)       # the model's own directory
    assert r.exit_code == 2 and "holds more than a dasc plan" in r.output
    assert (ck / "model.safetensors").exists() and (ck / "config.json").exists()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("keep me")
    r = _cli("compile", ck, "--wmax", 16, "--out", victim)
    assert r.exit_code == 2 and (victim / "notes.txt").read_text() == "keep me"
    # an earlier plan directory is replaced whole
    assert _cli("compile", ck, "--wmax", 16, "--out", tmp_path / "p").exit_code == 0
    assert _cli("compile", ck, "--wmax", 4, "--out", tmp_path / "p").exit_code == 0
    assert load_plan(tmp_path / "p").policy.w_max == 4


@pytest.mark.parametrize("args, needle", [
    (["--wmax", "abc"], "option '--wmax': 'abc' is not a whole number"),
    (["--wmax", "16", "--bogus"], "No such option: --bogus"),
    # click 8.3 words it "No such option: --tps", 8.5 "No such option '--tps'."; either way one stop, closest first
    (["--wmax", "16", "--tps", "1"], "; did you mean --tp, --eps or --out? (see 'dasc compile --help')"),
    (["--wmax", "16", "--wmaxx", "4"], "; did you mean --wmax? (see 'dasc compile --help')"),
    (["--wmax", "99999999999999999999"], "policy field 'w_max'"),
    (["--wmax", "16", "--a-s", "nan"], "--a-s nan: Input should be a finite number (policy field 'a_s')"),
])
def test_console_script_usage_errors_are_one_line(tmp_path, args, needle):
    ck = small_gdn(tmp_path / "gdn")
    r = subprocess.run([sys.executable, "-c", "from dasc_compile.cli import main; main()", "compile", str(ck),
                        *args, "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert not (tmp_path / "o").exists()


def test_inspect_refuses_non_plan_and_non_png(tmp_path):
    ck = small_gdn(tmp_path / "gdn")
    r = _cli("inspect", ck / "config.json")
    assert r.exit_code == 2 and "not a dasc plan" in r.output
    assert _cli("compile", ck, "--wmax", 16, "--out", tmp_path / "p").exit_code == 0
    r = _cli("inspect", tmp_path / "p", "--plot", tmp_path / "x.svg")
    assert r.exit_code == 2 and "ending in .png" in r.output


def test_usable_slots_per_rank_budget(tmp_path):
    ck = small_gdn(tmp_path / "gdn")
    plan, _ = compile_plan(ck, Policy(w_max=16, pool_budget_bytes=384 * 10), tmp_path / "a", with_kernels=False)
    assert (plan.totals.usable_slots, plan.totals.usable_slots_dense) == (9, 7)   # 3840 // 384 - 1, 3840 // 448 - 1
    kda = small_kda(tmp_path / "kda")           # 2 heads: TP = 2 gives one head per rank
    plan, _ = compile_plan(kda, Policy(w_max=4, tp_size=2, pool_budget_bytes=10_000), tmp_path / "b",
                           with_kernels=False)
    assert plan.totals.usable_slots is None       # the budget is per rank: only the TP figure applies
    assert plan.tp.usable_slots == 10_000 // plan.tp.bottleneck_bytes_per_slot - 1

"""Reference checkpoints: exact formats of the real models, decay values from the published initialisation."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from dasc_compile import refckpt as ref
from dasc_compile.arch import arch_from_config
from dasc_compile.checkpoint import open_checkpoint, read_decay_tensors, read_safetensors_header
from dasc_compile.errors import DascInputError
from dasc_compile.refckpt_mamba2 import MAMBA2_REFERENCE_CONFIGS

BUNDLED = Path(__file__).resolve().parents[2] / "plans" / "reference"

# scaled-down configs of the three architectures (same code paths as the real ones)
SMALL_QWEN3_NEXT = {**ref.REFERENCE_CONFIGS["qwen3-next-80b-a3b"], "num_hidden_layers": 4, "hidden_size": 64,
                    "vocab_size": 4096, "num_experts": 4, "moe_intermediate_size": 16,
                    "shared_expert_intermediate_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
                    "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                    "linear_key_head_dim": 8, "linear_value_head_dim": 8}
SMALL_KIMI = {**ref.REFERENCE_CONFIGS["kimi-linear-48b-a3b"], "num_hidden_layers": 4, "hidden_size": 64,
              "vocab_size": 4096, "intermediate_size": 96, "num_experts": 4, "moe_intermediate_size": 16,
              "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
              "qk_rope_head_dim": 4, "v_head_dim": 8,
              "linear_attn_config": {"kda_layers": [1, 2, 4], "full_attn_layers": [3], "num_heads": 2,
                                     "head_dim": 8, "short_conv_kernel_size": 4}}
_Q35 = ref.REFERENCE_CONFIGS["qwen3.5-27b"]
SMALL_QWEN3_5 = {**_Q35,
                 "text_config": {**_Q35["text_config"], "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 4096,
                                 "intermediate_size": 96, "num_attention_heads": 2, "num_key_value_heads": 1,
                                 "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                 "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                                 "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
                 "vision_config": {**_Q35["vision_config"], "depth": 2, "hidden_size": 32, "intermediate_size": 48,
                                   "num_heads": 2, "out_hidden_size": 64, "num_position_embeddings": 64}}


# ----------------------------------------------------------------------------- the bundled files


@pytest.mark.parametrize("name", [n for n in ref.MODEL_NAMES if n not in MAMBA2_REFERENCE_CONFIGS])
def test_bundled_files_have_exact_names_shapes_dtypes(name):   # the Mamba2 ones: tests/compile/test_mamba2.py
    root = BUNDLED / name
    cfg = json.loads((root / "config.json").read_text())
    assert cfg == ref.REFERENCE_CONFIGS[name]
    spec = arch_from_config(cfg)
    hdr = read_safetensors_header(root / "model.safetensors")
    want = {n: (s, d) for n, s, d in ref.parameter_table(cfg, spec) if n.endswith(("A_log", "dt_bias"))}
    assert {n: (e.shape, e.dtype) for n, e in hdr.tensors.items()} == want
    assert len(want) == 2 * len(spec.recurrent_layer_ids)
    note = hdr.metadata["dasc_provenance"]
    assert note.startswith("initialisation draw, not trained: ") and note.endswith(", seed 0")


def test_bundled_facts_from_models_md():
    """MODELS.md: layer counts, decay tensor names, shapes and dtypes of the three models."""
    facts = {  # name -> (recurrent layers, first A_log name, A_log shape, dt_bias shape, dt_bias dtype)
        "qwen3-next-80b-a3b": (36, "model.layers.0.linear_attn.A_log", (32,), (32,), "BF16"),
        "kimi-linear-48b-a3b": (20, "model.layers.0.self_attn.A_log", (1, 1, 32, 1), (4096,), "F32"),
        "qwen3.5-27b": (48, "model.language_model.layers.0.linear_attn.A_log", (48,), (48,), "BF16"),
    }
    for name, (n_rec, first, a_shape, d_shape, d_dtype) in facts.items():
        hdr = read_safetensors_header(BUNDLED / name / "model.safetensors")
        a = hdr.tensors[first]
        d = hdr.tensors[first.replace("A_log", "dt_bias")]
        assert (a.shape, a.dtype, d.shape, d.dtype) == (a_shape, "F32", d_shape, d_dtype)
        assert len(hdr.tensors) == 2 * n_rec


@pytest.mark.parametrize("name", ref.MODEL_NAMES)
def test_bundled_files_are_reproducible(tmp_path, name):
    out = ref.write_decay_only(name, tmp_path / name, seed=0)
    for f in ("config.json", "model.safetensors"):
        assert (out / f).read_bytes() == (BUNDLED / name / f).read_bytes(), f


def test_bundled_total_size_is_small():
    """The references every device call carries (initialisation draws, calibrated references, trained-decay
    copies) stay small; the bundled trained eval models (a PROVENANCE.md, 6-64 MB each) are parked before a
    device call (benchmarks/h200/park.py ``park bundles``) and kept out of the wheel (pyproject), each file at
    most 16 MiB."""
    trained = {d for d in BUNDLED.iterdir() if (d / "PROVENANCE.md").is_file()}
    carried = sum(p.stat().st_size for p in BUNDLED.rglob("*")
                  if p.is_file() and not any(d in p.parents for d in trained))
    assert carried < 2 * 1024 * 1024
    assert {d.name for d in trained} >= {"kda-hybrid-3m-sharegpt", "gdn-hybrid-11m-sharegpt", "kda-hybrid-11m-sharegpt",
                                       "gdn-hybrid-30m-sharegpt", "kda-hybrid-30m-sharegpt"}
    assert max(p.stat().st_size for d in trained for p in d.rglob("*") if p.is_file()) <= 16 * 2 ** 20


def test_bundled_reader_sees_provenance():
    src = open_checkpoint(BUNDLED / "kimi-linear-48b-a3b")
    assert src.provenance.startswith("initialisation draw, not trained: kda (fla)")
    got = read_decay_tensors(src, arch_from_config(src.config))
    assert len(got) == 40 and got[1][1].dtype == torch.float32


# ----------------------------------------------------------------------------- the draws


def test_gdn_draw_follows_the_transformers_scheme():
    tensors, scheme = ref.draw_decay(ref.REFERENCE_CONFIGS["qwen3.5-27b"], seed=3)
    assert scheme == ref.GDN_SCHEME
    a = torch.stack([t for n, t in tensors if n.endswith("A_log")]).double().exp()
    d = torch.stack([t for n, t in tensors if n.endswith("dt_bias")])
    assert a.shape == (48, 48) and d.dtype == torch.bfloat16 and bool((d == 1).all())
    assert 0.01 <= a.min() and a.max() <= 16
    assert 7.0 < a.mean() < 9.0     # U(0.01, 16) has mean 8.005; 2304 draws, std of the mean ~0.1
    assert len({t.double().sum().item() for n, t in tensors if n.endswith("A_log")}) == 48   # per-layer draws


def test_kda_draw_follows_the_fla_scheme():
    tensors, scheme = ref.draw_decay(ref.REFERENCE_CONFIGS["kimi-linear-48b-a3b"], seed=1)
    assert scheme == ref.KDA_SCHEME
    a = torch.stack([t for n, t in tensors if n.endswith("A_log")]).exp()
    assert a.shape == (20, 1, 1, 32, 1) and 1 <= a.min() and a.max() <= 16
    dt = torch.nn.functional.softplus(torch.stack([t for n, t in tensors if n.endswith("dt_bias")]).double())
    assert dt.shape == (20, 4096)
    assert 1e-3 * (1 - 1e-5) <= dt.min() and dt.max() <= 1e-1 * (1 + 1e-5)   # inverse softplus undone
    # log-uniform: log10(dt) is uniform on [-3, -1], mean -2
    assert abs(dt.log10().mean().item() + 2) < 0.02


def test_safe_gate_draw_starts_a_log_at_zero():
    cfg = {**SMALL_KIMI, "linear_attn_config": {**SMALL_KIMI["linear_attn_config"], "gate_lower_bound": -5.0}}
    tensors, scheme = ref.draw_decay(cfg, seed=0)
    assert scheme == ref.KDA_SAFE_SCHEME
    assert all(bool((t == 0).all()) for n, t in tensors if n.endswith("A_log"))


def test_draw_is_seeded():
    cfg = ref.REFERENCE_CONFIGS["qwen3-next-80b-a3b"]
    a, _ = ref.draw_decay(cfg, seed=7)
    b, _ = ref.draw_decay(cfg, seed=7)
    c, _ = ref.draw_decay(cfg, seed=8)
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))
    assert not torch.equal(a[0][1], c[0][1])


# ----------------------------------------------------------------------------- parameter tables


def test_full_size_tables_of_the_real_models():
    rows = {}
    for name in ref.MODEL_NAMES:
        if name in MAMBA2_REFERENCE_CONFIGS:   # decay tensors only (no full-size table modelled)
            continue
        cfg = ref.REFERENCE_CONFIGS[name]
        table = ref.parameter_table(cfg)
        assert len({n for n, _, _ in table}) == len(table)          # no duplicate names
        rows[name] = (len(table), sum(math.prod(s) for _, s, _ in table),
                      sum(math.prod(s) * (4 if d == "F32" else 2) for _, s, d in table))
    # Qwen3-Next: 48 MoE layers + 1 MTP layer, 512 experts x 3 tensors each
    names = {n for n, _, _ in ref.parameter_table(ref.REFERENCE_CONFIGS["qwen3-next-80b-a3b"])}
    assert sum(".experts." in n for n in names) == 49 * 512 * 3
    assert "mtp.layers.0.mlp.experts.511.down_proj.weight" in names
    # Kimi-Linear: layer 0 dense, 26 MoE layers with 256 experts
    names = {n for n, _, _ in ref.parameter_table(ref.REFERENCE_CONFIGS["kimi-linear-48b-a3b"])}
    assert sum(".experts." in n for n in names) == 26 * 256 * 3 and "model.layers.0.mlp.gate_proj.weight" in names
    # published sizes: Qwen3.x-27B checkpoints hold 27.78 B parameters, 55.56 GB of BF16 tensors
    assert round(rows["qwen3.5-27b"][1] / 1e9, 2) == 27.78 and round(rows["qwen3.5-27b"][2] / 1e9, 2) == 55.56
    assert 80e9 < rows["qwen3-next-80b-a3b"][1] < 82e9 and 48e9 < rows["kimi-linear-48b-a3b"][1] < 50e9


def _meta_model(cls, cfg):
    with torch.device("meta"):
        return cls(cfg)


def test_qwen3_next_table_matches_transformers():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3NextForCausalLM"):
        pytest.skip("transformers without qwen3_next")
    model = _meta_model(transformers.Qwen3NextForCausalLM, transformers.Qwen3NextConfig(**SMALL_QWEN3_NEXT))
    want = {}
    for n, p in model.named_parameters():
        if n.endswith("mlp.experts.gate_up_proj"):     # transformers fuses [E, 2I, H]; on disk per expert
            e, two_i, h = p.shape
            for j in range(e):
                want[n.replace("gate_up_proj", f"{j}.gate_proj.weight")] = (two_i // 2, h)
                want[n.replace("gate_up_proj", f"{j}.up_proj.weight")] = (two_i // 2, h)
        elif n.endswith("mlp.experts.down_proj"):
            for j in range(p.shape[0]):
                want[n.replace("down_proj", f"{j}.down_proj.weight")] = tuple(p.shape[1:])
        else:
            want[n] = tuple(p.shape)
    got = {n: s for n, s, _ in ref.parameter_table(SMALL_QWEN3_NEXT) if not n.startswith("mtp.")}
    assert got == want


def test_qwen3_5_table_matches_transformers():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3_5ForConditionalGeneration"):
        pytest.skip("transformers without qwen3_5")
    model = _meta_model(transformers.Qwen3_5ForConditionalGeneration, transformers.Qwen3_5Config(**SMALL_QWEN3_5))
    want = {n: tuple(p.shape) for n, p in model.named_parameters()}
    got = {n: s for n, s, _ in ref.parameter_table(SMALL_QWEN3_5) if not n.startswith("mtp.")}
    assert got == want


def test_kimi_table_follows_sglang_names():
    """Names SGLang 0.5.17 ``KimiLinearForCausalLM.load_weights`` maps (kimi_linear is not in transformers)."""
    table = {n: (s, d) for n, s, d in ref.parameter_table(SMALL_KIMI)}
    p = "model.layers.0.self_attn."
    assert table[p + "A_log"] == ((1, 1, 2, 1), "F32") and table[p + "dt_bias"] == ((16,), "F32")
    assert table[p + "q_conv1d.weight"] == ((16, 1, 4), "BF16") and table[p + "f_b_proj.weight"] == ((16, 8), "BF16")
    m = "model.layers.2.self_attn."   # MLA layer (layer 3, 1-indexed)
    assert table[m + "kv_a_proj_with_mqa.weight"][0] == (16 + 4, 64)
    assert table[m + "kv_b_proj.weight"][0] == (2 * (8 + 8), 16) and table[m + "q_proj.weight"][0] == (2 * 12, 64)
    assert table["model.layers.1.block_sparse_moe.experts.3.w2.weight"][0] == (64, 16)
    assert table["model.layers.1.block_sparse_moe.gate.e_score_correction_bias"] == ((4,), "F32")
    assert "model.layers.0.mlp.down_proj.weight" in table and "model.layers.0.block_sparse_moe.gate.weight" not in table


def test_unknown_model_name():
    with pytest.raises(DascInputError, match="reference model 'nope' is unknown"):
        ref.write_decay_only("nope", "/tmp/never-written")


# ----------------------------------------------------------------------------- full-size writer


@pytest.mark.parametrize("cfg", [SMALL_QWEN3_NEXT, SMALL_KIMI, SMALL_QWEN3_5], ids=["qwen3_next", "kimi", "qwen3_5"])
def test_full_size_writer_is_sparse_and_exact(tmp_path, cfg):
    out = ref.write_full_size(cfg, tmp_path / "ck", seed=5, shard_bytes=300_000)
    table = ref.parameter_table(cfg)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    wm = index["weight_map"]
    assert set(wm) == {n for n, _, _ in table}
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1 and {s.name for s in shards} == set(wm.values())
    assert shards[0].name == f"model-00001-of-{len(shards):05d}.safetensors"
    seen, total, apparent, allocated = {}, 0, 0, 0
    for s in shards:
        hdr = read_safetensors_header(s)
        assert hdr.metadata["dasc_provenance"].endswith("seed 5")
        for n, e in hdr.tensors.items():
            assert wm[n] == s.name
            seen[n] = (e.shape, e.dtype)
            total += e.nbytes
        apparent += s.stat().st_size
        allocated += s.stat().st_blocks * 512
    assert seen == {n: (sh, d) for n, sh, d in table}
    assert index["metadata"]["total_size"] == total
    assert allocated < 0.2 * apparent                 # holes: only headers and decay tensors take blocks
    # safetensors itself loads any tensor; holes read as zeros, decay tensors are the draw
    draws = dict(ref.draw_decay(cfg, seed=5)[0])
    embed = next(n for n, _, _ in table if n.endswith("embed_tokens.weight"))
    with safe_open(str(out / wm[embed]), "pt") as fh:
        assert not fh.get_tensor(embed).any()
    src = open_checkpoint(out)
    got = read_decay_tensors(src, arch_from_config(src.config))
    assert [n for n, _ in got] == list(draws) and all(torch.equal(t, draws[n]) for n, t in got)
    assert src.provenance == ref.provenance_note(ref.draw_decay(cfg, 5)[1], 5)


def test_cli_entry_point(tmp_path, capsys):
    assert ref.main(["--model", "qwen3.5-27b", "--out", str(tmp_path / "q")]) == 0
    assert (tmp_path / "q" / "model.safetensors").exists()
    assert ref.main(["--model", "nope", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: reference model 'nope' is unknown")


@pytest.mark.parametrize("tool,args,says", [
    ("refckpt", ["--model", "qwen3.5-27b", "--seed", "99999999999999999999999"], "argument --seed: expected an integer"),
    ("refckpt", ["--model", "qwen3.5-27b", "--full-size", "--shard-bytes", "0"], "argument --shard-bytes: expected"),
    ("refckpt", ["--model", "qwen3.5-27b", "--out", ""], "argument --out: expected an output directory"),
    ("refckpt", ["--model", "qwen3.5-27b", "--out", "{file}"], "cannot write there"),
    ("calibrated", ["--model", "kimi-linear-48b-a3b-calibrated", "--seed", "-1"], "argument --seed: expected"),
    ("calibrated", ["--model", "kimi-linear-48b-a3b-calibrated", "--out", "{file}"], "cannot write there"),
])
def test_reference_tools_refuse_bad_input_in_one_line(tmp_path, capsys, tool, args, says):
    """``python -m dasc_compile.refckpt`` / ``.calibrated``: a seed torch or numpy cannot take, --out an existing
    file and a zero shard size ended in tracebacks or wrote 20,495 one-tensor shards; --out '' wrote into the
    current directory."""
    import importlib

    main = importlib.import_module(f"dasc_compile.{tool}").main
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    argv = [x.replace("{file}", str(a_file)) for x in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == "" and cap.err.startswith("error: ") and says in cap.err, cap.err
    assert cap.err.count("\n") == 1 and not (tmp_path / "out").exists()

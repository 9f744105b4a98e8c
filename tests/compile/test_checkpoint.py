"""Checkpoint reader: locating config + tensors, reading only the decay tensors, one-line errors."""

import hashlib
import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dasc_compile import checkpoint as ck
from dasc_compile.arch import arch_from_config
from dasc_compile.checkpoint import (
    TRAINED_PROVENANCE,
    config_fingerprint,
    decay_bytes,
    decay_fingerprint,
    open_checkpoint,
    read_decay_tensors,
    read_safetensors_header,
)
from dasc_compile.errors import DascInputError

# 4 layers, interval 2 -> recurrent layers 0 and 2; H_v = 4 value heads
GDN_CFG = {
    "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4,
    "full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
}
# 3 layers, KDA layers 1 and 3 (1-indexed) -> 0 and 2; H = 2 heads x d = 4 channels
KDA_CFG = {
    "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "num_hidden_layers": 3,
    "linear_attn_config": {"kda_layers": [1, 3], "full_attn_layers": [2], "num_heads": 2, "head_dim": 4,
                           "short_conv_kernel_size": 4},
}


def gdn_tensors() -> dict[str, torch.Tensor]:
    """Decay tensors with distinct, exactly representable values, plus two other tensors."""
    return {
        "model.layers.0.linear_attn.A_log": torch.tensor([0.5, 1.0, 1.5, 2.0]),
        "model.layers.0.linear_attn.dt_bias": torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16),
        "model.layers.2.linear_attn.A_log": torch.tensor([-1.0, -2.0, -3.0, -4.0]),
        "model.layers.2.linear_attn.dt_bias": torch.tensor([0.25, 0.5, 0.75, 1.0], dtype=torch.bfloat16),
        "model.layers.0.linear_attn.out_proj.weight": torch.ones(16, 32, dtype=torch.bfloat16),
        "model.embed_tokens.weight": torch.ones(64, 16, dtype=torch.bfloat16),
    }


def write_dir(root: Path, cfg: dict, tensors: dict, metadata: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(root / "model.safetensors"), metadata=metadata)
    return root


def write_sharded(root: Path, cfg: dict, shards: dict[str, dict]) -> Path:
    """``shards``: file name -> tensors; writes the matching index."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    wm = {}
    for fname, ts in shards.items():
        save_file(ts, str(root / fname))
        wm.update({n: fname for n in ts})
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return root


def read(model, config=None):
    src = open_checkpoint(model, config)
    return src, read_decay_tensors(src, arch_from_config(src.config, str(src.config_path)))


# ----------------------------------------------------------------------------- happy paths


def test_single_file_reads_decay_tensors_in_layer_order(tmp_path):
    t = gdn_tensors()
    write_dir(tmp_path / "m", GDN_CFG, t)
    src, got = read(tmp_path / "m" / "model.safetensors")
    assert [n for n, _ in got] == ["model.layers.0.linear_attn.A_log", "model.layers.0.linear_attn.dt_bias",
                                   "model.layers.2.linear_attn.A_log", "model.layers.2.linear_attn.dt_bias"]
    for n, v in got:
        assert v.dtype == t[n].dtype and torch.equal(v, t[n])
    assert src.provenance == TRAINED_PROVENANCE
    assert src.config_path == tmp_path / "m" / "config.json" and src.root == tmp_path / "m"
    assert set(src.tensor_files) == set(t) and src.index_path is None
    assert decay_bytes(got) == 2 * (4 * 4 + 4 * 2)


def test_directory_and_explicit_config(tmp_path):
    write_dir(tmp_path / "m", GDN_CFG, gdn_tensors())
    _, got = read(tmp_path / "m")
    assert len(got) == 4
    other = tmp_path / "elsewhere.json"
    other.write_text(json.dumps(GDN_CFG))
    (tmp_path / "m" / "config.json").unlink()
    _, got2 = read(tmp_path / "m" / "model.safetensors", other)
    assert decay_fingerprint(got) == decay_fingerprint(got2)


def test_kda_shapes_and_provenance_from_metadata(tmp_path):
    t = {"model.layers.0.self_attn.A_log": torch.zeros(1, 1, 2, 1),
         "model.layers.0.self_attn.dt_bias": torch.arange(8.0),
         "model.layers.2.self_attn.A_log": torch.ones(1, 1, 2, 1),
         "model.layers.2.self_attn.dt_bias": -torch.arange(8.0)}
    write_dir(tmp_path / "k", KDA_CFG, t, metadata={"dasc_provenance": "initialisation draw, not trained: test"})
    src, got = read(tmp_path / "k")
    assert src.provenance == "initialisation draw, not trained: test"
    assert [tuple(v.shape) for _, v in got] == [(1, 1, 2, 1), (8,)] * 2
    assert torch.equal(got[3][1], -torch.arange(8.0))


def test_index_directory_and_index_path(tmp_path):
    t = gdn_tensors()
    names = sorted(t)
    root = write_sharded(tmp_path / "s", GDN_CFG, {
        "model-00001-of-00002.safetensors": {n: t[n] for n in names[:3]},
        "model-00002-of-00002.safetensors": {n: t[n] for n in names[3:]},
    })
    for model in (root, root / "model.safetensors.index.json"):
        src, got = read(model)
        assert src.index_path == root / "model.safetensors.index.json"
        assert src.tensor_files["model.layers.2.linear_attn.dt_bias"].name == "model-00002-of-00002.safetensors"
        assert [torch.equal(v, t[n]) for n, v in got] == [True] * 4


def test_directory_of_shards_without_index(tmp_path):
    t = gdn_tensors()
    root = tmp_path / "d"
    root.mkdir()
    (root / "config.json").write_text(json.dumps(GDN_CFG))
    save_file({k: v for k, v in t.items() if "layers.0" in k}, str(root / "a.safetensors"))
    save_file({k: v for k, v in t.items() if "layers.0" not in k}, str(root / "b.safetensors"))
    src, got = read(root)
    assert src.tensor_files["model.layers.2.linear_attn.A_log"] == root / "b.safetensors" and len(got) == 4


def test_only_decay_tensors_are_read(tmp_path, monkeypatch):
    """Every get_tensor call goes through safe_open; record them: only A_log / dt_bias may appear."""
    write_dir(tmp_path / "m", GDN_CFG, gdn_tensors())
    asked: list[str] = []
    real = ck.safe_open

    class Recording:
        def __init__(self, *a, **k):
            self.h = real(*a, **k)

        def __enter__(self):
            self.h.__enter__()
            return self

        def __exit__(self, *exc):
            return self.h.__exit__(*exc)

        def get_tensor(self, name):
            asked.append(name)
            return self.h.get_tensor(name)

        def __getattr__(self, item):
            return getattr(self.h, item)

    monkeypatch.setattr(ck, "safe_open", Recording)
    read(tmp_path / "m")
    assert sorted(asked) == sorted(n for n in gdn_tensors() if n.endswith(("A_log", "dt_bias")))


# ----------------------------------------------------------------------------- bad input: files


def expect(match: str, fn, *a):
    with pytest.raises(DascInputError) as ei:
        fn(*a)
    msg = str(ei.value)
    assert "\n" not in msg
    for part in match.split("|"):
        assert part in msg, msg
    return msg


def test_missing_model_path(tmp_path):
    expect(f"{tmp_path / 'nope'}|does not exist", open_checkpoint, tmp_path / "nope")


def test_missing_config_beside_file(tmp_path):
    write_dir(tmp_path / "m", GDN_CFG, gdn_tensors())
    (tmp_path / "m" / "config.json").unlink()
    expect("no config.json beside it|--config", open_checkpoint, tmp_path / "m" / "model.safetensors")
    expect(f"{tmp_path / 'x.json'}|config not found", open_checkpoint, tmp_path / "m", tmp_path / "x.json")


def test_corrupt_config_json(tmp_path):
    write_dir(tmp_path / "m", GDN_CFG, gdn_tensors())
    (tmp_path / "m" / "config.json").write_text("{not json")
    expect("config.json|config is not valid JSON", open_checkpoint, tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("[1, 2]")
    expect("config.json|must be a JSON object", open_checkpoint, tmp_path / "m")


def test_config_without_layer_kinds(tmp_path):
    cfg = {k: v for k, v in GDN_CFG.items() if k != "full_attention_interval"}
    write_dir(tmp_path / "m", cfg, gdn_tensors())
    expect("config.json|no layer kinds", read, tmp_path / "m")


def test_empty_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GDN_CFG))
    expect("no model.safetensors.index.json and no *.safetensors", open_checkpoint, tmp_path)


def test_truncated_file(tmp_path):
    p = write_dir(tmp_path / "m", GDN_CFG, gdn_tensors()) / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[:-10])
    expect(f"{p}|truncated safetensors file|ends at data byte", open_checkpoint, tmp_path / "m")
    p.write_bytes(data[:5])
    expect(f"{p}|truncated|8-byte header length", open_checkpoint, tmp_path / "m")
    p.write_bytes(data[:40])
    expect(f"{p}|truncated|header claims", open_checkpoint, tmp_path / "m")


def test_oversized_and_corrupt_header(tmp_path):
    p = write_dir(tmp_path / "m", GDN_CFG, gdn_tensors()) / "model.safetensors"
    p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    expect(f"{p}|exceeds the 100000000-byte limit", open_checkpoint, tmp_path / "m")
    bad = b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]'   # unterminated
    p.write_bytes(struct.pack("<Q", len(bad)) + bad + b"\0" * 4)
    expect(f"{p}|not valid JSON", open_checkpoint, tmp_path / "m")
    bad = b'{"a": {"dtype": "F32", "shape": "x", "data_offsets": [0, 4]}}'
    p.write_bytes(struct.pack("<Q", len(bad)) + bad + b"\0" * 4)
    expect(f"{p}|entry for tensor 'a'", open_checkpoint, tmp_path / "m")
    bad = b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}'
    p.write_bytes(struct.pack("<Q", len(bad)) + bad + b"\0" * 4)
    expect(f"{p}|tensor 'a' (F32 [2]) spans 4 bytes, expected 8", open_checkpoint, tmp_path / "m")


def test_index_naming_missing_shard(tmp_path):
    t = gdn_tensors()
    root = write_sharded(tmp_path / "s", GDN_CFG, {"model-00001-of-00002.safetensors": dict(list(t.items())[:3]),
                                                   "model-00002-of-00002.safetensors": dict(list(t.items())[3:])})
    (root / "model-00002-of-00002.safetensors").unlink()
    expect("model.safetensors.index.json|names shard 'model-00002-of-00002.safetensors'|does not exist",
           open_checkpoint, root)


def test_index_naming_tensor_the_shard_lacks(tmp_path):
    t = gdn_tensors()
    root = write_sharded(tmp_path / "s", GDN_CFG, {"a.safetensors": {k: v for k, v in t.items() if "layers.2" not in k},
                                                   "b.safetensors": {k: v for k, v in t.items() if "layers.2" in k}})
    idx = json.loads((root / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.layers.2.linear_attn.A_log"] = "a.safetensors"   # wrong shard
    (root / "model.safetensors.index.json").write_text(json.dumps(idx))
    expect("index.json|names shard 'a.safetensors' for tensor 'model.layers.2.linear_attn.A_log'|no such tensor",
           read, root)


def test_corrupt_index(tmp_path):
    root = write_sharded(tmp_path / "s", GDN_CFG, {"a.safetensors": gdn_tensors()})
    (root / "model.safetensors.index.json").write_text('{"weight_map": [1]}')
    expect("index.json|'weight_map' must map tensor names", open_checkpoint, root)
    (root / "model.safetensors.index.json").write_text("{")
    expect("index.json|index is not valid JSON", open_checkpoint, root)


def test_duplicate_tensor_across_files(tmp_path):
    t = gdn_tensors()
    root = tmp_path / "d"
    root.mkdir()
    (root / "config.json").write_text(json.dumps(GDN_CFG))
    save_file(t, str(root / "a.safetensors"))
    save_file({"model.embed_tokens.weight": t["model.embed_tokens.weight"]}, str(root / "b.safetensors"))
    expect("b.safetensors|tensor 'model.embed_tokens.weight' is also in|a.safetensors", open_checkpoint, root)


# ----------------------------------------------------------------------------- bad input: tensors


def test_missing_decay_tensor_for_recurrent_layer(tmp_path):
    t = gdn_tensors()
    del t["model.layers.2.linear_attn.dt_bias"]
    write_dir(tmp_path / "m", GDN_CFG, t)
    expect("tensor 'model.layers.2.linear_attn.dt_bias' is missing|layer 2 recurrent", read, tmp_path / "m")


def test_wrong_shape(tmp_path):
    t = gdn_tensors()
    t["model.layers.0.linear_attn.A_log"] = torch.zeros(8)
    p = write_dir(tmp_path / "m", GDN_CFG, t) / "model.safetensors"
    expect(f"{p}|tensor 'model.layers.0.linear_attn.A_log' has shape [8]; expected [4]", read, tmp_path / "m")


def test_wrong_dtype(tmp_path):
    t = gdn_tensors()
    t["model.layers.2.linear_attn.dt_bias"] = torch.ones(4, dtype=torch.int64)
    write_dir(tmp_path / "m", GDN_CFG, t)
    expect("tensor 'model.layers.2.linear_attn.dt_bias' has dtype I64; expected a floating dtype (F32, BF16, F16)",
           read, tmp_path / "m")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_values(tmp_path, bad):
    t = gdn_tensors()
    t["model.layers.2.linear_attn.A_log"] = torch.tensor([0.0, 0.0, bad, 0.0])
    write_dir(tmp_path / "m", GDN_CFG, t)
    expect("tensor 'model.layers.2.linear_attn.A_log' holds 1 non-finite value(s)|first at flat index 2",
           read, tmp_path / "m")


def test_bf16_nan_is_caught(tmp_path):
    t = gdn_tensors()
    t["model.layers.0.linear_attn.dt_bias"] = torch.tensor([1.0, float("nan"), float("nan"), 1.0], dtype=torch.bfloat16)
    write_dir(tmp_path / "m", GDN_CFG, t)
    expect("'model.layers.0.linear_attn.dt_bias' holds 2 non-finite|index 1", read, tmp_path / "m")


# ----------------------------------------------------------------------------- headers and fingerprints


def test_header_parse_matches_file(tmp_path):
    p = write_dir(tmp_path / "m", GDN_CFG, gdn_tensors(), metadata={"k": "v"}) / "model.safetensors"
    h = read_safetensors_header(p)
    e = h.tensors["model.layers.0.linear_attn.dt_bias"]
    assert (e.dtype, e.shape, e.nbytes) == ("BF16", (4,), 8)
    assert h.metadata == {"k": "v"}
    assert h.data_start + h.data_bytes == p.stat().st_size
    raw = p.read_bytes()[h.data_start + e.begin:h.data_start + e.end]
    assert torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.bfloat16), gdn_tensors()[
        "model.layers.0.linear_attn.dt_bias"])


def test_decay_fingerprint_known_answer():
    """The byte format the runtime must reproduce: name, dtype, shape, length, raw bytes."""
    f32 = [("a", torch.tensor([1.0]))]
    expected = hashlib.sha256(b"a\0torch.float32\0[1]\0" + (4).to_bytes(8, "little") + b"\x00\x00\x80\x3f\0")
    assert decay_fingerprint(f32) == expected.hexdigest()
    bf16 = [("a", torch.tensor([1.0], dtype=torch.bfloat16))]
    expected = hashlib.sha256(b"a\0torch.bfloat16\0[1]\0" + (2).to_bytes(8, "little") + b"\x80\x3f\0")
    assert decay_fingerprint(bf16) == expected.hexdigest()


def test_decay_fingerprint_sensitivity():
    base = [("x.A_log", torch.tensor([0.5, 1.0])), ("x.dt_bias", torch.tensor([1.0, 2.0], dtype=torch.bfloat16))]
    fp = decay_fingerprint(base)
    assert fp == decay_fingerprint([(n, t.clone()) for n, t in base])
    assert fp != decay_fingerprint([base[0], ("x.dt_bias", torch.tensor([1.0, 2.0]))])           # dtype
    assert fp != decay_fingerprint([base[0], ("x.dt_bias", torch.tensor([1.0, 2.0 + 2 ** -6], dtype=torch.bfloat16))])
    assert fp != decay_fingerprint([("y.A_log", base[0][1]), base[1]])                          # name
    assert fp != decay_fingerprint([("x.A_log", base[0][1].reshape(1, 2)), base[1]])             # shape
    assert fp != decay_fingerprint(base[::-1])                                                    # order


def test_config_fingerprint_known_answer():
    assert config_fingerprint({"b": [2], "a": 1}) == hashlib.sha256(b'{"a":1,"b":[2]}').hexdigest()
    assert config_fingerprint({"a": 1, "b": [2]}) == config_fingerprint({"b": [2], "a": 1})


def test_provenance_when_metadata_is_not_first_in_header(tmp_path):
    """safetensors' writer puts __metadata__ first (read from a short prefix); other orders fall back."""
    a = torch.tensor([0.5, 1.0, 1.5, 2.0])
    d = torch.ones(4, dtype=torch.bfloat16)
    data = a.numpy().tobytes() + d.view(torch.uint8).numpy().tobytes()
    note = "initialisation draw, not trained: x" + "y" * 70000     # longer than the 64 KiB prefix too
    header = {
        "model.layers.0.linear_attn.A_log": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "model.layers.0.linear_attn.dt_bias": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]},
        "__metadata__": {"dasc_provenance": note},
    }
    raw = json.dumps(header).encode()
    root = tmp_path / "m"
    root.mkdir()
    cfg = {**GDN_CFG, "num_hidden_layers": 2}        # one recurrent layer (0), one full attention (1)
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    src, got = read(root)
    assert src.provenance == note
    assert torch.equal(got[0][1], a) and torch.equal(got[1][1], d)

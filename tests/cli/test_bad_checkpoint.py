"""Bad checkpoint files (issue 13 items 2 and 3): config / index / shard files that are not what they claim,
index entries pointing outside the checkpoint, FIFOs that would hang, decay values whose product is NaN.

Each case runs ``dasc compile`` through the real CLI entry (under a deadline, so a hang fails instead of
blocking): exit 2, one ``error:`` line naming the file and the problem, nothing written.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from safetensors.torch import save_file

from tests.support.clihelp import GDN_CONFIG, assert_one_error, dasc, deadline, gdn_tensors, snapshot, write_ckpt


def _compile(tmp_path, model, *more):
    before = snapshot(tmp_path)
    with deadline(20):
        r = dasc("compile", model, "--wmax", 4, "--out", tmp_path / "plan", *more)
    after = snapshot(tmp_path)
    return r, before, after


def _check(tmp_path, model, *needles, more=()):
    r, before, after = _compile(tmp_path, model, *more)
    line = assert_one_error(r, *needles)
    assert after == before
    return line


# ----------------------------------------------------------------------------- config.json as a file


@pytest.mark.parametrize("kind, needles", [
    ("binary", ["config.json", "not UTF-8"]),
    ("empty", ["config.json", "not valid JSON"]),
    ("truncated", ["config.json", "not valid JSON", "line 1"]),
    ("nested_100000", ["config.json", "nested too deeply"]),
    ("nested_100", ["config.json", "nested 101 levels deep; expected at most 64"]),
    ("huge_integer", ["config.json", "not valid JSON", "digits"]),
    ("too_large", ["config.json", "bytes; expected at most"]),
    ("json_list", ["config.json", "must be a JSON object, got list"]),
    ("directory", ["config.json", "is a directory"]),
    ("fifo", ["config.json", "FIFO"]),
])
def test_config_file_that_is_not_a_json_object(tmp_path, kind, needles):
    ck = write_ckpt(tmp_path / "m", GDN_CONFIG, gdn_tensors())
    cfg = ck / "config.json"
    text = None
    if kind == "binary":
        cfg.write_bytes(bytes(range(256)))
    elif kind == "empty":
        text = ""
    elif kind == "truncated":
        text = json.dumps(GDN_CONFIG)[:40]
    elif kind == "nested_100000":
        text = '{"model_type": "qwen3_next", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    elif kind == "nested_100":
        text = json.dumps({**GDN_CONFIG, "unused": json.loads("[" * 100 + "]" * 100)})
    elif kind == "huge_integer":
        text = json.dumps(GDN_CONFIG).replace('"num_hidden_layers": 4', '"num_hidden_layers": ' + "9" * 5000)
    elif kind == "too_large":
        text = json.dumps({**GDN_CONFIG, "pad": "x" * (17 << 20)})
    elif kind == "json_list":
        text = "[1, 2]"
    elif kind in ("directory", "fifo"):
        cfg.unlink()
        cfg.mkdir() if kind == "directory" else os.mkfifo(cfg)
    if text is not None:
        cfg.write_text(text)
    _check(tmp_path, ck, *needles)


def test_config_option_pointing_at_a_fifo(tmp_path):
    ck = write_ckpt(tmp_path / "m", GDN_CONFIG, gdn_tensors())
    (ck / "config.json").unlink()
    os.mkfifo(tmp_path / "cfg.json")
    _check(tmp_path, ck / "model.safetensors", "cfg.json", "FIFO", more=("--config", tmp_path / "cfg.json"))


# ----------------------------------------------------------------------------- the model path and shards


def test_model_path_that_is_a_fifo(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(GDN_CONFIG))
    os.mkfifo(tmp_path / "m" / "model.safetensors")
    _check(tmp_path, tmp_path / "m" / "model.safetensors", "model.safetensors", "not a regular file")
    _check(tmp_path, tmp_path / "m", "model.safetensors", "not a regular file")   # found by the directory glob
    os.mkfifo(tmp_path / "pipe")
    _check(tmp_path, tmp_path / "pipe", "expected a .safetensors file")


def _sharded(tmp_path, weight_map_edit: dict) -> "os.PathLike":
    root = tmp_path / "m"
    root.mkdir()
    (root / "config.json").write_text(json.dumps(GDN_CONFIG))
    t = gdn_tensors()
    save_file(t, str(root / "model-00001-of-00001.safetensors"))
    wm = {n: "model-00001-of-00001.safetensors" for n in t}
    wm.update(weight_map_edit)
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return root


A0 = "model.layers.0.linear_attn.A_log"


@pytest.mark.parametrize("shard, needles", [
    ("../../../etc/hostname", ["'../../../etc/hostname'", "inside the index's directory"]),
    ("/etc/hostname", ["'/etc/hostname'", "no absolute path"]),
    ("sub/../../outside.safetensors", ["'sub/../../outside.safetensors'", "no '..'"]),
    ("..\\..\\x.safetensors", ["inside the index's directory"]),
    ("", ["inside the index's directory"]),
    (5, ["must map tensor names to shard file names", "5"]),
    (["a"], ["must map tensor names to shard file names"]),
    ("missing.safetensors", ["names shard 'missing.safetensors'", "does not exist"]),
])
def test_index_entry_outside_or_not_a_shard(tmp_path, shard, needles):
    (tmp_path / "outside.safetensors").write_bytes(b"never read")
    root = _sharded(tmp_path, {A0: shard})
    _check(tmp_path, root, "model.safetensors.index.json", *needles)


def test_index_shard_that_is_a_fifo_and_a_symlink_inside(tmp_path):
    root = _sharded(tmp_path, {A0: "pipe.safetensors"})
    os.mkfifo(root / "pipe.safetensors")
    _check(tmp_path, root, "pipe.safetensors", "FIFO")
    # a symbolic link inside the directory (the Hugging Face cache's snapshot layout) is followed
    (root / "pipe.safetensors").unlink()
    (root / "blobs").mkdir()
    save_file(gdn_tensors(), str(root / "blobs" / "abc"))
    (root / "pipe.safetensors").symlink_to("blobs/abc")
    r = dasc("compile", root, "--wmax", 4, "--out", tmp_path / "plan")
    assert r.code == 0, r.err


def test_index_that_is_not_an_index(tmp_path):
    root = _sharded(tmp_path, {})
    (root / "model.safetensors.index.json").write_text('{"weight_map": ' + "[" * 50_000 + "]" * 50_000 + "}")
    _check(tmp_path, root, "index", "nested too deeply")
    (root / "model.safetensors.index.json").write_text('{"weight_map": [1]}')
    _check(tmp_path, root, "'weight_map' must map tensor names")


def test_safetensors_header_nested_too_deeply(tmp_path):
    root = tmp_path / "m"
    root.mkdir()
    (root / "config.json").write_text(json.dumps(GDN_CONFIG))
    header = ('{"x": ' + "[" * 50_000 + "]" * 50_000 + "}").encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    _check(tmp_path, root, "model.safetensors", "corrupt safetensors header", "nested too deeply")


# ----------------------------------------------------------------------------- decay values


def test_inf_times_zero_decay_is_refused_not_taken_as_infinite_horizon(tmp_path):
    t = gdn_tensors()
    t["model.layers.2.linear_attn.A_log"] = torch.tensor([1e30, -2.3])      # exp -> inf
    t["model.layers.2.linear_attn.dt_bias"] = torch.tensor([-1e30, 0.3])    # softplus -> 0
    ck = write_ckpt(tmp_path / "m", GDN_CONFIG, t)
    line = _check(tmp_path, ck, "model.layers.2.linear_attn.A_log / model.layers.2.linear_attn.dt_bias",
                  "not a number", "unit 0")
    assert "inf * 0" in line


def test_decay_extremes_that_are_well_defined_still_compile(tmp_path):
    # exp(A_log) = inf with a positive softplus is g = -inf: H = 0, the unit is local (forgets at once)
    t = gdn_tensors()
    t["model.layers.2.linear_attn.A_log"] = torch.tensor([1e30, -2.3])
    ck = write_ckpt(tmp_path / "m", GDN_CONFIG, t)
    r = dasc("compile", ck, "--wmax", 4, "--out", tmp_path / "plan")
    assert r.code == 0, r.err
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan["layers"][1]["kept_units"] == [1]


@pytest.mark.parametrize("more", [(), ("--no-kernels",)], ids=["kernels", "no-kernels"])
def test_no_recurrent_layer_is_refused_before_kernels(tmp_path, more):
    cfg = {**GDN_CONFIG, "layer_types": ["full_attention"] * 4}
    ck = write_ckpt(tmp_path / "m", cfg, {"model.layers.0.self_attn.q_proj.weight": torch.zeros(2, 2)})
    line = _check(tmp_path, ck, "config.json", "makes no layer recurrent", more=more)
    assert "kernel constants" not in line


def test_one_shard_of_a_sharded_checkpoint_is_named_with_what_to_pass(tmp_path):
    """A user passed model-00001-of-00002.safetensors and read only "tensor ... is missing" about the folder."""
    ck = write_ckpt(tmp_path / "m", GDN_CONFIG, {})
    (ck / "model.safetensors").unlink()
    t = gdn_tensors()
    save_file({k: v for k, v in t.items() if ".layers.0." in k}, str(ck / "model-00001-of-00002.safetensors"))
    save_file({k: v for k, v in t.items() if ".layers.2." in k}, str(ck / "model-00002-of-00002.safetensors"))
    _check(tmp_path, ck / "model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors: shard 1 of 2",
           "'model.layers.2.linear_attn.A_log'", f"pass the folder {ck}")
    # the folder itself compiles (both shards read from their headers)
    r, _, _ = _compile(tmp_path, ck)
    assert r.code == 0, r.err


def test_config_option_is_refused_for_a_folder_with_its_own_config(tmp_path):
    """--config silently replaced the folder's own config.json, and the error that followed named neither."""
    ck = write_ckpt(tmp_path / "m", GDN_CONFIG, gdn_tensors())
    (tmp_path / "other.json").write_text(json.dumps(GDN_CONFIG))
    _check(tmp_path, ck, f"--config {tmp_path / 'other.json'}", "has its own config.json", "drop --config",
           more=("--config", tmp_path / "other.json"))
    # a lone file keeps --config (its documented use), even with a config.json beside it
    r, _, _ = _compile(tmp_path, ck / "model.safetensors", "--config", tmp_path / "other.json")
    assert r.code == 0, r.err

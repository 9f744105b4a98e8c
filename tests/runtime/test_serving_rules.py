"""One truth about what the runtime serves (issue 22 item 1): every refusal of the runtime is a rule of
``dasc_runtime.serving_rules`` (or needs the served model), the server refuses each rule's example, and
``dasc size`` refuses or corrects the same configuration; the flags ``dasc size`` prints start the server.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from dasc_compile.cli import app
from dasc_runtime import serving_rules, size_options
from dasc_runtime.serving_rules import RULES, SMALLEST_AUTO_CHUNK, STARTUP_ONLY
from tests.support.runtime_fixtures import SGLANG_SKIP_REASON, compile_tiny

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
LONG_A = [[0.0005, 0.1, 1.0, 8.0], [0.02, 3.0, 5.0, 0.05], [0.01, 0.02, 0.03, 9.0]]   # H_s 12,520 tokens in unit 0


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Tiny plans, one per serving situation the rules tell apart: ``name -> (plan, plan_dir)``."""
    d = tmp_path_factory.mktemp("rules")
    out = {}
    for name, kw in (("nr", {}), ("wr", dict(load_policy="wr")), ("off2", dict(tp_size=2)),
                     ("storage2", dict(tp_size=2, balance="storage")), ("hybrid2", dict(tp_size=2, balance="hybrid")),
                     ("wr-long", dict(load_policy="wr", w_max=16384, a_table=LONG_A)),
                     ("wr-storage2", dict(load_policy="wr", tp_size=2, balance="storage"))):
        sub = d / name
        sub.mkdir()
        plan, path, _ = compile_tiny(sub, **kw)
        out[name] = (plan, path)
    assert out["wr-long"][0].refresh.w_replay_cap == 16384 > SMALLEST_AUTO_CHUNK
    return out


# How each rule is met. "server": the ServerArgs attributes, refresh slots and context length the server sees;
# "size": what dasc size is given and what it must do ("refuse", or "correct" with the flag it adds), or why
# dasc size never meets the rule ("never": a flag dasc size never prints; "startup": needs the served model).
EXAMPLES = {
    "disable_radix_cache": dict(server=dict(disable_radix_cache=True), size=("never", "--disable-radix-cache")),
    "radix_cache_backend": dict(server=dict(radix_cache_backend="lmcache"), size=("never", "--radix-cache-backend")),
    "hierarchical_cache": dict(server=dict(enable_hierarchical_cache=True),
                               size=("never", "--enable-hierarchical-cache")),
    "unified_memory": dict(server=dict(enable_unified_memory=True), size=("never", "--enable-unified-memory")),
    "page_major_layout": dict(server=dict(enable_page_major_kv_layout=True),
                              size=("never", "--enable-page-major-kv-layout")),
    "int8_mamba_checkpoint": dict(server=dict(enable_int8_mamba_checkpoint=True),
                                  size=("never-dasc", "--enable-int8-mamba-checkpoint")),
    "speculative_decoding": dict(server=dict(speculative_algorithm="EAGLE"), size=("never", "--speculative-algorithm")),
    "replayssm": dict(server=dict(enable_linear_replayssm_spec=True), size=("never", "--enable-linear-replayssm")),
    "session_radix_cache": dict(server=dict(enable_session_radix_cache=True),
                                size=("never", "--enable-session-radix-cache")),
    "streaming_session": dict(server=dict(enable_streaming_session=True), size=("never", "--enable-streaming-session")),
    "disaggregation": dict(server=dict(disaggregation_mode="prefill"), size=("never", "--disaggregation-mode")),
    "pipeline_parallel": dict(server=dict(pp_size=2), size=("never", "--pp-size")),
    "device": dict(server=dict(device="cpu"), size=("never", "--device")),
    "extra_buffer_lazy": dict(server=dict(mamba_radix_cache_strategy="extra_buffer_lazy"),
                              size=("refuse", ["--mamba-radix-cache-strategy", "extra_buffer_lazy"])),
    "mixed_chunk": dict(server=dict(enable_mixed_chunk=True), size=("never", "--enable-mixed-chunk")),
    "dp_attention": dict(server=dict(enable_dp_attention=True), size=("never", "--enable-dp-attention")),
    "memory_saver": dict(server=dict(enable_memory_saver=True), size=("never", "--enable-memory-saver")),
    "external_state_store": dict(server=dict(enable_lmcache=True), size=("never", "--enable-lmcache")),
    "storage_balance_overlap": dict(plan="storage2", server=dict(disable_overlap_schedule=False),
                                    size=("correct", [], "--disable-overlap-schedule")),
    # dasc size prints --tp-size P itself (settle_size_options), so the rule never fires on what it prints
    "tp_size": dict(plan="off2", server=dict(tp_size=1), size=("prints", "--tp-size 2")),
    "no_buffer_overlap": dict(server=dict(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=False),
                              size=("correct", ["--mamba-radix-cache-strategy", "no_buffer"],
                                    "--disable-overlap-schedule")),
    "balance_hybrid": dict(plan="hybrid2", size=("refuse", [])),
    # dasc size names its own flag (the server's text names --dasc-refresh-slots, a flag the user did not type)
    "refresh_slots_without_wr": dict(plan="nr", refresh_slots=2,
                                     size=("own-flag", ["--refresh-slots", "2"],
                                           "error: --refresh-slots 2: this plan runs no dasc-wr refresh (load_policy: "
                                           "nr, w_replay_cap 8), so it has no scratch slots to size; leave "
                                           "--refresh-slots out, or size a plan compiled with --load-policy wr that "
                                           "omits units")),
    "refresh_slots_zero": dict(plan="wr", refresh_slots=0,
                               size=("own-flag", ["--refresh-slots", "0"],
                                     "error: --refresh-slots: expected an integer >= 1 and <= 2147483648 (2**31), "
                                     "got 0")),
    "refresh_window_over_context": dict(plan="wr", context_len=8,
                                        size=("startup", "the served context length is the model's (or "
                                              "--context-length); dasc size prints neither")),
    "refresh_window_over_chunk": dict(plan="wr-long", server=dict(chunked_prefill_size=SMALLEST_AUTO_CHUNK),
                                      size=("correct", [], "--chunked-prefill-size 16384")),
    "refresh_dp_attention": dict(plan="wr", server=dict(enable_dp_attention=True),
                                 size=("never", "--enable-dp-attention")),
}


def _server_refuses(rule, ex, plan):
    """Run the server's own start-up check of the rule's scope on the example; return the refusal text."""
    from dasc_runtime.verify import DascRefusal, check_plan_supported, check_server_args
    from dasc_runtime.wr_scratch import check_refresh_startup

    sa = SimpleNamespace(**ex.get("server", {}))
    with pytest.raises(DascRefusal) as info:
        if rule.scope == "option":
            check_server_args(sa, plan)
        elif rule.scope == "plan":
            check_plan_supported(plan)
        else:
            check_refresh_startup(plan, refresh_slots=ex.get("refresh_slots"), context_len=ex.get("context_len", 10**6),
                                  chunked_prefill_size=getattr(sa, "chunked_prefill_size", None), server_args=sa)
    return str(info.value)


def _size(plan_dir, *extra):
    return runner.invoke(app, ["size", str(plan_dir), "--dense-slots", "64", "--max-running-requests", "4",
                               "--json", *extra])


def test_every_rule_has_an_example():
    assert sorted(EXAMPLES) == sorted(r.name for r in RULES)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_the_server_refuses_each_rule_and_dasc_size_agrees(plans, rule):
    ex = EXAMPLES[rule.name]
    plan, plan_dir = plans[ex.get("plan", "nr")]
    text = _server_refuses(rule, ex, plan)
    clause = serving_rules.serving_refusals(SimpleNamespace(**ex.get("server", {})), plan,
                                            refresh_slots=ex.get("refresh_slots"),
                                            context_len=ex.get("context_len"), scopes=(rule.scope,))
    assert [c.rule for c in clause] == [rule.name] and clause[0].text in text
    what = ex["size"]
    if what[0] == "refuse":
        r = _size(plan_dir, *what[1])
        assert r.exit_code == 2 and r.output.startswith("error: the dasc runtime would refuse to start: "), r.output
        assert clause[0].text in r.output and len(r.output.splitlines()) == 1
    elif what[0] == "correct":
        r = _size(plan_dir, *what[1])
        assert r.exit_code == 0, r.output
        arms = json.loads(r.stdout)
        assert all(what[2] in " ".join(a["flags"]) for a in arms)
        assert f"warning: added {what[2]} to every arm: the dasc runtime refuses" in r.stderr
    elif what[0] == "own-flag":
        r = _size(plan_dir, *what[1])
        assert r.exit_code == 2 and r.output.strip() == what[2], r.output
    elif what[0] == "prints":
        r = _size(plan_dir)
        assert r.exit_code == 0 and r.stderr == "", r.output
        assert all(what[1] in " ".join(a["flags"]) for a in json.loads(r.stdout) if a["kind"] == "dasc")
    elif what[0] in ("never", "never-dasc"):   # test_size_flags_start_the_server checks the printed flags
        assert what[1].startswith("--")
    else:
        assert what[0] == "startup" and rule.scope == "refresh"


def test_size_refuses_what_the_server_refuses_and_says_so(plans):
    """A user's view of the defects of issue 22: the storage plan gains its flag, the hybrid plan is refused."""
    plan_dir = plans["storage2"][1]
    text = runner.invoke(app, ["size", str(plan_dir), "--dense-slots", "64", "--max-running-requests", "4"])
    assert text.exit_code == 0
    assert all("--disable-overlap-schedule" in ln for ln in text.stdout.splitlines() if "--max-running-requests" in ln)
    assert "extra_buffer without the overlap scheduler: 4 native slots a request" in text.stdout   # k = 4, not 5
    hy = runner.invoke(app, ["size", str(plans["hybrid2"][1]), "--dense-slots", "64", "--max-running-requests", "4"])
    assert hy.exit_code == 2 and "balance=hybrid" in hy.output and "recompile with --balance storage or off" in hy.output


def _startup_refusal_sites() -> set[str]:
    """``module.function`` of every function in runtime/ that raises DascRefusal itself."""
    sites = set()
    for path in sorted((ROOT / "runtime").glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                        and getattr(node.exc.func, "id", None) == "DascRefusal":
                    sites.add(f"{path.stem}.{fn.name}")
    return sites


def test_every_refusal_of_the_runtime_is_a_rule_or_needs_the_served_model():
    through_rules = {"verify.check_server_args", "verify.check_plan_supported", "wr_scratch.check_refresh_startup",
                     "startup_checks.check_launch"}
    sites = _startup_refusal_sites()
    assert "verify.check_fingerprint" in sites and "verify.check_server_args" in sites   # the scan sees raises
    assert sites == through_rules | set(STARTUP_ONLY), (
        "a refusal of the runtime is neither a serving rule nor listed in serving_rules.STARTUP_ONLY: "
        f"{sorted(sites - through_rules - set(STARTUP_ONLY))}; stale entries: {sorted(set(STARTUP_ONLY) - sites)}")


def _parse_sglang_flags(flags: list[str]):
    """SGLang's own command line parser (ServerArgs plus dasc's plugin flags) on ``flags``: a namespace with
    ServerArgs' attribute names, as the server reads them."""
    from sglang.srt.server_args import ServerArgs

    from dasc_runtime.plugin import add_cli_args

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    add_cli_args(None, parser)
    return parser.parse_args(["--model-path", "dummy", *flags])


@pytest.mark.sglang
@pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")
@pytest.mark.parametrize("name", ["nr", "wr", "off2", "storage2", "wr-long", "wr-storage2"])
@pytest.mark.parametrize("strategy,overlap", [("extra_buffer", True), ("extra_buffer", False), ("no_buffer", True)])
def test_size_flags_start_the_server(plans, name, strategy, overlap):
    """Every dasc arm's printed flags, parsed by SGLang's own parser, pass every runtime check decidable
    before launch (the chunk size SGLang would pick itself taken at its smallest)."""
    from dasc_runtime.sizing import size_arms
    from dasc_runtime.verify import check_plan_supported, check_server_args
    from dasc_runtime.wr_scratch import check_refresh_startup

    plan, plan_dir = plans[name]
    arms = size_arms(plan, max_running_requests=4, dense_slots=64, strategy=strategy, overlap_schedule=overlap,
                     plan_path=str(plan_dir), arms=("dense", "int8", "dasc"))
    for arm in arms:
        ns = _parse_sglang_flags(list(arm.flags))
        # SGLang's own ServerArgs refuses no_buffer under the overlap scheduler (an assertion, every arm)
        assert ns.mamba_radix_cache_strategy != "no_buffer" or ns.disable_overlap_schedule, arm.flags
        never = [ex["size"][1] for ex in EXAMPLES.values() if ex["size"][0] == "never"]
        assert not any(f in arm.flags for f in never), arm.flags
        if arm.kind != "dasc":
            assert ns.dasc_plan is None
            continue
        assert "--enable-int8-mamba-checkpoint" not in arm.flags and ns.dasc_plan == str(plan_dir)
        check_server_args(ns, plan)
        check_plan_supported(plan)
        chunk = ns.chunked_prefill_size if ns.chunked_prefill_size is not None else SMALLEST_AUTO_CHUNK
        assert check_refresh_startup(plan, refresh_slots=ns.dasc_refresh_slots, context_len=10**6,
                                     chunked_prefill_size=chunk, server_args=ns) >= (1 if "wr" in name else 0)


def test_refusal_doc_is_generated_from_the_rules():
    doc = (ROOT / "docs" / "runtime-refusals.md").read_text()
    assert doc == serving_rules.markdown(), "regenerate: python -m dasc_runtime.serving_rules > docs/runtime-refusals.md"
    assert all(f"`{r.name}`" in doc for r in RULES) and all(f"`{k}`" in doc for k in STARTUP_ONLY)


def test_size_says_a_plan_keeps_nothing(plans, tmp_path):
    # issue 22: "capacity 392 (7.54x Dense)" with no word that every hit restores a zero state
    plan, plan_dir, _ = compile_tiny(tmp_path, w_max=10**6)
    assert plan.totals.n_kept == 0
    r = runner.invoke(app, ["size", str(plan_dir), "--dense-slots", "64", "--max-running-requests", "4"])
    assert r.exit_code == 0
    assert "warning: nothing is kept" in r.stderr and "every hit restores a zero temporal state" in r.stderr


def test_size_budget_errors_name_the_budget_and_the_smallest_that_fits(tmp_path):
    # issue 22: --budget 1.5GiB answered with an error about --dense-slots 36, a flag the user did not pass
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy

    _, path = compile_plan(ROOT / "plans" / "reference" / "kimi-linear-48b-a3b-calibrated", Policy(w_max=16),
                           tmp_path / "k", with_kernels=False)
    r = runner.invoke(app, ["size", str(path), "--budget", "1.5GiB", "--max-running-requests", "8"])
    assert r.exit_code == 2 and "--dense-slots" not in r.output
    assert r.output.strip() == (
        "error: --budget 1.50 GiB (1,610,612,736 bytes) holds Dense M=36 native slots of 41.41 MiB (43,417,600 bytes) on "
        "one TP rank (and one padding slot); SGLang runs at most floor(M / 5) requests with extra_buffer, so --max-running-requests 8 needs M >= 40 for Dense alone; "
        "a --budget of at least 1823539200 bytes (1.70 GiB) fits every arm")
    # the smallest budget for every arm at once, not only for M' (that one failed next on the INT8 pool)
    ok = runner.invoke(app, ["size", str(path), "--budget", "1780121600", "--max-running-requests", "8", "--json"])
    assert ok.exit_code == 2 and "no SGLang INT8 checkpoint slot fits" in ok.output and "--budget of at least" in ok.output
    need = int(ok.output.split("--budget of at least ")[1].split(" ")[0])
    assert need == 1823539200
    assert runner.invoke(app, ["size", str(path), "--budget", str(need), "--max-running-requests", "8"]).exit_code == 0
    assert runner.invoke(app, ["size", str(path), "--budget", str(need - 1), "--max-running-requests", "8"]).exit_code == 2


@pytest.mark.sglang
@pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")
def test_a_plan_of_other_state_dtypes_gets_the_server_setting_that_matches(tmp_path):
    """A plan with temporal_dtype bfloat16 got flags without --mamba-ssm-dtype, and the server refused it at start-up
    naming a flag no tool printed; conv_dtype float32 has no flag (SGLang reads SGLANG_MAMBA_CONV_DTYPE): a warning
    says so, and the start-up refusal names the variable."""
    from dasc_runtime.sizing import size_arms
    from dasc_runtime.verify import DascRefusal, check_state

    plan, plan_dir, _ = compile_tiny(tmp_path / "bf", temporal_dtype="bfloat16")
    settled = size_options.settle_size_options(plan, strategy="extra_buffer", overlap_schedule=True)
    assert any("--mamba-ssm-dtype bfloat16" in n for n in settled.notes)
    for arm in size_arms(plan, max_running_requests=4, dense_slots=64, plan_path=str(plan_dir),
                         arms=("dense", "int8", "dasc")):
        assert _parse_sglang_flags(list(arm.flags)).mamba_ssm_dtype == "bfloat16", arm.flags
    plan, _, _ = compile_tiny(tmp_path / "cf", conv_dtype="float32")
    settled = size_options.settle_size_options(plan, strategy="extra_buffer", overlap_schedule=True)
    assert any("SGLANG_MAMBA_CONV_DTYPE=float32" in n for n in settled.notes)
    import torch

    m = plan.model
    with pytest.raises(DascRefusal, match="SGLANG_MAMBA_CONV_DTYPE"):
        check_state(plan, layer_ids=m.recurrent_layer_ids, temporal_shape=(plan.tp.heads_per_rank, m.head_v_dim,
                    m.head_k_dim), conv_shapes=[], temporal_dtype=torch.float32, conv_dtype=torch.bfloat16,
                    tp_rank=0, tp_size=plan.tp.tp_size)


def test_a_wr_pool_budget_is_warned_with_what_the_server_builds(tmp_path):
    """`compile --pool-budget 300MiB` of a dasc-wr plan printed 50 usable slots and the server refused it (its 8
    scratch slots take 347 MB of the budget first); at 1 GiB inspect said 173, the server built 117."""
    from dasc_compile.plan_checks import plan_warnings
    from dasc_compile.schema import usable_slots

    plan, _, _ = compile_tiny(tmp_path / "probe", load_policy="wr")
    b_dense, b = plan.tp.bytes_dense_per_slot, plan.tp.bottleneck_bytes_per_slot
    scratch = serving_rules.DEFAULT_REFRESH_SLOTS * b_dense
    for extra_slots, refused in ((40, False), (0, True)):
        budget = scratch + (extra_slots + 1) * b + (b - 1 if extra_slots == 0 else 0)
        plan, _, _ = compile_tiny(tmp_path / f"b{extra_slots}", load_policy="wr", pool_budget_bytes=budget)
        (line,) = [w for w in plan_warnings(plan) if "refresh scratch slots" in w]
        assert f"leaving {max(usable_slots(budget - scratch, b), 0)} usable compressed slots, not the " \
               f"{usable_slots(budget, b)} recorded" in line
        assert ("it would refuse to start" in line) == refused
    nr, _, _ = compile_tiny(tmp_path / "nr", pool_budget_bytes=10 ** 6)
    assert not any("scratch" in w for w in plan_warnings(nr))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_the_launcher_refuses_each_rule_before_weights_load(plans, rule):
    """A user on SGLang 0.5.17: `--disable-radix-cache`, `--tp-size 2` under a TP-8 plan, `--dasc-refresh-slots 0` ...
    were accepted by the launcher and refused only after the model had loaded. Every rule that the options as given
    and the plan decide is now refused by the launching process (``startup_checks.check_launch``, which calls
    ``serving_refusals``); only the served context length's rule waits for the model."""
    from dasc_runtime.settings import DascSettings
    from dasc_runtime.startup_checks import check_launch
    from dasc_runtime.verify import DascRefusal

    ex = EXAMPLES[rule.name]
    plan, plan_dir = plans[ex.get("plan", "nr")]
    settings = DascSettings(plan=str(plan_dir), refresh_slots=ex.get("refresh_slots"))
    options = SimpleNamespace(**ex.get("server", {}))
    if rule.name == "refresh_window_over_context":          # the served context length is the model's
        assert check_launch(settings, options).model.model_type == plan.model.model_type
        return
    hits = serving_rules.serving_refusals(options, plan, refresh_slots=ex.get("refresh_slots"))
    (clause,) = [h.text for h in hits if h.rule == rule.name]
    with pytest.raises(DascRefusal) as info:
        check_launch(settings, options)
    msg = str(info.value)
    prefix = "dasc: refusing to start: " + ("unsupported option(s): " if rule.scope == "option" else "")
    assert "\n" not in msg and (msg == prefix + clause if len(hits) == 1 else clause in msg), (msg, hits)

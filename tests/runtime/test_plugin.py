"""The SGLang plugin end to end on CPU: entry point, flag plumbing, pool and cache hooks, refusals.

The hooks patch SGLang classes for the whole process, so the checks run in a fresh interpreter
(tests/support/runtime_plugin_check.py) through SGLang's own ``load_plugins()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON, compile_tiny

ROOT = Path(__file__).resolve().parents[2]      # the repository root: the probe runs as tests.support.<name>

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plugin")
    _, gdn_dir, _ = compile_tiny(tmp)
    _, kda_dir, _ = compile_tiny(tmp, "kda")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASC_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "tests.support.runtime_plugin_check", str(gdn_dir), str(kda_dir)],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and line, f"plugin check failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = json.loads(line[-1][len("RESULT "):])
    out["_gdn_dir"], out["_kda_dir"] = str(gdn_dir), str(kda_dir)
    return out


def test_entry_point_and_every_hook_applied(findings):
    assert findings["entry_point"] == ["dasc_runtime.plugin:register"]
    # 13, + the start-up check after SGLang builds its cache, + the 4 weight-update paths (issue 13 items 7, 8),
    # + in 0.5.23 the first Engine's launch (it loads the plugins inside its own constructor)
    assert len(findings["hooks_applied"]) == findings["hooks_total"] == \
        14 + findings["weight_methods"] + findings["first_engine_hook"]


def test_flag_reaches_server_args_env_and_pickled_copies(findings):
    plan = findings["_gdn_dir"]
    want = {"plan": plan, "pool_slots": 5, "compressed_only": False, "demote_watermark": 2, "dummy_decay_ok": True}
    assert findings["cli_settings"] == want
    assert findings["pickled_settings"] == want                 # what a spawned scheduler receives
    assert findings["cli_env"] == {"DASC_PLAN": plan, "DASC_POOL_SLOTS": "5", "DASC_DEMOTE_WATERMARK": "2",
                                   "DASC_DUMMY_DECAY_OK": "1"}
    assert findings["cli_checked"]                              # its schedulers do not check the launch again
    assert findings["kwarg_settings"] == {"plan": plan, "compressed_only": True}   # Engine(dasc_plan=...)
    assert findings["plain_settings"] is None


def test_pool_and_two_tier_cache_installed(findings):
    assert findings["pool_type"] == "DascCheckpointPool"
    assert findings["pool_slots"] == 5 and findings["pool_watermark"] == 2
    assert findings["component"] == "DascMambaComponent"
    assert findings["no_plan_pool"] == "None"                   # without a plan SGLang is untouched


def test_hit_batch_hint_and_log_counters(findings):
    # native id 3 (dense hit) and compressed id 10 (= native size 8 + 1 + slot 1) in one batch
    assert findings["cow_src"] == [3, 10] and findings["cow_hint"] == [False, True]
    assert findings["clear"] == [6]
    parts = findings["prefill_log_parts"]
    # the batch's two copy-on-write sources are admitted hits, counted by tier when SGLang collects them
    assert parts[-1].startswith("dasc restored d/c: 0/0, dasc hits d/c: 1/1") and "dasc free c: 5/5" in parts[-1]
    assert parts[-1].endswith("dasc restore batches: 0 (mixed 0, hint misses 0)")
    # 2 dense checkpoints (1 locked) occupy native slots: evictable 1, used = 8 - (5 + 1) = 2
    assert findings["stats_after"] == [1, 2, 0.25]
    assert findings["invariant_ok"][0] is False and findings["invariant_leak"][0] is True
    assert "dense_evictable=1, dense_protected=1" in findings["invariant_leak"][1]


def test_mismatched_plan_and_unsupported_option_refuse_to_start(findings):
    # Engine(...) in the launching process, with the plan only in DASC_PLAN: refused before its constructor runs
    # (0.5.17: as it builds ServerArgs), before any model loads; it was refused only in the scheduler, after the
    # weights had loaded
    assert findings["hicache_launch"].startswith("DascRefusal: dasc: refusing to start: unsupported option(s): "
                                                 "--enable-hierarchical-cache")
    # in a scheduler process (the launch checked): the refusals at model load, which stay as the backstop
    assert findings["mismatch"].startswith("DascRefusal: dasc: refusing to start: temporal state per rank")
    assert "plan (2, 8, 8)" in findings["mismatch"] and "server (4, 16, 16)" in findings["mismatch"]
    assert findings["hicache"] == ("DascRefusal: dasc: refusing to start: unsupported option(s): "
                                   "--enable-hierarchical-cache (host offload of compressed checkpoints is not supported)")


@pytest.mark.parametrize("name, raw, value", [("DASC_LOG_RESTORES", "true", True), ("DASC_LOG_RESTORES", " 0 ", False),
                                              ("DASC_WR_CHECK", "yes", True), ("DASC_WR_DUMP_MAX", "7", 7),
                                              ("DASC_WR_DUMP_MAX", "", 4)])
def test_diagnostic_env_vars_read_every_spelling_the_other_knobs_take(monkeypatch, name, raw, value):
    """DASC_LOG_RESTORES=true was silently off (only "1" counted)."""
    from dasc_runtime.settings import env_setting

    monkeypatch.setenv(name, raw)
    assert env_setting(name) == value and env_setting(name, strict=True) == value


@pytest.mark.parametrize("name, raw", [("DASC_WR_DUMP_MAX", "abc"), ("DASC_LOG_RESTORES", "2"), ("DASC_WR_CHECK", "on!")])
def test_a_bad_diagnostic_value_is_refused_at_start_up_not_a_traceback_at_import(monkeypatch, name, raw):
    """DASC_WR_DUMP_MAX=abc raised a ValueError traceback on `import dasc_runtime.wr_refresh` (in every scheduler
    process); the import now falls back to the default and the start-up check refuses the value in one line."""
    from dasc_compile.errors import DascInputError
    from dasc_runtime import startup_checks

    env = dict(os.environ, **{name: raw})
    r = subprocess.run([sys.executable, "-c", "import dasc_runtime.wr_refresh, dasc_runtime.pool"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    monkeypatch.setenv(name, raw)
    with pytest.raises(DascInputError) as exc:
        startup_checks.check_env_knobs()
    assert str(exc.value).startswith(f"{name}: expected ") and repr(raw) in str(exc.value)

"""The H200 Mamba2 smoke (benchmarks/h200/mamba2_smoke.sh) checked on a CPU as far as a CPU can: its config
is read by SGLang 0.5.17's own NemotronHConfig into the state the plans were compiled for, its decay-only
checkpoint gives the plans the script announces, its server flags get through SGLang 0.5.17's NemotronH
start-up checks (which refused the triton attention backend on the H200, 2026-12-02) with the radix cache on
and nothing dasc refuses, its verdict (mamba2_smoke_verdict.py) passes a case only on evidence, and the
script parses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

ROOT = Path(__file__).resolve().parents[2]
CFG = ROOT / "benchmarks" / "h200" / "sglang" / "nemotronh-tiny.config.json"


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from benchmarks.h200.mamba2_smoke_model import write
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy

    d = tmp_path_factory.mktemp("m2smoke")
    ckpt = write(str(CFG), str(d / "nemo"))
    other = write(str(CFG), str(d / "other"), shift=1)
    out = {w: compile_plan(ckpt, Policy(w_max=w), d / f"w{w}.dasc", with_kernels=False)[0] for w in (0, 16)}
    out["other"] = compile_plan(other, Policy(w_max=16), d / "other.dasc", with_kernels=False)[0]
    out["ckpt"], out["plan16_dir"] = ckpt, d / "w16.dasc"
    return out


def test_smoke_plans_keep_what_the_script_says(plans):
    assert plans[16].totals.n_kept == 32 and plans[0].totals.n_kept == 64 and plans[16].totals.n_units == 64
    assert all(lp.n_kept == 8 for lp in plans[16].layers)
    assert plans["other"].fingerprint.decay_sha256 != plans[16].fingerprint.decay_sha256


@pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")
def test_sglang_reads_the_smoke_config_into_the_plans_state(plans, monkeypatch):
    import sglang.srt.configs.nemotron_h as nh

    from dasc_runtime.verify import check_state

    monkeypatch.setattr(nh, "get_parallel", lambda: SimpleNamespace(attn_tp_size=1))
    raw = json.loads(CFG.read_text())
    cfg = nh.NemotronHConfig(**{k: v for k, v in raw.items() if k != "architectures"})
    plan = plans[16]
    assert list(cfg.mamba_layer_ids) == plan.model.recurrent_layer_ids == [0, 2, 4, 6]
    # SGLang sizes the state with n_groups and builds MambaMixer2 with mamba_n_groups: both must be the plan's
    assert cfg.n_groups == cfg.mamba_n_groups == plan.model.conv_groups == 8
    cp = cfg.mamba2_cache_params
    assert cp.shape.temporal == (16, 64, 128) and cp.shape.conv == [(16 * 64 + 2 * 8 * 128, 3)]
    check_state(plan, layer_ids=cp.layers, temporal_shape=cp.shape.temporal, conv_shapes=cp.shape.conv,
                temporal_dtype=cp.dtype.temporal, conv_dtype=cp.dtype.conv, tp_rank=0, tp_size=1)


def test_smoke_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "h200" / "mamba2_smoke.sh")], check=True)


# ------------------------------------------------------------------ the server flags against SGLang 0.5.17

def _script_common_flags() -> list[str]:
    """The COMMON=( ... ) flags of mamba2_smoke.sh as bash expands them (DASC_SMOKE_ATTN unset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASC_SMOKE")}
    p = subprocess.run(["bash", "-c", 'eval "$(sed -n "/^COMMON=(/,/)$/p" "$1")"; printf "%s\\n" "${COMMON[@]}"', "_",
                        str(ROOT / "benchmarks" / "h200" / "mamba2_smoke.sh")],
                       capture_output=True, text=True, check=True, env=env)
    return p.stdout.split("\n")[:-1]


_RESOLVE = r"""
import json, sys
from sglang.srt.plugins import load_plugins
load_plugins()                                         # as sglang.launch_server does: the --dasc-* flags
import sglang.srt.server_args as S
S.is_cuda = lambda: True                               # the CPU stands in for the H200 here (extra_buffer's check)
from tests.support.runtime_fixtures import as_on_a_gpu_machine
as_on_a_gpu_machine()                                  # and for dasc's launch check of a CUDA GPU
argv = json.loads(sys.argv[1])
res = {}
try:
    sa = S.prepare_server_args(argv)
except AssertionError as e:
    res["assertion"] = str(e)
else:
    res.update({k: getattr(sa, k) for k in ("attention_backend", "disable_radix_cache", "mamba_radix_cache_strategy",
                                            "moe_runner_backend", "sampling_backend")})
    res["decode_graph"] = sa.cuda_graph_config.decode.backend
    from dasc_compile.schema import load_plan
    from dasc_runtime.verify import check_server_args
    check_server_args(sa, load_plan(sys.argv[2], verify_kernels=False))   # dasc start-up rules: raise on a refusal
    res["dasc_refusal"] = None
print("RESULT " + json.dumps(res))
"""


def _resolve(argv: list[str], plan_dir) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, "-c", _RESOLVE, json.dumps(argv), str(plan_dir)], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=600)
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(line[0][len("RESULT "):])


@pytest.mark.slow
@pytest.mark.sglang
@pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")
def test_served_flags_pass_sglang_0517_nemotronh_checks(plans):
    from dasc_runtime.sglang_api import TESTED, installed_version

    if installed_version() != TESTED[0]:        # the H200 carry is the oldest tested release
        pytest.skip(f"the smoke serves SGLang {TESTED[0]} (installed: {installed_version()})")
    common = _script_common_flags()
    assert common[:2] == ["--attention-backend", "torch_native"]
    run_sglang = (ROOT / "benchmarks" / "h200" / "sglang" / "run_sglang.sh").read_text()
    assert '--attention-backend triton --sampling-backend pytorch "$@"' in run_sglang   # its own flags come first
    head = ["--model-path", str(plans["ckpt"]), "--attention-backend", "triton", "--sampling-backend", "pytorch"]
    dasc = ["--dasc-plan", str(plans["plan16_dir"]), "--dasc-pool-slots", "64", "--dasc-dummy-decay-ok"]
    # what the H200 said on 2026-12-02 to run_sglang.sh's triton default: reproduced here, so the check can fail
    before = _resolve(head + [f for f in common if f not in ("--attention-backend", "torch_native")]
                      + ["--device", "cuda"] + dasc, plans["plan16_dir"])
    assert "does not support triton attention backend" in before.get("assertion", ""), before
    got = _resolve(head + common + ["--device", "cuda"] + dasc, plans["plan16_dir"])
    assert got == {"attention_backend": "torch_native", "disable_radix_cache": False,
                   "mamba_radix_cache_strategy": "extra_buffer", "moe_runner_backend": "triton",
                   "sampling_backend": "pytorch", "decode_graph": "disabled", "dasc_refusal": None}, got


# ------------------------------------------------------------------ the verdict (mamba2_smoke_verdict.py)

def test_refusal_pattern_is_the_runtimes_wording(plans):
    """The verdict's mismatch evidence is the line dasc's fingerprint check raises for these very plans."""
    import torch

    from benchmarks.h200.mamba2_smoke_verdict import REFUSAL_RE
    from dasc_runtime.verify import DascRefusal, check_fingerprint

    plan, other = plans[16], plans["other"]
    served = [(n, torch.tensor(v, dtype=torch.float32))
              for n, v in zip(plan.fingerprint.served.names, other.fingerprint.served.values)]
    with pytest.raises(DascRefusal) as exc:
        check_fingerprint(plan, served, load_format="dummy")
    assert REFUSAL_RE.search(str(exc.value)), str(exc.value)
    own = [(n, torch.tensor(v, dtype=torch.float32))
           for n, v in zip(plan.fingerprint.served.names, plan.fingerprint.served.values)]
    check_fingerprint(plan, own, load_format="dummy")            # its own decays: no refusal


_OUT16 = [[7] * 16, [8] * 16, [9] * 16]
_REFUSAL = ("[2026-12-02 05:00:00] Scheduler hit an exception: dasc_runtime.refusal.DascRefusal: dasc: refusing to "
            "start: decay tensors of the served weights (sha256 0123456789abcdef...) differ from the ones the plan "
            "was compiled from (sha256 fedcba9876543210...), e.g. 'backbone.layers.0.mixer.A' torch.float32 [16]; "
            "recompile the plan from the served checkpoint")
_ASSERTION = ("AssertionError: NemotronHForCausalLM does not support triton attention backend,as the first layer "
              "might not be an attention layer")       # server_31004.log of the H200 call of 2026-12-02


def _case(out: Path, label: str, port: int, rc="0", cached=(0, 512, 512), outputs=_OUT16, log=""):
    (out / f"start_{label}.rc").write_text(f"{rc}\n")
    if outputs is not None:
        rows = [{"req": f"r{i + 1} x", "prompt_tokens": 700, "cached_tokens": c, "output_ids": o}
                for i, (c, o) in enumerate(zip(cached, outputs))]
        (out / f"client_{label}.json").write_text(json.dumps({"label": label, "rows": rows}))
    (out / f"server_{port}.log").write_text(log)


_RESTORE = ("[2026-12-02] dasc: restoring 1 compressed (local units zero-filled) + 0 dense checkpoint(s) into active slots "
            "(totals before: compressed 0, dense 0)\n"
            "[2026-12-02] dasc restore check: compressed row 1 -> slot 3: temporal max|diff| 0 (kept 32 of 64 units), "
            "conv max|diff| 0\n")
_WRONG = _RESTORE.replace("temporal max|diff| 0 ", "temporal max|diff| 0.125 ")
RUNS = ["dense", "dasc_w16", "dasc_w0", "mismatch"]


def _good(out: Path) -> None:
    _case(out, "dense", 31001)
    _case(out, "dasc_w16", 31002, outputs=[_OUT16[0], [1] * 16, [2] * 16], log=_RESTORE)   # lossy hit: may differ
    _case(out, "dasc_w0", 31003, log=_RESTORE)
    _case(out, "mismatch", 31004, rc="4", outputs=None, log="Traceback ...\n" + _REFUSAL + "\n")


def test_verdict_passes_a_run_with_all_evidence(tmp_path):
    from benchmarks.h200.mamba2_smoke_verdict import verdict

    _good(tmp_path)
    rc, lines = verdict(tmp_path, RUNS)
    assert rc == 0 and lines[-1] == "mamba2 smoke: 4/4 case(s) passed", lines
    assert "dasc: refusing to start: decay tensors" in lines[3]


@pytest.mark.parametrize("breakage, failed", [
    # the H200 run of 2026-12-02: every server died of SGLang's NemotronH assertion; mismatch looked "refused"
    (lambda o: _case(o, "mismatch", 31004, rc="4", outputs=None, log=_ASSERTION), ["mismatch"]),
    (lambda o: _case(o, "mismatch", 31004, rc="0", outputs=None, log=_REFUSAL), ["mismatch"]),   # started anyway
    (lambda o: (o / "start_mismatch.rc").unlink(), ["mismatch"]),                              # never ran / hung
    # dense without answers also leaves the keep-all case without its reference (dasc_w16 says r1 was not compared)
    (lambda o: _case(o, "dense", 31001, rc="4", outputs=None, log=_ASSERTION), ["dense", "dasc_w0"]),
    (lambda o: (o / "client_dense.json").unlink(), ["dense", "dasc_w0"]),                       # client failed
    (lambda o: _case(o, "dense", 31001, cached=(0, 0, 0)), ["dense"]),                           # no prefix hit
    (lambda o: _case(o, "dasc_w16", 31002, log=""), ["dasc_w16"]),                               # no restore line
    (lambda o: _case(o, "dasc_w16", 31002, outputs=[[3] * 16] * 3, log=_RESTORE), ["dasc_w16"]),  # r1 != dense r1
    (lambda o: _case(o, "dasc_w16", 31002, log=_RESTORE.splitlines()[0]), ["dasc_w16"]),        # no restore check
    (lambda o: _case(o, "dasc_w0", 31003, log=_WRONG), ["dasc_w0"]),                # restored slot != reference
    (lambda o: _case(o, "dasc_w0", 31003, outputs=[_OUT16[0], _OUT16[1], [5] * 16], log=_RESTORE), ["dasc_w0"]),
    (lambda o: _case(o, "dasc_w0", 31003, outputs=[x[:15] for x in _OUT16], log=_RESTORE), ["dasc_w0"]),
    (lambda o: _case(o, "dasc_w0", 31003, rc="skipped (past the 450 s deadline)", outputs=None), ["dasc_w0"]),
])
def test_verdict_fails_a_case_without_its_evidence(tmp_path, breakage, failed):
    from benchmarks.h200.mamba2_smoke_verdict import main, verdict

    _good(tmp_path)
    breakage(tmp_path)
    rc, lines = verdict(tmp_path, RUNS)
    assert rc == 1 and [l.split()[0] for l in lines[:-1] if " FAILED: " in l] == failed, lines
    assert lines[-1].endswith("FAILED: " + " ".join(failed))
    assert main([str(tmp_path), " ".join(RUNS)]) == 1


def test_verdict_needs_dense_for_the_exact_restore_and_judges_only_requested_cases(tmp_path):
    from benchmarks.h200.mamba2_smoke_verdict import verdict

    _good(tmp_path)
    rc, lines = verdict(tmp_path, ["dasc_w0"])                 # dense's files exist but it was not requested
    assert rc == 1 and "no dense answers" in lines[0], lines
    assert verdict(tmp_path, ["dasc_w16", "mismatch"])[0] == 0  # r1 not compared without dense: said, not failed
    assert verdict(tmp_path, [])[0] == 1 and verdict(tmp_path, ["dense", "typo"])[0] == 1
    refreshed = "... dasc refreshed: 2 (128 tok replayed, 1 passes, 0 skipped) ...\n"
    _case(tmp_path, "dasc_wr16", 31005, log=_RESTORE)
    assert verdict(tmp_path, ["dasc_wr16"])[0] == 1            # a dasc-wr hit must be refreshed
    _case(tmp_path, "dasc_wr16", 31005, log=_RESTORE + refreshed)
    assert verdict(tmp_path, ["dasc_wr16"])[0] == 0


# ------------------------------------------------------------------ the script's server phase, with fake servers

_FAKE_RUN_SGLANG = r"""#!/usr/bin/env bash
# run_sglang.sh stand-in: TARBALL MODEL PORT FLAGS...; FAKE_FAIL names ports that die, with what the log says
PORT=$3; LOG=$OUT/server_$PORT.log
echo "flags: $*" > "$LOG"
for f in $FAKE_FAIL; do
  if [ "${f%%=*}" = "$PORT" ]; then sleep 1; echo "${f#*=}" | tr _ ' ' >> "$LOG"; exit 4; fi
done
setsid sleep 5 > /dev/null 2>&1 &   # a stand-in server in its own session, gone by itself
echo $!
"""

_PRELUDE = r"""set -uo pipefail
T0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
smoke_serve() {   # site_env.sh's, minus the client: answers as runtime_smoke_client.py writes them
  local model=$1 port=$2 label=$3; shift 3
  bash "$DEV/run_sglang.sh" x "$model" "$port" "${COMMON[@]}" "$@" > /dev/null; local rc=$?
  if [ $rc -ne 0 ]; then echo "$label: server did not start (rc $rc)"; return $rc; fi
  python3 -c 'import json, sys; json.dump({"rows": [{"req": f"r{i} x", "prompt_tokens": 700, "cached_tokens": c,
    "output_ids": [i] * 16} for i, c in ((1, 0), (2, 512), (3, 512))]}, open(sys.argv[1], "w"))' "$OUT/client_$label.json"
  [ "$label" = dense ] || printf '%s\n' "dasc: restoring 1 compressed (local units zero-filled) + 0 dense checkpoint(s)" \
    "dasc restore check: compressed row 1 -> slot 3: temporal max|diff| 0 (kept 32 of 64 units), conv max|diff| 0" \
    >> "$OUT/server_$port.log"
  return 0
}
"""


@pytest.mark.parametrize("fail, status, failed", [
    ("31004=dasc:_refusing_to_start:_decay_tensors_of_the_served_weights_(sha256_0123abcd...)_differ_from_the_ones_"
     "the_plan_was_compiled_from", 0, []),
    # 2026-12-02: every server died of SGLang's assertion, and the script still reported the mismatch as refused
    ("31001=AssertionError:_NemotronHForCausalLM_does_not_support_triton 31004=AssertionError:_NemotronHForCausalLM",
     1, ["dense", "dasc_w0", "mismatch"]),
])
def test_script_server_phase_judges_with_fake_servers(tmp_path, fail, status, failed):
    """mamba2_smoke.sh from its COMMON flags to the end (the servers' phase and the verdict) with run_sglang.sh
    replaced: the exit status and the FAILED lines follow what the servers did."""
    script = (ROOT / "benchmarks" / "h200" / "mamba2_smoke.sh").read_text()
    dev, out = tmp_path / "dev", tmp_path / "out"
    dev.mkdir(), out.mkdir()
    (dev / "run_sglang.sh").write_text(_FAKE_RUN_SGLANG)
    harness = tmp_path / "harness.sh"
    harness.write_text(_PRELUDE + script[script.index("\nCOMMON=("):])
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DASC_SMOKE")}, "OUT": str(out),
           "DEV": str(dev), "FAKE_FAIL": fail}
    p = subprocess.run(["bash", str(harness)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == status, p.stdout + p.stderr
    assert [l.split()[0] for l in p.stdout.splitlines() if l.split()[1:2] == ["FAILED:"]] == failed, p.stdout
    assert p.stdout.splitlines()[-2].startswith("mamba2 smoke: ")
    # the background mismatch case keeps its pid files under $OUT, not at fixed paths a later run would share
    assert (out / "mismatch.runner").is_file() and (out / "mismatch.pid").is_file()
    assert "/tmp/mamba2-mismatch" not in script

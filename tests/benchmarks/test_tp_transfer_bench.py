"""CPU mode of benchmarks/tp_transfer_bench.py (storage balancing, paper App. B.1 Fig. 9 (b)).

Runs the script in a subprocess as the lead runs it on GPUs, but with P = 2 gloo processes, the
Triton interpreter and the script's tiny configs: every row must pass its bit-exact checks with
units actually crossing ranks (M_remote > 0, payload = M_remote x unit bytes x N, recomputed here
from the compiled plan). A P = 1 run in this process that flips one loaded bit must fail with exit status 1.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = [sys.executable, "-m", "benchmarks.tp_transfer_bench"]
TINY = ["--device", "cpu", "--tp", "2", "--wmax", "16", "--warmup", "0", "--repeats", "1"]


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out_json = tmp_path / "rows.json"
    proc = subprocess.run([*SCRIPT, *TINY, "--json", str(out_json), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    rows = json.loads(out_json.read_text()) if out_json.exists() else []
    return proc, rows


def _bench():
    """The benchmark script as a module."""
    return importlib.import_module("benchmarks.tp_transfer_bench")


def _expected_maps(tmp_path: Path) -> dict[str, tuple[int, int, list[int]]]:
    """(M_remote, unit bytes, n_local) per model, from the same tiny plans compiled in this process."""
    bench = _bench()
    args = bench.parse_args(TINY)
    out = {}
    for case in bench.compile_cases(args, tmp_path / "plans"):
        plan = json.loads((Path(case["plan_dir"]) / "plan.json").read_text())
        unit = plan["model"]["head_v_dim"] * (plan["model"]["head_k_dim"] if plan["model"]["unit_kind"] == "gdn_head" else 1)
        smap = plan["tp"]["storage"]
        out[case["name"]] = (smap["m_remote"], unit * 4, smap["n_local"])
    return out


def test_cpu_mode_is_exact_and_reports_payload(tmp_path):
    md = tmp_path / "bench.md"
    proc, rows = _run(tmp_path, "--n", "2", "--out", str(md))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expect = _expected_maps(tmp_path)
    assert sorted({r["name"] for r in rows}) == ["kimi-linear-48b-a3b", "qwen3-next-80b-a3b"]
    assert [r["n"] for r in rows] == [2, 2]
    for r in rows:
        m_remote, unit_bytes, n_local = expect[r["name"]]
        assert m_remote > 0, r["name"]                         # the all-to-all really moved units
        assert (r["m_remote"], r["unit_bytes"], r["n_local"]) == (m_remote, unit_bytes, n_local)
        assert r["payload_bytes"] == m_remote * unit_bytes * r["n"]
        assert r["failed"] == [] and all(r["us"][k] > 0 for k in ("pack", "stage", "store", "load"))
    assert proc.stdout.count("| yes |") == 2
    text = md.read_text()
    assert "Command: `python " in text and "--device cpu" in text and "P = 2" in text
    assert "initialisation draw" in text and "torch " in text and "triton " in text


def test_flipped_bit_fails_the_check(tmp_path, capsys):
    # P = 1 runs in this process (no spawn): the same check path, with one loaded bit flipped
    bench = _bench()
    out_json = tmp_path / "rows.json"
    rc = bench.main(["--device", "cpu", "--tp", "1", "--wmax", "16", "--n", "1", "--warmup", "0", "--repeats", "1",
                     "--model", "qwen3-next-80b-a3b", "--json", str(out_json), "--inject-fault"])
    assert rc == 1
    rows = json.loads(out_json.read_text())
    assert rows[0]["n_local"][0] > 0 and [r["failed"] for r in rows] == [["r0:roundtrip_ok"]]
    assert "NO (r0:roundtrip_ok)" in capsys.readouterr().out

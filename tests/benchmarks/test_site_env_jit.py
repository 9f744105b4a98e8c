"""The compile caches that travel between serving calls (benchmarks/h200/site_env.sh: jit_env, jit_save,
jit_restore): a pack and an unpack give back the same files at the same paths, a pack over the returned-file
limit leaves no file behind, and the compilers' cache variables point into the cache folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("xz") is None, reason="tar -J needs xz, as on the device image")


def sh(script: str, jit: Path, **env: str) -> str:
    full = {**os.environ, "JIT_DIR": str(jit), **env}
    p = subprocess.run(["bash", "-c", f"source benchmarks/h200/site_env.sh; {script}"], cwd=REPO, env=full,
                       capture_output=True, text=True, check=True)
    return p.stdout


def test_save_then_restore_gives_back_the_caches(tmp_path):
    jit, out, carried = tmp_path / "jit", tmp_path / "out", tmp_path / "dev-jit"
    out.mkdir()
    env_line = sh('jit_env; echo "$TRITON_CACHE_DIR $TORCHINDUCTOR_CACHE_DIR $XDG_CACHE_HOME"', jit)
    assert env_line.split() == [str(jit / "triton"), str(jit / "inductor"), str(jit / "xdg")]
    kernel = jit / "triton" / "ab12" / "kernel.cubin"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(bytes(range(256)) * 64)
    (jit / "xdg" / "flashinfer").mkdir(parents=True)
    (jit / "xdg" / "flashinfer" / "op.so").write_text("so")
    said = sh(f"jit_save {out}", jit)
    assert "saved" in said and (out / "jit.tar.xz").is_file()

    carried.mkdir()
    (out / "jit.tar.xz").rename(carried / "jit.tar.xz")
    fresh = tmp_path / "fresh-machine"
    said = sh(f"jit_restore {carried}", fresh)
    assert "restored" in said
    assert (fresh / "triton" / "ab12" / "kernel.cubin").read_bytes() == kernel.read_bytes()
    assert (fresh / "xdg" / "flashinfer" / "op.so").read_text() == "so"
    # a second call on the same machine keeps what it has
    assert "already restored" in sh(f"jit_restore {carried}", fresh)


def test_a_pack_over_the_limit_is_left_out_and_said(tmp_path):
    jit, out = tmp_path / "jit", tmp_path / "out"
    out.mkdir()
    (jit / "triton").mkdir(parents=True)
    (jit / "triton" / "k.bin").write_bytes(os.urandom(4096))
    said = sh(f"jit_save {out}", jit, JIT_LIMIT_MIB="0")
    assert "not saved" in said and not (out / "jit.tar.xz").exists()


def test_nothing_carried_is_said_and_leaves_an_empty_cache(tmp_path):
    said = sh(f"jit_restore {tmp_path / 'none'}", tmp_path / "jit")
    assert "none carried" in said and (tmp_path / "jit" / "triton").is_dir()

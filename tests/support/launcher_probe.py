"""Run in a fresh process by tests/runtime/test_sglang_versions.py: SGLang's own launcher parse path
(``load_plugins()`` then ``prepare_server_args(argv)``, what ``python -m sglang.launch_server`` runs before it
starts the server) on each case, with the dasc hooks applied by SGLang's ``HookRegistry``.

Usage (from the repository root): python -m tests.support.launcher_probe CASES.json
CASES.json: ``[{"argv": [...], "env": {"DASC_...": "..."}}, ...]``. Prints one ``RESULT {json}`` line: per case
``{"code": exit status or 0, "stderr": everything written to stderr while SGLang parsed, "settings": the dasc
settings recorded on the ServerArgs (or None)}``. Every ``DASC_*`` variable is cleared before each case. A case's
optional ``"gpu": true / false`` stands for the machine having a CUDA GPU or not (``startup_checks.cuda_visible``,
the launch's last check), so that the cases give the same results on a CPU machine and on a GPU one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")


def main(cases_path: str) -> list:
    from sglang.srt.plugins import load_plugins

    load_plugins()                                   # what launch_server's __main__ does first
    from sglang.srt.server_args import prepare_server_args

    from dasc_runtime import startup_checks
    from dasc_runtime.side_channels import settings_of
    from tests.support.runtime_fixtures import as_on_a_gpu_machine

    machine = startup_checks.cuda_visible

    out = []
    for case in json.loads(open(cases_path).read()):
        for k in [k for k in os.environ if k.startswith("DASC_")]:
            del os.environ[k]
        os.environ.update(case.get("env", {}))
        startup_checks.cuda_visible = machine
        if case.get("gpu") is not None:
            as_on_a_gpu_machine(bool(case["gpu"]))
        err = io.StringIO()
        code, settings = 0, None
        with contextlib.redirect_stderr(err):
            try:
                settings = settings_of(prepare_server_args(["--model-path", "dummy", *case["argv"]]))
            except SystemExit as exc:
                code = exc.code
        out.append({"code": code, "stderr": err.getvalue(), "settings": settings})
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1]), default=str))

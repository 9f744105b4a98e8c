"""Import what an SGLang 0.5.17 server start imports, from one unpacked site folder; used by compare_sites.sh.

Usage: python -S site_imports.py SITE_DIR MODEL_DIR OUT_JSON
Writes {"res": {module or step: "ok" | "ErrorType: message"}, "files": [paths under SITE_DIR that were
imported], "so": [shared libraries under SITE_DIR mapped into the process], "warns": [log messages]}.
On a CPU machine some steps fail for want of CUDA; compare_sites.sh compares two sites, not absolutes.
"""
import importlib
import json
import logging
import os
import sys

# the modules launch_server reaches on the way to serving Qwen3-Next / Kimi-Linear with the triton backends
MODULES = """sglang sglang.srt.server_args sglang.launch_server sglang.srt.plugins sglang.srt.entrypoints.http_server
sglang.srt.entrypoints.engine sglang.srt.managers.tokenizer_manager sglang.srt.managers.detokenizer_manager
sglang.srt.managers.scheduler sglang.srt.model_executor.model_runner sglang.srt.model_loader.loader
sglang.srt.models.registry sglang.srt.models.qwen3_next sglang.srt.models.kimi_linear
sglang.srt.configs.qwen3_next sglang.srt.configs.kimi_linear sglang.srt.utils.hf_transformers_utils
sglang.srt.layers.attention.triton_backend sglang.srt.layers.attention.hybrid_linear_attn_backend
sglang.srt.layers.sampler sglang.srt.layers.moe.fused_moe_triton sglang.srt.layers.layernorm
sglang.srt.entrypoints.openai.serving_transcription sglang.srt.entrypoints.warmup
sglang.srt.constrained.xgrammar_backend sglang.srt.utils.torch_memory_saver_adapter
sglang.srt.mem_cache.memory_pool sglang.srt.sampling.custom_logit_processor sglang.kernels.jit.utils.deps
soundfile xgrammar tokenizers torch_memory_saver tvm_ffi flashinfer flashinfer.jit sgl_kernel
transformers.models.auto.configuration_auto""".split()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -S site_imports.py SITE_DIR MODEL_DIR OUT_JSON", file=sys.stderr)
        return 2
    site, model, out = argv
    warns = []

    def err(e: BaseException) -> str:
        return f"{type(e).__name__}: {str(e).replace(site, 'SITE')[:200]}"

    class Keep(logging.Handler):
        def emit(self, record):
            warns.append(record.getMessage().replace(site, "SITE")[:300])

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger().addHandler(Keep())
    res = {}
    for name in MODULES:
        try:
            importlib.import_module(name)
            res[name] = "ok"
        except BaseException as e:  # an import may raise anything; record it and go on
            res[name] = err(e)
    try:  # the model registry imports every SGLang model module, as at server start
        from sglang.srt.models.registry import ModelRegistry
        archs = set(ModelRegistry.get_supported_archs())
        for arch in ("Qwen3NextForCausalLM", "KimiLinearForCausalLM"):
            res[f"registry has {arch}"] = str(arch in archs)
        res["registry size"] = str(len(archs))
    except BaseException as e:
        res["registry"] = err(e)
    try:
        from sglang.srt.utils.hf_transformers_utils import get_config
        res["get_config(MODEL)"] = type(get_config(model, trust_remote_code=False)).__name__
    except BaseException as e:
        res["get_config(MODEL)"] = err(e)
    try:
        from sglang.srt.server_args import prepare_server_args
        a = prepare_server_args(["--model-path", model, "--attention-backend", "triton", "--sampling-backend",
                                 "pytorch", "--load-format", "dummy", "--skip-tokenizer-init"])
        res["prepare_server_args"] = f"ok {a.attention_backend} {a.sampling_backend}"
    except BaseException as e:
        res["prepare_server_args"] = err(e)
    root = os.path.abspath(site) + "/"
    files = sorted({os.path.relpath(f, root) for f in (getattr(m, "__file__", None) for m in list(sys.modules.values()))
                    if f and os.path.abspath(f).startswith(root)})
    with open("/proc/self/maps") as maps:
        so = sorted({os.path.relpath(p, root) for p in (ln.split()[-1] for ln in maps) if p.startswith(root)})
    with open(out, "w") as fh:
        json.dump({"res": res, "files": files, "so": so, "warns": warns}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

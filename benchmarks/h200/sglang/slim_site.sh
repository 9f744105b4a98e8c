#!/usr/bin/env bash
# Trim an installed SGLang 0.5.17 site folder (the `pip install --target` folder of build_site.sh) to what
# a dasc server start on the H200 loads: `python3 -m sglang.launch_server --attention-backend triton
# --sampling-backend pytorch` serving Qwen3-Next / Kimi-Linear checkpoints (torch 2.11.0+cu130, one node).
# One device call sends at most 64 MiB (git tree + the xz tarball), so every MiB taken out here is headroom
# for the repository. Usage: slim_site.sh SITE_DIR   (edits SITE_DIR in place; needs binutils' strip)
#
# What goes, and why it is never loaded in that setup (read from SGLang 0.5.17's sources):
#  - sgl_kernel's FlashAttention-3 / FlashMLA / InfLLM and sm100 builds: other attention backends, other GPUs;
#    xgrammar's static library (lib/libxgrammar.a, 65 MB: only for linking C++ against xgrammar).
#  - sglang/srt/server/_core*.so (the embedded Rust HTTP server) and sglang/srt/grpc/_core*.so (the native
#    gRPC server): loaded only with SGLANG_RUST_SERVER=1 (managers/rust_server.py) or --grpc-port
#    (entrypoints/http_server.py); the default Python HTTP server is used otherwise.
#  - sglang/multimodal_gen (the diffusion runtime of `sglang serve`/`sglang generate`) and sglang/test
#    (imported by srt only under SGLANG_TEST_SCRIPTED_RUNTIME).
#  - torch_memory_saver's ROCm/XPU (unsuffixed) and CUDA-12 hook libraries: its utils.py loads the one
#    `*_cu<torch.version.cuda major>` build, i.e. the _cu13 ones with torch 2.11.0+cu130.
#  - flashinfer/data's cutlass examples/python/test, cccl python/benchmarks/docs/ci/tests: flashinfer's JIT
#    compiles only against the include folders that flashinfer/jit/env.py names, and those stay.
#  - tvm_ffi's libbacktrace sources (a build-time input), `tests` folders, .pyi stubs, __pycache__.
#  - DWARF debug sections of the shared libraries (xgrammar's bindings alone carry ~50 MB of them);
#    `strip --strip-debug` keeps code, dynamic symbols and the symbol table.
# Kept on purpose: soundfile + _soundfile_data (http_server imports openai/serving_transcription, which
# imports realtime/session.py, which imports soundfile at module level), every transformers model folder
# (sglang/srt/models/registry.py imports every SGLang model module at start-up, and those import many
# transformers configs), dill (sampling/custom_logit_processor.py), flashinfer's JIT headers.
# `slim_site.sh --strip-only DIR` does the last step alone (compare_sites.sh uses it on other builds).
set -euo pipefail
command -v strip >/dev/null && command -v readelf >/dev/null \
  || { echo "error: slim_site.sh needs strip and readelf (Debian package binutils)" >&2; exit 2; }
strip_debug() {  # DWARF sections of every shared library under the current folder
  find . -type f -name '*.so*' -print0 | while IFS= read -r -d '' f; do
    if readelf -S -W "$f" 2>/dev/null | grep -q ' \.debug_'; then strip --strip-debug "$f"; fi
  done
}
if [ "${1:-}" = --strip-only ]; then cd "${2:?usage: slim_site.sh --strip-only DIR}" && strip_debug; exit; fi
SITE=${1:?usage: slim_site.sh SITE_DIR}
[ -d "$SITE/sglang/srt" ] || { echo "error: $SITE has no sglang/srt (expected build_site.sh's pip --target folder)" >&2; exit 2; }
cd "$SITE"
before=$(du -sb . | cut -f1)
rm -f sgl_kernel/flash_ops.abi3.so sgl_kernel/sm100/common_ops.abi3.so \
      sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so sgl_kernel/flashmla_ops.abi3.so \
      xgrammar/libxgrammar.a xgrammar/lib/libxgrammar.a
rm -rf bin sglang/srt/server sglang/multimodal_gen sglang/test
rm -f sglang/srt/grpc/_core.*.so
rm -f torch_memory_saver_hook_mode_torch.abi3.so torch_memory_saver_hook_mode_preload.abi3.so \
      torch_memory_saver_hook_mode_torch_cu12.abi3.so torch_memory_saver_hook_mode_preload_cu12.abi3.so
[ -f torch_memory_saver_hook_mode_preload_cu13.abi3.so ] \
  || { echo "error: $SITE lacks torch_memory_saver_hook_mode_preload_cu13.abi3.so (torch_memory_saver changed?)" >&2; exit 2; }
FD=flashinfer/data
rm -rf $FD/cutlass/examples $FD/cutlass/python $FD/cutlass/test $FD/cutlass/tools/util/scripts \
       $FD/cccl/python $FD/cccl/benchmarks $FD/cccl/docs $FD/cccl/ci $FD/cccl/libcudacxx/test \
       $FD/cccl/libcudacxx/codegen $FD/cccl/cub/benchmarks $FD/cccl/thrust/scripts
for d in cutlass/include cutlass/tools/util/include cccl/cub/cub cccl/libcudacxx/include cccl/thrust/thrust \
         include csrc spdlog/include; do
  [ -d "$FD/$d" ] || { echo "error: $SITE/$FD/$d is missing (flashinfer's JIT needs it)" >&2; exit 2; }
done
# flashinfer 0.7 (SGLang 0.5.23's pin) ships the CUDA sources its JIT builds optional kernels from (258 MiB):
# the 0.5.23 site exists for ONE try serving the tiny Qwen3-Next model (sglang_new_try.sh: triton attention,
# pytorch sampling, triton MoE, SGLang's own GDN kernels), which compiles none of the sources below, and the
# whole carry must stay under 64 MiB. Removed for that build only: DeepSeek-V4, KDA, MoE, FMHA, sampling,
# Blackwell / sm100 / sm120 and experimental sources. Also 0.5.23's Rust extensions that this server never
# loads: _server (only with SGLANG_RUST_SERVER, rust_server/server.py), _grpc (only with --grpc-port,
# utils/common.py and entrypoints/http_server.py), _bench (benchmark/rust_client.py) and _multimodal (lazy, in
# multimodal processors); rust_tree_core stays. The 0.5.17 site (flashinfer 0.6) is left as it was.
if ls -d flashinfer_python-0.7.* >/dev/null 2>&1; then
  rm -f sglang/srt/rust_extensions/_server.*.so sglang/srt/rust_extensions/_grpc.*.so \
        sglang/srt/rust_extensions/_bench.*.so sglang/srt/rust_extensions/_multimodal.*.so
  ( cd $FD/csrc && rm -rf cake_dsv4 cake_sampling kda fused_moe cake_fmha cake_bgmv_moe experimental \
      blackwell_* *sm100* *sm120* cake_trtllm_mla_blackwell cake_kimi_k3_mla cake_minimax_* )
fi
rm -rf tvm_ffi/3rdparty/libbacktrace
find . -depth -type d \( -name tests -o -name __pycache__ \) -exec rm -rf {} +
find . -type f -name '*.pyi' -delete
strip_debug
after=$(du -sb . | cut -f1)
echo "slim_site: $SITE from $((before / 1048576)) MiB to $((after / 1048576)) MiB unpacked"

"""The llama.cpp patch series, in order. //third_party/llama_cpp:patch_series_test checks this
list is contiguous (0001, 0002, ...) and equals the *.patch files in patches/."""

LLAMA_CPP_PATCHES = [
    "//third_party/llama_cpp:patches/0001-range-aware-tensor-loading.patch",
    "//third_party/llama_cpp:patches/0002-endpoint-ownership.patch",
    "//third_party/llama_cpp:patches/0003-hidden-state-input.patch",
    "//third_party/llama_cpp:patches/0004-pre-norm-output.patch",
    "//third_party/llama_cpp:patches/0005-layer-filtered-kv.patch",
    "//third_party/llama_cpp:patches/0006-layer-range-adapter-table.patch",
    "//third_party/llama_cpp:patches/0007-qwen3-adapter.patch",
    "//third_party/llama_cpp:patches/0008-qwen3moe-adapter.patch",
    "//third_party/llama_cpp:patches/0009-gemma3-adapter.patch",
    "//third_party/llama_cpp:patches/0010-f32-activations-for-quantized-matmul.patch",
    "//third_party/llama_cpp:patches/0011-vulkan-headers-before-1.3.261.patch",
    "//third_party/llama_cpp:patches/0012-fused-f32-activation-kernels.patch",
    "//third_party/llama_cpp:patches/0013-grammar-bounds-for-untrusted-grammars.patch",
    "//third_party/llama_cpp:patches/0014-grammar-cpu-limit-per-thread.patch",
]

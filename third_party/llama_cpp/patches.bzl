"""The llama.cpp patch series, in order. //third_party/llama_cpp:patch_series_test checks this
list is contiguous (0001, 0002, ...) and equals the *.patch files in patches/."""

LLAMA_CPP_PATCHES = [
    "//third_party/llama_cpp:patches/0001-range-aware-tensor-loading.patch",
    "//third_party/llama_cpp:patches/0002-endpoint-ownership.patch",
    "//third_party/llama_cpp:patches/0003-hidden-state-input.patch",
    "//third_party/llama_cpp:patches/0004-pre-norm-output.patch",
    "//third_party/llama_cpp:patches/0005-layer-filtered-kv.patch",
]

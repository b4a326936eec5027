"""The llama.cpp patch series, in order. //third_party/llama_cpp:patch_series_test checks this
list is contiguous (0001, 0002, ...) and equals the *.patch files in patches/."""

LLAMA_CPP_PATCHES = [
]

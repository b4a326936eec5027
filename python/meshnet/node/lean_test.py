"""A lean node: the control process of a GGUF node loads none of the heavy stacks it does not
need in steady state (issue 14: under 48 MiB peak RSS). Checked in a fresh interpreter, since
this test process may have loaded anything."""

import subprocess
import sys

# torch/numpy/gguf: weights and GGUF parsing; cryptography: X.509 (the certificate is made by a
# child process) and Ed25519 (libsodium instead); prometheus_client and the HTTP stack: /metrics,
# loaded only with --metrics-listen.
HEAVY = ("torch", "numpy", "gguf", "transformers", "cryptography", "prometheus_client", "uvicorn", "starlette",
         "fastapi")


def test_importing_the_node_loads_no_heavy_stack():
    code = ("import sys, meshnet.node.main\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert out.stdout.strip() == "[]", out.stdout

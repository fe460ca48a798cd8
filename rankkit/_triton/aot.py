"""Ahead-of-time compilation of the Triton kernels for an H100 (sm_90), with no GPU.

``triton.compile`` lowers a kernel to PTX and a cubin for a named target; the register count,
spills and shared memory then come from the tools that Triton ships in its package
(``triton/backends/nvidia/bin/``: ``ptxas -v`` on the PTX, ``cuobjdump
--dump-resource-usage`` on the cubin). (``CompiledKernel.n_regs``
and ``n_spills`` are filled in only when the cubin is loaded on a device.)
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rankkit._triton.histogram import _histogram_kernel
from rankkit._triton.lambdas import _lambda_kernel, _rank_kernel

H100 = GPUTarget("cuda", 90, 32)

# kernel name -> (kernel, signature, constexprs) of the configurations that are shipped.
KERNELS = {
    "rank": (_rank_kernel,
             {"s_ptr": "*fp32", "y_ptr": "*fp32", "m_ptr": "*u8", "rank_ptr": "*i32",
              "inv_idcg_ptr": "*fp32", "L": "i32", "k": "i32", "GAIN": "constexpr",
              "BLOCK_R": "constexpr", "BLOCK_C": "constexpr"},
             {"GAIN": 0, "BLOCK_R": 32, "BLOCK_C": 64}),
    "lambda_ndcg": (_lambda_kernel,
                    {"s_ptr": "*fp32", "y_ptr": "*fp32", "m_ptr": "*u8", "rank_ptr": "*i32",
                     "inv_idcg_ptr": "*fp32", "w_ptr": "*fp32", "grad_ptr": "*fp32",
                     "hess_ptr": "*fp32", "L": "i32", "k": "i32", "sigma": "fp32",
                     "WEIGHTING": "constexpr", "GAIN": "constexpr", "HAS_WEIGHTS": "constexpr",
                     "BLOCK_R": "constexpr", "BLOCK_C": "constexpr"},
                    {"WEIGHTING": 1, "GAIN": 0, "HAS_WEIGHTS": False, "BLOCK_R": 32,
                     "BLOCK_C": 64}),
    "lambda_ranknet": (_lambda_kernel, None,
                       {"WEIGHTING": 0, "GAIN": 0, "HAS_WEIGHTS": False, "BLOCK_R": 32,
                        "BLOCK_C": 64}),
    "histogram": (_histogram_kernel,
                  {"codes_ptr": "*u8", "node_ptr": "*i32", "g_ptr": "*i32", "h_ptr": "*i32",
                   "out_ptr": "*i64", "N": "i32", "n_nodes": "i32", "BLOCK_N": "constexpr"},
                  {"BLOCK_N": 256}),
}
KERNELS["lambda_ranknet"] = (_lambda_kernel, KERNELS["lambda_ndcg"][1],
                             KERNELS["lambda_ranknet"][2])


def _tool(name: str) -> str:
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"triton {triton.__version__} ships no {name} at {path}")
    return path


def ptxas_path() -> str:
    """The ptxas that Triton ships and that reads its PTX.

    Triton 3.9 ships two: ``ptxas`` (CUDA 12.9, PTX ISA up to 8.8) and ``ptxas-blackwell``
    (CUDA 13.4); the PTX it emits is ``.version 9.4``, which only the second assembles.
    """
    try:
        return _tool("ptxas-blackwell")
    except FileNotFoundError:
        return _tool("ptxas")


def compile_kernel(name: str, target: GPUTarget = H100, num_warps: int = 4) -> dict:
    """Compile one shipped kernel for ``target``; return its resource use.

    Returns:
        {"name", "registers", "spill_stores", "spill_loads" (bytes, from ``ptxas -v`` on the
        PTX), "local_bytes", "stack_bytes", "shared_bytes" (from ``cuobjdump
        --dump-resource-usage`` of Triton's own cubin), "triton_shared_bytes" (Triton's
        allocation, ``metadata.shared``), "num_warps"}.
    """
    fn, signature, constexprs = KERNELS[name]
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                              target=target, options={"num_warps": num_warps})
    arch = f"sm_{target.arch}a" if target.arch >= 90 else f"sm_{target.arch}"
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        assembled = subprocess.run([ptxas_path(), "-v", f"--gpu-name={arch}", ptx, "-o",
                                    os.path.join(tmp, "again.cubin")],
                                   capture_output=True, text=True, check=True)
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", cubin],
                               capture_output=True, text=True, check=True).stdout
    info = assembled.stderr + assembled.stdout

    def grab(pattern, text):
        found = re.search(pattern, text)
        return int(found.group(1)) if found else None

    return {
        "name": name,
        "registers": grab(r"REG:(\d+)", usage),
        "ptxas_registers": grab(r"Used (\d+) registers", info),
        "spill_stores": grab(r"(\d+) bytes spill stores", info),
        "spill_loads": grab(r"(\d+) bytes spill loads", info),
        "local_bytes": grab(r"LOCAL:(\d+)", usage),
        "stack_bytes": grab(r"STACK:(\d+)", usage),
        "shared_bytes": grab(r"SHARED:(\d+)", usage),
        "triton_shared_bytes": int(compiled.metadata.shared),
        "num_warps": compiled.metadata.num_warps,
    }


if __name__ == "__main__":
    for kernel in KERNELS:
        print(compile_kernel(kernel))

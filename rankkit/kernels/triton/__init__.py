"""Triton kernels for the GPU fast paths: the fused lambda kernel, the quantized
level histogram and the split scan. Requires ``triton``; on a machine without a GPU they run
under Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is imported) on CPU
tensors, which is how the tests check them, and compile ahead of time for sm_90
(:mod:`rankkit.kernels.triton.aot`).
"""

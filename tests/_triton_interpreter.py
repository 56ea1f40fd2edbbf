"""Triton's CPU interpreter with a ``tl.dot`` that computes every output row by the same code.

Why: the interpreter evaluates ``tl.dot`` as one ``np.matmul`` of the whole tile, and the BLAS behind numpy may
compute an output element differently depending on where its row sits in the matrix. OpenBLAS's AVX2 (Haswell)
sgemm, the kernel it picks on AVX2 CPUs without AVX-512 (e.g. an AMD EPYC), tiles the rows and rounds a row of the
tail tile differently from a row of a full tile (1 float32 ulp; with ``OPENBLAS_CORETYPE=Prescott`` the rows agree).
A kernel whose result for a query must not depend on how many other queries share its tile
(``fused.paged_attention``: a verify block of T queries and a one-token step agree bit for bit, as they do on the
GPU, where every row of an MMA tile runs the same instructions) then differs in the interpreter by an ulp that
says nothing about the kernel. Computing the product one row at a time (each row alone is a 1 x K by K x N
product, always row 0 of its call) makes a row's result a function of that row's inputs only.

``rowwise_dot()`` patches the interpreter in this process; call it before the first kernel launch. Used by the
interpreter runs of tests/runtime/test_fused_kernels.py.
"""
from __future__ import annotations


def rowwise_dot() -> None:
    """Replace ``InterpreterBuilder.create_dot`` by a row-at-a-time product with the same dtype rules and result.

    The product of a [..., M, K] and b [..., K, N] plus the accumulator d [..., M, N] is assembled from M products
    of [..., 1, K] by [..., K, N], each by the interpreter's own ``create_dot`` (so its fp8 and accumulator dtype
    handling stays Triton's)."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_rowwise", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, *args, **kwargs):
        rows = a.data.shape[-2]
        parts = [original(self, interpreter.TensorHandle(a.data[..., i:i + 1, :], a.dtype), b,
                          interpreter.TensorHandle(d.data[..., i:i + 1, :], d.dtype), *args, **kwargs)
                 for i in range(rows)]
        return interpreter.TensorHandle(np.concatenate([p.data for p in parts], axis=-2), parts[0].dtype)

    create_dot._rowwise = True
    builder.create_dot = create_dot

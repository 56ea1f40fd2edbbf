"""Triton's CPU interpreter with a ``tl.dot`` whose every output element depends only on its own row and column.

Why: the interpreter evaluates ``tl.dot`` as one ``np.matmul`` of the whole tile, and the BLAS behind numpy may
compute an output element differently depending on where its row sits in the matrix. OpenBLAS's AVX2 (Haswell)
sgemm, the kernel it picks on AVX2 CPUs without AVX-512 (e.g. an AMD EPYC), tiles the rows and rounds a row of one
micro-tile differently from the same row in another (1 float32 ulp; with ``OPENBLAS_CORETYPE=Prescott`` the rows
agree). A kernel whose result for a query must not depend on how many other queries share its tile
(``fused.paged_attention``: a verify block of T queries and a one-token step agree bit for bit, as they do on the
GPU, where every row of an MMA tile runs the same instructions) then differs in the interpreter by an ulp that says
nothing about the kernel. ``np.einsum`` without path optimisation never calls BLAS: it sums each element's products
over K in one order whatever the row, and on a loaded 2-core machine it is also faster than the threaded sgemm.

``exact_dot()`` patches the interpreter in this process; call it before the first kernel launch. Used by the
interpreter runs of tests/runtime/test_fused_kernels.py.
"""
from __future__ import annotations


def exact_dot() -> None:
    """Replace ``InterpreterBuilder.create_dot``: a [..., M, K] by b [..., K, N] summed by ``np.einsum`` in the
    accumulator's dtype, plus the accumulator d [..., M, N] (Triton's own create_dot with np.einsum for np.matmul;
    8-bit float inputs keep Triton's path)."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_exact", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, *args, **kwargs):
        if any(x.dtype.primitive_bitwidth == 8 and x.dtype.is_floating() for x in (a, b)):
            return original(self, a, b, d, *args, **kwargs)
        prod = np.einsum("...mk,...kn->...mn", a.data, b.data, dtype=d.data.dtype, optimize=False)
        return interpreter.TensorHandle(prod + d.data, d.dtype.scalar)

    create_dot._exact = True
    builder.create_dot = create_dot

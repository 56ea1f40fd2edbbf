"""The Triton kernel of the ``jit-new-shape`` fault (runtime/faults.py): the draft window's compact lengths
c(L) = L - floor(max(L - W, 0) / P) * P (runtime/cache/window.py) of a batch's rows, in one program.

Imported only on CUDA, when the fault runs (Triton is absent on CPU machines). Triton compiles one variant per
BLOCK (a ``tl.constexpr``: next_power_of_2 of the batch bucket) and per pointer dtype (the lengths' integer width,
int32 or int64), on the calling thread, the first time it meets one (DESIGN.md "Known-answer faults").
"""
import triton
import triton.language as tl

next_power_of_2 = triton.next_power_of_2


@triton.jit
def window_len_kernel(len_ptr, rows_ptr, out_ptr, n, W, P, BLOCK: tl.constexpr):
    """out[i] = c(len[rows[i]]) for i < n; lanes i >= n are masked (no load, no store)."""
    i = tl.arange(0, BLOCK)
    m = i < n
    r = tl.load(rows_ptr + i, mask=m, other=0)
    L = tl.load(len_ptr + r, mask=m, other=0)
    over = tl.maximum(L - W, 0)
    tl.store(out_ptr + i, (L - (over // P) * P).to(out_ptr.dtype.element_ty), mask=m)

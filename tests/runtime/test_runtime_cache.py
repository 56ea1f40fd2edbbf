"""The draft window bound (DESIGN.md "The plan bound"), the paged KV block manager, the window rectangle built both
ways, and the linear-attention state commit against recomputation."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings, strategies as st  # noqa: E402

from gaptrace.runtime.cache.paged import token_map  # noqa: E402
from gaptrace.runtime.engine.block_manager import BlockManager, CacheFullError  # noqa: E402
from gaptrace.runtime.cache.window import (compact_len, draft_window_bound, rect_width,  # noqa: E402
                                           window_start)

torch.set_num_threads(1)


def _c_plain(L: int, W: int, P: int) -> int:
    """c(L) restated with Python's max: the aligned start floor(max(0, L - W) / P) * P."""
    return L - (max(0, L - W) // P) * P


GRID = [(W, P) for W in (4, 8, 16, 24, 64, 96) for P in (1, 2, 4, 8, 16, 32) if W % P == 0]


@pytest.mark.parametrize("W,P", GRID)
def test_bound_exhaustive(W, P):
    L = np.arange(0, 6 * W + 3 * P)
    c = compact_len(L, W, P)
    s = window_start(L, W, P)
    assert (c == np.array([_c_plain(int(x), W, P) for x in L])).all()
    assert (s % P == 0).all() and (s >= 0).all()
    assert (c >= np.minimum(L, W)).all()              # the window always holds the last min(L, W) tokens
    assert (c <= np.minimum(L, W + P - 1)).all()      # the claim
    assert c.max() == (W + P - 1 if P > 1 else W)     # and it is tight
    for lag in range(0, 13):                          # any Lplan >= L (lag = Lplan - L, up to one block of 12)
        assert (c <= draft_window_bound(L + lag, W, P)).all()
    assert (draft_window_bound(L, W, P) <= rect_width(W, P)).all()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 64), st.integers(1, 40), st.integers(0, 5000), st.integers(0, 64))
def test_bound_property(P, pages, L, lag):
    W = P * pages
    c = compact_len(L, W, P)
    assert c == _c_plain(L, W, P)
    assert 0 <= c <= min(L + lag, W + P - 1) == draft_window_bound(L + lag, W, P)
    t = torch.tensor([L])  # the tensor path gives the same numbers
    assert int(compact_len(t, W, P)) == c and int(draft_window_bound(t + lag, W, P)) == min(L + lag, W + P - 1)


def test_block_manager_allocate_free_reuse():
    bm = BlockManager(num_slots=3, max_pages_per_slot=4, page_size=8, num_pages=7)
    assert bm.free_pages[0] == 1 and 0 not in bm.free_pages          # page 0 is the garbage page
    bm.ensure(0, 1)
    bm.ensure(0, 8)                                                    # still one page
    assert bm.owned[0] == [1] and bm.capacity(0) == 8
    bm.ensure(0, 17)
    assert bm.owned[0] == [1, 2, 3] and list(bm.page_table[0]) == [1, 2, 3, 0]
    bm.ensure(1, 20)
    assert bm.owned[1] == [4, 5, 6] and len(bm.free_pages) == 0
    assert bm.take_dirty() == [0, 1] and bm.take_dirty() == []
    with pytest.raises(CacheFullError):
        bm.ensure(2, 1)                                                # out of pages
    with pytest.raises(CacheFullError):
        bm.ensure(0, 33)                                               # wider than the page table
    bm.free(0)
    assert list(bm.page_table[0]) == [0, 0, 0, 0] and bm.owned[0] == [] and bm.take_dirty() == [0]
    bm.ensure(2, 10)
    assert bm.owned[2] == [1, 2]                                       # freed pages come back first, in order
    assert sorted(bm.owned[1] + bm.owned[2] + list(bm.free_pages)) == list(range(1, 7))


def test_token_map_matches_page_table():
    bm = BlockManager(num_slots=2, max_pages_per_slot=3, page_size=4)
    bm.ensure(1, 9)
    bm.ensure(0, 2)
    tm = token_map(torch.from_numpy(bm.page_table), 4, 12)
    for slot in range(2):
        for pos in range(12):
            assert int(tm[slot, pos]) == int(bm.page_table[slot, pos // 4]) * 4 + pos % 4
    # positions of one slot never share a token slot with another slot's allocated positions
    a = set(tm[1, :bm.capacity(1)].tolist())
    b = set(tm[0, :bm.capacity(0)].tolist())
    assert not a & b and len(a) == bm.capacity(1)


def _tiny_cfg(**kw):
    from gaptrace.runtime.config import ModelConfig
    base = dict(num_layers=4, num_heads=4, num_kv_heads=2, hidden_size=64, head_dim=16, vocab_size=97,
                intermediate_size=96, layer_types=["linear_attention", "full_attention"] * 2)
    base.update(kw)
    return ModelConfig(**base)


def _state(rcfg, target, draft):
    from gaptrace.runtime.engine.model_runner import ModelRunner
    return ModelRunner(target, draft, rcfg)


def test_rect_fixed_equals_rect_packed():
    from gaptrace.runtime.config import RuntimeConfig
    from gaptrace.runtime.models.model import Transformer
    from gaptrace.runtime.spec.plan import rect_fixed, rect_packed
    torch.manual_seed(0)
    m = Transformer(_tiny_cfg())
    rc = RuntimeConfig(block_size=4, page_size=4, window=8, batch_size=5, max_seq_len=64)
    run = _state(rc, m, m)
    lengths = [0, 3, 8, 13, 50]
    for slot, L in enumerate(lengths):
        run.blocks.ensure(slot, L + 4)
    run.upload_page_tables()
    run.state.lengths[:5] = torch.tensor(lengths)
    rows = torch.arange(5)
    r1, c1 = rect_fixed(run.state, rows)
    r2, c2 = rect_packed(run.state, rows)
    assert torch.equal(r1, r2) and torch.equal(c1, c2)
    tm = run.state.token_map(rows)
    for i, L in enumerate(lengths):
        c = _c_plain(L, 8, 4)
        s = L - c
        assert int(c1[i]) == c and r1.shape[1] == 8 + 4 - 1
        assert r1[i, :c].tolist() == tm[i, s:s + c].tolist() and not r1[i, c:].any()


def test_linear_state_commit_equals_recomputation():
    """Verify B tokens from a prefilled slot, commit at tau; the committed state equals the state of a from-scratch
    recurrence over prompt + accepted tokens (and differs clearly from the neighbouring positions)."""
    from gaptrace.runtime.cache.paged import make_kv_pools
    from gaptrace.runtime.config import RuntimeConfig
    from gaptrace.runtime.models.model import CacheView, Transformer
    from gaptrace.runtime.spec.commit import commit_round
    from gaptrace.runtime.spec.verify import verify_block
    torch.manual_seed(1)
    m = Transformer(_tiny_cfg()).eval()
    B = 6
    rc = RuntimeConfig(block_size=B, page_size=4, window=8, batch_size=2, max_seq_len=64, prefill_chunk=5)
    run = _state(rc, m, m)
    prompts = [torch.randint(0, 97, (n,)).tolist() for n in (11, 7)]
    drafts = torch.randint(0, 97, (2, B))
    with torch.no_grad():
        for slot, p in enumerate(prompts):
            run.blocks.ensure(slot, len(p) + B)
            run.upload_page_tables()
            run.prefill(slot, p)
        rows = torch.tensor([0, 1])
        last = run.state.last_tok[rows].clone()
        pred, states = verify_block(m, run.state, rows, drafts)
        tau = torch.tensor([4, 2])
        commit_round(run.state, rows, pred, tau, states, states)
        for i, p in enumerate(prompts):
            t = int(tau[i])
            seq = p + [int(last[i])] + drafts[i, : t - 1].tolist()   # the block tokens fed before the commit point
            n = len(seq)
            k, v = make_kv_pools(m.config, n, "cpu", torch.float32)
            slots = torch.arange(n)[None]
            _, ref = m(torch.tensor([seq]), slots, CacheView(k, v, slots, slots, slots[:, None, :] <= slots[..., None]))
            got = run.state.tgt_lin.pool[:, i]
            assert int(run.state.lengths[i]) == len(p) + t
            torch.testing.assert_close(got, ref[:, 0], rtol=1e-5, atol=1e-6)
            for wrong in (t - 2, t):                                      # the neighbours are far off
                assert (states[:, i, wrong] - ref[:, 0]).abs().max() > 1e-3

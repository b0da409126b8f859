"""What the GPU paths rely on, checked on the CPU (issue 19): a fused attention kernel on every
path (no mask where causal suffices; equal head counts wherever a mask is needed), KV buffers
with fixed addresses reused across generate calls (CUDA graphs), activation checkpointing that
changes no gradient, a padded vocabulary that is never sampled and never in the loss, and DDP
with a recurrent model trained plainly."""

import math

import pytest
import torch
import torch.nn.functional as F

import lab.model_full as model_module
from engine import Engine, StaticKVCache
from lab.model_full import attend
from test_model import STYLES, TOL, make, tokens
from test_train import common, data, run  # noqa: F401  (the parity dataset fixture)


def naive_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(hd)) v with K/V repeated to the query heads, an explicit mask (None = causal)."""
    G = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    Tq, Tk = q.size(2), k.size(2)
    if mask is None:
        mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
    return torch.softmax(s.masked_fill(~mask, float('-inf')), -1) @ v


@pytest.mark.parametrize('H,Hkv,Tq,Tk', [(4, 2, 6, 6), (6, 2, 1, 9), (4, 1, 3, 7), (4, 4, 5, 5)])
def test_attend_equals_naive(H, Hkv, Tq, Tk):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, t, 8, generator=g, dtype=torch.float64) for h, t in ((H, Tq), (Hkv, Tk), (Hkv, Tk)))
    qpos = torch.arange(Tk - Tq, Tk)
    mask = (torch.arange(Tk)[None] <= qpos[:, None]) & (torch.arange(Tk)[None] > qpos[:, None] - 3)  # a window of 3
    torch.testing.assert_close(attend(q, k, v, mask), naive_attention(q, k, v, mask), **TOL)
    if Tq == Tk or Tq == 1:
        torch.testing.assert_close(attend(q, k, v, None), naive_attention(q, k, v, None), **TOL)


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Every call of scaled_dot_product_attention that model.py makes: (query heads, key heads, mask shape)."""
    calls, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((q.size(1), k.size(1), None if attn_mask is None else tuple(attn_mask.shape), kw.get('is_causal')))
        return real(q, k, v, attn_mask=attn_mask, **kw)
    monkeypatch.setattr(model_module.F, 'scaled_dot_product_attention', spy)
    return calls


@pytest.mark.parametrize('kw', [STYLES[0], STYLES[3]], ids=['t2mlr', 'lrt'])
def test_no_mask_where_causal_suffices(sdpa_calls, kw):
    # training passes over whole sequences without a window: is_causal, never a (T, T) mask
    m = make(**kw)  # 4 query heads, 2 KV heads
    idx = tokens()
    for mode in ('plain', 'jacobi'):
        sdpa_calls.clear()
        m(idx, mode=mode, n_iter=3, n_grad=1)
        assert sdpa_calls and all(mask is None and causal for _, _, mask, causal in sdpa_calls), (mode, sdpa_calls)


@pytest.mark.parametrize('window', [0, 4])
@pytest.mark.parametrize('kw', [STYLES[0], STYLES[3]], ids=['t2mlr', 'lrt'])
def test_every_mask_has_equal_head_counts(sdpa_calls, kw, window):
    # where a mask is needed (a window, strided subsets over the buffer, the static decode step
    # over the whole buffer), the query groups are folded: as many query heads as key heads
    # (what the memory-efficient kernel takes), and K/V are never repeated
    m = make(attn_window=window, **kw)
    idx = tokens(T=10)
    m(idx, mode='interleaved', n_subsets=3)
    m(idx, mode='exact')
    m.generate(idx[:, :4], 5, temperature=0)
    Engine(m, compile=False).generate(idx[:, :4], 5, temperature=0)  # the static decode step
    masked = [c for c in sdpa_calls if c[2] is not None]
    assert masked, 'no masked call: the test would prove nothing'
    assert all(hq == hk == 2 for hq, hk, _, _ in masked), masked  # 2 = the KV heads
    assert all(hk == 2 for _, hk, _, _ in sdpa_calls)  # K/V keep their 2 heads on every path


def test_static_decode_folds_query_groups(sdpa_calls):
    # one decoded token, 4 query heads over 2 KV heads: a (2 x 1, max_len) mask per KV head
    m = make(**STYLES[0])
    cache = StaticKVCache(4, 12)
    _, state, _ = m.prefill(tokens(T=5), cache)
    sdpa_calls.clear()
    Engine(m, compile=False).decode_step(tokens(T=1), range(5, 6), state, cache)
    assert {c[:3] for c in sdpa_calls} == {(2, 2, (2, 12))}

# -----------------------------------------------------------------------------
# CUDA graphs: KV buffers with fixed addresses, one cache per shape across generate calls


def test_kv_buffers_are_static_and_reused():
    m = make(**STYLES[0]).float()
    idx = tokens(B=2, T=4)
    engine = Engine(m, compile=dict(backend='eager'))
    engine.generate(idx, 6, temperature=0)
    (cache,) = engine.caches.values()
    bufs = [t for t in cache.k + cache.v if t is not None]
    assert bufs and all(getattr(t, '_dynamo_static_input_type', None) for t in bufs)  # mark_static_address
    ptrs = [t.data_ptr() for t in bufs]
    engine.generate(idx, 6, temperature=0)
    assert list(engine.caches.values()) == [cache] and [t.data_ptr() for t in cache.k + cache.v if t is not None] == ptrs


def test_generate_compiles_once_across_calls():
    # two generations with the compiled steps: no recompilation (any would raise), identical tokens
    from torch._dynamo.utils import counters
    m = make(**STYLES[3]).float()
    idx = tokens(B=2, T=6)
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(recompile_limit=1, error_on_recompile=True):
        engine = Engine(m, compile=dict(backend='eager'))
        a = engine.generate(idx, 10, temperature=0)
        b = engine.generate(idx, 10, temperature=0)
    assert counters['stats']['unique_graphs'] == 2  # decode_step and the exact prefill's span step
    assert torch.equal(a, b) and torch.equal(a, m.generate(idx, 10, temperature=0))
    torch._dynamo.reset()

# -----------------------------------------------------------------------------
# activation checkpointing


def grads_of(m, idx, tgt, **kw):
    m.zero_grad()
    loss = m(idx, tgt, **kw)[1]
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def saved_bytes(fn):
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@pytest.mark.parametrize('kw', [STYLES[0], STYLES[3], STYLES[4]], ids=['t2mlr', 'lrt-shared', 'lrt-layerwise'])
@pytest.mark.parametrize('scheme', [dict(mode='jacobi', n_iter=4, n_grad=2), dict(mode='jacobi', n_iter=3, n_grad=3),
                                    dict(mode='interleaved', n_subsets=3, n_rounds=2)], ids=['jacobi', 'jacobi-all', 'interleaved'])
def test_recompute_changes_no_gradient(kw, scheme):
    m = make(reset_token=0, **kw).train()
    idx, tgt = tokens(T=10), tokens(T=10, seed=3)
    idx[0, 4] = 0
    loss, g = grads_of(m, idx, tgt, **scheme)
    loss_r, g_r = grads_of(m, idx, tgt, recompute=True, **scheme)
    torch.testing.assert_close(loss_r, loss, rtol=0, atol=1e-12)
    assert g.keys() == g_r.keys() and len(g) == len(list(m.parameters()))
    for n in g:
        torch.testing.assert_close(g_r[n], g[n], rtol=0, atol=1e-12, msg=n)
    # and it keeps less for backward
    full = saved_bytes(lambda: m(idx, tgt, **scheme)[1])
    assert saved_bytes(lambda: m(idx, tgt, recompute=True, **scheme)[1]) < 0.8 * full

# -----------------------------------------------------------------------------
# the padded vocabulary


def test_padded_vocabulary_is_never_sampled_nor_in_the_loss():
    m = make(vocab_pad=16, **STYLES[0]).train()  # 23 tokens -> 32 embedding rows
    assert m.wte.weight.shape[0] == 32 and m.config.padded_vocab == 32
    idx, tgt = tokens(), tokens(seed=3)
    heads = []  # the padded head's 32 logits
    hook = m.lm_head.register_forward_hook(lambda mod, args, out: heads.append(out))
    logits, loss = m(idx, tgt, mode='jacobi', n_iter=3, n_grad=1)
    hook.remove()
    full = heads[-1]
    assert logits.shape[-1] == 23 and full.shape[-1] == 32
    torch.testing.assert_close(loss, F.cross_entropy(full[..., :23].flatten(0, 1), tgt.flatten()), **TOL)
    loss.backward()
    assert m.wte.weight.grad[23:].abs().max() == 0  # the padded rows take no part (tied: input and head)
    g = torch.Generator().manual_seed(0)
    out = m.generate(idx[:, :3], 28, temperature=5.0, generator=g)  # hot sampling: every id has a chance
    assert out.max() < 23

# -----------------------------------------------------------------------------
# DDP: a recurrent model trained with train_mode='plain' (its recurrence gets no gradient)


def test_ddp_recurrent_model_trained_plainly(data, tmp_path):  # noqa: F811
    p = run(common(data, tmp_path / 'ddp', '--recurrence=t2mlr', '--train_mode=plain', '--max_iters=3',
                   '--eval_interval=100', '--gradient_accumulation_steps=2'), tmp_path, torchrun=True)
    assert 'iter 3:' in p.stdout
    assert 'each process reads 1 of the 2 micro-batches of a step' in p.stdout

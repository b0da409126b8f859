"""model.py against the naive reference (tests/reference.py), in float64."""

import pytest
import torch

from lab.model_full import GPT, GPTConfig, KVCache
from reference import naive_exact, naive_plain
from support.checkpoint import smollm2_135m_config

TOL = dict(rtol=0, atol=1e-10)
TINY = dict(block_size=32, vocab_size=23, n_layer=4, n_head=4, n_kv_head=2, n_embd=32, mlp_hidden=48)


def make(seed=0, nonidentity=True, **kw):
    """A tiny float64 model; nonidentity moves every recurrence parameter off its
    identity init so the recurrence really changes the logits."""
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = GPT(GPTConfig(**{**TINY, **kw}))
    finally:
        torch.set_default_dtype(prev)
    if nonidentity:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if GPT.is_rec_param(name):
                    p.add_(0.3 * torch.randn_like(p))  # gates, gains, projections all off init
    return model.double().eval()  # the fp32 gate scalars too


def tokens(B=3, T=12, seed=1, vocab=23):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g)


STYLES = [
    dict(recurrence='t2mlr', rec_start=1, rec_end=2),                      # middle block
    dict(recurrence='t2mlr', rec_start=0, rec_end=3),                      # full-layer recurrence
    dict(recurrence='t2mlr', rec_start=2, rec_end=2, rec_proj=False, rec_residual=False),
    dict(recurrence='lrt', rec_start=0, rec_end=2),                        # LRT-shared, both
    dict(recurrence='lrt', rec_start=1, rec_end=2, lrt_shared=False),      # LRT-layerwise
    dict(recurrence='lrt', rec_start=0, rec_end=3, lrt_inject='kv'),
    dict(recurrence='lrt', rec_start=1, rec_end=1, lrt_inject='residual'),
]
IDS = ['t2mlr-mid', 't2mlr-full', 't2mlr-noproj-nores', 'lrt-shared', 'lrt-layerwise', 'lrt-kv', 'lrt-residual']


def test_plain_forward_matches_reference():
    m = make(recurrence='none')
    idx = tokens()
    torch.testing.assert_close(m(idx)[0], naive_plain(m, idx), **TOL)


@pytest.mark.parametrize('kw', [dict(recurrence='t2mlr', rec_start=1, rec_end=2),
                                dict(recurrence='t2mlr', rec_start=0, rec_end=3),
                                dict(recurrence='lrt', rec_start=0, rec_end=2, lrt_identity_init=True),
                                dict(recurrence='lrt', rec_start=1, rec_end=3, lrt_identity_init=True, lrt_shared=False)],
                         ids=['t2mlr-mid', 't2mlr-full', 'lrt-shared', 'lrt-layerwise'])
def test_identity_init_equals_plain(kw):
    rec = make(nonidentity=False, **kw)
    plain = make(recurrence='none')
    missing, unexpected = plain.load_state_dict(rec.state_dict(), strict=False)
    assert not missing and all(GPT.is_rec_param(k) for k in unexpected)
    idx = tokens()
    ref = plain(idx)[0]
    for mode in ('exact', 'jacobi', 'interleaved', 'plain'):
        torch.testing.assert_close(rec(idx, mode=mode)[0], ref, **TOL)
    torch.testing.assert_close(rec.generate(idx[:, :5], 6, temperature=0, return_logits=True)[1],
                               plain.generate(idx[:, :5], 6, temperature=0, return_logits=True)[1], **TOL)


def test_open_gate_init():
    """rec_gate_init opens T2MLR's recurrent path at init (g_rec = the value, g_cur = 0): the state
    then changes the exact forward, where the identity init leaves it equal to the plain one."""
    shut, opened = make(nonidentity=False, recurrence='t2mlr'), make(nonidentity=False, recurrence='t2mlr', rec_gate_init=0.5)
    assert opened.fusion.g_rec.item() == 0.5 and opened.fusion.g_cur.item() == 0.0 and shut.fusion.g_rec.item() == 0.0
    idx = tokens()
    assert (opened(idx, mode='exact')[0] - opened(idx, mode='zero')[0]).abs().max() > 1e-3
    torch.testing.assert_close(shut(idx, mode='exact')[0], shut(idx, mode='zero')[0], **TOL)


def test_lrt_gate_channels_option():
    # the official LRT gate reads only the first lrt_gate_channels channels of the normed input
    m = make(recurrence='lrt', rec_start=1, rec_end=2, lrt_gate_channels=8)
    assert m.lrt.gate[0].weight.shape == (2 * 2, 8)  # (g_loc, g_fb) per KV head, for the first reading layer (1)
    idx = tokens()
    exact = m(idx, mode='exact')[0]
    torch.testing.assert_close(exact, naive_exact(m, idx), **TOL)
    out, logits = m.generate(idx[:, :5], 4, temperature=0, return_logits=True)
    torch.testing.assert_close(logits, m(out, mode='exact')[0][:, :-1], **TOL)
    with pytest.raises(ValueError, match='lrt_gate_channels'):
        GPTConfig(**{**TINY, 'recurrence': 'lrt', 'lrt_gate_channels': 33})


@pytest.mark.parametrize('kw', STYLES, ids=IDS)
def test_exact_matches_naive_reference(kw):
    m = make(**kw)
    idx = tokens()
    exact = m(idx, mode='exact')[0]
    torch.testing.assert_close(exact, naive_exact(m, idx), **TOL)
    # the recurrence must actually matter, or the comparison above proves nothing
    assert (exact - m(idx, mode='plain')[0]).abs().max() > 1e-3


@pytest.mark.parametrize('kw', [STYLES[0], STYLES[3]], ids=['t2mlr', 'lrt'])
def test_reset_token_isolates_documents(kw):
    m = make(reset_token=0, **kw)
    idx = tokens(B=2, T=14)
    idx[:, 6] = 0
    idx[1, 10] = 0
    exact = m(idx, mode='exact')[0]
    torch.testing.assert_close(exact, naive_exact(m, idx), **TOL)
    # without the reset the state leaks across the boundary and the logits change
    m.config.reset_token = None
    assert (m(idx, mode='exact')[0][:, 6:] - exact[:, 6:]).abs().max() > 1e-4


@pytest.mark.parametrize('kw', STYLES, ids=IDS)
def test_decode_matches_exact(kw):
    m = make(reset_token=0, **kw)
    prompt = tokens(B=3, T=7)
    prompt[:, 4] = 0  # the prompt crosses a document start
    out, logits = m.generate(prompt, 8, temperature=0, return_logits=True)
    assert out.shape == (3, 15) and logits.shape == (3, 14, 23)
    exact = m(out, mode='exact')[0]
    torch.testing.assert_close(logits, exact[:, :-1], **TOL)
    # greedy: each new token is the argmax of the exact logits before it
    assert torch.equal(out[:, 7:], exact[:, 6:-1].argmax(-1))


def test_decode_resets_on_generated_reset_token():
    m = make(reset_token=5, recurrence='t2mlr', rec_start=1, rec_end=2)
    prompt = tokens(B=2, T=4)
    # force the sampler to emit the reset token at some steps by sampling with top_k=1 on
    # logits we cannot control; instead check decode_step directly
    cache = KVCache(4, 10)
    logits, state, _ = m.prefill(prompt, cache)
    tok = torch.full((2, 1), 5)
    l1, _ = m.decode_step(tok, range(4, 5), state, cache)
    ref = m(torch.cat([prompt, tok], 1), mode='exact')[0][:, -1:]
    torch.testing.assert_close(l1, ref, **TOL)


def test_plain_kv_cache_decode_equals_parallel():
    m = make(recurrence='none')
    prompt = tokens(B=2, T=5)
    out, logits = m.generate(prompt, 9, temperature=0, return_logits=True)
    torch.testing.assert_close(logits, m(out)[0][:, :-1], **TOL)


@pytest.mark.parametrize('kw', [STYLES[0], STYLES[3]], ids=['t2mlr', 'lrt'])
def test_prefill_modes(kw):
    m = make(**kw)
    prompt = tokens(B=2, T=6)
    # Jacobi prefill with k >= T passes is exact
    _, lj = m.generate(prompt, 4, temperature=0, prefill='jacobi', prefill_iters=6, return_logits=True)
    _, le = m.generate(prompt, 4, temperature=0, prefill='exact', return_logits=True)
    torch.testing.assert_close(lj, le, **TOL)
    # plain prefill: the prompt's logits are the backbone's
    _, lp = m.generate(prompt, 4, temperature=0, prefill='plain', return_logits=True)
    torch.testing.assert_close(lp[:, :6], m(prompt, mode='plain')[0], **TOL)
    assert (lp[:, :6] - le[:, :6]).abs().max() > 1e-3


def test_sampling_shapes_and_topk():
    m = make(recurrence='t2mlr', rec_start=1, rec_end=2).float()
    g = torch.Generator().manual_seed(0)
    out = m.generate(tokens(B=4, T=3), 10, temperature=0.8, top_k=1, generator=g)
    greedy = m.generate(tokens(B=4, T=3), 10, temperature=0)
    assert out.shape == (4, 13) and torch.equal(out, greedy)  # top_k=1 is greedy


@pytest.mark.parametrize('kw,msg', [
    (dict(recurrence='t2mlr', rec_start=3, rec_end=1), 'rec_end=1 < rec_start=3'),
    (dict(recurrence='t2mlr', rec_start=0, rec_end=7), 'rec_end=7 is out of range'),
    (dict(recurrence='lrt', rec_start=-2, rec_end=1), 'rec_start=-2 is out of range'),
    (dict(recurrence='gru'), "unknown recurrence 'gru'"),
    (dict(recurrence='lrt', lrt_inject='q'), "unknown lrt_inject 'q'"),
    (dict(n_head=3), 'not divisible by n_head'),
    (dict(n_kv_head=3), 'not divisible by n_kv_head'),
    (dict(reset_token=99), 'reset_token=99'),
])
def test_bad_config_errors(kw, msg):
    with pytest.raises(ValueError, match=msg.replace('(', r'\(')):
        GPTConfig(**{**TINY, **kw})


def test_too_long_and_bad_mode():
    m = make(recurrence='t2mlr', rec_start=1, rec_end=2)
    with pytest.raises(ValueError, match='exceeds block_size'):
        m(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        m(tokens(), mode='fast')
    with pytest.raises(ValueError, match='exceeds block_size'):
        m.generate(tokens(T=30), 5)


def test_smollm2_shape_and_param_groups():
    c = smollm2_135m_config(recurrence='t2mlr', rec_start=12, rec_end=17)
    with torch.device('meta'):
        m = GPT(c)
    plain = sum(p.numel() for n, p in m.named_parameters() if not GPT.is_rec_param(n))
    extra = sum(p.numel() for n, p in m.named_parameters() if GPT.is_rec_param(n))
    assert plain == 134_515_008  # SmolLM2-135M's parameter count
    d = c.n_embd
    assert extra == 5 * d * d + 2 * d + 2  # W_rec, f_cur, f_rec (+ biases) and two scalar gates
    def by(groups):  # (decayed, lr_mult) -> parameters
        out = {}
        for g in groups:
            k = (g['weight_decay'] > 0, g['lr_mult'])
            out[k] = out.get(k, 0) + sum(p.numel() for p in g['params'])
        return out
    groups = m.param_groups(weight_decay=0.1, rec_lr_mult=100.0)
    assert by(groups)[(True, 100.0)] == 5 * d * d and by(groups)[(False, 100.0)] == 2 * d + 2
    assert all(p.dim() >= 2 for g in groups if g['weight_decay'] > 0 for p in g['params'])
    gated = m.param_groups(weight_decay=0.1, rec_lr_mult=100.0, gate_lr_mult=0.1)  # the scalar gates apart
    assert by(gated)[(True, 100.0)] == 5 * d * d and by(gated)[(False, 100.0)] == 2 * d and by(gated)[(False, 10.0)] == 2
    assert len(gated) == len(groups)  # the groups by kind, whatever the multipliers: a run resumes with others
    from support.flops import flops_per_token, rec_flops
    assert flops_per_token(c, 512, 'jacobi', 16, 4) > flops_per_token(c, 512, 'plain') * 1.5
    assert rec_flops(c) == 2 * 5 * d * d


def test_checkpoint_roundtrip_and_errors(tmp_path):
    from dataclasses import asdict
    from support.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    m = make(**STYLES[0])
    path = str(tmp_path / 'ckpt.pt')
    save_checkpoint({'model': m.state_dict(), 'model_args': asdict(m.config)}, path)
    torch.set_default_dtype(torch.float64)  # float64 RoPE tables, as make() builds them
    try:
        m2, _ = load_checkpoint(path)
    finally:
        torch.set_default_dtype(torch.float32)
    idx = tokens()
    torch.testing.assert_close(m2.double()(idx)[0], m(idx)[0], **TOL)
    with pytest.raises(CheckpointError, match='no checkpoint'):
        load_checkpoint(str(tmp_path / 'nope.pt'))
    (tmp_path / 'bad.pt').write_bytes(b'not a checkpoint')
    with pytest.raises(CheckpointError, match='not a readable checkpoint'):
        load_checkpoint(str(tmp_path / 'bad.pt'))
    torch.save({'model': m.state_dict(), 'model_args': {**asdict(m.config), 'n_layer': 3}}, path)
    with pytest.raises(CheckpointError, match='weights do not fit'):
        load_checkpoint(path)
    torch.save({'model': {}, 'model_args': {**asdict(m.config), 'rec_end': 9}}, path)
    with pytest.raises(CheckpointError, match='invalid model args'):
        load_checkpoint(path)

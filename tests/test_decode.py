"""The static decode step (fixed-size KV buffer written in place, tensor position):
eager against the naive float64 reference, compiled against eager, and compiled
exactly once over a long generation."""

import pytest
import torch

import engine as engine_module
from engine import Engine, StaticKVCache
from lab.model_full import GPT, GPTConfig
from reference import naive_exact
from test_model import TOL, make, tokens

# reset token 0 and a window shorter than the sequences below, in every style
DECODE_STYLES = [
    dict(recurrence='t2mlr', rec_start=1, rec_end=2),
    dict(recurrence='lrt', rec_start=0, rec_end=2),                    # LRT-shared
    dict(recurrence='lrt', rec_start=1, rec_end=2, lrt_shared=False),  # LRT-layerwise
    dict(recurrence='none'),
]
DECODE_IDS = ['t2mlr', 'lrt-shared', 'lrt-layerwise', 'plain']


def forced_decode(m, seq, P):
    """Prefill seq[:, :P], then feed seq[:, P:] one token at a time through the engine's static
    decode_step, run eagerly (teacher forcing). Returns the logits at every position (B, T, V)."""
    B, T = seq.shape
    engine = Engine(m, compile=False)
    cache = StaticKVCache(m.config.n_layer, T)
    logits, state, _ = m.prefill(seq[:, :P], cache)
    out = [logits]
    for t in range(P, T):
        lt, state = engine.decode_step(seq[:, t:t + 1], torch.tensor([t]), state, cache)
        out.append(lt)
    return torch.cat(out, 1)


@pytest.mark.parametrize('kw', DECODE_STYLES, ids=DECODE_IDS)
@pytest.mark.parametrize('window', [0, 5])
def test_static_decode_matches_naive_reference(kw, window):
    m = make(reset_token=0, attn_window=window, **kw)
    seq = tokens(B=2, T=14)
    seq[:, 3] = 0    # a document start in the prompt
    seq[0, 9] = 0    # and one among the decoded tokens
    got = forced_decode(m, seq, P=5)
    torch.testing.assert_close(got, naive_exact(m, seq), **TOL)


def tiny32(rec):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=96, vocab_size=64, n_layer=2, n_head=2, n_kv_head=1, n_embd=32, mlp_hidden=64,
                    recurrence=rec, rec_start=0, rec_end=1, reset_token=3, attn_window=20)
    m = GPT(cfg).eval()
    with torch.no_grad():  # recurrence parameters off their identity init
        for name, p in m.named_parameters():
            if GPT.is_rec_param(name):
                p.add_(0.3 * torch.randn_like(p))
    return m


@pytest.mark.parametrize('rec', ['t2mlr', 'lrt'])
def test_compiled_decode_compiles_once_and_equals_eager(rec):
    """64 decoded tokens (and an 8-token exact prefill) with at most one compilation per
    step function: any recompilation (a shape or guard that depends on the position)
    raises. Then greedy tokens identical to eager, logits equal to float32 rounding."""
    m = tiny32(rec)
    idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    with torch._dynamo.config.patch(recompile_limit=1, error_on_recompile=True):
        out_c, lc = Engine(m).generate(idx, 65, temperature=0, return_logits=True)
    assert counters['stats']['unique_graphs'] == 2  # decode_step + exact prefill's span step, no graph break
    out_e, le = m.generate(idx, 65, temperature=0, return_logits=True)
    assert torch.equal(out_c, out_e)
    torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def test_compile_failure_is_one_line(monkeypatch, capsys):
    """A torch without a working compiler backend fails at the first compiled call: the
    scripts' compile_errors() makes it one line that says how to run without compiling, and
    lets every other error through."""
    from torch._inductor.exc import InvalidCxxCompiler
    from configurator import compile_errors

    def broken_compile(fn, **kw):
        def call(*args):
            raise InvalidCxxCompiler()  # what a machine without a C++ compiler raises
        return call
    monkeypatch.setattr(engine_module.torch, 'compile', broken_compile)
    m = tiny32('t2mlr')
    with pytest.raises(SystemExit) as e, compile_errors():
        Engine(m).generate(torch.zeros(1, 4, dtype=torch.long), 3, temperature=0)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count('\n') == 1 and '--compile=False' in err and 'InvalidCxxCompiler' in err
    with pytest.raises(ValueError, match='exceeds block_size'), compile_errors():  # not the compiler's: untouched
        Engine(m).generate(torch.zeros(1, 4, dtype=torch.long), 300)


@pytest.mark.parametrize('kw', [DECODE_STYLES[0], DECODE_STYLES[2]], ids=['t2mlr', 'lrt-layerwise'])
def test_old_checkpoint_with_separate_projections_loads(tmp_path, kw):
    """Checkpoints written before the projections were fused (wq/wk/wv, w_gate/w_up,
    lrt_fb_k/lrt_fb_v as separate matrices) load into the fused model unchanged."""
    from dataclasses import asdict
    from support.checkpoint import load_checkpoint, save_checkpoint
    m = make(**kw)
    c = m.config
    d, dkv, hid = c.n_embd, c.n_kv_head * (c.n_embd // c.n_head), c.mlp_hidden
    old = {}
    for k, w in m.state_dict().items():  # the old layout, written by hand
        if k.endswith('attn.wqkv.weight'):
            pre = k[:-len('wqkv.weight')]
            old[pre + 'wq.weight'], old[pre + 'wk.weight'], old[pre + 'wv.weight'] = w.split([d, dkv, dkv])
        elif k.endswith('mlp.w_gu.weight'):
            pre = k[:-len('w_gu.weight')]
            old[pre + 'w_gate.weight'], old[pre + 'w_up.weight'] = w.split([hid, hid])
        elif k.startswith('lrt.w_fb.'):
            j = k.split('.')[2]
            old[f'lrt_fb_k.{j}.weight'], old[f'lrt_fb_v.{j}.weight'] = w.split([dkv, dkv])
        elif k.startswith('lrt.gate.'):  # the layout before LRT was one module: per block
            old[f'h.{int(k.split(".")[2]) + c.rec_start}.attn.lrt_gate.weight'] = w
        elif k in ('lrt.alpha', 'lrt.gamma'):
            for j, v in enumerate(w):
                old[f'h.{j + c.rec_start}.lrt_{k[4:]}'] = v
        else:
            old[k] = w
    path = str(tmp_path / 'old.pt')
    save_checkpoint({'model': old, 'model_args': asdict(c)}, path)
    torch.set_default_dtype(torch.float64)
    try:
        m2, _ = load_checkpoint(path)
    finally:
        torch.set_default_dtype(torch.float32)
    idx = tokens()
    torch.testing.assert_close(m2.double()(idx)[0], m(idx)[0], **TOL)

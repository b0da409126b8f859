"""model.py, the textbook model: every path against the naive reference (tests/reference.py) in
float64, and the research model (lab/model_full.py) equal to it at the settings they share."""

import ast
import os
import shutil
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch

import model as textbook
from lab import model_full as lab
from reference import full_model, naive_exact, naive_interleaved, naive_plain

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = dict(rtol=0, atol=1e-10)     # against the reference: another order of operations
SAME = dict(rtol=0, atol=1e-12)    # lab against textbook: the same operations
TINY = dict(block_size=32, vocab_size=23, n_layer=4, n_head=4, n_kv_head=2, n_embd=32)
STYLES = [dict(recurrence='t2mlr', rec_start=1, rec_end=2),                    # a middle span
          dict(recurrence='t2mlr', rec_start=0, rec_end=3, attn_window=5),     # every block, a window
          dict(recurrence='t2mlr', rec_start=2, rec_end=2, reset_token=3),     # one block, document starts
          dict(recurrence='lrt', rec_start=0, rec_end=2),                      # LRT-shared
          dict(recurrence='lrt', rec_start=1, rec_end=3, lrt_shared=False, attn_window=4, reset_token=3)]
IDS = ['t2mlr-mid', 't2mlr-full-window', 't2mlr-one-reset', 'lrt-shared', 'lrt-layerwise-window-reset']


def make(seed=0, **kw):
    """A tiny float64 textbook model, every recurrence parameter moved off its init (so the
    state really changes the logits)."""
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        m = textbook.GPT(textbook.GPTConfig(**{**TINY, **kw}))
    finally:
        torch.set_default_dtype(prev)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if m.is_rec_param(name):
                p.add_(0.3 * torch.randn_like(p))
    return m.double().eval()


def twin(m):
    """The research model at the textbook model's settings, with its weights."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        other = lab.GPT(lab.GPTConfig(**asdict(m.config)))
    finally:
        torch.set_default_dtype(prev)
    other.load_state_dict(m.state_dict())
    return other.double().eval()


def tokens(B=3, T=12, seed=1):
    idx = torch.randint(0, 23, (B, T), generator=torch.Generator().manual_seed(seed))
    idx[1, 5] = 3  # a document start inside a row (reset_token=3)
    return idx


def test_plain_matches_reference():
    m, idx = make(recurrence='none'), tokens()
    torch.testing.assert_close(m(idx)[0], naive_plain(m, idx), **TOL)


@pytest.mark.parametrize('kw', STYLES, ids=IDS)
def test_exact_matches_reference(kw):
    m, idx = make(**kw), tokens()
    logits, loss = m(idx, idx, mode='exact')
    ref = naive_exact(m, idx)
    torch.testing.assert_close(logits, ref, **TOL)
    torch.testing.assert_close(loss, textbook.ce_loss(ref, idx), **TOL)
    assert (m(idx, mode='zero')[0] - logits).abs().max() > 1e-3  # the state carries something


@pytest.mark.parametrize('kw', STYLES, ids=IDS)
def test_zero_state_matches_reference(kw):
    m, idx = make(**kw), tokens()
    zero = torch.zeros(idx.size(1), m.config.n_embd, dtype=torch.float64)
    ref = torch.stack([full_model(m, row, zero)[0] for row in idx])
    torch.testing.assert_close(m(idx, mode='zero')[0], ref, **TOL)


@pytest.mark.parametrize('kw', STYLES, ids=IDS)
@pytest.mark.parametrize('init', ['plain', 'exact'])
def test_jacobi_matches_reference(kw, init):
    """'plain': exact at positions 0..D-1, exact everywhere once D >= T; 'exact': exact at any D."""
    idx, T = tokens(), 12
    m = make(**kw, jacobi_init=init)
    ref = naive_exact(m, idx)
    for D in (1, 3, T):
        logits = m(idx, mode='jacobi', n_iter=D, n_grad=min(D, 2))[0]
        exact_to = T if init == 'exact' or D >= T else D
        torch.testing.assert_close(logits[:, :exact_to], ref[:, :exact_to], **TOL)
        if exact_to < T:
            assert (logits[:, exact_to:] - ref[:, exact_to:]).abs().max() > 1e-6  # an approximation there


@pytest.mark.parametrize('kw', STYLES, ids=IDS)
@pytest.mark.parametrize('S', [1, 2, 5, 12])
def test_interleaved_matches_reference(kw, S):
    m, idx = make(**kw), tokens()
    logits = m(idx, mode='interleaved', n_subsets=S)[0]
    torch.testing.assert_close(logits, naive_interleaved(m, idx, S), **TOL)
    if S == 12:  # S = T: the exact recurrence
        torch.testing.assert_close(logits, naive_exact(m, idx), **TOL)


@pytest.mark.parametrize('kw', STYLES + [dict(recurrence='none')], ids=IDS + ['plain'])
def test_prefill_and_decode_match_reference(kw):
    """The prompt prefilled, then one forward pass per token (decode_step): the logits of the exact
    recurrence over the whole sequence; generate's greedy tokens are the argmax of those logits."""
    m, idx = make(**kw), tokens()
    ref = naive_exact(m, idx) if kw['recurrence'] != 'none' else naive_plain(m, idx)
    cache = m.new_cache(3, 12)
    logits, state, _ = m.prefill(idx[:, :4], cache)
    steps = [logits]
    for t in range(4, 12):
        out, state = m.decode_step(idx[:, t:t + 1], range(t, t + 1), state, cache)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), ref, **TOL)
    out, gen_logits = m.generate(idx[:, :4], 6, temperature=0, return_logits=True)
    torch.testing.assert_close(out[:, 4:], gen_logits[:, 3:].argmax(-1))  # the prompt's logits, then one a token
    full = naive_exact(m, out) if kw['recurrence'] != 'none' else naive_plain(m, out)
    torch.testing.assert_close(gen_logits, full[:, :-1], **TOL)


# ---------------------------------------------------------------------------
# the research model equals the textbook model at the settings they share

SCHEMES = [dict(mode='exact'), dict(mode='zero'), dict(mode='plain'), dict(mode='jacobi', n_iter=3, n_grad=1),
           dict(mode='jacobi', n_iter=12, n_grad=12), dict(mode='interleaved', n_subsets=2),
           dict(mode='interleaved', n_subsets=12)]


@pytest.mark.parametrize('kw', STYLES, ids=IDS)
@pytest.mark.parametrize('init', ['plain', 'exact'])
def test_lab_model_equals_textbook(kw, init):
    """Weights copied: the same logits, losses and gradients (1e-12, float64) on every scheme."""
    m = make(**kw, jacobi_init=init).train()
    other = twin(m).train()
    idx = tokens()
    for scheme in SCHEMES:
        if init == 'exact' and scheme['mode'] != 'jacobi':
            continue
        grads = []
        for model in (m, other):
            model.zero_grad()
            logits, loss = model(idx, idx, **scheme)
            loss.backward()
            grads.append((logits.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
        (l1, s1, g1), (l2, s2, g2) = grads
        torch.testing.assert_close(l2, l1, **SAME)
        torch.testing.assert_close(s2, s1, **SAME)
        assert g1.keys() == g2.keys() and g1, scheme
        for n in g1:
            torch.testing.assert_close(g2[n], g1[n], **SAME, msg=f"{scheme} {n}")


@pytest.mark.parametrize('kw', STYLES, ids=IDS)
def test_lab_model_generates_the_textbook_tokens(kw):
    m = make(**kw)
    other = twin(m)
    prompt = tokens()[:, :5]
    a = m.generate(prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(0))
    b = other.generate(prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b)


def test_init_is_the_lab_models():
    """Built from the same seed, the two models draw the same weights: a textbook config trains
    the same run under either (the lab's configs keep their numbers)."""
    kw = dict(TINY, recurrence='t2mlr', rec_start=0, rec_end=3, vocab_pad=16, rec_gate_init=1.0)
    torch.manual_seed(3)
    a = textbook.GPT(textbook.GPTConfig(**kw))
    torch.manual_seed(3)
    b = lab.GPT(lab.GPTConfig(**kw))
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


# ---------------------------------------------------------------------------
# model.py stands alone

def test_model_py_imports_torch_only(tmp_path):
    tree = ast.parse(open(os.path.join(ROOT, 'model.py')).read())
    mods = {(n.names[0].name if isinstance(n, ast.Import) else n.module).split('.')[0]
            for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))}
    assert mods <= {'torch', 'math', 'dataclasses', 'typing'}, mods
    shutil.copy(os.path.join(ROOT, 'model.py'), tmp_path)  # copied out alone, it builds and trains a step
    code = ("import torch, model; m = model.GPT(model.GPTConfig(vocab_size=11, recurrence='t2mlr', block_size=16)); "
            "x = torch.randint(0, 11, (2, 16)); loss = m(x, x, mode='jacobi')[1]; loss.backward(); "
            "print(m.generate(x[:, :3], 4, temperature=0).shape)")
    out = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, 'PYTHONPATH': ''})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'torch.Size([2, 7])'


@pytest.mark.parametrize('kw, msg', [(dict(n_head=5), 'n_head=5'), (dict(recurrence='x'), "'x'"),
                                     (dict(recurrence='t2mlr', rec_start=3, rec_end=1), 'rec_start=3'),
                                     (dict(jacobi_init='zero'), "'zero'"), (dict(vocab_pad=0), 'vocab_pad=0')])
def test_bad_config_is_one_value_error(kw, msg):
    with pytest.raises(ValueError, match=msg):
        textbook.GPTConfig(**{**TINY, **kw})


def test_bad_inputs_are_value_errors():
    m = make(recurrence='t2mlr')
    for call, msg in [(lambda: m(tokens(T=40)), 'block_size'), (lambda: m(tokens(), mode='block'), "'block'"),
                      (lambda: m(tokens(), mode='interleaved', n_subsets=13), 'n_subsets=13'),
                      (lambda: m(tokens(), mode='jacobi', n_iter=2, n_grad=3), 'n_grad=3'),
                      (lambda: m.generate(tokens().float(), 2), 'integer'),
                      (lambda: m.generate(tokens() + 30, 2), 'vocabulary'),
                      (lambda: m.generate(tokens(), 30), 'block_size'),
                      (lambda: m.generate(tokens(), 2, temperature=-1), 'temperature'),
                      (lambda: m.prefill(tokens(), m.new_cache(3, 12), 'jacobi'), 'jacobi')]:
        with pytest.raises(ValueError, match=msg):
            call()

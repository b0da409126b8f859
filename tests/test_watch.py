"""Watching the recurrence: the zero-state forward (mode='zero'), the reliance numbers and gate
statistics of train.py's evaluation, and lab/evaluate.py --trace, checked against tests/reference.py."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

try:
    import matplotlib  # noqa: F401
    HAVE_MPL = True
except ImportError:
    HAVE_MPL = False

import prepare
import reference as ref
from lab.model_full import GPT, GPTConfig
from support import dataset
from support.checkpoint import save_checkpoint
from support.diagnostics import trace_values

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}


def tiny(recurrence, dtype=torch.float64, seed=0, trained=True, **kw):
    """A small model; trained=True moves the recurrence away from identity (nonzero gates,
    random LRT gate weights), so that the state matters."""
    torch.manual_seed(seed)
    args = dict(block_size=24, vocab_size=5, n_layer=3, n_head=2, n_kv_head=1, n_embd=16,
                recurrence=recurrence, rec_start=1, rec_end=1)
    model = GPT(GPTConfig(**{**args, **kw})).to(dtype).eval()
    if trained:
        with torch.no_grad():
            if model.fusion is not None:
                model.fusion.g_cur.fill_(0.7)
                model.fusion.g_rec.fill_(-1.3)
            if model.lrt is not None:
                for gate in model.lrt.gate or []:
                    gate.weight.normal_(0, 0.5)
                if model.lrt.gamma is not None:
                    model.lrt.gamma.fill_(0.8)
                    model.lrt.alpha.fill_(0.9)
    return model


def naive_states(model, ids):
    """ids: (T,). The states each position reads under the exact recurrence, computed the
    naive way (tests/reference.py: the whole model on every prefix). -> (T, d)."""
    c = model.config
    states, prev = [], torch.zeros(c.n_embd, dtype=model.wte.weight.dtype)
    for t in range(ids.numel()):
        states.append(prev)
        S = torch.stack(states)
        _, h_e = ref.full_model(model, ids[:t + 1], S)
        prev = ref.next_state(model, h_e[t], S[t])
    return torch.stack(states)


# -----------------------------------------------------------------------------
# the zero-state forward

@pytest.mark.parametrize('recurrence,kw', [('t2mlr', {}), ('t2mlr', dict(rec_start=0, rec_end=2)),
                                           ('lrt', {}), ('lrt', dict(lrt_shared=False, lrt_inject='kv'))])
def test_zero_state_equals_explicit_zero_state(recurrence, kw):
    model = tiny(recurrence, **kw)
    idx = torch.randint(5, (2, 11), generator=torch.Generator().manual_seed(1))
    y = torch.randint(5, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, loss = model(idx, y, mode='zero')
        zeros = torch.zeros(11, model.config.n_embd, dtype=torch.float64)
        want = torch.stack([ref.full_model(model, ids, zeros)[0] for ids in idx])  # naive, state_in = 0
        # and run_blocks fed an explicit zero state, in parallel
        x = model.run_blocks(model.wte(idx), 0, model.config.n_layer - 1, range(11), model.state_input(torch.zeros(2, 11, 16, dtype=torch.float64)))
        par, par_loss = model.head(x, y)
        exact, exact_loss = model(idx, y, mode='exact')
    torch.testing.assert_close(logits, want, atol=1e-10, rtol=0)
    torch.testing.assert_close(logits, par, atol=1e-10, rtol=0)
    torch.testing.assert_close(loss, par_loss, atol=1e-10, rtol=0)
    assert (exact - logits).abs().max() > 1e-3  # the state matters in this model: the test can fail


def test_zero_state_with_rec_mask():
    model = tiny('t2mlr')
    idx = torch.randint(5, (2, 9), generator=torch.Generator().manual_seed(3))
    on = torch.rand(2, 9, generator=torch.Generator().manual_seed(4)) > 0.4
    with torch.no_grad():
        got = model(idx, mode='zero', rec_mask=on)[0]
    zeros = torch.zeros(9, 16, dtype=torch.float64)
    want = torch.stack([ref.full_model(model, ids, zeros, m)[0] for ids, m in zip(idx, on)])
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize('recurrence,kw', [('t2mlr', {}), ('lrt', dict(lrt_identity_init=True)),
                                           ('lrt', dict(lrt_identity_init=True, lrt_shared=False))])
def test_identity_init_reliance_gap_is_zero(recurrence, kw):
    # at identity init the state is multiplied by exact zeros (tanh(0), gamma = 0, W_fb = 0), so
    # mode='zero' (every token reads 0, the span run in parallel) equals the exact recurrence to
    # float64 rounding; a trained model's state moves the logits far more
    model = tiny(recurrence, dtype=torch.float64, trained=False, **kw)
    idx = torch.randint(5, (3, 13), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a, la = model(idx, idx, mode='exact')
        b, lb = model(idx, idx, mode='zero')
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
        torch.testing.assert_close(la, lb, atol=1e-12, rtol=0)
        trained = tiny(recurrence, dtype=torch.float64, **kw)
        assert (trained(idx, mode='exact')[0] - trained(idx, mode='zero')[0]).abs().max() > 1e-3


@pytest.mark.parametrize('recurrence', ['t2mlr', 'lrt'])
def test_watching_changes_nothing(recurrence):
    from support.diagnostics import values, watch
    model = tiny(recurrence, dtype=torch.float32)
    idx = torch.randint(5, (2, 7), generator=torch.Generator().manual_seed(6))
    want = model(idx, mode='exact')[0]
    with watch(model) as rec:
        got = model(idx, mode='exact')[0]
    assert torch.equal(got, want) and rec['state'][0].shape == (2, 1, 16)  # the span runs token by token
    assert values(rec, 'state').shape == (2, 7, 16)
    hooks = lambda: sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    assert hooks() == 0  # removed on exit: no leftovers
    with watch(model):
        assert hooks() > 0


# -----------------------------------------------------------------------------
# train.py: reliance and gate statistics in every evaluation

@pytest.fixture(scope='module')
def parity(tmp_path_factory):
    root = tmp_path_factory.mktemp('parity')
    prepare.main(['s5', '--group=Z2', '--n_train=64', '--n_val=8', '--n_test=8', '--train_len=8', '--test_lens=12',
                  f'--out_dir={root}/s5_Z2'])
    return root


def train(args, data, out, script='train.py'):
    cmd = [sys.executable, os.path.join(ROOT, script), '--device=cpu', '--n_layer=2', '--n_embd=16', '--n_head=2', '--n_kv_head=1',
           '--batch_size=4', '--eval_iters=1', '--eval_examples=8', '--log_interval=1',
           f'--dataset={data}/s5_Z2', f'--out_dir={out}', *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout, [json.loads(l) for l in open(out / 'log.jsonl')]


@pytest.mark.parametrize('recurrence', ['t2mlr', 'lrt'])
def test_train_reports_reliance_and_gates(parity, tmp_path, recurrence):
    extra = ['--train_mode=jacobi', '--n_iter=2', '--n_grad=1'] if recurrence == 't2mlr' else \
        ['--train_mode=interleaved', '--lrt_identity_init=True', '--rec_start=0', '--rec_end=1']
    out, log = train([f'--recurrence={recurrence}', '--max_iters=2', '--eval_interval=2', *extra],
                     parity, tmp_path, 'train.py' if recurrence == 't2mlr' else 'lab/train.py')  # (lrt_identity_init: the lab's)
    evals = [r for r in log if r['type'] == 'eval']
    assert [r['iter'] for r in evals] == [0, 2] and [r['iter'] for r in log if r['type'] == 'gates'] == [1, 2]
    first = evals[0]  # at identity init (T2MLR always, LRT with lrt_identity_init): no reliance at all
    for split in ('train', 'val'):
        assert first[f'{split}/loss_zero'] == first[f'{split}/loss_exact']
    for split in ('val', 'test', 'test_12'):
        assert (first[f'{split}/acc_zero'], first[f'{split}/em_zero']) == (first[f'{split}/acc_exact'], first[f'{split}/em_exact'])
    if recurrence == 't2mlr':
        assert first['gates/cur'] == first['gates/rec'] == first['gates/tanh_g_cur'] == 0.0
        assert evals[1]['gates/tanh_g_rec'] != 0.0  # the gates move with training
    else:
        assert first['gates/gamma'] == first['gates/gamma.0'] == first['gates/gamma.1'] == 0.0
        assert first['gates/alpha'] == 1.0 and first['gates/g_loc'] == first['gates/g_fb'] == 1.0  # 2 sigmoid(0)
        assert evals[1]['gates/gamma.1'] != 0.0
    assert 'zero-state' in out and 'reliance +0.0000' in out and '(zero state)' in out and 'gates' in out


# -----------------------------------------------------------------------------
# lab/evaluate.py --trace

def naive_trace_position(model, ids, t):
    """The trace values at position t, from the weights with explicit matmuls (float64)."""
    c = model.config
    S = naive_states(model, ids)
    x = model.wte.weight[ids]
    out = {'state_norm': S[t].norm().item()}
    for i in range(c.n_layer):
        if c.recurrence == 't2mlr' and i == c.rec_start:
            f = model.fusion
            r = S @ f.w_rec.weight.T
            hr = torch.cat([x, r], -1)[t]
            for name, lin, g in (('cur', f.f_cur, f.g_cur), ('rec', f.f_rec, f.g_rec)):
                gate = torch.tanh(g) * torch.sigmoid(hr @ lin.weight.T + lin.bias)
                out[f'gate_{name}_mean'], out[f'gate_{name}_std'] = gate.mean().item(), gate.std(correction=0).item()
            x = ref.fuse(model, x, S)
        if c.recurrence == 'lrt' and i >= c.rec_start:
            b, j = model.h[i], i - c.rec_start
            alpha, gamma, W_g = model.lrt.alpha[j], model.lrt.gamma[j], model.lrt.gate[j].weight
            out[f'gamma_m.{i}'] = (gamma * S[t]).norm().item()
            out[f'alpha_x.{i}'] = (alpha * x[t]).norm().item()
            a = ref.rms(alpha * x + gamma * S, b.ln_1.weight, c.norm_eps)[t]
            g = 2 * torch.sigmoid(a[..., :W_g.shape[1]] @ W_g.T)  # first the Hkv local gates, then the feedback ones
            out[f'g_loc.{i}'], out[f'g_fb.{i}'] = g[:c.n_kv_head].mean().item(), g[c.n_kv_head:].mean().item()
        x = ref.block(model, i, x, S if c.recurrence == 'lrt' and i >= c.rec_start else None)
    logits = ref.rms(x, model.ln_f.weight, c.norm_eps) @ model.lm_head.weight.T
    out['pred'] = logits[t].argmax().item()
    zero_logits = ref.full_model(model, ids, torch.zeros_like(S))[0]
    out['pred_zero'] = zero_logits[t].argmax().item()
    return out


@pytest.mark.parametrize('recurrence', ['t2mlr', 'lrt'])
def test_trace_values_match_recomputation(recurrence):
    model = tiny(recurrence)
    ids = torch.tensor([1, 4, 0, 2, 2, 3, 1, 0, 4])
    cols = trace_values(model, ids[None], labels=list(range(9)))
    for t in (0, 6):
        want = naive_trace_position(model, ids, t)
        if recurrence == 'lrt':
            assert {k for k in cols if k.startswith(('g_', 'gamma', 'alpha'))} == {k for k in want if '.' in k}
        for k, v in want.items():
            assert cols[k][t] == pytest.approx(v, abs=1e-10), (k, t)
    assert cols['label'] == list(range(9)) and cols['token'] == ids.tolist()
    # the state's first principal coordinate, fitted on the nonzero states (all but t = 0), up to sign
    import numpy as np
    S = naive_states(model, ids).detach().numpy()
    mu = S[1:].mean(0)
    pc = (S - mu) @ np.linalg.svd(S[1:] - mu)[2][0]
    np.testing.assert_allclose(np.abs(cols['state_pc1']), np.abs(pc), atol=1e-8, rtol=0)


@pytest.fixture(scope='module')
def ckpts(parity, tmp_path_factory):
    root = tmp_path_factory.mktemp('ckpts')
    for name, rec in (('t2mlr', 't2mlr'), ('plain', 'none')):
        m = tiny(rec, dtype=torch.float32, vocab_size=2, block_size=12)
        save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config),
                         'config': {'dataset': 's5_Z2', 'data_root': str(parity)}}, str(root / f'{name}.pt'))
    return root


def evaluate(*args, block_matplotlib=False):
    if block_matplotlib:  # as if matplotlib were not installed
        code = ("import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = ['lab/evaluate.py'] + sys.argv[1:]; "
                "runpy.run_path('lab/evaluate.py', run_name='__main__')")
        cmd = [sys.executable, '-c', code, *args]
    else:
        cmd = [sys.executable, os.path.join(ROOT, 'lab', 'evaluate.py'), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)


def test_trace_cli_json(parity, ckpts, tmp_path):
    r = evaluate(f'--init_from={ckpts}/t2mlr.pt', f'--trace={tmp_path}/tr.png', '--trace_split=test', '--trace_row=1')
    assert r.returncode == 0, r.stderr
    got = json.load(open(tmp_path / 'tr.json'))
    cols = got['columns']
    x, y = dataset.load_split(str(parity / 's5_Z2'), 'test')
    assert cols['token'] == x[1].tolist() and cols['label'] == y[1].tolist()  # row 1 and its labels
    assert got['recurrence'] == 't2mlr' and len(cols['pos']) == 8
    assert os.path.isfile(tmp_path / 'tr.png') or not HAVE_MPL  # the plot needs the optional matplotlib
    # the JSON holds what the float64 recomputation gives (the model ran in float32)
    from support.checkpoint import load_checkpoint
    model, _ = load_checkpoint(str(ckpts / 't2mlr.pt'))
    model = model.double().eval()
    ids = torch.tensor(cols['token'])
    want = naive_trace_position(model, ids, 5)
    for k in ('state_norm', 'gate_cur_mean', 'gate_cur_std', 'gate_rec_mean', 'gate_rec_std'):
        assert cols[k][5] == pytest.approx(want[k], abs=1e-5), k
    assert len(r.stdout.strip().splitlines()) == 1 + 8  # the table: header + one row per position


def test_trace_without_matplotlib(ckpts, tmp_path):
    r = evaluate(f'--init_from={ckpts}/t2mlr.pt', f'--trace={tmp_path}/tr.png', '--trace_split=test', block_matplotlib=True)
    assert r.returncode == 0 and 'Traceback' not in r.stderr, r.stderr
    notes = [l for l in r.stderr.splitlines() if 'not installed' in l]
    assert len(notes) == 1 and 'pip install matplotlib' in notes[0], r.stderr
    assert r.stdout.splitlines()[0].startswith('pos\ttoken\tstate_norm')
    assert os.path.isfile(tmp_path / 'tr.json') and not os.path.exists(tmp_path / 'tr.png')


def test_trace_bad_input_is_one_line(tmp_path, capsys):
    from lab.evaluate import trace
    for model, n, msg in ((tiny('none'), 5, 'error: nothing to trace'),
                          (tiny('t2mlr'), 25, "error: the trace input has 25 tokens, more than the model's block_size 24")):
        with pytest.raises(SystemExit) as e:
            trace(model, [1] * n, None, str(tmp_path / 'tr.png'), 'title')
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(msg) and len(err.strip().splitlines()) == 1, err
    assert not os.listdir(tmp_path)


def test_gate_statistics_of_a_huge_state_are_finite():
    # a state of about 1e22 (an exploding run whose loss still improves) overflowed a float32
    # norm to inf, which train.py took for a diverged loss; the statistics are float64 now
    from support.diagnostics import gate_stats
    model = tiny('t2mlr', dtype=torch.float32)
    with torch.no_grad():
        model.wte.weight.mul_(1e23)
    idx = torch.randint(5, (2, 9), generator=torch.Generator().manual_seed(8))
    stats = gate_stats(model, idx)
    assert 1e20 < stats['gates/state'] < float('inf') and all(v == v for v in stats.values())


# -----------------------------------------------------------------------------
# the training instrumentation (issue 25)

def test_train_logs_the_step_statistics(parity, tmp_path):
    """Every log line holds the interval's mean and largest loss, the largest step-to-step rise,
    the gradient norm before clipping and the fraction of steps clipped; the gates (with the
    clamp occupancy) come every log interval by default; they agree with the per-step losses."""
    out, log = train(['--recurrence=t2mlr', '--train_mode=jacobi', '--n_iter=2', '--n_grad=1', '--max_iters=6',
                      '--eval_interval=6', '--log_interval=3', '--grad_clip=1e-3'], parity, tmp_path)
    trains = [r for r in log if r['type'] == 'train']
    assert [r['iter'] for r in trains] == [3, 6] and [r['iter'] for r in log if r['type'] == 'gates'] == [3, 6]
    for r in trains:
        assert r['loss_max'] >= r['loss_mean'] and r['loss_max'] >= r['loss'] and r['grad_norm_max'] >= r['grad_norm'] > 0
        assert r['clip_frac'] == 1.0  # a clip at 1e-3 clips every step
    gates = [r for r in log if r['type'] == 'gates'][-1]
    assert 0.0 <= gates['gates/scale_at_min'] <= 1.0 and 0.0 <= gates['gates/scale_at_max'] <= 1.0
    assert '100% clipped' in out


@pytest.mark.parametrize('bounds,at_min,at_max', [((100.0, 100.0), 1.0, 0.0), ((1e-3, 1e-3), 0.0, 1.0),
                                                  ((1e-6, 1e6), 0.0, 0.0)])
def test_clamp_occupancy(bounds, at_min, at_max):
    """A scale pinned high (every state's RMS far above 1: the lower bound of clamp(1/rms, min, max)
    is what binds when m is too large, so it counts as 'at min'), pinned low, or never clamped."""
    from support.diagnostics import gate_stats
    model = tiny('t2mlr', rec_scale_min=bounds[0], rec_scale_max=bounds[1])
    x = torch.randint(0, 5, (3, 10), generator=torch.Generator().manual_seed(0))
    g = gate_stats(model, x)
    assert (g['gates/scale_at_min'], g['gates/scale_at_max']) == (at_min, at_max)

"""How fast Jacobi converges (issue 20): the Jacobi prefill to tolerance against the exact
prefill, and diagnostics.jacobi_profile against what it must find, in float64."""

import json
import os
import subprocess
import sys

import pytest
import torch

from lab.model_full import KVCache
from test_model import STYLES, TOL, make, tokens
from support.diagnostics import jacobi_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('kw', [STYLES[0], STYLES[1], STYLES[3], STYLES[4]],
                         ids=['t2mlr-mid', 't2mlr-full', 'lrt-shared', 'lrt-layerwise'])
def test_jacobi_prefill_to_tolerance_zero_is_exact(kw):
    m = make(reset_token=0, **kw)
    idx = tokens(B=2, T=9)
    idx[0, 4] = 0
    T = idx.size(1)
    le, se, pe = m.prefill(idx, KVCache(m.config.n_layer, T), 'exact')
    lj, sj, pj = m.prefill(idx, KVCache(m.config.n_layer, T), 'jacobi', tol=0.0)
    torch.testing.assert_close(lj, le, **TOL)
    torch.testing.assert_close(sj, se, **TOL)
    assert pe == T and 2 <= pj <= T + 1  # span passes: never more than T + 1
    # and a loose tolerance stops earlier, with the exact positions it promises still exact
    _, _, loose = m.prefill(idx, KVCache(m.config.n_layer, T), 'jacobi', tol=10.0)
    assert loose < pj


@pytest.mark.parametrize('kw', [STYLES[0], STYLES[3]], ids=['t2mlr', 'lrt'])
def test_generation_after_tolerance_prefill_is_exact(kw):
    m = make(**kw)
    prompt = tokens(B=3, T=7)
    out_e, le = m.generate(prompt, 6, temperature=0, prefill='exact', return_logits=True)
    out_j, lj = m.generate(prompt, 6, temperature=0, prefill='jacobi', prefill_tol=0.0, return_logits=True)
    assert torch.equal(out_j, out_e)
    torch.testing.assert_close(lj, le, **TOL)


@pytest.mark.parametrize('kw', [STYLES[1], STYLES[4]], ids=['t2mlr', 'lrt'])
def test_profile_bounds(kw):
    # at least the worst case: D iterations make the first D positions exact (jacobi_init='plain');
    # D = T makes everything exact; and the fractions are fractions
    m = make(**kw)
    X = tokens(B=3, T=8).numpy()
    rows = jacobi_profile(m, X)
    assert [r['k'] for r in rows] == list(range(1, 9)) and rows[0]['max_change'] is None
    for r in rows:
        assert r['prefix_min'] >= min(r['k'], 8) and r['prefix'] >= r['prefix_min']
        assert 0 <= r['state_exact'] <= 1 and 0 <= r['pred_exact'] <= 1
    assert rows[-1]['state_exact'] == 1.0 and rows[-1]['pred_exact'] == 1.0 and rows[-1]['prefix'] == 8
    assert rows[2]['state_exact'] < 1.0  # this random model is far from contracting: the test can fail


def test_profile_finds_a_span_that_ignores_its_state():
    # LRT at identity init: the span does not read the memory, so the first pass already
    # computes every exact state: the profile must show a full prefix at D = 1, far above
    # the worst case of 1 position
    m = make(recurrence='lrt', rec_start=0, rec_end=2, lrt_identity_init=True, nonidentity=False)
    rows = jacobi_profile(m, tokens(B=2, T=10).numpy(), K=3)
    assert [r['prefix'] for r in rows] == [10, 10, 10] and rows[1]['max_change'] == 0.0


def test_profile_cli(tmp_path):
    import dataclasses
    import prepare
    from support.checkpoint import save_checkpoint
    prepare.main(['s5', '--group=Z2', '--n_train=8', '--n_val=4', '--n_test=6', '--train_len=6', '--test_lens=',
                  f'--out_dir={tmp_path}/s5_Z2'])
    m = make(vocab_size=2, block_size=8, **STYLES[0]).float()
    save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config),
                     'config': {'dataset': 's5_Z2', 'data_root': str(tmp_path)}}, str(tmp_path / 'm.pt'))
    p = subprocess.run([sys.executable, os.path.join(ROOT, 'lab', 'evaluate.py'), f'--init_from={tmp_path}/m.pt',
                        f'--jacobi_profile={tmp_path}/prof.png', '--profile_rows=4'],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    prof = json.load(open(tmp_path / 'prof.json'))
    assert prof['T'] == 6 and len(prof['rows']) == 6 and 'exact prefix' in p.stdout

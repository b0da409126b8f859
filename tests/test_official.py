"""tools/official.py against the official code, at a small size (docs/peers.md). Runs when
T2MLR_REPO and LRT_REPO point at local checkouts of princeton-pli/T2MLR and
OoDBag/Latent_recurrent_transformer, is skipped otherwise:

  T2MLR_REPO=/path/T2MLR LRT_REPO=/path/Latent_recurrent_transformer python -m pytest tests/test_official.py

The T2MLR agreement is asserted with tight tolerances; the greedy tokens under a transformers
whose generate() runs the official recurrence (< 5.24), else the skip must be flagged. Timings
(noisy on a shared machine) are only checked for presence."""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, 'tools', 'official.py')
REPOS = [os.environ.get('T2MLR_REPO', ''), os.environ.get('LRT_REPO', '')]
needs_repos = pytest.mark.skipif(not all(REPOS), reason="T2MLR_REPO and LRT_REPO are not set (local checkouts "
                                 "of princeton-pli/T2MLR and OoDBag/Latent_recurrent_transformer)")
SMALL = ['--n_layer=4', '--n_embd=64', '--n_head=4', '--t2mlr_start=1', '--t2mlr_end=2', '--D=4', '--B=2',
         '--batch_size=2', '--seq_len=32', '--prompt_len=8', '--gen_len=16', '--reps=1']
GEN = 16


def tool(*args, **env):
    return subprocess.run([sys.executable, TOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, 'OMP_NUM_THREADS': '1', **env})


@pytest.fixture(scope='module')
def small():
    p = tool(*SMALL)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stdout


@needs_repos
def test_t2mlr_loss_gradients_exact_decode_agree(small):
    a = small[0]['t2mlr']['agreement']
    assert a['n_grads'] == 4 * 6 + 2 + 7  # every parameter: 6 a block, wte (lm_head tied), ln_f, the fusion's 7
    assert a['jacobi_loss_diff'] <= 1e-6 * a['jacobi_loss_ours']  # float32 precision
    assert a['max_rel_grad_diff'] < 1e-4, a['worst_param']
    assert a['exact_loss_diff'] <= 1e-6 * a['exact_loss_ours']
    assert a['decode_logits_diff'] < 1e-5
    # not vacuous: the recurrence moves the exact loss by far more than the tolerance
    assert a['recurrence_effect'] > 100 * 1e-6 * a['exact_loss_ours']


@needs_repos
def test_t2mlr_greedy_tokens_or_flagged(small):
    res, stdout = small
    a = res['t2mlr']['agreement']
    if res['env']['generate_cache_renamed']:  # transformers >= 5.24: the official generate() skips the recurrence
        assert a['tokens_equal'] is None and a['generate_mixer_calls'] == 0
        assert 'NOT COMPARED' in stdout and 'transformers <= 5.23' in stdout
    else:
        assert a['generate_mixer_calls'] == GEN - 1  # every token after the first read the state
        assert a['tokens_equal'] is True


@needs_repos
def test_official_trainer_call(small):
    """The official Jacobi forward as its trainer calls it (use_cache unset) agrees too, except under
    transformers >= 5.24, where its KV cache leaks into the iterations; then the report says so."""
    res, stdout = small
    a = res['t2mlr']['agreement']
    if a['default_cache_max_rel_grad_diff'] >= 1e-4:
        assert res['env']['generate_cache_renamed'] and 'stale keys' in stdout
    else:
        assert a['default_cache_loss_diff'] <= 1e-6 * a['jacobi_loss_ours']


@needs_repos
def test_timings_present(small):
    res = small[0]
    assert res['env']['threads'] == 1
    for m in ('t2mlr', 'lrt'):
        for key in ('train_step', 'decode_per_token', 'exact_eval', 'train_memory'):
            r = res[m]['timing'][key]
            assert math.isfinite(r['ratio']) and r['ratio'] > 0, (m, key, r)


def test_missing_checkout_is_one_line():
    for args, env, says in ((['--t2mlr_repo=/nonexistent', '--lrt_repo=/nonexistent'], {}, 'no src/t2mlr_wrapper'),
                            (['--lrt_repo=/nonexistent'], {'T2MLR_REPO': ''}, 't2mlr_repo is not set')):
        p = tool(*args, **env)
        assert p.returncode == 2 and p.stdout == '', p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and says in p.stderr

"""The lab scripts on bench.py's settings and helpers (lab/prefill.py, lab/hf_peer.py, lab/memory.py,
lab/profile_ops.py), end to end in --quick mode through a subprocess, as test_bench.py runs
bench.py: the last stdout line is one JSON object. Timings are never compared with thresholds:
only presence, sign and finiteness are checked."""

import dataclasses
import json
import os

import pytest
import torch

from lab.model_full import GPT, GPTConfig
from test_bench import bench, finite_pos
from support.checkpoint import save_checkpoint

QUICK = ['--quick=True', '--threads=1']


def run(script, *args):
    """One lab script, --quick, one thread -> (its JSON, its stdout)."""
    p = bench(*QUICK, *args, script=os.path.join('lab', script))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stdout


def test_prefill_figures(tmp_path):
    # a trained-model stand-in; compiled too, with dynamo's 'eager' backend: the same tracing and rows, no codegen
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=24, vocab_size=3, n_layer=2, n_head=2, n_kv_head=1, n_embd=16, recurrence='t2mlr',
                      rec_start=0, rec_end=1))
    save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config)}, str(tmp_path / 'ckpt.pt'))
    res, stdout = run('prefill.py', '--compile=True', '--compile_backend=eager', f'--prefill_ckpt={tmp_path}/ckpt.pt',
                      f'--out={tmp_path}/prefill.json')
    assert json.loads((tmp_path / 'prefill.json').read_text()) == res and 'prefill' in stdout
    assert len(res['env']['load_avg']) == 3
    modes = {(r['model'], r['mode']) for r in res['prefill']}
    assert modes == ({('plain', 'plain'), ('plain', 'plain-compiled')}
                     | {(m, k) for m in ('t2mlr', 'lrt') for k in ('plain', 'exact', 'jacobi', 'jacobi-tol', 'exact-compiled')}
                     | {('ckpt', k) for k in ('plain', 'exact', 'jacobi', 'jacobi-tol')})
    for r in res['prefill']:
        if r['mode'] == 'jacobi-tol':  # to tolerance: never more than T + 1 span passes
            assert 2 <= r['span_passes'] <= r['prompt_len'] + 1
    for r in res['prefill']:
        for k in ('ms', 'tokens_per_s', 'ratio', 'flop_ratio', 'ratio_over_flops'):
            assert finite_pos(r[k]), (r, k)
        if r['mode'] == 'jacobi':
            assert r['n_iter'] == res['config']['n_iter'] and r['flop_ratio'] > 1 and r['span_passes'] == r['n_iter'] + 1
        if r['mode'].endswith('-compiled'):
            assert finite_pos(r['ratio_to_plain_compiled'])


def test_hf_peer():
    args = ['--compile=True', '--compile_backend=eager', '--decode_batches=1']
    try:
        import transformers  # noqa: F401
    except ImportError:  # refused at once, in one line
        p = bench(*QUICK, *args, script=os.path.join('lab', 'hf_peer.py'))
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and 'transformers' in p.stderr
        return
    res, stdout = run('hf_peer.py', *args)
    cfg = res['config']
    assert len(res['decode_hf']) == len(cfg['decode_batches']) * len(cfg['gen_lens'])
    for h in res['decode_hf']:
        assert finite_pos(h['ms_per_token']) and finite_pos(h['ratio_to_plain_eager']) and finite_pos(h['ratio_to_plain_compiled'])
        assert h['same_greedy_tokens'] is True  # same weights: HF's greedy tokens are the plain model's
    assert 'HF gen' in stdout


def test_memory(tmp_path):
    # two small training configs (the second with activation checkpointing) for the memory at a config's size
    (tmp_path / 'mem.py').write_text("n_layer = 2\nn_embd = 32\nn_head = 4\nn_kv_head = 2\nblock_size = 64\nbatch_size = 8\n"
                                     "recurrence = 'lrt'\ntrain_mode = 'interleaved'\nn_subsets = 2\n")
    (tmp_path / 'mem_rc.py').write_text((tmp_path / 'mem.py').read_text() + "recompute = True\n")
    res, stdout = run('memory.py', f'--mem_configs={tmp_path}/mem.py,{tmp_path}/mem_rc.py', '--mem_vocab=100')
    # 1. bench.py's variants: what each keeps for backward
    rows = {r['name']: r for r in res['train_memory']}
    assert set(rows) == {'plain', 't2mlr+jacobi', 't2mlr+jacobi-exact', 'lrt+interleaved', 't2mlr+interleaved', 'lrt+jacobi',
                         't2mlr+jacobi+rc', 'lrt+interleaved+rc'}
    for name, r in rows.items():
        for k in ('act_mem_mb', 'act_mem_ratio', 'act_bytes_per_token'):
            assert finite_pos(r[k]), (name, k, r[k])
        assert r['step_peak_mem_mb'] is None  # cuda only
    assert rows['plain']['act_mem_ratio'] == 1.0
    # activation checkpointing: far fewer bytes kept for backward
    for name in ('t2mlr+jacobi', 'lrt+interleaved'):
        assert rows[name + '+rc']['act_bytes_per_token'] < 0.5 * rows[name]['act_bytes_per_token']
    # 2. the configs at their size
    full, rc = res['memory']
    assert full['mode'] == 'interleaved' and not full['recompute'] and rc['recompute'] and full['micro_batch'] == 8
    for r in (full, rc):
        assert finite_pos(r['saved_bytes_per_token']) and finite_pos(r['predicted_peak_gib']) and r['fits']
    assert rc['saved_bytes_per_token'] < full['saved_bytes_per_token'] and 'predicted peak' in stdout


def test_profile_ops():
    _, stdout = run('profile_ops.py')
    assert 'profile: training forward+backward, t2mlr+jacobi-exact' in stdout
    assert 'profile: one decode_step, batch 1, lrt' in stdout


@pytest.mark.parametrize('script, args, msg', [
    ('prefill.py', ['--prefill_iters=0'], 'prefill_iters=0 must be >= 1'),
    ('prefill.py', ['--prefill_ckpt=nope.pt'], 'prefill_ckpt=nope.pt: no such file'),
    ('prefill.py', ['--no_such_key=1'], 'unknown config key'),
    ('memory.py', ['--mem_gpu_gib=0'], 'mem_gpu_gib=0.0 must be > 0'),
    ('memory.py', ['--mem_configs=nope.py'], 'mem_configs: no config file nope.py'),
    ('memory.py', ['--n_iter=2', '--n_grad=3'], 'need n_iter >= 1, 0 <= n_grad <= n_iter'),  # bench.py's checks apply
    ('plot.py', [], 'results: give the JSON files'),
    ('plot.py', ['--results=nope.json'], 'results: nope.json'),
])
def test_lab_bad_arguments_are_one_line_exit_2(tmp_path, script, args, msg):
    p = bench(*args, script=os.path.join('lab', script), cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr)
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err
    assert not p.stdout

"""train.py end to end through its CLI: DDP equivalence, exact resume, compile, configs, errors."""

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--device=cpu', '--n_layer=2', '--n_embd=16', '--n_head=2', '--n_kv_head=1', '--batch_size=4', '--block_size=16',
        '--eval_iters=1', '--eval_exact_iters=1', '--eval_examples=8', '--log_interval=1', '--warmup_iters=1']


def run(args, cwd, check=True, torchrun=False, timeout=300):
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    cmd = ([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2'] if torchrun
           else [sys.executable]) + [os.path.join(ROOT, 'train.py')] + args
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    """A small parity dataset made by prepare.py."""
    root = tmp_path_factory.mktemp('data')
    subprocess.run([sys.executable, os.path.join(ROOT, 'prepare.py'), 's5', '--group=Z2', '--n_train=256',
                    '--n_val=16', '--n_test=16', '--train_len=12', '--test_lens=16',
                    f'--out_dir={root}/s5_Z2'], check=True, capture_output=True, timeout=120)
    return str(root)


def params(path):
    return torch.load(path, map_location='cpu', weights_only=False)['model']


def common(data, out, *extra):
    return TINY + [f'--data_root={data}', '--dataset=s5_Z2', f'--out_dir={out}', *extra]


@pytest.mark.parametrize('mode', ['jacobi', 'interleaved'])
def test_ddp_two_processes_equal_one(data, tmp_path, mode):
    # same global batch: 1 process x 4 micro-batches == 2 processes x 2 micro-batches
    args = ['--dtype=float64', '--max_iters=3', '--eval_interval=100', '--gradient_accumulation_steps=4',
            f'--train_mode={mode}', '--n_iter=3', '--n_grad=2', '--recurrence=lrt' if mode == 'interleaved' else '--recurrence=t2mlr']
    run(common(data, tmp_path / 'one', *args), tmp_path)
    run(common(data, tmp_path / 'two', *args), tmp_path, torchrun=True)
    a, b = params(tmp_path / 'one' / 'ckpt.pt'), params(tmp_path / 'two' / 'ckpt.pt')
    start = torch.load(tmp_path / 'one' / 'ckpt.pt', weights_only=False)
    assert start['iter_num'] == 3
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-12, msg=k)


def test_resume_continues_exactly(data, tmp_path):
    # the same lr schedule in both runs (it depends on lr_decay_iters, not on where a run stops)
    args = ['--max_iters=6', '--lr_decay_iters=6', '--eval_interval=3', '--train_mode=jacobi', '--n_iter=3', '--n_grad=1', '--dropout=0.1']
    run(common(data, tmp_path / 'straight', *args), tmp_path)
    half = [a if a != '--max_iters=6' else '--max_iters=3' for a in args]
    run(common(data, tmp_path / 'resumed', *half), tmp_path)
    p = run(common(data, tmp_path / 'resumed', *args, '--init_from=resume'), tmp_path)
    a, b = params(tmp_path / 'straight' / 'ckpt.pt'), params(tmp_path / 'resumed' / 'ckpt.pt')
    assert torch.load(tmp_path / 'resumed' / 'ckpt.pt', weights_only=False)['iter_num'] == 6
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # and resuming really moved on from step 3 (it did not retrain from scratch)
    assert 'iter 4:' in p.stdout and 'iter 1:' not in p.stdout


def test_compile_matches_eager(data, tmp_path):
    args = ['--max_iters=1', '--eval_interval=100', '--train_mode=jacobi', '--n_iter=3', '--n_grad=2', '--dtype=float64']
    run(common(data, tmp_path / 'eager', *args), tmp_path)
    run(common(data, tmp_path / 'compiled', *args, '--compile=True'), tmp_path, timeout=600)
    a, b = params(tmp_path / 'eager' / 'ckpt.pt'), params(tmp_path / 'compiled' / 'ckpt.pt')
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-10, msg=k)


def test_smoke_config_t2mlr_small_and_eval(data, tmp_path):
    p = run([os.path.join(ROOT, 'config', 't2mlr_small.py'), f'--data_root={data}', '--dataset=s5_Z2',
             f'--out_dir={tmp_path}/out', '--max_iters=2', '--eval_interval=2', '--eval_iters=1', '--log_interval=1',
             '--eval_exact_iters=1', '--eval_examples=8', '--n_iter=4'], tmp_path)  # D=32 passes: slow in a test
    assert 'iter 2:' in p.stdout and 'gap' in p.stdout and 'em' in p.stdout
    assert os.path.isfile(tmp_path / 'out' / 'ckpt.pt')
    lines = open(tmp_path / 'out' / 'log.jsonl').read().splitlines()
    assert any('"type": "eval"' in l and 'test_16/em_exact' in l for l in lines)
    last = [json.loads(l) for l in lines if '"type": "eval"' in l][-1]  # Jacobi from the exact states: approx is
    assert last['val/loss_approx'] == last['val/loss_exact'] and last['val/em_approx'] == last['val/em_exact']  # not rerun
    # eval_only on the checkpoint
    p = run([f'--data_root={data}', '--dataset=s5_Z2', f'--out_dir={tmp_path}/out', '--init_from=resume',
             '--eval_only=True', '--eval_iters=1', '--eval_exact_iters=1', '--eval_examples=8'], tmp_path)
    assert 'eval step 2' in p.stdout and 'iter 3:' not in p.stdout and 'saved' not in p.stdout


@pytest.mark.parametrize('args,msg', [
    (['--not_a_key=1'], "unknown config key 'not_a_key'"),
    (['--batch_size=big'], 'batch_size must be int'),
    (['--train_mode=fast'], "unknown train_mode 'fast'"),
    (['--jacobi_init=ones'], "unknown jacobi_init 'ones'"),
    (['--recurrence=t2mlr', '--rec_start=3', '--rec_end=1'], 'rec_end=1 < rec_start=3'),
    (['--dataset=nope'], 'prepare.py'),
    (['--init_from=resume', '--out_dir=/nonexistent'], 'no checkpoint'),
])
def test_errors_are_one_line(data, tmp_path, args, msg):
    p = run([f'--data_root={data}', '--dataset=s5_Z2', *args], tmp_path, check=False)
    assert p.returncode != 0 and msg in p.stderr
    assert 'Traceback' not in p.stderr


def test_corrupt_checkpoint_is_one_line(data, tmp_path):
    (tmp_path / 'ckpt.pt').write_bytes(b'\x00garbage')
    p = run(common(data, tmp_path, '--init_from=resume'), tmp_path, check=False)
    assert p.returncode != 0 and 'not a readable checkpoint' in p.stderr and 'Traceback' not in p.stderr

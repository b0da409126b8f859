"""train.py end to end through its CLI: DDP equivalence, exact resume, compile, configs, errors; its settings;
lab/train.py (train.py with the research model) and the model args each one's checkpoints hold."""

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--device=cpu', '--n_layer=2', '--n_embd=16', '--n_head=2', '--n_kv_head=1', '--batch_size=4', '--block_size=16',
        '--eval_iters=1', '--eval_examples=8', '--log_interval=1', '--warmup_iters=1']


def run(args, cwd, check=True, torchrun=False, timeout=300, script='train.py'):
    """python script args (train.py, or lab/train.py: the research model), or under torchrun with 2 processes."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    cmd = ([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2'] if torchrun
           else [sys.executable]) + [os.path.join(ROOT, script)] + args
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
    return TINY + [f'--dataset={data}/s5_Z2', f'--out_dir={out}', *extra]  # (a dataset may be a path)


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
    # the same lr schedule in both runs (it depends on lr_decay_iters, not on where a run stops); dropout
    # (the research model's, lab/train.py): the RNG state resumes too
    args = ['--max_iters=6', '--lr_decay_iters=6', '--eval_interval=3', '--train_mode=jacobi', '--n_iter=3', '--n_grad=1', '--dropout=0.1']
    run(common(data, tmp_path / 'straight', *args), tmp_path, script='lab/train.py')
    half = [a if a != '--max_iters=6' else '--max_iters=3' for a in args]
    run(common(data, tmp_path / 'resumed', *half), tmp_path, script='lab/train.py')
    p = run(common(data, tmp_path / 'resumed', *args, '--init_from=resume'), tmp_path, script='lab/train.py')
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
    p = run([os.path.join(ROOT, 'config', 't2mlr_small.py'), f'--dataset={data}/s5_Z2',
             f'--out_dir={tmp_path}/out', '--max_iters=2', '--eval_interval=2', '--eval_iters=1', '--log_interval=1',
             '--eval_examples=8', '--n_iter=4'], tmp_path)  # D=32 passes: slow in a test
    assert 'iter 2:' in p.stdout and 'gap' in p.stdout and 'em' in p.stdout
    assert os.path.isfile(tmp_path / 'out' / 'ckpt.pt')
    lines = open(tmp_path / 'out' / 'log.jsonl').read().splitlines()
    assert any('"type": "eval"' in l and 'test_16/em_exact' in l for l in lines)
    last = [json.loads(l) for l in lines if '"type": "eval"' in l][-1]  # Jacobi from the exact states: approx is
    assert last['val/loss_approx'] == last['val/loss_exact'] and last['val/em_approx'] == last['val/em_exact']  # not rerun
    # eval_only on the checkpoint
    p = run([f'--dataset={data}/s5_Z2', f'--out_dir={tmp_path}/out', '--init_from=resume',
             '--eval_only=True', '--eval_iters=1', '--eval_examples=8'], tmp_path)
    assert 'eval step 2' in p.stdout and 'iter 3:' not in p.stdout and 'saved' not in p.stdout


@pytest.mark.parametrize('args,msg', [
    (['--not_a_key=1'], "unknown config key 'not_a_key'"),
    (['--batch_size=big'], 'batch_size must be int'),
    (['--train_mode=fast'], "unknown train_mode 'fast'"),
    (['--jacobi_init=ones'], "unknown jacobi_init 'ones'"),
    (['--recurrence=t2mlr', '--rec_start=3', '--rec_end=1'], 'rec_start=3, rec_end=1'),
    (['--train_mode=block'], "train_mode='block'"),  # the research model's: the line names lab/train.py
    (['--rope=False'], "unknown config key 'rope'"),  # a research model's option: lab/train.py's
    (['--dataset=nope'], 'prepare.py'),
    (['--init_from=resume', '--out_dir=/nonexistent'], 'no checkpoint'),
])
def test_errors_are_one_line(data, tmp_path, args, msg):
    p = run([f'--dataset={data}/s5_Z2', *args], tmp_path, check=False)
    assert p.returncode != 0 and msg in p.stderr
    assert 'Traceback' not in p.stderr


def test_corrupt_checkpoint_is_one_line(data, tmp_path):
    (tmp_path / 'ckpt.pt').write_bytes(b'\x00garbage')
    p = run(common(data, tmp_path, '--init_from=resume'), tmp_path, check=False)
    assert p.returncode != 0 and 'not a readable checkpoint' in p.stderr and 'Traceback' not in p.stderr


def test_research_model_errors_are_one_line(data, tmp_path):
    # lab/train.py's own checks, and the research model's
    for args, msg in [(['--recurrence=t2mlr', '--rec_start=3', '--rec_end=1'], 'rec_end=1 < rec_start=3'),
                      (['--rec_lr_mult=-1'], 'rec_lr_mult=-1.0'), (['--arch=rnn'], "unknown arch 'rnn'")]:
        p = run([f'--dataset={data}/s5_Z2', *args], tmp_path, check=False, script='lab/train.py')
        assert p.returncode == 2 and msg in p.stderr and 'Traceback' not in p.stderr, p.stderr


def settings(script):
    """The settings `python script --help` lists, {name: default as printed}."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, script), '--help'], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split('settings (--key=value; defaults):\n')[1].splitlines()
    return dict(line.strip()[2:].split('=', 1) for line in lines)


def test_train_settings_are_forty_each_with_a_comment():
    # train.py's own 28 and the textbook model's GPTConfig fields but block_size, vocab_size, reset_token
    import model
    got = settings('train.py')
    own = ['out_dir', 'eval_interval', 'log_interval', 'eval_iters', 'eval_examples', 'eval_only', 'init_from', 'overwrite',
           'seed', 'dataset', 'batch_size', 'block_size', 'gradient_accumulation_steps', 'train_mode', 'n_iter', 'n_grad',
           'n_subsets', 'learning_rate', 'max_iters', 'weight_decay', 'grad_clip', 'gate_lr_mult', 'warmup_iters',
           'lr_decay_iters', 'min_lr', 'device', 'dtype', 'compile']
    fields = [f for f in model.GPTConfig.__dataclass_fields__ if f not in ('block_size', 'vocab_size', 'reset_token')]
    assert len(got) <= 40 and sorted(got) == sorted(own + fields), sorted(got)
    assert got['recurrence'] == "'t2mlr'" and got['dataset'] == "'s5_Z2'"
    source = open(os.path.join(ROOT, 'train.py')).read()
    for k in own + ['recurrence']:  # each of its own lines carries a comment (the model's: in model.py's GPTConfig)
        line = next(l for l in source.splitlines() if l.startswith(f'{k} = '))
        assert '#' in line, line
    # lab/train.py: the same, and every field of the research model's GPTConfig
    from lab import model_full
    lab = settings('lab/train.py')
    assert set(lab) == set(own) | set(model_full.GPTConfig.__dataclass_fields__) - {'block_size', 'vocab_size', 'reset_token'}
    assert {'n_rounds', 'block_len', 'recompute', 'rec_lr_mult', 'arch', 'rope', 'dropout'} <= set(lab)


def test_lab_train_checkpoint_holds_the_research_models_args(data, tmp_path):
    # a lab-only option end to end: the checkpoint's model args are the research model's, and load back into it
    import model
    from lab import model_full
    from support.checkpoint import load_checkpoint
    run(common(data, tmp_path / 'lab', '--max_iters=2', '--eval_interval=2', '--train_mode=interleaved', '--n_rounds=2',
               '--rope=False', '--rec_lr_mult=2'), tmp_path, script='lab/train.py')
    m, ck = load_checkpoint(str(tmp_path / 'lab' / 'ckpt.pt'))
    assert set(ck['model_args']) == set(model_full.GPTConfig.__dataclass_fields__)
    assert type(m) is model_full.GPT and m.config.rope is False and m.config.n_rounds == 2 and m.config.rec_lr_mult == 2
    assert ck['config']['n_rounds'] == 2 and ck['config']['rope'] is False
    # a resume with another training option: the run's setting applies (n_rounds 1, no note); the model is the
    # checkpoint's (rope=False, noted: the config left it at its default)
    p = run(common(data, tmp_path / 'lab', '--max_iters=3', '--eval_interval=3', '--train_mode=interleaved', '--n_rounds=1',
                   '--rec_lr_mult=2', '--init_from=resume'), tmp_path, script='lab/train.py')
    notes = [l for l in p.stdout.splitlines() if l.startswith('note: resuming')]
    assert 'iter 3:' in p.stdout and notes == ["note: resuming with the checkpoint's rope=False (config says True)"], p.stdout
    m, ck = load_checkpoint(str(tmp_path / 'lab' / 'ckpt.pt'))
    assert m.config.rope is False and m.config.n_rounds == 1 and ck['model_args']['n_rounds'] == 1 == ck['config']['n_rounds']
    # train.py (the textbook model) does not resume it: one line naming lab/train.py
    p = run(common(data, tmp_path / 'lab', '--max_iters=4', '--init_from=resume'), tmp_path, check=False)
    assert p.returncode == 2 and 'holds the research model' in p.stderr and 'lab/train.py' in p.stderr, p.stderr


def test_train_checkpoint_holds_the_textbook_models_args(data, tmp_path):
    import model
    from support.checkpoint import load_checkpoint
    run(common(data, tmp_path / 'plain', '--max_iters=1', '--eval_interval=1'), tmp_path)
    m, ck = load_checkpoint(str(tmp_path / 'plain' / 'ckpt.pt'))  # (it loads into the research model, a model.GPT)
    assert list(ck['model_args']) == list(model.GPTConfig.__dataclass_fields__) and len(ck['model_args']) == 15
    assert isinstance(m, model.GPT) and len(ck['config']) == 40 and ck['config']['dataset'] == f'{data}/s5_Z2'
    # resumed by train.py it stays the textbook model; by lab/train.py it becomes the research model
    run(common(data, tmp_path / 'plain', '--max_iters=2', '--eval_interval=1', '--init_from=resume'), tmp_path)
    assert torch.load(tmp_path / 'plain' / 'ckpt.pt', weights_only=False)['model_args'] == ck['model_args']
    run(common(data, tmp_path / 'plain', '--max_iters=3', '--eval_interval=1', '--init_from=resume'), tmp_path,
        script='lab/train.py')
    assert len(torch.load(tmp_path / 'plain' / 'ckpt.pt', weights_only=False)['model_args']) > 15


def test_prompt_masks_need_the_research_model(data, tmp_path):
    # prompt/response data (a rec_mask per row: the parity rows with one, made here) under the textbook
    # model: one line naming lab/train.py; lab/train.py trains it
    import shutil
    import numpy as np
    shutil.copytree(f'{data}/s5_Z2', tmp_path / 'qa')
    meta = json.load(open(tmp_path / 'qa' / 'meta.json'))
    for split, v in meta['splits'].items():
        mask = np.zeros((v['n'], v['len']), np.uint8)
        mask[:, v['len'] // 2:] = 1  # the recurrence on in the second half of each row
        mask.tofile(tmp_path / 'qa' / f'{split}_m.bin')
    json.dump(dict(meta, rec_mask=True), open(tmp_path / 'qa' / 'meta.json', 'w'))
    p = run(TINY + [f'--dataset={tmp_path}/qa', f'--out_dir={tmp_path}/out'], tmp_path, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and 'prompt masks' in lines[0] and 'lab/train.py' in lines[0], p.stderr
    run(TINY + [f'--dataset={tmp_path}/qa', f'--out_dir={tmp_path}/out', '--max_iters=1', '--eval_interval=1'], tmp_path,
        script='lab/train.py')

"""lab/compare.py end to end in a tiny mode, and the paper-scale configs smoke-tested at reduced size."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}


def prep(*args):
    subprocess.run([sys.executable, os.path.join(ROOT, 'prepare.py'), *args], check=True,
                   capture_output=True, timeout=120, env=ENV)


def test_compare_tiny(tmp_path):
    prep('s5', '--group=Z2', '--n_train=64', '--n_val=8', '--n_test=8', '--train_len=8', '--test_lens=12',
         f'--out_dir={tmp_path}/data/s5_Z2')
    cmd = [sys.executable, os.path.join(ROOT, 'lab', 'compare.py'), '--quick=True', '--max_iters=2', '--seeds=1,2',
           f'--data_root={tmp_path}/data', f'--out_dir={tmp_path}/cmp']
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.load(open(tmp_path / 'cmp' / 'results.json'))
    assert res['lengths'] == [8, 12]
    for name in ('plain', 't2mlr_full', 't2mlr_mid', 'lrt'):
        s = res['summary'][name]
        for key in ('em_exact@8', 'em_exact@12', 'acc_exact@12', 'em_approx@8'):
            median, lo, hi = s[key]  # median [min, max] over the seeds
            assert 0 <= lo <= median <= hi <= 1
        assert 0 <= s['solved@12'] <= 2
        assert len(res['runs'][name]) == 2
    md = open(tmp_path / 'cmp' / 'results.md').read()
    assert md.count('\n| ') == 4 and 'EM@12 (exact)' in md and 'seeds EM@12 >= 0.9' in md  # one row per model
    assert 'commit ' in md and '`python lab/compare.py --quick=True' in md  # where the table came from
    # a second call reuses the finished runs instead of training again
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode == 0 and p.stdout.count('already done') == 8
    # gate statistics over training, plotted; the reliance table from the checkpoints, no training
    try:
        import matplotlib  # noqa: F401  (optional: without it lab/compare.py draws no plots)
        assert os.path.isfile(tmp_path / 'cmp' / 'gates.png')
    except ImportError:
        pass
    logs = [json.loads(l) for l in open(tmp_path / 'cmp' / 't2mlr_full_s1' / 'log.jsonl')]
    assert [r['iter'] for r in logs if r['type'] == 'gates'] == [1, 2]
    p = subprocess.run(cmd + ['--reliance=True'], capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode == 0 and 'already done' not in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    rel = json.load(open(tmp_path / 'cmp' / 'reliance.json'))
    assert sorted(rel) == ['lrt', 'plain', 't2mlr_full', 't2mlr_mid'] and all(len(v) == 2 for v in rel.values())
    for r in rel['plain']:  # no state: zeroing it changes nothing
        assert (r['loss_zero'], r['acc_zero'], r['em_zero']) == (r['loss_exact'], r['acc_exact'], r['em_exact'])
    ev = res['runs']['t2mlr_full'][0]['eval']  # the checkpoint's numbers are the final evaluation's
    assert rel['t2mlr_full'][0]['acc_exact'] == ev['test/acc_exact'] and rel['t2mlr_full'][0]['acc_zero'] == ev['test/acc_zero']
    md = open(tmp_path / 'cmp' / 'reliance.md').read()
    assert md.count('\n| ') == 4 and 'reliance (loss gap)' in md


def test_compare_curves_and_new_models(tmp_path):
    # the options added for the state-tracking groups, end to end in the tiny mode: a
    # non-abelian group, LRT with refinement rounds, a Jacobi-depth variant, learning
    # curves every step, and the tables and plots written to results_dir
    prep('s5', '--group=S3', '--n_train=64', '--n_val=8', '--n_test=8', '--train_len=8', '--test_lens=12',
         f'--out_dir={tmp_path}/data/s5_S3')
    cmd = [sys.executable, os.path.join(ROOT, 'lab', 'compare.py'), '--quick=True', '--max_iters=2', '--seeds=1',
           '--models=lrt_r4_w32,t2mlr_w32_D4,t2mlr_w32_D8,plain_w32,t2mlr_decay500', '--dataset=s5_S3', '--curve_interval=1',
           f'--data_root={tmp_path}/data', f'--out_dir={tmp_path}/cmp',
           f'--results_dir={tmp_path}/evidence/s5_S3']
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert '--n_rounds=4' in p.stdout and '--n_iter=4' in p.stdout
    # the arm with a research model's option (n_rounds) runs lab/train.py, the others train.py
    line = lambda n: next(l for l in p.stdout.splitlines() if l.startswith(f'{n} seed 1: '))
    assert os.path.join('lab', 'train.py') in line('lrt_r4_w32').split()[3]
    assert all(line(n).split()[3].endswith(os.sep + 'train.py') and os.path.join('lab', 'train.py') not in line(n)
               for n in ('plain_w32', 't2mlr_w32_D4', 't2mlr_decay500'))
    ck = lambda n: torch.load(tmp_path / 'cmp' / f'{n}_s1' / 'ckpt.pt', weights_only=False)['model_args']
    assert ck('lrt_r4_w32')['n_rounds'] == 4 and 'n_rounds' not in ck('plain_w32')
    # an arm's own learning-rate schedule reaches train.py; the others' cosine spans the run's steps (-1)
    decay = lambda n: torch.load(tmp_path / 'cmp' / f'{n}_s1' / 'ckpt.pt', weights_only=False)['config']['lr_decay_iters']
    assert decay('t2mlr_decay500') == 500 and decay('plain_w32') == -1
    assert not os.path.exists(tmp_path / 'cmp' / 'results.json')  # the tables went to results_dir
    res = json.load(open(tmp_path / 'evidence' / 's5_S3' / 'results.json'))
    assert res['dataset'] == 's5_S3' and sorted(res['summary']) == ['lrt_r4_w32', 'plain_w32', 't2mlr_decay500', 't2mlr_w32_D4', 't2mlr_w32_D8']
    # the FLOP count orders the schemes: deeper Jacobi costs more, the plain model least
    f = {n: s['flops_per_token'] for n, s in res['summary'].items()}
    assert f['plain_w32'] < f['t2mlr_w32_D4'] < f['t2mlr_w32_D8']
    for name, runs in res['runs'].items():
        ev = runs[0]['curve']['eval']
        assert [e['iter'] for e in ev] == [0, 1, 2]  # an evaluation at every step (step 0 too), the last one final
        assert all('test_12/em_exact' in e and 'val/loss_exact' in e for e in ev)
        assert runs[0]['curve']['train'] and runs[0]['eval']['iter'] == 2
    try:
        import matplotlib  # noqa: F401
        for f in ('curves.png', 'accuracy.png', 'depth.png'):
            assert os.path.isfile(tmp_path / 'evidence' / 's5_S3' / f), f
    except ImportError:
        pass


def tiny_parity_compare(tmp_path, steps):
    """A tiny parity dataset under tmp_path and the lab/compare.py command that trains the plain model
    on it for `steps` steps (seed 1) -> (command, the run's directory)."""
    prep('s5', '--group=Z2', '--n_train=64', '--n_val=8', '--n_test=8', '--train_len=8', '--test_lens=12',
         f'--out_dir={tmp_path}/data/s5_Z2')
    cmd = [sys.executable, os.path.join(ROOT, 'lab', 'compare.py'), '--quick=True', f'--max_iters={steps}', '--seeds=1',
           '--models=plain', f'--data_root={tmp_path}/data', f'--out_dir={tmp_path}/cmp']
    return cmd, tmp_path / 'cmp' / 'plain_s1'


def test_compare_leaves_a_run_in_training_alone(tmp_path):
    # a run with no final evaluation is restarted, unless another lab/compare.py is training it now
    # (its pid in compare.pid): restarting that one would destroy it
    cmd, run_dir = tiny_parity_compare(tmp_path, steps=2)
    os.makedirs(run_dir)
    (run_dir / 'log.jsonl').write_text('{"iter": 1, "type": "train", "loss": 1.0}\n')  # the other's run, unfinished
    (run_dir / 'compare.pid').write_text(str(os.getpid()))  # a live process: this test's
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode != 0 and 'is being trained now by process' in p.stdout + p.stderr
    assert (run_dir / 'log.jsonl').read_text().startswith('{"iter": 1,')  # untouched
    dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
    (run_dir / 'compare.pid').write_text(dead.stdout.strip())  # a process that has exited: a stale lock
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert not os.path.exists(run_dir / 'compare.pid') and os.path.isfile(run_dir / 'time.json')


def children(pid):
    """The pids of process pid's children (Linux's /proc), or None where /proc does not list them."""
    try:
        return [int(c) for c in open(f'/proc/{pid}/task/{pid}/children').read().split()]
    except OSError:
        return None


def alive(pid):
    """Whether process pid is running (a zombie, exited but not yet reaped, is not)."""
    try:
        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


@pytest.mark.skipif(not os.path.exists('/proc/self/task'), reason='needs Linux /proc to find the child process')
def test_compare_stops_its_run_on_sigterm(tmp_path):
    # SIGTERM to lab/compare.py alone (a scheduler, `kill`) must stop the training it started and
    # remove its lock: an orphaned train.py would go on writing into a run that the next
    # lab/compare.py, finding a stale lock, restarts from scratch in the same directory
    cmd, run_dir = tiny_parity_compare(tmp_path, steps=100000)
    log = open(tmp_path / 'compare.out', 'w')  # a file, not a pipe: an orphaned train.py would hold a pipe open
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    t0, kids = time.time(), []
    try:
        while time.time() - t0 < 300 and p.poll() is None:  # until train.py has logged a step
            kids = children(p.pid) or []
            if kids and os.path.exists(run_dir / 'log.jsonl') and '"train"' in (run_dir / 'log.jsonl').read_text():
                break
            time.sleep(0.2)
        assert p.poll() is None and len(kids) == 1, 'lab/compare.py did not start its training run'
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
        out = (tmp_path / 'compare.out').read_text()
        assert not alive(kids[0]), 'train.py outlived lab/compare.py'
        assert p.returncode == 128 + signal.SIGTERM, out[-2000:]
        assert 'stopped by SIGTERM' in out, out[-2000:]  # train.py stopped at a step boundary and saved
        assert not os.path.exists(run_dir / 'compare.pid')
    finally:
        for pid in [p.pid, *kids]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize('cfg', ['t2mlr_135m_fineweb.py', 'lrt_shared_fineweb.py', 'plain_135m_fineweb.py',
                                 's5_retrieval_t2mlr.py', 's3_t2mlr.py', 's3_lrt.py'])
def test_paper_configs_run_at_reduced_size(tmp_path, cfg):
    text = tmp_path / 'corpus.txt'
    text.write_text('\n\n'.join(f'document {i}: the quick brown fox jumps over the lazy dog.' for i in range(200)))
    prep('text', f'--input={text}', '--tokenizer=char', f'--out_dir={tmp_path}/data/tiny')
    lab = cfg not in ('s3_t2mlr.py', 's3_lrt.py')  # the research model's configs (mlp_hidden, rope_theta, ...)
    small = ['--n_layer=4', '--n_embd=32', '--n_head=2', '--n_kv_head=1', *(['--mlp_hidden=64'] if lab else []), '--block_size=32',
             '--batch_size=2', '--gradient_accumulation_steps=1', '--max_iters=2', '--eval_interval=2',
             '--eval_iters=1', '--warmup_iters=1', '--log_interval=1',
             '--device=cpu', '--dtype=float32', '--compile=False',
             f'--dataset={tmp_path}/data/tiny', f'--out_dir={tmp_path}/out']
    if cfg != 'plain_135m_fineweb.py':
        small += ['--rec_start=1', '--rec_end=2']
    script = os.path.join(ROOT, 'lab', 'train.py') if lab else os.path.join(ROOT, 'train.py')
    p = subprocess.run([sys.executable, script, os.path.join(ROOT, 'config', cfg), *small],
                       capture_output=True, text=True, timeout=300, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert 'iter 2:' in p.stdout and 'bpb' in p.stdout


def test_compare_text(tmp_path):
    # language modelling: equal steps, and A@B (A for B's training FLOPs); test bits per character
    # of the held-out files under the exact recurrence, the approximation and the zero state
    prep('stdlib_char', '--max_files=40', f'--out_dir={tmp_path}/data/stdlib_char')
    cmd = [sys.executable, os.path.join(ROOT, 'lab', 'compare.py'), '--quick=True', '--max_iters=4', '--seeds=1',
           '--dataset=stdlib_char', '--models=stdlib_plain,stdlib_lrt,stdlib_plain@stdlib_lrt',
           f'--data_root={tmp_path}/data', f'--out_dir={tmp_path}/cmp', '--extra=--block_size=16 --eval_interval=2']
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.load(open(tmp_path / 'cmp' / 'text.json'))
    rows = {r['model']: r for r in res['rows']}
    ratio = rows['stdlib_lrt']['flops_per_token'] / rows['stdlib_plain']['flops_per_token']
    assert ratio > 1.5 and rows['stdlib_plain@stdlib_lrt']['steps'] == round(4 * ratio)  # equal compute
    assert rows['stdlib_lrt']['train_pflops'] == pytest.approx(rows['stdlib_plain@stdlib_lrt']['train_pflops'], rel=0.15)
    lrt = res['runs']['stdlib_lrt'][0]['test']['bits']
    assert set(lrt) == {'exact', 'approx', 'zero'} and all(2 < v < 10 for v in lrt.values())
    assert 'reliance' in rows['stdlib_lrt'] and 'reliance' not in rows['stdlib_plain']
    assert 'noise floor' in open(tmp_path / 'cmp' / 'text.md').read()
    # test_windows: the same runs (not retrained) scored on the first windows only, recomputed once
    p = subprocess.run(cmd + ['--test_windows=3'], capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert 'iter ' not in p.stdout and 'first 3 windows' in open(tmp_path / 'cmp' / 'text.md').read()
    part = json.load(open(tmp_path / 'cmp' / 'text.json'))['runs']['stdlib_lrt'][0]['test']
    assert part['windows'] == 3 and part['bits']['exact'] != lrt['exact']

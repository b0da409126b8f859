"""Never lose a good run (issue 12): divergence guard and best.pt, exact resume after a real
SIGINT/SIGTERM (one process and torchrun), stale temp files and fsync, bad settings as one line
before any model is built, resume notes, bounded downloads, DDP accumulation/loss/timeout, one
bool parser.

Runs that need no real process of their own (no signal, no torchrun) run train.py/sample.py/lab/evaluate.py
in this process (in_process): no torch import per run keeps the file fast."""

import contextlib
import io
import json
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import configurator
import prepare
from test_train import ROOT, common, params, run
from support import checkpoint, corpora, dataset

GOOD = ['--max_iters=4', '--eval_interval=2', '--n_iter=3', '--n_grad=2']


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    """The parity task of test_train, and a small char-level token corpus."""
    root = tmp_path_factory.mktemp('data')
    subprocess.run([sys.executable, os.path.join(ROOT, 'prepare.py'), 's5', '--group=Z2', '--n_train=256', '--n_val=16',
                    '--n_test=16', '--train_len=12', '--test_lens=16', f'--out_dir={root}/s5_Z2'],
                   check=True, capture_output=True, timeout=120)
    text = root / 'corpus.txt'
    text.write_text('\n\n'.join(f"paragraph {i}: the quick brown fox jumps over the lazy dog" for i in range(40)))
    subprocess.run([sys.executable, os.path.join(ROOT, 'prepare.py'), 'text', f'--input={text}', f'--out_dir={root}/chars',
                    f'--cache_dir={root}/cache'], check=True, capture_output=True, timeout=120)
    return str(root)


def in_process(script, args, cwd, check=False):
    """Run train.py (or lab/train.py), sample.py or lab/evaluate.py in this process, as `python script args` in
    cwd would (one thread, like the subprocess runs with OMP_NUM_THREADS=1) -> (exit code, stdout, stderr).
    Restores the signal handlers train.py installs (and lab/train.py the module `model`)."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    argv, here, threads = sys.argv, os.getcwd(), torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        os.chdir(cwd)
        sys.argv = [script] + [str(a) for a in args]
        torch.set_num_threads(1)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(os.path.join(ROOT, script), run_name='__main__')
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)  # what the interpreter prints for SystemExit('error: ...')
    finally:
        sys.argv = argv
        os.chdir(here)
        torch.set_num_threads(threads)
        dataset.release_locks()  # as the process's exit would
        for s, h in handlers.items():
            signal.signal(s, h)
    if check and code != 0:
        raise AssertionError(f"{script} {' '.join(map(str, args))} failed ({code}):\n{out.getvalue()[-3000:]}\n{err.getvalue()[-3000:]}")
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope='module')
def good_run(data, tmp_path_factory):
    """A short healthy run (4 steps, evals at 2 and 4), started next to temp files of killed
    saves (ours, of a dead pid), a foreign name, and one of a live process: the start must
    remove the first two only."""
    out = tmp_path_factory.mktemp('good')
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()  # a pid that is no longer alive
    stale = [out / f'ckpt.pt.tmp.{dead.pid}', out / f'best.pt.tmp.{dead.pid}']
    kept = [out / 'ckpt.pt.tmp.notapid', out / 'notes.tmp.1', out / f'ckpt.pt.tmp.{os.getppid()}']  # (alive)
    for f in stale + kept:
        f.write_bytes(b'half a checkpoint')
    _, stdout, _ = in_process('train.py', common(data, out, *GOOD), out, check=True)
    return out, stdout, stale, kept


def copy_run(src, dst, files=('ckpt.pt', 'best.pt', 'log.jsonl')):
    for f in files:
        shutil.copy(src / f, dst / f)

# -----------------------------------------------------------------------------
# 1. divergence: stop at once, save nothing non-finite, keep the best apart from the latest


def test_diverging_run_stops_and_saves_nothing(data, good_run, tmp_path):
    copy_run(good_run[0], tmp_path, ['ckpt.pt'])
    before = params(tmp_path / 'ckpt.pt')
    code, _, err = in_process('train.py', common(data, tmp_path, *GOOD, '--init_from=resume', '--max_iters=40',
                                                 '--learning_rate=1e6', '--grad_clip=0'), tmp_path)
    assert code == 3, err[-2000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: iteration ') and 'non-finite' in lines[0]
    assert 'train loss' in lines[0] or 'gradient norm' in lines[0]
    after = params(tmp_path / 'ckpt.pt')
    assert all(torch.equal(before[k], after[k]) for k in before)  # the good weights are still there


def test_nonfinite_eval_stops_before_saving(data, good_run, tmp_path):
    ckpt = torch.load(good_run[0] / 'ckpt.pt', weights_only=False)
    ckpt['model']['wte.weight'][0, 0] = float('nan')  # a model that evaluates to nan
    torch.save(ckpt, tmp_path / 'ckpt.pt')
    stamp = os.stat(tmp_path / 'ckpt.pt').st_mtime_ns, os.path.getsize(tmp_path / 'ckpt.pt')
    code, _, err = in_process('train.py', common(data, tmp_path, *GOOD, '--init_from=resume', '--max_iters=8'), tmp_path)
    assert code == 3 and err.startswith('error: iteration 4: non-finite') and 'val/loss_exact' in err, err
    assert (os.stat(tmp_path / 'ckpt.pt').st_mtime_ns, os.path.getsize(tmp_path / 'ckpt.pt')) == stamp
    assert not (tmp_path / 'best.pt').exists()


def test_best_kept_apart_from_latest_and_resume_notes(data, good_run, tmp_path):
    # a run that gets worse (lr=10: finite, but worse) never replaces best.pt: best.pt is the
    # checkpoint of the lowest exact val loss logged, ckpt.pt the latest step.
    # 5. and resuming notes every model arg the checkpoint overrides; the saved config is what ran
    copy_run(good_run[0], tmp_path)
    _, stdout, _ = in_process('train.py', common(data, tmp_path, *GOOD, '--init_from=resume', '--max_iters=10',
                                                 '--learning_rate=10', '--warmup_iters=0', '--lr_decay_iters=1000', '--n_head=4',
                                                 '--rec_start=1', '--attn_window=8'), tmp_path, check=True)
    evals = [e for e in map(json.loads, open(tmp_path / 'log.jsonl')) if e['type'] == 'eval' and e['iter'] > 0]
    best = min(evals, key=lambda e: e['val/loss_exact'])
    b, c = (torch.load(tmp_path / f, weights_only=False) for f in ('best.pt', 'ckpt.pt'))
    assert c['iter_num'] == 10 and b['iter_num'] == best['iter']
    assert b['best_val_loss'] == c['best_val_loss'] == best['val/loss_exact']
    assert max(e['val/loss_exact'] for e in evals) > best['val/loss_exact']  # it did get worse
    notes = [l for l in stdout.splitlines() if l.startswith('note: resuming')]
    assert sorted(n.split("checkpoint's ")[1].split('=')[0] for n in notes) == ['attn_window', 'n_head', 'rec_start']
    for k in ('n_head', 'rec_start', 'attn_window'):
        assert c['config'][k] == c['model_args'][k], k


def test_sample_loads_best_or_latest(data, good_run):
    # the run is task data, which lab/evaluate.py shows label by label (sample.py loads through the same load_model)
    out = good_run[0]
    for which, name in (('latest', 'ckpt.pt'), ('best', 'best.pt')):
        code, _, err = in_process('lab/evaluate.py', [f'--out_dir={out}', f'--ckpt={which}', '--start=0 1',
                                                      f'--data_root={data}'], out)
        assert code == 0, err
        assert f"loaded the {which} checkpoint {os.path.join(str(out), name)}" in err
        code, _, err = in_process('sample.py', [f'--out_dir={out}', f'--ckpt={which}', '--start=0 1', '--max_new_tokens=2',
                                                '--num_samples=1', f'--data_root={data}'], out)
        assert code == 2 and 'not sampled' in err, err  # sample.py loads the same file, then refuses task data
        assert f"loaded the {which} checkpoint {os.path.join(str(out), name)}" in err

# -----------------------------------------------------------------------------
# 2. a real signal to a real process: save at the step boundary, resume bit-identically


def launch(args, cwd, torchrun, script='train.py'):
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    cmd = ([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2'] if torchrun
           else [sys.executable]) + [os.path.join(ROOT, script)] + args
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


@pytest.mark.parametrize('torchrun,sig', [(False, signal.SIGTERM), (True, signal.SIGINT)], ids=['one', 'torchrun2'])
def test_signal_saves_at_step_boundary_and_resumes_exactly(data, tmp_path, torchrun, sig):
    # the lr schedule does not depend on max_iters (lr_decay_iters is fixed), so a run to
    # 100000 stopped at step k and resumed to K is the same run as one straight to K. lab/train.py (the
    # research model, under torchrun too): dropout, whose RNG state must resume
    args = ['--lr_decay_iters=50', '--eval_interval=100000', '--n_iter=3', '--n_grad=1',
            *(['--dropout=0.0', '--dtype=float64'] if torchrun else ['--dropout=0.1'])]  # (DDP: rank 0's RNG state is saved)
    p = launch(common(data, tmp_path / 'cut', *args, '--max_iters=100000'), tmp_path, torchrun, 'lab/train.py')
    seen = []
    try:
        for line in p.stdout:  # the handlers are installed long before the first step is logged
            seen.append(line)
            if line.startswith('iter 2:'):
                break
        if torchrun:  # Ctrl-C in a terminal: the whole process group, and torchrun passes it on again
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
        out, err = p.communicate(timeout=120)
        out = ''.join(seen) + out
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode != 0
    if not torchrun:
        assert p.returncode == 128 + sig  # 143: SIGTERM
    k = torch.load(tmp_path / 'cut' / 'ckpt.pt', weights_only=False)['iter_num']
    assert f"stopped by {sig.name} at step {k}: saved" in out, err[-2000:]
    K = k + 3
    resume = common(data, tmp_path / 'cut', *args, f'--max_iters={K}', '--init_from=resume')
    if torchrun:
        run(resume, tmp_path, torchrun=True, script='lab/train.py')
    else:  # in this process (one thread, like the subprocess): no second torch import
        in_process('lab/train.py', resume, tmp_path, check=True)
    # the uninterrupted run. torchrun: one process with the same global batch of 2 micro-batches,
    # which is bit-identical to 2 processes in float64 (grad(L/2) = grad(L)/2 exactly; a + b = b + a)
    in_process('lab/train.py', common(data, tmp_path / 'straight', *args, f'--max_iters={K}',
                                  *(['--gradient_accumulation_steps=2'] if torchrun else [])), tmp_path, check=True)
    a, b = params(tmp_path / 'straight' / 'ckpt.pt'), params(tmp_path / 'cut' / 'ckpt.pt')
    assert torch.load(tmp_path / 'cut' / 'ckpt.pt', weights_only=False)['iter_num'] == K
    for name in a:
        assert torch.equal(a[name], b[name]), name
    if torchrun:
        # 7. the docstring's command: gradient_accumulation_steps=1 raised to the 2 processes, with
        # a note; and the logged train loss is the same quantity as in one process (the mean over
        # the step's micro-batches), where it used to be the last micro-batch's
        assert 'gradient_accumulation_steps=1 raised to 2' in out
        logged = [[e['loss'] for e in map(json.loads, open(tmp_path / d / 'log.jsonl')) if e['type'] == 'train']
                  for d in ('straight', 'cut')]
        assert len(logged[0]) == len(logged[1]) == K
        np.testing.assert_allclose(logged[0], logged[1], rtol=1e-12, atol=0)

# -----------------------------------------------------------------------------
# 3. stale temp files of killed saves; fsync around the rename


def test_stale_tmp_files_removed_at_start(good_run):
    _, stdout, stale, kept = good_run
    assert not any(f.exists() for f in stale) and all(f.exists() for f in kept)
    assert sum(l.startswith('note: removed') for l in stdout.splitlines()) == 2


def test_save_fsyncs_file_and_folder(tmp_path, monkeypatch):
    synced, real = [], os.fsync

    def fsync(fd):
        synced.append(os.path.realpath(f'/proc/self/fd/{fd}'))
        real(fd)
    monkeypatch.setattr(os, 'fsync', fsync)
    checkpoint.save_checkpoint({'x': 1}, str(tmp_path / 'ckpt.pt'))
    folder = os.path.realpath(tmp_path)
    assert len(synced) == 2 and synced[0].startswith(os.path.join(folder, 'ckpt.pt.tmp.')) and synced[1] == folder
    assert os.listdir(tmp_path) == ['ckpt.pt'] and torch.load(tmp_path / 'ckpt.pt')['x'] == 1

# -----------------------------------------------------------------------------
# 4. every bad setting: one line, exit 2, before any model is built


@pytest.mark.parametrize('args,msg', [
    (['--n_iter=0'], 'n_iter=0'),
    (['--n_iter=2', '--n_grad=3'], 'n_grad=3'),
    (['--n_subsets=0'], 'n_subsets=0'),
    (['--train_mode=interleaved', '--n_subsets=17'], 'n_subsets=17'),  # rows of 16: S <= 16 (Jacobi does not read it)
    (['--eval_interval=0'], 'eval_interval=0'),
    (['--log_interval=0'], 'log_interval=0'),
    (['--eval_iters=0'], 'eval_iters=0'),
    (['--eval_examples=-1'], 'eval_examples=-1'),
    (['--batch_size=0'], 'batch_size=0'),
    (['--gradient_accumulation_steps=0'], 'gradient_accumulation_steps=0'),
    (['--learning_rate=-0.1'], 'learning_rate=-0.1'),
    (['--max_iters=-5'], 'max_iters=-5'),
    (['--device=cuda'], 'device=cuda'),
    (['--dataset=chars', '--block_size=512'], '/chars has'),
    (['--dataset=bad_ids'], 'token id 999'),
])
def test_bad_setting_is_one_line_before_the_model(data, tmp_path, args, msg):
    if args == ['--device=cuda'] and torch.cuda.is_available():
        pytest.skip('CUDA is available here')
    if args == ['--dataset=bad_ids']:
        shutil.copytree(os.path.join(data, 'chars'), tmp_path / 'bad_ids')
        meta = dataset.load_meta(tmp_path / 'bad_ids')
        ids = np.memmap(tmp_path / 'bad_ids' / 'val.bin', dtype=meta['dtype'], mode='r+')
        ids[3] = 999  # a corrupt id; the file size is unchanged, so load_meta accepts it
        ids.flush()
        data = str(tmp_path)
    args = [f'--dataset={data}/{a[10:]}' if a.startswith('--dataset=') else a for a in args]  # (a path)
    code, out, err = in_process('train.py', common(data, tmp_path / 'out', '--max_iters=2', *args), tmp_path)
    assert code == 2 and err.count('\n') == 1 and err.startswith('error:') and msg in err, err
    assert 'parameters' not in out  # the model summary line: no model was built


def test_jacobi_ignores_n_subsets(data, tmp_path):
    # n_subsets is read by interleaved training only: a Jacobi run with S > the row length trains
    code, out, err = in_process('train.py', common(data, tmp_path / 'out', '--max_iters=1', '--train_mode=jacobi',
                                                   '--n_subsets=17'), tmp_path)
    assert code == 0 and 'iter 1:' in out, err


@pytest.mark.parametrize('args,msg', [(['--top_k=-1'], 'top_k=-1'), (['--temperature=-0.5'], 'temperature=-0.5'),
                                      (['--ckpt=newest'], "ckpt='newest'")])
def test_sample_bad_setting_is_one_line(data, tmp_path, args, msg):
    code, _, err = in_process('sample.py', ['--init_from=scratch', f'--data_root={data}', '--dataset=s5_Z2', '--start=0 1',
                                            '--max_new_tokens=4', '--num_samples=1', *args], tmp_path)
    assert code == 2 and err.count('\n') == 1 and msg in err, err

# -----------------------------------------------------------------------------
# 6. downloads: a network that accepts and never answers ends with one line, quickly


@pytest.fixture
def black_hole(tmp_path):
    """A proxy on 127.0.0.1 that accepts connections and never answers; the environment of a
    child process that goes through it, with a 2 s FETCH_TIMEOUT and empty caches."""
    srv = socket.socket()
    srv.bind(('127.0.0.1', 0))
    srv.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    proxy = f'http://127.0.0.1:{srv.getsockname()[1]}'
    env = {k: v for k, v in os.environ.items() if k.lower() not in ('no_proxy', 'hf_hub_offline', 'transformers_offline')}
    env.update(HTTPS_PROXY=proxy, HTTP_PROXY=proxy, https_proxy=proxy, http_proxy=proxy, FETCH_TIMEOUT='2',
               TIKTOKEN_CACHE_DIR=str(tmp_path / 'tiktoken'), HF_HOME=str(tmp_path / 'hf'), OMP_NUM_THREADS='1')
    yield env
    srv.close()
    for c in held:
        c.close()


@pytest.mark.parametrize('cmd,msg', [
    (['prepare.py', 'tinystories'], 'could not fetch the GPT-2 tokenizer: no answer within 2 s'),
    (['lab/train.py', '--init_from=HuggingFaceTB/SmolLM2-135M'], 'could not fetch the model HuggingFaceTB/SmolLM2-135M'),
])
def test_download_through_a_silent_network_is_bounded(data, tmp_path, black_hole, cmd, msg):
    extra = [f'--out_dir={tmp_path}/x'] + ([f'--dataset={data}/s5_Z2'] if cmd[0].endswith('train.py') else [])
    t = time.time()
    p = subprocess.run([sys.executable, os.path.join(ROOT, cmd[0]), *cmd[1:], *extra], cwd=tmp_path, env=black_hole,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and msg in p.stderr and 'Traceback' not in p.stderr, p.stderr[-2000:]
    assert time.time() - t < 45  # the 2 s bound, plus interpreter and torch start-up on a busy machine

# -----------------------------------------------------------------------------
# 8. one bool rule for every script; an empty text file


def test_one_bool_parser_for_all_scripts():
    for raw, want in [('True', True), ('true', True), ('1', True), ('yes', True),
                      ('False', False), ('false', False), ('0', False), ('NO', False)]:
        g = {'compile': not want}
        configurator.configure(g, ['compile'], [f'--compile={raw}'])
        assert g['compile'] is want, raw
    for raw in ('maybe', '2', ''):
        with pytest.raises(SystemExit):
            configurator.configure({'compile': False}, ['compile'], [f'--compile={raw}'])
    # prepare.py and bench.py parse with the same function (no parser of their own)
    for script in ('prepare.py', 'bench.py', 'train.py', 'sample.py', 'lab/evaluate.py', 'lab/compare.py'):
        src = open(os.path.join(ROOT, script)).read()
        assert 'configure(' in src and not any(w in src for w in ('literal_eval', 'def parse_args', 'def set_key')), script


def test_prepare_text_on_an_empty_file(tmp_path):
    (tmp_path / 'empty.txt').write_text('')
    with pytest.raises(SystemExit, match='the file is empty'):
        corpora.prepare_text(dict(corpora.TEXT_DEFAULTS, input=str(tmp_path / 'empty.txt'), out_dir=str(tmp_path / 'o')))

"""Trust (issue 41): a checkpoint cannot run code, one writer per folder, an overwrite or a
re-prepare loses nothing until the new one exists, disk and permission faults are one line, and
a resume says what it does. train.py, sample.py and lab/evaluate.py run in this process (test_reliability.in_process),
the tools and the lock holders as processes."""

import os
import subprocess
import sys

import pytest
import torch

from test_bad_inputs import one_line, prep, snapshot, train_args, world  # noqa: F401 (world: a fixture)
from test_reliability import in_process
from test_train import ROOT


def script(*argv, cwd=None):
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, 'OMP_NUM_THREADS': '1'})


class Evil:
    """What a crafted checkpoint holds: unpickling it calls os.system."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))

# -----------------------------------------------------------------------------
# 1. a checkpoint cannot run code


def test_malicious_checkpoint_is_refused_unrun_by_every_reader(world, tmp_path):
    marker = tmp_path / 'ran'
    evil = tmp_path / 'evil' / 'ckpt.pt'
    evil.parent.mkdir()
    torch.save({'model': Evil(marker), 'model_args': {}, 'config': {}, 'optimizer': {}}, evil)
    data = [f'--data_root={world}/data', '--dataset=s5_Z2']
    results = {
        'sample.py': in_process('sample.py', ['--init_from=' + str(evil), *data, '--start=0 1'], tmp_path),
        'lab/evaluate.py': in_process('lab/evaluate.py', ['--init_from=' + str(evil), *data, '--start=0 1'], tmp_path),
        'train.py': in_process('train.py', train_args(world, evil.parent, '--init_from=resume'), tmp_path),
    }
    for name, argv in [('lab/replay.py', [os.path.join(ROOT, 'lab', 'replay.py'), evil, tmp_path / 'replay']),
                       ('lab/prefill.py', [os.path.join(ROOT, 'lab', 'prefill.py'), '--quick=True', '--threads=1',
                                           f'--prefill_ckpt={evil}'])]:
        p = script(*argv, cwd=tmp_path)
        results[name] = (p.returncode, p.stdout, p.stderr)
    from support.checkpoint import CheckpointError, load_checkpoint, read_checkpoint  # lab/compare.py's readers
    for read in (read_checkpoint, load_checkpoint):
        with pytest.raises(CheckpointError, match='refused'):
            read(str(evil))
    for name, (code, out, err) in results.items():
        assert code != 0 and 'refused' in err and 'posix.system' in err and 'Traceback' not in err, (name, err)
        assert len([l for l in err.splitlines() if l.startswith('error:')]) == 1, (name, err)
    assert not marker.exists()


def test_real_checkpoints_still_load(world):
    # the allowlist covers what train.py saves (numpy's RNG state included), and a run resumes from it
    from support.checkpoint import read_checkpoint
    ck = read_checkpoint(str(world / 'run' / 'ckpt.pt'))
    assert ck['rng']['numpy'][1].dtype.name == 'uint32' and ck['iter_num'] == 2
    fixture = torch.load(os.path.join(ROOT, 'tests', 'fixtures', 'fingerprint.pt'), weights_only=True)
    assert fixture

# -----------------------------------------------------------------------------
# 2. one writer per folder


@pytest.fixture
def holder(tmp_path):
    """A process holding the lock of a folder (as a running train.py or prepare.py does) -> start(folder) -> its pid."""
    procs = []

    def start(folder):
        code = (f"import sys; sys.path.insert(0, {ROOT!r}); import time; from support import dataset; "
                f"dataset.lock_folder({str(folder)!r}, 'a test'); print('locked', flush=True); time.sleep(600)")
        os.makedirs(folder, exist_ok=True)
        p = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == 'locked'
        procs.append(p)
        return p.pid
    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_second_writer_is_refused_naming_the_holder(world, tmp_path, holder):
    from support import dataset
    run_dir = tmp_path / 'run'
    pid = holder(run_dir)
    assert dataset.lock_holder(str(run_dir)) == str(pid)  # what lab/compare.py checks before it starts a trainer
    for extra in ([], ['--overwrite=True'], ['--init_from=resume']):
        code, out, err = in_process('train.py', train_args(world, run_dir, *extra), tmp_path)
        lines = err.strip().splitlines()
        assert code != 0 and len(lines) == 1 and f'in use by process {pid}' in lines[0], (extra, err)
    assert sorted(os.listdir(run_dir)) == ['.lock']  # nothing written
    # prepare.py on a dataset folder another writer holds
    data_dir = tmp_path / 'data'
    pid = holder(data_dir)
    code, err = prep('s5', '--group=Z2', '--n_train=8', '--n_val=2', '--n_test=2', '--train_len=4', '--test_lens=6',
                     f'--out_dir={data_dir}')
    assert code != 0 and f'in use by process {pid}' in err and 'Traceback' not in err
    assert sorted(os.listdir(data_dir)) == ['.lock']


def test_lock_goes_with_its_process(world, tmp_path):
    # a writer killed by kill -9 (no cleanup) leaves no stale lock: the next run starts
    from support import dataset
    run_dir = tmp_path / 'run'
    os.makedirs(run_dir)
    subprocess.run([sys.executable, '-c', f"import sys, os; sys.path.insert(0, {ROOT!r}); from support import dataset; "
                    f"dataset.lock_folder({str(run_dir)!r}, 'x'); os.kill(os.getpid(), 9)"])
    assert (run_dir / '.lock').read_text().strip() and dataset.lock_holder(str(run_dir)) is None
    in_process('train.py', train_args(world, run_dir), tmp_path, check=True)

# -----------------------------------------------------------------------------
# 3. an overwrite or a re-prepare loses nothing until the new one exists


def kept(folder):
    """A folder's files, but the lock (which holds the last writer's PID)."""
    return {f: v for f, v in snapshot(folder).items() if f != '.lock'}


def run_files(folder):
    return {f: v for f, v in snapshot(folder).items() if f in ('ckpt.pt', 'best.pt', 'log.jsonl')}


def test_overwrite_keeps_the_old_run_until_the_new_one_checkpoints(world, tmp_path):
    before = run_files(world / 'run')
    for f in before:
        (tmp_path / f).write_bytes(before[f])
    # a bad setting: refused at start, before anything is touched
    code, out, err = in_process('train.py', train_args(world, tmp_path, '--overwrite=True', '--gate_lr_mult=-2'), world)
    one_line(code, err, "gate_lr_mult=-2.0")
    assert run_files(tmp_path) == before
    # a new run that ends before its first checkpoint (here: max_iters=0, nothing to save): the old one is back
    code, out, err = in_process('train.py', train_args(world, tmp_path, '--overwrite=True', '--max_iters=0'), world)
    assert code == 0 and 'the previous run is back' in err
    assert run_files(tmp_path) == before and not [f for f in os.listdir(tmp_path) if f.startswith('.old.')]
    # and one that checkpoints replaces it
    in_process('train.py', train_args(world, tmp_path, '--overwrite=True', '--seed=5'), world, check=True)
    assert run_files(tmp_path)['ckpt.pt'] != before['ckpt.pt'] and not [f for f in os.listdir(tmp_path) if f.startswith('.old.')]


def test_failed_or_interrupted_reprepare_keeps_the_old_dataset(tmp_path):
    import numpy as np
    from support.dataset import DataError, load_meta, write_task
    out = str(tmp_path / 'toy')
    (tmp_path / 'toy').mkdir()
    (tmp_path / 'toy' / 'notes.txt').write_text('mine')  # not a dataset file: never moved or removed

    def make_gen(fail_after):
        calls = [0]

        def generate(rng, rows):
            calls[0] += 1
            if calls[0] > fail_after:
                raise fail_after_exc
            x = rng.integers(0, 2, (rows, 4))
            return x, x.astype(np.int32)
        return lambda param: generate
    sizes = [('train', 8, 4), ('val', 4, 4)]
    write_task(out, {'seed': 0}, 'toy', ['a', 'b'], make_gen(99), sizes)
    before = kept(out)
    for fail_after_exc in (RuntimeError('generator bug'), KeyboardInterrupt()):  # a bug; SIGINT/SIGTERM (prepare.py)
        with pytest.raises(type(fail_after_exc)):
            write_task(out, {'seed': 1}, 'toy', ['a', 'b'], make_gen(2), sizes)  # the probe row, then train, then fails
        assert kept(out) == before
        assert load_meta(out)['args'] == {'seed': 0}
    with pytest.raises(DataError):  # (a checked failure: nothing was touched either)
        write_task(out, {'seed': -1}, 'toy', ['a', 'b'], make_gen(99), sizes)
    assert kept(out) == before


def test_sigterm_during_reprepare_keeps_the_old_dataset(tmp_path):
    import signal
    import time
    out = tmp_path / 's5'
    small = ['s5', '--group=Z2', '--n_val=2', '--n_test=2', '--train_len=8', '--test_lens=12', f'--out_dir={out}']
    assert prep(*small, '--n_train=8')[0] == 0
    before = kept(out)
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, 'prepare.py'), *small, '--n_train=20000000'],
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not any(f.startswith('.old.') for f in os.listdir(out)) and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 130 and 'interrupted' in err and 'Traceback' not in err, err
    assert kept(out) == before


def test_signal_while_moving_the_old_dataset_aside_waits_until_it_can_be_put_back(tmp_path, monkeypatch):
    # the race the test above can hit: SIGTERM after .old.<pid> exists but before the move is noted;
    # here the signal comes deterministically, from inside the first rename of the move
    import signal
    import threading
    from support import dataset
    out = tmp_path / 's5'
    small = ['s5', '--group=Z2', '--n_val=2', '--n_test=2', '--train_len=8', '--test_lens=12', f'--out_dir={out}']
    assert prep(*small, '--n_train=8')[0] == 0
    before = kept(out)
    real_replace = os.replace

    def replace_and_signal(src, dst):
        real_replace(src, dst)
        if '.old.' in str(dst):
            os.kill(os.getpid(), signal.SIGTERM)  # its handler raises at the next bytecode, unless held
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    monkeypatch.setattr(dataset.os, 'replace', replace_and_signal)
    # a second thread, as torch and pytest-xdist have: the kernel may hand the signal to it
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            dataset.begin_dataset(str(out))
    finally:
        stop.set()
        signal.signal(signal.SIGTERM, previous)
        monkeypatch.undo()
        dataset.abort_datasets()  # what prepare.py runs on its way out
    assert kept(out) == before

# -----------------------------------------------------------------------------
# 4. disk and permission faults: one line each, at start where they can be seen at start

ROOT_USER = os.geteuid() == 0  # root writes through chmod: such cases are simulated (os.access)


def deny(monkeypatch, path, mode):
    """path refuses mode (os.R_OK/W_OK): chmod where that works, else (root) os.access says so."""
    if not ROOT_USER:
        os.chmod(path, 0o555 if mode == os.W_OK else 0o000)
        return
    real = os.access
    monkeypatch.setattr(os, 'access', lambda p, m, *a, **k: False if os.path.realpath(p) == os.path.realpath(path)
                        and m & mode else real(p, m, *a, **k))


def test_full_disk_at_save_is_one_line_and_leaves_a_restartable_folder(world, tmp_path, monkeypatch):
    from support import checkpoint
    from support.dataset import DataError

    def full(*a, **k):
        raise RuntimeError('[enforce fail at inline_container.cc:664] . unexpected pos 4480 vs 4388')
    (tmp_path / 'old.pt').write_bytes(b'old')
    monkeypatch.setattr(torch, 'save', full)
    with pytest.raises(DataError, match='no space left on the device holding .*old.pt'):
        checkpoint.save_checkpoint({'x': 1}, str(tmp_path / 'old.pt'))
    assert os.listdir(tmp_path) == ['old.pt'] and (tmp_path / 'old.pt').read_bytes() == b'old'  # untouched, no temp
    monkeypatch.setattr(torch, 'save', lambda *a, **k: (_ for _ in ()).throw(OSError(28, 'No space left on device')))
    with pytest.raises(DataError, match='no space left'):
        checkpoint.save_checkpoint({'x': 1}, str(tmp_path / 'old.pt'))
    # train.py's first save on a full disk: one line, and the folder holds no best.pt without a ckpt.pt
    code, out, err = in_process('train.py', train_args(world, tmp_path / 'run'), tmp_path)
    assert code == 1 and err.strip().splitlines()[-1].startswith('error: no space left on the device holding')
    assert 'Traceback' not in err and not {'ckpt.pt', 'best.pt'} & set(os.listdir(tmp_path / 'run'))
    # over an old run (--overwrite=True): the old run is back
    for f, v in run_files(world / 'run').items():
        (tmp_path / 'run' / f).write_bytes(v)
    code, out, err = in_process('train.py', train_args(world, tmp_path / 'run', '--overwrite=True'), tmp_path)
    assert code == 1 and 'no space left' in err and run_files(tmp_path / 'run') == run_files(world / 'run')
    monkeypatch.undo()
    in_process('train.py', train_args(world, tmp_path / 'run2'), tmp_path, check=True)  # (the disk freed: it runs)


def test_read_only_out_dir_fails_at_start(world, tmp_path, monkeypatch):
    out = tmp_path / 'ro'
    out.mkdir()
    deny(monkeypatch, out, os.W_OK)
    try:
        code, stdout, err = in_process('train.py', train_args(world, out), tmp_path)
    finally:
        os.chmod(out, 0o755)
    one_line(code, err, 'cannot write out_dir=')
    assert 'parameters' not in stdout  # refused before the model is built, not at the first evaluation


def test_unreadable_data_is_one_line_not_never_prepared(world, tmp_path, monkeypatch):
    import shutil
    import numpy as np
    from support.dataset import DataError, load_meta, load_split
    d = tmp_path / 's5_Z2'
    shutil.copytree(world / 'data' / 's5_Z2', d)
    deny(monkeypatch, d, os.R_OK)
    try:
        with pytest.raises(DataError, match='cannot read') as e:
            load_meta(str(d))
        assert 'never prepared' not in str(e.value)
    finally:
        os.chmod(d, 0o755)
        monkeypatch.undo()
    meta = load_meta(str(d))
    monkeypatch.setattr(np, 'memmap', lambda path, *a, **k: (_ for _ in ()).throw(PermissionError(13, 'Permission denied', path)))
    with pytest.raises(DataError, match=r'cannot read .*train_x.bin \(Permission denied\)'):
        load_split(str(d), 'train', meta)

# -----------------------------------------------------------------------------
# 5. a resume says what it does


def resume(world, out, *extra, dataset='s5_Z2', script='train.py'):
    args = [a for a in train_args(world, out, dataset=dataset) if not a.startswith('--max_iters')]
    return in_process(script, [*args, '--max_iters=4', '--init_from=resume', *extra], world)


def test_resume_on_a_regenerated_dataset_is_noted(world, tmp_path):
    sizes = ['--n_val=8', '--n_test=8', '--train_len=8', '--test_lens=12']
    assert prep('s5', '--group=Z2', '--n_train=64', *sizes, f'--out_dir={tmp_path}/data/s5_Z2')[0] == 0
    in_process('train.py', train_args(tmp_path, tmp_path / 'run'), tmp_path, check=True)
    code, out, err = resume(tmp_path, tmp_path / 'run2')  # (no run there: refused)
    assert code != 0
    assert prep('s5', '--group=Z2', '--n_train=96', '--seed=7', *sizes, f'--out_dir={tmp_path}/data/s5_Z2')[0] == 0
    code, out, err = resume(tmp_path, tmp_path / 'run')
    assert code == 0, err
    note = [l for l in out.splitlines() if 'was regenerated' in l]
    assert len(note) == 1 and 'seed 1337 -> 7' in note[0] and 'split train [rows, len] [64, 8] -> [96, 8]' in note[0], out


def test_resume_applies_a_changed_optimizer_setting_with_a_note(world, tmp_path):
    import shutil
    shutil.copytree(world / 'run', tmp_path / 'run', ignore=shutil.ignore_patterns('.lock'))
    ck = torch.load(tmp_path / 'run' / 'ckpt.pt', weights_only=False)  # a run of other betas (beta2, before issue 64)
    for g in ck['optimizer']['param_groups']:
        g['betas'] = (0.9, 0.99)
    torch.save(ck, tmp_path / 'run' / 'ckpt.pt')
    code, out, err = resume(world, tmp_path / 'run', '--weight_decay=0.05', '--gate_lr_mult=0.5')
    assert code == 0, err
    notes = [l for l in out.splitlines() if l.startswith('note: resuming with')]
    assert any('weight_decay is now 0.05 (the checkpoint\'s 0.1)' in n for n in notes), out
    assert any('betas is now (0.9, 0.95)' in n for n in notes) and any('lr_mult is now 0.5' in n for n in notes), out
    ck = torch.load(tmp_path / 'run' / 'ckpt.pt', weights_only=False)
    groups = ck['optimizer']['param_groups']
    assert {g['weight_decay'] for g in groups} == {0.0, 0.05} and {tuple(g['betas']) for g in groups} == {(0.9, 0.95)}
    assert ck['config']['weight_decay'] == 0.05 and ck['config']['gate_lr_mult'] == 0.5  # what ran, recorded
    # the research model (lab/train.py): a change that regroups the parameters cannot be applied: refused in
    # one line (rec_lr_mult=10: the recurrence's own parameters leave the groups they shared at 1.0)
    in_process('lab/train.py', train_args(world, tmp_path / 'lab'), world, check=True)
    code, out, err = resume(world, tmp_path / 'lab', '--rec_lr_mult=10', script='lab/train.py')
    one_line(code, err, 'group the parameters differently', 'rec_lr_mult')


def test_resume_with_another_architecture_is_refused(world, tmp_path):
    lstm = ['--arch=lstm', '--recurrence=none', '--train_mode=plain']
    in_process('lab/train.py', train_args(world, tmp_path / 'lstm', *lstm), world, check=True)
    before = snapshot(tmp_path / 'lstm')
    code, out, err = resume(world, tmp_path / 'lstm')  # the default config: T2MLR
    one_line(code, err, 'holds an LSTM', "recurrence='t2mlr'")
    code, out, err = resume(world, world / 'run', '--recurrence=lrt', '--train_mode=interleaved')
    one_line(code, err, "holds a GPT with recurrence='t2mlr'", "recurrence='lrt'")
    assert snapshot(tmp_path / 'lstm') == before


def test_eval_only_needs_a_checkpoint(world, tmp_path):
    import shutil
    shutil.copytree(world / 'run', tmp_path / 'run', ignore=shutil.ignore_patterns('.lock'))
    before = snapshot(tmp_path / 'run')
    code, out, err = in_process('train.py', train_args(world, tmp_path / 'run', '--eval_only=True'), world)
    one_line(code, err, 'eval_only=True evaluates a trained model', '--init_from=resume')
    assert snapshot(tmp_path / 'run') == before

"""lab/chain_bursts.py on a tiny checkpoint and dataset made here: it runs, its unshifted
loss is the model's own exact loss on the same rows, it shifts g_rec back after measuring, and
a non-T2MLR checkpoint is a one-line error. lab/pairs.py on a made-up text.json. lab/replay.py
on a tiny run: a replay repeats the run, and --freeze_gates holds the gates. lab/pool.py on
made-up results.json files: the pooled medians, counts and rank test, and its one-line errors.
lab/state_parts.py: by hand on S3, and on a tiny run against its own exact accuracy."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import prepare
from lab.model_full import GPT, GPTConfig
from support.checkpoint import save_checkpoint
from support.dataset import load_meta, load_split

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(REPO, 'lab', 'chain_bursts.py')


def make(root, recurrence):
    prepare.main(['s5', '--group=Z2', '--n_train=8', '--n_val=4', '--n_test=4', '--train_len=16',
                  '--test_lens=24', f'--out_dir={root / "parity"}'])
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=32, vocab_size=2, n_layer=2, n_head=2, n_kv_head=1, n_embd=16,
                      recurrence=recurrence, rec_start=0, rec_end=1, rec_gate_init=0.5))
    path = str(root / f'{recurrence}.pt')
    save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config), 'iter_num': 7,
                     'config': {'dataset': 'parity', 'data_root': str(root)}}, path)
    return m, path


def test_chain_bursts(tmp_path):
    m, path = make(tmp_path, 't2mlr')
    r = subprocess.run([sys.executable, TOOL, path, '--batches=3'], capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr
    assert len(re.findall(r'state cut every', r.stdout)) == 4  # never, 8, 2, 1
    data = str(tmp_path / 'parity')
    X, Y = load_split(data, 'val', load_meta(data))
    m.eval()
    with torch.no_grad():
        _, loss = m(*(torch.from_numpy(a[:256].astype(np.int64)) for a in (X, Y)), mode='exact')
    for name in ('g_rec', 'g_cur'):  # the unshifted model's loss, on both lines: each shift was undone
        line = next(l for l in r.stdout.splitlines() if f'{name} shifted' in l)
        assert f'+0.000: {loss.item():.3f}' in line


def test_chain_bursts_rejects_lrt(tmp_path):
    _, path = make(tmp_path, 'lrt')
    r = subprocess.run([sys.executable, TOOL, path, '--batches=1'], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "'lrt' model" in r.stderr and 'Traceback' not in r.stderr


def test_pairs(tmp_path):
    # lab/pairs.py: medians and the rank test of two arms from a text.json; /zero picks the mode;
    # an unknown arm or mode is a one-line error
    # several files pool each model's seeds (a seed in two files must be the same run)
    runs = {'a': [{'seed': k, 'test': {'bits': {'exact': 2.0 + s, 'zero': 1.0 + s}}} for k, s in ((1, 0.01), (2, 0.02), (3, 0.03))],
            'b': [{'seed': k, 'test': {'bits': {'exact': 3.0 + s}}} for k, s in ((1, 0.01), (2, 0.02), (3, 0.03))]}
    path, part, clash = tmp_path / 'text.json', tmp_path / 'part.json', tmp_path / 'clash.json'
    path.write_text(json.dumps({'runs': runs}))
    part.write_text(json.dumps({'runs': {'a': runs['a'][:1], 'b': runs['b'][1:]}}))
    clash.write_text(json.dumps({'runs': {'b': [{'seed': 2, 'test': {'bits': {'exact': 9.0}}}]}}))
    tool = os.path.join(REPO, 'lab', 'pairs.py')
    for paths in (str(path), f'{part},{path}'):
        r = subprocess.run([sys.executable, tool, paths, 'a:b', 'a/zero:a'], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        rows = [l for l in r.stdout.splitlines() if l.startswith('| a')]
        assert '2.020 [2.010, 2.030]' in rows[0] and '-1.000' in rows[0] and rows[0].endswith('| 0.10 |')
        assert '1.020 [1.010, 1.030]' in rows[1] and rows[1].endswith('| 0.10 |')
    r = subprocess.run([sys.executable, tool, str(part), 'a:b'], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and '2.010 [2.010, 2.010]' in r.stdout and '3.025 [3.020, 3.030]' in r.stdout
    for paths, bad, msg in [(path, 'a:c', "no model 'c'"), (path, 'b/zero:a', "no 'zero' bits"), (path, 'ab', 'expected A:B'),
                            (f'{path},{clash}', 'a:b', 'b seed 2 is in two files with different bits'),
                            (f'{path},{tmp_path / "none.json"}', 'a:b', 'no such text.json')]:
        r = subprocess.run([sys.executable, tool, str(paths), bad], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and msg in r.stderr and 'Traceback' not in r.stderr


def test_replay(tmp_path):
    # lab/replay.py: resumed from a checkpoint at step 3, a run repeats the uninterrupted run's
    # steps 4-6; with --freeze_gates the scalar gates do not move while everything else trains
    prepare.main(['s5', '--group=Z2', '--n_train=64', '--n_val=8', '--n_test=8', '--train_len=8',
                  '--test_lens=12', f'--out_dir={tmp_path / "data" / "parity"}'])
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    small = ['--n_embd=16', '--n_head=2', '--n_kv_head=1', '--batch_size=4', '--n_iter=8', '--attn_window=0',
             '--lr_decay_iters=6', '--warmup_iters=1', '--eval_interval=3', '--log_interval=1', '--eval_examples=4',
             '--eval_iters=1', f'--dataset={tmp_path / "data" / "parity"}', '--seed=3']

    def train(out, steps):
        r = subprocess.run([sys.executable, os.path.join(REPO, 'lab', 'train.py'), os.path.join(REPO, 'config', 't2mlr_small.py'),
                            *small, f'--max_iters={steps}', f'--out_dir={tmp_path / out}'],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    def losses(out):
        recs = [json.loads(l) for l in open(tmp_path / out / 'log.jsonl')]
        return {r['iter']: r['loss'] for r in recs if r.get('type') == 'train'}

    def replay(out, *extra):
        r = subprocess.run([sys.executable, os.path.join(REPO, 'lab', 'replay.py'), str(tmp_path / 'half' / 'ckpt.pt'),
                            str(tmp_path / out), '--max_iters=6', *extra], capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    train('whole', 6)
    train('half', 3)
    replay('again')
    whole, again = losses('whole'), losses('again')
    assert sorted(again) == [4, 5, 6]
    for i in again:
        assert abs(again[i] - whole[i]) < 1e-6, (i, again[i], whole[i])
    replay('frozen', '--freeze_gates')
    load = lambda out: torch.load(tmp_path / out / 'ckpt.pt', map_location='cpu', weights_only=False)['model']
    before, after = load('half'), load('frozen')
    gates = [k for k in before if k.endswith(('g_rec', 'g_cur'))]
    assert gates and all(torch.equal(before[k], after[k]) for k in gates)
    assert not any(torch.equal(before[k], load('again')[k]) for k in gates)  # unfrozen, they move
    assert not torch.equal(before['wte.weight'], after['wte.weight'])  # the rest trained
    # a directory that holds a run is refused
    r = subprocess.run([sys.executable, os.path.join(REPO, 'lab', 'replay.py'), str(tmp_path / 'half' / 'ckpt.pt'),
                        str(tmp_path / 'again')], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and 'already holds a run' in r.stderr and 'Traceback' not in r.stderr


def test_pool(tmp_path):
    # two results.json files of one arm (seeds 1-2 and 3), one of another (seeds 1-3)
    def row(seed, em, escape, grad, loss):
        return {'seed': seed, 'escape': escape, 'curve': {'grad_max': grad},
                'eval': {'test_64/em_exact': em, 'val/loss_exact': loss}}

    def write(name, model, rows):
        json.dump({'lengths': [32, 48, 64], 'runs': {model: rows}}, open(tmp_path / name, 'w'))
    write('a.json', 'new', [row(1, 1.0, 300, 1e3, 0.0), row(2, 0.5, 500, 2e3, 0.1)])
    write('b.json', 'new', [row(3, 0.95, 400, 3e3, 0.0)])
    write('c.json', 'old', [row(1, 1.0, 600, 1e6, 0.01), row(2, 0.2, 1501, 1e9, 0.3), row(3, 0.99, 700, 1e7, 0.02)])
    tool = os.path.join(REPO, 'lab', 'pool.py')
    pool = lambda *a: subprocess.run([sys.executable, tool, *a], capture_output=True, text=True, timeout=60)
    r = pool(f'old=old:{tmp_path / "c.json"}', f'new=new:{tmp_path / "a.json"},{tmp_path / "b.json"}')
    assert r.returncode == 0, r.stderr
    old, new = r.stdout.splitlines()
    assert 'EM@64 0.99 [0.20, 1.00], 2/3 >= 0.9; escape 700 [600, 1501]' in old and 'p vs' not in old
    assert 'seeds 1,2,3; EM@64 0.95 [0.50, 1.00], 2/3 >= 0.9; escape 400 [300, 500]' in new
    # every new escape and grad norm ranks below every old one: 1 split of C(6, 3) = 20 each way, p = 0.1
    assert 'p vs old (escape, grad norm, val loss): 0.1, 0.1, ' in new
    r = pool(f'new=new:{tmp_path / "a.json"}@2')  # a chosen seed
    assert r.returncode == 0 and 'seeds 2; EM@64 0.50 [0.50, 0.50], 0/1' in r.stdout
    for args, msg in ((['new=new:' + str(tmp_path / 'a.json') + ',' + str(tmp_path / 'a.json')], 'seed 1 is in more than one file'),
                      (['x=old:' + str(tmp_path / 'a.json')], "has no runs of 'old'"),
                      (['x=new:' + str(tmp_path / 'a.json') + '@7'], 'seeds [7] are in none'),
                      (['x=new:' + str(tmp_path / 'nope.json')], 'no such results.json'), (['new'], 'expected NAME=MODEL')):
        r = pool(*args)
        assert r.returncode != 0 and msg in r.stderr and 'Traceback' not in r.stderr, (args, r.stderr)
    # a task whose splits are not named by length (varassign: by depth) is read by lab/compare.py's split
    # names; a file without them whose splits are not named by length is refused
    json.dump({'lengths': [70, 94], 'splits': ['test', 'test_6'], 'runs': {'va': [
        {'seed': 1, 'escape': 9, 'curve': {'grad_max': 5.0}, 'eval': {'test_6/em_exact': 0.4, 'val/loss_exact': 1.0}}]}},
        open(tmp_path / 'd.json', 'w'))
    r = pool(f'va=va:{tmp_path / "d.json"}')
    assert r.returncode == 0 and 'EM@94 0.40 [0.40, 0.40], 0/1' in r.stdout, r.stderr
    d = json.load(open(tmp_path / 'd.json'))
    del d['splits']
    json.dump(d, open(tmp_path / 'e.json', 'w'))
    r = pool(f'va=va:{tmp_path / "e.json"}')
    assert r.returncode != 0 and "no split 'test_94'" in r.stderr and 'Traceback' not in r.stderr
    # files that log the training curve and the throw-backs: counted, and the peak loss after the escape
    def curved(seed, escape, collapses, train):
        return dict(row(seed, 1.0, escape, 1e3, 0.0), collapses=collapses, curve={'grad_max': 1e3, 'train': train})
    write('f.json', 'calm', [curved(1, 100, 0, [[50, 0.7], [100, 0.1], [150, 0.05]]),
                             curved(2, 150, 0, [[100, 0.6], [150, 0.1], [200, 0.02]])])
    write('g.json', 'wild', [curved(1, 100, 1, [[100, 0.1], [150, 0.9], [200, 0.0]]),
                             curved(2, 50, 2, [[50, 0.1], [100, 0.3], [150, 0.0], [200, 0.7]])])
    r = pool(f'wild=wild:{tmp_path / "g.json"}', f'calm=calm:{tmp_path / "f.json"}')
    assert r.returncode == 0, r.stderr
    wild, calm = r.stdout.splitlines()
    assert 'thrown back 2/2, peak loss after the escape 0.800 [0.700, 0.900]' in wild
    # every calm count and peak ranks below every wild one: 1 split of C(4, 2) = 6 each way, p = 1/3
    assert 'thrown back 0/2, peak loss after the escape 0.035 [0.020, 0.050]' in calm
    assert calm.endswith('(escape, grad norm, val loss, throw-backs, peak): 0.667, 1, 1, 0.333, 0.333')


def test_relabel(tmp_path):
    """lab/relabel.py: --drop=state unlabels the training split's moves only; --ask_at=move puts
    each slot's value at the move before it, in every split, and unlabels the slots; --swap=True
    exchanges the labels of each move and its slot; with --drop=lookup the training split's moves
    are then unlabelled (the state alone), the other splits keep the swap's labels; --phase1=True
    asks the training split's values at the move too, under the dataset's own name, the other
    splits untouched."""
    sys.path.insert(0, os.path.join(REPO, 'lab'))
    from relabel import relabel
    from support.tasks import position_kinds
    prepare.main(['s5_retrieval', '--group=S3', '--k=1', '--n_actions=5', '--test_actions=7', '--n_train=30',
                  '--n_val=4', '--n_test=4', f"--out_dir={tmp_path / 'r'}"])
    meta = load_meta(str(tmp_path / 'r'))
    y = lambda d, split: np.fromfile(tmp_path / d / f'{split}_y.bin', dtype=np.int32).reshape(-1, meta['splits'][split]['len'])
    relabel('r', drop='state', data_root=str(tmp_path))
    relabel('r', ask_at='move', data_root=str(tmp_path))
    relabel('r', swap=True, data_root=str(tmp_path))
    relabel('r', swap=True, drop='lookup', data_root=str(tmp_path))
    relabel('r', phase1=True, data_root=str(tmp_path))
    assert load_meta(str(tmp_path / 'phase1' / 'r'))['name'] == 'r'  # a resume onto the official rows accepts it
    for split in ('train', 'test_7'):
        k, old, p1 = position_kinds(meta, split), y('r', split), y('phase1/r', split)
        assert (p1[:, k['state']] == old[:, k['value']]).all() if split == 'train' else (p1 == old).all()
        assert (p1[:, ~k['state']] == old[:, ~k['state']]).all()
        assert (tmp_path / 'phase1' / 'r' / f'{split}_x.bin').read_bytes() == (tmp_path / 'r' / f'{split}_x.bin').read_bytes()
    for split in ('train', 'test_7'):
        k, old, ns, am = position_kinds(meta, split), y('r', split), y('r_nostate', split), y('r_atmove', split)
        sw, nl = y('r_swap', split), y('r_swap_nolookup', split)
        assert (nl[:, k['state']] == -1).all() and (nl[:, ~k['state']] == sw[:, ~k['state']]).all() if split == 'train' else (nl == sw).all()
        assert (sw[:, k['state']] == old[:, k['value']]).all() and (sw[:, k['value']] == old[:, k['state']]).all()
        assert (sw[:, ~(k['state'] | k['value'])] == old[:, ~(k['state'] | k['value'])]).all()
        assert (ns[:, ~k['state']] == old[:, ~k['state']]).all()
        assert (ns[:, k['state']] == -1).all() if split == 'train' else (ns == old).all()
        assert (am[:, k['state']] == old[:, k['value']]).all() and (am[:, k['value']] == -1).all()
        assert (am[:, ~(k['state'] | k['value'])] == old[:, ~(k['state'] | k['value'])]).all()
        for d in ('r_nostate', 'r_atmove', 'r_swap', 'r_swap_nolookup'):  # the inputs untouched
            assert (tmp_path / d / f'{split}_x.bin').read_bytes() == (tmp_path / 'r' / f'{split}_x.bin').read_bytes()


@pytest.mark.parametrize('config,phase1', [('s5_retrieval_2phase_t2mlr.py', []),
                                            ('s5_retrieval_2phase_lrt.py', ['--train_mode=jacobi', '--n_iter=2', '--n_grad=1'])])
def test_two_phases(tmp_path, config, phase1):
    """The two-phase configs' two commands on tiny rows: phase 1 trains on lab/relabel.py
    --phase1's copy (another folder, the same dataset name; LRT's on Jacobi), phase 2 resumes
    that run on the official rows (LRT's switching to the config's interleaved scheme) and says the
    labels changed under it."""
    sys.path.insert(0, os.path.join(REPO, 'lab'))
    from relabel import relabel
    prepare.main(['s5_retrieval', '--group=S3', '--k=1', '--n_actions=5', '--test_actions=7', '--n_train=30',
                  '--n_val=4', '--n_test=4', f"--out_dir={tmp_path / 's5_retrieval_S3'}"])
    relabel('s5_retrieval_S3', phase1=True, data_root=str(tmp_path))
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    small = ['--n_embd=16', '--n_head=2', '--n_kv_head=1', '--batch_size=4', '--n_subsets=21', '--eval_interval=2',
             '--eval_examples=4', '--eval_iters=1', '--log_interval=1',
             f"--out_dir={tmp_path / 'run'}"]

    def train(*extra):
        r = subprocess.run([sys.executable, os.path.join(REPO, 'lab', 'train.py'),
                            os.path.join(REPO, 'config', config), *small, *extra],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return r.stdout + r.stderr

    out = train(f"--dataset={tmp_path / 'phase1' / 's5_retrieval_S3'}", '--max_iters=2', *phase1)
    assert f"train_mode={'jacobi' if phase1 else 'interleaved'}" in out
    out = train(f"--dataset={tmp_path / 's5_retrieval_S3'}", '--init_from=resume', '--max_iters=4')
    assert 'relabel phase1 -> None' in out  # the note that the labels changed under the run
    assert 'train_mode=interleaved' in out  # phase 2 on the config's exact scheme
    ck = torch.load(tmp_path / 'run' / 'ckpt.pt', map_location='cpu', weights_only=False)
    assert ck['iter_num'] == 4 and ck['config']['lr_decay_iters'] == 3000 and ck['config']['train_mode'] == 'interleaved'
    recs = [json.loads(l) for l in open(tmp_path / 'run' / 'log.jsonl')]
    assert sorted(r['iter'] for r in recs if r.get('type') == 'train') == [1, 2, 3, 4]


def _state_parts():
    # lab/state_parts.py by its path (lab/ on sys.path would shadow top-level modules)
    import importlib.util
    spec = importlib.util.spec_from_file_location('state_parts', os.path.join(REPO, 'lab', 'state_parts.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_state_parts_by_hand():
    # lab/state_parts.parts on S3 predictions built to agree on one part only: t = '210' swaps
    # points 0 and 2 and fixes 1; (t.y)[i] = y[t[i]] keeps where 1 goes (p[1]), (y.t)[i] = t[y[i]]
    # keeps which point lands on 1; either way the element and its sign are always wrong (t is odd)
    from support.tasks import make_group
    names, mul = make_group('S3')
    y, t = np.arange(6).repeat(3), names.index('210')
    parts = _state_parts().parts
    third = pytest.approx(1 / 3)
    got = parts(mul[t, y], y, names)
    assert got == {'element': 0.0, 'sign': 0.0, 'p[0]': 0.0, 'p[1]': 1.0, 'p[2]': 0.0,
                   'lands on 0': third, 'lands on 1': third, 'lands on 2': third}
    got = parts(mul[y, t], y, names)
    assert got == {'element': 0.0, 'sign': 0.0, 'p[0]': third, 'p[1]': third, 'p[2]': third,
                   'lands on 0': 0.0, 'lands on 1': 1.0, 'lands on 2': 0.0}
    even = names.index('120')  # a 3-cycle: the sign kept, every point moved
    got = parts(mul[y, even], y, names)
    assert got['sign'] == 1.0 and got['element'] == 0.0 and got['p[0]'] == 0.0 and got['lands on 2'] == 0.0
    assert set(parts(y, y, names).values()) == {1.0}
    assert set(parts(np.full_like(y, -1), y, names).values()) == {0.0}  # not a group element: wrong on every part


def test_state_parts_tool(tmp_path):
    # the tool on a tiny S3 run: its element accuracy is the model's own exact accuracy on the same
    # rows (every s5 label is a state); a parity run is a one-line error
    prepare.main(['s5', '--group=S3', '--n_train=8', '--n_val=4', '--n_test=6', '--train_len=16',
                  '--test_lens=24', f'--out_dir={tmp_path / "s3"}'])
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=32, vocab_size=6, n_layer=2, n_head=2, n_kv_head=1, n_embd=16,
                      recurrence='t2mlr', rec_start=0, rec_end=1, rec_gate_init=1.0))
    path = str(tmp_path / 's3.pt')
    save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config), 'iter_num': 7,
                     'config': {'dataset': 's3', 'data_root': str(tmp_path)}}, path)
    tool = os.path.join(REPO, 'lab', 'state_parts.py')
    r = subprocess.run([sys.executable, tool, path, '--rows=5'], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    X, Y = load_split(str(tmp_path / 's3'), 'test', load_meta(str(tmp_path / 's3')))
    m.eval()
    with torch.no_grad():
        pred = m(torch.from_numpy(X[:5].astype(np.int64)), mode='exact')[0].argmax(-1).numpy()
    acc = (pred == Y[:5])[Y[:5] >= 0].mean()
    line = next(l for l in r.stdout.splitlines() if l.split()[:1] == ['element'])
    assert float(line.split()[1]) == pytest.approx(acc, abs=5e-4 + 1e-9) and '5 rows, 80 state labels' in r.stdout
    _, parity = make(tmp_path, 't2mlr')
    r = subprocess.run([sys.executable, tool, parity], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and 'not a permutation group' in r.stderr and 'Traceback' not in r.stderr
    r = subprocess.run([sys.executable, tool, path, '--rows=0'], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and 'usage' in r.stderr and 'Traceback' not in r.stderr

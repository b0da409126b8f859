"""The bad-input probe, kept: every input below once lost a run or a dataset, hung, did the wrong
thing silently, or ended in a traceback. Each must now be one line (exit 2, naming the flag) or
the right behaviour, and the two that lost data must leave the finished run / the good dataset
as it was.

train.py, sample.py and lab/evaluate.py run in this process (test_reliability.in_process), prepare.py
through its main(); bench.py (and the lab/ scripts on it) and lab/compare.py fail before they import torch,
so they run as processes.
The sections after the first probe's are the second's (issue 41): the LSTM through the other
tools, options, inputs, data, tools."""

import contextlib
import io
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import prepare
from lab.model_full import GPT, GPTConfig
from test_reliability import in_process
from test_train import ROOT, TINY
from support.dataset import load_meta

RUN = ['--max_iters=2', '--eval_interval=2', '--n_iter=2', '--n_grad=1']
SIZES = ['--n_train=64', '--n_val=8', '--n_test=8', '--train_len=8', '--test_lens=12']


def prep(*argv):
    """prepare.py argv in this process -> (exit code, stderr), as `python prepare.py argv` would end."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            prepare.main([str(a) for a in argv])
    except SystemExit as e:
        if isinstance(e.code, str):  # a DataError: the interpreter prints its message, exit 1
            return 1, err.getvalue() + e.code + '\n'
        return e.code, err.getvalue()
    return 0, err.getvalue()


def snapshot(folder):
    return {f: open(os.path.join(folder, f), 'rb').read() for f in sorted(os.listdir(folder))}


@pytest.fixture(scope='module')
def world(tmp_path_factory):
    """Two tiny datasets with the same vocabulary size (parity Z2 and S2: 2 tokens each) and a
    finished 2-step run on Z2 (ckpt.pt, best.pt, log.jsonl)."""
    root = tmp_path_factory.mktemp('bad')
    for group in ('Z2', 'S2'):
        assert prep('s5', f'--group={group}', *SIZES, f'--out_dir={root}/data/s5_{group}')[0] == 0
    in_process('train.py', train_args(root, root / 'run'), root, check=True)
    return root


def train_args(root, out, *extra, dataset='s5_Z2'):
    return TINY + [f'--dataset={root}/data/{dataset}', f'--out_dir={out}', *RUN, *extra]


def one_line(code, err, *words):
    """exit 2, one 'error:' line naming what was wrong, no traceback."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith('error: '), (code, err)
    assert 'Traceback' not in err and all(w in lines[0] for w in words), err
    return lines[0]

# -----------------------------------------------------------------------------
# losses: a finished run and a good dataset stay as they were


def test_new_run_over_a_finished_run_is_refused(world, tmp_path):
    before = snapshot(world / 'run')
    assert {'ckpt.pt', 'best.pt', 'log.jsonl'} <= set(before)
    code, out, err = in_process('train.py', train_args(world, world / 'run'), world)
    one_line(code, err, 'holds a run', 'ckpt.pt and best.pt', '--init_from=resume', '--overwrite=True')
    assert snapshot(world / 'run') == before and 'parameters' not in out
    # --overwrite=True replaces it: the old files go only once every check has passed, and the
    # log holds the new run's records alone
    for f in before:
        (tmp_path / f).write_bytes(before[f])
    code, out, err = in_process('lab/train.py', train_args(world, tmp_path, '--overwrite=True', '--norm_eps=0'), world)
    one_line(code, err, 'norm_eps=0.0')
    assert snapshot(tmp_path) == before  # a bad setting after the flag: still nothing removed
    _, out, _ = in_process('train.py', train_args(world, tmp_path, '--overwrite=True', '--seed=7'), world, check=True)
    assert "note: overwrite=True: removed the previous run's ckpt.pt, best.pt, log.jsonl" in out
    new = torch.load(tmp_path / 'ckpt.pt', weights_only=False)
    assert new['config']['seed'] == 7 and new['iter_num'] == 2
    assert open(tmp_path / 'log.jsonl').read().count('"type": "eval"') == 2  # steps 0 and 2


def test_resume_on_another_dataset_of_the_same_vocab_size_is_refused(world):
    before = snapshot(world / 'run')
    code, out, err = in_process('train.py', train_args(world, world / 'run', '--init_from=resume', '--max_iters=4',
                                                       dataset='s5_S2'), world)
    one_line(code, err, 'trained on dataset s5_Z2', 's5_S2', 'another vocabulary', '--overwrite=True')
    assert snapshot(world / 'run') == before


@pytest.mark.parametrize('argv', [['s5', '--seed=-1'], ['s5_retrieval', '--seed=-7']])
def test_bad_seed_keeps_the_good_dataset(world, argv):
    data = world / 'data' / 's5_Z2'
    before = snapshot(data)
    one_line(*prep(*argv, f'--out_dir={data}'), f'{argv[1]}: must be >= 0')
    assert snapshot(data) == before and load_meta(str(data))['splits']['train']['n'] == 64

# -----------------------------------------------------------------------------
# hangs: sized arithmetically, refused in well under a second


@pytest.mark.parametrize('argv,flag', [(['s5', '--train_len=1e7'], '--train_len=10000000'),
                                       (['s5', '--train_len=1e8'], '--train_len=100000000'),
                                       (['s5', '--train_len=1e9'], '--train_len=1000000000'),
                                       (['s5', '--test_lens=48,1000000'], '--test_lens=48,1000000'),
                                       (['s5_retrieval', '--n_actions=1e8'], '--n_actions=100000000'),
                                       (['s5_retrieval', '--n_actions=32', '--k=100000'], '--k=100000')])
def test_huge_rows_fail_fast(world, tmp_path, argv, flag):
    t = time.time()
    one_line(*prep(*argv, f'--out_dir={tmp_path}/d'), flag, 'tokens; at most 8,192')
    assert time.time() - t < 5 and not os.path.exists(tmp_path / 'd')


def test_disk_size_is_arithmetic(tmp_path, monkeypatch):
    # a huge split is refused from its row length alone: the generator is asked for one short row
    calls = []
    from support import tasks
    real = tasks.running_product
    monkeypatch.setattr(tasks, 'running_product', lambda mul, x: calls.append(x.shape) or real(mul, x))
    code, err = prep('s5', '--n_train=1e12', '--train_len=8192', f'--out_dir={tmp_path}/big')
    assert code == 1 and 'GiB free' in err and calls == [(1, 48)]  # one row of the shortest split

# -----------------------------------------------------------------------------
# every other bad setting: one line, exit 2, before any model is built


LAB = 'lab/train.py'  # the research model's options


@pytest.mark.parametrize('script,args,words', [
    (LAB, ['--rec_gate_gain=-1'], ['rec_gate_gain=-1.0', '>= 0']),
    (LAB, ['--rec_lr_mult=-1'], ['rec_lr_mult=-1.0', '>= 0']),
    ('train.py', ['--gate_lr_mult=-1'], ['gate_lr_mult=-1.0', '>= 0']),
    ('train.py', ['--vocab_pad=1e9'], ['vocab_pad=1000000000', '1..4096']),
    (LAB, ['--vocab_pad=1e9'], ['vocab_pad=1000000000', '1..4096']),
    (LAB, ['--norm_eps=-1'], ['norm_eps=-1.0', '> 0']),  # once a divergence blamed on the learning rate
    (LAB, ['--rope_theta=0'], ['rope_theta=0.0', '> 0']),
    ('train.py', ['--init_from=/a/local/path'], ['init_from=/a/local/path', 'no such folder']),  # once "could not fetch from the Hub"
    ('train.py', ['--init_from=./nowhere'], ['init_from=./nowhere', 'no such folder']),
    ('train.py', ['--init_from=HuggingFaceTB/SmolLM2-135M'], ['init_from=HuggingFaceTB/SmolLM2-135M', 'lab/train.py']),  # a retrofit
    ('train.py', ['--rec_lr_mult=2'], ["unknown config key 'rec_lr_mult'"]),  # the research model's: lab/train.py's setting
    (LAB, ['--beta2=0.99'], ["unknown config key 'beta2'"]),  # (gone: AdamW's betas are (0.9, 0.95))
])
def test_train_bad_setting(world, tmp_path, script, args, words):
    code, out, err = in_process(script, train_args(world, tmp_path / 'out', *args), world)
    one_line(code, err, *words)
    assert 'parameters' not in out and not os.path.exists(tmp_path / 'out' / 'ckpt.pt')


def test_train_out_dir_is_a_file(world, tmp_path):
    (tmp_path / 'f').write_text('a file')
    code, _, err = in_process('train.py', train_args(world, tmp_path / 'f'), world)
    one_line(code, err, f'out_dir={tmp_path}/f is a file')
    code, _, err = in_process('train.py', train_args(world, tmp_path / 'f' / 'sub'), world)
    one_line(code, err, f'out_dir={tmp_path}/f/sub', 'cannot create')


def test_recompute_in_plain_mode_is_noted(world, tmp_path):
    _, out, _ = in_process('lab/train.py', train_args(world, tmp_path, '--recurrence=none', '--train_mode=plain',
                                                      '--recompute=True', '--max_iters=0'), world, check=True)
    assert "note: recompute=True does nothing with train_mode='plain'" in out


@pytest.mark.parametrize('args,words', [
    (['--prefill=exact', '--prefill_tol=0.1'], ["prefill_tol=0.1 applies to prefill='jacobi' only"]),
    (['--prefill_tol=0.1'], ["prefill_tol=0.1", "(prefill is 'exact')"]),  # the default prefill of task data
    (['--prefill=jacobi', '--prefill_iters=0'], ['prefill_iters=0', '>= 1']),
    (['--prefill_iters=-3'], ['prefill_iters=-3', '>= 1']),
    (['--attn_window=-7'], ['attn_window=-7', '-1 for the model']),
    (['--init_from=/a/local/path'], ['init_from=/a/local/path', 'no such folder']),
])
def test_sample_bad_setting(world, tmp_path, args, words):
    bad_setting(world, tmp_path, 'sample.py', args, words)


@pytest.mark.parametrize('args,words', [
    (['--profile_rows=-5'], ['profile_rows=-5', '>= 1']),
    (['--profile_rows=0'], ['profile_rows=0', '>= 1']),
    (['--attn_window=-7'], ['attn_window=-7', '-1 for the model']),
    (['--jacobi_profile=missing/p.png'], ['jacobi_profile=missing/p.png', 'does not exist']),
    (['--trace=missing/t.png'], ['trace=missing/t.png', 'does not exist']),
    (['--jacobi_profile=p.png', '--profile_with=notes.txt'], ['profile_with: notes.txt is not a profile']),
    (['--init_from=/a/local/path'], ['init_from=/a/local/path', 'no such folder']),
])
def test_evaluate_bad_setting(world, tmp_path, args, words):
    bad_setting(world, tmp_path, 'lab/evaluate.py', args, words)


def bad_setting(world, tmp_path, script, args, words):
    """script on the task data with args: one line naming the setting, nothing on stdout, nothing written."""
    (tmp_path / 'notes.txt').write_text('not json')
    scratch = [] if any(a.startswith('--init_from') for a in args) else ['--init_from=scratch']
    code, out, err = in_process(script, [*scratch, f'--data_root={world}/data', '--dataset=s5_Z2', '--start=0 1',
                                         *args], tmp_path)
    one_line(code, err, *words)
    assert not out and os.listdir(tmp_path) == ['notes.txt']


def test_generate_checks_its_arguments():
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=16, vocab_size=8, n_layer=2, n_head=2, n_kv_head=1, n_embd=16, recurrence='t2mlr'))
    x = torch.zeros(1, 2, dtype=torch.long)
    for kw, msg in [(dict(temperature=-1), 'temperature=-1 must be >= 0'),  # once: the inverted distribution
                    (dict(top_k=0), 'top_k=0 must be None'), (dict(top_k=-1), 'top_k=-1 must be None'),
                    (dict(prefill='jacobi', prefill_iters=0), 'prefill_iters=0 must be >= 1'),
                    (dict(prefill='jacobi', prefill_iters=-3), 'prefill_iters=-3 must be >= 1'),
                    (dict(prefill='jacobi', prefill_tol=-1.0), 'prefill_tol=-1.0 must be >= 0')]:
        with pytest.raises(ValueError, match=msg.replace('(', r'\(')):
            m.generate(x, 2, **kw)
    assert m.generate(x, 2, temperature=0.5, top_k=1).shape == (1, 4)  # the good ones still sample


@pytest.mark.parametrize('argv,words', [(['stdlib_char', '--max_files=-5'], ['--max_files=-5', '>= 0']),
                                        (['s5', '--n_train=0'], ['--n_train=0', '>= 1']),
                                        (['varassign', '--n_chains=0'], ['--n_chains=0', '>= 1']),
                                        (['s5', '--test_lens=16,0'], ['--test_lens=16,0', '>= 1']),
                                        (['s5_retrieval', '--k=0'], ['--k=0', '>= 1'])])
def test_prepare_bad_setting(tmp_path, argv, words):
    one_line(*prep(*argv, f'--out_dir={tmp_path}/d'), *words)
    assert not os.path.exists(tmp_path / 'd')


def test_prepare_removes_the_temp_files_of_a_killed_run(tmp_path):
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()  # a pid that is no longer alive: a prepare killed by SIGKILL mid-write
    out = tmp_path / 'stdlib'
    out.mkdir()
    stale = [out / f'train.bin.tmp.{dead.pid}', out / f'meta.json.tmp.{dead.pid}']
    kept = [out / f'val.bin.tmp.{os.getppid()}', out / 'notes.tmp.1']  # a live writer's; not ours
    for f in stale + kept:
        f.write_bytes(b'half a file')
    assert prep('stdlib_char', '--max_files=6', '--hold_out_every=3', f'--out_dir={out}')[0] == 0
    assert not any(f.exists() for f in stale) and all(f.exists() for f in kept)
    assert load_meta(str(out))['source']['files'] == 6


@pytest.mark.parametrize('script,args,words', [
    ('lab/compare.py', ['--seeds='], ["seeds=''", 'comma list of integers']),
    ('bench.py', ['--vocab_size=0'], ['vocab_size=0', '>= 1']),
    ('lab/memory.py', ['--mem_len=-5'], ['mem_len=-5', '>= 0']),
    ('bench.py', ['--out=missing/b.json'], ['out=missing/b.json', 'does not exist']),
    ('lab/plot.py', ['--out=missing/b.png'], ['out=missing/b.png', 'does not exist']),
    ('lab/prefill.py', ['--prefill_tol=-1'], ['prefill_tol=-1.0', '>= 0']),
])
def test_script_bad_setting(tmp_path, script, args, words):
    # before the work starts (bench.py and lab/: before they import torch), so well under a few seconds
    t = time.time()
    p = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    one_line(p.returncode, p.stderr, *words)
    assert time.time() - t < 10 and not p.stdout


def test_compare_restarts_an_interrupted_run(world, tmp_path):
    # an interrupted run of lab/compare.py: a checkpoint, and a log without the final evaluation.
    # lab/compare.py starts it over (it must say --overwrite=True to train.py, or nothing would run)
    run_dir = tmp_path / 'cmp' / 'plain_s1'
    run_dir.mkdir(parents=True)
    for f in ('ckpt.pt', 'best.pt'):
        (run_dir / f).write_bytes((world / 'run' / f).read_bytes())
    (run_dir / 'log.jsonl').write_text(open(world / 'run' / 'log.jsonl').readline())
    p = subprocess.run([sys.executable, os.path.join(ROOT, 'lab', 'compare.py'), '--quick=True', '--max_iters=1', '--seeds=1',
                        '--models=plain', f'--data_root={world}/data', f'--out_dir={tmp_path}/cmp'],
                       capture_output=True, text=True, timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert torch.load(run_dir / 'ckpt.pt', weights_only=False)['config']['recurrence'] == 'none'

# -----------------------------------------------------------------------------
# second probe (issue 41, item 7). The LSTM through the other tools: what does not apply to it is
# one line, what does runs


@pytest.fixture(scope='module')
def lstm_run(world):
    in_process('lab/train.py', train_args(world, world / 'lstm', '--arch=lstm', '--recurrence=none', '--train_mode=plain'),
               world, check=True)
    return world / 'lstm'


def loaded(err):
    """sample.py's (or lab/evaluate.py's) stderr less its 'note: loaded the ... checkpoint' line (it comes before
    the checks that need the model)."""
    return '\n'.join(line for line in err.splitlines() if not line.startswith('note: loaded'))


@pytest.mark.parametrize('script,arg', [('lab/evaluate.py', '--trace=t.png'), ('sample.py', '--prefill=jacobi'),
                                        ('sample.py', '--prefill_iters=3'), ('sample.py', '--prefill_tol=0.1'),
                                        ('sample.py', '--attn_window=4'), ('lab/evaluate.py', '--attn_window=4'),
                                        ('lab/evaluate.py', '--prefill=jacobi'), ('lab/evaluate.py', '--jacobi_profile=p.png')])
def test_sample_lstm_refuses_what_it_cannot_do(lstm_run, tmp_path, script, arg):
    code, out, err = in_process(script, [f'--out_dir={lstm_run}', '--init_from=resume', '--start=0 1', arg], tmp_path)
    one_line(code, loaded(err), arg[2:].split('=')[0], 'does not apply to an LSTM')
    assert not out and not os.listdir(tmp_path)


def test_lab_prefill_ckpt_lstm_fails_at_start(lstm_run, tmp_path):
    t = time.time()
    p = subprocess.run([sys.executable, os.path.join(ROOT, 'lab', 'prefill.py'), f'--prefill_ckpt={lstm_run}/ckpt.pt'], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    one_line(p.returncode, p.stderr, 'is an LSTM', 'no prefill modes')
    assert time.time() - t < 60 and not p.stdout  # before any timing


def test_engine_on_an_lstm(lstm_run):
    from engine import Engine
    from support.checkpoint import load_checkpoint
    m = load_checkpoint(str(lstm_run / 'ckpt.pt'), 'cpu')[0].eval()
    engine, x = Engine(m, compile=False), torch.zeros(1, 3, dtype=torch.long)
    assert torch.equal(engine.generate(x, 4, temperature=0), m.generate(x, 4, temperature=0))  # the same steps
    with pytest.raises(ValueError, match='exact and zero modes of a recurrent model'):  # once: AttributeError 'rec'
        engine(x)

# -----------------------------------------------------------------------------
# options: nan and inf (they pass a `< 0` check, then "diverge"), negatives that meant something
# else, settings the chosen scheme or recurrence does not read, a model too big to build


@pytest.mark.parametrize('script,line,words', [
    ('train.py', "gate_lr_mult = float('nan')", ['gate_lr_mult=nan', 'finite']),
    ('train.py', "gate_lr_mult = 1e999", ['gate_lr_mult=inf', 'finite']),  # once: -inf gates saved, exit 0
    (LAB, "rec_lr_mult = float('inf')", ['rec_lr_mult=inf', 'finite']),
    ('train.py', "weight_decay = float('nan')", ['weight_decay=nan', 'finite']),
    (LAB, "rec_scale_max = float('inf')", ['rec_scale_max=inf', 'finite']),
    (LAB, "rec_scale_min = float('nan')", ['rec_scale_min=nan', 'finite']),
    ('train.py', "rec_gate_init = float('nan')", ['rec_gate_init=nan', 'finite']),
    (LAB, "rec_gate_init = float('nan')", ['rec_gate_init=nan', 'finite']),
    (LAB, "rec_gate_gain = float('inf')", ['rec_gate_gain=inf', 'finite']),
    (LAB, "block_len = 8", ['block_len=8', "train_mode='block' only", "'jacobi'"]),
    (LAB, "n_rounds = 4", ['n_rounds=4', "train_mode='interleaved' only"]),
    (LAB, "train_mode = 'block'\nrecompute = True", ['recompute=True', "train_mode='block'"]),
    ('train.py', "train_mode = 'block'", ["train_mode='block'", 'lab/train.py']),  # the research model's
    ('train.py', "n_rounds = 4", ['c.py', "unknown config key 'n_rounds'"]),
    ('train.py', "n_embd = 65536", ['n_embd=65536', 'GiB of float32 weights alone', 'memory available']),  # once: allocator traceback
    (LAB, "n_embd = 65536", ['n_embd=65536', 'GiB of float32 weights alone', 'memory available']),
])
def test_train_bad_option(world, tmp_path, script, line, words):
    (tmp_path / 'c.py').write_text(line + '\n')
    t = time.time()
    code, out, err = in_process(script, train_args(world, tmp_path / 'out', str(tmp_path / 'c.py')), world)
    one_line(code, err, *words)
    assert 'parameters' not in out and not os.path.exists(tmp_path / 'out' / 'ckpt.pt') and time.time() - t < 30


def test_scheme_settings_of_another_mode_are_noted_in_a_plain_baseline(world, tmp_path):
    # a recurrent config run as its plain baseline (--recurrence=none --train_mode=plain) keeps its scheme
    _, out, _ = in_process('train.py', train_args(world, tmp_path, '--recurrence=none', '--train_mode=plain',
                                                  '--n_subsets=32', '--max_iters=0'), world, check=True)
    assert "note: n_subsets=32 does nothing with train_mode='plain'" in out
    # n_subsets under Jacobi: a note too (an interleaved config's S; test_reliability.py trains such a run)
    _, out, _ = in_process('train.py', train_args(world, tmp_path / 'j', '--n_subsets=4', '--max_iters=0'), world, check=True)
    assert "note: n_subsets=4 does nothing with train_mode='jacobi' (it applies to train_mode='interleaved' only)" in out


def test_another_recurrences_options_are_not_recorded_as_applied(world, tmp_path):
    _, out, _ = in_process('lab/train.py', train_args(world, tmp_path, '--recurrence=lrt', '--train_mode=interleaved',
                                                      '--rec_scale_min=0.1', '--rec_residual_detach=True'),
                           world, check=True)
    assert "note: rec_scale_min=0.1 applies to recurrence='t2mlr' only (recurrence is 'lrt')" in out
    args = torch.load(tmp_path / 'ckpt.pt', weights_only=False)['model_args']
    assert args['rec_scale_min'] == 0.2 and args['rec_residual_detach'] is False and args['recurrence'] == 'lrt'


def test_compile_reaches_the_evaluation_engine(world, tmp_path, monkeypatch):
    # --compile=True compiles the training model and the exact evaluation's Engine
    import engine
    seen = []

    class Spy(engine.Engine):
        def __init__(self, model, compile=True):
            seen.append(compile)
            super().__init__(model, compile=False)  # that it is asked is what is checked, not the compiler
    monkeypatch.setattr(engine, 'Engine', Spy)
    monkeypatch.setattr(torch, 'compile', lambda model, **kw: seen.append(kw) or model)
    in_process('train.py', train_args(world, tmp_path, '--compile=True', '--max_iters=0'), world, check=True)
    assert seen == [True, {}]

# -----------------------------------------------------------------------------
# inputs: generate's prompts and arguments, decode_step's position and batch, a binary prompt file


def test_generate_and_decode_step_check_their_inputs():
    from engine import Engine
    from model import KVCache
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=16, vocab_size=8, n_layer=2, n_head=2, n_kv_head=1, n_embd=16, recurrence='t2mlr')).eval()
    x = torch.zeros(1, 2, dtype=torch.long)
    for args, kw, msg in [((x + 8, 2), {}, r'outside the vocabulary 0\.\.7 \(min 8, max 8\)'),  # once: IndexError
                          ((x - 1, 2), {}, r'outside the vocabulary'),
                          ((x[:, :0], 2), {}, r'an empty prompt has no next token'),
                          ((x.float(), 2), {}, 'must be integer token ids'),
                          ((x, 2), dict(top_k=2.5), r'top_k=2\.5 must be None'),  # once: a torch.topk TypeError
                          ((x, -1), {}, 'max_new_tokens=-1 must be an int >= 0')]:
        for gen in (m, Engine(m, compile=False)):
            with pytest.raises(ValueError, match=msg):
                gen.generate(*args, **kw)
    assert m.generate(x, 0).shape == (1, 2)  # nothing new to make is not an error
    tok, state = x[:, :1], torch.zeros(1, 16)
    for step in (m.decode_step, Engine(m, compile=False).decode_step):
        with pytest.raises(ValueError, match='position 16: past the model.s block_size 16'):  # once: an IndexError
            step(tok, range(16, 17), state, KVCache(2, 20))
        with pytest.raises(ValueError, match=r'pos = range\(t, t \+ 1\)'):  # lab/official.py's int, once
            step(tok, 3, state, KVCache(2, 20))
    for gen in (m, Engine(m, compile=False)):  # prefilled at batch 1, decoded at batch 4: once a cache of zeros
        cache = KVCache(2, 10) if gen is m else gen.new_cache(1, 10)  # (the engine's: a static one)
        _, state, _ = gen.prefill(x, cache)
        with pytest.raises(ValueError, match='4 token rows, but the KV cache holds 1'):
            gen.decode_step(torch.zeros(4, 1, dtype=torch.long), range(2, 3), state.expand(4, -1), cache)


@pytest.mark.parametrize('script', ['sample.py', 'lab/evaluate.py'])
def test_sample_binary_prompt_file_is_one_line(world, tmp_path, script):
    (tmp_path / 'p.bin').write_bytes(bytes(range(256)))
    code, out, err = in_process(script, ['--init_from=scratch', f'--data_root={world}/data', '--dataset=s5_Z2',
                                         f'--start=FILE:{tmp_path}/p.bin'], tmp_path)
    one_line(code, err, f'--start=FILE:{tmp_path}/p.bin', 'not UTF-8 text')
    assert not out

# -----------------------------------------------------------------------------
# data: rows and vocabularies sized from the options, the disk checked, --out_dir a file


@pytest.mark.parametrize('argv,flag', [(['assoc', '--n_queries=1e9'], '--n_queries=1000000000'),
                                       (['assoc', '--n_queries=1e6'], '--n_queries=1000000'),  # once: OOM in train.py
                                       (['assoc', '--test_queries=48,100000'], '--test_queries=48,100000')])
def test_assoc_huge_rows_fail_fast(tmp_path, argv, flag):
    t = time.time()
    one_line(*prep(*argv, f'--out_dir={tmp_path}/d'), flag, 'tokens; at most 8,192')
    assert time.time() - t < 5 and not os.path.exists(tmp_path / 'd')


def test_assoc_huge_vocabulary_fails_fast(tmp_path):
    t = time.time()
    code, err = prep('assoc', '--n_keys=1e9', f'--out_dir={tmp_path}/d')
    assert code == 1 and '--n_keys=1000000000' in err and 'at most 65,536' in err and time.time() - t < 5


def test_stdlib_char_checks_the_disk(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple
    monkeypatch.setattr(shutil, 'disk_usage', lambda p: namedtuple('u', 'total used free')(10**6, 10**6 - 1000, 1000))
    code, err = prep('stdlib_char', '--max_files=6', '--hold_out_every=3', f'--out_dir={tmp_path}/d')
    assert code == 1 and 'stdlib_char would take' in err and 'GiB free' in err
    assert not os.path.exists(tmp_path / 'd' / 'meta.json') and not os.path.exists(tmp_path / 'd' / 'train.bin')


def test_prepare_out_dir_is_a_file(tmp_path):
    (tmp_path / 'f').write_text('a file')
    one_line(*prep('s5', f'--out_dir={tmp_path}/f'), f'--out_dir={tmp_path}/f is a file')
    one_line(*prep('s5', f'--out_dir={tmp_path}/f/sub'), f'--out_dir={tmp_path}/f/sub', 'cannot create it')
    assert (tmp_path / 'f').read_text() == 'a file'

# -----------------------------------------------------------------------------
# tools: bad files, an unwritable results folder found at start, a stale score, a replay's retry


def tool(name, *args, cwd=ROOT):
    return subprocess.run([sys.executable, os.path.join(ROOT, 'lab', name), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env={**os.environ, 'OMP_NUM_THREADS': '1'})


@pytest.mark.parametrize('content,words', [(b'{not json', ['JSONDecodeError']), (b'\xff\xfe', ['UnicodeDecodeError']),
                                           (b'{"runs": {"a": [{"seed": 1}]}, "lengths": [8]}', ['no ']),
                                           (b'[1, 2]', ['no '])])
def test_pool_and_pairs_on_bad_files(tmp_path, content, words):
    (tmp_path / 'r.json').write_bytes(content)
    p = tool('pool.py', f'a=a:{tmp_path}/r.json')  # once: a JSONDecodeError or KeyError traceback
    one_line(p.returncode, p.stderr, f'{tmp_path}/r.json: not a results.json', *words)
    p = tool('pairs.py', f'{tmp_path}/r.json', 'a:b')  # sys.exit(message): exit 1, the message alone
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [p.stderr.strip()] and 'Traceback' not in p.stderr
    assert f'{tmp_path}/r.json: not a text.json' in p.stderr and all(w in p.stderr for w in words)


@pytest.mark.parametrize('flag', ['--results_dir=/proc/no/such/folder', '--results_dir=FILE/sub', '--out_dir=FILE'])
def test_compare_unwritable_results_dir_fails_at_start(world, tmp_path, flag):
    (tmp_path / 'FILE').write_text('a file')
    t = time.time()
    p = subprocess.run([sys.executable, os.path.join(ROOT, 'lab', 'compare.py'), '--quick=True', '--max_iters=1', '--seeds=1',
                        '--models=plain', f'--data_root={world}/data', f'--out_dir={tmp_path}/cmp',
                        flag.replace('FILE', str(tmp_path / 'FILE'))], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    one_line(p.returncode, p.stderr, flag.split('=')[0][2:] + '=')  # once: after all the training
    assert not p.stdout and time.time() - t < 30 and not os.path.exists(tmp_path / 'cmp' / 'plain_s1')


def test_compare_text_rerun_with_other_steps_is_rescored(tmp_path):
    # a rerun with another --max_iters retrains the run; its test bits were the old run's (test_eval.json)
    assert prep('stdlib_char', '--max_files=6', '--hold_out_every=3', f'--out_dir={tmp_path}/data/stdlib_char')[0] == 0
    cmd = [sys.executable, os.path.join(ROOT, 'lab', 'compare.py'), '--quick=True', '--seeds=1', '--dataset=stdlib_char',
           '--models=stdlib_plain', f'--data_root={tmp_path}/data', f'--out_dir={tmp_path}/cmp',
           '--extra=--block_size=16 --eval_interval=2']
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    for steps in (2, 4):
        p = subprocess.run(cmd + [f'--max_iters={steps}'], capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        scored = json.load(open(tmp_path / 'cmp' / 'text.json'))['runs']['stdlib_plain'][0]['test']
        assert scored['steps'] == steps, scored


def test_replay_retry_after_a_bad_override(world, tmp_path):
    out = tmp_path / 'replay'
    p = tool('replay.py', world / 'run' / 'ckpt.pt', out, '--max_iters=3', '--no_such_key=1', cwd=world)
    assert p.returncode == 2 and "unknown config key 'no_such_key'" in p.stderr
    p = tool('replay.py', world / 'run' / 'ckpt.pt', out, '--max_iters=3', cwd=world)  # once: "already holds a run"
    assert p.returncode == 0, p.stderr[-2000:]
    assert 'never ran a step: replaced' in p.stdout and torch.load(out / 'ckpt.pt', weights_only=False)['iter_num'] == 3
    p = tool('replay.py', world / 'run' / 'ckpt.pt', out, '--max_iters=3', cwd=world)  # a replay that ran: kept
    one_line(p.returncode, p.stderr, 'already holds a run')


@pytest.mark.parametrize('key,value,ok', [('skip_spike', 0.0, True), ('init_loss', True, True), ('gate_interval', 7, True),
                                          ('skip_spike', 10.0, False), ('rec_weight_decay', 0.01, False)])
def test_replay_of_a_run_with_a_removed_setting(world, tmp_path, key, value, ok):
    # a checkpoint from before a setting's removal: at the value that changed nothing it is dropped
    # (train.py then refuses only the bad override, not the old key); else refused in one line
    ck = torch.load(world / 'run' / 'ckpt.pt', weights_only=False)
    ck['config'][key] = value
    torch.save(ck, tmp_path / 'old.pt')
    p = tool('replay.py', tmp_path / 'old.pt', tmp_path / 'replay', '--no_such_key=1', cwd=world)
    if ok:
        assert p.returncode == 2 and "unknown config key 'no_such_key'" in p.stderr, p.stderr
    else:
        one_line(p.returncode, p.stderr, f'{key}={value!r}', 'no longer has')
        assert not os.path.exists(tmp_path / 'replay')

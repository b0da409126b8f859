"""sample.py and lab/evaluate.py: through their CLIs on tiny prepared datasets and checkpoints
made here (no train.py): task data shown label by label (lab/evaluate.py, teacher-forced, true
labels recomputed; sample.py, one forward pass per token: the exact forward's labels, of --start
or a test row), sample counts and lengths on a corpus, --start=FILE:, one-line checkpoint,
bad-symbol and missing-dataset errors, eval_split; and the streaming loop gives exactly
model.generate's tokens."""

import contextlib
import dataclasses
import io
import os
import re
import runpy
import subprocess
import sys

import numpy as np
import pytest
import torch

import prepare
from lab.model_full import GPT, GPTConfig
from lab.evaluate import eval_split
from sample import encode_prompt, read_prompt
from support import dataset, tasks
from support.checkpoint import save_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(REPO, 'sample.py')
EVALUATE = os.path.join(REPO, 'lab', 'evaluate.py')
SEP = '---------------'


def tiny_gpt(vocab, recurrence='t2mlr', seed=0, **kw):
    torch.manual_seed(seed)
    config = GPTConfig(block_size=96, vocab_size=vocab, n_layer=2, n_head=2, n_kv_head=1, n_embd=16,
                       recurrence=recurrence, rec_start=0, rec_end=1, **kw)
    return GPT(config)


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp('sample')
    data = str(root / 'parity')
    prepare.main(['s5', '--group=Z2', '--n_train=8', '--n_val=4', '--n_test=12', '--train_len=16',
                  '--test_lens=24', f'--out_dir={data}'])
    m = tiny_gpt(2)
    ckpt = str(root / 'ckpt.pt')
    save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config),
                     'config': {'dataset': 'parity', 'data_root': str(root)}}, ckpt)
    return root, data


def run(*args, cwd=None, script=SAMPLE):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, cwd=cwd or REPO, timeout=120)


def run_here(*args, script=SAMPLE):
    """sample.py's (or lab/evaluate.py's) __main__ in this process (no new interpreter, so a few
    tenths of a second) -> (exit code, stdout, stderr); a SystemExit('error: ...') prints as the
    interpreter would."""
    argv, out, err, code = sys.argv, io.StringIO(), io.StringIO(), 0
    try:
        sys.argv = [script, *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(script, run_name='__main__')
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def error_line(err):
    """The one error line that ends stderr (after the notes); no traceback."""
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith('error: ') and 'Traceback' not in err, err
    return lines[-1]


def table(stdout):
    """The per-position rows of a label table -> [(pos, input, pred, true or None, wrong)]."""
    rows = []
    for line in stdout.splitlines():
        m = re.fullmatch(r' *(\d+)  (\S+) +(\S+)(?: +([^\s*]+))?( +\*)?', line)
        if m:
            rows.append((int(m.group(1)), m.group(2), m.group(3), m.group(4), bool(m.group(5))))
    return rows


def label_rows(stdout, chars=False):
    """sample.py's label display on task data -> {'input': [...], 'model': [...], 'true': [...]}, the
    rows of all its wrapped lines joined, and 'marks': the positions marked ^ (wrong). chars: the
    task's symbols are one character each, shown without spaces."""
    rows, marked, start = {}, [], 0
    for line in stdout.splitlines():
        key = line[:7].strip()
        if key in ('input', 'model', 'true'):
            start = len(rows.get('input', [])) if key == 'input' else start  # where this chunk starts
            rows.setdefault(key, []).extend(list(line[7:]) if chars else line[7:].split())
        elif line.startswith(' ' * 7) and '^' in line:
            marked.append((start, line[7:]))
    w = 1 if chars else max(len(x) for r in rows.values() for x in r) + 1  # a column: the widest symbol and a space
    rows['marks'] = [a + i // w for a, line in marked for i, c in enumerate(line) if c == '^']
    return rows


def samples(stdout):
    blocks = stdout.split(SEP + '\n')
    assert blocks[-1] == ''
    return [b.strip() for b in blocks[:-1]]


def test_task_data_is_shown_not_sampled(setup):
    root, data = setup
    # sample.py shows its labels, not samples; a sampling setting is refused in one line
    code, out, err = run_here(f'--out_dir={root}', '--start=0 1 1 0 1', '--num_samples=3', '--max_new_tokens=7')
    assert code == 2 and not out and 'num_samples=3 applies to sampling' in error_line(err), err
    code, out, err = run_here(f'--out_dir={root}', '--start=0 1 1 0 1')
    assert code == 0 and SEP not in out and label_rows(out, chars=True)['true'] == list('01001'), err  # parity
    # the dataset comes from the checkpoint's config (data_root + dataset); the CLI once, for real
    r = run(f'--out_dir={root}', '--start=0 1 1 0 1', script=EVALUATE)
    assert r.returncode == 0, r.stderr
    assert SEP not in r.stdout and 'exact recurrence' in r.stdout.splitlines()[0]
    rows = table(r.stdout)
    assert [(p, i, t) for p, i, _, t, _ in rows] == list(zip(range(5), '0 1 1 0 1'.split(), '0 1 0 0 1'.split()))  # parity
    # the prompt from a file; --dataset given explicitly
    (root / 'prompt.txt').write_text('1 0\n')
    code, out, err = run_here(f'--init_from={root}/ckpt.pt', f'--dataset={data}', f'--start=FILE:{root}/prompt.txt',
                              script=EVALUATE)
    assert code == 0, err
    assert [(i, t) for _, i, _, t, _ in table(out)] == [('1', '1'), ('0', '1')]
    with pytest.raises(SystemExit):
        read_prompt(f'FILE:{root}/nope.txt')
    # no input: one line that names both ways to give one
    code, _, err = run_here(f'--out_dir={root}', script=EVALUATE)
    assert code == 2 and error_line(err).startswith('error: the prompt is empty'), err
    assert '--start=' in error_line(err) and '--show_split=' in error_line(err)



def opened(m):
    """m with its T2MLR gates opened: at init tanh(g) = 0 and the exact forward is the plain one."""
    if m.fusion is not None:
        with torch.no_grad():
            m.fusion.g_cur.fill_(1.0)
            m.fusion.g_rec.fill_(3.0)
    return m


def checkpoint(m, name, root, path):
    save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config),
                     'config': {'dataset': name, 'data_root': str(root)}}, path)
    return path


@pytest.fixture(scope='module')
def z2(tmp_path_factory):
    """A tiny s5 Z2 (parity) dataset with two test lengths, the longer not the last, and an
    untrained T2MLR checkpoint of it with its gates opened."""
    root = tmp_path_factory.mktemp('z2')
    data = str(root / 's5_Z2')
    prepare.main(['s5', '--group=Z2', '--n_train=8', '--n_val=4', '--n_test=3', '--train_len=8',
                  '--test_lens=40,20', f'--out_dir={data}'])
    return data, checkpoint(opened(tiny_gpt(2, seed=3)), 's5_Z2', root, str(root / 'ckpt.pt'))


def exact_labels(path, ids, rec_mask=None):
    """-> (argmax of the model's exact forward over ids, argmax of its plain forward)."""
    from support.checkpoint import load_checkpoint
    model, _ = load_checkpoint(path)
    x = torch.tensor([ids])
    with torch.no_grad():
        exact = model.eval()(x, mode='exact', rec_mask=rec_mask)[0].argmax(-1)[0].tolist()
        plain = model(x, mode='plain')[0].argmax(-1)[0].tolist()
    return exact, plain


@pytest.fixture
def passes(monkeypatch):
    """Counts the GPTs' prefill calls (their mode and length) and decode_step calls: what sample.py
    runs. Both model.py's GPT and the one checkpoints load as (support.checkpoint's) are counted."""
    from support import checkpoint as ck
    calls = {'prefill': [], 'decode_step': 0}

    def counted(name, fn):
        def prefill(self, idx, cache, mode='exact', *a, **kw):
            calls['prefill'].append((mode, idx.size(1)))
            return fn(self, idx, cache, mode, *a, **kw)

        def decode_step(self, *a, **kw):
            calls['decode_step'] += 1
            return fn(self, *a, **kw)
        return {'prefill': prefill, 'decode_step': decode_step}[name]
    for cls in {GPT, getattr(ck, 'GPT', GPT)}:
        for name in ('prefill', 'decode_step'):
            if name in vars(cls):  # its own, not inherited: each call counted once
                monkeypatch.setattr(cls, name, counted(name, vars(cls)[name]))
    return calls


def test_sample_shows_task_labels(z2, passes):
    data, ckpt = z2
    meta = dataset.load_meta(data)
    # no --start: the first row of the longest test split, with its stored labels
    code, out, err = run_here(f'--init_from={ckpt}')
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == 's5_Z2 test_40 row 0: 40 tokens, one forward pass each (KV cache + t2mlr state)'
    assert max(map(len, lines)) <= 80 and sum(l.startswith('input ') for l in lines) == 1  # 40 bits: one line
    x, y = dataset.load_split(data, 'test_40', meta)
    ids, want = x[0].tolist(), y[0].tolist()
    exact, plain = exact_labels(ckpt, ids)
    assert exact != plain  # the state matters: a plain forward would show other labels
    rows = label_rows(out, chars=True)
    name = lambda ids: [meta['itos'][i] for i in ids]
    assert rows['input'] == name(ids) and rows['true'] == name(want) and rows['model'] == name(exact)
    wrong = [t for t in range(40) if exact[t] != want[t]]
    assert rows['marks'] == wrong and wrong  # an untrained model: some wrong
    assert lines[-1] == f'{40 - len(wrong)} of 40 right (^ = wrong)'
    # as inference runs: a prefill of the first token, then one decode step per token
    assert passes == {'prefill': [('exact', 1)], 'decode_step': 39}
    # --start: bits, one a character, spaces allowed; the true labels: the parities so far
    bits = '0110 1001 1101 0'
    code, out, err = run_here(f'--init_from={ckpt}', f'--start={bits}')
    assert code == 0, err
    ids = [int(c) for c in bits.replace(' ', '')]
    rows = label_rows(out, chars=True)
    assert out.splitlines()[0] == 's5_Z2, --start: 13 tokens, one forward pass each (KV cache + t2mlr state)'
    assert rows['input'] == list(bits.replace(' ', '')) and rows['true'] == [str(v) for v in np.cumsum(ids) % 2]
    assert rows['model'] == name(exact_labels(ckpt, ids)[0])
    # a longer input wraps at 80 columns, in lines of even length
    ids = np.random.default_rng(0).integers(0, 2, size=90).tolist()
    code, out, err = run_here(f'--init_from={ckpt}', '--start=' + ''.join(map(str, ids)))
    assert code == 0, err
    lines, rows = out.splitlines(), label_rows(out, chars=True)
    assert max(map(len, lines)) <= 80 and [len(l) for l in lines if l.startswith('input')] == [7 + 45] * 2
    assert rows['input'] == name(ids) and rows['model'] == name(exact_labels(ckpt, ids)[0])
    assert rows['marks'] == [t for t in range(90) if rows['model'][t] != rows['true'][t]]
    # the CLI once, for real, with the input from a file
    path = os.path.join(os.path.dirname(ckpt), 'bits.txt')
    with open(path, 'w') as f:
        f.write('1 0 1\n1\n')
    r = run(f'--init_from={ckpt}', f'--start=FILE:{path}')
    assert r.returncode == 0, r.stderr
    rows = label_rows(r.stdout, chars=True)
    assert rows['input'] == list('1011') and rows['true'] == list('1101')
    assert rows['model'] == name(exact_labels(ckpt, [1, 0, 1, 1])[0])


def test_sample_task_bad_input_is_one_line(z2, s3):
    data, ckpt = z2
    for args, msg in ((['--start=01 20'], "error: --start: '2' is not a symbol of s5_Z2; its symbols "
                                          "(one a character, spaces allowed): 0 1"),
                      (['--start= '], "error: the prompt is empty: give s5_Z2's symbols"),
                      (['--start=0110', '--temperature=0'], 'error: temperature=0.0 applies to sampling')):
        code, out, err = run_here(f'--init_from={ckpt}', *args)
        assert code == 2 and not out and error_line(err).startswith(msg), err
        assert 'model:' not in err  # before any model is built
    # symbols of more than one character: space-separated, and the message says so
    code, out, err = run_here(f'--init_from={s3[1]["t2mlr"]}', '--start=012102')
    assert code == 2 and not out, err
    assert error_line(err) == "error: --start: '012102' is not a symbol of s5_S3; its symbols (space-separated): 012 021 102 120 201 210"



def test_sample_task_lstm(z2, tmp_path, passes):
    # an LSTM baseline runs the same loop (its prefill and decode_step: its own (h, c) state)
    from support.lstm import LSTM, LSTMConfig
    data, _ = z2
    torch.manual_seed(0)
    m = LSTM(LSTMConfig(block_size=64, vocab_size=2, n_layer=1, n_embd=8))
    ckpt = checkpoint(m, 's5_Z2', os.path.dirname(data), str(tmp_path / 'lstm.pt'))
    code, out, err = run_here(f'--init_from={ckpt}', '--start=0110100111')
    assert code == 0, err
    assert out.splitlines()[0] == 's5_Z2, --start: 10 tokens, one forward pass each (LSTM state)'
    want = m.eval()(torch.tensor([[0, 1, 1, 0, 1, 0, 0, 1, 1, 1]]))[0].argmax(-1)[0].tolist()
    assert label_rows(out, chars=True)['model'] == [str(i) for i in want]
    assert passes == {'prefill': [], 'decode_step': 0}  # (GPT's: not called)

@pytest.mark.parametrize('recurrence', ['t2mlr', 'lrt'])
def test_sample_task_with_a_recurrence_mask(tmp_path, passes, recurrence):
    # s5_retrieval (official layout): the recurrence is off on the dictionary and '|'; sample.py
    # prefills that prefix plain in one call, then a decode step per token: the exact forward's labels
    data = str(tmp_path / 'ret')
    prepare.main(['s5_retrieval', '--group=S3', '--k=2', '--n_actions=4', '--test_actions=6', '--n_train=4',
                  '--n_val=2', '--n_test=2', f'--out_dir={data}'])
    meta = dataset.load_meta(data)
    ckpt = checkpoint(opened(tiny_gpt(meta['vocab_size'], recurrence, seed=4)), 'ret', tmp_path, str(tmp_path / 'm.pt'))
    code, out, err = run_here(f'--init_from={ckpt}')
    assert code == 0, err
    x, _ = dataset.load_split(data, 'test_6', meta)
    mask = dataset.load_rec_mask(data, 'test_6', meta)[0].astype(bool)
    cut = int((~mask).sum())
    assert 0 < cut < len(mask) and not mask[:cut].any()
    exact, _ = exact_labels(ckpt, x[0].tolist(), torch.tensor(mask[None]))
    assert label_rows(out)['model'] == [meta['itos'][i] for i in exact]
    assert passes == {'prefill': [('plain', cut)], 'decode_step': len(mask) - cut}


@pytest.fixture(scope='module')
def s3(tmp_path_factory):
    """A tiny s5 S3 dataset, and untrained T2MLR and plain checkpoints of its vocabulary. The T2MLR
    gates are opened (at init tanh(g) = 0 and the exact forward is the plain one), so the exact
    recurrence's predictions differ from a plain forward's and the test can tell them apart."""
    root = tmp_path_factory.mktemp('s3')
    data = str(root / 's5_S3')
    prepare.main(['s5', '--group=S3', '--n_train=8', '--n_val=4', '--n_test=6', '--train_len=8',
                  '--test_lens=12', f'--out_dir={data}'])
    ckpts = {}
    for rec in ('t2mlr', 'none'):
        m = tiny_gpt(6, rec, seed=2)
        if m.fusion is not None:
            with torch.no_grad():
                m.fusion.g_cur.fill_(1.0)
                m.fusion.g_rec.fill_(3.0)
        ckpts[rec] = str(root / f'{rec}.pt')
        save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config),
                         'config': {'dataset': 's5_S3', 'data_root': str(root)}}, ckpts[rec])
    return data, ckpts


@pytest.mark.parametrize('rec', ['t2mlr', 'none'])
def test_show_labels_s3(s3, rec):
    from support.checkpoint import load_checkpoint
    data, ckpts = s3
    meta = dataset.load_meta(data)
    names, mul = tasks.make_group('S3')
    word = np.random.default_rng(5).integers(0, 6, size=10)
    code, out, err = run_here(f'--init_from={ckpts[rec]}', '--start=' + ' '.join(names[i] for i in word), script=EVALUATE)
    assert code == 0, err
    # the true column is the running product of the input; the prediction is the exact forward's argmax
    model, _ = load_checkpoint(ckpts[rec])
    pred = model.eval()(torch.tensor(word[None]), mode='exact')[0].argmax(-1)[0].tolist()
    if rec == 't2mlr':  # the state matters here: a plain forward would show other predictions
        assert pred != model(torch.tensor(word[None]), mode='plain')[0].argmax(-1)[0].tolist()
    want = [names[i] for i in tasks.running_product(mul, word[None])[0]]
    rows = table(out)
    assert [r[0] for r in rows] == list(range(10)) and [r[1] for r in rows] == [names[i] for i in word]
    assert [r[3] for r in rows] == want and [r[2] for r in rows] == [names[i] for i in pred]
    assert [r[4] for r in rows] == [r[2] != r[3] for r in rows]
    right = sum(not r[4] for r in rows)
    assert f'accuracy {right}/10 = {right / 10:.4f} over the labelled positions' in out
    # only a recurrent model says exact recurrence
    assert ('exact recurrence' in out) == (rec == 't2mlr') and ('plain forward' in out) == (rec == 'none')
    # a stored row: its stored labels
    code, out, err = run_here(f'--init_from={ckpts[rec]}', '--show_split=test_12', '--show_row=3', script=EVALUATE)
    assert code == 0, err
    x, y = dataset.load_split(data, 'test_12', meta)
    rows = table(out)
    assert 'test_12 row 3' in out and [r[1] for r in rows] == [names[i] for i in x[3]]
    assert [r[3] for r in rows] == [names[i] for i in y[3]]


@pytest.mark.parametrize('args,msg', [(['--show_split=nope'], "no split 'nope'"),
                                      (['--show_split=test', '--show_row=6'], 'show_row=6 is out of range'),
                                      (['--show_split=test', '--eval_split=test'], 'not both'),
                                      (['--start=012 999'], "'999' is not in the vocabulary")])
def test_show_labels_errors_are_one_line(s3, args, msg):
    code, _, err = run_here(f'--init_from={s3[1]["t2mlr"]}', *args, script=EVALUATE)
    assert code in (1, 2) and msg in error_line(err), err


def test_missing_dataset_message(tmp_path):
    # it names the built-in tasks and says a dataset can be your own (write_task), not only those
    with pytest.raises(dataset.DataError) as e:
        dataset.load_meta(str(tmp_path / 'mine'))
    msg = str(e.value.code)
    assert msg.startswith(f"error: no dataset at {tmp_path / 'mine'}") and 'meta.json' in msg
    assert 'python prepare.py NAME' in msg and 'prepare.py --help' in msg and 'write_task' in msg
    assert 'docs/usage.md' in msg
    (tmp_path / 'mine').mkdir()  # a folder without meta.json: the same hint
    with pytest.raises(dataset.DataError, match="no meta.json.*write_task"):
        dataset.load_meta(str(tmp_path / 'mine'))
    # sample.py prints it as one line (train.py calls the same load_meta and prints the same)
    code, _, err = run_here('--init_from=scratch', f'--data_root={tmp_path}', '--dataset=nothere')
    assert code == 1 and err.count('\n') == 1 and 'no dataset at' in err and 'write_task' in err, err  # no notes before it


def test_bad_checkpoint_is_one_line(setup, tmp_path):
    root, _ = setup
    (tmp_path / 'ckpt.pt').write_bytes(b'not a checkpoint at all')
    for out_dir, msg in ((tmp_path / 'missing', 'no checkpoint at'), (tmp_path, 'not a readable checkpoint')):
        r = run(f'--out_dir={out_dir}')
        assert r.returncode == 1 and 'Traceback' not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, r.stderr
    # a prompt token the dataset does not have: one line too (DataError is a SystemExit)
    encode, _ = dataset.get_tokenizer(dataset.load_meta(setup[1]))
    with pytest.raises(dataset.DataError, match="'2' is not in the vocabulary"):
        encode_prompt('0 2', dataset.load_meta(setup[1]), encode)


def test_eval_split(setup):
    root, data = setup
    r = run(f'--out_dir={root}', '--eval_split=test_24', '--eval_batch_size=5', script=EVALUATE)
    assert r.returncode == 0, r.stderr
    m = re.search(r'token accuracy ([\d.]+) \((\d+)/(\d+)\), exact match ([\d.]+) \((\d+)/(\d+)\)', r.stdout)
    assert m, r.stdout
    assert int(m.group(3)) == 12 * 24 and int(m.group(6)) == 12
    # the same numbers computed here, batch by batch vs whole split
    from contextlib import nullcontext
    from support.checkpoint import load_checkpoint
    model, _ = load_checkpoint(str(root / 'ckpt.pt'))
    model.eval()
    x, y = dataset.load_split(data, 'test_24')
    logits, _ = model(torch.from_numpy(x.astype('int64')), mode='exact')
    right = (logits.argmax(-1).numpy() == y)
    assert int(m.group(2)) == right.sum() and int(m.group(5)) == right.all(1).sum()
    assert eval_split(model, data, dataset.load_meta(data), 'test_24', 7, nullcontext())[0] == pytest.approx(right.mean())


@pytest.mark.parametrize('recurrence', ['t2mlr', 'lrt', 'none'])
@pytest.mark.parametrize('prefill', ['exact', 'jacobi'])
def test_stream_equals_generate(recurrence, prefill):
    # streaming (on_token) sees every token and changes nothing; stop_token ends early
    model = tiny_gpt(11, recurrence, seed=1, reset_token=3).eval()
    idx = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    kw = dict(temperature=1.0, top_k=5, prefill=prefill, prefill_iters=3)
    want = model.generate(idx, 12, generator=torch.Generator().manual_seed(0), **kw)
    seen = []
    got = model.generate(idx, 12, generator=torch.Generator().manual_seed(0),
                         on_token=lambda ids: seen.append(ids.size(1)), **kw)
    assert torch.equal(got, want) and seen == list(range(9, 21))
    stop = want[0, 10].item()  # the third new token
    first = (want[0, 8:] == stop).nonzero()[0].item()
    cut = model.generate(idx, 12, generator=torch.Generator().manual_seed(0), stop_token=stop, **kw)
    assert torch.equal(cut, want[:, :8 + first + 1])


def test_char_dataset_and_scratch(tmp_path):
    src = tmp_path / 'tiny.txt'
    src.write_text('\n\n'.join(f'hello world {i}' for i in range(20)))
    data = str(tmp_path / 'tiny')
    prepare.main(['text', f'--input={src}', f'--out_dir={data}', f'--cache_dir={tmp_path}/hf'])
    # an untrained model of the right vocab (smoke test), streamed
    r = run('--init_from=scratch', f'--dataset={data}', '--start=hello', '--num_samples=1', '--max_new_tokens=9')
    assert r.returncode == 0, r.stderr
    out = r.stdout.split(SEP + '\n')
    assert len(out) == 2 and out[0].startswith('hello') and len(out[0]) == len('hello') + 9 + 1  # + the final newline


def test_corpus_is_still_sampled(tmp_path):
    # a token corpus is sampled as before: several samples at once, each the prompt and its new tokens
    src = tmp_path / 'tiny.txt'
    src.write_text('\n\n'.join(f'hello world {i}' for i in range(20)))
    data = str(tmp_path / 'tiny')
    prepare.main(['text', f'--input={src}', f'--out_dir={data}', f'--cache_dir={tmp_path}/hf'])
    code, out, err = run_here('--init_from=scratch', f'--dataset={data}', '--start=hello', '--num_samples=3',
                              '--max_new_tokens=7')
    assert code == 0, err
    out = samples(out)
    assert len(out) == 3 and all(s.startswith('hello') and len(s) <= len('hello') + 7 for s in out)
    # lab/evaluate.py has no labels to show on it, nor answers to score: one line, before any model is built
    for job in ([], ['--show_split=val'], ['--eval_answers=val']):
        code, out, err = run_here('--init_from=scratch', f'--dataset={data}', '--start=hello', *job, script=EVALUATE)
        assert code == 2 and not out and err.count('\n') == 1, err
        assert ('needs prompt/response data' if job == ['--eval_answers=val'] else 'not labelled task data') in err


def test_prompt_gets_the_reset_token():
    # gpt2 corpora: every training document starts with <|endoftext|>; so does the prompt
    meta = dict(name='corpus', tokenizer='gpt2', reset_token=50256)
    assert encode_prompt('hi', meta, lambda s: [5, 6]) == ([50256, 5, 6], 1)
    assert encode_prompt('', meta, lambda s: []) == ([50256], 1)
    assert encode_prompt('<|endoftext|>hi', meta, lambda s: [50256, 5]) == ([50256, 5], 0)
    assert encode_prompt('1 0', dict(name='t', tokenizer='task', reset_token=None), lambda s: [1, 0]) == ([1, 0], 0)


def test_another_vocabulary_is_one_line(tmp_path):
    # a checkpoint records its dataset's vocabulary (train.py: data_fingerprint); data with another
    # token table is refused in one line, where it used to decode with the wrong table
    for name, group in (('a', 'Z2'), ('b', 'Z5'), ('c', 'Z2')):
        prepare.main(['s5', f'--group={group}', '--n_train=4', '--n_val=2', '--n_test=4', '--train_len=6',
                      '--test_lens=', f'--out_dir={tmp_path}/{name}'])
    m = tiny_gpt(5)
    save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config),
                     'config': {'dataset': 'a', 'data_root': str(tmp_path)},
                     'data': dataset.data_fingerprint(dataset.load_meta(str(tmp_path / 'a')))}, str(tmp_path / 'm.pt'))
    code, _, err = run_here(f'--init_from={tmp_path}/m.pt', f'--data_root={tmp_path}', '--dataset=b', '--eval_split=test',
                            script=EVALUATE)
    assert code != 0 and 'has another vocabulary than s5_Z2' in error_line(err)
    code, _, err = run_here(f'--init_from={tmp_path}/m.pt', f'--data_root={tmp_path}', '--dataset=b', '--start=0 1')
    assert code != 0 and 'has another vocabulary than s5_Z2' in error_line(err)  # sample.py reads the same check
    code, out, err = run_here(f'--init_from={tmp_path}/m.pt', f'--data_root={tmp_path}', '--dataset=c', '--eval_split=test',
                              script=EVALUATE)
    assert code == 0 and 'exact match' in out, err  # the same vocabulary, other rows: fine


def test_data_root_flag_wins_over_the_checkpoints(tmp_path):
    # a checkpoint trained elsewhere records a data_root this machine lacks: --data_root points to
    # the same dataset here (the checkpoint still names it), without it the message names the old path
    prepare.main(['s5', '--group=Z2', '--n_train=4', '--n_val=2', '--n_test=4', '--train_len=6',
                  '--test_lens=', f'--out_dir={tmp_path}/a'])
    m = tiny_gpt(5)
    save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config),
                     'config': {'dataset': 'a', 'data_root': str(tmp_path / 'elsewhere')}}, str(tmp_path / 'm.pt'))
    code, out, err = run_here(f'--init_from={tmp_path}/m.pt', f'--data_root={tmp_path}', '--eval_split=test',
                              script=EVALUATE)
    assert code == 0 and 'exact match' in out, err
    code, _, err = run_here(f'--init_from={tmp_path}/m.pt', '--eval_split=test', script=EVALUATE)
    assert code != 0 and f"no dataset at {tmp_path / 'elsewhere' / 'a'}" in error_line(err), err

"""prepare.py: every generator's labels against an independent computation, determinism,
the text path end to end (offline, char tokenizer), atomic writes, one-line errors."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import configurator
import prepare
from support import corpora, dataset
from support.dataset import DataError, load_meta, load_split, get_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPARE = os.path.join(REPO, 'prepare.py')


def run_cli(*args, env=None, cwd=None):
    full_env = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', **(env or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full_env, cwd=cwd or REPO, timeout=120)


def make(tmp_path, *argv, name='d'):
    out = str(tmp_path / name)
    prepare.main([*argv, f'--out_dir={out}'])
    return out


SMALL = ['--n_train=40', '--n_val=5', '--n_test=6']

# -----------------------------------------------------------------------------
# s5: running products, recomputed with permutation matrices

def perm_matrix(name):
    # row i has its 1 in column p[i]; then M(a) @ M(b) = M(a then b), (a.b)[i] = b[a[i]]
    p = [int(c) for c in name]
    M = np.zeros((len(p), len(p)), dtype=np.int64)
    M[np.arange(len(p)), p] = 1
    return M


@pytest.mark.parametrize('group', ['Z2', 'Z5', 'S3', 'S5', 'A5'])
def test_s5_labels(tmp_path, group):
    d = make(tmp_path, 's5', f'--group={group}', *SMALL, '--train_len=8', '--test_lens=12')
    meta = load_meta(d)
    order = {'Z2': 2, 'Z5': 5, 'S3': 6, 'S5': 120, 'A5': 60}[group]
    assert meta['vocab_size'] == len(meta['itos']) == order and len(set(meta['itos'])) == order
    assert meta['format'] == 'examples' and meta['tokenizer'] == 'task' and meta['reset_token'] is None
    assert {s: (v['n'], v['len']) for s, v in meta['splits'].items()} == \
        {'train': (40, 8), 'val': (5, 8), 'test': (6, 8), 'test_12': (6, 12)}
    itos = meta['itos']
    for split in meta['splits']:
        x, y = load_split(d, split, meta)
        assert x.dtype == np.uint16 and y.dtype == np.int32
        for row_x, row_y in zip(x, y):
            if group.startswith('Z'):
                want = np.cumsum([int(itos[t]) for t in row_x]) % order
                assert [int(itos[t]) for t in row_y] == want.tolist()
            else:
                assert itos[0] == ''.join(map(str, range(len(itos[0]))))  # element 0 = identity
                M = np.eye(len(itos[0]), dtype=np.int64)
                for tx, ty in zip(row_x, row_y):
                    M = M @ perm_matrix(itos[tx])
                    assert (M == perm_matrix(itos[ty])).all()
    if group == 'A5':  # only even permutations
        assert all(np.linalg.det(perm_matrix(n)) > 0 for n in itos)

# -----------------------------------------------------------------------------
# s5_retrieval: re-parse each row's dictionary from its tokens

def compose(a, b):
    """a then b, on permutation names: (a.b)[i] = b[a[i]]."""
    return ''.join(b[int(c)] for c in a)


@pytest.mark.parametrize('group', ['S3', 'A4'])
@pytest.mark.parametrize('layout', ['official', 'state'])
def test_retrieval_labels(tmp_path, group, layout):
    # official (princeton-pli/T2MLR's generator): a dictionary of min(moves, G) distinct keys that
    # holds every action used; every position labelled (copies on the dictionary and '|'); the
    # value of the ACTION; the recurrence off on the dictionary and '|'. state: every element in
    # the dictionary, the value of the STATE, the dictionary unlabelled, no mask
    k = 3
    d = make(tmp_path, 's5_retrieval', f'--group={group}', f'--k={k}', f'--layout={layout}', '--n_actions=5',
             '--test_actions=9', *SMALL)
    meta = load_meta(d)
    itos = meta['itos']
    G = {'S3': 6, 'A4': 12}[group]
    elements = itos[:G]
    assert bool(meta.get('rec_mask')) == (layout == 'official')
    for split, A in (('train', 5), ('test', 5), ('test_9', 9)):
        x, y = load_split(d, split, meta)
        D = G if layout == 'state' else min(A, G)
        assert x.shape[1] == D * (k + 1) + 1 + A * (k + 1)
        masks = dataset.load_rec_mask(d, split, meta)
        for i, (row_x, row_y) in enumerate(zip(x, y)):
            words, labels = [itos[t] for t in row_x], row_y.tolist()
            table = {}
            for j in range(D):  # the dictionary: distinct keys, each followed by k value characters
                key, *val = words[j * (k + 1):(j + 1) * (k + 1)]
                assert key in elements and key not in table and all(len(c) == 1 and c.isalnum() for c in val)
                table[key] = val
            prompt = D * (k + 1) + 1
            assert words[prompt - 1] == '|'
            moves = words[prompt::k + 1]
            if layout == 'official':
                assert set(moves) <= set(table) and labels[:prompt] == row_x[:prompt].tolist()
                assert masks[i].tolist() == [0] * prompt + [1] * (A * (k + 1))
            else:
                assert labels[:prompt] == [-1] * prompt
            state = ''.join(map(str, range(len(elements[0]))))  # the moves, the running state, the value
            for a, pos in enumerate(range(prompt, len(words), k + 1)):
                move, blanks = words[pos], words[pos + 1:pos + 1 + k]
                assert move in elements and blanks == ['_'] * k
                state = compose(state, move)
                want = table[move] if layout == 'official' else table[state]
                assert [itos[t] for t in labels[pos:pos + 1 + k]] == [state] + want


def test_retrieval_rejects_cyclic(tmp_path):
    with pytest.raises(DataError, match='permutation group'):
        make(tmp_path, 's5_retrieval', '--group=Z5', *SMALL)

# -----------------------------------------------------------------------------
# varassign: re-resolve each query by parsing the lines

def test_varassign_labels(tmp_path):
    d = make(tmp_path, 'varassign', '--depth=3', '--test_depths=5', '--n_chains=3', '--n_branch=2', '--n_vars=30', *SMALL)
    meta = load_meta(d)
    encode, decode = get_tokenizer(meta)
    for split, depth in (('train', 3), ('val', 3), ('test_5', 5)):
        x, y = load_split(d, split, meta)
        for row_x, row_y in zip(x, y):
            text = decode(row_x.tolist())
            assert encode(text) == row_x.tolist()
            body, query = text.split(' ? ')
            lines = [ln.split() for ln in body.split(' ;') if ln.strip()]
            assert len(lines) == 3 * (depth + 1) + 2
            env = {}
            for lhs, eq, rhs in lines:
                assert eq == '=' and lhs.isalpha() and lhs not in env  # each variable assigned once
                env[lhs] = rhs
            v, steps = query.strip(), 0
            while not v.isdigit():
                v, steps = env[v], steps + 1
            assert steps == depth + 1
            labels = row_y.tolist()
            assert labels[:-1] == [-1] * (len(labels) - 1) and meta['itos'][labels[-1]] == v

# -----------------------------------------------------------------------------
# assoc: every query looked up again in the decoded dictionary

def test_assoc_labels(tmp_path):
    d = make(tmp_path, 'assoc', '--n_keys=6', '--n_values=5', '--n_pairs=4', '--n_queries=7', '--test_queries=10', *SMALL)
    meta = load_meta(d)
    encode, decode = get_tokenizer(meta)
    assert meta['vocab_size'] == 6 + 5 + 1 and meta['task']['name'] == 'assoc'
    assert {s: v['len'] for s, v in meta['splits'].items()} == {'train': 16, 'val': 16, 'test': 16, 'test_10': 19}
    for split, Q in (('train', 7), ('test', 7), ('test_10', 10)):
        x, y = load_split(d, split, meta)
        for row_x, row_y in zip(x, y):
            words = decode(row_x.tolist()).split()
            assert encode(' '.join(words)) == row_x.tolist()
            pairs, sep, queries = words[:8], words[8], words[9:]
            table = dict(zip(pairs[::2], pairs[1::2]))
            assert sep == '|' and len(table) == 4 and len(queries) == Q  # 4 distinct keys
            assert all(k[0] == 'k' and v[0] == 'v' for k, v in table.items())
            labels = row_y.tolist()
            assert labels[:9] == [-1] * 9  # only the queries are labelled: with their values
            assert [meta['itos'][i] for i in labels[9:]] == [table[q] for q in queries]
    with pytest.raises(DataError, match='n_pairs'):
        make(tmp_path, 'assoc', '--n_keys=3', '--n_pairs=4', *SMALL, name='bad')

# -----------------------------------------------------------------------------
# determinism, CLI errors

def files_of(d):
    return {os.path.basename(f): open(f, 'rb').read() for f in sorted(glob.glob(os.path.join(d, '*.bin')))}


@pytest.mark.parametrize('argv', [['s5', '--group=S5'], ['s5_retrieval', '--group=S3'], ['varassign'], ['assoc']])
def test_deterministic_by_seed(tmp_path, argv):
    a = files_of(make(tmp_path, *argv, *SMALL, '--seed=7', name='a'))
    b = files_of(make(tmp_path, *argv, *SMALL, '--seed=7', name='b'))
    c = files_of(make(tmp_path, *argv, *SMALL, '--seed=8', name='c'))
    assert a == b
    assert all(a[f] != c[f] for f in a if f.endswith('_x.bin'))
    # a split does not depend on the size of the others
    e = files_of(make(tmp_path, *argv, '--n_train=41', '--n_val=5', '--n_test=6', '--seed=7', name='e'))
    assert e['val_x.bin'] == a['val_x.bin'] and e['test_x.bin'] == a['test_x.bin']


def test_cli_errors_are_one_line(tmp_path):
    cases = [(['s5', '--nope=1'], 2, "unknown config key 'nope'"),
             (['s5', '--n_train=many'], 2, "n_train must be int, got str 'many'"),
             (['s5', 'group=S5'], 2, 'no config file group=S5'),
             (['s5', '--train_len=0', f'--out_dir={tmp_path}/z'], 2, '--train_len=0: must be >= 1'),
             (['s5', '--n_train=1e12', f'--out_dir={tmp_path}/big'], 1, 'GiB free'),
             (['imagenet'], 2, "unknown dataset 'imagenet'"),
             (['s5', '--group=Q8', f'--out_dir={tmp_path}/q'], 1, "unknown group 'Q8'"),
             (['text', f'--input={tmp_path}/missing.txt'], 1, 'no such file')]
    for argv, code, msg in cases:
        r = run_cli(PREPARE, *argv)
        assert r.returncode == code, (argv, r.stderr)
        assert msg in r.stderr and 'Traceback' not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run_cli(PREPARE, 's5', '--n_train=30', '--n_val=3', '--n_test=3', '--test_lens=', f'--out_dir={tmp_path}/ok', cwd=str(tmp_path))
    assert r.returncode == 0 and 'wrote' in r.stdout, r.stderr
    assert set(load_meta(str(tmp_path / 'ok'))['splits']) == {'train', 'val', 'test'}
    assert not os.path.exists(tmp_path / 'big' / 'train_x.bin')  # refused before writing anything
    d = dict(n=0, f=0.5, b=True)
    configurator.configure(d, d, ['--n=1e3', '--f=2', '--b=false'])  # prepare.py's parser is every script's
    assert d == dict(n=1000, f=2.0, b=False)

# -----------------------------------------------------------------------------
# the loader refuses what is not a complete dataset

def test_loader_errors(tmp_path):
    with pytest.raises(DataError, match='python prepare.py'):
        load_meta(str(tmp_path / 'nothing'))
    os.makedirs(tmp_path / 'empty')
    with pytest.raises(DataError, match='python prepare.py'):
        load_meta(str(tmp_path / 'empty'))
    d = make(tmp_path, 's5', '--group=Z2', *SMALL)
    with pytest.raises(DataError, match='available: train, val, test, test_48, test_64'):
        load_split(d, 'test_99')
    # a missing or truncated file makes the whole dataset unacceptable
    with open(os.path.join(d, 'test_48_y.bin'), 'r+b') as f:
        f.truncate(10)
    with pytest.raises(DataError, match='test_48_y.bin is missing or has the wrong size'):
        load_meta(d)
    os.remove(os.path.join(d, 'val_x.bin'))
    with pytest.raises(DataError, match='val_x.bin is missing'):
        load_split(d, 'train')


def test_interrupted_write_is_never_accepted(tmp_path, monkeypatch):
    d = make(tmp_path, 's5', '--group=S3', *SMALL)
    assert load_meta(d)
    old = {f: open(os.path.join(d, f), 'rb').read() for f in os.listdir(d) if f != '.lock'}
    real = dataset.write_examples

    def crash_at_test(out_dir, split, *a):
        if split == 'test':
            raise KeyboardInterrupt  # e.g. Ctrl-C half way
        return real(out_dir, split, *a)

    monkeypatch.setattr(dataset, 'write_examples', crash_at_test)
    with pytest.raises(SystemExit) as e:
        make(tmp_path, 's5', '--group=S3', *SMALL)  # re-preparing the same folder
    assert e.value.code == 130  # one line, 'interrupted'
    assert not glob.glob(os.path.join(d, '*.tmp.*'))  # temp files cleaned up, the splits written before the
    assert {f: open(os.path.join(d, f), 'rb').read() for f in os.listdir(d) if f != '.lock'} == old  # interruption
    assert load_meta(d)  # gone, and the dataset that was there is back as it was (issue 41)

    # the same for a token corpus, interrupted in the middle of the stream
    monkeypatch.setattr(dataset, 'write_examples', real)
    src = tmp_path / 'corpus.txt'
    src.write_text('\n\n'.join(f'paragraph {i} ' * 5 for i in range(40)))

    def crash_after(texts, spec, num_proc):
        for i, item in enumerate(real_encoded(texts, spec, num_proc)):
            if i == 20:
                raise RuntimeError('disk full')
            yield item

    real_encoded = corpora.encoded_docs
    monkeypatch.setattr(corpora, 'encoded_docs', crash_after)
    with pytest.raises(RuntimeError):
        make(tmp_path, 'text', f'--input={src}', f'--cache_dir={tmp_path}/hf', name='t')
    with pytest.raises(DataError, match='no meta.json'):
        load_meta(str(tmp_path / 't'))
    assert not glob.glob(str(tmp_path / 't' / '*.tmp.*')) and not glob.glob(str(tmp_path / 't' / '*.bin'))

# -----------------------------------------------------------------------------
# text corpora

PARAS = [f"Paragraph {i}: the cat sat on the mat {'x' * (i % 7)}.\nA second line, naïve café {i}." for i in range(30)]


def test_text_char_end_to_end(tmp_path):
    src = tmp_path / 'story.txt'
    src.write_text('\n\n'.join(PARAS) + '\n', encoding='utf-8')
    r = run_cli(PREPARE, 'text', f'--input={src}', '--val_frac=0.1', f'--out_dir={tmp_path}/story',
                env={'HF_HOME': str(tmp_path / 'hf')})
    assert r.returncode == 0, r.stderr
    d = str(tmp_path / 'story')
    meta = load_meta(d)
    assert meta['format'] == 'tokens' and meta['tokenizer'] == 'char' and meta['reset_token'] is None
    assert meta['itos'] == sorted(set('\n\n'.join(PARAS) + '\n'))
    encode, decode = get_tokenizer(meta)
    train, val = (decode(load_split(d, s).tolist()) for s in ('train', 'val'))
    # one paragraph = one document; every 10th goes to val (the first included)
    assert val.split('\n\n')[:-1] == PARAS[::10]
    assert train.split('\n\n')[:-1] == [p for i, p in enumerate(PARAS) if i % 10]
    for split, text in (('train', train), ('val', val)):
        assert meta['splits'][split]['n'] == len(text)
        assert meta['bytes_per_token'][split] == pytest.approx(len(text.encode('utf-8')) / len(text))
    assert decode(encode('the café')) == 'the café'
    with pytest.raises(DataError, match="'Z' is not in the vocabulary"):
        encode('Zebra')


def test_text_num_proc(tmp_path):
    # the tokenizer pool (spawned workers) writes the same bytes as one process
    src = tmp_path / 'story.txt'
    src.write_text('\n\n'.join(PARAS * 20) + '\n', encoding='utf-8')
    outs = [make(tmp_path, 'text', f'--input={src}', f'--num_proc={n}', f'--cache_dir={tmp_path}/hf', name=f'p{n}')
            for n in (1, 2)]
    assert files_of(outs[0]) == files_of(outs[1]) and load_meta(outs[0])['splits']['train']['n'] > 0


def test_text_folder_documents(tmp_path):
    os.makedirs(tmp_path / 'docs' / 'sub')
    texts = {}
    for i in range(6):
        path = tmp_path / 'docs' / ('sub' if i % 2 else '') / f'doc{i}.txt'
        path.write_text(f'document {i}\n\nhas a blank line' + ('\n' if i % 3 else ''))
        texts[str(path)] = path.read_text()
    d = make(tmp_path, 'text', f'--input={tmp_path}/docs', '--val_frac=0.5', f'--cache_dir={tmp_path}/hf')
    meta = load_meta(d)
    assert meta['args']['sample_by'] == 'document' and meta['name'] == 'docs'  # auto, for a folder
    _, decode = get_tokenizer(meta)
    # whole files are documents (in sorted path order), each followed by a newline if it
    # lacks one; every second one goes to val
    docs = [t if t.endswith('\n') else t + '\n' for _, t in sorted(texts.items())]
    assert decode(load_split(d, 'val').tolist()) == ''.join(docs[0::2])
    assert decode(load_split(d, 'train').tolist()) == ''.join(docs[1::2])


class FakeGPT2:
    """Stands in for tiktoken offline: one token per byte, ids 0..255, eot 50256."""
    eot_token, n_vocab = 50256, 50257

    def encode_ordinary_batch(self, texts, num_threads=1):
        return [list(t.encode('utf-8')) for t in texts]


def test_hub_pipeline_with_fakes(tmp_path, monkeypatch):
    """The tinystories/fineweb path without network: fake tokenizer and fake Hub splits.
    Checks <|endoftext|> PRECEDES every document, the own val split, --max_tokens,
    and that small shards write the same bytes as one. (num_proc=2 is test_text_num_proc: its
    workers are spawned, and a fresh process does not see these fakes.)"""
    import datasets
    monkeypatch.setattr(corpora, 'gpt2_encoding', lambda: FakeGPT2())
    docs = {'train': [{'text': f'story {i} ' * (i % 4 + 1)} for i in range(50)],
            'validation': [{'text': f'val {i}'} for i in range(5)]}
    monkeypatch.setattr(datasets, 'load_dataset', lambda path, name=None, split=None, **kw: docs[split])
    monkeypatch.setattr(corpora, 'check_hub', lambda *a: None)  # the Hub is faked: no reachability probe
    outs = [make(tmp_path, 'tinystories', '--num_proc=1', name='ts1')]
    monkeypatch.setattr(corpora, 'SHARD_TOKENS', 7)  # many small shards appended
    outs.append(make(tmp_path, 'tinystories', '--num_proc=1', name='ts2'))
    assert files_of(outs[0]) == files_of(outs[1])
    meta = load_meta(outs[0])
    assert meta['reset_token'] == 50256 and meta['dtype'] == 'uint16' and meta['vocab_size'] == 50257
    train = load_split(outs[0], 'train').tolist()
    want = []
    for row in docs['train']:
        want += [50256] + list(row['text'].encode())
    assert train == want
    val = load_split(outs[0], 'val').tolist()
    assert val[0] == 50256 and val.count(50256) == 5
    assert meta['bytes_per_token']['train'] == pytest.approx(sum(len(r['text']) for r in docs['train']) / len(want))
    # fineweb_edu: no own val split, every k-th document; --max_tokens caps train
    d = make(tmp_path, 'fineweb_edu', '--val_frac=0.25', '--max_tokens=100', '--num_proc=1', name='fw')
    meta = load_meta(d)
    assert meta['splits']['train']['n'] == 100
    assert load_split(d, 'val').tolist()[:9] == [50256] + list(b'story 0 ')


def test_hub_offline_is_one_line(tmp_path):
    # the dataset download fails (offline): tiktoken faked so that the Hub step is reached
    code = ("import prepare, sys; from support import corpora; sys.path.insert(0, 'tests'); from test_prepare import FakeGPT2; "
            "corpora.gpt2_encoding = lambda: FakeGPT2(); prepare.main(sys.argv[1:])")
    for name in ('tinystories', 'fineweb_edu'):
        r = run_cli('-c', code, name, f'--out_dir={tmp_path}/{name}', env={'HF_HOME': str(tmp_path / 'hf')})
        assert r.returncode == 1
        err = [ln for ln in r.stderr.splitlines() if ln.startswith('error:')]
        assert len(err) == 1 and 'Traceback' not in r.stderr, r.stderr
        assert 'Hugging Face Hub' in err[0] and 'Connect to the internet' in err[0] and 'prepare.py text --input=PATH' in err[0]
        assert not os.path.exists(tmp_path / name / 'meta.json')
    # the GPT-2 vocabulary download fails (no cache, unreachable proxy): one line too
    src = tmp_path / 'a.txt'
    src.write_text('hello\n\nworld\n')
    blocked = {'TIKTOKEN_CACHE_DIR': str(tmp_path / 'tk'), 'HTTPS_PROXY': 'http://127.0.0.1:9',
               'HTTP_PROXY': 'http://127.0.0.1:9', 'NO_PROXY': '', 'no_proxy': ''}
    r = run_cli(PREPARE, 'text', f'--input={src}', '--tokenizer=gpt2', f'--out_dir={tmp_path}/g', env=blocked)
    assert r.returncode == 1 and 'Traceback' not in r.stderr
    assert r.stderr.strip().count('\n') == 0 and 'GPT-2 tokenizer' in r.stderr, r.stderr


def test_task_tokenizer_round_trip(tmp_path):
    d = make(tmp_path, 's5_retrieval', '--group=S3', '--k=2', '--n_actions=3', '--test_actions=', *SMALL)
    meta = load_meta(d)
    encode, decode = get_tokenizer(meta)
    x, _ = load_split(d, 'train', meta)
    assert encode(decode(x[0].tolist())) == x[0].tolist()
    assert json.load(open(os.path.join(d, 'meta.json')))['version'] == 1


def test_stdlib_char_is_deterministic_and_holds_out_whole_files(tmp_path):
    # the same interpreter writes the same bytes; a file is never split between splits; every file
    # starts with the document token (the reset token); meta records where the text came from
    a = make(tmp_path, 'stdlib_char', '--max_files=24', '--hold_out_every=6', name='a')
    b = make(tmp_path, 'stdlib_char', '--max_files=24', '--hold_out_every=6', name='b')
    assert files_of(a) == files_of(b)
    meta = load_meta(a)
    src = meta['source']
    assert src['files'] == 24 and src['python'] == sys.version.split()[0] and len(src['sha256']) == 64
    assert meta['reset_token'] == 0 and meta['itos'][0] == corpora.FILE_TOKEN
    files = corpora.stdlib_files(src['root'])[:24]
    assert not any('/test/' in f or os.path.basename(f).startswith('test_') for f in files)
    itos = meta['itos']
    for split, picks in (('test', [0, 6, 12, 18]), ('val', [3, 9, 15, 21])):
        ids = load_split(a, split, meta).tolist()
        want = []
        for i in picks:
            want += [0] + [itos.index(c) for c in open(files[i], encoding='utf-8', errors='replace').read()]
        assert ids == want and meta['splits'][split]['files'] == 4
    assert meta['splits']['train']['files'] == 16

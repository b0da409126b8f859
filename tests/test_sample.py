"""sample.py: through its CLI on a tiny prepared dataset and a checkpoint made here
(no train.py): sample counts and lengths, --start=FILE:, one-line checkpoint errors,
eval_split; and the streaming loop gives exactly model.generate's tokens."""

import dataclasses
import os
import re
import subprocess
import sys

import pytest
import torch

import prepare
from model import GPT, GPTConfig, save_checkpoint
from sample import evaluate, encode_prompt, read_prompt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(REPO, 'sample.py')
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


def run(*args, cwd=None):
    return subprocess.run([sys.executable, SAMPLE, *args], capture_output=True, text=True, cwd=cwd or REPO, timeout=120)


def samples(stdout):
    blocks = stdout.split(SEP + '\n')
    assert blocks[-1] == ''
    return [b.strip() for b in blocks[:-1]]


def test_samples_and_prompt_file(setup):
    root, data = setup
    # the dataset comes from the checkpoint's config (data_root + dataset)
    r = run(f'--out_dir={root}', '--start=0 1 1', '--num_samples=3', '--max_new_tokens=7')
    assert r.returncode == 0, r.stderr
    out = samples(r.stdout)
    assert len(out) == 3
    for s in out:
        words = s.split()
        assert words[:3] == ['0', '1', '1'] and len(words) == 3 + 7 and set(words) <= {'0', '1'}
    # one sample streams; the prompt from a file; --dataset given explicitly
    (root / 'prompt.txt').write_text('1 0\n')
    r = run(f'--init_from={root}/ckpt.pt', f'--dataset={data}', f'--start=FILE:{root}/prompt.txt',
            '--num_samples=1', '--max_new_tokens=5', '--temperature=0')
    assert r.returncode == 0, r.stderr
    out = samples(r.stdout)
    assert len(out) == 1 and out[0].split()[:2] == ['1', '0'] and len(out[0].split()) == 2 + 5
    with pytest.raises(SystemExit):
        read_prompt(f'FILE:{root}/nope.txt')


def test_bad_checkpoint_is_one_line(setup, tmp_path):
    root, _ = setup
    (tmp_path / 'ckpt.pt').write_bytes(b'not a checkpoint at all')
    for out_dir, msg in ((tmp_path / 'missing', 'no checkpoint at'), (tmp_path, 'not a readable checkpoint')):
        r = run(f'--out_dir={out_dir}')
        assert r.returncode == 1 and 'Traceback' not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, r.stderr
    # a prompt token the dataset does not have: one line too (DataError is a SystemExit)
    encode, _ = prepare.get_tokenizer(prepare.load_meta(setup[1]))
    with pytest.raises(prepare.DataError, match="'2' is not in the vocabulary"):
        encode_prompt('0 2', prepare.load_meta(setup[1]), encode)


def test_eval_split(setup):
    root, data = setup
    r = run(f'--out_dir={root}', '--eval_split=test_24', '--eval_batch_size=5')
    assert r.returncode == 0, r.stderr
    m = re.search(r'token accuracy ([\d.]+) \((\d+)/(\d+)\), exact match ([\d.]+) \((\d+)/(\d+)\)', r.stdout)
    assert m, r.stdout
    assert int(m.group(3)) == 12 * 24 and int(m.group(6)) == 12
    # the same numbers computed here, batch by batch vs whole split
    from model import load_checkpoint
    from contextlib import nullcontext
    model, _ = load_checkpoint(str(root / 'ckpt.pt'))
    model.eval()
    x, y = prepare.load_split(data, 'test_24')
    logits, _ = model(torch.from_numpy(x.astype('int64')), mode='exact')
    right = (logits.argmax(-1).numpy() == y)
    assert int(m.group(2)) == right.sum() and int(m.group(5)) == right.all(1).sum()
    assert evaluate(model, data, prepare.load_meta(data), 'test_24', 7, 'cpu', nullcontext())[0] == pytest.approx(right.mean())


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


def test_prompt_gets_the_reset_token():
    # gpt2 corpora: every training document starts with <|endoftext|>; so does the prompt
    meta = dict(name='corpus', tokenizer='gpt2', reset_token=50256)
    assert encode_prompt('hi', meta, lambda s: [5, 6]) == ([50256, 5, 6], 1)
    assert encode_prompt('', meta, lambda s: []) == ([50256], 1)
    assert encode_prompt('<|endoftext|>hi', meta, lambda s: [50256, 5]) == ([50256, 5], 0)
    assert encode_prompt('1 0', dict(name='t', tokenizer='task', reset_token=None), lambda s: [1, 0]) == ([1, 0], 0)

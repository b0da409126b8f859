"""Fine-tuning a retrofitted pretrained model, end to end and offline. A tiny random
LlamaForCausalLM and a character tokenizer (tokenizers WordLevel in a
PreTrainedTokenizerFast), both written to tmp_path, stand in for SmolLM2; a toy JSONL
(running sums mod 10, GSM8K-shaped: '... #### 8') stands in for GSM8K.

prepare.py jsonl -> lab/train.py init_from=<folder> (Jacobi) -> lab/evaluate.py --eval_answers, and:
the row layout (x, y, rec mask) against an independent tokenization; the gates leave 0 and
the loss falls; the prompt stays the plain model after fine-tuning; the training mask is
exactly what generate(prefill='plain') computes; answer accuracy equals row-by-row
model.generate; resume reloads a retrofit run exactly; one-line errors.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip('transformers')
from transformers import AutoTokenizer  # noqa: E402

import prepare  # noqa: E402
import lab.evaluate  # noqa: E402
from lab.evaluate import eval_answers  # noqa: E402
from support import dataset, sft
from support.checkpoint import load_checkpoint  # noqa: E402
from support.dataset import DataError, load_answers, load_meta, load_rec_mask, load_split
from support.sft import extract_answer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1'}
N = 20  # training steps
TRAIN = ['--device=cpu', '--recurrence=t2mlr', '--rec_start=1', '--rec_end=1', '--rec_gate_gain=1e-2',
         '--rec_lr_mult=10.0', '--train_mode=jacobi', '--n_iter=4', '--n_grad=2', '--batch_size=16',
         '--learning_rate=3e-3', '--min_lr=3e-4', '--warmup_iters=2', f'--lr_decay_iters={N}', '--weight_decay=0.0',
         '--eval_interval=10', '--eval_iters=2', '--eval_examples=16', '--log_interval=1']  # (lab/train.py: prompt masks, rec_lr_mult)


def run(script, *args, cwd=None, check=True):
    p = subprocess.run([sys.executable, os.path.join(ROOT, script), *map(str, args)], cwd=cwd or ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{script} {' '.join(map(str, args))} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def error_line(p):
    """The process failed with exactly one 'error:' line and no traceback."""
    assert p.returncode != 0 and 'Traceback' not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith('error:')]
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    """tmp/llama (random Llama + tokenizer), tmp/sums.jsonl, tmp/data/sums (prepared)."""
    root = tmp_path_factory.mktemp('retrofit')
    llama = root / 'llama'
    sft.make_tiny_tokenizer(llama)
    sft.make_tiny_llama(llama, vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                            max_position_embeddings=48)
    records = list(sft.running_sums(np.random.default_rng(0), 300, 3))  # rows of one length...
    records += list(sft.running_sums(np.random.default_rng(1), 20, 2))  # ...and shorter ones (padding)
    with open(root / 'sums.jsonl', 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in records)
    prepare.main(['jsonl', f'--input={root}/sums.jsonl', f'--tokenizer={llama}', '--val_frac=0.1', '--test_frac=0.1',
                  '--max_len=64', f'--out_dir={root}/data/sums'])
    return root, llama, records


@pytest.fixture(scope='module')
def trained(setup):
    """N Jacobi steps from the pretrained folder; -> the run's out_dir."""
    root, llama, _ = setup
    out = root / 'out'
    p = run('lab/train.py', *TRAIN, f'--init_from={llama}', f'--dataset={root}/data/sums', f'--out_dir={out}',
            f'--max_iters={N}', cwd=root)
    assert f'iter {N}:' in p.stdout
    return out

# -----------------------------------------------------------------------------
# the data


def test_rows_against_independent_tokenization(setup):
    root, llama, records = setup
    d = str(root / 'data' / 'sums')
    meta = load_meta(d)
    assert meta['tokenizer'] == 'hf' and meta['hf_tokenizer'] == str(llama) and meta['rec_mask'] is True
    assert meta['vocab_size'] == 18 and meta['eos_token'] == 1 and meta['pad_token'] == 0
    assert {s: v['n'] for s, v in meta['splits'].items()} == {'train': 256, 'val': 32, 'test': 32}
    tok = AutoTokenizer.from_pretrained(llama)
    newline = tok.encode('\n')[0]
    padded = 0
    by_prompt = {r['prompt']: r for r in records}
    seen = []
    for split in meta['splits']:
        X, Y = load_split(d, split, meta)
        M = load_rec_mask(d, split, meta)
        assert M.dtype == np.uint8 and M.shape == X.shape == Y.shape
        refs = load_answers(d, split, meta) if split != 'train' else None
        for i, (x, y, m) in enumerate(zip(X.tolist(), Y.tolist(), M.tolist())):
            prompt = tok.decode(x[:x.index(newline) + 1])  # 'a+b+c=\n' (or 'a+b=\n'): one token a character
            r = by_prompt[prompt]
            seen.append(prompt)
            p, resp = tok.encode(r['prompt']), tok.encode(r['response']) + [tok.eos_token_id]
            P, L = len(p), len(p) + len(resp) - 1
            assert x[:L] == p + resp[:-1] and all(t == 0 for t in x[L:])  # eos never an input; then <pad>
            assert y[:P - 1] == [-1] * (P - 1) and y[P - 1:L] == resp and all(t == -1 for t in y[L:])
            assert m == [0] * P + [1] * (L - P) + [0] * (len(m) - L)  # last prompt token plain
            padded += L < len(x)
            if refs:
                assert refs['prompt_len'][i] == P and refs['answer'][i] == r['response'][-1]
    assert sorted(seen) == sorted(by_prompt)  # every record in exactly one split
    assert padded >= 20
    with pytest.raises(DataError, match="no reference answers for split 'train'"):
        load_answers(d, 'train', meta)


def test_extract_answer():
    assert extract_answer('She has 3 + 4 = 7 apples.\n#### 7') == '7'
    assert extract_answer('#### 1,000.50 dollars') == '1000.5'
    assert extract_answer('#### -12\nmore 99') == '-12'
    assert extract_answer('so 5, then 18.0') == '18'  # no marker: the last number
    assert extract_answer('#### Paris ') == 'Paris' and extract_answer('####') == ''


def test_chat_template(setup, tmp_path):
    root, llama, records = setup
    tok = sft.make_tiny_tokenizer(tmp_path / 'chat', chars=sft.DEMO_CHARS + 'QA')
    tok.chat_template = ("{% for m in messages %}Q{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}A{% endif %}")
    tok.save_pretrained(tmp_path / 'chat')
    d = str(tmp_path / 'c')
    prepare.main(['jsonl', f'--input={root}/sums.jsonl', f'--tokenizer={tmp_path}/chat', '--chat_template=True', f'--out_dir={d}'])
    meta = load_meta(d)
    assert meta['prompt_format'] == 'chat'
    X, _ = load_split(d, 'test', meta)
    P = load_answers(d, 'test', meta)['prompt_len'][0]
    prompt = tok.decode(X[0, :P].tolist())
    assert P == 9 and prompt[0] == 'Q' and prompt[-1] == 'A' and prompt[1:-1] in {r['prompt'] for r in records}
    with pytest.raises(DataError, match='the tokenizer has no chat template'):
        prepare.main(['jsonl', f'--input={root}/sums.jsonl', f'--tokenizer={llama}', '--chat_template=True',
                      f'--out_dir={tmp_path}/n'])


def test_gsm8k_with_fake_hub(setup, tmp_path, monkeypatch):
    import datasets
    _, llama, _ = setup
    rows = {'train': [{'question': f' {i}+1= ', 'answer': f'{i}+1=<<{i}+1={i + 1}>>{i + 1}\n#### {i + 1}'} for i in range(12)],
            'test': [{'question': '2+2=', 'answer': '2+2=<<2+2=4>>4\n#### 4'}]}
    monkeypatch.setattr(datasets, 'load_dataset', lambda path, name=None, split=None, **kw: rows[split])
    monkeypatch.setattr(sft, 'check_hub', lambda *a: None)  # the Hub is faked: no reachability probe
    d = str(tmp_path / 'g')
    prepare.main(['gsm8k', f'--tokenizer={llama}', '--n_val=2', f'--out_dir={d}'])
    meta = load_meta(d)
    assert {s: v['n'] for s, v in meta['splits'].items()} == {'train': 10, 'val': 2, 'test': 1}
    tok = AutoTokenizer.from_pretrained(llama)
    x, y = load_split(d, 'test', meta)
    assert tok.decode(x[0].tolist()) == '2+2=\n2+2=4\n#### 4'  # question + newline, then the solution without <<...>>
    assert y[0, -1] == meta['eos_token']
    assert load_answers(d, 'test', meta) == {'prompt_len': [5], 'answer': ['4']}

# -----------------------------------------------------------------------------
# fine-tuning


def test_finetune_moves_gates_and_lowers_loss(setup, trained):
    _, llama, _ = setup
    log = [json.loads(ln) for ln in open(trained / 'log.jsonl')]
    evals = [r for r in log if r['type'] == 'eval']
    losses = [r['loss'] for r in log if r['type'] == 'train']
    assert [r['iter'] for r in evals] == [0, 10, N] and len(losses) == N
    assert evals[-1]['val/loss_exact'] < evals[0]['val/loss_exact'] - 0.3
    assert np.mean(losses[-3:]) < losses[0] - 0.3
    assert 'test/acc_exact' in evals[-1]  # response-token accuracy, teacher forced
    ckpt = torch.load(trained / 'ckpt.pt', weights_only=False)
    assert ckpt['pretrained'] == str(llama) and ckpt['model_args']['n_layer'] == 3
    for g in ('fusion.g_cur', 'fusion.g_rec'):
        assert abs(ckpt['model'][g].item()) > 1e-3, g  # started at exactly 0


def test_prompt_positions_are_the_plain_model(setup, trained):
    """After fine-tuning, with the mask the prompt positions equal the plain backbone in every
    scheme (the state never reaches them); without it they would not."""
    root, _, _ = setup
    model = load_checkpoint(str(trained / 'ckpt.pt'))[0].double().eval()
    d = str(root / 'data' / 'sums')
    meta = load_meta(d)
    X, _ = load_split(d, 'val', meta)
    x = torch.from_numpy(X.astype(np.int64))
    m = torch.from_numpy(load_rec_mask(d, 'val', meta).astype(bool))
    prompt = torch.arange(x.size(1)) < torch.tensor(load_answers(d, 'val', meta)['prompt_len'])[:, None]
    response = m.clone()
    response[:, :X.shape[1] - 8] = False  # later response positions: the state has had time to act
    assert response.any(1).all() and (prompt == ~m.cumsum(1).bool()).all()
    with torch.no_grad():
        plain = model(x, mode='plain')[0]
        for kw in (dict(mode='exact'), dict(mode='jacobi', n_iter=4, n_grad=0), dict(mode='interleaved', n_subsets=3)):
            out = model(x, rec_mask=m, **kw)[0]
            assert (out - plain)[prompt].abs().max() < 1e-10, kw
            assert (out - plain)[response].abs().amax(-1).min() > 1e-6, kw  # every response reads the state
        unmasked = model(x, mode='exact')[0]
        assert (unmasked - plain)[prompt].abs().max() > 1e-4


def test_training_mask_is_what_generation_computes(setup, trained):
    """generate(prefill='plain') = the exact forward over prompt + generated tokens with the
    mask prepare.py writes (0 on the prompt, 1 from the first response input on)."""
    root, _, _ = setup
    model = load_checkpoint(str(trained / 'ckpt.pt'))[0].double().eval()
    d = str(root / 'data' / 'sums')
    meta = load_meta(d)
    X, _ = load_split(d, 'test', meta)
    plen = np.array(load_answers(d, 'test', meta)['prompt_len'])
    P = plen[0]
    prompt = torch.from_numpy(X[plen == P][:4, :P].astype(np.int64))
    out, gen_logits = model.generate(prompt, 10, temperature=0, prefill='plain', return_logits=True)
    seq = out[:, :-1]
    mask = (torch.arange(seq.size(1)) >= P).expand_as(seq)
    with torch.no_grad():
        logits = model(seq, mode='exact', rec_mask=mask)[0]
    assert (logits - gen_logits).abs().max() < 1e-10


def test_answer_eval(setup, trained, monkeypatch):
    """lab/evaluate.py --eval_answers prints an accuracy. Its batched greedy decoding equals row-by-row
    model.generate (prompt prefilled plainly, cut at eos, read by extract_answer); checked on a
    perturbed model whose outputs vary (the briefly trained one answers '' everywhere)."""
    root, llama, _ = setup
    p = run('lab/evaluate.py', f'--out_dir={trained}', '--eval_answers=test', '--max_new_tokens=12', cwd=root)
    assert re.search(r'sums test: 32 prompts, greedy, prefill plain, <= 12 new tokens: answer accuracy [\d.]+ \(\d+/32\)', p.stdout), p.stdout
    torch.manual_seed(0)
    model = load_checkpoint(str(trained / 'ckpt.pt'))[0].double().eval()
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(torch.randn_like(prm))
    d = str(root / 'data' / 'sums')
    meta = load_meta(d)
    tok = AutoTokenizer.from_pretrained(llama)
    X, _ = load_split(d, 'test', meta)
    refs = load_answers(d, 'test', meta)
    texts, want, stopped = {}, {}, 0
    for i in range(len(X)):
        P = refs['prompt_len'][i]
        ids = model.generate(torch.from_numpy(X[i:i + 1, :P].astype(np.int64)), 12, temperature=0, prefill='plain')[0, P:].tolist()
        stopped += 1 in ids
        texts[i] = tok.decode(ids[:ids.index(1)] if 1 in ids else ids)
        want[i] = extract_answer(texts[i])
    assert len(set(texts.values())) > 10 and len(set(want.values())) > 3 and stopped > 3  # varied; some stop at eos
    # make every other reference the expected prediction: accuracy must be exactly one half
    fake = dict(refs, answer=[want[i] if i % 2 == 0 else 'x' for i in range(len(X))])
    monkeypatch.setattr(lab.evaluate, 'load_answers', lambda *a: fake)
    acc, got_texts, got = eval_answers(model, d, meta, 'test', tok.decode, 12, 64, torch.no_grad(), 'plain')
    assert got_texts == texts and got == want and acc == 0.5


def test_resume_a_retrofit_run_exactly(setup, trained, tmp_path):
    root, llama, _ = setup
    common = [*TRAIN, f'--dataset={root}/data/sums', f'--out_dir={tmp_path}']
    run('lab/train.py', *common, f'--init_from={llama}', f'--max_iters={N // 2}', cwd=tmp_path)
    p = run('lab/train.py', *common, '--init_from=resume', f'--max_iters={N}', cwd=tmp_path)
    assert f'iter {N // 2 + 1}:' in p.stdout and 'iter 1:' not in p.stdout and 'note: resuming' not in p.stdout
    a = torch.load(trained / 'ckpt.pt', weights_only=False)['model']
    b = torch.load(tmp_path / 'ckpt.pt', weights_only=False)['model']
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

# -----------------------------------------------------------------------------
# one-line errors


def test_tokenizer_vocab_larger_than_the_model(setup, tmp_path):
    root, llama, _ = setup
    big = tmp_path / 'big'
    sft.make_tiny_tokenizer(big, chars=sft.DEMO_CHARS + 'abcdefghijklmnopqrstuvwxyz')  # 44 tokens > 32
    prepare.main(['jsonl', f'--input={root}/sums.jsonl', f'--tokenizer={big}', f'--out_dir={tmp_path}/data/big'])
    p = run('lab/train.py', f'--dataset={tmp_path}/data/big', f'--init_from={llama}',
            f'--out_dir={tmp_path}/out', cwd=tmp_path, check=False)
    assert 'vocabulary of 44 tokens but the model only 32' in error_line(p)


def one_line(excinfo):
    msg = str(excinfo.value)
    assert '\n' not in msg and msg.startswith('error: '), msg
    return msg


def test_missing_tokenizer_folder(setup, tmp_path):
    root, _, _ = setup
    with pytest.raises(DataError) as e:
        prepare.main(['jsonl', f'--input={root}/sums.jsonl', f'--tokenizer={tmp_path}/nope'])
    assert f'no tokenizer folder at {tmp_path}/nope' in one_line(e)
    with pytest.raises(DataError) as e:  # sample.py's and lab/evaluate.py's path, once the folder is gone
        dataset.get_tokenizer(dict(tokenizer='hf', hf_tokenizer=str(tmp_path / 'gone')))
    assert 'no tokenizer folder' in one_line(e)


def test_offline_hub_is_one_line(setup, tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants
    _, llama, _ = setup
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
    with pytest.raises(DataError) as e:  # the default tokenizer is a Hub name
        prepare.main(['gsm8k', f'--out_dir={tmp_path}/g'])
    assert "could not load the tokenizer 'HuggingFaceTB/SmolLM2-1.7B-Instruct'" in one_line(e)

    def offline(*a, **kw):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)\nmore")
    monkeypatch.setattr(datasets, 'load_dataset', offline)
    with pytest.raises(DataError) as e:
        prepare.main(['gsm8k', f'--tokenizer={llama}', f'--out_dir={tmp_path}/g'])
    assert 'could not load openai/gsm8k' in one_line(e)
    assert not os.path.exists(tmp_path / 'g' / 'meta.json')

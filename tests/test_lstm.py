"""The LSTM baseline (support/lstm.py): its size against the GPT's, its generation against its own
forward (float64), its checkpoints, and train.py (exact resume), the evaluation, lab/evaluate.py
and sample.py with it, end to end through their CLIs."""

import json
import os
import runpy
import subprocess
import sys

import pytest
import torch

import prepare
from lab.model_full import GPT, GPTConfig
from support.checkpoint import build_model, load_checkpoint, save_checkpoint
from support.flops import flops_per_token
from support.lstm import LSTM, LSTMConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = dict(rtol=0, atol=1e-10)


def count(m):
    return sum(p.numel() for p in m.parameters())


def test_parameter_count_matches_the_gpt():
    # at a task vocabulary (<= 128 tokens: one table of 128 rows, the configs' vocab_pad)
    gpt = GPT(GPTConfig(block_size=64, vocab_size=6, vocab_pad=128, n_layer=4, n_head=4, n_kv_head=4, n_embd=64))
    ns = runpy.run_path(os.path.join(ROOT, 'config', 's3_lstm.py'))
    c = LSTMConfig(block_size=64, vocab_size=6, vocab_pad=128, n_layer=ns['n_layer'], n_embd=ns['n_embd'])
    lstm, H = LSTM(c), 81
    assert (ns['arch'], ns['n_layer'], ns['n_embd']) == ('lstm', 4, H)
    assert count(gpt) == 221_760
    # per layer four gates (H + H) -> H and two bias vectors; one embedding table, tied to the head
    assert count(lstm) == 4 * (4 * H * 2 * H + 2 * 4 * H) + 128 * H == 222_912
    assert abs(count(lstm) / count(gpt) - 1) < 0.01
    fwd = 4 * 2 * 4 * H * 2 * H + 2 * H * 128
    assert flops_per_token(c, 32, 'plain', train=False) == fwd and flops_per_token(c, 32, 'plain') == 3 * fwd


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return LSTM(LSTMConfig(**{**dict(block_size=32, vocab_size=11, n_layer=2, n_embd=12), **kw})).double().eval()


def test_generate_equals_teacher_forced_forward():
    m = tiny()
    prompt = torch.randint(0, 11, (3, 4), generator=torch.Generator().manual_seed(1))
    out, logits = m.generate(prompt, 7, temperature=0, return_logits=True)
    full = m(out)[0]
    torch.testing.assert_close(logits, full[:, :-1], **TOL)  # one step per token = the whole sequence at once
    assert torch.equal(out[:, 4:], full[:, 3:-1].argmax(-1))  # greedy
    # every mode is its one forward; a recurrence mask changes nothing
    mask = torch.rand(out.shape, generator=torch.Generator().manual_seed(2)) > 0.5
    for mode in ('plain', 'exact', 'zero', 'jacobi', 'interleaved', 'block'):
        torch.testing.assert_close(m(out, mode=mode, rec_mask=mask, n_subsets=3, block_len=2)[0], full, **TOL)
    with pytest.raises(ValueError, match='unknown mode'):
        m(out, mode='nope')


def test_checkpoint_roundtrip(tmp_path):
    from dataclasses import asdict
    m = tiny(dropout=0.1, tie_embeddings=False)
    path = str(tmp_path / 'ckpt.pt')
    save_checkpoint({'model': m.state_dict(), 'model_args': asdict(m.config)}, path)
    m2, _ = load_checkpoint(path)
    assert isinstance(m2, LSTM) and m2.config == m.config and m2.lm_head.weight is not m2.wte.weight
    idx = torch.randint(0, 11, (2, 9))
    torch.testing.assert_close(m2.eval()(idx)[0], m(idx)[0], **TOL)
    assert isinstance(build_model(dict(asdict(m.config))), LSTM)
    assert isinstance(build_model(dict(vocab_size=11, n_layer=2, n_head=2, n_kv_head=2, n_embd=8, arch='gpt')), GPT)
    groups = m.param_groups(0.1)
    assert sum(len(g['params']) for g in groups) == len(list(m.parameters()))
    assert all(p.dim() >= 2 for g in groups if g['weight_decay'] > 0 for p in g['params'])

# -----------------------------------------------------------------------------
# through the CLIs

@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('lstm_data')
    prepare.main(['s5', '--group=Z2', '--n_train=128', '--n_val=8', '--n_test=8', '--train_len=12', '--test_lens=16',
                  f'--out_dir={root}/s5_Z2'])
    src = root / 'input.txt'
    src.write_text(open(os.path.join(ROOT, 'support', 'flops.py')).read() * 4)
    prepare.main(['text', f'--input={src}', f'--out_dir={root}/text', f'--cache_dir={root}/hf'])
    return str(root)


def run(script, *args, cwd):
    p = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, 'OMP_NUM_THREADS': '1'}, timeout=300)
    assert p.returncode == 0, f"{script} {' '.join(args)}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p


def train(data, out, *extra, dataset='s5_Z2'):
    return run('lab/train.py', os.path.join(ROOT, 'config', 's3_lstm.py'), '--device=cpu',  # (arch: the research model's)
               f'--dataset={data}/{dataset}', f'--out_dir={out}', '--n_embd=16', '--batch_size=4', '--eval_iters=1',
               '--eval_examples=8', '--log_interval=1', '--warmup_iters=1', *extra, cwd=out.parent)


def test_train_resume_evaluate_sample(data, tmp_path):
    args = ['--max_iters=4', '--lr_decay_iters=4', '--eval_interval=2', '--dropout=0.1']
    p = train(data, tmp_path / 'straight', *args)
    assert 'arch=lstm' in p.stdout and 'zero-state' not in p.stdout
    train(data, tmp_path / 'resumed', *[a.replace('max_iters=4', 'max_iters=2') for a in args])
    p = train(data, tmp_path / 'resumed', *args, '--init_from=resume')
    assert 'iter 3:' in p.stdout and 'iter 1:' not in p.stdout
    a, b = (torch.load(tmp_path / d / 'ckpt.pt', weights_only=False) for d in ('straight', 'resumed'))
    assert a['iter_num'] == b['iter_num'] == 4 and a['model_args']['arch'] == 'lstm'
    for k in a['model']:
        assert torch.equal(a['model'][k], b['model'][k]), k
    # the evaluation: one forward, so approximate = exact = zero state, at every test length
    ev = [json.loads(line) for line in open(tmp_path / 'straight' / 'log.jsonl') if '"eval"' in line][-1]
    for split in ('val', 'test_16'):
        key = 'loss' if split == 'val' else 'em'
        assert ev[f'{split}/{key}_approx'] == ev[f'{split}/{key}_exact'] == ev[f'{split}/{key}_zero']
    p = run('lab/evaluate.py', f'--out_dir={tmp_path / "straight"}', '--eval_split=test_16', cwd=tmp_path)
    assert 'model: lstm, 4 layers, d=16' in p.stderr and 'exact match' in p.stdout
    # sampling: a text model, two samples of 12 new characters
    train(data, tmp_path / 'text', '--max_iters=2', '--eval_interval=2', '--block_size=16', dataset='text')
    p = run('sample.py', f'--out_dir={tmp_path / "text"}', '--start=def ', '--num_samples=2', '--max_new_tokens=12',
            '--stream=False', cwd=tmp_path)
    assert p.stdout.count('---------------') == 2 and p.stdout.startswith('def ')


def test_lstm_needs_no_recurrence(data, tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, 'lab', 'train.py'), '--arch=lstm', '--device=cpu',
                        f'--dataset={data}/s5_Z2', f'--out_dir={tmp_path}'], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "recurrence='none'" in p.stderr

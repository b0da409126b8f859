"""Behaviour pinned before the model.py redesign (issue 18): tests/fixtures/fingerprint.pt was
written by tests/make_fingerprint.py on the code before it (commit 81c4002). For eight tiny
float64 models (plain, T2MLR x3, LRT x4: shared, layerwise, kv-only with 8 gate channels,
residual-only; windows, NoPE, detach, resets and a prompt mask among them) it holds the
initial weights as that code saved them, the logits and loss of every forward mode, the
greedy tokens and logits of generate after each prefill, and the weights after one AdamW
step of the model's own scheme. The initial weights are loaded through checkpoint.py's
upgrade (old LRT keys -> the LRT module), so this is also the test that old checkpoints load.

Bitwise: the plain and Jacobi modes, every mode of the plain model, and one training step
of the plain and T2MLR models. To 1e-12 (float64), where the order of operations changed:
- the exact forward, zero-state and generate logits: the span now runs through the readable
  range path (the growing prefix of keys) instead of the static step (the whole buffer under a
  mask);
- interleaved, and LRT's training step (interleaved): the strided subset passes attend under a
  mask, now with the query heads of each KV head folded into the query axis (issue 19) instead
  of enable_gqa."""

import os

import pytest
import torch

from checkpoint import upgrade_state_dict
from model import GPT, GPTConfig

FIXTURE = torch.load(os.path.join(os.path.dirname(__file__), 'fixtures', 'fingerprint.pt'), weights_only=False)
BITWISE = ('plain', 'jacobi', 'jacobi_masked')


def build(entry):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = GPT(GPTConfig(**entry['model_args']))
    finally:
        torch.set_default_dtype(prev)
    model = model.double()
    model.load_state_dict(upgrade_state_dict(dict(entry['state_dict']), model.config))
    return model


def batch(seed=1, B=3, T=12):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(1, 23, (B, T), generator=g)
    idx[0, 5] = 0
    tgt = torch.randint(0, 23, (B, T), generator=g)
    tgt[:, ::5] = -1
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :4] = False
    return idx, tgt, mask


def same(got, want, bitwise):
    if bitwise:
        assert torch.equal(got, want), (got - want).abs().max().item()
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize('name', list(FIXTURE['models']))
def test_every_mode_as_before(name):
    entry, model = FIXTURE['models'][name], build(FIXTURE['models'][name])
    idx, tgt, mask = batch()
    model.eval()
    with torch.no_grad():
        for mode, extra in [('plain', {}), ('exact', {}), ('zero', {}), ('exact_masked', dict(rec_mask=mask)),
                            ('jacobi', dict(n_iter=3, n_grad=1)), ('jacobi_masked', dict(n_iter=3, n_grad=1, rec_mask=mask)),
                            ('interleaved', dict(n_subsets=2)), ('interleaved_r2', dict(n_subsets=3, n_rounds=2))]:
            logits, loss = model(idx, tgt, mode=mode.split('_')[0], **extra)
            bitwise = mode in BITWISE or name == 'plain'
            same(logits, entry[f'logits/{mode}'], bitwise)
            same(loss, entry[f'loss/{mode}'], bitwise)
        for prefill in ('exact', 'jacobi', 'plain'):
            toks, logits = model.generate(idx[:, :6], 7, temperature=0, prefill=prefill, prefill_iters=3, return_logits=True)
            assert torch.equal(toks, entry[f'generate/{prefill}/tokens'])
            same(logits, entry[f'generate/{prefill}/logits'], False)


@pytest.mark.parametrize('name', [n for n in FIXTURE['models'] if 'train/state_dict' in FIXTURE['models'][n]])
def test_one_training_step_as_before(name):
    entry, model = FIXTURE['models'][name], build(FIXTURE['models'][name])
    rec = model.config.recurrence
    idx, tgt, _ = batch()
    model.train()
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=1e-2, betas=(0.9, 0.95))
    loss = model(idx, tgt, **FIXTURE['TRAIN']['plain' if rec == 'none' else rec])[1]
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    same(loss.detach(), entry['train/loss'], True)
    want = upgrade_state_dict(dict(entry['train/state_dict']), model.config)
    got = model.state_dict()
    assert set(got) == set(want)
    for k in got:
        same(got[k], want[k], rec != 'lrt')

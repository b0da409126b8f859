"""Behaviour pinned before the model.py redesign (issue 18): tests/fixtures/fingerprint.pt was
written by tests/make_fingerprint.py on the code before it (commit 81c4002). For eight tiny
float64 models (plain, T2MLR x3, LRT x4: shared, layerwise, kv-only with 8 gate channels,
residual-only; windows, NoPE, detach, resets and a prompt mask among them) it holds the
initial weights as that code saved them, the logits and loss of every forward mode, the
greedy tokens and logits of generate after each prefill, and the weights after one AdamW
step of the model's own scheme. The initial weights are loaded through support/checkpoint.py's
upgrade (old LRT keys -> the LRT module), so this is also the test that old checkpoints load.

Every float is compared to 1e-12 in float64 (relative where values are larger than 1), on
every CPU: never bitwise. MKL and oneDNN pick their kernels by instruction set and thread
count, so the last bits differ between machines (measured: 4e-14 at most between
ATEN_CPU_CAPABILITY=default, avx2 and avx512, the largest after the AdamW step). Greedy tokens
are compared exactly: they are integers. test_a_small_change_trips_it keeps the tolerance
honest: a 1e-9 change of one weight of any model must fail the comparison."""

import os

import pytest
import torch

from lab.model_full import GPT, GPTConfig
from support.checkpoint import upgrade_state_dict

FIXTURE = torch.load(os.path.join(os.path.dirname(__file__), 'fixtures', 'fingerprint.pt'), weights_only=False)
TOL = dict(rtol=1e-12, atol=1e-12)
MODES = [('plain', {}), ('exact', {}), ('zero', {}), ('exact_masked', dict(rec_mask=True)),
         ('jacobi', dict(n_iter=3, n_grad=1)), ('jacobi_masked', dict(n_iter=3, n_grad=1, rec_mask=True)),
         ('interleaved', dict(n_subsets=2)), ('interleaved_r2', dict(n_subsets=3, n_rounds=2))]


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


def differences(model, entry):
    """The recorded outputs (forward modes, generate) that model no longer reproduces to TOL."""
    idx, tgt, mask = batch()
    bad = []

    def check(key, got):
        want = entry[key]
        if got.dtype.is_floating_point:
            ok = torch.allclose(got, want, **TOL)
        else:
            ok = torch.equal(got, want)
        if not ok:
            bad.append(f"{key}: max |diff| {(got.double() - want.double()).abs().max().item():.3g}")

    model.eval()
    with torch.no_grad():
        for mode, extra in MODES:
            extra = {k: (mask if k == 'rec_mask' else v) for k, v in extra.items()}
            logits, loss = model(idx, tgt, mode=mode.split('_')[0], **extra)
            check(f'logits/{mode}', logits)
            check(f'loss/{mode}', loss)
        for prefill in ('exact', 'jacobi', 'plain'):
            toks, logits = model.generate(idx[:, :6], 7, temperature=0, prefill=prefill, prefill_iters=3, return_logits=True)
            check(f'generate/{prefill}/tokens', toks)
            check(f'generate/{prefill}/logits', logits)
    return bad


@pytest.mark.parametrize('name', list(FIXTURE['models']))
def test_every_mode_as_before(name):
    entry = FIXTURE['models'][name]
    assert differences(build(entry), entry) == []


@pytest.mark.parametrize('name', list(FIXTURE['models']))
def test_a_small_change_trips_it(name):
    """The tolerance is tight enough to see a real change: one weight moved by 1e-9 (the first
    parameter the recurrence adds; the final norm's first gain in the plain model)."""
    entry = FIXTURE['models'][name]
    model = build(entry)
    target = next((n for n, _ in model.named_parameters() if GPT.is_rec_param(n)), 'ln_f.weight')
    with torch.no_grad():
        dict(model.named_parameters())[target].view(-1)[0] += 1e-9
    assert differences(model, entry), f"moving {target}[0] by 1e-9 went unnoticed"


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
    torch.testing.assert_close(loss.detach(), entry['train/loss'], **TOL)
    want = upgrade_state_dict(dict(entry['train/state_dict']), model.config)
    got = model.state_dict()
    assert set(got) == set(want)
    for k in got:
        torch.testing.assert_close(got[k], want[k], **TOL, msg=lambda m: f"{k}: {m}")

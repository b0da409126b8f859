"""
Writes tests/fixtures/fingerprint.pt: what today's model computes, pinned before the
model.py redesign (issue 18) so that tests/test_fingerprint.py can check afterwards that
the behaviour did not change. Run once, on the code before the redesign:

    python tests/make_fingerprint.py

Per model (float64, tiny): its initial state dict as this code saves it (so the fixture is
also a checkpoint written by the old code: the upgrade path is tested on it), the logits and
loss of every forward mode, the greedy tokens and logits of generate with each prefill, and
the weights after one AdamW step of the model's own training scheme.
"""

import os
import sys
from dataclasses import asdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lab.model_full import GPT, GPTConfig  # noqa: E402

TINY = dict(block_size=32, vocab_size=23, n_layer=4, n_head=4, n_kv_head=2, n_embd=16, mlp_hidden=32, reset_token=0)
STYLES = {
    'plain': dict(recurrence='none'),
    't2mlr_mid': dict(recurrence='t2mlr', rec_start=1, rec_end=2),
    't2mlr_full_window': dict(recurrence='t2mlr', rec_start=0, rec_end=3, attn_window=5, jacobi_init='zero'),
    't2mlr_detach_nope': dict(recurrence='t2mlr', rec_start=1, rec_end=3, rec_residual_detach=True, rope=False),
    'lrt_shared': dict(recurrence='lrt', rec_start=0, rec_end=2),
    'lrt_layerwise': dict(recurrence='lrt', rec_start=1, rec_end=2, lrt_shared=False, attn_window=5),
    'lrt_kv_gate8': dict(recurrence='lrt', rec_start=0, rec_end=3, lrt_inject='kv', lrt_gate_channels=8),
    'lrt_residual': dict(recurrence='lrt', rec_start=1, rec_end=1, lrt_inject='residual'),
}
TRAINED = ('plain', 't2mlr_mid', 't2mlr_full_window', 'lrt_shared', 'lrt_layerwise')  # one AdamW step each
TRAIN = {'plain': dict(mode='plain'), 't2mlr': dict(mode='jacobi', n_iter=4, n_grad=2),
         'lrt': dict(mode='interleaved', n_subsets=2, n_rounds=2)}


def build(kw, seed=0):
    """A float64 model with every recurrence parameter moved off its identity init."""
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = GPT(GPTConfig(**{**TINY, **kw}))
    finally:
        torch.set_default_dtype(prev)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if GPT.is_rec_param(name):
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.double()


def batch(seed=1, B=3, T=12):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(1, 23, (B, T), generator=g)
    idx[0, 5] = 0  # a document start
    tgt = torch.randint(0, 23, (B, T), generator=g)
    tgt[:, ::5] = -1
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :4] = False  # a prompt that runs plain
    return idx, tgt, mask


def record(name, model, kw):
    idx, tgt, mask = batch()
    out = {}
    model.eval()
    with torch.no_grad():
        for mode, extra in [('plain', {}), ('exact', {}), ('zero', {}), ('exact_masked', dict(rec_mask=mask)),
                            ('jacobi', dict(n_iter=3, n_grad=1)), ('jacobi_masked', dict(n_iter=3, n_grad=1, rec_mask=mask)),
                            ('interleaved', dict(n_subsets=2)), ('interleaved_r2', dict(n_subsets=3, n_rounds=2))]:
            m = mode.split('_')[0]
            logits, loss = model(idx, tgt, mode=m, **extra)
            out[f'logits/{mode}'], out[f'loss/{mode}'] = logits, loss
        for prefill in ('exact', 'jacobi', 'plain'):
            toks, logits = model.generate(idx[:, :6], 7, temperature=0, prefill=prefill, prefill_iters=3, return_logits=True)
            out[f'generate/{prefill}/tokens'], out[f'generate/{prefill}/logits'] = toks, logits
    if name not in TRAINED:
        return out
    model.train()
    scheme = TRAIN['plain' if kw['recurrence'] == 'none' else kw['recurrence']]
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=1e-2, betas=(0.9, 0.95))
    loss = model(idx, tgt, **scheme)[1]
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    out['train/loss'] = loss.detach()
    out['train/state_dict'] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


if __name__ == '__main__':
    fixture = {'TINY': TINY, 'STYLES': STYLES, 'TRAIN': TRAIN, 'models': {}}
    for name, kw in STYLES.items():
        model = build(kw)
        entry = {'model_args': asdict(model.config), 'state_dict': {k: v.clone() for k, v in model.state_dict().items()}}
        entry.update(record(name, model, kw))
        fixture['models'][name] = entry
        print(name, {k: round(v.item(), 6) for k, v in entry.items() if k.startswith('loss/')})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'fingerprint.pt')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(fixture, path)
    print(f"wrote {path} ({os.path.getsize(path) / 1024:.0f} KiB)")

"""
Where a trained T2MLR's bursts of gradient come from (docs/recipe.md). For each checkpoint, on
fixed weights:

  1. the gradient norm of N training batches (32 rows) through exact training (interleaved,
     S = T), and the parameter that owns each burst (a batch whose norm is > 100x the median);
     then the same with the gradient through the state cut every k positions (the state a
     position reads is detached at every k-th refined position; the keys/values still carry it);
  2. the exact validation loss with the scalar gates g_rec and g_cur shifted by a few hundredths:
     how far an optimizer step on g_rec may go before the model breaks.

$ python lab/chain_bursts.py out/recipe_Z2/t2mlr_full_w32_S32_s9/best.pt [more checkpoints] [--batches=100]
"""

import os
import sys
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: its modules are top level
from configurator import fail  # noqa: E402
from support.checkpoint import CheckpointError, load_checkpoint  # noqa: E402
from support.dataset import DataError, load_meta, load_split  # noqa: E402

paths = [a for a in sys.argv[1:] if not a.startswith('--')]
n_batches = int(next((a.split('=')[1] for a in sys.argv[1:] if a.startswith('--batches=')), 100))
if not paths:
    fail("usage: python lab/chain_bursts.py CKPT.pt [CKPT.pt ...] [--batches=100] (T2MLR checkpoints)")


def cut_every(model, k):
    """model.shift_states that detaches its result on every k-th call (0: never). Exact training
    (interleaved, S = T) calls it once per position, in order, so this cuts the state's chain."""
    plain, calls = model.shift_states, [0]

    def shift(self, states, idx, rec_mask=None):
        calls[0] += 1
        out = plain(states, idx, *([] if rec_mask is None else [rec_mask]))  # (model.py's GPT takes no mask)
        return out.detach() if k and calls[0] % k == 0 else out
    return types.MethodType(shift, model), calls


for path in paths:
    try:
        model, ck = load_checkpoint(path)
        c = ck['config']
        data_dir = os.path.join(c.get('data_root', 'data'), c['dataset'])  # (train.py since issue 64: a path in dataset)
        meta = load_meta(data_dir)
        (X, Y), (Xv, Yv) = load_split(data_dir, 'train', meta), load_split(data_dir, 'val', meta)
    except (CheckpointError, DataError) as e:
        fail(str(e))
    if model.config.recurrence != 't2mlr':
        fail(f"{path}: a {model.config.recurrence!r} model; this tool reads T2MLR's scalar gates")
    T = X.shape[1]
    print(f"{path} (step {ck.get('iter_num')}): g_rec {model.fusion.g_rec.item():.4f}, g_cur {model.fusion.g_cur.item():.4f}")
    model.train()
    for k in (0, 8, 2, 1):
        model.shift_states, calls = cut_every(model, k)
        gen, norms, owners = torch.Generator().manual_seed(0), [], []
        for _ in range(n_batches):
            rows = torch.randint(len(X), (32,), generator=gen).numpy()
            x, y = (torch.from_numpy(a[rows].astype(np.int64)) for a in (X, Y))
            model.zero_grad()
            calls[0] = 0
            _, loss = model(x, y, mode='interleaved', n_subsets=T)
            loss.backward()
            per = {n: p.grad.norm().item() for n, p in model.named_parameters() if p.grad is not None}
            norms.append(sum(v * v for v in per.values()) ** 0.5)
            owners.append(max(per, key=per.get))
        n = np.array(norms)
        burst = n > 100 * np.median(n)
        who = sorted({o for o, b in zip(owners, burst) if b})
        print(f"  gradient, state cut every {k or 'never':>5}: median {np.median(n):.3g}, 90th percentile "
              f"{np.percentile(n, 90):.3g}, largest {n.max():.3g}; {burst.sum()} of {n_batches} batches > 100x the "
              f"median, owned by {', '.join(who) or '-'}")
    del model.shift_states  # back to the class's method
    model.eval()
    x, y = (torch.from_numpy(a[:256].astype(np.int64)) for a in (Xv, Yv))
    for name in ('g_rec', 'g_cur'):
        p = getattr(model.fusion, name)
        p0, out = p.detach().clone(), []
        for delta in (-0.02, -0.01, -0.004, 0.0, 0.004, 0.01, 0.02):
            with torch.no_grad():
                p.copy_(p0 + delta)
                out.append(f"{delta:+.3f}: {model(x, y, mode='exact')[1].item():.3f}")
        with torch.no_grad():
            p.copy_(p0)
        print(f"  exact val loss (256 rows), {name} shifted by  " + ',  '.join(out))

"""
Which parameter owns the gradient norm of a trained model (docs/recipe.md): for each run folder,
40 training batches of 32 rows through the run's own training scheme, the total gradient norm
before clipping (median and largest) and, per batch, the parameter with the largest gradient.

$ python lab/grad_owners.py out/recipe_Z2/t2mlr_full_w32_s1 out/recipe_Z2/t2mlr_full_w32_S32_s1
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: its modules are top level
from configurator import fail  # noqa: E402
from support.checkpoint import CheckpointError, load_checkpoint  # noqa: E402
from support.dataset import DataError, load_meta, load_split  # noqa: E402

if len(sys.argv) < 2:
    fail("usage: python lab/grad_owners.py RUN_DIR [RUN_DIR ...] (folders holding a ckpt.pt)")
for run in sys.argv[1:]:
    try:
        model, ck = load_checkpoint(os.path.join(run, 'ckpt.pt'))
        c = ck['config']
        data_dir = os.path.join(c.get('data_root', 'data'), c['dataset'])  # (train.py since issue 64: a path in dataset)
        X, Y = load_split(data_dir, 'train', load_meta(data_dir))
    except (CheckpointError, DataError) as e:
        fail(str(e))
    model.train()
    gen, owners, norms = torch.Generator().manual_seed(0), {}, []
    for _ in range(40):
        rows = torch.randint(len(X), (32,), generator=gen).numpy()
        x, y = (torch.from_numpy(a[rows].astype(np.int64)) for a in (X, Y))
        model.zero_grad()
        _, loss = model(x, y, mode=c['train_mode'], n_iter=c['n_iter'], n_grad=c['n_grad'], n_subsets=c['n_subsets'],
                        **{k: c[k] for k in ('n_rounds',) if k in c})  # (the research model's; else its config's)
        loss.backward()
        per = {n: p.grad.norm().item() for n, p in model.named_parameters() if p.grad is not None}
        top = max(per, key=per.get)
        owners[top] = owners.get(top, 0) + 1
        norms.append(sum(v * v for v in per.values()) ** 0.5)
    print(f"{run}: gradient norm median {np.median(norms):.2f}, largest {max(norms):.1f}; "
          f"the largest parameter gradient, in batches of 40: {owners}")

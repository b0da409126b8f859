"""
Which part of a permutation state a model gets right (docs/evidence.md, S5-Retrieval with swapped
labels). A state of S<n> is a word p, p[i] = where point i ends up after the moves so far. A model
can carry part of it and guess the rest: its sign (even or odd: the quotient S<n> -> Z2), where one
point i goes (p[i]), or which point lands on j (the position of j in the word). For each part,
the share of state labels whose predicted element agrees with the true one on that part; a model
that carries only that part is right on it and at chance within it (S3: element accuracy 1/3
given the sign, 1/2 given one p[i]).

$ python lab/state_parts.py out/swap_lrt_s1/best.pt [more checkpoints] [--split=test] [--rows=500]

The state labels are those that are group elements after the dictionary (s5 and s5_retrieval
data, swapped or not); the dataset is the one each run was trained on.
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: its modules are top level
from configurator import fail  # noqa: E402
from support.checkpoint import CheckpointError, load_checkpoint  # noqa: E402
from support.dataset import DataError, load_meta, load_rec_mask, load_split  # noqa: E402
from support.diagnostics import masked  # noqa: E402
from support.tasks import make_group, position_kinds  # noqa: E402


def parts(pred, label, names):
    """pred, label: (N,) element indices into names (pred may be -1: not a group element, wrong
    on every part). -> {part: share of the N where pred and label agree on it}."""
    P = np.array([[int(c) for c in w] for w in names])  # (G, n): P[g, i] = where g sends point i
    n = P.shape[1]
    sign = np.array([sum(p[i] > p[j] for i in range(n) for j in range(i + 1, n)) % 2 for p in P])
    where = P.argsort(1)  # where[g, j] = the point that g sends to j
    ok = pred >= 0
    p, y = np.where(ok, pred, 0), label
    out = {'element': ok & (p == y), 'sign': ok & (sign[p] == sign[y])}
    out.update({f'p[{i}]': ok & (P[p, i] == P[y, i]) for i in range(n)})
    out.update({f'lands on {j}': ok & (where[p, j] == where[y, j]) for j in range(n)})
    return {k: float(v.mean()) for k, v in out.items()}


@torch.no_grad()
def predict(model, X, M, batch_size=100):
    """The exact recurrence's argmax at every position, (n, T)."""
    out = []
    for i in range(0, len(X), batch_size):
        x = torch.from_numpy(np.asarray(X[i:i + batch_size], dtype=np.int64))
        m = None if M is None else torch.from_numpy(np.asarray(M[i:i + batch_size], dtype=np.bool_))
        out.append(model(x, mode='exact', **masked(m))[0].argmax(-1).numpy())
    return np.concatenate(out)


def state_labels(meta, split, X, Y, ids):
    """(n, T) bool: the positions whose label is a group element, after s5_retrieval's dictionary."""
    kinds = position_kinds(meta, split)
    after = np.ones(X.shape[1], bool) if kinds is None else kinds['state'] | kinds['value']
    return np.isin(Y, ids) & after[None]


def main(argv):
    paths = [a for a in argv if not a.startswith('--')]
    opts = dict(a[2:].split('=', 1) for a in argv if a.startswith('--') and '=' in a)
    split, rows = opts.get('split', 'test'), opts.get('rows', '500')
    if not paths or set(opts) - {'split', 'rows'} or not rows.isdigit() or int(rows) < 1:
        fail("usage: python lab/state_parts.py CKPT.pt [CKPT.pt ...] [--split=test] [--rows=500]")
    rows = int(rows)
    for path in paths:
        try:
            model, ckpt = load_checkpoint(path)
            data_dir = os.path.join(ckpt['config'].get('data_root', 'data'), ckpt['config']['dataset'])
            meta = load_meta(data_dir)
            X, Y = load_split(data_dir, split, meta)
            M = load_rec_mask(data_dir, split, meta)
        except (CheckpointError, DataError, KeyError) as e:
            fail(f"{path}: {e}")
        group = (meta.get('task') or {}).get('group', meta['name'].split('_')[-1])
        if not group.startswith(('S', 'A')):
            fail(f"{path}: trained on {meta['name']}, not a permutation group's word problem")
        names = make_group(group)[0]
        ids = [meta['itos'].index(w) for w in names]  # the token of each element
        X, Y, M = X[:rows], Y[:rows], None if M is None else M[:rows]
        model.eval()
        pred = predict(model, X, M)
        to_elem = np.full(max(meta['vocab_size'], model.config.vocab_size), -1)
        to_elem[ids] = np.arange(len(ids))
        at = state_labels(meta, split, X, Y, ids)
        late = at & (np.arange(X.shape[1]) >= X.shape[1] // 2)[None]  # the second half of the row
        every, second = (parts(to_elem[pred[w]], to_elem[Y[w]], names) for w in (at, late))
        print(f"{path}: {meta['name']} {split}, {len(X)} rows, {at.sum()} state labels "
              f"({late.sum()} in the second half of the row)")
        print(f"  {'part':<12} {'all':>6} {'2nd half':>9}")
        for k in every:
            print(f"  {k:<12} {every[k]:6.3f} {second[k]:9.3f}")


if __name__ == '__main__':
    main(sys.argv[1:])

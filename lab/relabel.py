"""
A copy of an s5_retrieval dataset (official layout) with its labels moved or removed, to find
which half of the task a model fails and why (docs/evidence.md, "What blocks the lookup"). The
inputs are untouched; only {split}_y.bin changes.

$ python lab/relabel.py s5_retrieval_S3 --drop=state    # -> data/s5_retrieval_S3_nostate
$ python lab/relabel.py s5_retrieval_S3 --ask_at=move   # -> data/s5_retrieval_S3_atmove
$ python lab/relabel.py s5_retrieval_S3 --swap=True     # -> data/s5_retrieval_S3_swap
$ python lab/relabel.py s5_retrieval_S3 --swap=True --drop=lookup  # -> data/s5_retrieval_S3_swap_nolookup
$ python lab/relabel.py s5_retrieval_S3 --phase1=True   # -> data/phase1/s5_retrieval_S3

--drop=state   the states are not labelled in training (the value slots and the dictionary's
               copies are); the evaluation splits keep every label
--ask_at=move  the value is asked at the move itself (its own key, as prepare.py assoc asks
               it) instead of at the slot after it; the states and slots are not labelled. In
               every split, so a run's "state" accuracy is then the lookup's accuracy
--swap=True    both halves, each label moved to the other position of its move: the value at
               the move (its own key), the state at the slot after it (what the move made).
               In every split: a run's "state" accuracy is then the lookup's, its "value"
               accuracy the state's; exact match is the whole row's as before
--swap=True --drop=lookup   the swapped rows with the lookups unlabelled in training (the states
               and the dictionary's copies are): a first phase that trains the state alone; the
               evaluation splits keep every label
--phase1=True  the official rows for a first phase of training that teaches the lookup: in the
               training split each value is asked at its move as well as at the slot after it
               (the states unlabelled), the evaluation splits as they were. Under the same
               dataset name in another folder, so that a run continues from it onto the
               official rows with --init_from=resume (docs/evidence.md, "The official layout in two phases")
"""

import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from support.dataset import DATA_DIR  # noqa: E402
from support.tasks import position_kinds  # noqa: E402


def relabel(name, drop=None, ask_at=None, swap=False, phase1=False, data_root=DATA_DIR):
    src = os.path.join(data_root, name)
    meta = json.load(open(os.path.join(src, 'meta.json')))
    if (meta.get('task') or {}).get('layout') != 'official' or (drop, ask_at, swap, phase1) not in (
            ('state', None, False, False), (None, 'move', False, False), (None, None, True, False),
            ('lookup', None, True, False), (None, None, False, True)):
        sys.exit(f"{name}: needs s5_retrieval data in the official layout and one of --drop=state, --ask_at=move, "
                 f"--swap=True, --swap=True --drop=lookup, --phase1=True")
    if (ask_at or swap or phase1) and meta['task']['k'] != 1:
        sys.exit(f"{name}: --ask_at, --swap and --phase1 need one value character a key (k=1), not k={meta['task']['k']}")
    suffix = 'swap_nolookup' if swap and drop else 'nostate' if drop else 'atmove' if ask_at else 'swap'
    dst = os.path.join(data_root, 'phase1', name) if phase1 else os.path.join(data_root, f"{name}_{suffix}")
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f.endswith('.bin'):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    for split, s in meta['splits'].items():
        path = os.path.join(dst, f'{split}_y.bin')
        y = np.fromfile(path, dtype=np.int32).reshape(s['n'], s['len'])  # (rows, T), -1 = no label
        kinds = position_kinds(meta, split)  # (T,) bool each: the moves, the value slots after them
        if ask_at:
            y[:, kinds['state']], y[:, kinds['value']] = y[:, kinds['value']], -1
        if swap:
            y[:, kinds['state']], y[:, kinds['value']] = y[:, kinds['value']], y[:, kinds['state']]
        if drop and split == 'train':  # the states (--drop=state), or after the swap the lookups, at the moves
            y[:, kinds['state']] = -1
        if phase1 and split == 'train':  # the value at the move too, where the state was
            y[:, kinds['state']] = y[:, kinds['value']]
        y.tofile(path)
    args = {**(meta.get('args') or {}), 'relabel': 'phase1' if phase1 else suffix}  # a resume across it says so
    json.dump({**meta, 'name': name if phase1 else os.path.basename(dst), 'args': args}, open(os.path.join(dst, 'meta.json'), 'w'))
    print(f"wrote {dst}")
    return dst


if __name__ == '__main__':
    args = dict(a.removeprefix('--').split('=', 1) for a in sys.argv[2:])
    if (len(sys.argv) < 3 or set(args) - {'drop', 'ask_at', 'swap', 'phase1', 'data_root'}
            or any(args.get(k, 'True') != 'True' for k in ('swap', 'phase1'))):
        sys.exit(__doc__)
    relabel(sys.argv[1], args.get('drop'), args.get('ask_at'), 'swap' in args, 'phase1' in args, args.get('data_root', DATA_DIR))

"""
Pool the runs of one arm that compare.py tabulated in several results.json files (runs made in
different sessions, with the same arithmetic), and test the pool against another arm's pool:
docs/recipe.md's ten-seed rows whose seeds were run in two batches.

$ python lab/pool.py NAME=MODEL:RESULTS.json[,RESULTS.json...][@SEEDS] [NAME=...]

Each argument is one arm: a label, compare.py's model name in those files, the files, and
optionally which seeds to keep (e.g. @1,2,3; default every seed, a seed found twice is an error).
Prints per arm the exact EM at the longest test length (median [min, max]) and how many seeds reach
0.9, the plateau-escape step, the largest pre-clip gradient norm and the final exact val loss; where
the files log them, how many runs were thrown back onto the plateau after their escape and the
highest loss after it; and, for every arm after the first, the two-sided Mann-Whitney p of those
endpoints (the count of throw-backs a run had, not the k of n) against the first.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: its modules are top level
from configurator import fail  # noqa: E402
from stats import med_range, rank_test  # noqa: E402  (lab/stats.py, beside this script)


def load(arg):
    """'name=model:a.json,b.json@1,2' -> (name, {seed: run row}, the longest test length, its split)."""
    if '=' not in arg or ':' not in arg:
        fail(f"{arg!r}: expected NAME=MODEL:RESULTS.json[,RESULTS.json...][@SEEDS]")
    name, rest = arg.split('=', 1)
    model, rest = rest.split(':', 1)
    files, _, keep = rest.partition('@')
    rows, lengths, split = {}, None, None
    for f in files.split(','):
        if not os.path.isfile(f):
            fail(f"{f}: no such results.json (compare.py writes one into its results_dir)")
        d = read(f)
        if model not in d['runs']:
            fail(f"{f} has no runs of {model!r} (it has {', '.join(d['runs'])})")
        if lengths not in (None, d['lengths']):
            fail(f"{f} tests lengths {d['lengths']}, an earlier file {lengths}: pool runs of one task only")
        lengths, split = d['lengths'], longest_split(f, d)
        for r in d['runs'][model]:
            if r['seed'] in rows:
                fail(f"{name}: seed {r['seed']} is in more than one file; keep one with @SEEDS")
            rows[r['seed']] = r
    if keep:
        want = [int(s) for s in keep.split(',')]
        missing = [s for s in want if s not in rows]
        if missing:
            fail(f"{name}: seeds {missing} are in none of {files}")
        rows = {s: rows[s] for s in want}
    return name, rows, lengths[-1], split


def read(f):
    """A results.json compare.py wrote, with what this tool reads of it; anything else is one line
    (once a JSONDecodeError or a KeyError traceback)."""
    try:
        with open(f) as fh:
            d = json.load(fh)
        d['lengths'][-1]
        for r in (r for rs in d['runs'].values() for r in rs):
            r['seed'], r['escape'], r['eval']['val/loss_exact'], r['curve']['grad_max']
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        fail(f"{f}: not a results.json ({type(e).__name__}: {e})")
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        fail(f"{f}: not a results.json of compare.py (no {e} where one is read)")
    return d


def longest_split(f, d):
    """The name of the longest test split: compare.py lists the splits in order of length. Files
    written before it did are of the s5 tasks, whose splits are named by length ('test' at the
    training length, 'test_<length>' beyond); any other name is refused, not guessed."""
    if 'splits' in d:
        return d['splits'][-1]
    split = 'test' if len(d['lengths']) == 1 else f"test_{d['lengths'][-1]}"
    if any(f'{split}/em_exact' not in r['eval'] for rs in d['runs'].values() for r in rs):
        fail(f"{f} lists no split names and has no split {split!r}: rerun its compare.py command to rewrite it")
    return split


def endpoints(rows, split):
    e = {'em': [r['eval'][f'{split}/em_exact'] for r in rows.values()],
         'escape': [r['escape'] for r in rows.values()],
         'grad_max': [r['curve']['grad_max'] for r in rows.values()],
         'val_loss': [r['eval']['val/loss_exact'] for r in rows.values()]}
    if all('collapses' in r and 'train' in r['curve'] for r in rows.values()):  # the throw-backs, if logged
        e['collapses'] = [r['collapses'] for r in rows.values()]
        e['peak'] = [peak_after(r['curve']['train'], r['escape']) for r in rows.values()]
    return e


def peak_after(train, escape):
    """How far back a run was thrown: the highest mean train loss of a log interval after its
    escape (train = [[step, loss], ...]; 0 if it never escaped)."""
    return max((loss for step, loss in train if step > escape), default=0.0)


NAMES = {'escape': 'escape', 'grad_max': 'grad norm', 'val_loss': 'val loss', 'collapses': 'throw-backs', 'peak': 'peak'}


if __name__ == '__main__':
    if len(sys.argv) < 2:
        fail(__doc__.strip().split('\n\n')[1])
    arms = [load(a) for a in sys.argv[1:]]
    base = None
    for name, rows, length, split in arms:
        e = endpoints(rows, split)
        em, esc, g, v = (med_range(e[k]) for k in ('em', 'escape', 'grad_max', 'val_loss'))
        line = (f"{name}: seeds {','.join(map(str, rows))}; EM@{length} {em[0]:.2f} [{em[1]:.2f}, {em[2]:.2f}], "
                f"{sum(x >= 0.9 for x in e['em'])}/{len(rows)} >= 0.9; escape {esc[0]:g} [{esc[1]:g}, {esc[2]:g}]; "
                f"largest grad norm {g[0]:.0e} [{g[1]:.0e}, {g[2]:.0e}]; val loss {v[0]:.4f} [{v[1]:.4f}, {v[2]:.4f}]")
        if 'peak' in e:
            pk = med_range(e['peak'])
            line += (f"; thrown back {sum(c > 0 for c in e['collapses'])}/{len(rows)}, "
                     f"peak loss after the escape {pk[0]:.3f} [{pk[1]:.3f}, {pk[2]:.3f}]")
        if base is not None:
            keys = ('escape', 'grad_max', 'val_loss') + (('collapses', 'peak') if 'peak' in e and 'peak' in base[1] else ())
            line += '; p vs {} ({}): {}'.format(base[0], ', '.join(NAMES[k] for k in keys),
                                                ', '.join(f"{rank_test(e[k], base[1][k]):.3g}" for k in keys))
        else:
            base = (name, e)
        print(line)

"""
Rank tests between arms of a language-modelling comparison: compare.py writes text.json (every
run's test bits per character under each mode); this prints, per pair of arms, the median
[min, max] of each and the two-sided exact Mann-Whitney p (stats.rank_test) on those bits.

$ python lab/pairs.py lab/results/ablations/stdlib6/text.json ab6_t2mlr_mid:ab6_t2mlr_full ab6_lrt_nomem/zero:ab6_plain
$ python lab/pairs.py a/text.json,b/text.json ab6_lrt_exact:ab6_lrt

Several files (comma-separated) pool each model's seeds: runs made in different sessions, with
the same arithmetic. A seed found in two files must be the same run (the same bits), else it is
an error.

An arm is a model name, optionally /mode (exact, approx or zero; default exact): the control
ab6_lrt_nomem is judged by its zero-state bits, the memory it was trained with.
"""

import json
import os
import sys

from stats import med_range, rank_test  # lab/stats.py, beside this script


def bits(runs, arm):
    """The test bits per character of every seed of arm ('name' or 'name/mode')."""
    name, _, mode = arm.partition('/')
    if name not in runs:
        sys.exit(f"no model {name!r} in this file; it has {', '.join(runs)}")
    got = [r['test']['bits'].get(mode or 'exact') for r in runs[name]]
    if None in got:
        sys.exit(f"{name} has no {mode!r} bits; it has {', '.join(runs[name][0]['test']['bits'])}")
    return got


def read(path):
    """The runs of a text.json compare.py wrote, {model: [run, ...]}; anything else is one line (once
    a JSONDecodeError or a KeyError traceback)."""
    try:
        with open(path) as f:
            runs = json.load(f)['runs']
        for r in (r for rs in runs.values() for r in rs):
            r['seed'], r['test']['bits'].get
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        sys.exit(f"{path}: not a text.json ({type(e).__name__}: {e})")
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        sys.exit(f"{path}: not a text.json of compare.py (no {e} where one is read)")
    return runs


def pool(paths):
    """{model: [run, ...]} over the text.json files in paths, one run per (model, seed)."""
    runs = {}
    for path in paths.split(','):
        if not os.path.isfile(path):
            sys.exit(f"{path}: no such text.json (compare.py writes one into its results_dir)")
        for name, rs in read(path).items():
            have = {r['seed']: r for r in runs.setdefault(name, [])}
            for r in rs:
                if r['seed'] not in have:
                    runs[name].append(r)
                elif have[r['seed']]['test']['bits'] != r['test']['bits']:
                    sys.exit(f"{name} seed {r['seed']} is in two files with different bits: not the same run")
    return runs


def main(paths, pairs):
    runs = pool(paths)
    print('| A | B | A: bits/char | B: bits/char | A - B (medians) | p (rank test) |')
    print('|---|---|---|---|---|---|')
    for pair in pairs:
        if ':' not in pair:
            sys.exit(f"{pair!r}: expected A:B, e.g. ab6_t2mlr_mid:ab6_t2mlr_full")
        a, b = pair.split(':')
        xa, xb = bits(runs, a), bits(runs, b)
        ma, mb = med_range(xa), med_range(xb)
        print(f"| {a} | {b} | {ma[0]:.3f} [{ma[1]:.3f}, {ma[2]:.3f}] | {mb[0]:.3f} [{mb[1]:.3f}, {mb[2]:.3f}] "
              f"| {ma[0] - mb[0]:+.3f} | {rank_test(xa, xb):.2f} |")


if __name__ == '__main__':
    if len(sys.argv) < 3 or sys.argv[1] in ('-h', '--help'):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])

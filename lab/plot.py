"""
Measured against FLOP-predicted ratios to the plain model, one panel per section the JSON files hold:
the training step and decode (bench.py --out), the prefill (lab/prefill.py --out). Needs matplotlib.

    python bench.py --out=bench.json && python lab/prefill.py --out=prefill.json
    python lab/plot.py --results=bench.json,prefill.json --out=bench.png
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configurator.py: one folder up
from configurator import configure, fail
from support.dataset import check_out_file

# -----------------------------------------------------------------------------
results = ''            # the JSON files (comma-separated) that bench.py and lab/prefill.py wrote with --out
out = 'bench.png'       # the picture
# -----------------------------------------------------------------------------
configure(globals(), ['results', 'out'], doc=__doc__)
check_out_file('out', out)
if not results:
    fail("results: give the JSON files to draw (--results=bench.json,prefill.json)")
res = {}
for path in results.split(','):
    try:
        with open(path) as f:
            res.update(json.load(f))
    except (OSError, ValueError) as e:
        fail(f"results: {path}: {e}")
panels = [  # (title, rows, label): the plain rows are the baseline (1.0 by definition), the black line, not a bar
    ('training step', [r for r in res.get('train', []) if r['name'] != 'plain'], lambda r: r['name']),
    ('decode, per token', [r for r in res.get('decode', []) if r['model'] != 'plain'],
     lambda r: f"{r['model']} batch {r['batch']} gen {r['gen_len']}"),
    ('prefill', res.get('prefill', [])[1:], lambda r: f"{r['model']} {r['mode']}")]
panels = [p for p in panels if p[1]]
if not panels:
    fail(f"results: {results} holds no train, decode or prefill rows")
try:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
except ImportError:
    fail("lab/plot.py needs matplotlib, which is not installed (pip install matplotlib)")

fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
for ax, (title, rows, label) in zip(axes[0], panels):
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r['ratio'] for r in rows], 0.4, label='measured')
    ax.bar([x + 0.2 for x in xs], [r['flop_ratio'] for r in rows], 0.4, label='FLOP-predicted')
    ax.axhline(1.0, color='k', lw=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([label(r) for r in rows], rotation=60, ha='right', fontsize=7)
    ax.set_title(title)
    ax.set_ylabel('time / plain model')
axes[0][0].legend()
cfg, env = res.get('config', {}), res.get('env', {})
fig.suptitle(f"recurrence cost vs plain GPT ({env.get('device')}, {env.get('dtype')}, L={cfg.get('n_layer')}, "
             f"d={cfg.get('n_embd')})")
fig.tight_layout()
fig.savefig(out, dpi=120)
print(f"wrote {out}")

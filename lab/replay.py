"""
Replay a run from one of its checkpoints, unchanged or with one change: the experiment of
docs/recipe.md ("A solved model's crash, replayed"). A checkpoint holds the model, the optimizer,
the data generator and the RNGs, so on the same machine with the same thread
count the resumed run repeats the original step for step, and a change made at the resume point
is an intervention on that one trajectory.

$ python lab/replay.py CKPT OUT_DIR [--freeze_gates] [--key=value ...]

CKPT: a run's ckpt.pt or best.pt. OUT_DIR: a new directory for the replay (its ckpt.pt, best.pt,
log.jsonl). --freeze_gates: T2MLR's scalar gates g_cur, g_rec get learning rate 0 from the resume
on (--gate_lr_mult=0; the run must have them). Every --key=value goes to train.py (lab/train.py for the research
model's runs) after the run's own settings, e.g. --gate_lr_mult=0.1, --log_interval=1.
"""

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repo root: its modules are top level
import model  # noqa: E402  (model.py: the textbook model's fields)
from configurator import fail  # noqa: E402
from support.checkpoint import CheckpointError, read_checkpoint  # noqa: E402

args = sys.argv[1:]
paths = [a for a in args if not a.startswith('--')]
overrides = [a for a in args if a.startswith('--') and a != '--freeze_gates']
if len(paths) != 2:
    fail("usage: python lab/replay.py CKPT OUT_DIR [--freeze_gates] [--key=value ...]")
src, out_dir = paths
try:
    ckpt = read_checkpoint(src)  # weights_only: a crafted file is refused before it runs anything
    config, groups = ckpt['config'], ckpt['optimizer']['param_groups']
except CheckpointError as e:
    fail(str(e))
except Exception as e:  # a missing or foreign file
    fail(f"{src}: not a train.py checkpoint ({type(e).__name__}: {e})")


def unstarted(folder):
    """Whether folder holds only a replay that never ran a step: no log, and its ckpt.pt still at
    the resume point (a bad --key=value ended train.py at start-up). Replacing it loses nothing."""
    if os.path.exists(os.path.join(folder, 'log.jsonl')):
        return False
    try:
        return read_checkpoint(os.path.join(folder, 'ckpt.pt'))['iter_num'] == ckpt['iter_num']
    except Exception:
        return False


if os.path.exists(os.path.join(out_dir, 'ckpt.pt')):
    if not unstarted(out_dir):
        fail(f"{out_dir} already holds a run (ckpt.pt): give the replay a new directory")
    print(f"note: {out_dir} holds a replay that never ran a step: replaced")

if '--freeze_gates' in args:
    # the scalar gates are the 0-dim parameters (GPT.param_groups puts them in groups of their own)
    state = ckpt['optimizer']['state']
    frozen = [g for g in groups if g['params'] and all(state[i]['exp_avg'].dim() == 0 for i in g['params'])]
    if not frozen:
        fail(f"{src}: no scalar gates to freeze (not a T2MLR run?)")
    for g in frozen:
        g['lr_mult'] = 0.0
    config['gate_lr_mult'] = 0.0  # what train.py builds the groups from on resume (a changed setting is applied)
    print(f"froze {sum(len(g['params']) for g in frozen)} scalar gates")

# settings train.py no longer has (git history keeps them), with the values that changed nothing:
# a checkpoint from before their removal that ran at those replays as it ran; one that did not is
# refused (gate_interval only set how often the gate statistics were logged: dropped whatever its value)
REMOVED = dict(skip_spike=0.0, skip_spike_arm=0.0, rec_weight_decay=None, init_loss=True, beta2=0.95)
for k in [*REMOVED, 'gate_interval', 'eval_exact_iters', 'eval_examples_mid', 'eval_batch_size', 'eval_first']:
    if k in REMOVED and k in config and config[k] != REMOVED[k]:
        fail(f"{src}: the run used {k}={config[k]!r}, a setting train.py no longer has (git history keeps it): "
             f"replay it with the train.py it ran with")
    config.pop(k, None)  # (the evaluation's sizes and eval_first: the evaluation only, never the trajectory)
if 'data_root' in config:  # (before issue 64) dataset is now a name in data/ or a path
    root = config.pop('data_root')
    config['dataset'] = config['dataset'] if os.path.normpath(root) == 'data' else os.path.abspath(os.path.join(root, config['dataset']))
# the research model's runs (every checkpoint before issue 64, arch, n_rounds, ...) replay with lab/train.py
lab = not set(ckpt.get('model_args', {})) <= set(model.GPTConfig.__dataclass_fields__)

os.makedirs(out_dir, exist_ok=True)
torch.save(ckpt, os.path.join(out_dir, 'ckpt.pt'))
# the run's own settings (all of train.py's, as the checkpoint recorded them), then the changes
same = [f'--{k}={v!r}' for k, v in config.items() if k not in ('out_dir', 'init_from', 'overwrite')]
cmd = [sys.executable, os.path.join(ROOT, 'lab', 'train.py') if lab else os.path.join(ROOT, 'train.py'), *same, f'--out_dir={out_dir}', '--init_from=resume', *overrides]
print(f"replaying {src} (step {ckpt['iter_num']}) in {out_dir}" + (f" with {' '.join(overrides)}" if overrides else ''),
      flush=True)
os.execv(sys.executable, cmd)  # train.py in this process: Ctrl-C and SIGTERM reach it as they would a run

"""
The evidence: the plain GPT against T2MLR and LRT on a state-tracking task, at the
same backbone size, trained on lengths 1..32 and judged with the EXACT recurrence
(what generation computes) at 32 and at longer, unseen lengths.

$ python prepare.py s5 --group=Z2 && python lab/compare.py

Runs train.py once per (model, seed), one after another (lab/train.py for the arms that use the
research model's options), each in its own out_dir under out_dir/, then writes out_dir/results.md,
out_dir/results.json and out_dir/accuracy.png (if matplotlib is installed), and out_dir/gates.png: the gate
statistics each run logs during training (with train.py's log lines), i.e. how the
recurrence switches on from identity. A run whose final evaluation is already in its
log is not run again, so an interrupted comparison picks up where it stopped.

$ python prepare.py s5 --group=S3 && python lab/compare.py --dataset=s5_S3 --curve_interval=250 \
      --out_dir=out/compare_S3 --results_dir=lab/results/evidence/s5_S3

also evaluates every 250 steps (on 200 rows a split: train.py's fifth of eval_examples) and draws curves.png, the exact-recurrence
loss and exact match against training steps, and writes the tables and plots to
results_dir instead of out_dir (the runs themselves stay in out_dir).

$ python prepare.py stdlib_char && python lab/compare.py --dataset=stdlib_char --seeds=1,2,3 \
      --models=stdlib_plain,stdlib_t2mlr,stdlib_lrt,stdlib_plain@stdlib_t2mlr,stdlib_plain@stdlib_lrt

language modelling (a token corpus): each config's own max_iters (equal steps), and a model
named A@B trains A for as many steps as cost B's training FLOPs (support/flops.py: equal compute; B is
trained first). The table: bits per character of the held-out test files, read whole, under the
exact recurrence, the training approximation and the zero state; step time and FLOPs; and
text.png, test bits per character against steps and against training FLOPs.

$ python lab/compare.py --models=... --reliance=True

trains nothing: it loads every finished run's checkpoint and writes
out_dir/reliance.md/.json, the loss, token accuracy and exact match on the test split
at the training length with the exact recurrence and with the state forced to zero at
every position (model.py's mode='zero'), and redraws gates.png from the logs.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: its modules are top level
from configurator import configure, fail, parse_value, read_config  # noqa: E402
from support.dataset import check_out_folder  # noqa: E402
from stats import endpoints, med_range, rank_test  # noqa: E402  (lab/stats.py, beside this script)

# -----------------------------------------------------------------------------
out_dir = 'out/compare'
data_root = 'data'
dataset = 's5_Z2'
models = 'plain,t2mlr_full,t2mlr_mid,lrt'  # names from MODELS below
seeds = '1,2'
max_iters = 1500
extra = ''               # more --key=value for every run, space separated
quick = False            # a tiny end-to-end run for the tests
curve_interval = 0       # > 0: also evaluate every so many steps (exact EM on 200 rows a split) -> curves.png
results_dir = ''         # where results.md/.json and the plots go ('' = out_dir), e.g. lab/results/evidence/s5_S3
reliance = False         # only the reliance table from the runs' checkpoints (no training)
target = 0.9             # tasks: the table counts the seeds whose exact match at the longest length reaches this
escape_loss = 0.0        # tasks: a run leaves the plateau at the first logged step whose mean train loss is below
                         # this; 0 = by dataset (parity 0.2, S3 0.5, else 0.3 ln V: about a third of chance)
spike = 0.25             # a spike: the mean train loss more than this (nats) above its running minimum after the escape
test_windows = 0         # language modelling: score the first so many test windows (0 = the whole test split)
# -----------------------------------------------------------------------------
given = configure(globals(), [k for k in list(globals()) if not k.startswith('_') and k not in ('json', 'math', 'os', 'signal', 'subprocess', 'sys', 'time', 'check_out_folder', 'configure', 'fail', 'parse_value', 'read_config', 'endpoints', 'med_range', 'rank_test')], doc=__doc__)
# SIGTERM unwinds like Ctrl-C (Python's default would exit on the spot): the run in training is
# stopped with us and its compare.pid removed (run(), below)
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

# the contenders: same 4-layer d=64 backbone, only the recurrence differs.
# T2_JACOBI: T2MLR as every table before docs/recipe.md trained it (Jacobi D=8, B=4, the recurrent
# gate closed at init, full attention); spelled out, so that those arms keep meaning what they
# measured now that config/t2mlr_small.py carries the recipe
T2_JACOBI = ['config/t2mlr_small.py', '--train_mode=jacobi', '--jacobi_init=plain', '--n_iter=8', '--n_grad=4', '--attn_window=0',
             '--rec_gate_init=0.0', '--gate_lr_mult=1.0']
# T2_EXACT: the recipe before it took the one-step gradient (interleaved S = T = 32: exact states, the
# gradient through the whole chain, the init pass in the loss), which the arms below built on
T2_EXACT = ['config/t2mlr_small.py', '--train_mode=interleaved', '--n_subsets=32']
MODELS = {
    'plain': ['config/plain_small.py', '--attn_window=0'],  # no window
    # the recipe (docs/recipe.md): all 4 layers on exact states (computed token by token without
    # gradient) with a one-step gradient (one Jacobi iteration and the final pass: Jacobi D = 32 = T, B = 1's
    # states and gradient, t2mlr_j32b1), a 32-token window, the scalar gates at a tenth of the learning rate. For S3, the recurrent gate open at init and trained exactly (interleaved S = 32):
    # config/s3_t2mlr.py, the same run as t2mlr_full_w32_S32_gate1
    't2mlr': ['config/t2mlr_small.py'],
    # the quick start before its cosine ended at step 500: the cosine over all the run's steps (-1);
    # docs/recipe.md's tables made before then name it t2mlr
    't2mlr_cos': ['config/t2mlr_small.py', '--lr_decay_iters=-1'],
    't2mlr_gate1': [*T2_EXACT, '--rec_gate_init=1.0', '--gate_lr_mult=1.0'],
    # against the bursts of gradient, which land on the scalar gate g_rec (docs/recipe.md): the scalar
    # gates at a tenth of the learning rate, on the exact scheme (t2mlr_full_w32_S32); the recipe before
    # t2mlr_j32b1
    't2mlr_glr01': [*T2_EXACT, '--gate_lr_mult=0.1'],
    # the recipe with exact states but a one-step gradient: Jacobi D = 32 >= T (every position reads its
    # true state, as S = 32 gives) and B = 1 (the gradient through the last iteration and the final pass,
    # not the 32-step chain whose bursts throw runs back), and no init pass in the loss. LRT on S3 under this scheme
    # escapes earlier than under its exact one and never sees a large gradient (docs/recipe.md)
    't2mlr_j32b1': ['config/t2mlr_small.py', '--jacobi_init=plain', '--n_iter=32'],  # the same, iterated to the exact states
    # (t2mlr_b2 and t2mlr_b299, AdamW's beta2 at 0.999 and 0.99, went with the beta2 setting in issue 64: git history)
    # the learning rate after the escape: the cosine reaches min_lr (2e-4) at step 750 or 500 instead of
    # 1500, and stays there (runs escape at steps 250-700; the throw-backs come 100-300 steps later)
    't2mlr_decay750': ['config/t2mlr_small.py', '--lr_decay_iters=750'],
    't2mlr_decay500': ['config/t2mlr_small.py', '--lr_decay_iters=500'],  # = t2mlr since (its table's name)
    't2mlr_full': [*T2_JACOBI],                                  # layers 0..3, Jacobi D=8 B=4
    't2mlr_mid': [*T2_JACOBI, '--rec_start=1', '--rec_end=2'],   # middle block 1..2
    't2mlr_full_D32': [*T2_JACOBI, '--n_iter=32', '--n_grad=4'],  # D >= T: exact training
    'lrt': ['config/lrt_small.py', '--n_subsets=2', '--attn_window=0'],      # the paper's S=2, no window
    'lrt_jacobi': ['config/lrt_small.py', '--train_mode=jacobi', '--n_iter=8', '--n_grad=4', '--attn_window=0'],  # cross pairing
    # the same with a 32-token attention window in training and test, so that no
    # attention distance at test time is longer than any seen in training
    'plain_w32': ['config/plain_small.py'],
    't2mlr_full_w32': [*T2_JACOBI, '--attn_window=32'],
    'lrt_jacobi_w32': ['config/lrt_small.py', '--train_mode=jacobi', '--n_iter=8', '--n_grad=4', '--attn_window=32'],
    # LRT's own scheme with deeper chains: R rounds of the S=2 subsets train through the
    # first R*S positions exactly; S = T refines every position once, in order: exact
    # training with the gradient through the whole chain (model.py forward_interleaved)
    'lrt_w32': ['config/lrt_small.py', '--n_subsets=2'],
    'lrt_r4_w32': ['config/lrt_small.py', '--n_subsets=2', '--n_rounds=4'],
    'lrt_S32_w32': ['config/lrt_small.py'],  # the config: S = T = 32, the window
    # how much Jacobi depth a task needs: D in {4, 8, 16, 32 = T} with gradient through the
    # last iteration only (B=1); t2mlr_full_w32 is D=8 at B=4
    't2mlr_w32_D4': [*T2_JACOBI, '--n_iter=4', '--n_grad=1', '--attn_window=32'],
    't2mlr_w32_D8': [*T2_JACOBI, '--n_iter=8', '--n_grad=1', '--attn_window=32'],
    't2mlr_w32_D16': [*T2_JACOBI, '--n_iter=16', '--n_grad=1', '--attn_window=32'],
    't2mlr_w32_D32': [*T2_JACOBI, '--n_iter=32', '--n_grad=1', '--attn_window=32'],
    't2mlr_w32_D4B4': [*T2_JACOBI, '--n_iter=4', '--n_grad=4', '--attn_window=32'],  # B varied at D=4
    # the recipe ablation (docs/recipe.md): one knob at a time against t2mlr_full_w32 (parity) and
    # t2mlr_w32_D32 (S3). rms1: the state's scale unclamped, R_t = m_t / rms(m_t) (RMS 1, as LRT's
    # memory); lr1e3: half the learning rate, 5% warmup; detach: no gradient through R_{t-1} in m_t = h_t + R_{t-1} (the
    # official S5 recipe); B4: gradient through the last 4 iterations; noclip: no gradient clipping
    # (the global norm is mostly the scalar gate g_rec's gradient: clipping it rescales every other one);
    # gate1: g_rec = 1 at init, the recurrent path open from the start (0: the official identity init)
    't2mlr_full_w32_rms1': [*T2_JACOBI, '--attn_window=32', '--rec_scale_min=1e-3', '--rec_scale_max=1e3'],
    't2mlr_full_w32_lr1e3': [*T2_JACOBI, '--attn_window=32', '--learning_rate=1e-3', '--min_lr=1e-4',
                             '--warmup_iters=75'],
    't2mlr_full_w32_gate1': [*T2_JACOBI, '--attn_window=32', '--rec_gate_init=1.0'],
    't2mlr_full_w32_S32_gate1': [*T2_JACOBI, '--attn_window=32', '--train_mode=interleaved',
                                 '--n_subsets=32', '--rec_gate_init=1.0'],
    't2mlr_full_w32_noclip': [*T2_JACOBI, '--attn_window=32', '--grad_clip=0'],
    't2mlr_full_w32_detach': [*T2_JACOBI, '--attn_window=32', '--rec_residual_detach=True'],
    't2mlr_full_w32_rms1_detach': [*T2_JACOBI, '--attn_window=32', '--rec_scale_min=1e-3',
                                   '--rec_scale_max=1e3', '--rec_residual_detach=True'],
    # the mirror pair: the scheme apart from the architecture. T2MLR trained interleaved with S = T
    # (exact, the gradient through the whole chain, as LRT's S=32); LRT trained with Jacobi D = T, B = 1
    't2mlr_full_w32_S32': [*T2_JACOBI, '--attn_window=32', '--train_mode=interleaved', '--n_subsets=32'],
    'lrt_w32_D32': ['config/lrt_small.py', '--attn_window=32', '--train_mode=jacobi', '--n_iter=32', '--n_grad=1'],
    't2mlr_w32_D32_rms1': [*T2_JACOBI, '--n_iter=32', '--n_grad=1', '--attn_window=32',
                           '--rec_scale_min=1e-3', '--rec_scale_max=1e3'],
    't2mlr_w32_D32_B4': [*T2_JACOBI, '--n_iter=32', '--n_grad=4', '--attn_window=32'],
    't2mlr_w32_D32_lr1e3': [*T2_JACOBI, '--n_iter=32', '--n_grad=1', '--attn_window=32',
                            '--learning_rate=1e-3', '--min_lr=1e-4', '--warmup_iters=75'],
    # the LSTM baseline (support/lstm.py): 4 layers, hidden 81, the parameters of the 4-layer d=64 GPT;
    # no attention, so no _w32 variant
    'lstm': ['config/s3_lstm.py'],
    # its learning rate (the config's is 1e-2; the official recipe's LSTM trains at 10x its transformer's)
    'lstm_lr2e3': ['config/s3_lstm.py', '--learning_rate=2e-3', '--min_lr=2e-4'],
    'lstm_lr5e3': ['config/s3_lstm.py', '--learning_rate=5e-3', '--min_lr=5e-4'],
    'lstm_lr1e2': ['config/s3_lstm.py', '--learning_rate=1e-2', '--min_lr=1e-3'],
    # the lookup control (prepare.py assoc): its dictionary opens the row, so the S_3 recipes without the window
    's3_t2mlr_w0': ['config/s3_t2mlr.py', '--attn_window=0'],
    # what decides the lookup (docs/ablations.md): config/assoc_plain.py's learning rate, and NoPE
    'assoc_plain': ['config/assoc_plain.py'],
    'assoc_plain_lr2e3': ['config/assoc_plain.py', '--learning_rate=2e-3', '--min_lr=2e-4'],
    'assoc_plain_lr5e4': ['config/assoc_plain.py', '--learning_rate=5e-4', '--min_lr=5e-5'],
    'assoc_plain_nope': ['config/assoc_plain.py', '--rope=False'],
    'lrt_S32': ['config/lrt_small.py', '--attn_window=0'],
    # language modelling on prepare.py stdlib_char: the same backbone, three models (docs/text.md)
    'stdlib_plain': ['config/stdlib_plain.py'],
    'stdlib_t2mlr': ['config/stdlib_t2mlr.py'],
    'stdlib_lrt': ['config/stdlib_lrt.py'],
}
# the papers' ablations in miniature (docs/ablations.md): stdlib_char at 6 layers, so that "middle"
# and "mid-upper" mean something, context 128 and 500 steps, so that a run is minutes of one core
AB6 = ['config/stdlib_plain.py', '--n_layer=6', '--block_size=128', '--max_iters=500', '--warmup_iters=50',
       '--eval_interval=250']
T2_AB6 = [*AB6, '--recurrence=t2mlr', '--train_mode=jacobi', '--n_iter=4', '--n_grad=2']  # stdlib_t2mlr.py's scheme
LRT_AB6 = [*AB6, '--recurrence=lrt', '--rec_start=0', '--train_mode=interleaved', '--n_subsets=2']  # stdlib_lrt.py's
MODELS.update({
    'ab6_plain': AB6,
    'ab6_t2mlr_mid': [*T2_AB6, '--rec_start=2', '--rec_end=3'],   # blocks 2..3 of 0..5: a third, the middle
    'ab6_t2mlr_full': [*T2_AB6, '--rec_start=0', '--rec_end=5'],  # every block
    'ab6_t2mlr_one': [*T2_AB6, '--rec_start=2', '--rec_end=2'],   # one middle block
    'ab6_lrt': [*LRT_AB6, '--rec_end=3'],                         # source: block 3 of 0..5 (mid-upper, the paper's 12 of 20)
    'ab6_lrt_last': [*LRT_AB6, '--rec_end=5'],                    # source: the last block
    'ab6_lrt_low': [*LRT_AB6, '--rec_end=1'],                     # source: block 1
    'ab6_lrt_kv': [*LRT_AB6, '--rec_end=3', '--lrt_inject=kv'],   # injection: keys/values only
    'ab6_lrt_res': [*LRT_AB6, '--rec_end=3', '--lrt_inject=residual'],  # injection: residual only
    'ab6_lrt_block': [*LRT_AB6, '--rec_end=3', '--train_mode=block', '--block_len=16'],  # block training, 8 chunks
    'ab6_lrt_exact': [*LRT_AB6, '--rec_end=3', '--train_mode=block', '--block_len=1'],   # C = 1: exact training
    # the control: LRT's modules with the memory always zero (one chunk of the whole row): its KV
    # gates are gated attention and its alpha_i layer scaling, the paper's generic additions;
    # judged by its zero-state bits (its exact column reads a memory it never trained on)
    'ab6_lrt_nomem': [*LRT_AB6, '--rec_end=3', '--train_mode=block', '--block_len=128'],
})
here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo root: train.py and config/, from any cwd
rd = results_dir or out_dir
for _k, _d in (('out_dir', out_dir), ('results_dir', rd)):  # not after hours of training
    check_out_folder(_k, _d)
names = models.split(',')
try:
    seed_list = [int(s) for s in seeds.split(',')]
except ValueError:
    fail(f"seeds={seeds!r}: expected a comma list of integers, e.g. 1,2,3")
for n in names:
    if n.split('@')[0] not in MODELS or ('@' in n and n.split('@')[1] not in MODELS):
        fail(f"unknown model {n!r}; expected some of {', '.join(MODELS)} (or A@B: A at B's training compute)")
meta = json.load(open(os.path.join(data_root, dataset, 'meta.json'))) if os.path.isfile(
    os.path.join(data_root, dataset, 'meta.json')) else fail(f"no dataset {data_root}/{dataset}: run prepare.py first")
# train.py reads data/<dataset> or a path: this dataset of data_root
train_dataset = dataset if os.path.normpath(data_root) == 'data' else os.path.abspath(os.path.join(data_root, dataset))
escape_at = escape_loss or {'s5_Z2': 0.2, 's5_S3': 0.5}.get(dataset, 0.3 * math.log(meta['vocab_size']))
text = meta['format'] == 'tokens'  # language modelling: each config's own max_iters, bits per character
quick_args = ['--device=cpu', '--n_embd=16', '--n_head=2', '--n_kv_head=2', '--batch_size=4', '--eval_iters=1',
              '--eval_examples=16', '--log_interval=1'] if quick else []


def final_eval(run_dir, steps):
    """The last evaluation record of a finished run, or None."""
    path = os.path.join(run_dir, 'log.jsonl')
    if not os.path.isfile(path):
        return None
    evals = [json.loads(l) for l in open(path) if '"type": "eval"' in l]
    return evals[-1] if evals and evals[-1]['iter'] == steps else None


def config_value(name, key, default):
    """A key's value for model name as train.py will see it: its config file's last assignment, or
    the arm's own --key=value after it, else default."""
    for arg in MODELS[name.split('@')[0]]:
        if arg.endswith('.py'):
            default = read_config(os.path.join(here, arg)).get(key, default)
        elif arg.startswith(f'--{key}='):
            default = parse_value(arg.split('=', 1)[1])  # as train.py's configurator reads it
    return default


def research(name):
    """Whether model name runs on the research model (lab/train.py): its config files or flags (or --extra's)
    set one of lab/model_full.py's own options or train_mode='block', or the data has prompt masks."""
    import model as textbook
    from lab.model_full import GPTConfig
    own = set(GPTConfig.__dataclass_fields__) - set(textbook.GPTConfig.__dataclass_fields__)
    keys = set()
    for arg in MODELS[name.split('@')[0]] + extra.split():
        keys |= set(read_config(os.path.join(here, arg))) if arg.endswith('.py') else {arg[2:].split('=')[0]}
    mode = next((a.split('=', 1)[1] for a in reversed(extra.split()) if a.startswith('--train_mode=')), None)
    return bool(keys & own) or (mode or config_value(name, 'train_mode', 'jacobi')) == 'block' or bool(meta.get('rec_mask'))


def steps_of(name):
    """Training steps of model name: max_iters (tasks), its config's (text), or for A@B as many
    steps of A as cost B's training FLOPs."""
    if '@' in name:
        a, b = name.split('@')
        return round(steps_of(b) * flops_of(b) / flops_of(a))
    return config_value(name, 'max_iters', max_iters) if text and 'max_iters' not in given else max_iters


def alive(pid):
    """Whether process pid (a string, from a lock file) is running."""
    try:
        os.kill(int(pid), 0)  # signal 0: nothing is sent, only the process's existence is checked
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # it exists, as another user's
        pass
    return True


def end_with_parent():
    """In the child, before train.py starts (Linux): SIGTERM it when compare.py dies, even by kill -9,
    which runs no cleanup; it then saves at its step boundary and exits."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the except below still ends the child on every exit compare.py survives


def run(name, seed):
    run_dir = os.path.join(out_dir, f'{name}_s{seed}')
    steps = steps_of(name)
    done = final_eval(run_dir, steps)
    if done is not None:
        print(f"{name} seed {seed}: already done, reusing {run_dir}")
        return done, json.load(open(os.path.join(run_dir, 'time.json')))['seconds']
    # a run without its final evaluation was interrupted, and starts over (--overwrite=True below),
    # unless another compare.py is training it right now: restarting that one would destroy it
    lock = os.path.join(run_dir, 'compare.pid')
    owner = open(lock).read() if os.path.exists(lock) else ''
    if owner and alive(owner):
        fail(f"{run_dir} is being trained now by process {owner} (another compare.py with this "
             f"--out_dir?): wait for it, or stop it; delete {lock} if no such process is training it")
    from support.dataset import lock_holder
    holder = lock_holder(run_dir)  # train.py's own lock: a trainer still running there (its compare.py killed?)
    if holder:
        fail(f"{run_dir} is being trained now by process {holder}: wait for it, or stop it")
    for f in ('log.jsonl', 'test_eval.json'):  # the interrupted (or other --max_iters) run's: its test bits are not the new one's
        if os.path.exists(os.path.join(run_dir, f)):
            os.remove(os.path.join(run_dir, f))
    script = os.path.join(here, 'lab', 'train.py') if research(name) else os.path.join(here, 'train.py')
    cmd = [sys.executable, script] + [os.path.join(here, a) if a.endswith('.py') else a for a in MODELS[name.split('@')[0]]]
    every = curve_interval if curve_interval > 0 else config_value(name, 'eval_interval', steps) if text else steps
    cmd += [f'--dataset={train_dataset}', f'--out_dir={run_dir}', f'--seed={seed}',
            f'--max_iters={steps}', f'--eval_interval={every}',  # the schedule: the config's (-1: over max_iters)
            '--eval_examples=1000', '--overwrite=True'] + quick_args + extra.split()
    print(f"{name} seed {seed}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    os.makedirs(run_dir, exist_ok=True)
    open(lock, 'w').write(str(os.getpid()))
    try:
        p = subprocess.Popen(cmd, preexec_fn=end_with_parent)
        try:
            p.wait()
        except BaseException:  # Ctrl-C or SIGTERM: stop the training with us (it saves at its step boundary;
            p.terminate()      # within 2 s a second signal is the same request), never leave it running unowned
            p.wait()
            raise
        if p.returncode != 0:
            fail(f"{name} seed {seed} failed (exit {p.returncode})")
        seconds = time.time() - t0
        json.dump({'seconds': seconds}, open(os.path.join(run_dir, 'time.json'), 'w'))
    finally:  # done (time.json written), failed or interrupted: no longer being trained
        os.remove(lock)
    return final_eval(run_dir, steps), seconds


def curve(name, seed):
    """The run's learning curve: per evaluation, the step, the exact-recurrence val loss and
    the exact EM on every test split; and per logged step, the training loss."""
    recs = [json.loads(l) for l in open(os.path.join(out_dir, f'{name}_s{seed}', 'log.jsonl'))]
    evals = {r['iter']: {k: v for k, v in r.items() if k in ('iter', 'val/loss_exact', 'test/loss_exact') or k.endswith('/em_exact')}
             for r in recs if r.get('type') == 'eval'}  # by step: a later evaluation of a step replaces it
    evals = [evals[i] for i in sorted(evals)]
    ms = sorted(r['dt_ms'] for r in recs if r.get('type') == 'train' and r['iter'] > 0)
    train = [[r['iter'], r.get('loss_mean', r['loss'])] for r in recs if r.get('type') == 'train']  # the interval's mean
    return {'eval': evals, 'train': train,
            'grad': [[r['iter'], r['grad_norm'], r['clip_frac']] for r in recs if r.get('type') == 'train' and 'grad_norm' in r],
            'grad_max': max((r['grad_norm_max'] for r in recs if 'grad_norm_max' in r), default=math.nan),  # pre-clip
            'clamp': [[r['iter'], r['gates/scale_at_min']] for r in recs if r.get('type') == 'gates' and 'gates/scale_at_min' in r],
            'ms_per_step': ms[len(ms) // 2] if ms else None}  # the median of the logged steps


def plot_curves(plt):
    """results_dir/curves.png: training loss and exact val loss (left), exact EM at every test
    length (middle), the gradient norm before clipping (right, where logged), against training
    steps; one color per model, one line per seed."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    styles = ['-', '--', ':', '-.']
    for k, name in enumerate(names):
        for j, r in enumerate(results[name]):
            c, lab = f'C{k}', (name if j == 0 else None)
            tr = r['curve']['train']
            if tr:  # each point: the mean over a log interval (a single step's loss in older logs)
                axes[0].plot([a for a, _ in tr], [b for _, b in tr], color=c, lw=0.8, alpha=0.6, label=lab)
            gr = r['curve'].get('grad', [])
            if gr:
                axes[2].plot([a for a, _, _ in gr], [b for _, b, _ in gr], color=c, lw=0.8, alpha=0.7, label=lab)
            ev = r['curve']['eval']
            axes[0].plot([e['iter'] for e in ev], [e['val/loss_exact'] for e in ev], color=c, marker='o', ms=3, lw=1.5)
            for si, (s, L) in enumerate(zip(splits, lengths)):
                axes[1].plot([e['iter'] for e in ev], [e.get(f'{s}/em_exact', float('nan')) for e in ev], color=c,
                             ls=styles[si % len(styles)], marker='o', ms=3, label=f'{name} @{L}' if j == 0 else None)
    axes[0].set_title('training loss (thin: log-interval means, the scheme\'s approximation) and exact val loss (dots)',
                      fontsize=8)
    axes[1].set_title('exact-recurrence EM on the test splits (line style = length)', fontsize=8)
    axes[0].set_ylabel('loss')
    axes[1].set_ylabel('exact match')
    axes[1].set_ylim(-0.05, 1.05)
    axes[2].set_yscale('log')
    axes[2].set_title('gradient norm before clipping (mean over each log interval)', fontsize=8)
    axes[2].set_ylabel('gradient norm')
    for ax in axes:
        ax.set_xlabel('training step')
        ax.legend(fontsize=6)
    fig.suptitle(dataset, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(rd, 'curves.png'), dpi=120)
    print(f"wrote {os.path.join(rd, 'curves.png')}")


def plot_depth(plt):
    """results_dir/depth.png, when the models include a Jacobi-depth sweep (names ending in _D<n>):
    exact EM at every test length against D (left), and the training cost per step (right):
    the median measured step time and the model's FLOP count, both relative to the smallest D."""
    import re
    sweep = sorted((int(re.search(r'_D(\d+)$', n).group(1)), n) for n in names if re.search(r'_D(\d+)$', n))
    if len(sweep) < 2:
        return
    Ds = [D for D, _ in sweep]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for si, (s, L) in enumerate(zip(splits, lengths)):
        ms = [summary[n][f'em_exact@{L}'] for _, n in sweep]
        axes[0].errorbar(Ds, [m for m, _, _ in ms], yerr=[[m - lo for m, lo, _ in ms], [hi - m for m, _, hi in ms]],
                         marker='o', capsize=3, label=f'EM@{L}')
    axes[0].set_xscale('log', base=2)
    axes[0].set_xticks(Ds, [str(D) for D in Ds])
    axes[0].set_xlabel(f'Jacobi iterations D (train length {lengths[0]})')
    axes[0].set_ylabel('exact match (exact recurrence)')
    axes[0].set_ylim(-0.05, 1.05)
    axes[0].legend(fontsize=7)
    step = [sum(r['curve']['ms_per_step'] for r in results[n]) / len(results[n]) for _, n in sweep]
    flops = [summary[n]['flops_per_token'] for _, n in sweep]
    axes[1].plot(Ds, [t / step[0] for t in step], marker='o', label='measured step time (median)')
    axes[1].plot(Ds, [f / flops[0] for f in flops], marker='s', ls='--', label='FLOPs per step (model count)')
    axes[1].set_xscale('log', base=2)
    axes[1].set_xticks(Ds, [str(D) for D in Ds])
    axes[1].set_xlabel('Jacobi iterations D')
    axes[1].set_ylabel(f'training cost per step, relative to D={Ds[0]}')
    axes[1].legend(fontsize=7)
    fig.suptitle(f'{dataset}: how much Jacobi depth the task needs', fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(rd, 'depth.png'), dpi=120)
    print(f"wrote {os.path.join(rd, 'depth.png')}")


def flops_of(name):
    """The model's FLOPs per trained token under its scheme (support/flops.py), from the first seed's
    checkpoint config and the scheme arguments of its command."""
    from support.checkpoint import CheckpointError, model_config, read_checkpoint
    from support.flops import flops_per_token
    try:
        ck = read_checkpoint(os.path.join(out_dir, f'{name}_s{seed_list[0]}', 'ckpt.pt'))  # weights_only: runs no code
    except CheckpointError as e:
        fail(str(e))
    cfg = ck['config']
    T = cfg['block_size'] if text else lengths[0]  # tokens per training row
    return flops_per_token(model_config(ck['model_args']), T, mode=cfg['train_mode'], n_iter=cfg['n_iter'],
                           n_grad=cfg['n_grad'], n_subsets=cfg['n_subsets'], n_rounds=cfg.get('n_rounds', 1),
                           block_len=cfg.get('block_len', 1))


def fmt(mr, digits=2):
    return f"{mr[0]:.{digits}f} [{mr[1]:.{digits}f}, {mr[2]:.{digits}f}]"


def provenance():
    """The commit the runs' code was at, and the command: for the note under every table."""
    try:
        commit = subprocess.run(['git', '-C', here, 'rev-parse', '--short', 'HEAD'], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ''
    return f"commit {commit or '?'}; `python lab/compare.py {' '.join(sys.argv[1:])}`"


def plot_gates():
    """out_dir/gates.png: the gate statistics over training steps of every run that logged them."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no gate plot (pip install matplotlib)")
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    drawn = False
    for k, name in enumerate(names):
        color = f'C{k}'
        for j, seed in enumerate(seed_list):
            path = os.path.join(out_dir, f'{name}_s{seed}', 'log.jsonl')
            recs = [json.loads(l) for l in open(path)] if os.path.isfile(path) else []
            recs = sorted((r for r in recs if 'gates/state' in r), key=lambda r: r['iter'])
            if not recs:
                continue
            it = [r['iter'] for r in recs]
            lab = (lambda s: f'{name} {s}') if j == 0 else (lambda s: None)
            if 'gates/cur' in recs[0]:  # T2MLR: mean tanh(g) sigmoid(f) of each path
                axes[0].plot(it, [r['gates/rec'] for r in recs], color=color, label=lab('rec'))
                axes[0].plot(it, [r['gates/cur'] for r in recs], color=color, ls='--', label=lab('cur'))
            else:  # LRT: feedback key/value gate and residual injection scale
                if 'gates/g_fb' in recs[0]:
                    axes[1].plot(it, [r['gates/g_fb'] for r in recs], color=color, label=lab('g_fb'))
                if 'gates/gamma' in recs[0]:
                    axes[1].plot(it, [r['gates/gamma'] for r in recs], color=color, ls='--', label=lab('gamma'))
            drawn = True
    if not drawn:
        plt.close(fig)
        print("no run logged gate statistics: no gate plot")
        return
    axes[0].set_title('T2MLR: mean tanh(g) sigmoid(f)  (solid: recurrent path, dashed: current)', fontsize=8)
    axes[1].set_title('LRT: mean g_fb (solid), mean gamma (dashed), over reading layers', fontsize=8)
    for ax in axes:
        ax.axhline(0, color='gray', lw=0.5)
        ax.set_xlabel('training step')
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, 'no run of this style', ha='center', va='center', transform=ax.transAxes, color='gray')
    fig.tight_layout()
    fig.savefig(os.path.join(rd, 'gates.png'), dpi=120)
    print(f"wrote {os.path.join(rd, 'gates.png')}")


def reliance_table():
    """Exact vs zero-state loss, accuracy and EM on the test split at the training length, from
    the runs' checkpoints. -> (markdown table, {name: [per-seed dicts]})."""
    from support.checkpoint import CheckpointError, load_checkpoint
    from support.dataset import load_meta, load_rec_mask, load_split
    from support.diagnostics import task_accuracy
    data_dir = os.path.join(data_root, dataset)
    meta = load_meta(data_dir)
    split = min((s for s in meta['splits'] if s.startswith('test')), key=lambda s: meta['splits'][s]['len'])
    X, Y = load_split(data_dir, split, meta)
    X, Y, M = X[:1000], Y[:1000], load_rec_mask(data_dir, split, meta)
    M = None if M is None else M[:1000]
    runs = {}
    for name in names:
        for seed in seed_list:
            path = os.path.join(out_dir, f'{name}_s{seed}', 'ckpt.pt')
            try:
                model, _ = load_checkpoint(path)
            except CheckpointError as e:
                print(f"{name} seed {seed}: skipped ({e})")
                continue
            model.eval()
            row = {'seed': seed}
            for mode in ('exact', 'zero'):
                r = task_accuracy(model, X, Y, M, mode=mode, batch_size=250)
                row.update({f'loss_{mode}': r['loss'], f'acc_{mode}': r['acc'], f'em_{mode}': r['em']})
            print(f"{name} seed {seed}: {row}", flush=True)
            runs.setdefault(name, []).append(row)
    L = meta['splits'][split]['len']
    head = ['model', f'loss@{L} exact', f'loss@{L} zero state', 'reliance (loss gap)', f'acc@{L} exact',
            f'acc@{L} zero state', f'EM@{L} exact', f'EM@{L} zero state']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name, rows in runs.items():
        mr = lambda f: fmt(med_range([f(r) for r in rows]))
        cells = [name, mr(lambda r: r['loss_exact']), mr(lambda r: r['loss_zero']),
                 mr(lambda r: r['loss_zero'] - r['loss_exact']), mr(lambda r: r['acc_exact']), mr(lambda r: r['acc_zero']),
                 mr(lambda r: r['em_exact']), mr(lambda r: r['em_zero'])]
        lines.append('| ' + ' | '.join(cells) + ' |')
    note = (f"\n\n{dataset} split {split} ({len(X)} rows x {L} tokens), seeds {seeds}: median [min, max] over "
            f"seeds; 'zero state' = the exact forward with every position reading an all-zero state "
            f"(model.py mode='zero'); reliance = loss(zero state) - loss(exact). {provenance()}.\n")
    return '\n'.join(lines) + note, runs


def text_report(results):
    """Language modelling: per model, the held-out test files read whole (diagnostics.corpus_loss,
    windows of the training length): bits per character under the exact recurrence, the training
    approximation and the zero state; median [min, max] over seeds; the plain model's seed spread
    (the noise floor); step time and FLOPs. Writes text.md, text.json and text.png (test bits
    per character against training steps and against training FLOPs)."""
    from support.checkpoint import load_checkpoint
    from support.dataset import load_split
    from support.diagnostics import corpus_loss, eval_modes
    test = load_split(os.path.join(data_root, dataset), 'test', meta)
    ln2 = math.log(2)
    for name in names:
        for r in results[name]:
            run_dir = os.path.join(out_dir, f"{name}_s{r['seed']}")
            path = os.path.join(run_dir, 'test_eval.json')
            r['test'] = json.load(open(path)) if os.path.isfile(path) else {}
            if not r['test'] or r['test'].get('windows', 0) != test_windows or r['test'].get('steps') != steps_of(name):
                # once per run (its steps: a rerun with another --max_iters retrained it) and test_windows:
                # the exact recurrence over 0.5M tokens takes minutes
                model, ck = load_checkpoint(os.path.join(run_dir, 'ckpt.pt'))
                cfg, bits = ck['config'], {}
                scheme = {k: cfg.get(k, 1) for k in ('n_iter', 'n_grad', 'n_subsets')}
                scheme.update({k: cfg[k] for k in ('n_rounds', 'block_len') if k in cfg})  # the research model's
                for tag, mode in eval_modes(cfg['train_mode'], model.config.recurrence != 'none'):
                    bits[tag] = corpus_loss(model.eval(), test, cfg['block_size'], mode, max_windows=test_windows,
                                            **scheme)[0] / ln2
                    print(f"{name} seed {r['seed']}: test {bits[tag]:.4f} bits per character ({tag})", flush=True)
                tokens = cfg['batch_size'] * cfg['block_size'] * cfg['gradient_accumulation_steps']
                r['test'] = dict(bits=bits, steps=ck['iter_num'], tokens_per_step=tokens, windows=test_windows)
                json.dump(r['test'], open(path, 'w'))
    rows, plain_spread = [], None
    for name in names:
        rs = results[name]
        bpc = med_range([r['test']['bits']['exact'] for r in rs])
        fl = flops_of(name)
        row = dict(model=name, steps=rs[0]['test']['steps'], bpc_exact=bpc, flops_per_token=fl,
                   train_pflops=fl * rs[0]['test']['steps'] * rs[0]['test']['tokens_per_step'] / 1e15,
                   ms_per_step=med_range([r['curve']['ms_per_step'] or math.nan for r in rs]))  # nan: none logged
        if 'zero' in rs[0]['test']['bits']:
            row['bpc_approx'] = med_range([r['test']['bits']['approx'] for r in rs])
            row['reliance'] = med_range([r['test']['bits']['zero'] - r['test']['bits']['exact'] for r in rs])
        elif plain_spread is None:
            plain_spread = bpc[2] - bpc[1]
        rows.append(row)
    base = rows[0]['flops_per_token']
    head = ['model', 'steps', 'test bits/char (exact)', 'training approx', 'reliance (zero - exact)', 'ms/step',
            'FLOPs/token (x first)', 'training PFLOP']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in rows:
        lines.append('| ' + ' | '.join([r['model'], str(r['steps']), fmt(r['bpc_exact'], 3),
                                        fmt(r['bpc_approx'], 3) if 'bpc_approx' in r else '-',
                                        fmt(r['reliance'], 3) if 'reliance' in r else '-', f"{r['ms_per_step'][0]:.0f}",
                                        f"{r['flops_per_token'] / base:.2f}", f"{r['train_pflops']:.3f}"]) + ' |')
    read = (f"the first {test_windows:,} windows of the training length of the held-out test files" if test_windows
            else f"the {len(test):,} tokens of the held-out test files read whole in windows of the training length")
    note = (f"\n\n{dataset}: {read}; seeds {seeds}: median [min, max]. The plain model's seed spread (the noise floor): "
            f"{plain_spread if plain_spread is not None else float('nan'):.3f} bits. A@B: A trained for B's FLOPs. "
            f"ms/step: the median logged step (evaluation excluded), on a shared 2-core machine. {provenance()}.\n")
    os.makedirs(rd, exist_ok=True)
    open(os.path.join(rd, 'text.md'), 'w').write('\n'.join(lines) + note)
    json.dump({'dataset': dataset, 'seeds': seed_list, 'rows': rows, 'runs': results, 'noise_floor': plain_spread},
              open(os.path.join(rd, 'text.json'), 'w'), indent=1)
    print('\n'.join(lines) + note)
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for k, name in enumerate(names):
        for j, r in enumerate(results[name]):
            ev = [e for e in r['curve']['eval'] if 'test/loss_exact' in e]
            steps = [e['iter'] for e in ev]
            bpc = [e['test/loss_exact'] / ln2 for e in ev]
            per_step = flops_of(name) * r['test']['tokens_per_step'] / 1e15
            axes[0].plot(steps, bpc, color=f'C{k}', marker='.', label=name if j == 0 else None)
            axes[1].plot([s * per_step for s in steps], bpc, color=f'C{k}', marker='.', label=name if j == 0 else None)
    axes[0].set_xlabel('training step')
    axes[1].set_xlabel('training compute (PFLOP, support/flops.py)')
    axes[0].set_ylabel('test bits per character (exact recurrence)')
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(f"{dataset}: one line per seed (at each evaluation: the test loss on eval_exact_iters random batches)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(rd, 'text.png'), dpi=120)
    print(f"wrote {os.path.join(rd, 'text.png')}")


if reliance:
    table, runs = reliance_table()
    os.makedirs(rd, exist_ok=True)
    open(os.path.join(rd, 'reliance.md'), 'w').write(table)
    json.dump(runs, open(os.path.join(rd, 'reliance.json'), 'w'), indent=1)
    print(table)
    plot_gates()
    sys.exit(0)

results = {n: [] for n in names}
for name in names:
    for seed in seed_list:
        ev, seconds = run(name, seed)
        c = curve(name, seed)
        results[name].append({'seed': seed, 'seconds': seconds, 'eval': ev, 'curve': c, **endpoints(c['train'], steps_of(name), escape_at, spike)})

if text:
    text_report(results)
    sys.exit(0)

# the test splits, in order of length (the train-length one is 'test')
splits = sorted((s for s in meta['splits'] if s.startswith('test')), key=lambda s: meta['splits'][s]['len'])
lengths = [meta['splits'][s]['len'] for s in splits]
summary = {}
for name in names:
    rows = results[name]
    summary[name] = {'seconds': med_range([r['seconds'] for r in rows]), 'flops_per_token': flops_of(name)}
    for s, L in zip(splits, lengths):
        for key in ('em_exact', 'acc_exact', 'em_approx', 'acc_approx'):
            summary[name][f'{key}@{L}'] = med_range([r['eval'][f'{s}/{key}'] for r in rows])
        summary[name][f'solved@{L}'] = sum(r['eval'][f'{s}/em_exact'] >= target for r in rows)
    summary[name]['escape'] = med_range([r['escape'] for r in rows])
    summary[name]['escaped'] = sum(r['escape'] <= max_iters for r in rows)
    summary[name]['spikes'] = med_range([r['spikes'] for r in rows])
    summary[name]['collapsed'] = sum(r['collapses'] > 0 for r in rows)  # runs thrown back onto the plateau
    summary[name]['val_loss'] = med_range([r['eval']['val/loss_exact'] for r in rows])
    summary[name]['grad_max'] = med_range([r['curve']['grad_max'] for r in rows])  # the exploding chain (recipe.md)
    if name != names[0]:  # against the first model (the baseline arm), on the continuous endpoints
        base = results[names[0]]
        summary[name]['p_escape'] = rank_test([r['escape'] for r in rows], [r['escape'] for r in base])
        summary[name]['p_val_loss'] = rank_test([r['eval']['val/loss_exact'] for r in rows],
                                                [r['eval']['val/loss_exact'] for r in base])
        summary[name]['p_grad_max'] = rank_test([r['curve']['grad_max'] for r in rows], [r['curve']['grad_max'] for r in base])

# markdown table: exact-recurrence exact match at each length, then the approximation gap
head = (['model'] + [f'EM@{L} (exact)' for L in lengths] + [f'acc@{lengths[-1]} (exact)', f'EM@{lengths[0]} (train approx)']
        + [f'seeds EM@{lengths[-1]} >= {target:g}', f'escape step (loss < {escape_at:g})', 'spikes', 'runs thrown back', 'val loss (exact)',
           'largest grad norm', f'p vs {names[0]} (escape, val loss, grad norm)', 'time/run (s)'])
lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
for name in names:
    s = summary[name]
    cells = [name] + [fmt(s[f'em_exact@{L}']) for L in lengths] + [fmt(s[f'acc_exact@{lengths[-1]}']),
             fmt(s[f'em_approx@{lengths[0]}']), f"{s[f'solved@{lengths[-1]}']}/{len(seed_list)}",
             f"{fmt(s['escape'], 0)} ({s['escaped']}/{len(seed_list)} left)", fmt(s['spikes'], 0),
             f"{s['collapsed']}/{len(seed_list)}", fmt(s['val_loss'], 3),
             '{:.0e} [{:.0e}, {:.0e}]'.format(*s['grad_max']),
             f"{s['p_escape']:.3f}, {s['p_val_loss']:.3f}, {s['p_grad_max']:.3f}" if 'p_escape' in s else '-', f"{s['seconds'][0]:.0f}"]
    lines.append('| ' + ' | '.join(cells) + ' |')
table = '\n'.join(lines)
note = (f"\n\n{dataset}, trained on length {lengths[0]} rows (every prefix is a training instance), "
        f"{max_iters} iterations, seeds {seeds}: median [min, max] over seeds; {os.cpu_count()} CPU cores. "
        f"EM = whole-sequence exact match; 'exact' = the exact sequential recurrence; "
        f"'train approx' = the training scheme's parallel approximation on the same weights. Escape step: the first "
        f"logged step whose mean train loss over the log interval is below {escape_at:g} (never: {max_iters + 1}); "
        f"spikes: episodes of that mean more than {spike:g} nats above its running minimum after the escape; "
        f"thrown back: runs whose mean went back to {escape_at:g} or above after the escape; "
        f"largest grad norm: the largest gradient norm before clipping of any step of the run; "
        f"p: two-sided exact Mann-Whitney U test against {names[0]}. {provenance()}.\n")
os.makedirs(rd, exist_ok=True)
open(os.path.join(rd, 'results.md'), 'w').write(table + note)
json.dump({'dataset': dataset, 'max_iters': max_iters, 'seeds': seed_list, 'lengths': lengths, 'splits': splits,
           'summary': summary, 'runs': results}, open(os.path.join(rd, 'results.json'), 'w'), indent=1)
print(table + note)

try:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib is not installed: no plot (pip install matplotlib)")
else:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name in names:
        ms = [summary[name][f'em_exact@{L}'] for L in lengths]
        ax.errorbar(lengths, [m for m, _, _ in ms], yerr=[[m - lo for m, lo, _ in ms], [hi - m for m, _, hi in ms]],
                    marker='o', capsize=3, label=name,
                    ls='--' if '_w' in name else '-')  # dashed: with an attention window
    ax.axvline(lengths[0], color='gray', lw=0.5, ls='--')
    ax.set_xlabel('sequence length (train: up to %d)' % lengths[0])
    ax.set_ylabel('exact match (exact recurrence)')
    ax.set_title(dataset)
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=7, loc='lower left')
    fig.tight_layout()
    fig.savefig(os.path.join(rd, 'accuracy.png'), dpi=120)
    print(f"wrote {os.path.join(rd, 'accuracy.png')}")
    plot_gates()
    if curve_interval > 0:
        plot_curves(plt)
    plot_depth(plt)

"""
train.py's housekeeping, so that its loop reads top to bottom: the start-up checks, the model
args from the config, the resume notes, the evaluation's printout, the stop requests (signals),
the divergence guard, the per-interval step statistics, and the DDP shutdown.
"""

import math
import os
import signal
import sys
import time
from dataclasses import asdict, fields
from types import SimpleNamespace

import numpy as np
import torch

from configurator import fail
from support.checks import check_scheme
from support.dataset import load_rec_mask, load_split

# -----------------------------------------------------------------------------
# start-up checks: each bad setting ends the run with one line (exit 2) before any work


# the scheme settings one train_mode reads, and train.py's defaults (which every mode accepts): a
# value set for another scheme is refused, not ignored; under train_mode='plain' (no scheme: the
# baseline run of a recurrent config), and n_subsets under any mode, it is a note
IDLE_SCHEME = dict(n_subsets=(2, 'interleaved'), n_rounds=(1, 'interleaved'), block_len=(4, 'block'))


def the_model():
    """The module of the model train.py trains: model.py, or lab/model_full.py under lab/train.py (which
    runs train.py with it as the module `model`), looked up when called."""
    import model
    return model


def the_config_class():
    return the_model().GPTConfig


def check_config(c):
    """The training settings alone (c: the config, attributes), before any data is read or model
    built. The model's own settings are checked by GPTConfig; the checks that need the data follow
    its loading (check_data). The research model's options (lab/train.py: arch, n_rounds, block_len,
    recompute, rec_lr_mult) are checked where the config has them."""
    lab = hasattr(c, 'block_len')  # the research model's settings (lab/train.py)
    if c.train_mode not in ('plain', 'jacobi', 'interleaved', 'block'):
        fail(f"unknown train_mode {c.train_mode!r}; expected 'plain', 'jacobi' or 'interleaved'" + (" or 'block'" if lab else ''))
    if c.train_mode == 'block' and not lab:
        fail("train_mode='block' (LRT's block training) is the research model's: python lab/train.py ...")
    arch = getattr(c, 'arch', 'gpt')
    if arch not in ('gpt', 'lstm'):
        fail(f"unknown arch {c.arch!r}; expected 'gpt' or 'lstm'")
    if arch == 'lstm' and (c.recurrence != 'none' or c.init_from not in ('scratch', 'resume')):
        fail("arch='lstm' (the LSTM baseline) has no latent recurrence and no pretrained weights: "
             "set recurrence='none' train_mode='plain', init_from 'scratch' or 'resume'")
    if c.recurrence == 'none' and c.train_mode != 'plain':
        fail(f"train_mode={c.train_mode!r} needs a recurrence; use train_mode='plain' for recurrence='none'")
    if c.dtype not in ('float32', 'bfloat16', 'float16', 'float64'):
        fail(f"unknown dtype {c.dtype!r}")
    try:
        check_scheme(c.train_mode, c.n_iter, c.n_grad, c.n_subsets, getattr(c, 'n_rounds', 1), block_len=getattr(c, 'block_len', 1))
    except ValueError as e:
        fail(str(e))
    for k in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval', 'log_interval',
              'eval_iters', 'eval_examples'):
        if getattr(c, k) < 1:
            fail(f"{k}={getattr(c, k)}: must be >= 1")
    for k in ('learning_rate', 'min_lr', 'max_iters', 'warmup_iters', 'grad_clip', 'weight_decay', 'gate_lr_mult'):
        if not 0 <= getattr(c, k) < math.inf:  # nan and inf pass a `< 0` check, then "diverge" at step 1
            fail(f"{k}={getattr(c, k)}: must be >= 0 and finite")
    for k, (default, mode) in IDLE_SCHEME.items():  # a scheme setting another train_mode reads would do nothing
        if getattr(c, k, default) == default or c.train_mode == mode:
            continue
        if c.train_mode != 'plain' and k != 'n_subsets':
            fail(f"{k}={getattr(c, k)} applies to train_mode='{mode}' only (train_mode is {c.train_mode!r})")
        # a note under plain (a recurrent config's baseline run), and for n_subsets (an interleaved
        # config's S in a Jacobi run: tests/test_reliability.py trains one)
        if int(os.environ.get('RANK', 0)) == 0:
            print(f"note: {k}={getattr(c, k)} does nothing with train_mode={c.train_mode!r} (it applies to "
                  f"train_mode='{mode}' only)")
    if getattr(c, 'recompute', False) and c.train_mode == 'block':  # block training keeps no pass to recompute
        fail("recompute=True does nothing with train_mode='block' (it recomputes the Jacobi and interleaved passes)")
    if not 0 <= getattr(c, 'rec_lr_mult', 1.0) < math.inf:  # a negative multiplier is gradient ascent on the recurrence
        fail(f"rec_lr_mult={c.rec_lr_mult}: must be >= 0 and finite (0 freezes the recurrence's own parameters)")
    if c.device.startswith('cuda') and not torch.cuda.is_available():
        fail(f"device={c.device} but torch.cuda.is_available() is False (use --device=cpu)")
    from support.dataset import missing_folder
    if c.init_from not in ('scratch', 'resume') and missing_folder(c.init_from):  # not a Hub download that fails
        fail(f"init_from={c.init_from}: no such folder (a local path; a Hugging Face name is owner/name)")
    if c.init_from not in ('scratch', 'resume') and not lab:  # from_pretrained's model: the HF config's widths, RoPE base
        fail(f"init_from={c.init_from}: a retrofit of a pretrained Llama trains the research model: python lab/train.py ...")
    if os.path.exists(c.out_dir) and not os.path.isdir(c.out_dir):
        fail(f"out_dir={c.out_dir} is a file, not a folder")
    # a new run in the folder of another would replace its ckpt.pt and best.pt at its first save
    old = [f for f in ('ckpt.pt', 'best.pt') if os.path.isfile(os.path.join(c.out_dir, f))]
    if old and c.init_from != 'resume' and not c.overwrite and not c.eval_only:
        fail(f"out_dir={c.out_dir} holds a run ({' and '.join(old)}): continue it with --init_from=resume, "
             f"start a new one in another --out_dir, or replace it with --overwrite=True")
    if c.eval_only and c.init_from == 'scratch':  # a fresh random model's numbers, logged as the run's
        fail("eval_only=True evaluates a trained model: add --init_from=resume (out_dir's ckpt.pt), "
             "or give a pretrained model's name or folder as init_from")
    if getattr(c, 'recompute', False) and c.train_mode == 'plain' and int(os.environ.get('RANK', 0)) == 0:
        print("note: recompute=True does nothing with train_mode='plain' (it recomputes the Jacobi and "
              "interleaved passes in backward)")


def check_data(data_dir, dataset, meta, is_task, seq_len, n_subsets, load_split):
    """Sanity checks that need the data (still before any model is built): every split long
    enough for one batch, every token id inside the vocabulary (one max over each memmap,
    so a corrupt .bin is not an IndexError or a device assert in the middle of a run)."""
    if n_subsets > seq_len:
        fail(f"n_subsets={n_subsets}: interleaved needs 1 <= n_subsets <= the sequence length {seq_len}")
    for split in meta['splits']:
        arrays = load_split(data_dir, split, meta)
        arrays = arrays if is_task else (arrays,)
        if not is_task and len(arrays[0]) < seq_len + 2:
            fail(f"split {split} of {dataset} has {len(arrays[0])} tokens: block_size={seq_len} needs at least "
                 f"{seq_len + 2} (use a smaller block_size or more data)")
        if is_task and len(arrays[0]) == 0:
            fail(f"split {split} of {dataset} has no rows")
        top = max(int(a.max()) for a in arrays)
        if top >= meta['vocab_size']:
            fail(f"split {split} of {dataset} holds token id {top} >= vocab_size {meta['vocab_size']}: "
                 f"the data is corrupt or from another tokenizer (re-run prepare.py)")

# -----------------------------------------------------------------------------
# model args: GPTConfig's fields, taken from train.py's settings of the same name


def model_args_from(config, meta, given=()):
    """The model args of a new model: every GPTConfig field from the config's setting of the same
    name (train.py takes them by name, GPTConfig's default the one default), except: vocab_size and
    reset_token come from the data, and a retrofit's rec_gate_init is 0. block_size is the config's
    (task data: raised to the longest split by train.py)."""
    GPTConfig = the_config_class()
    args = {f.name: config[f.name] for f in fields(GPTConfig) if f.name in config}
    args.update(vocab_size=meta['vocab_size'], reset_token=meta.get('reset_token'))
    if config['init_from'] not in ('scratch', 'resume'):
        args['rec_gate_init'] = 0.0  # a retrofit starts at the identity
        if 'rec_gate_gain' not in given:  # (given: the settings the config set) from_pretrained's, 1e-2
            args.pop('rec_gate_gain', None)
    for k, only in OWN_OPTIONS.items():  # another recurrence's options: recorded as what runs, the default
        default = next((f.default for f in fields(GPTConfig) if f.name == k), None)
        if k not in args or args['recurrence'] == only:
            continue
        if args[k] != default and int(os.environ.get('RANK', 0)) == 0:
            print(f"note: {k}={args[k]!r} applies to recurrence='{only}' only (recurrence is {args['recurrence']!r}): "
                  f"not applied, recorded as {default!r}")
        args[k] = default
    return args


# GPTConfig's options of one recurrence (DESIGN.md 3, 4): the others do not read them
OWN_OPTIONS = {**{k: 't2mlr' for k in ('rec_residual', 'rec_proj', 'rec_gate_gain', 'rec_gate_init', 'rec_residual_detach',
                                       'rec_scale_min', 'rec_scale_max')},
               **{k: 'lrt' for k in ('lrt_inject', 'lrt_shared', 'lrt_identity_init', 'lrt_gate_channels')}}


INIT_ONLY = ('rec_gate_gain', 'rec_gate_init', 'lrt_identity_init')  # model args that only shape the initialisation
# the research model's training options (lab/model_full.py's config fields, settings of lab/train.py): how a
# run trains, not what the model is. The run's settings apply, on resume and retrofit too
TRAINING_OPTIONS = ('n_rounds', 'block_len', 'recompute', 'rec_lr_mult')


def resume_notes(saved, wanted, retrofit):
    """A note for every model arg in which the checkpoint (what runs) differs from the config.
    A retrofit's backbone shape is the pretrained model's: only its recurrence args are noted.
    block_size: token sequences shorter than the model's context are fine (checked later)."""
    try:  # resolve the config's automatic values (mlp_hidden=0, rec_end=-1) as a new model would
        wanted = asdict(the_config_class()(**wanted))
    except (ValueError, TypeError):
        pass
    for k in saved:
        if k in INIT_ONLY or k in TRAINING_OPTIONS or k not in wanted or saved[k] == wanted[k]:
            continue
        if retrofit and not (k.startswith(('rec', 'lrt_')) or k == 'dropout'):
            continue
        if k == 'block_size' and wanted[k] <= saved[k]:
            continue
        print(f"note: resuming with the checkpoint's {k}={saved[k]!r} (config says {wanted[k]!r})")

# -----------------------------------------------------------------------------
# evaluation printout and the divergence guard


def print_eval(metrics, iter_num, recurrent, task_splits, train_mode):
    """eval step N: <split> loss <approx> (exact <exact>, gap <approx - exact>, zero-state <zero>,
    reliance <zero - exact>): the reliance gap is how much worse the exact model gets when
    every position reads a zero state (about 0: the state is not used)."""
    parts = []
    for split in [s for s in ('train', 'val', 'test') if f'{s}/loss_approx' in metrics]:
        a, e, z = metrics[f'{split}/loss_approx'], metrics[f'{split}/loss_exact'], metrics[f'{split}/loss_zero']
        parts.append(f"{split} loss {a:.4f} (exact {e:.4f}, gap {a - e:+.4f}"
                     + (f", zero-state {z:.4f}, reliance {z - e:+.4f})" if recurrent else ")"))
        if f'{split}/bpb_exact' in metrics:
            parts.append(f"{split} bpb {metrics[f'{split}/bpb_exact']:.4f}")
    print(f"eval step {iter_num}: " + ", ".join(parts))
    for split in task_splits:
        acc = lambda tag: f"acc {metrics[f'{split}/acc_{tag}']:.4f} em {metrics[f'{split}/em_{tag}']:.4f}"
        kinds = ''.join(f", {k[len(split) + 5:-6]} {v:.4f}" for k, v in metrics.items() if k.startswith(f'{split}/acc_')
                        and k.endswith('_exact') and k != f'{split}/acc_exact')  # s5_retrieval: at states, values
        print(f"  {split}: acc {metrics[f'{split}/acc_exact']:.4f}{kinds} em {metrics[f'{split}/em_exact']:.4f} (exact)"
              f" | {acc('approx')} ({train_mode})" + (f" | {acc('zero')} (zero state)" if recurrent else ""))
    if 'gates/cur' in metrics:
        print(f"  gates: tanh(g)sigmoid(f) cur {metrics['gates/cur']:+.4f} rec {metrics['gates/rec']:+.4f}, "
              f"tanh g_cur {metrics['gates/tanh_g_cur']:+.4f} g_rec {metrics['gates/tanh_g_rec']:+.4f}, "
              f"state norm {metrics['gates/state']:.3f}")
    elif 'gates/state' in metrics:
        names = [n for n in ('g_loc', 'g_fb', 'gamma', 'alpha') if f'gates/{n}' in metrics]
        print("  gates (mean over reading layers): " + ", ".join(f"{n} {metrics[f'gates/{n}']:.4f}" for n in names)
              + f", state norm {metrics['gates/state']:.3f}")


def nonfinite(metrics):
    """The names of the non-finite losses and accuracies of an evaluation (a diverged model).
    The gate statistics are not among them: they describe the model, they do not judge it."""
    return [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v) and not k.startswith('gates/')]


def warn_state(metrics, iter_num, n_embd):
    """A state that grows without bound is worth a line, not a stop: the loss may still be improving."""
    norm = metrics.get('gates/state')
    if norm is not None and norm > 1e4 * math.sqrt(n_embd):  # (a NaN is a diverged loss's business)
        print(f"warning: iteration {iter_num}: the recurrent state is exploding (mean norm {norm:.3g} at "
              f"d={n_embd}); the loss is still finite, so the run goes on", file=sys.stderr)


def stop_diverged(what, iter_num, master, ckpt_path, best_path):
    """A non-finite value: stop at once, one line, exit 3, nothing saved (ckpt.pt and best.pt
    keep the last good weights)."""
    if master:
        print(f"error: iteration {iter_num}: {what}: the run diverged; stopped without saving "
              f"({ckpt_path} and {best_path} hold the last good weights; resume with a lower "
              f"learning_rate or grad_clip > 0)", file=sys.stderr)
    sys.exit(3)

def check_step(lossf, grad_norm, stop_request, fp16, ddp):
    """After backward, before the update: one small collective and one host sync per step, so
    that every process stops at the same step. Over the processes: the loss or the gradient norm
    non-finite anywhere (fp16: the scaler skips a non-finite gradient itself), a stop request
    (SIGINT/SIGTERM) anywhere, the largest gradient norm. -> SimpleNamespace(diverged: '' or what
    went non-finite, stop: bool, grad_norm: the largest, loss: this process's)."""
    import torch.distributed as dist
    flags = torch.stack([~torch.isfinite(lossf), ~torch.isfinite(grad_norm) & (not fp16),
                         torch.tensor(stop_request.signum > 0, device=lossf.device), grad_norm.float()]).float()
    if ddp:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    loss_bad, grad_bad, stop, step_grad, loss = torch.cat([flags, lossf.float().view(1)]).tolist()
    bad = []
    if loss_bad:
        bad.append("non-finite train loss" + ('' if ddp else f" ({lossf.item()})"))
    if grad_bad:
        bad.append(f"non-finite gradient norm ({grad_norm.item()})")
    return SimpleNamespace(diverged=' and '.join(bad), stop=bool(stop), grad_norm=step_grad, loss=loss)

# -----------------------------------------------------------------------------
# stop requests: SIGINT (Ctrl-C) and SIGTERM (what schedulers send before preemption) only set a
# flag: the loop finishes the step it is in and saves at the step boundary, so the checkpoint
# never holds a half-updated model or a data generator one batch ahead (exact resume). A second
# signal more than 2 s later exits at once, without saving (within 2 s it is the same request:
# Ctrl-C under torchrun reaches a worker twice, from the terminal and from torchrun).


class StopRequest:

    def __init__(self):
        self.signum, self.time = 0, 0.0
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)

    def on_signal(self, signum, frame):
        if self.signum and time.monotonic() - self.time > 2:
            raise SystemExit(128 + signum)
        if not self.signum:
            self.signum, self.time = signum, time.monotonic()

# -----------------------------------------------------------------------------
# per-step statistics over a log interval (rank 0's share under DDP): the loss of every step and
# the gradient norm before clipping -> the interval's mean and largest loss, the largest rise of
# the loss from one step to the next, the gradient norm and the fraction of steps clipped


class StepStats:
    """Per log interval: the loss's mean, largest value and largest step-to-step rise, the
    gradient norm before clipping (mean, largest) and the clipped share."""

    def __init__(self, grad_clip):
        self.grad_clip, self.losses, self.grads, self.last = grad_clip, [], [], None

    def add(self, loss, grad_norm):
        self.losses.append(loss)
        self.grads.append(grad_norm)

    def interval(self):
        """The interval's statistics since the last call (then a new interval starts)."""
        losses, grads = self.losses, self.grads
        jumps = [b - a for a, b in zip(([self.last] if self.last is not None else []) + losses[:-1], losses)]
        clip = self.grad_clip
        out = dict(loss_mean=sum(losses) / len(losses), loss_max=max(losses), jump_max=max(jumps, default=0.0),
                   grad_norm=sum(grads) / len(grads), grad_norm_max=max(grads),
                   clip_frac=sum(g > clip for g in grads) / len(grads) if clip > 0 else 0.0)
        self.losses, self.grads, self.last = [], [], losses[-1]
        return out

# -----------------------------------------------------------------------------
# the end of a run


def shutdown(exit_code, ddp):
    """Leave with exit_code. DDP keeps its own reference to the process group, so
    destroy_process_group does not stop gloo's threads; they are torn down by C++ destructors at
    interpreter exit, which now and then aborts the process ("terminate called without an active
    exception"). Everything is saved and flushed by now, so a DDP process leaves without running
    those destructors (os._exit)."""
    if not ddp:
        sys.exit(exit_code)
    if isinstance(exit_code, str):  # a one-line error (dataset.DataError, e.g. a full disk at a save)
        print(exit_code, file=sys.stderr)
        exit_code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)

# -----------------------------------------------------------------------------
# batches: token streams (language modelling) or fixed-length examples with aligned targets (tasks)


class Batches:
    """The batches of one dataset. The order of training batches comes from one generator that
    every process holds in the same state: each step draws the rows (or offsets) of the whole
    global batch, and each process reads and copies to its device only its own share. So N
    processes see exactly what one process sees (same global batch), and the generator's state
    in the checkpoint resumes the data order exactly."""

    def __init__(self, data_dir, meta, block_size, device):
        self.data_dir, self.meta, self.device = data_dir, meta, device
        self.is_task = meta['format'] == 'examples'
        self.train = load_split(data_dir, 'train', meta)  # (X, Y) of task data, else the token memmap
        self.train_mask = load_rec_mask(data_dir, 'train', meta) if self.is_task else None  # prompt/response data
        self.seq_len = self.train[0].shape[1] if self.is_task else block_size

    def split(self, split):
        return self.train if split == 'train' else load_split(self.data_dir, split, self.meta)

    def draw(self, gen, split, B):
        """B random rows (task data) or offsets (token data) of split: the only random draw."""
        if self.is_task:
            rows = torch.randint(len(self.split(split)[0]), (B,), generator=gen).numpy()
            rows.sort()  # memmap-friendly; the set is what matters
            return rows
        return torch.randint(len(self.split(split)) - self.seq_len - 1, (B,), generator=gen).tolist()

    def fetch(self, split, picks):
        """-> x, y: (B, seq_len) int64 on the device, y aligned with x (-1 = no loss), and rec_mask:
        (B, seq_len) bool, where the recurrence is on (prompt/response data), or None."""
        rec_mask, T = None, self.seq_len
        if self.is_task:
            X, Y = self.split(split)
            M = self.train_mask if split == 'train' else load_rec_mask(self.data_dir, split, self.meta)
            x, y = torch.from_numpy(X[picks].astype(np.int64)), torch.from_numpy(Y[picks].astype(np.int64))
            rec_mask = None if M is None else torch.from_numpy(M[picks].astype(np.bool_))
        else:
            data = self.split(split)
            x = torch.from_numpy(np.stack([data[i:i + T].astype(np.int64) for i in picks]))
            y = torch.from_numpy(np.stack([data[i + 1:i + 1 + T].astype(np.int64) for i in picks]))
        if self.device.startswith('cuda'):  # pinned host memory: the copies run asynchronously
            return tuple(None if t is None else t.pin_memory().to(self.device, non_blocking=True) for t in (x, y, rec_mask))
        return x.to(self.device), y.to(self.device), None if rec_mask is None else rec_mask.to(self.device)


# -----------------------------------------------------------------------------
# the model at start-up: new, resumed, or retrofitted from a pretrained checkpoint


def init_model(init_from, model_args, meta, dataset, ckpt_path, master):
    """-> (model, the checkpoint to resume or None, the model args that run, the pretrained model
    a retrofit started from or None). Every mismatch between the data and the model: one line.
    The research model's training options (TRAINING_OPTIONS) are the run's, whatever the start."""
    from support.checkpoint import CheckpointError, build_model, from_pretrained, load_checkpoint
    from support.checks import check_gpt_size
    from support.dataset import check_hub, data_changes, data_fingerprint
    ckpt, pretrained, wanted, mod = None, None, model_args, the_model()
    try:
        if init_from == 'scratch' and model_args.get('arch') == 'lstm':
            model = build_model(model_args)  # the LSTM baseline (lab/train.py --arch=lstm)
        elif init_from == 'scratch':
            config = mod.GPTConfig(**model_args)  # a broken setting: one line
            check_gpt_size(config)  # a model too big for the memory: one line, before it is allocated
            model = mod.GPT(config)
        elif init_from == 'resume':
            model, ckpt = load_checkpoint(ckpt_path)  # (a GPT comes back as the research model, which reads them all)
            shape = lambda a, r: 'an LSTM' if a == 'lstm' else f"a GPT with recurrence={r!r}"
            saved = ckpt['model_args']
            if saved.get('arch') != 'lstm' and type(model) is not mod.GPT:  # train.py on model.py
                model = textbook_model(model, saved, mod, ckpt_path)
            was, want = [(a.get('arch', 'gpt'), a.get('recurrence', 'none')) for a in (saved, wanted)]
            if was != want:  # it would train the checkpoint's model under the config's labels
                fail(f"{ckpt_path} holds {shape(*was)}, the config asks for {shape(*want)}: resume it with its own "
                     f"arch and recurrence, or start a new run (another --out_dir, or --overwrite=True)")
            trained_on, now = ckpt.get('data'), data_fingerprint(meta)
            vocab = lambda fp: {k: fp[k] for k in ('name', 'tokenizer', 'vocab_size', 'vocab_crc')}
            if trained_on and vocab(trained_on) != vocab(now):  # same vocab size or not: another dataset is another run
                fail(f"{ckpt_path} was trained on dataset {trained_on['name']} ({trained_on['tokenizer']}, "
                     f"{trained_on['vocab_size']} tokens), not on {dataset} ({now['name']}, {now['tokenizer']}, "
                     f"{now['vocab_size']} tokens{', another vocabulary' if trained_on['vocab_crc'] != now['vocab_crc'] else ''}): "
                     f"resume it on its own dataset, or start a new run (another --out_dir, or --overwrite=True)")
            changed = data_changes(trained_on['content'], now['content']) if trained_on and 'content' in trained_on else []
            if changed and master:  # (checkpoints before issue 41 have no content to compare)
                print(f"note: dataset {dataset} was regenerated since {ckpt_path} was saved ({'; '.join(changed)}): "
                      f"the run continues on the data as it is now")
            pretrained = ckpt.get('pretrained')
            if master:
                resume_notes(ckpt['model_args'], model_args, pretrained)
            model_args = ckpt['model_args']
        else:  # retrofit a pretrained Llama-family checkpoint
            if not os.path.isdir(os.path.expanduser(init_from)):
                check_hub(f"the model {init_from}")  # a network that never answers: one line, not a hang
            rec = {k: model_args[k] for k in model_args if k.startswith(('rec', 'lrt_')) or k in ('dropout', 'reset_token')}
            rec['lrt_identity_init'] = True  # a retrofit starts at identity: LRT's gamma = 0, W_fb = 0
            model = from_pretrained(init_from, **rec)  # the backbone's shape and vocab come from the checkpoint
            model_args = asdict(model.config)
            pretrained = init_from
            name_of = lambda p: os.path.basename(os.path.normpath(p))  # a Hub name or a folder: compare the last part
            if meta.get('hf_tokenizer') and name_of(meta['hf_tokenizer']) != name_of(init_from):
                print(f"note: {dataset} was tokenized with {meta['hf_tokenizer']}, the model is {init_from}: they must share a tokenizer")
    except (CheckpointError, ValueError, ImportError) as e:
        fail(str(e))
    runs = {k: wanted[k] for k in TRAINING_OPTIONS if k in wanted and hasattr(model.config, k)}
    for k, v in runs.items():
        setattr(model.config, k, v)
    model_args = {**model_args, **runs}
    if meta['vocab_size'] > model.config.vocab_size:
        fail(f"dataset {dataset} has a vocabulary of {meta['vocab_size']} tokens but the model only {model.config.vocab_size} "
             f"embeddings: tokenize the data with the model's own tokenizer (prepare.py --tokenizer=...)")
    return model, ckpt, model_args, pretrained


def textbook_model(loaded, saved, mod, ckpt_path):
    """The resumed run's weights (loaded: the research model load_checkpoint builds) in mod.GPT, the model
    train.py trains (model.py's); a checkpoint of the research model (model args model.py has not: every run
    before issue 64, and lab/train.py's) is one line: it resumes under lab/train.py."""
    other = sorted(set(saved) - set(mod.GPTConfig.__dataclass_fields__))
    if other:
        fail(f"{ckpt_path} holds the research model (model args {', '.join(other[:3])}{', ...' if len(other) > 3 else ''}): "
             f"resume it with python lab/train.py")
    model = mod.GPT(mod.GPTConfig(**saved))
    model = model.double() if next(loaded.parameters()).dtype == torch.float64 else model
    model.load_state_dict(loaded.state_dict())
    return model.to(next(loaded.parameters()).device)


OPTIM_SETTINGS = {'weight_decay': 'weight_decay', 'betas': "AdamW's betas (0.9, 0.95)",
                  'lr_mult': 'rec_lr_mult or gate_lr_mult'}  # a group's setting -> train.py's


def restore_state(ckpt, ckpt_path, optimizer, data_gen, cuda):
    """The optimizer, the data order and the RNGs of a resumed run, as they were at its save; the
    optimizer's settings are the config's (the saved state would bring back the old ones while
    the new checkpoint's config recorded the new): each change is applied, with a note."""
    import random
    wanted = [{k: g[k] for k in OPTIM_SETTINGS} for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(ckpt['optimizer'])
    except KeyError as e:
        fail(f"{ckpt_path}: cannot resume the optimizer state (KeyError: {e})")
    except ValueError as e:  # another number or size of parameter groups
        fail(f"{ckpt_path}: the optimizer settings group the parameters differently from the checkpoint's (a changed "
             f"weight_decay, rec_lr_mult or gate_lr_mult that splits or merges groups: {e}): resume "
             f"with the run's own values, or start a new run")
    notes = set()
    for g, want in zip(optimizer.param_groups, wanted):
        for k, v in want.items():
            old = tuple(g[k]) if isinstance(v, tuple) else g[k]
            if old != v:
                notes.add(f"note: resuming with {OPTIM_SETTINGS[k]}: a parameter group's {k} is now {v} (the checkpoint's {old})")
                g[k] = v
    for n in sorted(notes) if int(os.environ.get('RANK', 0)) == 0 else []:
        print(n)
    try:
        data_gen.set_state(ckpt['data_gen'])
        torch.set_rng_state(ckpt['rng']['torch'])
        np.random.set_state(ckpt['rng']['numpy'])
        random.setstate(ckpt['rng']['python'])
        if cuda and ckpt['rng'].get('cuda') is not None:
            torch.cuda.set_rng_state(ckpt['rng']['cuda'])
    except (KeyError, ValueError, RuntimeError) as e:
        fail(f"{ckpt_path}: cannot resume the optimizer/data state ({type(e).__name__}: {e})")


RUN_FILES = ('ckpt.pt', 'best.pt', 'log.jsonl')  # a run's own files (a new run's records must not follow an old run's)


def set_aside_previous_run(out_dir):
    """overwrite=True, once every check has passed: the old run's files move aside (dataset.move_aside),
    to be deleted at the new run's first checkpoint (drop_aside), or put back if the new run ends
    before it (restore_previous_run). -> where they are, or None."""
    from support.dataset import move_aside
    aside = move_aside(out_dir, RUN_FILES)
    if aside:
        print(f"note: overwrite=True: the previous run's files are in {aside} until this run's first checkpoint")
    return aside


def drop_previous_run(aside):
    """This run's first checkpoint has landed: the old run moved aside goes. -> None"""
    from support.dataset import drop_aside
    if aside:
        gone = [f for f in RUN_FILES if os.path.isfile(os.path.join(aside, f))]
        drop_aside(aside)
        print(f"note: overwrite=True: removed the previous run's {', '.join(gone)} from {os.path.dirname(aside)}")


def restore_previous_run(aside):
    """The new run ended (failed, diverged, stopped) before its first checkpoint: the old one is back."""
    from support.dataset import put_back
    if aside:
        put_back(aside, RUN_FILES)
        print(f"note: no checkpoint of the new run: the previous run is back in {os.path.dirname(aside)}", file=sys.stderr)

# -----------------------------------------------------------------------------
# processes


def init_processes(device, gradient_accumulation_steps, timeout_s=600):
    """DDP when torchrun started this process (RANK set), else one process. -> (ddp, rank,
    local_rank, world_size, device, gradient_accumulation_steps): each process on its own GPU
    (cuda:<local rank>); the steps' micro-batches, the total over processes, raised to a
    multiple of the number of processes. timeout_s: how long a process waits for the others in a
    collective (a frozen rank ends the job); more than the longest evaluation + save, which rank 0
    runs alone."""
    import torch.distributed as dist
    if int(os.environ.get('RANK', -1)) == -1:
        return False, 0, 0, 1, device, gradient_accumulation_steps
    from datetime import timedelta
    use_cuda = device.startswith('cuda')
    dist.init_process_group(backend='nccl' if use_cuda else 'gloo', timeout=timedelta(seconds=timeout_s))
    rank, local_rank, world_size = dist.get_rank(), int(os.environ['LOCAL_RANK']), dist.get_world_size()
    if use_cuda:
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
    if gradient_accumulation_steps % world_size:  # e.g. the docstring's torchrun command with a 1-step config
        scaled = -(-gradient_accumulation_steps // world_size) * world_size
        if rank == 0:
            print(f"note: gradient_accumulation_steps={gradient_accumulation_steps} raised to {scaled}, "
                  f"a multiple of the {world_size} processes (a larger batch per step)")
        gradient_accumulation_steps = scaled
    return True, rank, local_rank, world_size, device, gradient_accumulation_steps


def make_out_dir(out_dir, ckpt_path, best_path):
    """The run's folder (rank 0), locked for this process (one run per folder: another writer is
    refused, naming its PID), and the temp files of saves killed mid-write (kill -9, OOM) gone."""
    from support.checkpoint import remove_stale_tmp
    from support.dataset import lock_folder, stale_asides
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:  # a path through a file, no permission
        fail(f"out_dir={out_dir}: cannot create the folder ({e.strerror})")
    if not os.access(out_dir, os.W_OK):  # at start, not at the first save minutes in
        fail(f"cannot write out_dir={out_dir} (read-only or not ours)")
    lock_folder(out_dir, 'a train.py run')
    for old in stale_asides(out_dir):
        print(f"note: {old} holds the files of a run that a killed --overwrite=True run had moved aside: "
              f"move them back to keep that run, or delete it", file=sys.stderr)
    for p in (ckpt_path, best_path):
        for f in remove_stale_tmp(p):
            print(f"note: removed {f}, left by an interrupted save")

"""
Train the plain GPT, T2MLR or LRT, with the parallel training scheme of your choice (or the
LSTM baseline, lstm.py: arch='lstm').

One process:
$ python train.py config/t2mlr_small.py
DDP (gloo on CPU, NCCL on GPUs):
$ torchrun --standalone --nproc_per_node=2 train.py config/t2mlr_small.py
(gradient_accumulation_steps is the total over processes: one that is not a multiple of
the number of processes is raised to the next multiple, with a note.)

Reliability (README, "Reliability"): out_dir/ckpt.pt is the latest checkpoint, out_dir/best.pt
the one with the best exact validation loss so far. A non-finite training loss, gradient
norm or evaluation loss stops the run at once (exit 3) without saving. SIGINT (Ctrl-C) and
SIGTERM finish the current step, save ckpt.pt at the step boundary and exit (130, 143):
--init_from=resume continues bit-identically to an uninterrupted run, on the run's own dataset
only. A new run refuses an out_dir that holds one (ckpt.pt or best.pt): --overwrite=True replaces it.

train_mode picks how the recurrence is made parallel for training (model.py):
  'plain'        no recurrence (the baseline; or a recurrent model's backbone alone)
  'jacobi'       T2MLR's Jacobi iterations as the official code runs them: D = n_iter, B = n_grad
  'interleaved'  LRT's strided subsets: n_subsets refinements on a shared key/value buffer,
                 n_rounds times over (1: the paper; more: deeper chains, DESIGN.md 7)
  'block'        LRT's block-training baseline: chunks of block_len tokens in order, the state
                 crossing chunk boundaries only (1: the exact recurrence, DESIGN.md 7)
Evaluation always reports the loss under the training approximation AND under the
exact sequential recurrence (what generation computes); their gap is the
approximation error. Judge recurrent models by the exact numbers. It also reports the
exact loss (and task accuracy) with the state forced to zero at every position
(model.py's mode='zero'): the reliance gap zero - exact says how much the model uses
its state. The gate statistics (gates/... in log.jsonl) show what the gates do.

Retrofit (README, "Retrofit a pretrained model"): init_from=<Hugging Face Llama name or folder> starts from a
pretrained model with the recurrence at identity. Prompt/response data (prepare.py jsonl,
gsm8k) carries a per-position recurrence mask: the prompt runs as the plain model, the
response carries the state, in training and in both evaluations, as in generation.
"""

import importlib.util
import json
import math
import os
import random
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoint import CheckpointError, build_model, from_pretrained, load_checkpoint, remove_stale_tmp, save_checkpoint
from configurator import autocast as precision, compile_errors, configure, fail
from dataset import check_hub, data_fingerprint, load_meta, load_rec_mask, load_split, missing_folder
from diagnostics import gate_stats, task_accuracy
from flops import flops_per_token
from engine import Engine
from model import GPT, GPTConfig, check_scheme
from tasks import position_kinds

# -----------------------------------------------------------------------------
# default config values; override with a config file and/or --key=value
# I/O
out_dir = 'out'
eval_interval = 250
log_interval = 10
eval_iters = 20          # batches for the approximate (training-scheme) losses
eval_exact_iters = 4     # batches for the exact losses (token-by-token: slower)
eval_examples = 1000     # task data: rows per split for accuracy / exact match
eval_examples_mid = 0    # the same at the evaluations before the last (0: eval_examples): cheaper learning curves
eval_batch_size = 256    # task data: rows per forward pass in that accuracy evaluation
eval_only = False
eval_first = True        # also evaluate before the first step
gate_interval = 0        # log the gate statistics (one exact pass of gate_rows val rows) every so many steps;
                         # 0: with every log line (log_interval), -1: only at evaluations
gate_rows = 8            # val rows of that pass (cheap enough to leave on)
always_save_checkpoint = True
init_from = 'scratch'    # 'scratch' | 'resume' (out_dir/ckpt.pt) | a Hugging Face Llama name or folder (retrofit)
overwrite = False        # True: a new run may replace the run in out_dir (its ckpt.pt, best.pt, log.jsonl); else refused
seed = 1337
wandb_log = False
wandb_project = 't2t-recurrence'
wandb_run_name = 'run'
# data (made by prepare.py)
data_root = 'data'
dataset = 's5_Z2'
batch_size = 32          # micro-batch size per process
block_size = 64          # tokens per sequence (token data); model context (task data: >= longest split)
gradient_accumulation_steps = 1  # in total across processes
# model
arch = 'gpt'             # 'gpt' | 'lstm' (the baseline, lstm.py: n_layer layers of hidden size n_embd; recurrence='none')
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
mlp_hidden = 0           # 0 = 8/3 n_embd rounded up to 64
rope_theta = 10000.0
rope = True              # False: no positional encoding (NoPE; the causal mask alone tells positions apart)
norm_eps = 1e-5
dropout = 0.0
tie_embeddings = True
vocab_pad = 128          # the embedding table rounded up to a multiple of this (fast LM-head GEMMs; never sampled)
attn_window = 0          # > 0: sliding-window attention over the last attn_window tokens
recurrence = 't2mlr'     # 'none' | 't2mlr' | 'lrt'
rec_start = 0
rec_end = -1             # -1 = last layer
rec_residual = True
rec_proj = True
rec_gate_gain = 0.0       # xavier gain of T2MLR's gates; 0 = auto: 1.0 from scratch (paper), 1e-2 retrofit
lrt_inject = 'both'
lrt_shared = True
lrt_identity_init = False
lrt_gate_channels = 0    # LRT gates read the first N channels of the normed input (official option); 0 = all
# training scheme
train_mode = 'jacobi'    # 'plain' | 'jacobi' | 'interleaved' | 'block'
n_iter = 8               # Jacobi: D iterations as in the official code (D+1 span passes: initial, D-1, final)
n_grad = 4               # Jacobi: B, the last iterations that carry gradient (plus the final pass)
jacobi_init = 'plain'    # Jacobi: the initial pass runs the plain model (official) or reads the 'zero' state
rec_residual_detach = False  # T2MLR: no gradient through R_{t-1} in m_t = h_t + R_{t-1} (official S5/GSM8K recipes)
rec_scale_min = 0.2      # T2MLR: the bounds of the state's RMS scale clamp(1/rms(m_t), min, max)
rec_scale_max = 5.0
n_subsets = 2            # interleaved: S
n_rounds = 1             # interleaved: R rounds of the S refinements (exact positions 0..R*S-1 in training)
block_len = 4            # block: C, the chunk length (the state reaches a chunk from the one before only)
recompute = False        # activation checkpointing: the passes that keep a graph are recomputed in backward
# optimizer
learning_rate = 1e-3
max_iters = 2000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0          # 0 = off
rec_lr_mult = 1.0        # lr multiplier of the recurrence's own parameters (retrofit: 100)
rec_weight_decay = -1.0  # weight decay of the recurrence's own matrices; -1 = weight_decay (official S5 recipe: 0.01)
decay_lr = True
warmup_iters = 100
lr_decay_iters = -1      # -1 = max_iters
min_lr = 1e-4
# system
device = 'cuda' if torch.cuda.is_available() else 'cpu'
dtype = 'auto'           # 'auto' (bfloat16 on cuda, float32 on cpu) | 'float32' | 'bfloat16' | 'float16' | 'float64'
compile = False
compile_backend = 'inductor'
ddp_timeout = 600.0      # seconds a process waits for the others in a collective (a frozen rank ends the job);
                         # more than the longest evaluation + save, which rank 0 runs alone
peak_flops = -1.0        # for MFU; -1 = auto (989e12, H100/H200 bf16 dense, on cuda; none on cpu); 0 = no MFU
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items()
               if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))]
configure(globals(), config_keys)
if dtype == 'auto':  # after the overrides: --device=cpu on a GPU machine means float32
    dtype = 'bfloat16' if device.startswith('cuda') else 'float32'
if peak_flops < 0:
    peak_flops = 989e12 if device.startswith('cuda') else 0.0
config = {k: globals()[k] for k in config_keys}


def check_config():
    """Sanity checks of the training settings alone: each bad one ends the run with one line
    (exit 2) before any data is read or model built. The model's own settings are checked by
    GPTConfig once the data is known; the checks that need the data follow its loading."""
    if train_mode not in ('plain', 'jacobi', 'interleaved', 'block'):
        fail(f"unknown train_mode {train_mode!r}; expected 'plain', 'jacobi', 'interleaved' or 'block'")
    if arch not in ('gpt', 'lstm'):
        fail(f"unknown arch {arch!r}; expected 'gpt' or 'lstm'")
    if arch == 'lstm' and (recurrence != 'none' or init_from not in ('scratch', 'resume')):
        fail("arch='lstm' (the LSTM baseline) has no latent recurrence and no pretrained weights: "
             "set recurrence='none' train_mode='plain', init_from 'scratch' or 'resume'")
    if recurrence == 'none' and train_mode != 'plain':
        fail(f"train_mode={train_mode!r} needs a recurrence; use train_mode='plain' for recurrence='none'")
    if dtype not in ('float32', 'bfloat16', 'float16', 'float64'):
        fail(f"unknown dtype {dtype!r}")
    try:
        check_scheme(train_mode, n_iter, n_grad, n_subsets, n_rounds, block_len=block_len)
    except ValueError as e:
        fail(str(e))
    for k in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval', 'log_interval',
              'eval_iters', 'eval_exact_iters', 'eval_examples', 'eval_batch_size'):
        if globals()[k] < 1:
            fail(f"{k}={globals()[k]}: must be >= 1")
    for k in ('learning_rate', 'min_lr', 'max_iters', 'warmup_iters', 'grad_clip', 'weight_decay'):
        if globals()[k] < 0:
            fail(f"{k}={globals()[k]}: must be >= 0")
    if ddp_timeout <= 0:
        fail(f"ddp_timeout={ddp_timeout}: must be > 0 (seconds)")
    for k in ('beta1', 'beta2'):  # AdamW's own check is a traceback
        if not 0 <= globals()[k] < 1:
            fail(f"{k}={globals()[k]}: must be in [0, 1)")
    if rec_lr_mult < 0:  # a negative multiplier is gradient ascent on the recurrence
        fail(f"rec_lr_mult={rec_lr_mult}: must be >= 0 (0 freezes the recurrence's own parameters)")
    if rec_gate_gain < 0:
        fail(f"rec_gate_gain={rec_gate_gain}: must be >= 0 (0 = auto: 1.0 from scratch, 1e-2 retrofit)")
    if device.startswith('cuda') and not torch.cuda.is_available():
        fail(f"device={device} but torch.cuda.is_available() is False (use --device=cpu)")
    if wandb_log and importlib.util.find_spec('wandb') is None:  # not at the first log, minutes in
        fail("wandb_log=True but wandb is not installed (pip install wandb, or --wandb_log=False)")
    if init_from not in ('scratch', 'resume') and missing_folder(init_from):  # not a Hub download that fails
        fail(f"init_from={init_from}: no such folder (a local path; a Hugging Face name is owner/name)")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        fail(f"out_dir={out_dir} is a file, not a folder")
    # a new run in the folder of another would replace its ckpt.pt and best.pt at its first save
    old = [f for f in ('ckpt.pt', 'best.pt') if os.path.isfile(os.path.join(out_dir, f))]
    if old and init_from != 'resume' and not overwrite and not eval_only:
        fail(f"out_dir={out_dir} holds a run ({' and '.join(old)}): continue it with --init_from=resume, "
             f"start a new one in another --out_dir, or replace it with --overwrite=True")
    if recompute and train_mode == 'plain' and int(os.environ.get('RANK', 0)) == 0:
        print("note: recompute=True does nothing with train_mode='plain' (it recomputes the Jacobi and "
              "interleaved passes in backward)")


check_config()
# -----------------------------------------------------------------------------
# processes and devices

ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    use_cuda = device.startswith('cuda')
    from datetime import timedelta
    dist.init_process_group(backend='nccl' if use_cuda else 'gloo', timeout=timedelta(seconds=ddp_timeout))
    rank, local_rank, world_size = dist.get_rank(), int(os.environ['LOCAL_RANK']), dist.get_world_size()
    if use_cuda:
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
    master = rank == 0
    if gradient_accumulation_steps % world_size:  # e.g. the docstring's torchrun command with a 1-step config
        scaled = -(-gradient_accumulation_steps // world_size) * world_size
        if master:
            print(f"note: gradient_accumulation_steps={gradient_accumulation_steps} raised to {scaled}, "
                  f"a multiple of the {world_size} processes (a larger batch per step)")
        gradient_accumulation_steps = config['gradient_accumulation_steps'] = scaled
else:
    rank, world_size, master = 0, 1, True
accum_local = gradient_accumulation_steps // world_size  # micro-batches this process runs per step
device_type = 'cuda' if device.startswith('cuda') else 'cpu'
torch.manual_seed(seed + rank)  # dropout differs per process; the data order is shared (below)
if device_type == 'cuda':
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float64': torch.float64}[dtype]
autocast = precision(device_type, dtype)  # bf16/fp16: autocast over fp32 weights; float64 (tests) converts the weights
if master:
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:  # a path through a file, no permission
        fail(f"out_dir={out_dir}: cannot create the folder ({e.strerror})")

# SIGINT (Ctrl-C) and SIGTERM (what schedulers send before preemption) only set a flag: the
# loop finishes the step it is in and saves at the step boundary, so the checkpoint never
# holds a half-updated model or a data generator one batch ahead (exact resume). A second
# signal more than 2 s later exits at once, without saving (within 2 s it is the same request:
# Ctrl-C under torchrun reaches a worker twice, from the terminal and from torchrun).
stop_signal, stop_time = 0, 0.0


def on_signal(signum, frame):
    global stop_signal, stop_time
    if stop_signal and time.monotonic() - stop_time > 2:
        raise SystemExit(128 + signum)
    if not stop_signal:
        stop_signal, stop_time = signum, time.monotonic()


signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGTERM, on_signal)

# -----------------------------------------------------------------------------
# data: token streams (language modelling) or fixed-length examples with aligned targets (tasks)

data_dir = os.path.join(data_root, dataset)
meta = load_meta(data_dir)  # a missing or broken dataset: one line (DataError)
is_task = meta['format'] == 'examples'
if is_task:
    train_x, train_y = load_split(data_dir, 'train', meta)
    train_m = load_rec_mask(data_dir, 'train', meta)  # None unless prompt/response data
    seq_len = train_x.shape[1]
    task_splits = [s for s in meta['splits'] if s != 'train']
    block_size = max(block_size, max(meta['splits'][s]['len'] for s in meta['splits']))
else:
    train_data = load_split(data_dir, 'train', meta)
    seq_len = block_size


def check_data():
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


check_data()
tokens_per_iter = gradient_accumulation_steps * batch_size * seq_len

# The order of training batches comes from one generator that every process holds in the
# same state: each step draws the rows (or offsets) of the whole global batch, and each
# process reads and copies to its device only its own share. So N processes see exactly what
# one process sees (same global batch), and the generator's state in the checkpoint resumes
# the data order exactly.
data_gen = torch.Generator().manual_seed(seed)


def draw(gen, split, B):
    """B random rows (task data) or offsets (token data) of split: the only random draw."""
    if is_task:
        rows = torch.randint(len(train_x if split == 'train' else load_split(data_dir, split, meta)[0]), (B,),
                             generator=gen).numpy()
        rows.sort()  # memmap-friendly; the set is what matters
        return rows
    data = train_data if split == 'train' else load_split(data_dir, split, meta)
    return torch.randint(len(data) - seq_len - 1, (B,), generator=gen).tolist()


def fetch(split, picks):
    """-> x, y: (B, seq_len) int64 on the device, y aligned with x (-1 = no loss), and m:
    (B, seq_len) bool, where the recurrence is on (prompt/response data), or None."""
    m = None
    if is_task:
        X, Y = (train_x, train_y) if split == 'train' else load_split(data_dir, split, meta)
        M = train_m if split == 'train' else load_rec_mask(data_dir, split, meta)
        x, y = torch.from_numpy(X[picks].astype(np.int64)), torch.from_numpy(Y[picks].astype(np.int64))
        m = None if M is None else torch.from_numpy(M[picks].astype(np.bool_))
    else:
        data = train_data if split == 'train' else load_split(data_dir, split, meta)
        x = torch.from_numpy(np.stack([data[i:i + seq_len].astype(np.int64) for i in picks]))
        y = torch.from_numpy(np.stack([data[i + 1:i + 1 + seq_len].astype(np.int64) for i in picks]))
    if device_type == 'cuda':  # pinned host memory: the copies run asynchronously
        return tuple(None if t is None else t.pin_memory().to(device, non_blocking=True) for t in (x, y, m))
    return x.to(device), y.to(device), None if m is None else m.to(device)


def draw_batch(gen, split, B):
    return fetch(split, draw(gen, split, B))


def train_batches():
    """The micro-batches of this process for one step (every process draws the whole global batch)."""
    picks = [draw(data_gen, 'train', batch_size) for _ in range(gradient_accumulation_steps)]
    return [fetch('train', p) for p in picks[rank * accum_local:(rank + 1) * accum_local]]

# -----------------------------------------------------------------------------
# model, optimizer, resume

model_args = dict(block_size=block_size, vocab_size=meta['vocab_size'], n_layer=n_layer, n_head=n_head,
                  n_kv_head=n_kv_head, n_embd=n_embd, mlp_hidden=mlp_hidden, rope_theta=rope_theta, rope=rope,
                  norm_eps=norm_eps, dropout=dropout, tie_embeddings=tie_embeddings, attn_window=attn_window,
                  vocab_pad=vocab_pad,
                  recurrence=recurrence,
                  rec_start=rec_start, rec_end=rec_end, reset_token=meta.get('reset_token'),
                  rec_residual=rec_residual, rec_proj=rec_proj, rec_residual_detach=rec_residual_detach,
                  rec_scale_min=rec_scale_min, rec_scale_max=rec_scale_max,
                  jacobi_init=jacobi_init,
                  rec_gate_gain=rec_gate_gain or (1.0 if init_from in ('scratch', 'resume') else 1e-2),
                  lrt_inject=lrt_inject, lrt_shared=lrt_shared, lrt_identity_init=lrt_identity_init,
                  lrt_gate_channels=lrt_gate_channels)
iter_num, best_val_loss, ckpt = 0, 1e9, None
pretrained = None  # the Hugging Face checkpoint a retrofit run started from (kept across resumes)
ckpt_path = os.path.join(out_dir, 'ckpt.pt')   # the latest checkpoint
best_path = os.path.join(out_dir, 'best.pt')   # the best by exact validation loss so far
if master:
    for p in (ckpt_path, best_path):  # temp files of saves killed mid-write (kill -9, OOM)
        for f in remove_stale_tmp(p):
            print(f"note: removed {f}, left by an interrupted save")
INIT_ONLY = ('rec_gate_gain', 'lrt_identity_init')  # model args that only shape the initialisation


def resume_notes(saved, wanted, retrofit):
    """A note for every model arg in which the checkpoint (what runs) differs from the config.
    A retrofit's backbone shape is the pretrained model's: only its recurrence args are noted.
    block_size: token sequences shorter than the model's context are fine (checked later)."""
    try:  # resolve the config's automatic values (mlp_hidden=0, rec_end=-1) as a new model would
        wanted = asdict(GPTConfig(**wanted))
    except (ValueError, TypeError):
        pass
    for k in saved:
        if k in INIT_ONLY or k not in wanted or saved[k] == wanted[k]:
            continue
        if retrofit and not (k.startswith(('rec', 'lrt_')) or k == 'dropout'):
            continue
        if k == 'block_size' and wanted[k] <= saved[k]:
            continue
        if master:
            print(f"note: resuming with the checkpoint's {k}={saved[k]!r} (config says {wanted[k]!r})")


try:
    if init_from == 'scratch':
        model = build_model(dict(model_args, arch=arch))
    elif init_from == 'resume':
        model, ckpt = load_checkpoint(ckpt_path)
        trained_on, now = ckpt.get('data'), data_fingerprint(meta)
        if trained_on and trained_on != now:  # same vocab size or not: another dataset is another run
            fail(f"{ckpt_path} was trained on dataset {trained_on['name']} ({trained_on['tokenizer']}, "
                 f"{trained_on['vocab_size']} tokens), not on {dataset} ({now['name']}, {now['tokenizer']}, "
                 f"{now['vocab_size']} tokens{', another vocabulary' if trained_on['vocab_crc'] != now['vocab_crc'] else ''}): "
                 f"resume it on its own dataset, or start a new run (another --out_dir, or --overwrite=True)")
        pretrained = ckpt.get('pretrained')
        resume_notes(ckpt['model_args'], model_args, pretrained)
        model_args = ckpt['model_args']
        # the saved config records what runs: the checkpoint's model args (block_size stays
        # the config's: for token data it is the training sequence length)
        config.update({k: v for k, v in model_args.items() if k in config and k != 'block_size'})
        iter_num, best_val_loss = ckpt['iter_num'], ckpt['best_val_loss']
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
if meta['vocab_size'] > model.config.vocab_size:
    fail(f"dataset {dataset} has a vocabulary of {meta['vocab_size']} tokens but the model only {model.config.vocab_size} "
         f"embeddings: tokenize the data with the model's own tokenizer (prepare.py --tokenizer=...)")
longest = max(meta['splits'][s]['len'] for s in meta['splits']) if is_task else seq_len
if longest > model.config.block_size:
    fail(f"dataset {dataset} has rows of {longest} tokens but the model's block_size is {model.config.block_size}: "
         f"prepare the data with a smaller --max_len (or use a smaller block_size)")
if ptdtype == torch.float64:
    model = model.double()
model.to(device)
raw_model = model  # unwrapped and uncompiled: eval, generation and checkpoints use it
exact_engine = Engine(raw_model) if compile and raw_model.config.recurrence != 'none' else None  # compiled exact eval
groups = raw_model.param_groups(weight_decay, rec_lr_mult, None if rec_weight_decay < 0 else rec_weight_decay)
fused = device_type == 'cuda'
optimizer = torch.optim.AdamW(groups, lr=learning_rate, betas=(beta1, beta2), fused=fused)
if ckpt is not None:
    try:
        optimizer.load_state_dict(ckpt['optimizer'])
        data_gen.set_state(ckpt['data_gen'])
        torch.set_rng_state(ckpt['rng']['torch'])
        np.random.set_state(ckpt['rng']['numpy'])
        random.setstate(ckpt['rng']['python'])
        if device_type == 'cuda' and ckpt['rng'].get('cuda') is not None:
            torch.cuda.set_rng_state(ckpt['rng']['cuda'])
    except (KeyError, ValueError, RuntimeError) as e:
        fail(f"{ckpt_path}: cannot resume the optimizer/data state ({type(e).__name__}: {e})")
if overwrite and init_from != 'resume' and not eval_only and master:  # every check passed: the old run goes now
    gone = [f for f in ('ckpt.pt', 'best.pt', 'log.jsonl') if os.path.isfile(os.path.join(out_dir, f))]
    for f in gone:  # (its log too: a new run's records must not follow an old run's)
        os.remove(os.path.join(out_dir, f))
    if gone:
        print(f"note: overwrite=True: removed the previous run's {', '.join(gone)} from {out_dir}")
scaler = torch.amp.GradScaler(device_type, enabled=ptdtype == torch.float16)
if compile:
    print(f"compiling the model ({compile_backend})...")
    model = torch.compile(model, backend=compile_backend)
if ddp:
    # a recurrent model trained plainly leaves the recurrence's parameters without gradient:
    # DDP must be told, or it waits for their reduction forever ("Expected to have finished reduction")
    unused = raw_model.config.recurrence != 'none' and train_mode == 'plain'
    model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None, find_unused_parameters=unused)

scheme = dict(mode=train_mode, n_iter=n_iter, n_grad=n_grad, n_subsets=n_subsets, n_rounds=n_rounds, block_len=block_len)
flops_per_iter = flops_per_token(raw_model.config, seq_len, **scheme) * tokens_per_iter
if master:
    n_rec = sum(p.numel() for n, p in raw_model.named_parameters() if GPT.is_rec_param(n))
    c = raw_model.config
    shape = 'arch=lstm' if getattr(c, 'arch', 'gpt') == 'lstm' else f"recurrence={c.recurrence} s={c.rec_start} e={c.rec_end}"
    print(f"{sum(p.numel() for p in raw_model.parameters()) / 1e6:.3f}M parameters ({n_rec} recurrent), {shape}, "
          f"train_mode={train_mode}, {tokens_per_iter} tokens/iter, {world_size} process(es) on {device}")
    if ddp:
        print(f"data: each process reads {accum_local} of the {gradient_accumulation_steps} micro-batches of a step")


def get_lr(it):
    """Linear warmup, then cosine decay to min_lr."""
    decay_iters = max_iters if lr_decay_iters < 0 else lr_decay_iters
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)

# -----------------------------------------------------------------------------
# evaluation: training approximation vs exact recurrence

@torch.no_grad()
def evaluate(final=True):
    """Returns a dict of metrics (final=False: an intermediate evaluation, on eval_examples_mid
    rows). Runs on the raw model, never through the DDP wrapper (whose forward would start a
    collective only this process joins). With compile, the exact modes run through the
    engine (engine.py: the compiled span step)."""
    raw_model.eval()
    out = {}
    recurrent = raw_model.config.recurrence != 'none'
    modes = [('approx', train_mode)] + ([('exact', 'exact'), ('zero', 'zero')] if recurrent else [])
    kw = lambda mode: dict(mode=mode, n_iter=n_iter, n_grad=n_grad, n_subsets=n_subsets, n_rounds=n_rounds,
                           block_len=block_len)
    engine = lambda mode: exact_engine if mode in ('exact', 'zero') else None
    for split in ['train', 'val'] + (['test'] if 'test' in meta['splits'] and not is_task else []):
        for tag, mode in modes:
            gen = torch.Generator().manual_seed(1234)  # the same batches at every eval
            n = eval_iters if tag == 'approx' else eval_exact_iters  # exact and zero: the same batches
            losses = []
            for _ in range(n):
                x, y, m = draw_batch(gen, split, batch_size)
                with autocast:
                    losses.append((engine(mode) or raw_model)(x, y, rec_mask=m, **kw(mode))[1].item())
            out[f'{split}/loss_{tag}'] = sum(losses) / len(losses)
        if not recurrent:  # no state: exact and zero-state are the plain forward
            out[f'{split}/loss_exact'] = out[f'{split}/loss_zero'] = out[f'{split}/loss_approx']
        bpt = meta.get('bytes_per_token', {}).get(split)
        if bpt:
            out[f'{split}/bpb_exact'] = out[f'{split}/loss_exact'] / math.log(2) / bpt
    if is_task:
        for split in task_splits:
            X, Y = load_split(data_dir, split, meta)
            M = load_rec_mask(data_dir, split, meta)
            n = min(len(X), eval_examples if final or eval_examples_mid < 1 else eval_examples_mid)
            for tag, mode in modes:
                r = task_accuracy(raw_model, X[:n], Y[:n], None if M is None else M[:n], batch_size=eval_batch_size,
                                  ctx=autocast, kinds=position_kinds(meta, split), engine=engine(mode), **kw(mode))
                out[f'{split}/acc_{tag}'], out[f'{split}/em_{tag}'] = r['acc'], r['em']
                out.update({f'{split}/{k}_{tag}': v for k, v in r.items() if k.startswith('acc_')})  # s5_retrieval
            if not recurrent:
                for key in [k for k in out if k.startswith(f'{split}/') and k.endswith('_approx')]:
                    out[key.replace('_approx', '_exact')] = out[key.replace('_approx', '_zero')] = out[key]
    if recurrent:  # the gates on the first val batch, run exactly
        x, _, m = draw_batch(torch.Generator().manual_seed(1234), 'val', batch_size)
        out.update(gate_stats(raw_model, x, m, autocast))
    raw_model.train()
    return out


def log_json(record):
    with open(os.path.join(out_dir, 'log.jsonl'), 'a') as f:
        f.write(json.dumps(record) + '\n')


def checkpoint():
    rng = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(), python=random.getstate(),
               cuda=torch.cuda.get_rng_state() if device_type == 'cuda' else None)
    return dict(model=raw_model.state_dict(), model_args=asdict(raw_model.config), optimizer=optimizer.state_dict(),
                iter_num=iter_num, best_val_loss=best_val_loss, config=config, data_gen=data_gen.get_state(),
                rng=rng, pretrained=pretrained, data=data_fingerprint(meta), version=1)


def print_eval(m):
    """eval step N: <split> loss <approx> (exact <exact>, gap <approx - exact>, zero-state <zero>,
    reliance <zero - exact>): the reliance gap is how much worse the exact model gets when
    every position reads a zero state (about 0: the state is not used)."""
    recurrent = raw_model.config.recurrence != 'none'
    parts = []
    for split in [s for s in ('train', 'val', 'test') if f'{s}/loss_approx' in m]:
        a, e, z = m[f'{split}/loss_approx'], m[f'{split}/loss_exact'], m[f'{split}/loss_zero']
        parts.append(f"{split} loss {a:.4f} (exact {e:.4f}, gap {a - e:+.4f}"
                     + (f", zero-state {z:.4f}, reliance {z - e:+.4f})" if recurrent else ")"))
        if f'{split}/bpb_exact' in m:
            parts.append(f"{split} bpb {m[f'{split}/bpb_exact']:.4f}")
    print(f"eval step {iter_num}: " + ", ".join(parts))
    if is_task:
        for split in task_splits:
            kinds = ''.join(f", {k[len(split) + 5:-6]} {m[k]:.4f}" for k in m if k.startswith(f'{split}/acc_') and
                            k.endswith('_exact') and k != f'{split}/acc_exact')  # s5_retrieval: at states, values
            print(f"  {split}: acc {m[f'{split}/acc_exact']:.4f}{kinds} em {m[f'{split}/em_exact']:.4f} (exact)"
                  f" | acc {m[f'{split}/acc_approx']:.4f} em {m[f'{split}/em_approx']:.4f} ({train_mode})"
                  + (f" | acc {m[f'{split}/acc_zero']:.4f} em {m[f'{split}/em_zero']:.4f} (zero state)" if recurrent else ""))
    if 'gates/cur' in m:
        print(f"  gates: tanh(g)sigmoid(f) cur {m['gates/cur']:+.4f} rec {m['gates/rec']:+.4f}, "
              f"tanh g_cur {m['gates/tanh_g_cur']:+.4f} g_rec {m['gates/tanh_g_rec']:+.4f}, state norm {m['gates/state']:.3f}")
    elif 'gates/state' in m:
        names = [n for n in ('g_loc', 'g_fb', 'gamma', 'alpha') if f'gates/{n}' in m]
        print("  gates (mean over reading layers): " + ", ".join(f"{n} {m[f'gates/{n}']:.4f}" for n in names)
              + f", state norm {m['gates/state']:.3f}")

def nonfinite(metrics):
    """The names of the non-finite losses and accuracies of an evaluation (a diverged model).
    The gate statistics are not among them: they describe the model, they do not judge it."""
    return [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v) and not k.startswith('gates/')]


def warn_state(metrics):
    """A state that grows without bound is worth a line, not a stop: the loss may still be improving."""
    norm = metrics.get('gates/state')
    if norm is not None and norm > 1e4 * math.sqrt(raw_model.config.n_embd):  # (a NaN is a diverged loss's business)
        print(f"warning: iteration {iter_num}: the recurrent state is exploding (mean norm {norm:.3g} at "
              f"d={raw_model.config.n_embd}); the loss is still finite, so the run goes on", file=sys.stderr)


def stop_diverged(what):
    """A non-finite value: stop at once, one line, exit 3, nothing saved (ckpt.pt and best.pt
    keep the last good weights)."""
    if master:
        print(f"error: iteration {iter_num}: {what}: the run diverged; stopped without saving "
              f"({ckpt_path} and {best_path} hold the last good weights; resume with a lower "
              f"learning_rate or grad_clip > 0)", file=sys.stderr)
    sys.exit(3)

# -----------------------------------------------------------------------------
# training loop

if wandb_log and master:
    import wandb
    wandb.init(project=wandb_project, name=wandb_run_name, config=config)

t0 = time.time()
exit_code = 0
# per-step statistics over a log interval (rank 0's share under DDP): the loss of every step and
# the gradient norm before clipping -> the interval's mean and largest loss, the largest rise of
# the loss from one step to the next, the gradient norm and the fraction of steps clipped
steps_seen = dict(loss=[], grad=[], last=None)


def window_stats():
    losses, grads, last = steps_seen['loss'], steps_seen['grad'], steps_seen['last']
    jumps = [b - a for a, b in zip(([last] if last is not None else []) + losses[:-1], losses)]
    out = dict(loss_mean=sum(losses) / len(losses), loss_max=max(losses), jump_max=max(jumps, default=0.0),
               grad_norm=sum(grads) / len(grads), grad_norm_max=max(grads),
               clip_frac=sum(g > grad_clip for g in grads) / len(grads) if grad_clip > 0 else 0.0)
    steps_seen.update(loss=[], grad=[], last=losses[-1])
    return out


try:
    with compile_errors() if compile else nullcontext():  # a compiler that fails here: one line
        while True:
            lr = get_lr(iter_num)
            for g in optimizer.param_groups:
                g['lr'] = lr * g['lr_mult']

            at_start = iter_num == 0 and not eval_first and not eval_only
            if (iter_num % eval_interval == 0 or eval_only or iter_num == max_iters) and not at_start:
                bad = []
                if master:
                    metrics = evaluate(final=iter_num == max_iters or eval_only)
                    print_eval(metrics)
                    log_json({'iter': iter_num, 'type': 'eval', **metrics})
                    if wandb_log:
                        wandb.log({'iter': iter_num, **metrics})
                    bad = nonfinite(metrics)  # never saved: ckpt.pt and best.pt stay finite
                    warn_state(metrics)
                    val = metrics['val/loss_exact']
                    if not bad and iter_num > 0 and not eval_only:
                        improved = val < best_val_loss
                        best_val_loss = min(best_val_loss, val)
                        if improved:  # best.pt: the best exact val loss so far, never replaced by a worse one
                            save_checkpoint(checkpoint(), best_path)
                        if improved or always_save_checkpoint:
                            save_checkpoint(checkpoint(), ckpt_path)
                            print(f"saved checkpoint to {ckpt_path}" + (f" and {best_path}" if improved else ""))
                if ddp:  # every process evaluates at the same steps: all learn whether rank 0 saw a diverged model
                    flag = torch.tensor([float(bool(bad))], device=device)
                    dist.broadcast(flag, src=0)
                    bad = bad or (['an evaluation loss'] if flag.item() else [])
                if bad:
                    stop_diverged(f"non-finite {', '.join(bad)}")
                t0 = time.time()  # step timing excludes evaluation
            if eval_only or iter_num >= max_iters:
                break

            # one optimisation step over the global batch
            loss_sum = 0.0
            for micro, (x, y, m) in enumerate(train_batches()):
                if ddp:  # synchronise gradients on the last micro-step only
                    model.require_backward_grad_sync = micro == accum_local - 1
                with autocast:
                    _, loss = model(x, y, rec_mask=m, recompute=recompute, **scheme)
                    loss_sum = loss_sum + loss.detach()
                    loss = loss / accum_local
                scaler.scale(loss).backward()
            scaler.unscale_(optimizer)  # (a no-op without fp16) the norm of the true gradient
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else math.inf)
            # the step's train loss: the mean over all its micro-batches (of all processes, below).
            # Divergence guard and stop requests, one small collective per step: [loss, grad norm,
            # signal] non-finite / set on any process -> every process stops at the same step.
            lossf = loss_sum / accum_local
            flags = torch.stack([~torch.isfinite(lossf),
                                 ~torch.isfinite(grad_norm) & (not scaler.is_enabled()),  # fp16: the scaler skips such steps
                                 torch.tensor(stop_signal > 0, device=lossf.device)]).float()
            if ddp:
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            loss_bad, grad_bad, stop = flags.tolist()
            step_loss, step_grad = torch.stack([lossf.float(), grad_norm.float()]).tolist()  # one host sync
            steps_seen['loss'].append(step_loss)
            steps_seen['grad'].append(step_grad)
            if loss_bad or grad_bad:  # before optimizer.step: the weights are still the last good ones
                stop_diverged(' and '.join(["non-finite train loss" + ('' if ddp else f" ({lossf.item()})")] * bool(loss_bad) +
                                           [f"non-finite gradient norm ({grad_norm.item()})"] * bool(grad_bad)))
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
            if iter_num % log_interval == 0:
                if ddp:
                    dist.all_reduce(lossf, op=dist.ReduceOp.AVG)
                w = window_stats()
                if master:
                    dt = (time.time() - t0) / log_interval
                    t0 = time.time()
                    mfu = flops_per_iter / dt / peak_flops if peak_flops > 0 else None
                    print(f"iter {iter_num}: loss {lossf.item():.4f} (mean {w['loss_mean']:.4f}, max {w['loss_max']:.4f}), "
                          f"grad norm {w['grad_norm']:.3g}" + (f" ({100 * w['clip_frac']:.0f}% clipped)" if grad_clip > 0 else "")
                          + f", time {dt * 1000:.1f}ms, {tokens_per_iter / dt:,.0f} tok/s" + (f", mfu {100 * mfu:.1f}%" if mfu else ""))
                    log_json({'iter': iter_num, 'type': 'train', 'loss': lossf.item(), **w, 'lr': lr,
                              'dt_ms': dt * 1000, 'tok_per_s': tokens_per_iter / dt, 'mfu': mfu})
                    if wandb_log:
                        wandb.log({'iter': iter_num, 'train/loss': lossf.item(), 'lr': lr, 'mfu': mfu,
                                   **{f'train/{k}': v for k, v in w.items()}})

            t_gates, gates = time.time(), gate_interval if gate_interval != 0 else log_interval
            if gates > 0 and iter_num % gates == 0 and master and raw_model.config.recurrence != 'none':
                x, _, m = draw_batch(torch.Generator().manual_seed(1234), 'val', gate_rows)  # not data_gen: training unchanged
                log_json({'iter': iter_num, 'type': 'gates', **gate_stats(raw_model, x, m, autocast)})
            t0 += time.time() - t_gates  # the step time excludes this pass

            if stop:  # the step boundary: the checkpoint is exactly what an uninterrupted run has here
                sig = stop_signal or signal.SIGTERM  # (a process that got none stops because another did)
                if master:
                    save_checkpoint(checkpoint(), ckpt_path)
                    print(f"stopped by {signal.Signals(sig).name} at step {iter_num}: saved checkpoint to {ckpt_path} "
                          f"(resume with --init_from=resume)", flush=True)
                if ddp:
                    dist.barrier()  # the others wait for rank 0's save
                sys.exit(128 + sig)
    if ddp:
        # rank 0 may still be evaluating and saving: tearing gloo down under it aborts
        dist.barrier()
except SystemExit as e:  # a stop request or divergence (above): leave with its status, below
    exit_code = e.code
finally:
    if ddp:
        dist.destroy_process_group()
if ddp:
    # DDP keeps its own reference to the process group, so destroy_process_group does not stop
    # gloo's threads; they are torn down by C++ destructors at interpreter exit, which aborts the
    # process now and then ("terminate called without an active exception": 4 of 100 two-process
    # gloo runs under load, 0 of 100 with this exit). Everything is saved and flushed by now, so
    # leave without running those destructors.
    if wandb_log and master:
        wandb.finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
sys.exit(exit_code)

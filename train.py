"""
Train the plain GPT, T2MLR or LRT of model.py, with the parallel training scheme of your choice.

$ python train.py config/t2mlr_small.py
$ torchrun --standalone --nproc_per_node=2 train.py config/t2mlr_small.py   # DDP: gloo on CPU, NCCL on GPUs
$ python lab/train.py config/s3_lstm.py   # this file with the research model, lab/model_full.py: its
                                          # options are settings too (rope, n_rounds, dropout, arch='lstm', ...)

train_mode picks how the recurrence is made parallel for training (model.py; DESIGN.md 6, 7):
'plain' (no recurrence), 'jacobi' (T2MLR's Jacobi iterations: n_iter, n_grad), 'interleaved'
(LRT's strided subsets: n_subsets); lab/train.py adds 'block' (LRT's block-training baseline).
Every evaluation reports the loss under the training approximation, under the exact recurrence
(what generation computes: judge recurrent models by it) and with the state forced to zero
(the reliance gap zero - exact: how much the model uses its state).
docs/usage.md: what a run logs, "Reliability" (best.pt, the divergence guard, exact resume after
SIGINT/SIGTERM, the overwrite refusal) and "Retrofit a pretrained model" (init_from=<Llama>).
"""

import inspect
import json
import math
import os
import random
import signal
import time
from contextlib import nullcontext
from dataclasses import asdict, fields
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import compile_errors, configure, device_setup, fail
from engine import Engine
from model import GPT, GPTConfig  # lab/train.py: this file with the research model (lab/model_full.py) as `model`
from support.checkpoint import save_checkpoint
from support.dataset import data_fingerprint, load_meta, load_rec_mask, load_split
from support.diagnostics import eval_modes, gate_stats, masked, task_accuracy
from support.flops import flops_per_token
from support.tasks import position_kinds
from support.trainutil import (Batches, init_processes, make_out_dir, StepStats, StopRequest, check_config, check_data, check_step, init_model, model_args_from, nonfinite,
                               drop_previous_run, print_eval, restore_previous_run, restore_state, set_aside_previous_run, shutdown, stop_diverged, warn_state)

# -----------------------------------------------------------------------------
# default config values; override with a config file and/or --key=value (python train.py --help lists them)
# I/O
out_dir = 'out'          # the run's folder: ckpt.pt, best.pt, log.jsonl
eval_interval = 250      # steps between evaluations (and checkpoints); step 0 is evaluated too
log_interval = 10        # steps between train log lines
eval_iters = 20          # batches for the approximate losses (the exact ones, token by token: a fifth of them)
eval_examples = 1000     # task data: rows per split for accuracy / exact match (a fifth before the last evaluation)
eval_only = False        # evaluate init_from's model once, then exit
init_from = 'scratch'    # 'scratch' | 'resume' (out_dir/ckpt.pt) | a Hugging Face Llama name or folder (retrofit)
overwrite = False        # True: a new run may replace the run in out_dir (its ckpt.pt, best.pt, log.jsonl); else refused
seed = 1337              # the weights' init, dropout and the batches' order
# data (made by prepare.py)
dataset = 's5_Z2'        # data/<dataset>, or a path to the folder: its meta.json and splits
batch_size = 32          # micro-batch size per process
block_size = 64          # tokens per sequence (token data); model context (task data: >= longest split)
gradient_accumulation_steps = 1  # in total across processes
# training scheme
train_mode = 'jacobi'    # 'plain' | 'jacobi' | 'interleaved' (lab/train.py: 'block' too)
n_iter = 8               # Jacobi: D iterations as in the official code (D+1 span passes: initial, D-1, final)
n_grad = 4               # Jacobi: B, the last iterations that carry gradient (plus the final pass)
n_subsets = 2            # interleaved: S
# optimizer (AdamW, betas (0.9, 0.95))
learning_rate = 1e-3     # peak learning rate (after warmup)
max_iters = 2000         # training steps
weight_decay = 0.1       # AdamW's, on matrices
grad_clip = 1.0          # clip the global gradient norm to this; 0 = off
gate_lr_mult = 1.0       # T2MLR: lr multiplier of the scalar gates g_cur, g_rec (docs/recipe.md)
warmup_iters = 100       # linear warmup steps, then cosine decay
lr_decay_iters = -1      # the cosine reaches min_lr here; -1 = max_iters
min_lr = 1e-4            # the learning rate at the end of the decay
# system
device = 'cuda' if torch.cuda.is_available() else 'cpu'  # 'cpu' | 'cuda' | 'cuda:N'
dtype = 'auto'           # 'auto' (bfloat16 on cuda, float32 on cpu) | 'float32' | 'bfloat16' | 'float16' | 'float64'
compile = False          # torch.compile the model (and the exact evaluation's engine)
# model: every GPTConfig field but block_size, vocab_size and reset_token (model.py: n_layer, n_embd, rec_start,
# attn_window, jacobi_init, vocab_pad, ...; lab/train.py: lab/model_full.py's too) is a setting, GPTConfig's default
model_keys = [f.name for f in fields(GPTConfig) if f.name not in ('block_size', 'vocab_size', 'reset_token')]
assert not set(model_keys) & set(globals()), "a model field named as a training setting"
globals().update({f.name: f.default for f in fields(GPTConfig) if f.name in model_keys})
recurrence = 't2mlr'     # 'none' | 't2mlr' | 'lrt' (GPTConfig's 'none' is the plain GPT a library user builds)
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items()
               if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))]
given = configure(globals(), config_keys, doc=__doc__)
if dtype == 'auto':  # after the overrides: --device=cpu on a GPU machine means float32
    dtype = 'bfloat16' if device.startswith('cuda') else 'float32'
config = {k: globals()[k] for k in config_keys}
check_config(SimpleNamespace(**config))
eval_exact_iters = max(1, eval_iters // 5)  # batches for the exact and zero-state losses (token by token: slower)
# -----------------------------------------------------------------------------
# processes and devices

ddp, rank, local_rank, world_size, device, gradient_accumulation_steps = init_processes(
    device, gradient_accumulation_steps)  # DDP under torchrun (support/trainutil.py)
config['gradient_accumulation_steps'] = gradient_accumulation_steps
master = rank == 0  # logs, evaluates and saves
accum_local = gradient_accumulation_steps // world_size  # micro-batches this process runs per step
# seed + rank: dropout differs per process, the data order is shared (below). autocast: bf16/fp16
# over fp32 weights; float64 (tests) converts the weights
device_type, ptdtype, autocast = device_setup(device, dtype, seed + rank)

stop_request = StopRequest()  # SIGINT/SIGTERM: save at the step boundary, then exit (support/trainutil.py)

# -----------------------------------------------------------------------------
# data: token streams (language modelling) or fixed-length examples with aligned targets (tasks)

data_dir = os.path.join('data', dataset)  # (an absolute path stays itself)
meta = load_meta(data_dir)  # a missing or broken dataset: one line (DataError)
if meta.get('rec_mask') and 'rec_mask' not in inspect.signature(GPT.forward).parameters:  # prompt/response data
    fail(f"dataset {dataset} has prompt masks (prompt/response data): train it with the research model, python lab/train.py")
is_task = meta['format'] == 'examples'
task_splits = [s for s in meta['splits'] if s != 'train'] if is_task else []
batches = Batches(data_dir, meta, block_size, device)  # its memmaps: draw and fetch, below (support/trainutil.py)
seq_len = batches.seq_len  # token data: block_size; task data: the length of train's rows
if is_task:  # the model's context holds the longest example
    block_size = max(block_size, max(meta['splits'][s]['len'] for s in meta['splits']))
check_data(data_dir, dataset, meta, is_task, seq_len, n_subsets if train_mode == 'interleaved' else 1, load_split)
data_gen = torch.Generator().manual_seed(seed)  # the training batches' order, saved with every checkpoint
tokens_per_iter = gradient_accumulation_steps * batch_size * seq_len


def get_batch(split, B, gen):
    """-> x, y: (B, seq_len) int64 on the device, y aligned with x (-1: no loss), and rec_mask (where
    the recurrence is on: prompt/response data) or None. gen picks B random rows (task data) or
    B windows of seq_len + 1 tokens (token data) of split: the only random draw."""
    return batches.fetch(split, batches.draw(gen, split, B))

# -----------------------------------------------------------------------------
# model, optimizer, resume

model_args = model_args_from(dict(config, block_size=block_size), meta, given)  # GPTConfig's fields (support/trainutil.py)
iter_num, best_val_loss = 0, 1e9
ckpt_path = os.path.join(out_dir, 'ckpt.pt')   # the latest checkpoint
best_path = os.path.join(out_dir, 'best.pt')   # the best by exact validation loss so far
if master:
    make_out_dir(out_dir, ckpt_path, best_path)
model, ckpt, model_args, pretrained = init_model(init_from, model_args, meta, dataset, ckpt_path, master)
if ckpt is not None:
    # the saved config records what runs: the checkpoint's model args (block_size stays
    # the config's: for token data it is the training sequence length)
    config.update({k: v for k, v in model_args.items() if k in config and k != 'block_size'})
    iter_num, best_val_loss = ckpt['iter_num'], ckpt['best_val_loss']
longest = max(meta['splits'][s]['len'] for s in meta['splits']) if is_task else seq_len
if longest > model.config.block_size:
    fail(f"dataset {dataset} has rows of {longest} tokens but the model's block_size is {model.config.block_size}: "
         f"prepare the data with a smaller --max_len (or use a smaller block_size)")
if ptdtype == torch.float64:
    model = model.double()
model.to(device)
raw_model = model  # unwrapped and uncompiled: eval, generation and checkpoints use it
recurrent = raw_model.config.recurrence != 'none'
exact_guess = recurrent and train_mode == 'jacobi' and raw_model.config.jacobi_init == 'exact'
exact_engine = Engine(raw_model) if compile and recurrent else None  # compiled exact eval
groups = raw_model.param_groups(weight_decay, gate_lr_mult)  # (the research model's: rec_lr_mult from its config)
optimizer = torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.95), fused=device_type == 'cuda')
if ckpt is not None:
    restore_state(ckpt, ckpt_path, optimizer, data_gen, device_type == 'cuda')
scaler = torch.amp.GradScaler(device_type, enabled=ptdtype == torch.float16)
if compile:
    print("compiling the model...")
    model = torch.compile(model)
if ddp:
    # a recurrent model trained plainly leaves the recurrence's parameters without gradient:
    # DDP must be told, or it waits for their reduction forever ("Expected to have finished reduction")
    unused = recurrent and train_mode == 'plain'
    model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None, find_unused_parameters=unused)

scheme = dict(mode=train_mode, n_iter=n_iter, n_grad=n_grad, n_subsets=n_subsets)  # the forward's (the lab's options: its config)
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
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)

# -----------------------------------------------------------------------------
# evaluation: training approximation vs exact recurrence

@torch.inference_mode()
def evaluate(final=True):
    """Returns a dict of metrics (final=False: an intermediate evaluation, on a fifth of eval_examples
    rows). Runs on the raw model, never through the DDP wrapper (whose forward would start a
    collective only this process joins). With compile, the exact modes run through the
    engine (engine.py: the compiled span step)."""
    raw_model.eval()
    out = {}
    modes = eval_modes(train_mode) if recurrent else [('approx', train_mode)]  # no state: all three are one
    if exact_guess:  # Jacobi from the exact states: the training forward is the exact one, approx = exact
        modes = [m for m in modes if m[0] != 'approx']
    kw = lambda mode: dict(scheme, mode=mode)
    engine = lambda mode: exact_engine if mode in ('exact', 'zero') else None
    for split in ['train', 'val'] + (['test'] if 'test' in meta['splits'] and not is_task else []):
        for tag, mode in modes:
            gen = torch.Generator().manual_seed(1234)  # the same batches at every eval
            n = eval_iters if tag == 'approx' else eval_exact_iters  # exact and zero: the same batches
            losses = []
            for _ in range(n):
                x, y, rec_mask = get_batch(split, batch_size, gen)
                with autocast:
                    losses.append((engine(mode) or raw_model)(x, y, **masked(rec_mask), **kw(mode))[1].item())
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
            n = min(len(X), eval_examples if final else max(1, eval_examples // 5))
            for tag, mode in modes:
                r = task_accuracy(raw_model, X[:n], Y[:n], None if M is None else M[:n], batch_size=256,
                                  ctx=autocast, kinds=position_kinds(meta, split), engine=engine(mode), **kw(mode))
                out[f'{split}/acc_{tag}'], out[f'{split}/em_{tag}'] = r['acc'], r['em']
                out.update({f'{split}/{k}_{tag}': v for k, v in r.items() if k.startswith('acc_')})  # s5_retrieval
            if not recurrent:
                for key in [k for k in out if k.startswith(f'{split}/') and k.endswith('_approx')]:
                    out[key.replace('_approx', '_exact')] = out[key.replace('_approx', '_zero')] = out[key]
    if exact_guess:
        out.update({k[:-len('exact')] + 'approx': v for k, v in out.items() if k.endswith('_exact')})
    if recurrent:  # the gates on the first val batch, run exactly
        x, _, rec_mask = get_batch('val', batch_size, torch.Generator().manual_seed(1234))
        out.update(gate_stats(raw_model, x, rec_mask, autocast))
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


# -----------------------------------------------------------------------------
# training loop

PEAK_FLOPS = 989e12  # for the MFU on cuda: H100/H200 bf16 dense

t0, exit_code, stop_signal = time.time(), 0, 0
step_stats = StepStats(grad_clip)
divergence = lambda what: stop_diverged(what, iter_num, master, ckpt_path, best_path)
# every check has passed: an old run to overwrite moves aside, deleted at this run's first checkpoint
aside = set_aside_previous_run(out_dir) if overwrite and init_from != 'resume' and not eval_only and master else None

try:
    with compile_errors() if compile else nullcontext():  # a compiler that fails here: one line
        while True:
            lr = get_lr(iter_num)
            for g in optimizer.param_groups:
                g['lr'] = lr * g['lr_mult']

            if iter_num % eval_interval == 0 or eval_only or iter_num == max_iters:
                bad = []
                if master:
                    metrics = evaluate(final=iter_num == max_iters or eval_only)
                    print_eval(metrics, iter_num, recurrent, task_splits, train_mode)
                    log_json({'iter': iter_num, 'type': 'eval', **metrics})
                    bad = nonfinite(metrics)  # never saved: ckpt.pt and best.pt stay finite
                    warn_state(metrics, iter_num, raw_model.config.n_embd)
                    val = metrics['val/loss_exact']
                    if not bad and iter_num > 0 and not eval_only:
                        improved = val < best_val_loss
                        best_val_loss = min(best_val_loss, val)
                        # ckpt.pt first: a folder with a best.pt always has a run to resume (a full disk between them)
                        save_checkpoint(checkpoint(), ckpt_path)
                        if improved:  # best.pt: the best exact val loss so far, never replaced by a worse one
                            save_checkpoint(checkpoint(), best_path)
                        print(f"saved checkpoint to {ckpt_path}" + (f" and {best_path}" if improved else ""))
                        aside = drop_previous_run(aside)  # the new run exists: the old one goes
                if ddp:  # every process evaluates at the same steps: all learn whether rank 0 saw a diverged model
                    flag = torch.tensor([float(bool(bad))], device=device)
                    dist.broadcast(flag, src=0)
                    bad = bad or (['an evaluation loss'] if flag.item() else [])
                if bad:
                    divergence(f"non-finite {', '.join(bad)}")
                t0 = time.time()  # step timing excludes evaluation
            if eval_only or iter_num >= max_iters:
                break

            # one optimisation step over the global batch: every process draws all of it (data_gen is
            # in the same state everywhere) and runs its own accum_local micro-batches
            picks = [batches.draw(data_gen, 'train', batch_size) for _ in range(gradient_accumulation_steps)]
            loss_sum = 0.0
            for micro, rows in enumerate(picks[rank * accum_local:(rank + 1) * accum_local]):
                x, y, rec_mask = batches.fetch('train', rows)
                if ddp:  # synchronise gradients on the last micro-step only
                    model.require_backward_grad_sync = micro == accum_local - 1
                with autocast:
                    _, loss = model(x, y, **masked(rec_mask), **scheme)
                    loss_sum = loss_sum + loss.detach()
                    loss = loss / accum_local
                scaler.scale(loss).backward()
            scaler.unscale_(optimizer)  # (a no-op without fp16) the norm of the true gradient
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else math.inf)
            lossf = loss_sum / accum_local  # the step's train loss: the mean over its micro-batches
            # divergence and stop requests, the same on every process (support/trainutil.py)
            check = check_step(lossf, grad_norm, stop_request, scaler.is_enabled(), ddp)
            step_stats.add(check.loss, check.grad_norm)
            if check.diverged:  # before optimizer.step: the weights are still the last good ones
                divergence(check.diverged)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
            if iter_num % log_interval == 0:
                if ddp:
                    dist.all_reduce(lossf, op=dist.ReduceOp.AVG)
                w = step_stats.interval()
                if master:
                    dt = (time.time() - t0) / log_interval
                    t0 = time.time()
                    mfu = flops_per_iter / dt / PEAK_FLOPS if device_type == 'cuda' else None
                    print(f"iter {iter_num}: loss {lossf.item():.4f} (mean {w['loss_mean']:.4f}, max {w['loss_max']:.4f}), "
                          f"grad norm {w['grad_norm']:.3g}" + (f" ({100 * w['clip_frac']:.0f}% clipped)" if grad_clip > 0 else "")
                          + f", time {dt * 1000:.1f}ms, {tokens_per_iter / dt:,.0f} tok/s" + (f", mfu {100 * mfu:.1f}%" if mfu else ""))
                    log_json({'iter': iter_num, 'type': 'train', 'loss': lossf.item(), **w, 'lr': lr,
                              'dt_ms': dt * 1000, 'tok_per_s': tokens_per_iter / dt, 'mfu': mfu})

            t_gates = time.time()  # the gate statistics with every log line
            if iter_num % log_interval == 0 and master and recurrent:
                x, _, rec_mask = get_batch('val', 8, torch.Generator().manual_seed(1234))  # not data_gen: training unchanged
                log_json({'iter': iter_num, 'type': 'gates', **gate_stats(raw_model, x, rec_mask, autocast)})
            t0 += time.time() - t_gates  # the step time excludes this pass

            if check.stop:  # the step boundary: the checkpoint is exactly what an uninterrupted run has here
                stop_signal = stop_request.signum or signal.SIGTERM  # (a process that got none stops because another did)
                break
    if stop_signal and master:
        save_checkpoint(checkpoint(), ckpt_path)
        aside = drop_previous_run(aside)
        print(f"stopped by {signal.Signals(stop_signal).name} at step {iter_num}: saved checkpoint to {ckpt_path} "
              f"(resume with --init_from=resume)", flush=True)
    if ddp:
        # rank 0 may still be evaluating and saving: tearing gloo down under it aborts
        dist.barrier()
    exit_code = 128 + stop_signal if stop_signal else 0
except SystemExit as e:  # divergence (above): leave with its status, below
    exit_code = e.code
finally:
    restore_previous_run(aside)  # (None once this run has a checkpoint)
    if ddp:
        dist.destroy_process_group()
shutdown(exit_code, ddp)

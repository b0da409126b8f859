"""
Sample from a trained model, or score it on a task split with the exact recurrence.

$ python sample.py --out_dir=out --start="ROMEO:"              # 3 samples from out/ckpt.pt
$ python sample.py --out_dir=out --ckpt=best                   # from out/best.pt (best exact val loss)
$ python sample.py --out_dir=out --start=FILE:prompt.txt --num_samples=1   # streams tokens
$ python sample.py --out_dir=out-s5 --eval_split=test_64       # token accuracy / exact match
$ python sample.py --out_dir=out-s5 --start="0 1 1 0"         # task data: predicted vs true label per position
$ python sample.py --out_dir=out-s5 --show_split=test_64 --show_row=3   # the same for a stored row
$ python sample.py --init_from=scratch --dataset=s5_Z2 --start="0 1 1"     # untrained smoke test
$ python sample.py --out_dir=out/retrofit_tiny --eval_answers=test --max_new_tokens=16   # answer accuracy
$ python sample.py --out_dir=out-s5 --trace=trace.png --trace_split=test --trace_row=0   # the state at work

Generation is exactly model.generate: one prefill of the prompt (prefill='exact', 'jacobi'
with prefill_iters passes, or 'plain'), then one forward pass per new token with the KV
cache and the recurrent state. With num_samples=1 the same loop runs here, token by
token, so the text can be printed as it is produced. Datasets whose documents start with
a reset token (gpt2 corpora: <|endoftext|>) get it in front of the prompt, as in training.
Samples go to stdout, each followed by a line of dashes; notes go to stderr.

Labelled task data (prepare.py s5, s5_retrieval, varassign, your own write_task: tokenizer 'task')
is not sampled: its targets are labels, not the next input, so feeding a predicted label back
as the next token means nothing. Instead the input (--start, space-separated token names, or
row show_row of split show_split) goes through ONE teacher-forced forward pass, with the exact
recurrence for a recurrent model (mode='exact', what generation computes), and a table shows
per position the input token, the predicted label and the true label (* = wrong), then the
accuracy over the labelled positions. True labels: the split's stored ones, or for a --start
input of s5 / s5_retrieval recomputed from it (prepare.task_labels); other tasks show none.

Prompt/response data (prepare.py jsonl, gsm8k: the recurrence runs on the response only) is
prefilled plainly by default, as it was trained. --eval_answers=SPLIT generates a greedy
answer to every prompt of the split (prompt prefilled, one pass per token, stop at eos) and
reports exact-match accuracy of the final answer (prepare.extract_answer: the number after
'####', else the last number) against the stored reference.

--trace=FILE.png runs the exact recurrence once on one input (row trace_row of task split
trace_split, or the --start prompt) and writes, per position, the norm of the state read,
the gates (T2MLR: tanh(g) sigmoid(f) of the current and the recurrent path, mean and spread
over channels; LRT: g_loc and g_fb per reading layer, |gamma m| against |alpha x|), the
prediction of the exact model and of the zero-state model (mode='zero') and the label,
as a picture (FILE.png, needs matplotlib) and as JSON (FILE.json); the table goes to stdout.
"""

import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch

from checkpoint import CheckpointError, from_pretrained, load_checkpoint
from configurator import check_out_file, compile_errors, configure, device_setup, fail
from dataset import (check_hub, data_fingerprint, get_tokenizer, load_answers, load_meta, load_rec_mask, load_split,
                     missing_folder, short)
from diagnostics import corpus_loss, eval_modes, plot_trace, task_accuracy, trace_values
from engine import Engine
from model import GPT, GPTConfig
from sft import extract_answer
from tasks import position_kinds, task_labels, task_rec_mask

# -----------------------------------------------------------------------------
out_dir = 'out'
init_from = 'resume'     # 'resume' (out_dir/ckpt.pt or best.pt: ckpt), a path to a .pt file, 'scratch' (fresh tiny model), or a
                         # Hugging Face Llama name/folder: the pretrained model as it is (a baseline; give --dataset)
data_root = 'data'
ckpt = 'latest'          # init_from=resume: 'latest' (out_dir/ckpt.pt) or 'best' (out_dir/best.pt, best exact val loss)
dataset = ''             # data_root/<dataset>; '' = what the checkpoint was trained on
start = '\n'             # the prompt, or FILE:path to read it from a file
num_samples = 3
max_new_tokens = 200
temperature = 0.8        # 0 = greedy
top_k = 200              # 0 = no top-k filter
prefill = ''             # 'exact' | 'jacobi' | 'plain' (see model.GPT.prefill); '' = plain for prompt/response data, else exact
prefill_iters = 8        # Jacobi passes over the prompt for prefill='jacobi'
stream = True            # with num_samples=1, print each token as it is generated
eval_split = ''          # e.g. test_64: instead of sampling, score this task split (exact recurrence)
eval_answers = ''         # e.g. test: greedy answers to the split's prompts, exact-match accuracy (prompt/response data)
eval_n = 0               # eval_answers: only the first eval_n prompts (0 = all)
eval_batch_size = 64
seed = 1337
device = 'cpu'           # 'cpu', 'cuda', 'cuda:1', ...
dtype = 'float32'        # 'float32' | 'bfloat16' (autocast)
attn_window = -1         # >= 0: run with this attention window instead of the model's (0 = full attention)
trace = ''               # e.g. trace.png: gate and state trace of one input (also writes trace.json)
trace_split = ''         # the trace's input: a row of this task split (with its labels); '' = the --start prompt
trace_row = 0
show_split = ''          # task data: show this split's row show_row (with its stored labels) instead of the --start input
show_row = 0
compile = False          # torch.compile the decode step and the exact prefill's span step (compiled once, then fast)
prefill_tol = -1.0       # >= 0: prefill='jacobi' iterates until no state moves by more than this (at most T iterations)
jacobi_profile = ''      # e.g. profile.png: how fast Jacobi reaches the exact states on a task split (also .json)
profile_split = 'test'   # the profile's rows: the first profile_rows of this split
profile_rows = 64
profile_with = ''        # more profiles to draw in the same picture: their .json files, comma-separated
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))]


def load_model(init_from, out_dir, device, which='latest'):
    """-> (model, ckpt config dict). Checkpoint problems end the program with one line.
    which: 'latest' (ckpt.pt) or 'best' (best.pt) for init_from='resume'."""
    if init_from == 'scratch':
        return None, {}
    if init_from != 'resume' and not init_from.endswith('.pt'):
        if missing_folder(init_from):  # not a Hub download that fails
            fail(f"init_from={init_from}: no such folder (a local path; a Hugging Face name is owner/name)")
        if not os.path.isdir(os.path.expanduser(init_from)):
            check_hub(f"the model {init_from}")  # a network that never answers: one line, not a hang
        try:  # a pretrained Hugging Face model, recurrence off: the baseline a retrofit starts from
            return from_pretrained(init_from).to(device), {}
        except (CheckpointError, ImportError) as e:
            fail(str(e))
    path = os.path.join(out_dir, {'latest': 'ckpt.pt', 'best': 'best.pt'}[which]) if init_from == 'resume' else init_from
    try:
        model, ckpt = load_checkpoint(path, device)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    kind = f"the {which} checkpoint" if init_from == 'resume' else "checkpoint"
    best = ckpt.get('best_val_loss', 1e9)
    print(f"note: loaded {kind} {path} (step {ckpt.get('iter_num', '?')}"
          + (f", best exact val loss {best:.4f})" if best < 1e9 else ")"), file=sys.stderr)
    return model, dict(ckpt.get('config') or {}, data=ckpt.get('data'))


def scratch_model(meta, device):
    """A fresh tiny T2MLR model (untrained): checks the plumbing without a checkpoint."""
    vocab = meta['vocab_size'] if meta else 50304  # GPT-2's vocab padded to a multiple of 64
    config = GPTConfig(block_size=1024, vocab_size=vocab, n_layer=2, n_head=2, n_kv_head=1, n_embd=32,
                       recurrence='t2mlr', rec_start=0, rec_end=1, reset_token=(meta or {}).get('reset_token'))
    return GPT(config).to(device)


def read_prompt(start):
    if start.startswith('FILE:'):
        path = start[5:]
        if not os.path.isfile(path):
            fail(f"--start=FILE:{path}: no such file")
        try:
            with open(path, encoding='utf-8') as f:
                return f.read()
        except UnicodeDecodeError as e:  # a binary file (a .bin, a picture): not a prompt
            fail(f"--start=FILE:{path}: not UTF-8 text (byte {e.start}): give a text file")
        except OSError as e:
            fail(f"--start=FILE:{path}: cannot read it ({e.strerror})")
    return start


def encode_prompt(text, meta, encode):
    """-> (ids, skip): the prompt's token ids and how many leading ids are not the user's
    text (the reset token that starts every document of a gpt2 corpus)."""
    ids = encode(text)
    reset = meta.get('reset_token')
    if reset is not None and (not ids or ids[0] != reset):
        return [reset] + ids, 1
    if not ids:
        hint = (f" (tokens of {meta['name']}, space-separated: {' '.join(meta['itos'][:8])} ...), "
                f"or --show_split=test --show_row=0 for a stored row") if meta['tokenizer'] == 'task' else ''
        fail(f"the prompt is empty: give one with --start=...{hint}")
    return ids, 0


def printer(decode, skip, shown):
    """on_token callback: print the new text. Decodes everything so far and prints what is
    new after the text already shown, holding back a trailing U+FFFD (half of a multi-byte
    character). -> (on_token, a one-item list holding the text shown so far)."""
    shown = [shown]

    def on_token(ids):
        text = decode(ids[0, skip:].tolist()).rstrip('\ufffd')
        if text.startswith(shown[0]):
            print(text[len(shown[0]):], end='', flush=True)
            shown[0] = text
    return on_token, shown


def evaluate_corpus(model, data_dir, meta, split, batch_size, ctx, scheme):
    """A token corpus's split read whole in windows of the training length: bits per token
    (one character for char data) under the exact recurrence, the training scheme's
    approximation and the zero state."""
    import math
    data = load_split(data_dir, split, meta)
    T = min(train_config.get('block_size') or model.config.block_size, model.config.block_size)
    t0, res = time.time(), {}
    for tag, mode in eval_modes(scheme['mode'], model.config.recurrence != 'none'):
        tag = {'approx': scheme['mode'], 'zero': 'zero state'}.get(tag, 'plain' if mode == 'plain' else tag)
        loss, n = corpus_loss(model, data, T, mode=mode, batch_size=batch_size, ctx=ctx,
                              **{k: v for k, v in scheme.items() if k != 'mode'})
        res[tag] = loss / math.log(2)
    print(f"{meta['name']} {split}: {n:,} tokens in windows of {T}, bits per token: "
          + ', '.join(f"{v:.4f} ({k})" for k, v in res.items()) + f"  [{time.time() - t0:.1f}s]")
    return res


def evaluate(model, data_dir, meta, split, batch_size, ctx):
    """Token accuracy (argmax == y over positions with y != -1) and exact match (every
    labelled position of a row right) of the EXACT sequential recurrence on a task split,
    with accuracy by position and the step accuracy."""
    if meta['format'] != 'examples':
        scheme = {k: train_config.get(k, d) for k, d in (('mode', 'jacobi'), ('n_iter', 8), ('n_grad', 4),
                                                          ('n_subsets', 2), ('n_rounds', 1), ('block_len', 1))}
        scheme['mode'] = train_config.get('train_mode', 'plain')
        return evaluate_corpus(model, data_dir, meta, split, batch_size, ctx, scheme)
    X, Y = load_split(data_dir, split, meta)
    n, T = X.shape
    if T > model.config.block_size:
        fail(f"split {split} has rows of length {T}, more than the model's block_size {model.config.block_size}")
    t0 = time.time()
    r = task_accuracy(model, X, Y, load_rec_mask(data_dir, split, meta), mode='exact', batch_size=batch_size, ctx=ctx,
                      kinds=position_kinds(meta, split))
    kinds = ''.join(f", at the {k[4:]}s {v:.4f}" for k, v in r.items() if k.startswith('acc_'))  # s5_retrieval
    print(f"{meta['name']} {split}: {n} rows x {T} tokens, exact recurrence: "
          f"token accuracy {r['acc']:.4f} ({r['right']}/{r['labelled']}){kinds}, "
          f"exact match {r['em']:.4f} ({round(r['em'] * n)}/{n})  [{time.time() - t0:.1f}s]")
    # where the errors are: accuracy by position, and how often a right label is followed by a
    # right one. A state tracker that learned the step with accuracy p decays like p^t; p = 1
    # and a flat profile is a solved task
    at = [t for t in range(0, T, max(1, T // 8)) if r['pos_n'][t] > 0]
    if at:
        print("  accuracy by position: " + '  '.join(f"{t}:{r['pos_acc'][t]:.2f}" for t in at))
    if r['step_acc'] is not None:
        print(f"  step accuracy (right at t, given right at t-1): {r['step_acc']:.4f}")
    return r['acc'], r['em']


@torch.no_grad()
def evaluate_answers(model, data_dir, meta, split, max_new_tokens, batch_size, device, ctx, prefill, decode, limit=0):
    """Exact-match accuracy of greedy answers on a prompt/response split. Each prompt (its
    stored tokens, exactly as in training) is prefilled with `prefill`, then one forward pass
    per token until eos or max_new_tokens; the final answer extracted from the text is compared
    with the stored reference. Prompts of equal length run as one batch (no padding, so
    batching cannot change a row's tokens). -> (accuracy, {row: text}, {row: answer})."""
    refs = load_answers(data_dir, split, meta)
    X, _ = load_split(data_dir, split, meta)
    n = len(X) if limit <= 0 else min(limit, len(X))
    eos, block = meta['eos_token'], model.config.block_size
    by_len = {}
    for i in range(n):
        by_len.setdefault(refs['prompt_len'][i], []).append(i)
    texts, preds, capped, t0 = {}, {}, 0, time.time()
    for P, rows in sorted(by_len.items()):
        new = min(max_new_tokens, block - P)  # the model cannot see past its block_size
        capped += len(rows) if new < max_new_tokens else 0
        for j in range(0, len(rows), batch_size):
            chunk = rows[j:j + batch_size]
            idx = torch.from_numpy(np.asarray(X[chunk, :P], dtype=np.int64)).to(device)
            with ctx:
                out = model.generate(idx, new, temperature=0, prefill=prefill, stop_token=eos)
            for i, ids in zip(chunk, out[:, P:].tolist()):
                ids = ids[:ids.index(eos)] if eos in ids else ids
                texts[i] = decode(ids)
                preds[i] = extract_answer(texts[i])
    right = sum(preds[i] == refs['answer'][i] for i in range(n))
    if capped:
        print(f"note: {capped} prompts had fewer than {max_new_tokens} positions left in block_size {block}", file=sys.stderr)
    print(f"{meta['name']} {split}: {n} prompts, greedy, prefill {prefill}, <= {max_new_tokens} new tokens: "
          f"answer accuracy {right / n:.4f} ({right}/{n})  [{time.time() - t0:.1f}s]")
    return right / n, texts, preds


# -----------------------------------------------------------------------------
# labelled task data: predicted vs true label at every position of one input

def split_row(data_dir, meta, split, row, what):
    """-> (ids, labels) of row `row` of task split `split`; bad names: one line and exit 2."""
    if meta['format'] != 'examples':
        fail(f"{what}_split needs a task dataset (examples format); {meta['name']} is a token corpus")
    if split not in meta['splits']:
        fail(f"no split {split!r} in {meta['name']} (it has {', '.join(meta['splits'])})")
    X, Y = load_split(data_dir, split, meta)
    if not 0 <= row < len(X):
        fail(f"{what}_row={row} is out of range: split {split} has {len(X)} rows")
    return X[row].astype(np.int64).tolist(), Y[row].astype(np.int64).tolist()


def rec_mask(ids):
    """(1, T) bool: where the recurrence is on for this input, for task data that carries a mask
    (s5_retrieval's official layout: off on the dictionary and '|'); None: on everywhere."""
    m = task_rec_mask(meta, ids)
    return None if m is None else torch.tensor([m], device=device)


@torch.no_grad()
def show_labels(model, ids, labels, name, title, ctx):
    """One teacher-forced forward over ids (exact recurrence, or the plain forward of a model
    without one) and a table: position, input token, predicted label, true label (labels: -1 =
    unlabelled; None = unknown, no such column), * where they differ. Runs of unlabelled
    positions are folded into one line. -> (right, labelled)."""
    if len(ids) > model.config.block_size:
        fail(f"the input has {len(ids)} tokens, more than the model's block_size {model.config.block_size}")
    rec = model.config.recurrence != 'none'
    idx = torch.tensor([ids], dtype=torch.long, device=model.lm_head.weight.device)
    with ctx:
        logits, _ = model(idx, mode='exact', rec_mask=rec_mask(ids))  # the plain forward for a model without recurrence
    pred = logits[0].argmax(-1).tolist()
    how = f"exact recurrence ({model.config.recurrence}, mode='exact')" if rec else "plain forward (no recurrence)"
    print(f"{title}: {len(ids)} tokens, teacher-forced, one forward, {how}")
    w = max(5, max(len(name(t)) for t in ids + pred + [l for l in labels or [] if l >= 0]))
    print((f"{'pos':>7}  {'input':<{w}}  {'pred':<{w}}" + (f"  {'true':<{w}}" if labels else '')).rstrip())
    right = labelled = t = 0
    while t < len(ids):
        if labels and labels[t] < 0:  # fold a run of unlabelled positions (s5_retrieval's dictionary)
            end = t
            while end + 1 < len(ids) and labels[end + 1] < 0:
                end += 1
            if end > t:
                print(f"{f'{t}-{end}':>7}  ({end - t + 1} unlabelled positions)")
                t = end + 1
                continue
        row = f"{t:>7}  {name(ids[t]):<{w}}  {name(pred[t]):<{w}}"
        if labels:
            ok = labels[t] < 0 or pred[t] == labels[t]
            row += f"  {name(labels[t]) if labels[t] >= 0 else '-':<{w}}" + ('' if ok else '  *')
            right, labelled = right + (labels[t] >= 0 and ok), labelled + (labels[t] >= 0)
        print(row.rstrip())
        t += 1
    if labelled:
        print(f"accuracy {right}/{labelled} = {right / labelled:.4f} over the labelled positions "
              f"({'exact recurrence' if rec else 'plain forward'}; * = wrong)")
    elif labels:
        print("no labelled positions in this input")
    return right, labelled


# -----------------------------------------------------------------------------
# trace: what the recurrence does on one input

def print_trace(cols):
    keys = list(cols)
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)
    print('\t'.join(keys))
    for t in range(len(cols['pos'])):
        print('\t'.join(fmt(cols[k][t]) for k in keys))


def run_profile(model, data_dir, meta, path, label):
    """--jacobi_profile: the table, FILE.json and FILE.png (with the --profile_with profiles drawn in)."""
    import json
    from diagnostics import jacobi_profile, plot_jacobi_profile
    if model.config.recurrence == 'none':
        fail("no Jacobi profile: this model has no recurrence (recurrence='none')")
    if meta['format'] != 'examples':
        fail(f"jacobi_profile needs a task dataset (examples format); {meta['name']} is a token corpus")
    X, _ = load_split(data_dir, profile_split, meta)
    M = load_rec_mask(data_dir, profile_split, meta)
    rows = jacobi_profile(model, X[:profile_rows], None if M is None else M[:profile_rows])
    T = X.shape[1]
    print(f"{label}: Jacobi D = 1..{T} on {min(profile_rows, len(X))} rows of {profile_split} ({T} tokens), "
          f"against the exact recurrence (state exact: relative error <= 1e-3)")
    print(f"{'D':>4} {'state exact':>12} {'pred exact':>11} {'exact prefix':>13} {'min prefix':>11} {'max change':>11}")
    for r in rows:
        mc = '-' if r['max_change'] is None else f"{r['max_change']:.2e}"
        print(f"{r['k']:4d} {r['state_exact']:12.4f} {r['pred_exact']:11.4f} {r['prefix']:13.2f} {r['prefix_min']:11d} {mc:>11}")
    json_path = os.path.splitext(path)[0] + '.json'
    with open(json_path, 'w') as f:
        json.dump({'label': label, 'split': profile_split, 'T': T, 'rows': rows}, f)
    print(f"wrote {json_path}", file=sys.stderr)
    profiles = {label: rows, **read_profiles(profile_with)}
    try:
        plot_jacobi_profile(profiles, path, T)
        print(f"wrote {path}", file=sys.stderr)
    except ImportError:
        print("matplotlib is not installed: no picture (pip install matplotlib)", file=sys.stderr)


def read_profiles(paths):
    """--profile_with: {label: rows} of the profiles that --jacobi_profile wrote (FILE.json),
    comma-separated; a missing or foreign file is one line (read once at start-up, before any work)."""
    import json
    profiles = {}
    for other in [p for p in paths.split(',') if p]:
        if not os.path.isfile(other):
            fail(f"profile_with: no file {other}")
        try:
            with open(other) as f:
                o = json.load(f)
            profiles[o['label']] = o['rows']
        except (ValueError, KeyError, TypeError) as e:  # (UnicodeDecodeError is a ValueError)
            fail(f"profile_with: {other} is not a profile written by --jacobi_profile ({short(e)})")
    return profiles


def run_trace(model, ids, labels, path, title):
    """--trace: one line and exit 2 on bad input; else the table, FILE.json and FILE.png."""
    import json
    if model.config.recurrence == 'none':
        fail("nothing to trace: this model has no recurrence (recurrence='none')")
    if len(ids) > model.config.block_size:
        fail(f"the trace input has {len(ids)} tokens, more than the model's block_size {model.config.block_size}")
    cols = trace_values(model, torch.tensor([ids], dtype=torch.long, device=model.lm_head.weight.device), labels, rec_mask(ids))
    print_trace(cols)
    json_path = os.path.splitext(path)[0] + '.json'
    with open(json_path, 'w') as f:
        json.dump({'recurrence': model.config.recurrence, 'rec_start': model.config.rec_start,
                   'rec_end': model.config.rec_end, 'title': title, 'columns': cols}, f)
    print(f"wrote {json_path}", file=sys.stderr)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"matplotlib is not installed: no picture (pip install matplotlib); the numbers are above and in {json_path}",
              file=sys.stderr)
        return
    plot_trace(cols, path, title)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == '__main__':
    given = configure(globals(), config_keys, doc=__doc__)
    if device.startswith('cuda') and not torch.cuda.is_available():
        fail(f"device={device} but torch.cuda.is_available() is False")
    if dtype not in ('float32', 'bfloat16'):
        fail(f"dtype={dtype}: expected float32 or bfloat16")
    if prefill not in ('', 'exact', 'jacobi', 'plain'):
        fail(f"prefill={prefill}: expected exact, jacobi or plain")
    if eval_split and eval_answers:
        fail("give eval_split (teacher-forced token accuracy) or eval_answers (generated answers), not both")
    if trace and (eval_split or eval_answers):
        fail("give trace or eval_split/eval_answers, not both")
    if show_split and (trace or eval_split or eval_answers):
        fail("give show_split (one row, label by label) or trace/eval_split/eval_answers, not both")
    if num_samples < 1 or max_new_tokens < 1 or eval_batch_size < 1:
        fail("num_samples, max_new_tokens and eval_batch_size must be >= 1")
    if temperature < 0:
        fail(f"temperature={temperature}: must be >= 0 (0 = greedy)")
    if top_k < 0:
        fail(f"top_k={top_k}: must be >= 1, or 0 for no top-k filter")
    if ckpt not in ('latest', 'best'):
        fail(f"ckpt={ckpt!r}: expected 'latest' (out_dir/ckpt.pt) or 'best' (out_dir/best.pt)")
    if prefill_iters < 1:
        fail(f"prefill_iters={prefill_iters}: must be >= 1 (Jacobi passes over the prompt)")
    if profile_rows < 1:
        fail(f"profile_rows={profile_rows}: must be >= 1 (the first rows of profile_split)")
    if attn_window < -1:
        fail(f"attn_window={attn_window}: must be >= 0 (0 = full attention), or -1 for the model's own")
    check_out_file('trace', trace)  # the picture and its .json (same folder) are written after the work
    check_out_file('jacobi_profile', jacobi_profile)
    read_profiles(profile_with)
    read_prompt(start)  # a missing or binary --start=FILE: one line before any model is loaded
    _, _, ctx = device_setup(device, dtype, seed, tf32=False)  # (no TF32: the tokens as before)

    # model, and the dataset it was trained on (for the tokenizer and the task splits)
    model, train_config = load_model(init_from, out_dir, device, ckpt)
    if model is not None and getattr(model.config, 'arch', 'gpt') == 'lstm':  # these would be ignored, or a traceback
        for k in ('prefill', 'prefill_iters', 'prefill_tol', 'attn_window', 'trace', 'jacobi_profile'):
            if k in given:
                fail(f"{k}={globals()[k]!r} does not apply to an LSTM (its prompt always runs exactly; it has no "
                     f"attention and no latent state to trace)")
    if dataset:
        data_dir = os.path.join(data_root, dataset)
    elif train_config.get('dataset'):
        root = data_root if 'data_root' in given else train_config.get('data_root', data_root)  # the flag wins
        data_dir = os.path.join(root, train_config['dataset'])
    else:
        data_dir = None
    if data_dir is not None:
        meta = load_meta(data_dir)
    elif model is None or model.config.vocab_size >= 50257:
        meta = dict(name='gpt2', tokenizer='gpt2', reset_token=50256, vocab_size=50257, format='tokens')
        print("note: no dataset given or recorded in the checkpoint: using the GPT-2 tokenizer", file=sys.stderr)
    else:
        fail("the checkpoint records no dataset: give --dataset=NAME (a folder of data_root made by prepare.py)")
    trained_on = train_config.get('data')  # the vocabulary the checkpoint was trained with (train.py records it)
    if trained_on and data_dir is not None and data_fingerprint(meta)['vocab_crc'] != trained_on['vocab_crc']:
        fail(f"dataset {meta['name']} has another vocabulary than {trained_on['name']}, which the model was trained "
             f"on ({trained_on['tokenizer']}, {trained_on['vocab_size']} tokens): its tokens would mean other things")
    if not eval_split:
        encode, decode = get_tokenizer(meta)  # before building anything: gpt2 offline fails here
    prefill = prefill or ('plain' if meta.get('rec_mask') else 'exact')  # as the model was trained
    if prefill_tol >= 0 and prefill != 'jacobi':  # it would be ignored
        fail(f"prefill_tol={prefill_tol} applies to prefill='jacobi' only (prefill is {prefill!r})")
    if model is None:
        model = scratch_model(meta, device)
    if meta['vocab_size'] > model.config.vocab_size:
        fail(f"dataset {meta['name']} has {meta['vocab_size']} tokens but the model only {model.config.vocab_size}")
    if attn_window >= 0:  # e.g. test a full-attention model with a window (a diagnostic)
        model.config.attn_window = attn_window
    model.eval()
    print(f"model: {getattr(model.config, 'arch', model.config.recurrence)}, {model.config.n_layer} layers, d={model.config.n_embd}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters; data: {meta['name']}", file=sys.stderr)

    if jacobi_profile:
        run_profile(model, data_dir, meta, jacobi_profile, f"{meta['name']}: {os.path.basename(os.path.normpath(out_dir))}")
        sys.exit(0)
    if trace:
        if trace_split:
            ids, labels = split_row(data_dir, meta, trace_split, trace_row, 'trace')
            title = f"{meta['name']} {trace_split} row {trace_row}"
        else:
            ids, _ = encode_prompt(read_prompt(start), meta, encode)
            # a corpus: the next token; a task: the labels if they follow from the input (s5), else none
            labels = ids[1:] + [-1] if meta['format'] != 'examples' else task_labels(meta, ids)
            title = f"{meta['name']}: {start[:40]}"
        run_trace(model, ids, labels, trace, f"{model.config.recurrence} (s={model.config.rec_start}, "
                  f"e={model.config.rec_end}), {title}")
        sys.exit(0)
    if eval_split:
        evaluate(model, data_dir, meta, eval_split, eval_batch_size, ctx)
        sys.exit(0)
    if eval_answers:
        if not meta.get('rec_mask'):
            fail(f"eval_answers needs prompt/response data (prepare.py jsonl or gsm8k); {meta['name']} is not")
        evaluate_answers(model, data_dir, meta, eval_answers, max_new_tokens, eval_batch_size, device, ctx, prefill,
                         decode, eval_n)
        sys.exit(0)
    if meta['format'] == 'examples' and meta['tokenizer'] == 'task':
        # a labelled task: a predicted label is no next input, so show the labels teacher-forced instead
        if show_split:
            ids, labels = split_row(data_dir, meta, show_split, show_row, 'show')
            title = f"{meta['name']} {show_split} row {show_row}"
        else:
            ids, _ = encode_prompt(read_prompt(start), meta, encode)
            labels, title = task_labels(meta, ids), meta['name']
            if labels is None:
                print(f"note: no true labels for {meta['name']}: they are recomputed only for s5 and s5_retrieval data "
                      f"prepared by this version (meta.json 'task') and an input in the task's layout; "
                      f"--show_split=SPLIT --show_row=N shows a stored row with its labels", file=sys.stderr)
        show_labels(model, ids, labels, lambda i: decode([i]), title, ctx)
        sys.exit(0)
    if show_split:
        fail(f"show_split needs a labelled task dataset (prepare.py s5, s5_retrieval, varassign, write_task); "
             f"{meta['name']} is not: sample it with --start=...")

    ids, skip = encode_prompt(read_prompt(start), meta, encode)
    if len(ids) + max_new_tokens > model.config.block_size:
        fail(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's block_size {model.config.block_size}")
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    kw = dict(temperature=temperature, top_k=top_k or None, prefill=prefill, prefill_iters=prefill_iters, generator=generator,
              prefill_tol=prefill_tol if prefill_tol >= 0 else None)
    gen = Engine(model, compile=True) if compile else model  # engine.py: the same steps, compiled
    with ctx, compile_errors() if compile else nullcontext():
        if num_samples == 1 and stream:
            prompt_text = decode(ids[skip:]).rstrip('\ufffd')
            print(prompt_text, end='', flush=True)
            on_token, shown = printer(decode, skip, prompt_text)
            y = gen.generate(idx, max_new_tokens, on_token=on_token, **kw)
            text = decode(y[0, skip:].tolist())
            print(text[len(shown[0]):] if text.startswith(shown[0]) else '\n' + text)
            print('---------------')
        else:
            y = gen.generate(idx.repeat(num_samples, 1), max_new_tokens, **kw)
            for row in y.tolist():
                print(decode(row[skip:]))
                print('---------------')

"""
Measure a trained model: one job a run, named by its flag; each job is a function to call too.

$ python lab/evaluate.py --out_dir=out-s5 --eval_split=test_64          # token accuracy / exact match
$ python lab/evaluate.py --out_dir=out-s5 --start="0 1 1 0"            # no job flag: predicted vs true label per position
$ python lab/evaluate.py --out_dir=out-s5 --show_split=test_64 --show_row=3   # the same for a stored row
$ python lab/evaluate.py --out_dir=out/retrofit_tiny --eval_answers=test --max_new_tokens=16   # answer accuracy
$ python lab/evaluate.py --out_dir=out-s5 --trace=trace.png --trace_split=test --trace_row=0   # the state at work
$ python lab/evaluate.py --out_dir=out-s5 --jacobi_profile=profile.png  # how fast Jacobi reaches the exact states

The model and its dataset are found as sample.py finds them (--out_dir, --ckpt, --init_from,
--dataset, --data_root: checkpoint.load_model and find_data).

eval_split: token accuracy (argmax == label over the labelled positions) and exact match (every
labelled position of a row right) of the EXACT sequential recurrence on a task split, with the
accuracy by position; on a token corpus, bits per token under the exact recurrence, the training
scheme's approximation and the zero state.

show_labels (no job flag, or --show_split): labelled task data (prepare.py s5, s5_retrieval,
varassign, your own write_task: tokenizer 'task') is not sampled, since a predicted label is no next
input. The input (--start, space-separated token names, or row show_row of split show_split)
goes through ONE teacher-forced forward pass with the exact recurrence (mode='exact', what
generation computes), and a table shows per position the input token, the predicted label and
the true label (* = wrong), then the accuracy over the labelled positions. True labels: the
split's stored ones, or for a --start input of s5 / s5_retrieval recomputed from it
(tasks.task_labels); other tasks show none.

eval_answers: prompt/response data (prepare.py jsonl, gsm8k). A greedy answer to every prompt of
the split (prompt prefilled plainly by default, as trained; one pass per token; stop at eos),
and the exact-match accuracy of the final answer (sft.extract_answer: the number after '####',
else the last number) against the stored reference.

trace: the exact recurrence once on one input (row trace_row of task split trace_split, or the
--start prompt): per position the norm of the state read, the gates (T2MLR: tanh(g) sigmoid(f)
of the current and the recurrent path, mean and spread over channels; LRT: g_loc and g_fb per
reading layer, |gamma m| against |alpha x|), the prediction of the exact model and of the
zero-state model (mode='zero') and the label: a table on stdout, FILE.json, and FILE.png (needs
matplotlib).

jacobi_profile: Jacobi with D = 1..T passes on the first profile_rows rows of profile_split,
against the exact recurrence: a table, FILE.json, and FILE.png (with the --profile_with profiles).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: its modules are top level

import json
import math
import time
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import torch

from configurator import configure, device_setup, fail
from sample import encode_prompt, read_prompt
from support import diagnostics
from support.checkpoint import check_run_settings, find_data, finish_model, load_model, refuse_for_lstm
from support.dataset import check_out_file, get_tokenizer, load_answers, load_rec_mask, load_split, short
from support.diagnostics import corpus_loss, eval_modes, plot_trace, task_accuracy, trace_values
from support.sft import extract_answer
from support.tasks import position_kinds, task_labels, task_rec_mask

# -----------------------------------------------------------------------------
# eval_split: teacher-forced scores of a split

def eval_corpus(model, data_dir, meta, split, batch_size, ctx, scheme, T):
    """A token corpus's split read whole in windows of T tokens: bits per token (one character
    for char data) under the exact recurrence, the scheme's approximation and the zero state."""
    data = load_split(data_dir, split, meta)
    t0, res = time.time(), {}
    for tag, mode in eval_modes(scheme['mode'], model.config.recurrence != 'none'):
        tag = {'approx': scheme['mode'], 'zero': 'zero state'}.get(tag, 'plain' if mode == 'plain' else tag)
        loss, n = corpus_loss(model, data, T, mode=mode, batch_size=batch_size, ctx=ctx,
                              **{k: v for k, v in scheme.items() if k != 'mode'})
        res[tag] = loss / math.log(2)
    print(f"{meta['name']} {split}: {n:,} tokens in windows of {T}, bits per token: "
          + ', '.join(f"{v:.4f} ({k})" for k, v in res.items()) + f"  [{time.time() - t0:.1f}s]")
    return res


def eval_split(model, data_dir, meta, split, batch_size=64, ctx=nullcontext(), train_config=None):
    """Token accuracy and exact match of the exact recurrence on a task split, with accuracy by
    position and the step accuracy -> (acc, em). A token corpus: eval_corpus with the training
    length and scheme that train_config (the checkpoint's config) records -> {tag: bits}."""
    train_config = train_config or {}
    if meta['format'] != 'examples':
        scheme = {k: train_config.get(k, d) for k, d in (('n_iter', 8), ('n_grad', 4), ('n_subsets', 2))}
        scheme.update({k: train_config[k] for k in ('n_rounds', 'block_len') if k in train_config})  # the research model's
        scheme['mode'] = train_config.get('train_mode', 'plain')
        T = min(train_config.get('block_size') or model.config.block_size, model.config.block_size)
        return eval_corpus(model, data_dir, meta, split, batch_size, ctx, scheme, T)
    X, Y = load_split(data_dir, split, meta)  # (n, T) inputs and labels (-1: unlabelled)
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

# -----------------------------------------------------------------------------
# eval_answers: generated answers on prompt/response data

@torch.no_grad()
def eval_answers(model, data_dir, meta, split, decode, max_new_tokens, batch_size=64, ctx=nullcontext(),
                 prefill='plain', limit=0):
    """Exact-match accuracy of greedy answers on a prompt/response split. Each prompt (its stored
    tokens, exactly as in training) is prefilled with `prefill`, then one forward pass per token
    until eos or max_new_tokens; the final answer extracted from the text is compared with the
    stored reference. limit > 0: the first `limit` prompts only. Prompts of equal length run as one
    batch (no padding, so batching cannot change a row's tokens). -> (accuracy, {row: text}, {row: answer})."""
    refs = load_answers(data_dir, split, meta)
    X, _ = load_split(data_dir, split, meta)
    n = len(X) if limit <= 0 else min(limit, len(X))
    eos, block, device = meta['eos_token'], model.config.block_size, next(model.parameters()).device
    by_len = {}
    for i in range(n):
        by_len.setdefault(refs['prompt_len'][i], []).append(i)
    texts, preds, capped, t0 = {}, {}, 0, time.time()
    for P, rows in sorted(by_len.items()):
        new = min(max_new_tokens, block - P)  # the model cannot see past its block_size
        capped += len(rows) if new < max_new_tokens else 0
        for j in range(0, len(rows), batch_size):
            chunk = rows[j:j + batch_size]
            idx = torch.from_numpy(np.asarray(X[chunk, :P], dtype=np.int64)).to(device)  # (B, P)
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
# show_labels: predicted vs true label at every position of one input (labelled task data)

def split_row(data_dir, meta, split, row, what):
    """-> (ids, labels) of row `row` of task split `split`; bad names: one line (exit 2).
    what: the flags' prefix, for the message ('show' or 'trace')."""
    if meta['format'] != 'examples':
        fail(f"{what}_split needs a task dataset (examples format); {meta['name']} is a token corpus")
    if split not in meta['splits']:
        fail(f"no split {split!r} in {meta['name']} (it has {', '.join(meta['splits'])})")
    X, Y = load_split(data_dir, split, meta)
    if not 0 <= row < len(X):
        fail(f"{what}_row={row} is out of range: split {split} has {len(X)} rows")
    return X[row].astype(np.int64).tolist(), Y[row].astype(np.int64).tolist()


def rec_mask(meta, ids, device):
    """(1, T) bool: where the recurrence is on for this input, for task data that carries a mask
    (s5_retrieval's official layout: off on the dictionary and '|'); None: on everywhere."""
    m = None if meta is None else task_rec_mask(meta, ids)
    return None if m is None else torch.tensor([m], device=device)


@torch.no_grad()
def show_labels(model, ids, labels, name, title, ctx=nullcontext(), meta=None):
    """One teacher-forced forward over ids (exact recurrence, or the plain forward of a model
    without one) and a table: position, input token, predicted label, true label (labels: -1 =
    unlabelled; None = unknown, no such column), * where they differ. name(id) -> its text; meta:
    the task's, for its recurrence mask. Runs of unlabelled positions are folded into one line.
    -> (right, labelled)."""
    if len(ids) > model.config.block_size:
        fail(f"the input has {len(ids)} tokens, more than the model's block_size {model.config.block_size}")
    rec = model.config.recurrence != 'none'
    device = model.lm_head.weight.device
    idx = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    with ctx:
        logits, _ = model(idx, mode='exact', **diagnostics.masked(rec_mask(meta, ids, device)))  # no recurrence: plain
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


def trace(model, ids, labels, path, title, meta=None):
    """The trace of input ids (labels per position, or None): the table, path's .json and path
    (a picture, if matplotlib is installed); meta: the task's, for its recurrence mask. Bad input:
    one line (exit 2) before anything is written."""
    if model.config.recurrence == 'none':
        fail("nothing to trace: this model has no recurrence (recurrence='none')")
    if len(ids) > model.config.block_size:
        fail(f"the trace input has {len(ids)} tokens, more than the model's block_size {model.config.block_size}")
    device = model.lm_head.weight.device
    cols = trace_values(model, torch.tensor([ids], dtype=torch.long, device=device), labels, rec_mask(meta, ids, device))
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

# -----------------------------------------------------------------------------
# jacobi_profile: how fast Jacobi reaches the exact states

def read_profiles(paths):
    """{label: rows} of the profiles jacobi_profile wrote (FILE.json), comma-separated paths; a
    missing or foreign file is one line (read at start-up, before any work)."""
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


def jacobi_profile(model, data_dir, meta, path, label, split='test', rows=64, others=None):
    """Jacobi with D = 1..T passes on the first `rows` rows of task split `split`: the table,
    path's .json and path (a picture, with the profiles of others {label: rows} drawn in)."""
    if model.config.recurrence == 'none':
        fail("no Jacobi profile: this model has no recurrence (recurrence='none')")
    if meta['format'] != 'examples':
        fail(f"jacobi_profile needs a task dataset (examples format); {meta['name']} is a token corpus")
    X, _ = load_split(data_dir, split, meta)
    M = load_rec_mask(data_dir, split, meta)
    table = diagnostics.jacobi_profile(model, X[:rows], None if M is None else M[:rows])
    T = X.shape[1]
    print(f"{label}: Jacobi D = 1..{T} on {min(rows, len(X))} rows of {split} ({T} tokens), "
          f"against the exact recurrence (state exact: relative error <= 1e-3)")
    print(f"{'D':>4} {'state exact':>12} {'pred exact':>11} {'exact prefix':>13} {'min prefix':>11} {'max change':>11}")
    for r in table:
        mc = '-' if r['max_change'] is None else f"{r['max_change']:.2e}"
        print(f"{r['k']:4d} {r['state_exact']:12.4f} {r['pred_exact']:11.4f} {r['prefix']:13.2f} {r['prefix_min']:11d} {mc:>11}")
    json_path = os.path.splitext(path)[0] + '.json'
    with open(json_path, 'w') as f:
        json.dump({'label': label, 'split': split, 'T': T, 'rows': table}, f)
    print(f"wrote {json_path}", file=sys.stderr)
    try:
        diagnostics.plot_jacobi_profile({label: table, **(others or {})}, path, T)
        print(f"wrote {path}", file=sys.stderr)
    except ImportError:
        print("matplotlib is not installed: no picture (pip install matplotlib)", file=sys.stderr)
    return table

# -----------------------------------------------------------------------------
# the command line

JOBS = ('eval_split', 'eval_answers', 'show_split', 'trace', 'jacobi_profile')  # at most one a run; none: show --start
SETTINGS = dict(
    out_dir='out',          # init_from=resume reads out_dir/ckpt.pt (or best.pt)
    init_from='resume',     # 'resume', a .pt file, 'scratch' (a fresh tiny model), or a Hugging Face Llama name/folder
    ckpt='latest',          # init_from=resume: 'latest' (ckpt.pt) or 'best' (best.pt, best exact val loss)
    data_root='data',       # where datasets live (prepare.py writes them)
    dataset='',             # data_root/<dataset>; '' = what the checkpoint was trained on
    start='\n',             # show_labels / trace input: space-separated token names, or FILE:path
    eval_split='',          # job: score this split (e.g. test_64) with the exact recurrence
    eval_answers='',        # job: greedy answers to this split's prompts, exact-match accuracy (prompt/response data)
    eval_n=0,               # eval_answers: only the first eval_n prompts (0 = all)
    max_new_tokens=200,     # eval_answers: the longest answer
    prefill='',             # eval_answers: 'exact' | 'jacobi' | 'plain'; '' = plain for prompt/response data, else exact
    eval_batch_size=64,     # rows (eval_split) or prompts (eval_answers) a batch
    show_split='',          # job: show this task split's row show_row with its stored labels (instead of --start)
    show_row=0,             # show_split's row
    trace='',               # job: e.g. trace.png: gate and state trace of one input (also writes trace.json)
    trace_split='',         # the trace's input: a row of this task split (with its labels); '' = the --start input
    trace_row=0,            # trace_split's row
    jacobi_profile='',      # job: e.g. profile.png: how fast Jacobi reaches the exact states (also profile.json)
    profile_split='test',   # the profile's rows: the first profile_rows of this split
    profile_rows=64,        # the profile's row count
    profile_with='',        # more profiles to draw in the same picture: their .json files, comma-separated
    attn_window=-1,         # >= 0: this attention window instead of the model's (0 = full attention)
    seed=1337,              # torch's seed (a scratch model's weights)
    device='cpu',           # 'cpu', 'cuda', 'cuda:1', ...
    dtype='float32',        # 'float32' | 'bfloat16' (autocast)
)


def main(argv=None):
    cfg = dict(SETTINGS)
    given = configure(cfg, list(cfg), argv, doc=__doc__)
    c = SimpleNamespace(**cfg)
    check_run_settings(c.device, c.dtype, c.ckpt, c.prefill, c.attn_window)
    jobs = [k for k in JOBS if cfg[k]]
    if len(jobs) > 1:
        fail(f"one job a run: give {jobs[0]} or {jobs[1]}, not both")
    if c.max_new_tokens < 1 or c.eval_batch_size < 1:
        fail("max_new_tokens and eval_batch_size must be >= 1")
    if c.profile_rows < 1:
        fail(f"profile_rows={c.profile_rows}: must be >= 1 (the first rows of profile_split)")
    check_out_file('trace', c.trace)  # the picture and its .json (same folder) are written after the work
    check_out_file('jacobi_profile', c.jacobi_profile)
    others = read_profiles(c.profile_with)
    read_prompt(c.start)  # a missing or binary --start=FILE: one line before any model is loaded
    _, _, ctx = device_setup(c.device, c.dtype, c.seed, tf32=False)

    # the model, and the dataset it was trained on (for the tokenizer and the splits)
    model, train_config = load_model(c.init_from, c.out_dir, c.device, c.ckpt)
    refuse_for_lstm(model, {k: cfg[k] for k in ('prefill', 'attn_window', 'trace', 'jacobi_profile') if k in given})
    data_dir, meta = find_data(train_config, model, c.dataset, c.data_root, 'data_root' in given)
    encode, decode = get_tokenizer(meta) if not c.eval_split else (None, None)  # gpt2 offline fails here, before any model
    prefill = c.prefill or ('plain' if meta.get('rec_mask') else 'exact')  # as the model was trained
    task = meta['format'] == 'examples' and meta['tokenizer'] == 'task'  # labelled task data
    if c.eval_answers and not meta.get('rec_mask'):
        fail(f"eval_answers needs prompt/response data (prepare.py jsonl or gsm8k); {meta['name']} is not")
    if jobs in ([], ['show_split']) and not task:  # the label table needs labels
        fail(f"{meta['name']} is not labelled task data: no labels to show; give a job (eval_split, eval_answers, "
             f"trace, jacobi_profile), or sample it with python sample.py --start=...")
    model = finish_model(model, meta, c.device, c.attn_window)

    if c.jacobi_profile:
        label = f"{meta['name']}: {os.path.basename(os.path.normpath(c.out_dir))}"
        jacobi_profile(model, data_dir, meta, c.jacobi_profile, label, c.profile_split, c.profile_rows, others)
    elif c.trace:
        if c.trace_split:
            ids, labels = split_row(data_dir, meta, c.trace_split, c.trace_row, 'trace')
            title = f"{meta['name']} {c.trace_split} row {c.trace_row}"
        else:
            ids, _ = encode_prompt(read_prompt(c.start), meta, encode)
            # a corpus: the next token; a task: the labels if they follow from the input (s5), else none
            labels = ids[1:] + [-1] if meta['format'] != 'examples' else task_labels(meta, ids)
            title = f"{meta['name']}: {c.start[:40]}"
        mc = model.config
        trace(model, ids, labels, c.trace, f"{mc.recurrence} (s={mc.rec_start}, e={mc.rec_end}), {title}", meta)
    elif c.eval_split:
        eval_split(model, data_dir, meta, c.eval_split, c.eval_batch_size, ctx, train_config)
    elif c.eval_answers:
        eval_answers(model, data_dir, meta, c.eval_answers, decode, c.max_new_tokens, c.eval_batch_size, ctx, prefill,
                     c.eval_n)
    else:  # a labelled task: a predicted label is no next input, so show the labels teacher-forced instead
        if c.show_split:
            ids, labels = split_row(data_dir, meta, c.show_split, c.show_row, 'show')
            title = f"{meta['name']} {c.show_split} row {c.show_row}"
        else:
            ids, _ = encode_prompt(read_prompt(c.start), meta, encode)
            labels, title = task_labels(meta, ids), meta['name']
            if labels is None:
                print(f"note: no true labels for {meta['name']}: they are recomputed only for s5 and s5_retrieval data "
                      f"prepared by this version (meta.json 'task') and an input in the task's layout; "
                      f"--show_split=SPLIT --show_row=N shows a stored row with its labels", file=sys.stderr)
        show_labels(model, ids, labels, lambda i: decode([i]), title, ctx, meta)


if __name__ == '__main__':
    main()

"""
Sample from a trained model: the prompt is prefilled, then one forward pass per new token.

$ python sample.py --out_dir=out/stdlib_t2mlr --start="def "     # 3 samples (config/stdlib_t2mlr.py on prepare.py stdlib_char)
$ python sample.py --out_dir=out/stdlib_t2mlr --ckpt=best        # from best.pt (best exact val loss)
$ python sample.py --out_dir=out/stdlib_t2mlr --start=FILE:prompt.txt --num_samples=1   # streams tokens
$ python sample.py --init_from=scratch --dataset=stdlib_char --start="def "   # untrained smoke test
$ python sample.py --out_dir=out/t2mlr_small                    # task data: its labels of test_64's first row
$ python sample.py --out_dir=out/t2mlr_small --start=0110100111 # ... or of these bits

Generation is model.generate: one prefill of the prompt ('exact', 'jacobi' with prefill_iters
passes, or 'plain'), then one forward pass per new token with the KV cache and the recurrent
state. Samples go to stdout, each followed by a line of dashes; notes go to stderr.

Labelled task data (s5, varassign, ...) is not sampled (its targets are labels, not next inputs):
the model reads an input the way inference runs, model.prefill of the first token, then one
decode_step per token with the KV cache and the state, and its label at each token (the argmax)
is printed under the input, above the true labels where they are known (s5 and s5_retrieval
recompute them; a stored row has its own); one-character symbols without spaces. The input: --start, the task's symbols (one character
each, spaces allowed, when every symbol is one character; else space-separated), or, with --start
left out, the first row of the longest test split. The sampling settings do not apply to it.
Scores, label tables, traces and Jacobi profiles: lab/evaluate.py.
"""

import os
import sys
from contextlib import nullcontext

import torch

from configurator import compile_errors, configure, device_setup, fail
from engine import Engine
from model import KVCache
from support.checkpoint import check_run_settings, find_data, finish_model, load_model, refuse_for_lstm
from support.dataset import get_tokenizer, load_rec_mask, load_split
from support.tasks import task_labels, task_rec_mask

# -----------------------------------------------------------------------------
out_dir = 'out'          # init_from=resume reads out_dir/ckpt.pt (or best.pt)
init_from = 'resume'     # 'resume', a .pt file, 'scratch' (a fresh tiny model), or a Hugging Face Llama name/folder
ckpt = 'latest'          # init_from=resume: 'latest' (ckpt.pt) or 'best' (best.pt, best exact val loss)
data_root = 'data'       # where datasets live (prepare.py writes them)
dataset = ''             # its tokenizer: data_root/<dataset>; '' = what the checkpoint was trained on
start = '\n'             # the prompt, or FILE:path to read it from a file (task data: default = a test row)
num_samples = 3          # samples drawn at once, as one batch
max_new_tokens = 200     # tokens generated per sample
temperature = 0.8        # 0 = greedy
top_k = 200              # 0 = no top-k filter
prefill = ''             # 'exact' | 'jacobi' | 'plain'; '' = plain for prompt/response data (as trained), else exact
prefill_iters = 8        # Jacobi passes over the prompt for prefill='jacobi'
prefill_tol = -1.0       # >= 0: prefill='jacobi' iterates until no state moves by more than this
stream = True            # with num_samples=1, print each token as it is generated
attn_window = -1         # >= 0: this attention window instead of the model's (0 = full attention)
compile = False          # torch.compile the decode step and the exact prefill (engine.py)
seed = 1337              # the sampling generator's seed
device = 'cpu'           # 'cpu', 'cuda', 'cuda:1', ...
dtype = 'float32'        # 'float32' | 'bfloat16' (autocast)
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))]


def read_prompt(start):
    """--start: the text itself, or FILE:path. A missing or binary file is one line."""
    if not start.startswith('FILE:'):
        return start
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


def encode_prompt(text, meta, encode):
    """-> (ids, skip): the prompt's token ids, and how many leading ids are not the user's text:
    the reset token that starts every document of a gpt2 corpus goes in front, as in training."""
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
    """on_token callback that prints the new text: decodes all ids so far (1, t) and prints what
    follows the text shown, holding back a trailing U+FFFD (half a multi-byte character).
    -> (on_token, a one-item list holding the text shown so far)."""
    shown = [shown]

    def on_token(ids):
        text = decode(ids[0, skip:].tolist()).rstrip('\ufffd')
        if text.startswith(shown[0]):
            print(text[len(shown[0]):], end='', flush=True)
            shown[0] = text
    return on_token, shown


# -----------------------------------------------------------------------------
# labelled task data: the model's label at every input token, one forward pass per token

SAMPLING = ('num_samples', 'max_new_tokens', 'temperature', 'top_k', 'prefill', 'prefill_iters', 'prefill_tol',
            'stream', 'compile')  # settings of sampling that labelled task data has no use for


def task_input(text, meta):
    """--start for labelled task data -> its token ids: one symbol a character (spaces allowed)
    when every symbol of the task is one character (s5 Z2: 0110 or 0 1 1 0), else space-separated
    symbols. An empty input or a symbol the task lacks: one line naming the allowed symbols."""
    itos = meta['itos']
    stoi = {s: i for i, s in enumerate(itos)}
    single = all(len(s) == 1 for s in itos)
    pieces = [c for c in text if not c.isspace()] if single else text.split()
    allowed = ' '.join(itos[:40]) + (' ...' if len(itos) > 40 else '')
    how = 'one a character, spaces allowed' if single else 'space-separated'
    if not pieces:
        fail(f"the prompt is empty: give {meta['name']}'s symbols with --start=... ({how}: {allowed}), "
             f"or leave --start out for a test row")
    bad = next((p for p in pieces if p not in stoi), None)
    if bad is not None:
        fail(f"--start: {bad!r} is not a symbol of {meta['name']}; its symbols ({how}): {allowed}")
    return [stoi[p] for p in pieces]


def first_test_row(data_dir, meta):
    """The first row of the longest test split (the first of them if several) -> (ids, labels,
    recurrence mask or None, its name)."""
    splits = meta['splits']
    tests = [k for k in splits if k.startswith('test')] or list(splits)
    split = max(tests, key=lambda k: splits[k]['len'])
    X, Y = load_split(data_dir, split, meta)
    mask = load_rec_mask(data_dir, split, meta)
    return (X[0].astype('int64').tolist(), Y[0].astype('int64').tolist(),
            None if mask is None else mask[0].astype(bool).tolist(), f"{meta['name']} {split} row 0")


@torch.no_grad()
def labels_token_by_token(model, ids, mask, device, ctx=nullcontext()):
    """The model's label (argmax) at every token of ids, computed as inference runs: model.prefill
    of the first token ('exact'), then one decode_step per token with the KV cache and the state.
    mask: where the recurrence is on (off on a leading run: s5_retrieval's dictionary, prefilled
    'plain' as one call, as the exact forward runs it), None = everywhere. -> list of ints."""
    T = len(ids)
    if T > model.config.block_size:
        fail(f"the input has {T} tokens, more than the model's block_size {model.config.block_size}")
    cut = 0 if mask is None else next((t for t, on in enumerate(mask) if on), T)  # the leading run without recurrence
    if mask is not None and not all(mask[cut:]):
        fail("this input's recurrence is off after it is on: not one prefill and a decode step per token; "
             "lab/evaluate.py shows its labels")
    idx = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    first = max(cut, 1)
    cache = KVCache(model.config.n_layer, T)
    with ctx:
        logits, state, _ = model.prefill(idx[:, :first], cache, 'plain' if cut else 'exact')  # (the mode: an LSTM's is positional)
        out = [logits]  # (1, first, V), then (1, 1, V) a token
        for t in range(first, T):
            logits, state = model.decode_step(idx[:, t:t + 1], range(t, t + 1), state, cache)
            out.append(logits)
    return torch.cat(out, 1)[0].argmax(-1).tolist()


def print_labels(title, ids, pred, labels, name, sep=' ', width=80):
    """The input, the model's labels and the true ones (labels None: unknown, no such row; -1:
    unlabelled, '-'), column under column, sep between columns, wrapped to width; ^ under a
    wrong label. -> (right, labelled)."""
    rows = [('input', [name(i) for i in ids]), ('model', [name(i) for i in pred])]
    if labels is not None:
        rows.append(('true', [name(l) if l >= 0 else '-' for l in labels]))
        wrong = [l >= 0 and p != l for p, l in zip(pred, labels)]
    w = max(len(s) for _, r in rows for s in r)
    n = max(1, (width - 7 + len(sep)) // (w + len(sep)))  # symbols a line
    n = -(-len(ids) // -(-len(ids) // n))  # as many lines as needed, filled evenly
    print(title)
    for a in range(0, len(ids), n):
        if a:
            print()
        for key, r in rows:
            print(f"{key:<7}" + sep.join(f"{s:<{w}}" for s in r[a:a + n]).rstrip())
        if labels is not None and any(wrong[a:a + n]):
            print(' ' * 7 + sep.join(f"{'^' if x else '':<{w}}" for x in wrong[a:a + n]).rstrip())
    if labels is None:
        return 0, 0
    labelled = sum(l >= 0 for l in labels)
    right = labelled - sum(wrong)
    print(f"all {labelled} right" if right == labelled else f"{right} of {labelled} right (^ = wrong)")
    return right, labelled


def task_row(meta, data_dir, text):
    """The input of labelled task data: text (--start; None: the first row of the longest test
    split) -> (ids, true labels or None, recurrence mask or None, what it is)."""
    if text is None:
        return first_test_row(data_dir, meta)
    ids = task_input(text, meta)
    labels = task_labels(meta, ids)
    if labels is None:
        print(f"note: no true labels for {meta['name']}: they are recomputed only for s5 and s5_retrieval data "
              f"(an input in the task's layout); leave --start out for a stored row with its labels", file=sys.stderr)
    return ids, labels, task_rec_mask(meta, ids), f"{meta['name']}, --start"


def show_task(model, meta, row, device, ctx=nullcontext()):
    """sample.py on labelled task data: the input (row: task_row's), the model's label at every
    token, one forward pass per token, and the true labels where known. -> (right, labelled)."""
    ids, labels, mask, title = row
    pred = labels_token_by_token(model, ids, mask, device, ctx)
    if getattr(model.config, 'arch', 'gpt') == 'lstm':
        how = 'LSTM state'
    else:
        how = 'KV cache, no recurrence' if model.config.recurrence == 'none' else f"KV cache + {model.config.recurrence} state"
    itos = meta['itos']
    return print_labels(f"{title}: {len(ids)} tokens, one forward pass each ({how})", ids, pred, labels,
                        lambda i: itos[i] if 0 <= i < len(itos) else '\ufffd',
                        '' if all(len(s) == 1 for s in itos) else ' ')  # one-character symbols as --start takes them: 0110


if __name__ == '__main__':
    given = configure(globals(), config_keys, doc=__doc__)
    check_run_settings(device, dtype, ckpt, prefill, attn_window)
    if num_samples < 1 or max_new_tokens < 1:
        fail("num_samples and max_new_tokens must be >= 1")
    if temperature < 0:
        fail(f"temperature={temperature}: must be >= 0 (0 = greedy)")
    if top_k < 0:
        fail(f"top_k={top_k}: must be >= 1, or 0 for no top-k filter")
    if prefill_iters < 1:
        fail(f"prefill_iters={prefill_iters}: must be >= 1 (Jacobi passes over the prompt)")
    read_prompt(start)  # a missing or binary --start=FILE: one line before any model is loaded
    _, _, ctx = device_setup(device, dtype, seed, tf32=False)  # (no TF32: the same tokens as before)

    # the model, and the dataset it was trained on (for the tokenizer)
    model, train_config = load_model(init_from, out_dir, device, ckpt)
    refuse_for_lstm(model, {k: globals()[k] for k in ('prefill', 'prefill_iters', 'prefill_tol', 'attn_window') if k in given})
    data_dir, meta = find_data(train_config, model, dataset, data_root, 'data_root' in given)
    encode, decode = get_tokenizer(meta)  # before building anything: gpt2 offline fails here
    prefill = prefill or ('plain' if meta.get('rec_mask') else 'exact')  # as the model was trained
    if prefill_tol >= 0 and prefill != 'jacobi':  # it would be ignored
        fail(f"prefill_tol={prefill_tol} applies to prefill='jacobi' only (prefill is {prefill!r})")
    task = meta['format'] == 'examples' and meta['tokenizer'] == 'task'  # a predicted label is no next input
    if task and given & set(SAMPLING):
        k = next(k for k in SAMPLING if k in given)
        fail(f"{k}={globals()[k]!r} applies to sampling; {meta['name']} is labelled task data, not sampled: sample.py "
             f"shows the model's label at each input token (--start=..., or a test row without it)")
    row = task_row(meta, data_dir, read_prompt(start) if 'start' in given else None) if task else None  # before the model
    model = finish_model(model, meta, device, attn_window)
    if task:
        show_task(model, meta, row, device, ctx)
        raise SystemExit(0)

    ids, skip = encode_prompt(read_prompt(start), meta, encode)
    if len(ids) + max_new_tokens > model.config.block_size:
        fail(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's block_size {model.config.block_size}")
    idx = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T0)
    generator = torch.Generator(device=device).manual_seed(seed)
    kw = dict(temperature=temperature, top_k=top_k or None, prefill=prefill, prefill_iters=prefill_iters, generator=generator,
              prefill_tol=prefill_tol if prefill_tol >= 0 else None)
    gen = Engine(model, compile=True) if compile else model  # engine.py: the same steps, compiled
    with ctx, compile_errors() if compile else nullcontext():
        if num_samples == 1 and stream:  # the same loop, printing each token as it comes
            prompt_text = decode(ids[skip:]).rstrip('\ufffd')
            print(prompt_text, end='', flush=True)
            on_token, shown = printer(decode, skip, prompt_text)
            y = gen.generate(idx, max_new_tokens, on_token=on_token, **kw)  # (1, T0 + max_new_tokens)
            text = decode(y[0, skip:].tolist())
            print(text[len(shown[0]):] if text.startswith(shown[0]) else '\n' + text)
            print('---------------')
        else:
            y = gen.generate(idx.repeat(num_samples, 1), max_new_tokens, **kw)  # (num_samples, T0 + max_new_tokens)
            for row in y.tolist():
                print(decode(row[skip:]))
                print('---------------')

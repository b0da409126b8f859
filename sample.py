"""
Sample from a trained model: the prompt is prefilled, then one forward pass per new token.

$ python sample.py --out_dir=out/stdlib_t2mlr --start="def "     # 3 samples (config/stdlib_t2mlr.py on prepare.py stdlib_char)
$ python sample.py --out_dir=out/stdlib_t2mlr --ckpt=best        # from best.pt (best exact val loss)
$ python sample.py --out_dir=out/stdlib_t2mlr --start=FILE:prompt.txt --num_samples=1   # streams tokens
$ python sample.py --init_from=scratch --dataset=stdlib_char --start="def "   # untrained smoke test

Generation is model.generate: one prefill of the prompt ('exact', 'jacobi' with prefill_iters
passes, or 'plain'), then one forward pass per new token with the KV cache and the recurrent
state. Samples go to stdout, each followed by a line of dashes; notes go to stderr. Labelled
task data (s5, varassign, ...) is not sampled: its targets are labels, not next inputs.
Scores, label tables, traces and Jacobi profiles: lab/evaluate.py.
"""

import os
from contextlib import nullcontext

import torch

from configurator import compile_errors, configure, device_setup, fail
from engine import Engine
from support.checkpoint import check_run_settings, find_data, finish_model, load_model, refuse_for_lstm
from support.dataset import get_tokenizer

# -----------------------------------------------------------------------------
out_dir = 'out'          # init_from=resume reads out_dir/ckpt.pt (or best.pt)
init_from = 'resume'     # 'resume', a .pt file, 'scratch' (a fresh tiny model), or a Hugging Face Llama name/folder
ckpt = 'latest'          # init_from=resume: 'latest' (ckpt.pt) or 'best' (best.pt, best exact val loss)
data_root = 'data'       # where datasets live (prepare.py writes them)
dataset = ''             # its tokenizer: data_root/<dataset>; '' = what the checkpoint was trained on
start = '\n'             # the prompt, or FILE:path to read it from a file
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
    _, meta = find_data(train_config, model, dataset, data_root, 'data_root' in given)
    encode, decode = get_tokenizer(meta)  # before building anything: gpt2 offline fails here
    prefill = prefill or ('plain' if meta.get('rec_mask') else 'exact')  # as the model was trained
    if prefill_tol >= 0 and prefill != 'jacobi':  # it would be ignored
        fail(f"prefill_tol={prefill_tol} applies to prefill='jacobi' only (prefill is {prefill!r})")
    if meta['format'] == 'examples' and meta['tokenizer'] == 'task':  # a predicted label is no next input
        fail(f"{meta['name']} is labelled task data, not sampled: show its labels with "
             f"python lab/evaluate.py --start=... (or --show_split=SPLIT --show_row=N)")
    model = finish_model(model, meta, device, attn_window)

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

"""
Sample from a trained model, or score it on a task split with the exact recurrence.

$ python sample.py --out_dir=out --start="ROMEO:"              # 3 samples from out/ckpt.pt
$ python sample.py --out_dir=out --start=FILE:prompt.txt --num_samples=1   # streams tokens
$ python sample.py --out_dir=out-s5 --eval_split=test_64       # token accuracy / exact match
$ python sample.py --init_from=scratch --dataset=s5_Z2 --start="0 1 1"     # untrained smoke test
$ python sample.py --out_dir=out/retrofit_tiny --eval_answers=test --max_new_tokens=16   # answer accuracy

Generation is exactly model.generate: one prefill of the prompt (prefill='exact', 'jacobi'
with prefill_iters passes, or 'plain'), then one forward pass per new token with the KV
cache and the recurrent state. With num_samples=1 the same loop runs here, token by
token, so the text can be printed as it is produced. Datasets whose documents start with
a reset token (gpt2 corpora: <|endoftext|>) get it in front of the prompt, as in training.
Samples go to stdout, each followed by a line of dashes; notes go to stderr.

Prompt/response data (prepare.py jsonl, gsm8k: the recurrence runs on the response only) is
prefilled plainly by default, as it was trained. --eval_answers=SPLIT generates a greedy
answer to every prompt of the split (prompt prefilled, one pass per token, stop at eos) and
reports exact-match accuracy of the final answer (prepare.extract_answer: the number after
'####', else the last number) against the stored reference.
"""

import os
import sys
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

from configurator import configure, fail
from model import GPT, GPTConfig, CheckpointError, CompileError, load_checkpoint
from prepare import load_meta, load_split, load_answers, get_tokenizer, extract_answer

# -----------------------------------------------------------------------------
out_dir = 'out'
init_from = 'resume'     # 'resume' (out_dir/ckpt.pt), a path to a .pt file, 'scratch' (fresh tiny model), or a
                         # Hugging Face Llama name/folder: the pretrained model as it is (a baseline; give --dataset)
data_root = 'data'
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
compile = False          # torch.compile the decode step and the exact prefill's span step (compiled once, then fast)
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))]


def load_model(init_from, out_dir, device):
    """-> (model, ckpt config dict). Checkpoint problems end the program with one line."""
    if init_from == 'scratch':
        return None, {}
    if init_from != 'resume' and not init_from.endswith('.pt'):
        try:  # a pretrained Hugging Face model, recurrence off: the baseline a retrofit starts from
            return GPT.from_pretrained(init_from).to(device), {}
        except (CheckpointError, ImportError) as e:
            fail(str(e))
    path = os.path.join(out_dir, 'ckpt.pt') if init_from == 'resume' else init_from
    try:
        model, ckpt = load_checkpoint(path, device)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    return model, ckpt.get('config') or {}


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
        with open(path, encoding='utf-8') as f:
            return f.read()
    return start


def encode_prompt(text, meta, encode):
    """-> (ids, skip): the prompt's token ids and how many leading ids are not the user's
    text (the reset token that starts every document of a gpt2 corpus)."""
    ids = encode(text)
    reset = meta.get('reset_token')
    if reset is not None and (not ids or ids[0] != reset):
        return [reset] + ids, 1
    if not ids:
        hint = f" (tokens of {meta['name']}, space-separated: {' '.join(meta['itos'][:8])} ...)" if meta['tokenizer'] == 'task' else ''
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


@contextmanager
def compile_errors_fail():
    """--compile=True on a torch without a working compiler backend: one line, exit 2."""
    try:
        yield
    except CompileError as e:
        fail(str(e))


@torch.no_grad()
def evaluate(model, data_dir, meta, split, batch_size, device, ctx):
    """Token accuracy (argmax == y over positions with y != -1) and exact match (every
    labelled position of a row right) of the EXACT sequential recurrence on a task split."""
    if meta['format'] != 'examples':
        fail(f"eval_split needs a task dataset (examples format); {meta['name']} is a token corpus")
    X, Y = load_split(data_dir, split, meta)
    n, T = X.shape
    if T > model.config.block_size:
        fail(f"split {split} has rows of length {T}, more than the model's block_size {model.config.block_size}")
    correct = labelled = exact = 0
    t0 = time.time()
    for i in range(0, n, batch_size):
        x = torch.from_numpy(np.asarray(X[i:i + batch_size], dtype=np.int64)).to(device)
        y = torch.from_numpy(np.asarray(Y[i:i + batch_size], dtype=np.int64)).to(device)
        with ctx:
            logits, _ = model(x, mode='exact')
        mask = y != -1
        right = (logits.argmax(-1) == y) & mask
        correct += right.sum().item()
        labelled += mask.sum().item()
        exact += (right.sum(1) == mask.sum(1)).sum().item()
    print(f"{meta['name']} {split}: {n} rows x {T} tokens, exact recurrence: "
          f"token accuracy {correct / max(labelled, 1):.4f} ({correct}/{labelled}), "
          f"exact match {exact / n:.4f} ({exact}/{n})  [{time.time() - t0:.1f}s]")
    return correct / max(labelled, 1), exact / n


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


if __name__ == '__main__':
    configure(globals(), config_keys)
    if device.startswith('cuda') and not torch.cuda.is_available():
        fail(f"device={device} but torch.cuda.is_available() is False")
    if dtype not in ('float32', 'bfloat16'):
        fail(f"dtype={dtype}: expected float32 or bfloat16")
    if prefill not in ('', 'exact', 'jacobi', 'plain'):
        fail(f"prefill={prefill}: expected exact, jacobi or plain")
    if eval_split and eval_answers:
        fail("give eval_split (teacher-forced token accuracy) or eval_answers (generated answers), not both")
    if num_samples < 1 or max_new_tokens < 1 or eval_batch_size < 1:
        fail("num_samples, max_new_tokens and eval_batch_size must be >= 1")
    torch.manual_seed(seed)
    device_type = 'cuda' if device.startswith('cuda') else 'cpu'
    ctx = nullcontext() if dtype == 'float32' else torch.autocast(device_type, dtype=torch.bfloat16)

    # model, and the dataset it was trained on (for the tokenizer and the task splits)
    model, train_config = load_model(init_from, out_dir, device)
    if dataset:
        data_dir = os.path.join(data_root, dataset)
    elif train_config.get('dataset'):
        data_dir = os.path.join(train_config.get('data_root', data_root), train_config['dataset'])
    else:
        data_dir = None
    if data_dir is not None:
        meta = load_meta(data_dir)
    elif model is None or model.config.vocab_size >= 50257:
        meta = dict(name='gpt2', tokenizer='gpt2', reset_token=50256, vocab_size=50257, format='tokens')
        print("note: no dataset given or recorded in the checkpoint: using the GPT-2 tokenizer", file=sys.stderr)
    else:
        fail("the checkpoint records no dataset: give --dataset=NAME (a folder of data_root made by prepare.py)")
    if not eval_split:
        encode, decode = get_tokenizer(meta)  # before building anything: gpt2 offline fails here
    prefill = prefill or ('plain' if meta.get('rec_mask') else 'exact')  # as the model was trained
    if model is None:
        model = scratch_model(meta, device)
    if meta['vocab_size'] > model.config.vocab_size:
        fail(f"dataset {meta['name']} has {meta['vocab_size']} tokens but the model only {model.config.vocab_size}")
    if attn_window >= 0:  # e.g. test a full-attention model with a window (a diagnostic)
        model.config.attn_window = attn_window
    model.eval()
    print(f"model: {model.config.recurrence}, {model.config.n_layer} layers, d={model.config.n_embd}, "
          f"{model.get_num_params() / 1e6:.2f}M parameters; data: {meta['name']}", file=sys.stderr)

    if eval_split:
        evaluate(model, data_dir, meta, eval_split, eval_batch_size, device, ctx)
        sys.exit(0)
    if eval_answers:
        if not meta.get('rec_mask'):
            fail(f"eval_answers needs prompt/response data (prepare.py jsonl or gsm8k); {meta['name']} is not")
        evaluate_answers(model, data_dir, meta, eval_answers, max_new_tokens, eval_batch_size, device, ctx, prefill,
                         decode, eval_n)
        sys.exit(0)

    ids, skip = encode_prompt(read_prompt(start), meta, encode)
    if len(ids) + max_new_tokens > model.config.block_size:
        fail(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's block_size {model.config.block_size}")
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    kw = dict(temperature=temperature, top_k=top_k or None, prefill=prefill, prefill_iters=prefill_iters, generator=generator,
              compile=compile)
    with ctx, compile_errors_fail():
        if num_samples == 1 and stream:
            prompt_text = decode(ids[skip:]).rstrip('\ufffd')
            print(prompt_text, end='', flush=True)
            on_token, shown = printer(decode, skip, prompt_text)
            y = model.generate(idx, max_new_tokens, on_token=on_token, **kw)
            text = decode(y[0, skip:].tolist())
            print(text[len(shown[0]):] if text.startswith(shown[0]) else '\n' + text)
            print('---------------')
        else:
            y = model.generate(idx.repeat(num_samples, 1), max_new_tokens, **kw)
            for row in y.tolist():
                print(decode(row[skip:]))
                print('---------------')

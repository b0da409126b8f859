"""
Prompt/response data for fine-tuning a pretrained model (retrofit): jsonl, gsm8k, and the
offline miniature of the whole pipeline (tiny_retrofit_demo).
"""

import json
import os
import re
import sys

import numpy as np

from support.dataset import DATA_DIR, AtomicFile, DataError, begin_dataset, check_hub, dtype_for, hf_tokenizer, short, write_meta

# prompt/response data for fine-tuning a pretrained model (retrofit): jsonl, gsm8k
#
# Tokenized with the pretrained model's own tokenizer (transformers, imported only here). A row
# is the prompt followed by the response and its eos; the eos is the last TARGET, never an input:
#   x = p_0 .. p_{P-2} p_{P-1} r_0 .. r_{R-2}      (P + R - 1 input tokens)
#   y =  -1 ..  -1     r_0     r_1 .. r_{R-1}      (loss on the response only; r_{R-1} = eos)
#   m =   0 ..   0     0       1   ..  1           (the recurrence is on where the input is a response token)
# The last prompt token runs plain like the rest of the prompt: generation prefills the whole
# prompt plainly (generate(prefill='plain')) and the first generated token is the first that
# reads the state. Padding (after the row) has y = -1 and m = 0.


NUMBER = re.compile(r'-?\d[\d,]*(?:\.\d+)?')


def extract_answer(text):
    """The final answer of a worked solution, normalised for exact match: the first number after
    the last '####' (GSM8K's marker), else the last number in the text, else the text after the
    marker (or the whole text) stripped. Numbers lose commas and trailing zeros: '1,000.0' -> '1000'."""
    from decimal import Decimal, InvalidOperation
    marked = '####' in text
    tail = text.rsplit('####', 1)[1] if marked else text
    nums = NUMBER.findall(tail)
    if not nums:
        return tail.strip()
    num = (nums[0] if marked else nums[-1]).replace(',', '')
    try:
        return format(Decimal(num).normalize(), 'f')
    except InvalidOperation:
        return num


def encode_pair(tok, prompt, response, chat):
    """-> (prompt ids, response ids ending with eos). The prompt is encoded the way the tokenizer
    encodes a text (with the special tokens it adds, e.g. a BOS), or with chat=True wrapped in the
    model's chat template as one user turn with the assistant's turn opened. The response is
    encoded on its own, so the prompt's ids are exactly what generation is given."""
    if chat:
        if not getattr(tok, 'chat_template', None):
            raise DataError("--chat_template=True but the tokenizer has no chat template")
        text = tok.apply_chat_template([{'role': 'user', 'content': prompt}], tokenize=False, add_generation_prompt=True)
        p = tok.encode(text, add_special_tokens=False)
    else:
        p = tok.encode(prompt, add_special_tokens=True)
    return p, tok.encode(response, add_special_tokens=False) + [tok.eos_token_id]


def sft_rows(pairs, max_len, cut_long, pad):
    """Token pairs -> (x, y, m) arrays (n, len) padded to the longest row kept, plus the prompt
    lengths and indices of the rows kept, and how many were dropped / cut. A row longer than
    max_len is dropped, or with cut_long its response is cut to fit; a prompt that alone needs
    more than max_len positions is always dropped."""
    rows, plens, kept, dropped, cut = [], [], [], 0, 0
    for i, (p, r) in enumerate(pairs):
        x = p + r[:-1]
        y = [-1] * (len(p) - 1) + r
        m = [0] * len(p) + [1] * (len(r) - 1)
        if len(x) > max_len:
            if not cut_long or len(p) > max_len:
                dropped += 1
                continue
            x, y, m, cut = x[:max_len], y[:max_len], m[:max_len], cut + 1
        rows.append((x, y, m))
        plens.append(len(p))
        kept.append(i)
    T = max((len(x) for x, _, _ in rows), default=0)
    X = np.full((len(rows), T), pad, dtype=np.int64)
    Y = np.full((len(rows), T), -1, dtype=np.int32)
    M = np.zeros((len(rows), T), dtype=np.uint8)
    for j, (x, y, m) in enumerate(rows):
        X[j, :len(x)], Y[j, :len(y)], M[j, :len(m)] = x, y, m
    return (X, Y, M), plens, kept, dropped, cut


def write_sft(out_dir, name, splits, tok, tokenizer_name, cfg):
    """splits: {split: [{'prompt', 'response', optional 'answer'}]} -> a rec_mask examples dataset.
    train drops rows longer than --max_len; val/test keep them with the response cut (their
    reference answers are kept apart, so answer accuracy covers the whole split), dropping only
    rows whose prompt alone is too long. The reference answer of a row: extract_answer of its
    'answer' field if it has one, else of its response."""
    eos = tok.eos_token_id
    if eos is None:
        raise DataError(f"the tokenizer {tokenizer_name} has no eos token: a response must end with one")
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos  # padding carries no loss and no state
    vocab_size = len(tok)
    dtype = dtype_for(vocab_size)
    begin_dataset(out_dir)
    info = {}
    for split, records in splits.items():
        pairs = [encode_pair(tok, r['prompt'], r['response'], cfg['chat_template']) for r in records]
        (X, Y, M), plens, kept, dropped, cut = sft_rows(pairs, cfg['max_len'], split != 'train', pad)
        if not kept:
            raise DataError(f"split {split}: no example fits in --max_len={cfg['max_len']} tokens")
        for fname, arr, dt in ((f"{split}_x.bin", X, dtype), (f"{split}_y.bin", Y, np.int32), (f"{split}_m.bin", M, np.uint8)):
            with AtomicFile(os.path.join(out_dir, fname)) as f:
                f.write(np.ascontiguousarray(arr, dtype=dt).tobytes())
        info[split] = {'n': len(kept), 'len': X.shape[1], 'dropped': dropped, 'truncated': cut}
        if split != 'train':
            refs = [extract_answer(str(records[i].get('answer', records[i]['response']))) for i in kept]
            with AtomicFile(os.path.join(out_dir, f"{split}_answers.json"), 'w') as f:
                json.dump({'prompt_len': plens, 'answer': refs}, f)
            info[split]['answers'] = True
        if dropped or cut:
            print(f"{split}: {dropped} rows longer than --max_len={cfg['max_len']} dropped, {cut} cut", file=sys.stderr)
    local = os.path.isdir(os.path.expanduser(tokenizer_name))
    write_meta(out_dir, dict(
        name=name, format='examples', vocab_size=vocab_size, dtype=dtype, tokenizer='hf',
        hf_tokenizer=os.path.abspath(os.path.expanduser(tokenizer_name)) if local else tokenizer_name,
        itos=None, reset_token=None, rec_mask=True, pad_token=pad, eos_token=eos,
        prompt_format='chat' if cfg['chat_template'] else 'plain', splits=info, args=cfg))


def read_jsonl(path):
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    records = []
    with open(path, encoding='utf-8') as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{i}: not a JSON line ({e.msg})") from None
            if not (isinstance(r, dict) and isinstance(r.get('prompt'), str) and isinstance(r.get('response'), str)):
                raise DataError(f'{path}:{i}: expected {{"prompt": str, "response": str}} (and optionally "answer")')
            records.append(r)
    if not records:
        raise DataError(f"{path} holds no records")
    return records


JSONL_DEFAULTS = dict(input='', tokenizer='', val_input='', test_input='', val_frac=0.05, test_frac=0.05, max_len=1024,
                      chat_template=False, seed=1337, name='', out_dir='')


def prepare_jsonl(cfg):
    """Prompt/response records, one JSON object a line: {"prompt": ..., "response": ..., "answer": ...
    (optional: the reference final answer; else extract_answer(response))}. val and test come from
    their own files (--val_input, --test_input) or from a seeded random --val_frac / --test_frac of
    --input (at least one row each if the fraction is > 0; --test_frac=0 makes no test split)."""
    if not cfg['input'] or not cfg['tokenizer']:
        raise DataError("jsonl needs --input=FILE.jsonl and --tokenizer=<the pretrained model's Hub name or folder>")
    tok = hf_tokenizer(cfg['tokenizer'])  # fail fast, before reading anything
    records = read_jsonl(cfg['input'])
    order = np.random.default_rng(cfg['seed']).permutation(len(records))
    splits, start = {}, 0
    for split in ('val', 'test'):
        path, frac = cfg[f'{split}_input'], cfg[f'{split}_frac']
        if path:
            splits[split] = read_jsonl(path)
            continue
        if not 0 <= frac < 1:
            raise DataError(f"--{split}_frac={frac}: need 0 <= {split}_frac < 1")
        k = max(1, round(frac * len(records))) if frac > 0 else 0
        if k:
            splits[split] = [records[i] for i in sorted(order[start:start + k])]
        start += k
    if 'val' not in splits:
        raise DataError("jsonl needs a val split: --val_frac > 0 or --val_input=FILE")
    train = [records[i] for i in sorted(order[start:])]
    if not train:
        raise DataError(f"{cfg['input']}: nothing left for train after val/test ({len(records)} records)")
    name = cfg['name'] or os.path.splitext(os.path.basename(cfg['input']))[0]
    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, name)
    write_sft(out_dir, name, {'train': train, **splits}, tok, cfg['tokenizer'], cfg)
    return out_dir


GSM8K_DEFAULTS = dict(tokenizer='HuggingFaceTB/SmolLM2-1.7B-Instruct', n_val=200, max_len=512, chat_template=False,
                      strip_calc=True, seed=1337, cache_dir='', name='gsm8k', out_dir='')


def gsm8k_record(row, strip_calc):
    """prompt = question + newline; response = the worked solution ending '#### <answer>';
    strip_calc drops the calculator annotations <<48/2=24>> of the original data."""
    solution = re.sub(r'<<[^>]*>>', '', row['answer']) if strip_calc else row['answer']
    return dict(prompt=row['question'].strip() + '\n', response=solution.strip(), answer=extract_answer(solution))


def prepare_gsm8k(cfg):
    """openai/gsm8k 'main' from the Hub: its train split (less n_val seeded random rows for val)
    and its test split (1319 problems, for answer accuracy). Only GSM8K itself: for GSM8K-Aug or
    other math data, write JSONL and use `prepare.py jsonl`."""
    tok = hf_tokenizer(cfg['tokenizer'])  # fail fast, before the download
    check_hub('openai/gsm8k', ", or write the data as JSONL and use `python prepare.py jsonl --input=FILE`")

    def load(split):
        try:
            from datasets import load_dataset
            return list(load_dataset('openai/gsm8k', 'main', split=split, cache_dir=cfg['cache_dir'] or None))
        except Exception as e:
            raise DataError(f"could not load openai/gsm8k (main) split {split} from the Hugging Face Hub ({short(e)}). "
                            f"Connect to the internet (the download is cached), or write the data as JSONL and use "
                            f"`python prepare.py jsonl --input=FILE`") from None

    train = [gsm8k_record(r, cfg['strip_calc']) for r in load('train')]
    test = [gsm8k_record(r, cfg['strip_calc']) for r in load('test')]
    if not 0 < cfg['n_val'] < len(train):
        raise DataError(f"--n_val={cfg['n_val']}: need 0 < n_val < {len(train)}")
    order = np.random.default_rng(cfg['seed']).permutation(len(train))
    val_rows = set(order[:cfg['n_val']].tolist())
    splits = {'train': [r for i, r in enumerate(train) if i not in val_rows],
              'val': [r for i, r in enumerate(train) if i in val_rows], 'test': test}
    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, cfg['name'])
    write_sft(out_dir, cfg['name'], splits, tok, cfg['tokenizer'], cfg)
    return out_dir

# -----------------------------------------------------------------------------
# tiny_retrofit_demo: the retrofit pipeline offline, with a tiny random Llama in place of SmolLM2

DEMO_CHARS = '0123456789 +=#\n'


def make_tiny_tokenizer(path, chars=DEMO_CHARS):
    """A character-level tokenizer (tokenizers WordLevel, one token per character) saved as a
    transformers tokenizer folder: <pad> 0, <eos> 1, <unk> 2, then the characters."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {t: i for i, t in enumerate(['<pad>', '<eos>', '<unk>'] + list(chars))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r'[\s\S]'), behavior='isolated')  # every character a token
    tk.decoder = decoders.Fuse()  # decode joins them without spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token='<pad>', eos_token='<eos>', unk_token='<unk>')
    tok.save_pretrained(path)
    return tok


def make_tiny_llama(path, vocab_size, seed=0, **overrides):
    """A small random LlamaForCausalLM (SmolLM2's architecture: GQA, tied embeddings) saved to path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    args = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rope_theta=10000.0, tie_word_embeddings=True,
                pad_token_id=0, bos_token_id=None, eos_token_id=1)
    args.update(overrides)
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**args)).save_pretrained(path)


def running_sums(rng, n, digits):
    """A GSM8K-shaped toy: prompt '3+1+4=\\n', response '3 4 8 #### 8', the running sum mod 10
    worked out step by step, then the final answer after '####'. n distinct prompts (at most
    10^digits), so no prompt of val/test is also in train."""
    for code in rng.choice(10 ** digits, size=min(n, 10 ** digits), replace=False):
        d = [int(c) for c in f"{code:0{digits}d}"]
        s = np.cumsum(d) % 10
        yield dict(prompt='+'.join(map(str, d)) + '=\n', response=' '.join(map(str, s)) + f' #### {s[-1]}')


DEMO_DEFAULTS = dict(n_records=1000, digits=3, seed=1337, out_dir='', name='tiny_sums')


def prepare_tiny_retrofit_demo(cfg):
    """Writes out_dir (default data/tiny_retrofit_demo): llama/ = a tiny random Llama checkpoint
    with its tokenizer (what a Hub download of SmolLM2 would give, in miniature) and sums.jsonl;
    then prepares the JSONL exactly like
        python prepare.py jsonl --input=<out_dir>/sums.jsonl --tokenizer=<out_dir>/llama --name=tiny_sums --max_len=64
    into data/tiny_sums (next to out_dir when one is given), so that
    `python lab/train.py config/retrofit_tiny.py` runs next. Offline, no download."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise DataError("tiny_retrofit_demo needs the optional package transformers: pip install transformers") from None
    root = cfg['out_dir'] or os.path.join(DATA_DIR, 'tiny_retrofit_demo')
    llama, src = os.path.join(root, 'llama'), os.path.join(root, 'sums.jsonl')
    os.makedirs(root, exist_ok=True)
    tok = make_tiny_tokenizer(llama)
    make_tiny_llama(llama, vocab_size=32, seed=cfg['seed'])  # vocab padded past the tokenizer's 18, as real models often are
    rng = np.random.default_rng(cfg['seed'])
    with AtomicFile(src, 'w') as f:
        for r in running_sums(rng, cfg['n_records'], cfg['digits']):
            f.write(json.dumps(r) + '\n')
    print(f"wrote {llama} (random Llama, vocab 32; tokenizer {len(tok)} tokens) and {src} ({cfg['n_records']} records)")
    jcfg = dict(JSONL_DEFAULTS, input=src, tokenizer=llama, name=cfg['name'], max_len=64, seed=cfg['seed'],
                out_dir=os.path.join(os.path.dirname(os.path.normpath(root)), cfg['name']) if cfg['out_dir'] else '')
    return prepare_jsonl(jcfg)

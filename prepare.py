"""
Prepare a dataset for train.py and sample.py, and read it back.

    python prepare.py s5 --group=S5                    # state tracking       -> data/s5_S5
    python prepare.py s5 --group=Z2 --train_len=32     # parity               -> data/s5_Z2
    python prepare.py s5_retrieval --group=S5          # T2MLR S5-Retrieval   -> data/s5_retrieval_S5
    python prepare.py varassign --depth=4              # variable assignment  -> data/varassign
    python prepare.py text --input=input.txt --tokenizer=char   # local text  -> data/input
    python prepare.py tinystories --max_tokens=100e6   # Hub corpora, GPT-2 tokens (needs internet)
    python prepare.py fineweb_edu --num_proc=16
    python prepare.py jsonl --input=data.jsonl --tokenizer=HuggingFaceTB/SmolLM2-1.7B-Instruct  # prompt/response
    python prepare.py gsm8k --tokenizer=HuggingFaceTB/SmolLM2-1.7B-Instruct   # GSM8K for fine-tuning (needs internet)
    python prepare.py tiny_retrofit_demo               # offline: a tiny random Llama + tokenizer + JSONL, prepared

Every option is --key=value; `python prepare.py NAME --help` lists NAME's options.
Downloads wait at most FETCH_TIMEOUT seconds (environment variable, default 30) for an answer.

The format (the contract train.py and sample.py rely on). A dataset is a folder
holding meta.json and binary files:

  meta.json  {"name", "format": "tokens" | "examples", "vocab_size", "dtype": "uint16" | "uint32",
              "tokenizer": "char" | "gpt2" | "task" | "hf", "itos": [str] (char/task: index = token id),
              "hf_tokenizer": the pretrained tokenizer's Hub name or folder (hf only),
              "reset_token": int | null (the token that starts a document; the recurrent state is
              reset there: <|endoftext|> = 50256 for gpt2, null otherwise),
              "bytes_per_token": {split: float} (tokens format: UTF-8 bytes / tokens, for bits per byte),
              "splits": {split: {"n": tokens | rows, "len": row length (examples only), ...}},
              "task": {"name": "s5" | "s5_retrieval", "group": str, "k": int (s5_retrieval)} (only the
              built-in tasks whose labels follow from the input: what task_labels needs to recompute them),
              "args": the options used, "version": 1}
  tokens     {split}.bin, split in (train, val): one flat token stream in `dtype` (np.memmap it).
             gpt2 corpora: every document is PRECEDED by <|endoftext|>, so the reset token starts it.
  examples   {split}_x.bin (dtype, (n, len) row-major) input tokens and {split}_y.bin (int32,
             (n, len)) ALIGNED targets: y[t] is what the model must output at position t (not the
             shifted inputs), -1 = no loss. Splits train, val, test at the training length and
             test_<N> at longer lengths (N = the task's length parameter, see each task).
  rec_mask   prompt/response data (jsonl, gsm8k; meta "rec_mask": true, "pad_token", "eos_token"):
             examples rows plus {split}_m.bin (uint8, (n, len)): 1 where the recurrence is on (the
             response), 0 on the prompt and padding; and, for val/test, {split}_answers.json
             {"prompt_len": [int], "answer": [str]} per row (for answer accuracy, sample.py).

Writes are atomic: each file goes to a temporary name in the same folder and is os.replace'd,
an old meta.json is deleted before anything else is written, and the new one is written LAST.
load_meta() also checks every file's size, so an interrupted run is never accepted.
"""

import itertools
import json
import os
import re
import sys
import zlib

import numpy as np

from configurator import parse_bool  # the one command-line bool rule of all scripts

DATA_DIR = 'data'  # datasets go to data/<name>, relative to where you run (train.py's data_root)
FORMAT_VERSION = 1
GPT2_EOT = 50256
SHARD_TOKENS = 1 << 24  # token corpora are appended to their .bin in shards of this many tokens

# -----------------------------------------------------------------------------
# one-line errors and the --key=value parser

class DataError(SystemExit):
    """A bad dataset or bad input. A SystemExit, so an uncaught one prints its one-line
    message (no traceback) and exits 1; callers can still catch it by name."""
    def __init__(self, msg):
        super().__init__(f"error: {msg}")


def die(msg, code=1):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def parse_value(key, val, default):
    """Parse the string val to the type of default (bool, int, float or str)."""
    kind = type(default)
    try:
        if kind is bool:
            if parse_bool(val) is None:
                raise ValueError
            return parse_bool(val)
        if kind is int:
            try:
                return int(val)
            except ValueError:  # allow 1e9 and 100e6 for counts
                f = float(val)
                if not f.is_integer():
                    raise
                return int(f)
        if kind is float:
            return float(val)
        return val
    except ValueError:
        die(f"--{key}={val}: expected {'True/False' if kind is bool else kind.__name__}", 2)


def parse_args(argv, defaults):
    """--key=value overrides of a dict of defaults -> new dict. Unknown key or bad type:
    one line on stderr and exit 2."""
    config = dict(defaults)
    for arg in argv:
        if not (arg.startswith('--') and '=' in arg):
            die(f"expected --key=value, got {arg!r} (options: {', '.join('--' + k for k in defaults)})", 2)
        key, val = arg[2:].split('=', 1)
        if key not in defaults:
            die(f"unknown option --{key} (options: {', '.join('--' + k for k in defaults)})", 2)
        config[key] = parse_value(key, val, defaults[key])
    return config


def short(e, n=160):
    """An exception as one short line."""
    lines = str(e).strip().splitlines()
    msg = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return msg if len(msg) <= n else msg[:n - 3] + '...'

# -----------------------------------------------------------------------------
# reading a dataset: load_meta, load_split, get_tokenizer

def split_files(meta, split):
    if meta['format'] == 'tokens':
        return [(f"{split}.bin", meta['dtype'], meta['splits'][split]['n'])]
    n, T = meta['splits'][split]['n'], meta['splits'][split]['len']
    files = [(f"{split}_x.bin", meta['dtype'], n * T), (f"{split}_y.bin", 'int32', n * T)]
    if meta.get('rec_mask'):
        files.append((f"{split}_m.bin", 'uint8', n * T))
    return files


def load_meta(data_dir):
    """Read and check data_dir/meta.json, and that every file it lists is complete."""
    path = os.path.join(data_dir, 'meta.json')
    # not only the built-in names: a dataset can be any folder that write_task (or the format above) made
    hint = (f"run `python prepare.py TASK ...` for a built-in task ({', '.join(TASKS)}), or write your own "
            f"with prepare.py's write_task (see README 'Add your own task')")
    if not os.path.isdir(data_dir):
        raise DataError(f"no dataset at {data_dir} (no such folder, so no meta.json): {hint}")
    if not os.path.isfile(path):
        raise DataError(f"{data_dir} has no meta.json (never prepared, or the preparation was interrupted): {hint}")
    try:
        with open(path) as f:
            meta = json.load(f)
        if meta['version'] != FORMAT_VERSION:
            raise DataError(f"{path} has format version {meta['version']}, this code reads {FORMAT_VERSION}: re-run prepare.py")
        assert meta['format'] in ('tokens', 'examples') and meta['dtype'] in ('uint16', 'uint32')
        assert isinstance(meta['vocab_size'], int) and isinstance(meta['splits'], dict) and meta['splits']
        for split in meta['splits']:
            for fname, dtype, count in split_files(meta, split):
                fpath = os.path.join(data_dir, fname)
                want = count * np.dtype(dtype).itemsize
                if not os.path.isfile(fpath) or os.path.getsize(fpath) != want:
                    raise DataError(f"{fpath} is missing or has the wrong size (expected {want} bytes): re-run prepare.py")
    except (ValueError, KeyError, TypeError, AssertionError) as e:
        raise DataError(f"{path} is not a valid meta.json ({short(e)}): re-run prepare.py") from None
    return meta


def load_split(data_dir, split, meta=None):
    """tokens format: a 1-D np.memmap of the split's tokens.
    examples format: (x, y) np.memmaps of shape (n, len), inputs and aligned targets."""
    meta = meta if meta is not None else load_meta(data_dir)
    if split not in meta['splits']:
        raise DataError(f"{data_dir} has no split {split!r}; available: {', '.join(meta['splits'])}")
    arrays = [np.memmap(os.path.join(data_dir, fname), dtype=dtype, mode='r')
              for fname, dtype, _ in split_files(meta, split)[:2]]
    if meta['format'] == 'tokens':
        return arrays[0]
    T = meta['splits'][split]['len']
    return tuple(a.reshape(-1, T) for a in arrays)


def load_rec_mask(data_dir, split, meta):
    """Prompt/response data: the (n, len) bool mask of where the recurrence is on (the
    response positions). None for data without one (the recurrence is on everywhere)."""
    if not meta.get('rec_mask'):
        return None
    T = meta['splits'][split]['len']
    return np.memmap(os.path.join(data_dir, f"{split}_m.bin"), dtype=np.uint8, mode='r').reshape(-1, T)


def load_answers(data_dir, split, meta):
    """Prompt/response data: {"prompt_len": [...], "answer": [...]}, one entry per row."""
    path = os.path.join(data_dir, f"{split}_answers.json")
    if not meta['splits'].get(split, {}).get('answers') or not os.path.isfile(path):
        have = [s for s, v in meta['splits'].items() if v.get('answers')]
        raise DataError(f"{data_dir} has no reference answers for split {split!r} (prompt/response data made by "
                        f"prepare.py jsonl or gsm8k has them for: {', '.join(have) or 'none'})")
    with open(path) as f:
        answers = json.load(f)
    if len(answers['answer']) != meta['splits'][split]['n']:
        raise DataError(f"{path} does not match the split (re-run prepare.py)")
    return answers


# Downloads wait at most FETCH_TIMEOUT seconds for an answer (env FETCH_TIMEOUT, default 30): a
# network that drops packets instead of refusing must end with one line, not hang forever.
FETCH_TIMEOUT = float(os.environ.get('FETCH_TIMEOUT') or 30)
GPT2_OFFLINE = ("tiktoken downloads its vocabulary once: connect to the internet (or set TIKTOKEN_CACHE_DIR to "
                "a cache that holds it), or use a char-level dataset (prepare.py text --tokenizer=char)")


def gpt2_encoding():
    """tiktoken's GPT-2 encoding. Its first use downloads the vocabulary with no timeout
    (requests.get), so it runs in a daemon thread that we wait for at most FETCH_TIMEOUT
    seconds (the files are small: ~1.5 MB); a fetch still hanging then is abandoned."""
    import threading
    result = {}

    def load():
        try:
            import tiktoken
            result['enc'] = tiktoken.get_encoding('gpt2')
        except Exception as e:
            result['error'] = e
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(FETCH_TIMEOUT)
    if worker.is_alive():
        raise DataError(f"could not fetch the GPT-2 tokenizer: no answer within {FETCH_TIMEOUT:g} s "
                        f"(FETCH_TIMEOUT). {GPT2_OFFLINE}")
    if 'error' in result:
        raise DataError(f"could not load the GPT-2 tokenizer ({short(result['error'])}). {GPT2_OFFLINE}")
    return result['enc']


def check_hub(what, hint=', or give a local folder'):
    """Before a Hugging Face Hub download: does the Hub answer within FETCH_TIMEOUT seconds?
    (Its client retries timeouts for minutes.) No answer: one line, how to work offline.
    With HF_HUB_OFFLINE=1 nothing is fetched (the local cache only), so nothing is checked."""
    if os.environ.get('HF_HUB_OFFLINE', '').lower() in ('1', 'true', 'yes', 'on'):
        return
    try:
        from huggingface_hub import constants
        if constants.HF_HUB_OFFLINE:
            return
    except ImportError:
        pass
    import urllib.error
    import urllib.request
    endpoint = os.environ.get('HF_ENDPOINT', 'https://huggingface.co').rstrip('/')
    try:  # the proxy settings of the environment apply (HTTPS_PROXY, ...), as for the Hub client
        urllib.request.urlopen(urllib.request.Request(endpoint + '/api/whoami-v2', method='HEAD'), timeout=FETCH_TIMEOUT)
    except urllib.error.HTTPError:
        pass  # it answered (401 without a token): the Hub is reachable
    except Exception as e:
        raise DataError(f"could not fetch {what} from the Hugging Face Hub: {endpoint} did not answer "
                        f"({short(e)}; waited at most {FETCH_TIMEOUT:g} s, FETCH_TIMEOUT). Connect to the internet, "
                        f"or work offline: HF_HUB_OFFLINE=1 uses the local cache only{hint}") from None


def get_tokenizer(meta):
    """-> (encode, decode): str -> list[int], list[int] -> str.
    char: one token per character. task: whitespace-separated words, each one token (decode
    joins them with spaces). gpt2: tiktoken; <|endoftext|> may be written in the text.
    hf: the pretrained model's own tokenizer (transformers), with the special tokens it adds (e.g. a
    BOS), as prepare.py encodes a plain prompt (the chat template of chat-format data is not applied)."""
    kind = meta['tokenizer']
    if kind == 'hf':
        tok = hf_tokenizer(meta['hf_tokenizer'])
        encode = lambda s: tok.encode(s, add_special_tokens=True)
        decode = lambda ids: tok.decode([i for i in ids if 0 <= i < len(tok)])  # padded vocab ids dropped
        return encode, decode
    if kind == 'gpt2':
        enc = gpt2_encoding()
        encode = lambda s: enc.encode(s, allowed_special={'<|endoftext|>'})
        decode = lambda ids: enc.decode([i for i in ids if 0 <= i < enc.n_vocab])  # padded vocab ids dropped
        return encode, decode
    itos = meta['itos']
    stoi = {s: i for i, s in enumerate(itos)}
    unk = '\ufffd'  # a model with a padded vocab can sample ids past itos

    def lookup(pieces):
        bad = [p for p in pieces if p not in stoi]
        if bad:
            raise DataError(f"{bad[0]!r} is not in the vocabulary of {meta['name']} "
                            f"(it has {', '.join(map(repr, itos[:40]))}{' ...' if len(itos) > 40 else ''})")
        return [stoi[p] for p in pieces]

    if kind == 'char':
        return (lambda s: lookup(list(s))), (lambda ids: ''.join(itos[i] if 0 <= i < len(itos) else unk for i in ids))
    if kind == 'task':
        return (lambda s: lookup(s.split())), (lambda ids: ' '.join(itos[i] if 0 <= i < len(itos) else unk for i in ids))
    raise DataError(f"unknown tokenizer {kind!r} in meta.json of {meta['name']}")

# -----------------------------------------------------------------------------
# writing a dataset: temp name + os.replace per file, meta.json last

def dtype_for(vocab_size):
    return 'uint16' if vocab_size <= 65535 else 'uint32'


def begin_dataset(out_dir):
    """Create out_dir and delete an old meta.json first: from here until the new meta.json
    lands, the folder is not a dataset (a crash half-way leaves nothing loadable)."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create the dataset folder {out_dir} ({short(e)})") from None
    try:
        os.remove(os.path.join(out_dir, 'meta.json'))
    except FileNotFoundError:
        pass


class AtomicFile:
    """open() for writing to a temp name in the same folder: commit() renames it over
    `path`, abort() deletes it. As a with-block: commit if the block completes, else abort."""
    def __init__(self, path, mode='wb'):
        self.path, self.tmp = path, f"{path}.tmp.{os.getpid()}"
        self.f = open(self.tmp, mode)

    def commit(self):
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)

    def abort(self):
        if not self.f.closed:
            self.f.close()
            os.remove(self.tmp)

    def __enter__(self):
        return self.f

    def __exit__(self, exc_type, exc, tb):
        self.commit() if exc_type is None else self.abort()


def write_meta(out_dir, meta):
    meta = dict(meta, version=FORMAT_VERSION)
    with AtomicFile(os.path.join(out_dir, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1)


def write_examples(out_dir, split, generate, n, dtype, seed):
    """Write one examples split, generated in chunks of rows so that huge splits never sit
    in memory. Each split has its own RNG stream (seed, crc32(split)): the contents of one
    split do not depend on the sizes of the others. generate(rng, rows) -> (x, y) (rows, len)."""
    if n < 1:
        raise DataError(f"split {split} needs at least 1 row, got n={n}")
    rng = np.random.default_rng([seed, zlib.crc32(split.encode())])
    T = None
    with AtomicFile(os.path.join(out_dir, f"{split}_x.bin")) as fx, \
         AtomicFile(os.path.join(out_dir, f"{split}_y.bin")) as fy:
        for start in range(0, n, 4096):
            x, y = generate(rng, min(4096, n - start))
            T = x.shape[1]
            fx.write(np.ascontiguousarray(x, dtype=dtype).tobytes())
            fy.write(np.ascontiguousarray(y, dtype=np.int32).tobytes())
    return {'n': n, 'len': T}


def parse_lens(s, what):
    try:
        return [int(v) for v in s.split(',') if v.strip()]
    except ValueError:
        raise DataError(f"--{what}={s}: expected a comma list of integers, e.g. 48,64") from None


def write_task(out_dir, cfg, name, itos, make_gen, sizes, **extra):
    """Write the splits of a synthetic task and its meta. sizes: [(split, n, length param)],
    make_gen(length param) -> generate(rng, rows) -> (x, y), two (rows, length) int arrays:
    token ids (indices into itos) and aligned labels (-1 = none). cfg: the options (saved
    as meta 'args'; needs 'seed'). extra: more meta entries (e.g. task=...)."""
    begin_dataset(out_dir)
    dtype = dtype_for(len(itos))
    splits = {}
    for split, n, param in sizes:
        splits[split] = write_examples(out_dir, split, make_gen(param), n, dtype, cfg['seed'])
        splits[split]['param'] = param
    write_meta(out_dir, dict(name=name, format='examples', vocab_size=len(itos), dtype=dtype, tokenizer='task',
                             itos=itos, reset_token=None, splits=splits, args=cfg, **extra))
    return splits


def task_sizes(cfg, train_param, test_params):
    return ([('train', cfg['n_train'], train_param), ('val', cfg['n_val'], train_param), ('test', cfg['n_test'], train_param)]
            + [(f"test_{p}", cfg['n_test'], p) for p in test_params])

# -----------------------------------------------------------------------------
# finite groups, for the state tracking tasks

def make_group(name):
    """-> (names, mul). Element 0 is the identity; mul[a, b] = index of the product a.b.

    Convention: a permutation p is a tuple with p[i] = the image of point i, and
    a.b = "apply a first, then b", i.e. (a.b)[i] = b[a[i]]. So the running product
    x_0.x_1...x_t is where every point ends up after the moves x_0, x_1, ..., x_t in order
    (as functions: x_t o ... o x_0). Z<n>: addition mod n (abelian, no convention needed).
    S<n>: all permutations of 0..n-1, A<n>: the even ones, both in lexicographic order
    (which puts the identity first); names are the tuples written as digits, e.g. '10234'."""
    m = re.fullmatch(r'([ZSA])(\d+)', name)
    if not m:
        raise DataError(f"unknown group {name!r}; expected Z<n> (cyclic, e.g. Z2 = parity), S<n> or A<n> (e.g. S3, S5, A5)")
    kind, n = m.group(1), int(m.group(2))
    if kind == 'Z':
        if not 2 <= n <= 4096:
            raise DataError(f"group {name}: need 2 <= n <= 4096")
        a = np.arange(n)
        return [str(k) for k in range(n)], (a[:, None] + a[None, :]) % n
    if not (2 if kind == 'S' else 3) <= n <= 6:
        raise DataError(f"group {name}: S<n> needs 2 <= n <= 6, A<n> needs 3 <= n <= 6")
    perms = list(itertools.permutations(range(n)))
    if kind == 'A':
        perms = [p for p in perms if sum(p[i] > p[j] for i in range(n) for j in range(i + 1, n)) % 2 == 0]
    P = np.array(perms)  # (G, n)
    G = len(P)
    # comp[a, b, i] = P[b, P[a, i]] = (a.b)[i], shape (G, G, n)
    comp = P[np.arange(G)[None, :, None], P[:, None, :]]
    # lexicographic order of permutations = increasing order of their base-n value: index by searchsorted
    weights = n ** np.arange(n - 1, -1, -1)
    mul = np.searchsorted(P @ weights, comp @ weights)
    return [''.join(map(str, p)) for p in perms], mul


def running_product(mul, x):
    """x: (N, T) element ids -> (N, T), y[:, t] = x[:, 0].x[:, 1]...x[:, t]."""
    y = np.empty_like(x)
    y[:, 0] = x[:, 0]
    for t in range(1, x.shape[1]):
        y[:, t] = mul[y[:, t - 1], x[:, t]]
    return y

# -----------------------------------------------------------------------------
# task 1: s5, the group word problem (state tracking)

S5_DEFAULTS = dict(group='S5', train_len=32, test_lens='48,64', n_train=20000, n_val=500, n_test=1000, seed=1337, out_dir='')


def prepare_s5(cfg):
    """Tokens are group elements (vocab = the group). x_t uniform, y_t = x_0.x_1...x_t (see
    make_group for the convention). Every position is labelled, so one row of length 32
    trains every length 1..32 at once. Split test_<L> holds rows of length L."""
    names, mul = make_group(cfg['group'])
    G = len(names)

    def make_gen(T):
        def generate(rng, rows):
            x = rng.integers(0, G, size=(rows, T))
            return x, running_product(mul, x)
        return generate

    name = f"s5_{cfg['group']}"
    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, name)
    write_task(out_dir, cfg, name, names, make_gen, task_sizes(cfg, cfg['train_len'], parse_lens(cfg['test_lens'], 'test_lens')),
               task=dict(name='s5', group=cfg['group']))
    return out_dir

# -----------------------------------------------------------------------------
# task 2: s5_retrieval (T2MLR's S5-Retrieval): state tracking + in-context lookup

RETRIEVAL_DEFAULTS = dict(group='S5', k=4, n_actions=32, test_actions='48,64', n_train=20000, n_val=500, n_test=1000,
                          seed=1337, out_dir='')
VALUE_CHARS = 'abcdefghijklmnopqrstuvwxyz0123456789'


def prepare_s5_retrieval(cfg):
    """A row is
        dictionary   g v1..vk  (for every group element g, in a random order; v = k random chars)
        '|'
        actions      a_1 _ .. _   a_2 _ .. _   ...   (n_actions moves, each followed by k blanks '_')
    Targets: -1 on the dictionary and '|'; at a move, the state s = a_1.a_2...a_i (the running
    product from the identity); at its k blanks, the k characters the dictionary gives for s.
    Vocabulary: group elements (ids 0..G-1), then VALUE_CHARS, then '|', then '_'.
    Split test_<N> holds rows with N moves (length G*(k+1) + 1 + N*(k+1))."""
    names, mul = make_group(cfg['group'])
    if not cfg['group'].startswith(('S', 'A')):
        raise DataError(f"s5_retrieval needs a permutation group (S<n> or A<n>), got {cfg['group']}: the names of Z<n> elements clash with the value characters")
    G, k = len(names), cfg['k']
    if k < 1:
        raise DataError(f"--k={k}: need k >= 1")
    C0 = G                       # id of the first value character
    SEP, BLANK = G + len(VALUE_CHARS), G + len(VALUE_CHARS) + 1
    itos = names + list(VALUE_CHARS) + ['|', '_']

    def make_gen(A):
        def generate(rng, rows):
            order = rng.permuted(np.tile(np.arange(G), (rows, 1)), axis=1)      # (rows, G) dictionary order
            values = rng.integers(0, len(VALUE_CHARS), size=(rows, G, k))       # values[r, g] = value of element g
            moves = rng.integers(0, G, size=(rows, A))
            state = running_product(mul, moves)                                 # (rows, A)
            r = np.arange(rows)[:, None]
            dict_x = np.concatenate([order[:, :, None], C0 + values[r, order]], axis=2).reshape(rows, -1)
            act_x = np.concatenate([moves[:, :, None], np.full((rows, A, k), BLANK)], axis=2).reshape(rows, -1)
            act_y = np.concatenate([state[:, :, None], C0 + values[r, state]], axis=2).reshape(rows, -1)
            x = np.concatenate([dict_x, np.full((rows, 1), SEP), act_x], axis=1)
            y = np.concatenate([np.full((rows, dict_x.shape[1] + 1), -1), act_y], axis=1)
            return x, y
        return generate

    name = f"s5_retrieval_{cfg['group']}"
    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, name)
    sizes = task_sizes(cfg, cfg['n_actions'], parse_lens(cfg['test_actions'], 'test_actions'))
    write_task(out_dir, cfg, name, itos, make_gen, sizes, task=dict(name='s5_retrieval', group=cfg['group'], k=k))
    return out_dir


def task_labels(meta, ids):
    """The true labels of an input (token ids) of a task whose labels follow from its input, as
    meta['task'] records it (s5, s5_retrieval): what the generator would have stored as y for a
    row (or a prefix of one) with these tokens. -> list of ints (-1 = unlabelled), or None for
    any other task, a meta.json written before meta['task'] existed, or an input that is not
    (a prefix of) a row of the task. sample.py shows these next to the model's predictions."""
    task = meta.get('task') or {}
    if task.get('name') not in ('s5', 's5_retrieval') or not len(ids):
        return None
    names, mul = make_group(task['group'])
    G = len(names)
    if task['name'] == 's5':
        x = np.asarray(ids, dtype=np.int64)
        return running_product(mul, x[None])[0].tolist() if x.max() < G else None
    return retrieval_labels([int(t) for t in ids], G, task['k'], mul)


def retrieval_labels(x, G, k, mul):
    """s5_retrieval's labels for a prefix x of a row (layout in prepare_s5_retrieval), read
    position by position (the generator builds whole rows at once: the tests compare the two).
    None where x breaks the layout (dictionary entries, separator, move/blank pattern)."""
    SEP, BLANK, D = G + len(VALUE_CHARS), G + len(VALUE_CHARS) + 1, G * (k + 1)
    value, y, state = {}, [], None
    for p, tok in enumerate(x):
        if p < D:  # the dictionary: element, then its k value characters
            j, e = p % (k + 1), p - p % (k + 1)
            if j == 0 and (tok >= G or tok in value) or j > 0 and not G <= tok < SEP:
                return None
            if j == k:
                value[x[e]] = x[e + 1:p + 1]
            y.append(-1)
        elif p == D:
            if tok != SEP:
                return None
            y.append(-1)
        elif (p - D - 1) % (k + 1) == 0:  # a move: the label is the state after it
            if tok >= G:
                return None
            state = tok if state is None else int(mul[state, tok])
            y.append(state)
        else:  # a blank: the next value character of the current state
            if tok != BLANK:
                return None
            y.append(value[state][(p - D - 1) % (k + 1) - 1])
    return y


# -----------------------------------------------------------------------------
# task 3: varassign, variable assignment chains

VARASSIGN_DEFAULTS = dict(depth=4, test_depths='6,8', n_chains=3, n_branch=2, n_vars=52, n_train=20000, n_val=500,
                          n_test=1000, seed=1337, out_dir='')


def var_names(n):
    """a..z, then aa, ab, .. (one token each)."""
    letters = 'abcdefghijklmnopqrstuvwxyz'
    names = list(letters) + [a + b for a in letters for b in letters]
    return names[:n]


def prepare_varassign(cfg):
    """Lines `x = y ;` in a small word vocabulary, one token per word:
        digits 0..9 (ids 0..9), '=', ';', '?' (ids 10, 11, 12), variables (ids 13..).
    A row holds n_chains chains of `depth` aliases, u0 = digit ; u1 = u0 ; ... ; u_depth = u_{depth-1} ;
    (the other chains are distractors with their own digits), plus n_branch dead-end aliases
    `w = u` onto random chain variables, all lines shuffled, then the query `? u_depth` of chain 0.
    Variable names are drawn at random per row, so nothing marks the queried chain.
    Target: the digit the query resolves to, at the LAST position only (-1 elsewhere).
    Split test_<D> holds chains of depth D (length 4 * (n_chains * (D + 1) + n_branch) + 2)."""
    depths = [cfg['depth']] + parse_lens(cfg['test_depths'], 'test_depths')
    C, nb, nv = cfg['n_chains'], cfg['n_branch'], cfg['n_vars']
    if min(depths) < 0 or C < 1 or nb < 0:
        raise DataError("varassign needs depth >= 0, n_chains >= 1, n_branch >= 0")
    need = C * (max(depths) + 1) + nb
    if not need <= nv <= 702:
        raise DataError(f"varassign: depth {max(depths)} with {C} chains and {nb} branches needs {need} variables; "
                        f"set {need} <= --n_vars <= 702 (got {nv})")
    EQ, SEMI, Q, V0 = 10, 11, 12, 13
    itos = [str(d) for d in range(10)] + ['=', ';', '?'] + var_names(nv)

    def make_gen(D):
        def generate(rng, rows):
            nc = C * (D + 1)  # chain variables per row
            names = V0 + rng.permuted(np.tile(np.arange(nv), (rows, 1)), axis=1)[:, :nc + nb]
            chain = names[:, :nc].reshape(rows, C, D + 1)          # chain[r, c, j] = u_j of chain c
            digits = rng.integers(0, 10, size=(rows, C))
            rhs = np.concatenate([digits[:, :, None], chain[:, :, :-1]], axis=2)   # u_0 = digit, u_j = u_{j-1}
            lhs = np.concatenate([chain.reshape(rows, nc), names[:, nc:]], axis=1)  # + branch variables
            targets = names[np.arange(rows)[:, None], rng.integers(0, nc, size=(rows, nb))]
            rhs = np.concatenate([rhs.reshape(rows, nc), targets], axis=1)
            L = nc + nb
            lines = np.stack([lhs, np.full((rows, L), EQ), rhs, np.full((rows, L), SEMI)], axis=2)  # (rows, L, 4)
            shuffle = rng.permuted(np.tile(np.arange(L), (rows, 1)), axis=1)
            lines = np.take_along_axis(lines, shuffle[:, :, None], axis=1)
            x = np.concatenate([lines.reshape(rows, -1), np.full((rows, 1), Q), chain[:, 0, -1:]], axis=1)
            y = np.full(x.shape, -1)
            y[:, -1] = digits[:, 0]  # digit d is token id d
            return x, y
        return generate

    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, 'varassign')
    write_task(out_dir, cfg, 'varassign', itos, make_gen, task_sizes(cfg, depths[0], depths[1:]))
    return out_dir

# -----------------------------------------------------------------------------
# text corpora: documents -> tokens, in parallel, appended shard by shard to {split}.bin

_ENCODE = None  # the per-process encoder, built by _init_encoder (pickling-free in workers)


def _init_encoder(spec):
    """spec: ('gpt2',) or ('char', itos, sep). Each document becomes (token array, UTF-8 bytes).
    gpt2: <|endoftext|> PRECEDES every document (it is the reset token: it starts a document).
    char: the document followed by `sep` (char data has no reset token)."""
    global _ENCODE
    if spec[0] == 'gpt2':
        enc = gpt2_encoding()
        eot = enc.eot_token

        def encode(texts):
            ids = enc.encode_ordinary_batch(texts, num_threads=1)
            return [(np.array([eot] + t, dtype=np.uint16), len(s.encode('utf-8'))) for t, s in zip(ids, texts)]
    else:
        _, itos, sep = spec
        stoi = {c: i for i, c in enumerate(itos)}

        def encode(texts):
            out = []
            for s in texts:
                s = s + doc_sep(s, sep)
                out.append((np.array([stoi[c] for c in s], dtype=np.uint32), len(s.encode('utf-8'))))
            return out
    _ENCODE = encode


def _encode_batch(texts):
    return _ENCODE(texts)


def doc_sep(s, sep):
    """What follows a document in char data. 'paragraph': the blank line the paragraph split
    removed (so the text is rebuilt as it was); 'document': a newline if it has none."""
    return '\n\n' if sep == 'paragraph' else ('' if s.endswith('\n') else '\n')


def encoded_docs(texts, spec, num_proc):
    """Yield (tokens, n_bytes) per document, in order, tokenized by num_proc processes."""
    batches = iter(lambda: list(itertools.islice(texts, 256)), [])
    if num_proc <= 1:
        _init_encoder(spec)
        for batch in batches:
            yield from _encode_batch(batch)
        return
    import multiprocessing as mp
    with mp.Pool(num_proc, initializer=_init_encoder, initargs=(spec,)) as pool:  # terminated on early exit
        for out in pool.imap(_encode_batch, batches):
            yield from out


def iter_texts(ds, what):
    """The 'text' field of each row; a failing read (network) becomes one DataError line."""
    it = iter(ds)
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except Exception as e:
            raise DataError(f"reading {what} failed ({short(e)}); check the connection and re-run") from None
        yield row['text']


def write_token_bins(out_dir, streams, max_tokens, dtype):
    """streams: [(docs, route)] with docs an iterator of (tokens, n_bytes) and route(i) the split
    of its i-th document. Appends to {split}.bin (temp names until done) in shards of
    SHARD_TOKENS tokens, so a 10B-token corpus never sits in memory. A stream stops once the split it is
    filling holds max_tokens (0 = no cap; the last document is cut). -> {split: (tokens, bytes)}."""
    from tqdm import tqdm
    files, count, nbytes, buf, nbuf = {}, {}, {}, {}, {}

    def flush(split):
        if buf[split]:
            files[split].f.write(np.concatenate(buf[split]).astype(dtype).tobytes())
            buf[split], nbuf[split] = [], 0

    try:
        bar = tqdm(total=max_tokens * len(streams) or None, unit='tok', unit_scale=True, disable=None)
        for docs, route in streams:
            for i, (ids, b) in enumerate(docs):
                split = route(i)
                if split not in files:
                    files[split] = AtomicFile(os.path.join(out_dir, f"{split}.bin"))
                    count[split], nbytes[split], buf[split], nbuf[split] = 0, 0, [], 0
                full = max_tokens and count[split] + len(ids) >= max_tokens
                if full:  # cut the last document; its bytes pro rata
                    keep = max_tokens - count[split]
                    ids, b = ids[:keep], b * keep / max(len(ids), 1)
                buf[split].append(ids)
                nbuf[split] += len(ids)
                count[split] += len(ids)
                nbytes[split] += b
                bar.update(len(ids))
                if nbuf[split] >= SHARD_TOKENS:  # a shard: append it to the file
                    flush(split)
                if full:
                    break
        bar.close()
        for split in files:
            flush(split)
            files[split].commit()
    except BaseException:
        for af in files.values():  # an interrupted run leaves no temp files behind
            af.abort()
        raise
    for split in ('train', 'val'):
        if not count.get(split):
            raise DataError(f"split {split} is empty: use more documents or another --val_frac")
    return {s: (count[s], nbytes[s]) for s in count}


def route_every(val_frac):
    """Document i goes to val when i % k == 0, k = round(1 / val_frac): deterministic, exactly
    the fraction, streams fine, and val gets the first document."""
    if not 0 < val_frac <= 0.5:
        raise DataError(f"--val_frac={val_frac}: need 0 < val_frac <= 0.5")
    k = max(2, round(1 / val_frac))
    return lambda i: 'val' if i % k == 0 else 'train'


def write_token_meta(out_dir, name, counts, tokenizer, vocab_size, itos, cfg):
    dtype = dtype_for(vocab_size)
    write_meta(out_dir, dict(
        name=name, format='tokens', vocab_size=vocab_size, dtype=dtype, tokenizer=tokenizer, itos=itos,
        reset_token=GPT2_EOT if tokenizer == 'gpt2' else None,
        bytes_per_token={s: counts[s][1] / counts[s][0] for s in ('train', 'val')},
        splits={s: {'n': counts[s][0]} for s in ('train', 'val')}, args=cfg))


TEXT_DEFAULTS = dict(input='', tokenizer='char', name='', val_frac=0.1, sample_by='auto', num_proc=1, max_tokens=0,
                     cache_dir='', out_dir='')


def prepare_text(cfg):
    """Local text (a file, or a folder of .txt files searched recursively) through `datasets`'
    text loader, so local files and Hub data share one path. Documents: whole files
    (sample_by=document, the default for a folder) or blank-line separated paragraphs
    (sample_by=paragraph, the default for a single file, which would be one document). Split
    into train/val by document (route_every). char: vocab = the characters of the data;
    gpt2: every document preceded by <|endoftext|>."""
    src = cfg['input']
    if not src:
        raise DataError("text needs --input=PATH (a .txt file or a folder of .txt files)")
    if os.path.isdir(src):
        import glob
        files = sorted(glob.glob(os.path.join(src, '**', '*.txt'), recursive=True))
    elif os.path.isfile(src):
        files = [src]
    else:
        raise DataError(f"--input={src}: no such file or folder")
    if not files:
        raise DataError(f"--input={src}: the folder holds no .txt files")
    if all(os.path.getsize(f) == 0 for f in files):
        raise DataError(f"--input={src}: {'the file is' if len(files) == 1 else 'all its .txt files are'} empty")
    sample_by = cfg['sample_by'] if cfg['sample_by'] != 'auto' else ('document' if len(files) > 1 else 'paragraph')
    if sample_by not in ('document', 'paragraph'):
        raise DataError(f"--sample_by={sample_by}: expected auto, document or paragraph")
    if cfg['tokenizer'] not in ('char', 'gpt2'):
        raise DataError(f"--tokenizer={cfg['tokenizer']}: expected char or gpt2")
    if cfg['tokenizer'] == 'gpt2':
        gpt2_encoding()  # fail fast, before reading anything
    route = route_every(cfg['val_frac'])
    try:
        from datasets import load_dataset
        ds = load_dataset('text', data_files={'train': files}, sample_by=sample_by, split='train',
                          cache_dir=cfg['cache_dir'] or None)
    except Exception as e:
        raise DataError(f"could not read {src} ({short(e)})") from None
    name = cfg['name'] or os.path.splitext(os.path.basename(os.path.normpath(src)))[0]
    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, name)
    if cfg['tokenizer'] == 'char':
        chars = set(doc_sep('', sample_by)) | {'\n'}
        for text in iter_texts(ds, src):
            chars.update(text)
        itos = sorted(chars)
        spec, vocab_size = ('char', itos, sample_by), len(itos)
    else:
        itos, spec, vocab_size = None, ('gpt2',), GPT2_EOT + 1
    begin_dataset(out_dir)
    docs = encoded_docs(iter_texts(ds, src), spec, cfg['num_proc'])
    counts = write_token_bins(out_dir, [(docs, route)], cfg['max_tokens'], dtype_for(vocab_size))
    write_token_meta(out_dir, name, counts, cfg['tokenizer'], vocab_size, itos, dict(cfg, sample_by=sample_by))
    return out_dir


HUB_DEFAULTS = dict(val_frac=0.0005, num_proc=max(1, (os.cpu_count() or 2) // 2), max_tokens=0, streaming=False,
                    cache_dir='', out_dir='')
HUB = {  # name: (Hub path, config name, train split, own val split or None)
    'fineweb_edu': ('HuggingFaceFW/fineweb-edu', 'sample-10BT', 'train', None),
    'tinystories': ('roneneldan/TinyStories', None, 'train', 'validation'),
}


def prepare_hub(cfg, name):
    """A Hub corpus, GPT-2 tokens, every document preceded by <|endoftext|>. val: the corpus's
    own validation split if it has one (TinyStories), else every k-th document (--val_frac).
    --max_tokens caps each split; --streaming=True reads without downloading the whole corpus."""
    path, config, train_split, val_split = HUB[name]
    gpt2_encoding()  # fail fast: offline machines stop here with one line
    what = f"{path}{' (' + config + ')' if config else ''}"

    check_hub(what, ", or prepare local text with `python prepare.py text --input=PATH`")

    def load(split):
        try:
            from datasets import load_dataset
            return load_dataset(path, name=config, split=split, streaming=cfg['streaming'], cache_dir=cfg['cache_dir'] or None,
                                **({} if cfg['streaming'] else {'num_proc': cfg['num_proc']}))
        except Exception as e:
            raise DataError(f"could not load {what} split {split} from the Hugging Face Hub ({short(e)}). Connect to the "
                            f"internet (the download is cached for later runs), or prepare local text with "
                            f"`python prepare.py text --input=PATH`") from None

    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, name)
    train = load(train_split)
    val = load(val_split) if val_split else None
    begin_dataset(out_dir)
    spec = ('gpt2',)
    if val is None:
        streams = [(encoded_docs(iter_texts(train, what), spec, cfg['num_proc']), route_every(cfg['val_frac']))]
    else:
        streams = [(encoded_docs(iter_texts(train, what), spec, cfg['num_proc']), lambda i: 'train'),
                   (encoded_docs(iter_texts(val, what), spec, cfg['num_proc']), lambda i: 'val')]
    counts = write_token_bins(out_dir, streams, cfg['max_tokens'], dtype_for(GPT2_EOT + 1))
    write_token_meta(out_dir, name, counts, 'gpt2', GPT2_EOT + 1, None, cfg)
    return out_dir

# -----------------------------------------------------------------------------
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

def hf_tokenizer(name):
    """transformers.AutoTokenizer from a Hub name or a local folder; every failure is one line."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DataError("pretrained tokenizers need the optional package transformers: pip install transformers") from None
    path = os.path.expanduser(name)
    local = os.path.isdir(path)
    if not local and (os.path.isabs(path) or name.startswith(('.', '~')) or name.count('/') > 1 or os.path.exists(path)):
        raise DataError(f"no tokenizer folder at {name}")
    if not local:
        check_hub(f"the tokenizer {name}")
    try:
        return AutoTokenizer.from_pretrained(path if local else name)
    except Exception as e:
        if local:
            raise DataError(f"{name} is not a readable tokenizer folder ({short(e)})") from None
        raise DataError(f"could not load the tokenizer {name!r}: not a local folder, and the Hugging Face Hub could not "
                        f"be reached or has no such repo ({short(e)}). Connect once (it is cached), or give a local "
                        f"folder") from None


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
    `python train.py config/retrofit_tiny.py` runs next. Offline, no download."""
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

# -----------------------------------------------------------------------------

TASKS = {
    's5': (S5_DEFAULTS, prepare_s5),
    's5_retrieval': (RETRIEVAL_DEFAULTS, prepare_s5_retrieval),
    'varassign': (VARASSIGN_DEFAULTS, prepare_varassign),
    'text': (TEXT_DEFAULTS, prepare_text),
    'fineweb_edu': (HUB_DEFAULTS, lambda cfg: prepare_hub(cfg, 'fineweb_edu')),
    'tinystories': (HUB_DEFAULTS, lambda cfg: prepare_hub(cfg, 'tinystories')),
    'jsonl': (JSONL_DEFAULTS, prepare_jsonl),
    'gsm8k': (GSM8K_DEFAULTS, prepare_gsm8k),
    'tiny_retrofit_demo': (DEMO_DEFAULTS, prepare_tiny_retrofit_demo),
}


def main(argv):
    if not argv or argv[0] in ('-h', '--help'):
        print(__doc__.strip())
        sys.exit(0 if argv else 2)
    name = argv[0]
    if name not in TASKS:
        die(f"unknown dataset {name!r}; choose one of: {', '.join(TASKS)}", 2)
    defaults, prepare = TASKS[name]
    if argv[1:] in (['-h'], ['--help']):
        print(f"python prepare.py {name} " + ' '.join(f"--{k}={v}" for k, v in defaults.items()))
        sys.exit(0)
    cfg = dict(parse_args(argv[1:], defaults), dataset=name)
    out_dir = prepare(cfg)
    meta = load_meta(out_dir)
    sizes = ', '.join(f"{s} {v['n']:,}" + (f"x{v['len']}" if 'len' in v else '') for s, v in meta['splits'].items())
    print(f"wrote {out_dir}: {meta['format']}, vocab {meta['vocab_size']}, {sizes}")


if __name__ == '__main__':
    main(sys.argv[1:])

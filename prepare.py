"""
Prepare a dataset for train.py and sample.py, and read it back.

    python prepare.py s5 --group=S5                    # state tracking       -> data/s5_S5
    python prepare.py s5 --group=Z2 --train_len=32     # parity               -> data/s5_Z2
    python prepare.py s5_retrieval --group=S5          # T2MLR S5-Retrieval   -> data/s5_retrieval_S5
    python prepare.py varassign --depth=4              # variable assignment  -> data/varassign
    python prepare.py text --input=input.txt --tokenizer=char   # local text  -> data/input
    python prepare.py tinystories --max_tokens=100e6   # Hub corpora, GPT-2 tokens (needs internet)
    python prepare.py fineweb_edu --num_proc=16

Every option is --key=value; `python prepare.py NAME --help` lists NAME's options.

The format (the contract train.py and sample.py rely on). A dataset is a folder
holding meta.json and binary files:

  meta.json  {"name", "format": "tokens" | "examples", "vocab_size", "dtype": "uint16" | "uint32",
              "tokenizer": "char" | "gpt2" | "task", "itos": [str] (char/task: index = token id),
              "reset_token": int | null (the token that starts a document; the recurrent state is
              reset there: <|endoftext|> = 50256 for gpt2, null otherwise),
              "bytes_per_token": {split: float} (tokens format: UTF-8 bytes / tokens, for bits per byte),
              "splits": {split: {"n": tokens | rows, "len": row length (examples only), ...}},
              "args": the options used, "version": 1}
  tokens     {split}.bin, split in (train, val): one flat token stream in `dtype` (np.memmap it).
             gpt2 corpora: every document is PRECEDED by <|endoftext|>, so the reset token starts it.
  examples   {split}_x.bin (dtype, (n, len) row-major) input tokens and {split}_y.bin (int32,
             (n, len)) ALIGNED targets: y[t] is what the model must output at position t (not the
             shifted inputs), -1 = no loss. Splits train, val, test at the training length and
             test_<N> at longer lengths (N = the task's length parameter, see each task).

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
            if val.lower() in ('true', '1', 'yes'):
                return True
            if val.lower() in ('false', '0', 'no'):
                return False
            raise ValueError
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
    return [(f"{split}_x.bin", meta['dtype'], n * T), (f"{split}_y.bin", 'int32', n * T)]


def load_meta(data_dir):
    """Read and check data_dir/meta.json, and that every file it lists is complete."""
    path = os.path.join(data_dir, 'meta.json')
    hint = f"run `python prepare.py NAME` first (NAME: {', '.join(TASKS)})"
    if not os.path.isdir(data_dir):
        raise DataError(f"no dataset folder {data_dir}: {hint}")
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
              for fname, dtype, _ in split_files(meta, split)]
    if meta['format'] == 'tokens':
        return arrays[0]
    T = meta['splits'][split]['len']
    return tuple(a.reshape(-1, T) for a in arrays)


def gpt2_encoding():
    try:
        import tiktoken
        return tiktoken.get_encoding('gpt2')
    except Exception as e:
        raise DataError(f"could not load the GPT-2 tokenizer ({short(e)}). tiktoken downloads its "
                        f"vocabulary once: connect to the internet (or set TIKTOKEN_CACHE_DIR to a cache "
                        f"that holds it), or use a char-level dataset (prepare.py text --tokenizer=char)") from None


def get_tokenizer(meta):
    """-> (encode, decode): str -> list[int], list[int] -> str.
    char: one token per character. task: whitespace-separated words, each one token (decode
    joins them with spaces). gpt2: tiktoken; <|endoftext|> may be written in the text."""
    kind = meta['tokenizer']
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


def write_task(out_dir, cfg, name, itos, make_gen, sizes):
    """Write the splits of a synthetic task and its meta. sizes: [(split, n, length param)],
    make_gen(length param) -> generate(rng, rows)."""
    begin_dataset(out_dir)
    dtype = dtype_for(len(itos))
    splits = {}
    for split, n, param in sizes:
        splits[split] = write_examples(out_dir, split, make_gen(param), n, dtype, cfg['seed'])
        splits[split]['param'] = param
    write_meta(out_dir, dict(name=name, format='examples', vocab_size=len(itos), dtype=dtype, tokenizer='task',
                             itos=itos, reset_token=None, splits=splits, args=cfg))
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
    write_task(out_dir, cfg, name, names, make_gen, task_sizes(cfg, cfg['train_len'], parse_lens(cfg['test_lens'], 'test_lens')))
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
    write_task(out_dir, cfg, name, itos, make_gen, sizes)
    return out_dir

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

TASKS = {
    's5': (S5_DEFAULTS, prepare_s5),
    's5_retrieval': (RETRIEVAL_DEFAULTS, prepare_s5_retrieval),
    'varassign': (VARASSIGN_DEFAULTS, prepare_varassign),
    'text': (TEXT_DEFAULTS, prepare_text),
    'fineweb_edu': (HUB_DEFAULTS, lambda cfg: prepare_hub(cfg, 'fineweb_edu')),
    'tinystories': (HUB_DEFAULTS, lambda cfg: prepare_hub(cfg, 'tinystories')),
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

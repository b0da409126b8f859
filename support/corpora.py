"""
Text corpora as token streams: local text (a file or a folder), Hugging Face Hub corpora
(FineWeb-Edu, TinyStories; GPT-2 tokens, needs internet), and documents -> tokens, in
parallel, appended shard by shard to {split}.bin.
"""

import itertools
import os
import sys

import numpy as np

from support.dataset import (DATA_DIR, GPT2_EOT, AtomicFile, DataError, begin_dataset, check_hub, dtype_for, gpt2_encoding,
                             short, write_meta)

SHARD_TOKENS = 1 << 24  # token corpora are appended to their .bin in shards of this many tokens


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
    # spawn, not fork: a fork copies whatever lock another thread of this process holds (torch's,
    # a download's), and a worker that needs it waits forever (seen once in the test suite)
    with mp.get_context('spawn').Pool(num_proc, initializer=_init_encoder, initargs=(spec,)) as pool:  # terminated on early exit
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
    tqdm.monitor_interval = 0  # no monitor thread: the tokenizer pool forks this process, and a fork must not copy a held lock
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
    route = route_every(cfg['val_frac']) if val_split is None else None  # a bad --val_frac: before anything is deleted
    train = load(train_split)
    val = load(val_split) if val_split else None
    begin_dataset(out_dir)
    spec = ('gpt2',)
    if val is None:
        streams = [(encoded_docs(iter_texts(train, what), spec, cfg['num_proc']), route)]
    else:
        streams = [(encoded_docs(iter_texts(train, what), spec, cfg['num_proc']), lambda i: 'train'),
                   (encoded_docs(iter_texts(val, what), spec, cfg['num_proc']), lambda i: 'val')]
    counts = write_token_bins(out_dir, streams, cfg['max_tokens'], dtype_for(GPT2_EOT + 1))
    write_token_meta(out_dir, name, counts, 'gpt2', GPT2_EOT + 1, None, cfg)
    return out_dir

# -----------------------------------------------------------------------------
# stdlib_char: real text that every machine with Python has, offline

STDLIB_DEFAULTS = dict(root='', hold_out_every=20, max_files=0, out_dir='')
FILE_TOKEN = '<|file|>'  # the document token that starts every file: the recurrent state is reset there


def check_free(out_dir, name, need):
    """need bytes against the free disk of out_dir, before anything is written (write_task's rule): one line."""
    import shutil
    os.makedirs(out_dir, exist_ok=True)
    free = shutil.disk_usage(out_dir).free
    if need > 0.9 * free:
        raise DataError(f"{name} would take {need / 2**30:.2f} GiB but {out_dir} has {free / 2**30:.2f} GiB free")


def stdlib_files(root):
    """The .py files under root (the standard library), in sorted path order, without the test
    suites (folders test, tests, idle_test, and test_*.py files) and without site-packages."""
    skip = {'test', 'tests', 'idle_test', 'site-packages', '__pycache__'}
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        files += [os.path.join(folder, n) for n in names if n.endswith('.py') and not n.startswith('test_')]
    return sorted(files, key=lambda p: os.path.relpath(p, root))


def prepare_stdlib_char(cfg):
    """The running interpreter's standard library as a character corpus: English docstrings and
    comments, and code, that no one here wrote (karpathy's char-rnn 'Linux source' in spirit).
    Files in sorted path order; whole files are held out: file i goes to test when
    i % hold_out_every == 0, to val when it is hold_out_every // 2, else to train. Each file is
    preceded by the document token <|file|> (id 0, the reset token). One token per character;
    the vocabulary is <|file|> and every character of the text. Same Python, same bytes: meta.json
    records the Python version, the file count and the SHA-256 of the text. max_files > 0: only
    the first files (the tests)."""
    import hashlib
    import sysconfig
    root = cfg['root'] or sysconfig.get_paths()['stdlib']
    if not os.path.isdir(root):
        raise DataError(f"--root={root}: no such folder")
    k = cfg['hold_out_every']
    if k < 3:
        raise DataError(f"--hold_out_every={k}: need at least 3 (a test file, a val file and train files in each group)")
    files = stdlib_files(root)[:cfg['max_files'] or None]
    if len(files) < k:
        raise DataError(f"{root} has {len(files)} .py files outside its tests: need at least hold_out_every={k}")
    texts = [open(p, encoding='utf-8', errors='replace').read() for p in files]
    itos = [FILE_TOKEN] + sorted(set(''.join(texts)))
    stoi = {c: i for i, c in enumerate(itos)}
    route = lambda i: 'test' if i % k == 0 else 'val' if i % k == k // 2 else 'train'
    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, 'stdlib_char')
    check_free(out_dir, 'stdlib_char', 2 * sum(len(t) + 1 for t in texts))  # uint16: a character, a <|file|> a file
    begin_dataset(out_dir)
    digest, counts = hashlib.sha256(), {}
    for split in ('train', 'val', 'test'):
        ids = [[0] + [stoi[c] for c in t] for i, t in enumerate(texts) if route(i) == split]
        chars = sum(len(t) - 1 for t in ids)
        with AtomicFile(os.path.join(out_dir, f'{split}.bin')) as f:
            f.write(np.concatenate([np.array(t, dtype=np.uint16) for t in ids]).tobytes())
        counts[split] = dict(n=chars + len(ids), files=len(ids), chars=chars)
    for t in texts:
        digest.update(t.encode('utf-8'))
    sizes = {s: (c['n'], sum(len(t.encode('utf-8')) for i, t in enumerate(texts) if route(i) == s)) for s, c in counts.items()}
    write_meta(out_dir, dict(
        name='stdlib_char', format='tokens', vocab_size=len(itos), dtype=dtype_for(len(itos)), tokenizer='char',
        itos=itos, reset_token=0, bytes_per_token={s: b / n for s, (n, b) in sizes.items()}, splits=counts,
        source=dict(python=sys.version.split()[0], root=root, files=len(files), sha256=digest.hexdigest()), args=cfg))
    return out_dir

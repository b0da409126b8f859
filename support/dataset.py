"""
The dataset format: the contract between prepare.py (which writes datasets) and train.py /
sample.py / lab/evaluate.py (which read them), with its readers, its atomic writers and the tokenizers.

The format (the contract train.py, sample.py and lab/evaluate.py rely on). A dataset is a folder
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
             {"prompt_len": [int], "answer": [str]} per row (for answer accuracy, lab/evaluate.py).

Writes are atomic: each file goes to a temporary name in the same folder and is os.replace'd,
an old dataset is moved aside before anything is written (and put back if the write fails or is
interrupted, deleted once it succeeds), and the new meta.json is written LAST.
load_meta() also checks every file's size, so an interrupted run is never accepted.
"""

import contextlib
import json
import os
import re
import signal
import sys
import threading
import zlib

import numpy as np

DATA_DIR = 'data'  # datasets go to data/<name>, relative to where you run (train.py's data_root)
FORMAT_VERSION = 1
GPT2_EOT = 50256


class DataError(SystemExit):
    """A bad dataset or bad input. A SystemExit, so an uncaught one prints its one-line
    message (no traceback) and exits 1; callers can still catch it by name."""
    def __init__(self, msg):
        super().__init__(f"error: {msg}")


def write_error(e, path):
    """A failed write of path as one DataError line: a full disk says so (torch.save's own error on
    one is a RuntimeError, 'unexpected pos', that never does). An error that is not about the
    file or the disk: None (the caller re-raises it)."""
    import errno
    import shutil
    if isinstance(e, OSError):
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return DataError(f"no space left on the device holding {path}")
        return DataError(f"cannot write {path} ({e.strerror or short(e)})")
    try:
        full = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free < 2**20
    except OSError:
        full = False
    if full or 'unexpected pos' in str(e) or 'No space left' in str(e):
        return DataError(f"no space left on the device holding {path}")
    return None


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
    hint = ("run `python prepare.py NAME ...` for a built-in dataset (`python prepare.py --help` lists them), "
            "or write your own task with dataset.write_task (docs/usage.md)")
    if not os.path.isdir(data_dir):
        raise DataError(f"no dataset at {data_dir} (no such folder, so no meta.json): {hint}")
    if not os.access(data_dir, os.R_OK | os.X_OK):  # else its files look absent: "never prepared"
        raise DataError(f"cannot read {data_dir} (permission denied)")
    if not os.path.isfile(path):
        for old in stale_asides(data_dir):
            hint = f"the previous dataset is in {old} (a re-prepare was killed): move its files back, or {hint}"
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
    except OSError as e:
        raise DataError(f"cannot read {e.filename or path} ({e.strerror})") from None
    return meta


def memmap(path, dtype):
    """np.memmap(path, mode='r'): an unreadable file is one DataError line."""
    try:
        return np.memmap(path, dtype=dtype, mode='r')
    except OSError as e:
        raise DataError(f"cannot read {path} ({e.strerror})") from None


def load_split(data_dir, split, meta=None):
    """tokens format: a 1-D np.memmap of the split's tokens.
    examples format: (x, y) np.memmaps of shape (n, len), inputs and aligned targets."""
    meta = meta if meta is not None else load_meta(data_dir)
    if split not in meta['splits']:
        raise DataError(f"{data_dir} has no split {split!r}; available: {', '.join(meta['splits'])}")
    arrays = [memmap(os.path.join(data_dir, fname), dtype) for fname, dtype, _ in split_files(meta, split)[:2]]
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
    return memmap(os.path.join(data_dir, f"{split}_m.bin"), np.uint8).reshape(-1, T)


def load_answers(data_dir, split, meta):
    """Prompt/response data: {"prompt_len": [...], "answer": [...]}, one entry per row."""
    path = os.path.join(data_dir, f"{split}_answers.json")
    if not meta['splits'].get(split, {}).get('answers') or not os.path.isfile(path):
        have = [s for s, v in meta['splits'].items() if v.get('answers')]
        raise DataError(f"{data_dir} has no reference answers for split {split!r} (prompt/response data made by "
                        f"prepare.py jsonl or gsm8k has them for: {', '.join(have) or 'none'})")
    try:
        with open(path) as f:
            answers = json.load(f)
    except OSError as e:
        raise DataError(f"cannot read {path} ({e.strerror})") from None
    if len(answers['answer']) != meta['splits'][split]['n']:
        raise DataError(f"{path} does not match the split (re-run prepare.py)")
    return answers


def data_fingerprint(meta):
    """What a checkpoint records of its dataset (train.py): its vocabulary, which sample.py,
    lab/evaluate.py and a resume compare with the dataset they are given, so that data with
    another token table is one line, not a wrong decoding or an accuracy on data the model never
    saw; and its content (the options it was made with, the split sizes), so that a resume on a
    dataset regenerated under the same name says so."""
    table = meta.get('itos') or meta.get('hf_tokenizer') or meta['tokenizer']
    args = {k: v for k, v in (meta.get('args') or {}).items() if k not in ('out_dir', 'num_proc', 'cache_dir')}
    return dict(name=meta['name'], tokenizer=meta['tokenizer'], vocab_size=meta['vocab_size'],
                vocab_crc=zlib.crc32(json.dumps(table).encode()),
                content=dict(args=args, splits={s: [v['n'], v.get('len')] for s, v in meta['splits'].items()}))


def data_changes(old, new):
    """What differs between two fingerprints' contents, in words (empty: nothing)."""
    diff = lambda a, b, what: [f"{what(k)} {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b), key=str)
                               if a.get(k) != b.get(k)]
    return diff(old['args'], new['args'], lambda k: k) + diff(old['splits'], new['splits'], lambda s: f"split {s} [rows, len]")


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


def missing_folder(name):
    """A model or tokenizer name that can only be a local path (absolute, ./ or ~, more than one
    '/', an existing file) but is no folder: not a Hub name, so not worth a download that fails."""
    path = os.path.expanduser(name)
    return not os.path.isdir(path) and (os.path.isabs(path) or name.startswith(('.', '~')) or name.count('/') > 1
                                        or os.path.exists(path))


def check_out_file(key, path):
    """An output file a script writes at the end (a picture, a JSON): its folder must exist and be
    writable, and the path must not be a folder, or minutes of work end in a traceback. Checked at
    start-up; one line naming the flag otherwise (bench.py, lab/plot.py, lab/evaluate.py)."""
    from configurator import fail
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        fail(f"{key}={path} is a folder: give a file name")
    if not os.path.isdir(folder):
        fail(f"{key}={path}: the folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK):
        fail(f"{key}={path}: the folder {folder} is not writable")


def check_out_folder(key, path):
    """A folder a script writes into at the end (creating it if need be; lab/compare.py): it must be a
    folder, or creatable, on a writable disk. Checked at start-up by writing a probe file into the
    nearest folder that exists (os.access says yes to root on a read-only disk); nothing is created."""
    import tempfile
    from configurator import fail
    if os.path.exists(path) and not os.path.isdir(path):
        fail(f"{key}={path} is a file, not a folder")
    up = os.path.abspath(path)
    while not os.path.exists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        fail(f"{key}={path}: cannot create it ({up} is a file)")
    try:
        with tempfile.TemporaryFile(dir=up):
            pass
    except OSError as e:
        fail(f"{key}={path}: cannot write into {up} ({e.strerror})")


def hf_tokenizer(name):
    """transformers.AutoTokenizer from a Hub name or a local folder; every failure is one line."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DataError("pretrained tokenizers need the optional package transformers: pip install transformers") from None
    path = os.path.expanduser(name)
    local = os.path.isdir(path)
    if missing_folder(name):
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


# -----------------------------------------------------------------------------
# one writer per folder: train.py on its out_dir, prepare.py on its dataset (lab/compare.py's
# children are train.py). An OS lock, not a marker file: the kernel drops it when the process
# ends however it ends (kill -9 too), so a crash never leaves a stale lock behind.

_LOCKS = {}  # real path of a folder -> the fd of the lock this process holds on it


def lock_folder(folder, what):
    """Hold an exclusive fcntl.flock on folder/.lock (our PID written in it) until this process
    ends or unlock_folder. Re-entrant in one process. Held by another: one DataError line naming
    its PID. what: the writer, for that line (e.g. 'a train.py run')."""
    import fcntl
    key, path = os.path.realpath(folder), os.path.join(folder, '.lock')
    if key in _LOCKS:
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise DataError(f"cannot write {path} ({e.strerror}): {folder} must be writable") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 20, 0).decode(errors='replace').strip() or 'unknown'
        os.close(fd)
        raise DataError(f"{folder} is in use by process {pid} ({what} cannot share it with another writer): "
                        f"wait for that process to end or stop it, or use another folder") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _LOCKS[key] = fd


def unlock_folder(folder):
    fd = _LOCKS.pop(os.path.realpath(folder), None)
    if fd is not None:
        os.close(fd)  # closing the fd drops the lock


def release_locks():
    """Drop every lock this process holds (what its exit does; for scripts run in-process by tests)."""
    for key in list(_LOCKS):
        unlock_folder(key)


def lock_holder(folder):
    """The PID written in folder/.lock while another process holds it, else None."""
    import fcntl
    if os.path.realpath(folder) in _LOCKS:
        return None
    try:
        fd = os.open(os.path.join(folder, '.lock'), os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return os.pread(fd, 20, 0).decode(errors='replace').strip() or 'unknown'
    finally:
        os.close(fd)  # (drops the probe's own shared lock)

# -----------------------------------------------------------------------------
# writing a dataset: temp name + os.replace per file, meta.json last

def dtype_for(vocab_size):
    return 'uint16' if vocab_size <= 65535 else 'uint32'


def begin_dataset(out_dir):
    """Create and lock out_dir, and move an old dataset's files aside: from here until the new
    meta.json lands (write_meta, which deletes them) the folder is not a dataset (a crash half-way
    leaves nothing loadable), and a failure or an interrupt puts the old one back (abort_dataset).
    Also removes the temp files of writers that were killed (kill -9, OOM), which nothing else would."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create the dataset folder {out_dir} ({short(e)})") from None
    lock_folder(out_dir, 'prepare.py')  # two writers of one dataset would mix their files
    if os.path.realpath(out_dir) in _REPLACING:  # a write of this process that failed (library use): undone first
        abort_dataset(out_dir)
        lock_folder(out_dir, 'prepare.py')
    for f in remove_stale_tmp(out_dir):
        print(f"note: removed {f}, left by an interrupted prepare", file=sys.stderr)
    # SIGINT/SIGTERM held (not lost) until the old files are aside AND noted: an interrupt between the
    # two would leave them in .old.<pid> with nothing to put them back (abort_datasets reads the note)
    with signals_held():
        _REPLACING[os.path.realpath(out_dir)] = move_aside(out_dir, dataset_files(out_dir))


@contextlib.contextmanager
def signals_held():
    """Inside the block SIGINT/SIGTERM are noted, not acted on; the first is delivered as it ends.
    The handlers are swapped rather than the signal mask set: a process-wide signal goes to any thread
    that does not block it (torch's, pytest-xdist's), while Python runs its handlers in the main thread."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    got = []
    before = {s: signal.signal(s, lambda n, frame: got.append(n)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)
        if got:
            signal.raise_signal(got[0])


def dataset_files(folder):
    """The files of a dataset in folder (not whatever else a user keeps there)."""
    return [f for f in sorted(os.listdir(folder)) if re.fullmatch(r'meta\.json|.+\.bin|.+_answers\.json', f)]


def abort_dataset(out_dir):
    """A write that failed or was interrupted: its files go, the old dataset (if any) comes back."""
    key = os.path.realpath(out_dir)
    if key in _REPLACING:
        old = _REPLACING.pop(key)
        if old:
            put_back(old, dataset_files(out_dir))
        else:
            for f in dataset_files(out_dir):
                os.remove(os.path.join(out_dir, f))
    unlock_folder(out_dir)


def abort_datasets():
    """abort_dataset for every write this process began and did not finish (prepare.py, at exit)."""
    for key in list(_REPLACING):
        abort_dataset(key)

# -----------------------------------------------------------------------------
# replacing a run or a dataset: the old files are moved aside into folder/.old.<pid> (inside the
# folder: one rename each, and the lock stays where it is), deleted only once the new one exists,
# and put back if it never does. A process killed meanwhile (kill -9) leaves that folder: noted.

_REPLACING = {}  # real path of a dataset being written -> the folder holding the old one, or None


def move_aside(folder, names):
    """Move those of names that are files in folder into folder/.old.<pid> -> its path (None: no file)."""
    there = [f for f in names if os.path.isfile(os.path.join(folder, f))]
    if not there:
        return None
    aside = os.path.join(folder, f'.old.{os.getpid()}')
    os.makedirs(aside, exist_ok=True)
    for f in there:
        os.replace(os.path.join(folder, f), os.path.join(aside, f))
    return aside


def put_back(aside, new):
    """Undo move_aside: the new files (names) go, the old ones return."""
    folder = os.path.dirname(aside)
    for f in new:
        if os.path.isfile(os.path.join(folder, f)):
            os.remove(os.path.join(folder, f))
    for f in os.listdir(aside):
        os.replace(os.path.join(aside, f), os.path.join(folder, f))
    os.rmdir(aside)


def drop_aside(aside):
    """The new run or dataset exists: the old one moved aside goes. -> None"""
    if aside:
        import shutil
        shutil.rmtree(aside, ignore_errors=True)


def stale_asides(folder):
    """What processes killed mid-replacement left in folder (.old.<pid>, that pid gone)."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return [os.path.join(folder, f) for f in sorted(names) if re.fullmatch(r'\.old\.(\d+)', f) and not pid_alive(int(f[5:]))]


def remove_stale_tmp(folder, pattern=r'.+\.(?:bin|json)\.tmp\.(\d+)'):
    """Delete the temp files in folder whose name matches pattern (its one group: the writer's
    pid) and whose writer is gone: a writer killed by SIGKILL runs no cleanup. A live pid's file
    may be mid-write: kept. The default pattern is what AtomicFile names ({split}.bin.tmp.<pid>,
    ...); checkpoint.py passes its own. -> the removed paths."""
    removed = []
    for f in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        m = re.fullmatch(pattern, f)
        if not m or pid_alive(int(m.group(1))):
            continue
        try:
            os.remove(os.path.join(folder, f))
            removed.append(os.path.join(folder, f))
        except OSError:
            pass
    return removed


def pid_alive(pid):
    if pid == os.getpid():
        return False  # our own leftover cannot be mid-write: a writer cleans up before it writes
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


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
    drop_aside(_REPLACING.pop(os.path.realpath(out_dir), None))  # the new dataset exists: the old one goes
    unlock_folder(out_dir)  # the last file of a dataset: its writer is done


def write_examples(out_dir, split, generate, n, dtype, seed):
    """Write one examples split, generated in chunks of rows so that huge splits never sit
    in memory. Each split has its own RNG stream (seed, crc32(split)): the contents of one
    split do not depend on the sizes of the others. generate(rng, rows) -> (x, y) (rows, len), or
    (x, y, m) with m the recurrence mask (written to {split}_m.bin)."""
    if n < 1:
        raise DataError(f"split {split} needs at least 1 row, got n={n}")
    rng = np.random.default_rng([seed, zlib.crc32(split.encode())])
    files, T = [], None
    try:
        for start in range(0, n, 4096):
            arrays = generate(rng, min(4096, n - start))
            if not files:
                files = [AtomicFile(os.path.join(out_dir, f"{split}_{s}.bin")) for s in 'xym'[:len(arrays)]]
            T = arrays[0].shape[1]
            for f, a, dt in zip(files, arrays, (dtype, np.int32, np.uint8)):
                f.f.write(np.ascontiguousarray(a, dtype=dt).tobytes())
        for f in files:
            f.commit()
    except BaseException:
        for f in files:
            f.abort()
        raise
    return {'n': n, 'len': T}


def parse_lens(s, what):
    try:
        return [int(v) for v in s.split(',') if v.strip()]
    except ValueError:
        raise DataError(f"--{what}={s}: expected a comma list of integers, e.g. 48,64") from None


def write_task(out_dir, cfg, name, itos, make_gen, sizes, row_len=None, **extra):
    """Write the splits of a synthetic task and its meta. sizes: [(split, n, length param)],
    make_gen(length param) -> generate(rng, rows) -> (x, y), two (rows, length) int arrays:
    token ids (indices into itos) and aligned labels (-1 = none). cfg: the options (saved
    as meta 'args'; needs 'seed'). row_len(length param) -> the row length, if the task knows
    it (the built-in ones): the job is sized without generating anything; else one row of
    each split is generated to tell. extra: more meta entries (e.g. task=...).
    Everything is checked before anything is deleted or written: the seed, the row counts, and
    the size against the free disk (one line if it cannot fit); a run that fails or is
    interrupted (Ctrl-C, SIGTERM) removes what it wrote."""
    dtype = dtype_for(len(itos))
    if not isinstance(cfg['seed'], int) or cfg['seed'] < 0:  # numpy's rng would refuse it only after the old data is gone
        raise DataError(f"--seed={cfg['seed']}: must be an integer >= 0")
    need, masked = 0, False
    for i, (split, n, param) in enumerate(sizes):
        if n < 1:
            raise DataError(f"split {split} needs at least 1 row, got n={n}")
        if row_len is None or i == 0:  # one row tells the length (and whether rows carry a mask)
            row = make_gen(min(p for _, _, p in sizes) if row_len else param)(np.random.default_rng(0), 1)
            masked = len(row) == 3
        need += n * (row_len(param) if row_len else row[0].shape[1]) * (np.dtype(dtype).itemsize + 4 + masked)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create the dataset folder {out_dir} ({short(e)})") from None
    import shutil
    free = shutil.disk_usage(out_dir).free
    if need > 0.9 * free:
        raise DataError(f"{name} would take {need / 2**30:.2f} GiB but {out_dir} has {free / 2**30:.2f} GiB free: "
                        f"use fewer rows (--n_train=...) or shorter rows")
    begin_dataset(out_dir)
    splits = {}
    try:
        for split, n, param in sizes:
            splits[split] = write_examples(out_dir, split, make_gen(param), n, dtype, cfg['seed'])
            splits[split]['param'] = param
        write_meta(out_dir, dict(name=name, format='examples', vocab_size=len(itos), dtype=dtype, tokenizer='task',
                                 itos=itos, reset_token=None, splits=splits, args=cfg, **extra,
                                 **(dict(rec_mask=True) if masked else {})))
    except BaseException:
        abort_dataset(out_dir)  # this run's splits go, the old dataset comes back: nothing half-made stays
        raise
    return splits


def task_sizes(cfg, train_param, test_params):
    return ([('train', cfg['n_train'], train_param), ('val', cfg['n_val'], train_param), ('test', cfg['n_test'], train_param)]
            + [(f"test_{p}", cfg['n_test'], p) for p in test_params])

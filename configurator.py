"""
What every script shares: config overrides, one-line errors, the precision context.

Config, nanoGPT style, as a function instead of an exec'd file:

  python train.py config/t2mlr_small.py --batch_size=32 --compile=True

A script keeps its defaults as plain globals (or a dict), then calls configure(globals(), keys).
A config file is python that assigns some of those names; --key=value overrides come after
it. Values are type-checked against the defaults. Every mistake ends the program with one
line (exit 2), never a traceback.

Values on the command line: python literals (32, 1e-3, (1, 8)), else a bare string
(--dataset=s5_Z2). Booleans (parse_bool): True/true/1/yes and False/false/0/no, any case. An
int setting takes a whole float (--n_train=1e6); a tuple setting takes one value (--batch=8
means (8,)). In a config file (python) a bool must be True or False.
"""

import ast
import os
import sys
from contextlib import contextmanager, nullcontext


def fail(msg, code=2):
    """The one way a script stops on bad input: one line on stderr, no traceback."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def check_out_file(key, path):
    """An output file the script writes at the end (a picture, a JSON): its folder must exist
    and be writable, and the path must not be a folder, or minutes of work end in a traceback.
    Checked at start-up; one line naming the flag otherwise."""
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
    """A folder the script writes into at the end (creating it if need be): it must be a folder, or
    creatable, on a writable disk. Checked at start-up by writing a probe file into the nearest
    folder that exists (os.access says yes to root on a read-only disk); nothing is created."""
    import tempfile
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


BOOL_WORDS = {'true': True, '1': True, 'yes': True, 'false': False, '0': False, 'no': False}


def parse_bool(raw):
    """A command-line bool -> True/False, or None if raw is not one (the one rule of all scripts)."""
    return BOOL_WORDS.get(str(raw).strip().lower())


def _check(key, value, default, where):
    if default is None or value is None:
        return value  # None defaults take any value (e.g. optional token ids)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            fail(f"{where}: {key} must be True or False, got {value!r}")
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(default, int) and isinstance(value, float) and value.is_integer():
        return int(value)  # 1e6 rows
    if isinstance(default, tuple):
        value = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(value, (tuple, list)) or not all(type(v) is type(default[0]) for v in value):
            fail(f"{where}: {key} must be a tuple of {type(default[0]).__name__}, got {value!r}")
        return tuple(value)
    if type(value) is not type(default):
        fail(f"{where}: {key} must be {type(default).__name__}, got {type(value).__name__} {value!r}")
    return value


def parse_value(raw):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # a bare string such as --dataset=s5_Z2


def configure(g, keys, argv=None, doc=None, more=None):
    """g: the script's globals (or a dict of defaults); keys: the names that are config.
    more: further settings {name: default} the script also takes, set in that dict (train.py:
    GPTConfig's fields, dataclass_defaults). Applies config files and --key=value overrides from
    argv (default sys.argv[1:]) in order. -h/--help prints doc and every key with its default.
    -> the set of keys that were set."""
    argv = sys.argv[1:] if argv is None else argv
    keys, given = set(keys), set()
    if more:
        overlap = keys & set(more)
        assert not overlap, f"settings declared twice: {sorted(overlap)}"  # one default per setting
        g, keys = _Both(g, more), keys | set(more)
    if any(a in ('-h', '--help') for a in argv):
        print((doc or '').strip())
        print("\nsettings (--key=value; defaults):\n" + "\n".join(f"  --{k}={g[k]!r}" for k in sorted(keys)))
        raise SystemExit(0)
    for arg in argv:
        if not arg.startswith('--'):
            for k, v in read_config(arg).items():
                if k not in keys:
                    fail(f"{arg}: unknown config key {k!r}")
                g[k] = _check(k, v, g[k], arg)
                given.add(k)
        else:
            key, eq, raw = arg[2:].partition('=')
            if not eq:
                fail(f"override {arg!r} must look like --key=value")
            if key not in keys:
                fail(f"unknown config key {key!r} (known: {', '.join(sorted(keys))})")
            val = parse_value(raw)
            if isinstance(g[key], bool) and parse_bool(raw) is not None:
                val = parse_bool(raw)  # --compile=false, --compile=0
            if isinstance(g[key], str) and not isinstance(val, str):
                val = raw  # --dataset=123 stays a string
            g[key] = _check(key, val, g[key], f"--{key}")
            given.add(key)
    return given


class _Both(dict):
    """The script's settings and `more`, read and written as one mapping (configure)."""

    def __init__(self, g, more):
        super().__init__()
        self.g, self.more = g, more

    def __getitem__(self, k):
        return self.more[k] if k in self.more else self.g[k]

    def __setitem__(self, k, v):
        (self.more if k in self.more else self.g)[k] = v


def dataclass_defaults(cls, leave_out=()):
    """{field: default} of a dataclass (GPTConfig): settings a script takes by name, with the
    dataclass's own defaults and types (Optional fields, default None, take any value)."""
    from dataclasses import fields
    return {f.name: f.default for f in fields(cls) if f.name not in leave_out}


def autocast(device_type, dtype):
    """The precision context of every script: bfloat16 / float16 run as autocast over fp32
    weights; float32 and float64 (tests; the weights themselves are converted) run as they are."""
    if dtype in ('float32', 'float64'):
        return nullcontext()
    import torch
    return torch.autocast(device_type, dtype={'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype])


def read_config(path):
    """The settings a config file (python) assigns, {name: value} (its imports and _private names
    left out): the one reader of config files (configure, lab/memory.py, lab/compare.py)."""
    if not os.path.isfile(path):
        fail(f"no config file {path}")
    ns = {}
    try:
        exec(compile(open(path).read(), path, 'exec'), ns)
    except Exception as e:
        fail(f"{path}: {type(e).__name__}: {e}")
    return {k: v for k, v in ns.items() if not (k.startswith('_') or type(v).__name__ == 'module')}


def device_setup(device, dtype, seed, tf32=True):
    """The device and precision setup of every script: torch seeded, TF32 matmuls on CUDA (tf32).
    -> (device_type 'cuda' or 'cpu', the torch dtype, the precision context autocast(...))."""
    import torch
    torch.manual_seed(seed)
    device_type = 'cuda' if device.startswith('cuda') else 'cpu'
    if device_type == 'cuda' and tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device_type, getattr(torch, dtype), autocast(device_type, dtype)


@contextmanager
def compile_errors():
    """torch.compile that fails on this machine (no C++ compiler, no triton, an unsupported
    torch build) ends the script with one line that says how to run without it. An error that
    does not come from the compiler (its type, or a cause's, is not torch._dynamo's or
    torch._inductor's) passes through."""
    try:
        yield
    except Exception as e:
        chain, err = [], e
        while err is not None and len(chain) < 20:
            chain.append(err)
            err = err.__cause__ or err.__context__
        if not any(type(x).__module__.startswith(('torch._dynamo', 'torch._inductor')) for x in chain):
            raise
        first = (str(e).strip().splitlines() or [''])[0][:200]
        fail(f"torch.compile failed on this machine: {type(e).__name__}: {first}; run with --compile=False")

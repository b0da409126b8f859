"""What every script shares: its settings, one-line errors, the precision context. A script keeps its defaults as
globals (or a dict) and calls configure(globals(), keys): config files (python assigning some), then --key=value
(python literals, else a bare string; bools true/1/yes, false/0/no; an int takes 1e6, a tuple one value), each
checked against its default's type. Every mistake ends the program with one line (exit 2)."""
import ast
import os
import sys
from contextlib import contextmanager, nullcontext

def fail(msg, code=2):  # the one way a script stops on bad input: one line on stderr, no traceback
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(code)

def parse_bool(raw):  # a command-line bool -> True/False, or None if raw is not one (every script's rule)
    return {'true': True, '1': True, 'yes': True, 'false': False, '0': False, 'no': False}.get(str(raw).strip().lower())

def parse_value(raw):  # a python literal, else the bare string (--dataset=s5_Z2)
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw

def _check(key, value, default, where):  # value in default's type (None defaults take any), or one line
    if default is None or value is None or type(value) is type(default) and not isinstance(default, tuple):
        return value
    if type(default) is float and type(value) is int or type(default) is int and type(value) is float and value.is_integer():
        return type(default)(value)  # 1e6 rows, a learning rate of 1
    if isinstance(default, tuple):
        value = (value,) if type(value) is int else value
        if isinstance(value, (tuple, list)) and all(type(v) is type(default[0]) for v in value):
            return tuple(value)
    what = 'True or False' if isinstance(default, bool) else f"a tuple of {type(default[0]).__name__}" if isinstance(default, tuple) else type(default).__name__
    fail(f"{where}: {key} must be {what}, got {type(value).__name__} {value!r}")

def read_config(path):  # {name: value} a config file assigns, its imports and _private names left out
    ns = {} if os.path.isfile(path) else fail(f"no config file {path}")
    try:
        exec(compile(open(path).read(), path, 'exec'), ns)
    except Exception as e:
        fail(f"{path}: {type(e).__name__}: {e}")
    return {k: v for k, v in ns.items() if not (k.startswith('_') or type(v).__name__ == 'module')}

def configure(g, keys, argv=None, doc=None):  # argv's config files, --key=value in order into g (-h: doc, defaults) -> keys set
    argv, keys, given = sys.argv[1:] if argv is None else argv, set(keys), set()
    if any(a in ('-h', '--help') for a in argv):
        print((doc or '').strip() + "\n\nsettings (--key=value; defaults):\n" + "\n".join(f"  --{k}={g[k]!r}" for k in sorted(keys)))
        raise SystemExit(0)
    for arg in argv:
        flag, (key, eq, raw) = arg.startswith('--'), arg[2:].partition('=')
        if flag and not eq:
            fail(f"override {arg!r} must look like --key=value")
        for k, v in ([(key, parse_value(raw))] if flag else read_config(arg).items()):
            if k not in keys:
                fail(f"unknown config key {k!r} (known: {', '.join(sorted(keys))})" if flag else f"{arg}: unknown config key {k!r}")
            if flag and (isinstance(g[k], bool) and parse_bool(raw) is not None or isinstance(g[k], str) and not isinstance(v, str)):
                v = raw if isinstance(g[k], str) else parse_bool(raw)  # --compile=false (or 0); --dataset=123 stays a string
            g[k] = _check(k, v, g[k], f"--{k}" if flag else arg)
            given.add(k)
    return given

def device_setup(device, dtype, seed, tf32=True):  # torch seeded, TF32 on CUDA -> (device_type, dtype, bf16/fp16 autocast)
    import torch
    torch.manual_seed(seed)
    device_type = 'cuda' if device.startswith('cuda') else 'cpu'
    if device_type == 'cuda' and tf32:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    return device_type, getattr(torch, dtype), (nullcontext() if dtype in ('float32', 'float64')
                                                else torch.autocast(device_type, dtype=getattr(torch, dtype)))

@contextmanager
def compile_errors():  # torch.compile failing here (an error of torch._dynamo/_inductor, or caused by one): one line
    try:
        yield
    except Exception as e:
        chain = [e]  # e and its causes
        while len(chain) < 20 and (x := chain[-1].__cause__ or chain[-1].__context__) is not None:
            chain.append(x)
        if not any(type(x).__module__.startswith(('torch._dynamo', 'torch._inductor')) for x in chain):
            raise
        fail(f"torch.compile failed on this machine: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}; run with --compile=False")

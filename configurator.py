"""
Config overrides, nanoGPT style, as a function instead of an exec'd file:

  python train.py config/t2mlr_small.py --batch_size=32 --compile=True

A script keeps its defaults as plain globals, then calls configure(globals(), keys).
A config file is python that assigns some of those globals; --key=value overrides
come after it. Values are type-checked against the defaults. Every mistake ends
the program with one line (exit 2), never a traceback.

Booleans on the command line, in every script (parse_bool): True/true/1/yes and
False/false/0/no, case-insensitive. In a config file (python) a bool must be True or False.
"""

import ast
import os
import sys


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


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
    elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif type(value) is not type(default):
        fail(f"{where}: {key} must be {type(default).__name__}, got {type(value).__name__} {value!r}")
    return value


def _parse(raw):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # a bare string such as --dataset=s5_Z2


def configure(g, keys, argv=None):
    """g: the script's globals; keys: the names that are config. Applies config
    files and --key=value overrides from argv (default sys.argv[1:]) in order."""
    argv = sys.argv[1:] if argv is None else argv
    keys = set(keys)
    for arg in argv:
        if not arg.startswith('--'):
            if not os.path.isfile(arg):
                fail(f"no config file {arg}")
            ns = {}
            try:
                exec(compile(open(arg).read(), arg, 'exec'), ns)
            except Exception as e:
                fail(f"{arg}: {type(e).__name__}: {e}")
            for k, v in ns.items():
                if k.startswith('_') or k == '__builtins__' or type(v).__name__ == 'module':
                    continue
                if k not in keys:
                    fail(f"{arg}: unknown config key {k!r}")
                g[k] = _check(k, v, g[k], arg)
        else:
            key, eq, raw = arg[2:].partition('=')
            if not eq:
                fail(f"override {arg!r} must look like --key=value")
            if key not in keys:
                fail(f"unknown config key {key!r}")
            val = _parse(raw)
            if isinstance(g[key], bool) and parse_bool(raw) is not None:
                val = parse_bool(raw)  # --compile=false, --compile=0
            if isinstance(g[key], str) and not isinstance(val, str):
                val = raw  # --dataset=123 stays a string
            g[key] = _check(key, val, g[key], f"--{key}")

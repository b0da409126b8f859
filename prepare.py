"""
Prepare a dataset for train.py, sample.py and lab/evaluate.py:

    python prepare.py s5 --group=S5                    # state tracking       -> data/s5_S5
    python prepare.py s5 --group=Z2 --train_len=32     # parity               -> data/s5_Z2
    python prepare.py s5_retrieval --group=S5          # T2MLR S5-Retrieval   -> data/s5_retrieval_S5
    python prepare.py varassign --depth=4              # variable assignment  -> data/varassign
    python prepare.py assoc --n_pairs=8                # associative recall (lookup, no state) -> data/assoc
    python prepare.py stdlib_char                      # Python's own stdlib, characters, offline -> data/stdlib_char
    python prepare.py text --input=input.txt --tokenizer=char   # local text  -> data/input
    python prepare.py tinystories --max_tokens=100e6   # Hub corpora, GPT-2 tokens (needs internet)
    python prepare.py fineweb_edu --num_proc=16
    python prepare.py jsonl --input=data.jsonl --tokenizer=HuggingFaceTB/SmolLM2-1.7B-Instruct  # prompt/response
    python prepare.py gsm8k --tokenizer=HuggingFaceTB/SmolLM2-1.7B-Instruct   # GSM8K for fine-tuning (needs internet)
    python prepare.py tiny_retrofit_demo               # offline: a tiny random Llama + tokenizer + JSONL, prepared

Every option is --key=value; `python prepare.py NAME --help` lists NAME's options.
Downloads wait at most FETCH_TIMEOUT seconds (environment variable, default 30) for an answer.
The format of a dataset, and its readers: support/dataset.py. The tasks: support/tasks.py; text corpora:
support/corpora.py; prompt/response data: support/sft.py.
"""

import os
import signal
import sys

from configurator import configure, fail
from support import corpora, sft, tasks
from support.dataset import abort_datasets, load_meta, release_locks

DATASETS = {  # name: (its options with their defaults, the function that writes it)
    's5': (tasks.S5_DEFAULTS, tasks.prepare_s5),
    's5_retrieval': (tasks.RETRIEVAL_DEFAULTS, tasks.prepare_s5_retrieval),
    'varassign': (tasks.VARASSIGN_DEFAULTS, tasks.prepare_varassign),
    'assoc': (tasks.ASSOC_DEFAULTS, tasks.prepare_assoc),
    'text': (corpora.TEXT_DEFAULTS, corpora.prepare_text),
    'fineweb_edu': (corpora.HUB_DEFAULTS, lambda cfg: corpora.prepare_hub(cfg, 'fineweb_edu')),
    'tinystories': (corpora.HUB_DEFAULTS, lambda cfg: corpora.prepare_hub(cfg, 'tinystories')),
    'stdlib_char': (corpora.STDLIB_DEFAULTS, corpora.prepare_stdlib_char),
    'jsonl': (sft.JSONL_DEFAULTS, sft.prepare_jsonl),
    'gsm8k': (sft.GSM8K_DEFAULTS, sft.prepare_gsm8k),
    'tiny_retrofit_demo': (sft.DEMO_DEFAULTS, sft.prepare_tiny_retrofit_demo),
}


# the least value of every count, length and seed option (of whichever datasets have it): checked
# before anything is deleted or generated. A negative seed used to be refused by numpy only after
# the old dataset's meta.json was gone; a negative --max_files sliced from the end
MINIMUM = dict(seed=0, n_train=1, n_val=1, n_test=1, train_len=1, n_actions=1, k=1, depth=0, n_chains=1, n_branch=0,
               n_vars=1, num_proc=1, max_tokens=0, max_files=0, hold_out_every=3, max_len=1, n_records=1, digits=1)
LISTS = dict(test_lens=1, test_actions=1, test_depths=0)  # comma lists of lengths


def check_args(cfg):
    """One line (exit 2) for an option out of its range; the datasets check the rest (group names,
    the row lengths and the disk) before they delete or write anything."""
    for k, least in MINIMUM.items():
        if k in cfg and cfg[k] < least:
            fail(f"--{k}={cfg[k]}: must be >= {least}")
    for k, least in LISTS.items():
        if k in cfg:
            try:
                lens = [int(v) for v in cfg[k].split(',') if v.strip()]
            except ValueError:
                fail(f"--{k}={cfg[k]}: expected a comma list of integers, e.g. 48,64")
            if lens and min(lens) < least:
                fail(f"--{k}={cfg[k]}: every length must be >= {least}")


def check_out_dir(path):
    """--out_dir must be a folder, or a path one can create: a file there (or above it) was a traceback."""
    if not path:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        fail(f"--out_dir={path} is a file, not a folder")
    up = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        fail(f"--out_dir={path}: cannot create it ({up} is a file)")


def main(argv):
    if not argv or argv[0] in ('-h', '--help'):
        print(__doc__.strip())
        sys.exit(0 if argv else 2)
    name = argv[0]
    if name not in DATASETS:
        fail(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    defaults, prepare = DATASETS[name]
    cfg = dict(defaults)
    configure(cfg, defaults, argv[1:], doc=f"python prepare.py {name} [--key=value ...]\n\n{prepare.__doc__ or ''}")
    check_args(cfg)
    check_out_dir(cfg.get('out_dir'))
    # SIGTERM as Ctrl-C: the writers' cleanup runs, nothing half-written stays behind
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        out_dir = prepare(dict(cfg, dataset=name))
    except KeyboardInterrupt:
        fail(f"interrupted: {name} was not written (the partial files were removed, an older dataset there kept)", 130)
    finally:
        signal.signal(signal.SIGTERM, previous)
        abort_datasets()  # a write that did not finish: the old dataset back (a no-op after a success)
        release_locks()  # (what the exit does; main may run in a test's process)
    meta = load_meta(out_dir)
    sizes = ', '.join(f"{s} {v['n']:,}" + (f"x{v['len']}" if 'len' in v else '') for s, v in meta['splits'].items())
    print(f"wrote {out_dir}: {meta['format']}, vocab {meta['vocab_size']}, {sizes}")


if __name__ == '__main__':
    main(sys.argv[1:])

"""
Checkpoints in and out of model.GPT: the one format train.py, sample.py, lab/evaluate.py
and lab/prefill.py share, and the import of a pretrained Hugging Face Llama (SmolLM2, ...) for retrofitting.

  save_checkpoint(ckpt, path)          atomic and durable (temp file, fsync, rename, fsync dir)
  load_checkpoint(path) -> (model, ckpt)   every failure one CheckpointError line; checkpoints
                                       of older versions of this repo are upgraded on load
  read_checkpoint(path) -> ckpt        the file alone, unpickled safely (weights_only: no code runs)
  build_model(model_args)              model.GPT, or lstm.LSTM (the baseline) for arch='lstm'
  from_pretrained(name, **overrides)   a Hugging Face Llama checkpoint as a GPT, the recurrence at identity
  to_hf_llama(model)                   the backbone of a GPT as a transformers LlamaForCausalLM (same weights)

A model to run, and the dataset it reads (sample.py and lab/evaluate.py; bad input: one line):
  check_run_settings(...)              device, dtype, ckpt, prefill, attn_window
  load_model(init_from, out_dir, device, which) -> (model or None, the run's config)
  find_data(train_config, model, name, data_root, root_given) -> (data_dir, meta)
  finish_model(model, meta, device, attn_window)   scratch_model for None, checked, eval mode
"""

import os
import re
import sys

import numpy as np
import torch

from configurator import fail
from lab.model_full import GPT, GPTConfig
from support import dataset
from support.lstm import LSTM, LSTMConfig


class CheckpointError(ValueError):
    pass

# -----------------------------------------------------------------------------
# save and load

def save_checkpoint(ckpt, path):
    """Write a temporary file next to path, fsync it, rename it over path, fsync the folder:
    an interrupted save (or a power cut) never destroys the last good checkpoint. A save
    killed mid-write leaves path.tmp.<pid>: remove_stale_tmp. A save that fails (a full disk,
    no permission) removes its temp file and is one dataset.DataError line."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, 'wb') as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # a full disk, a folder turned read-only: one line, path untouched
        error = dataset.write_error(e, path)  # (before the partial file goes: a full disk still looks full)
        if os.path.exists(tmp):
            os.remove(tmp)
        if error is None:
            raise
        raise error from None
    try:  # make the rename durable (a no-op where folders cannot be opened)
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


# What our checkpoints hold beyond tensors and plain Python data: numpy's RNG state (an ndarray of
# uint32; numpy 1 pickles its rebuild function under numpy.core, numpy 2 under numpy._core). A
# checkpoint is a pickle, and a pickle can name any function to call on load: torch.load with
# weights_only=True calls none but these, so a shared checkpoint cannot run code.
_rebuild = np._core.multiarray._reconstruct if hasattr(np, '_core') else np.core.multiarray._reconstruct
SAFE_GLOBALS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), _rebuild,
                (_rebuild, 'numpy.core.multiarray._reconstruct'), (_rebuild, 'numpy._core.multiarray._reconstruct')]


def read_checkpoint(path, device='cpu'):
    """torch.load of a checkpoint file with weights_only=True and the allowlist above. A file that
    needs anything else (a pickle that would call a function: what a crafted file does to run code)
    is refused, one CheckpointError line, before anything of it runs."""
    import pickle
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        m = re.search(r'[Uu]nsupported (?:global: )?GLOBAL (\S+)', str(e))
        if m:  # (other refusals, e.g. an unknown opcode, are corrupt or foreign files: below)
            raise CheckpointError(f"{path} was refused: loading it would call {m.group(1)}, which no checkpoint of "
                                  f"this repo holds (a crafted or foreign file; torch.load(weights_only=True))") from None
        why = re.search(r'WeightsUnpickler error:\s*(.+)', str(e))  # (torch's advice around it is not ours to give)
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated?): "
                              f"{why.group(1).strip() if why else dataset.short(e)}") from None
    except PermissionError:
        raise CheckpointError(f"cannot read {path} (permission denied)") from None
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated?): {type(e).__name__}: {e}") from None


def remove_stale_tmp(path):
    """Delete the temporary files save_checkpoint(..., path) left when a process was killed
    mid-save: only names path.tmp.<pid> (our own pattern) whose process is gone. -> the removed paths."""
    folder, name = os.path.split(os.path.abspath(path))
    return dataset.remove_stale_tmp(folder, re.escape(name) + r'\.tmp\.(\d+)')


def upgrade_state_dict(sd, config):
    """State dicts written by older versions of this repo, in today's layout:
      wq, wk, wv -> wqkv; w_gate, w_up -> w_gu (the fused projections, stacked by rows);
      LRT in one module: lrt_fb_k.j + lrt_fb_v.j, lrt_fb.j or lrt.fb.j -> lrt.w_fb.j,
      h.i.attn.lrt_gate -> lrt.gate.(i - s), the per-block scalars h.i.lrt_alpha / h.i.lrt_gamma
      -> the vectors lrt.alpha / lrt.gamma (one entry per reading layer i >= s)."""
    fused = {'.attn.wq.weight': ('.attn.wqkv.weight', ('.attn.wq.weight', '.attn.wk.weight', '.attn.wv.weight')),
             '.mlp.w_gate.weight': ('.mlp.w_gu.weight', ('.mlp.w_gate.weight', '.mlp.w_up.weight'))}
    s = config.rec_start
    alpha, gamma = {}, {}
    for key in list(sd):
        for first, (new, parts) in fused.items():
            if key.endswith(first):
                pre = key[:-len(first)]
                sd[pre + new] = torch.cat([sd.pop(pre + p) for p in parts], 0)
        if key.startswith('lrt_fb_k.'):
            j = key.split('.')[1]
            sd[f'lrt.w_fb.{j}.weight'] = torch.cat([sd.pop(key), sd.pop(f'lrt_fb_v.{j}.weight')], 0)
        elif key.startswith(('lrt_fb.', 'lrt.fb.')):
            sd['lrt.w_fb.' + key.split('fb.', 1)[1]] = sd.pop(key)
        m = re.fullmatch(r'h\.(\d+)\.(attn\.lrt_gate\.weight|lrt_alpha|lrt_gamma)', key)
        if m:
            i, what = int(m.group(1)), m.group(2)
            if what == 'attn.lrt_gate.weight':
                sd[f'lrt.gate.{i - s}.weight'] = sd.pop(key)
            else:
                (alpha if what == 'lrt_alpha' else gamma)[i] = sd.pop(key)
    for name, vals in (('alpha', alpha), ('gamma', gamma)):
        if vals:
            sd[f'lrt.{name}'] = torch.stack([vals[i] for i in sorted(vals)])
    return sd


def model_config(model_args):
    """The config model args describe: lstm.LSTMConfig where model_args['arch'] == 'lstm' (the
    baseline), else lab/model_full.py's GPTConfig (the research model, which reads every checkpoint
    this repo wrote, model.py's too). Keys the config does not have are left out."""
    cls = LSTMConfig if model_args.get('arch') == 'lstm' else GPTConfig  # (train.py on model.py: issue 64, open)
    return cls(**{k: v for k, v in model_args.items() if k in cls.__dataclass_fields__})


def build_model(model_args):
    """A fresh model from a config's or a checkpoint's model args: lstm.LSTM or the lab's GPT (model_config)."""
    config = model_config(model_args)
    return LSTM(config) if isinstance(config, LSTMConfig) else GPT(config)


def load_checkpoint(path, device='cpu'):
    """Returns (model, ckpt). ckpt holds at least 'model' (state dict) and 'model_args'
    (GPTConfig fields). Every failure is one CheckpointError line."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    ckpt = read_checkpoint(path, device)
    if not isinstance(ckpt, dict) or 'model' not in ckpt or 'model_args' not in ckpt:
        raise CheckpointError(f"{path} is not a checkpoint of this repo (no 'model'/'model_args')")
    lstm = ckpt['model_args'].get('arch') == 'lstm'
    unknown = set(ckpt['model_args']) - set((LSTMConfig if lstm else GPTConfig).__dataclass_fields__)
    if unknown:
        raise CheckpointError(f"{path} has model args this code does not know: {sorted(unknown)}")
    try:
        model = build_model(ckpt['model_args'])
    except ValueError as e:
        raise CheckpointError(f"{path}: invalid model args: {e}") from None
    sd = {k.removeprefix('_orig_mod.').removeprefix('module.'): v for k, v in ckpt['model'].items()}
    sd = sd if lstm else upgrade_state_dict(sd, model.config)
    if {v.dtype for v in sd.values() if v.is_floating_point()} == {torch.float64}:
        model = model.double()  # a float64 run (tests): loading into float32 would round the weights
    try:
        model.load_state_dict(sd)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise CheckpointError(f"{path}: weights do not fit the model: {' '.join(first[:2])[:300]}") from None
    return model.to(device), ckpt

# -----------------------------------------------------------------------------
# retrofit: a pretrained Hugging Face Llama checkpoint (SmolLM2, ...) as a GPT

def smollm2_135m_config(**overrides):
    """The shape of SmolLM2-135M (the T2MLR paper's backbone)."""
    args = dict(block_size=2048, vocab_size=49152, n_layer=30, n_head=9, n_kv_head=3,
                n_embd=576, mlp_hidden=1536, rope_theta=100000.0, norm_eps=1e-5, tie_embeddings=True)
    args.update(overrides)
    return GPTConfig(**args)


# our parameter name -> LlamaForCausalLM's ({i}: layer index); a tuple: our matrix is theirs
# stacked by rows (fused projections). Both use the rotate_half RoPE convention on q/k as
# stored, so no weight is permuted.
HF_LLAMA_NAMES = {
    'wte.weight': 'model.embed_tokens.weight',
    'h.{i}.ln_1.weight': 'model.layers.{i}.input_layernorm.weight',
    'h.{i}.attn.wqkv.weight': ('model.layers.{i}.self_attn.q_proj.weight', 'model.layers.{i}.self_attn.k_proj.weight',
                               'model.layers.{i}.self_attn.v_proj.weight'),
    'h.{i}.attn.wo.weight': 'model.layers.{i}.self_attn.o_proj.weight',
    'h.{i}.ln_2.weight': 'model.layers.{i}.post_attention_layernorm.weight',
    'h.{i}.mlp.w_gu.weight': ('model.layers.{i}.mlp.gate_proj.weight', 'model.layers.{i}.mlp.up_proj.weight'),
    'h.{i}.mlp.w_down.weight': 'model.layers.{i}.mlp.down_proj.weight',
    'ln_f.weight': 'model.norm.weight',
    'lm_head.weight': 'lm_head.weight',
}


def hf_llama_config_args(hf, name):
    """GPTConfig fields from a transformers config. Anything this GPT would not reproduce
    exactly (biases, another activation, scaled RoPE, ...) is an error."""
    def bad(msg):
        raise CheckpointError(f"{name}: {msg}")
    if hf.model_type != 'llama':
        bad(f"model_type {hf.model_type!r} is not a Llama-architecture checkpoint (from_pretrained loads model_type 'llama', e.g. SmolLM2)")
    if getattr(hf, 'hidden_act', 'silu') != 'silu':
        bad(f"hidden_act {hf.hidden_act!r} is not supported (the MLP is SwiGLU: silu)")
    for k in ('attention_bias', 'mlp_bias'):
        if getattr(hf, k, False):
            bad(f"{k}=True is not supported (this GPT has no biases)")
    n_head = hf.num_attention_heads
    head_dim = getattr(hf, 'head_dim', None) or hf.hidden_size // n_head
    if head_dim * n_head != hf.hidden_size:
        bad(f"head_dim={head_dim} is not supported (this GPT needs head_dim * num_attention_heads = hidden_size = {hf.hidden_size})")
    rope = dict(getattr(hf, 'rope_parameters', None) or {})  # transformers >= 5
    scaling = rope or dict(getattr(hf, 'rope_scaling', None) or {})  # transformers 4
    rope_type = scaling.get('rope_type', scaling.get('type', 'default'))
    if rope_type != 'default':
        bad(f"rope scaling {rope_type!r} is not supported (only plain RoPE: rope_type 'default')")
    return dict(block_size=hf.max_position_embeddings, vocab_size=hf.vocab_size,
                n_layer=hf.num_hidden_layers, n_head=n_head,
                n_kv_head=getattr(hf, 'num_key_value_heads', None) or n_head,
                n_embd=hf.hidden_size, mlp_hidden=hf.intermediate_size,
                rope_theta=float(rope.get('rope_theta', getattr(hf, 'rope_theta', 10000.0))),
                norm_eps=float(hf.rms_norm_eps), tie_embeddings=bool(hf.tie_word_embeddings))


def from_pretrained(name_or_path, dtype=torch.float32, **overrides):
    """A Hugging Face Llama checkpoint (e.g. 'HuggingFaceTB/SmolLM2-135M' or a local folder)
    as a GPT; overrides are GPTConfig fields (recurrence, rec_start, ...). Weights are read in
    the checkpoint's dtype and copied (exactly, upcast) into a model built in `dtype` (float32
    by default; float64 builds float64 RoPE tables too). block_size may be overridden; the
    other backbone fields come from the checkpoint. The recurrence starts at identity, so the
    logits equal the pretrained model's: T2MLR's gates g_cur = g_rec = 0 always; LRT gets
    lrt_identity_init=True unless the caller passes lrt_identity_init=False. T2MLR defaults to
    rec_gate_gain=1e-2 (DESIGN.md 3, fine-tuning). Needs the optional package transformers.
    Every failure is one CheckpointError/ImportError line."""
    try:
        from transformers import AutoConfig, LlamaForCausalLM
    except ImportError:
        raise ImportError("from_pretrained needs the optional package transformers: pip install transformers") from None
    name = str(name_or_path)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    local = os.path.isdir(os.path.expanduser(name))
    if not local and (os.path.isabs(name) or name.startswith(('.', '~')) or os.path.exists(name)):
        raise CheckpointError(f"no checkpoint folder at {name}")
    name = os.path.expanduser(name) if local else name

    def one_line(e):
        return ' '.join(str(e).split())[:300]
    try:
        hf_config = AutoConfig.from_pretrained(name)
    except Exception as e:
        if local:
            raise CheckpointError(f"{name}: no readable config.json: {one_line(e)}") from None
        raise CheckpointError(f"{name!r} is not a local folder and could not be fetched from the Hugging Face Hub "
                              f"(offline, or no such repo?): {one_line(e)}") from None
    args = hf_llama_config_args(hf_config, name)
    fixed = (set(args) - {'block_size'}) & set(overrides)
    if fixed:
        raise CheckpointError(f"{name}: {sorted(fixed)} are set by the checkpoint and cannot be overridden")
    unknown = set(overrides) - set(GPTConfig.__dataclass_fields__)
    if unknown:
        raise CheckpointError(f"{name}: unknown GPTConfig fields {sorted(unknown)}")
    if overrides.get('recurrence') == 'lrt':
        overrides.setdefault('lrt_identity_init', True)
    if overrides.get('recurrence') == 't2mlr':
        overrides.setdefault('rec_gate_gain', 1e-2)
    config = GPTConfig(**{**args, **overrides})  # invalid overrides: GPTConfig's own ValueError

    try:
        hf = LlamaForCausalLM.from_pretrained(name, dtype='auto')  # the checkpoint's own dtype
    except Exception as e:
        raise CheckpointError(f"{name}: could not load the weights: {one_line(e)}") from None
    theirs = hf.state_dict()
    sd = {}
    for ours, key in HF_LLAMA_NAMES.items():
        if ours == 'lm_head.weight' and config.tie_embeddings:
            theirs.pop(key, None)  # the same tensor as the embedding
            continue
        for i in (range(config.n_layer) if '{i}' in ours else [None]):
            parts = []
            for k in ((key,) if isinstance(key, str) else key):
                k = k.format(i=i)
                if k not in theirs:
                    raise CheckpointError(f"{name}: the checkpoint has no weight {k}")
                parts.append(theirs.pop(k))
            sd[ours.format(i=i)] = torch.cat(parts, 0)  # fused projections: stacked by rows
    if theirs:
        raise CheckpointError(f"{name}: weights this GPT has no place for: {sorted(theirs)[:5]}")
    del hf

    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if dtype == torch.float64 else torch.float32)
    try:
        model = GPT(config)  # recurrence parameters initialised at identity
    finally:
        torch.set_default_dtype(prev)
    try:
        missing, _ = model.load_state_dict(sd, strict=False)  # exact upcast to the model's dtype
    except RuntimeError as e:
        raise CheckpointError(f"{name}: weights do not fit the config: {one_line(e)}") from None
    missing = [k for k in missing if not GPT.is_rec_param(k) and not (k == 'lm_head.weight' and config.tie_embeddings)]
    assert not missing, f"backbone weights not loaded: {missing}"
    return model.to(dtype)


def to_hf_llama(model):
    """The backbone of a GPT (no recurrence parameters) as a transformers LlamaForCausalLM with the
    same weights, in the model's dtype and device: the export of HF_LLAMA_NAMES. lab/hf_peer.py times
    it as a peer; lab/official.py wraps it in the official T2MLR code. Needs transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM
    c = model.config
    if not c.rope or c.attn_window:
        raise CheckpointError("to_hf_llama: a Llama has RoPE and full attention (rope=True, attn_window=0)")
    hc = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.mlp_hidden,
                     num_hidden_layers=c.n_layer, num_attention_heads=c.n_head, num_key_value_heads=c.n_kv_head,
                     max_position_embeddings=c.block_size, rope_theta=c.rope_theta, rms_norm_eps=c.norm_eps,
                     tie_word_embeddings=c.tie_embeddings, attention_bias=False, mlp_bias=False,
                     bos_token_id=None, eos_token_id=None, pad_token_id=None)
    p = next(model.parameters())
    hf = LlamaForCausalLM(hc).to(device=p.device, dtype=p.dtype).eval()
    ours, theirs = model.state_dict(), {}
    shapes = {k: t.shape for k, t in hf.state_dict().items()}
    for k_ours, k_hf in HF_LLAMA_NAMES.items():
        for i in (range(c.n_layer) if '{i}' in k_ours else [None]):
            keys = [k.format(i=i) for k in ((k_hf,) if isinstance(k_hf, str) else k_hf)]
            if keys[0] not in shapes:
                continue  # lm_head, tied
            w = ours[k_ours.format(i=i)]
            w = w[:c.vocab_size] if k_ours in ('wte.weight', 'lm_head.weight') else w  # padded rows: not theirs
            # our fused projections are theirs stacked by rows: split them back
            for k, part in zip(keys, w.split([shapes[k][0] for k in keys], 0)):
                theirs[k] = part
    missing, unexpected = hf.load_state_dict(theirs, strict=False)
    assert not unexpected and all('lm_head' in k for k in missing), (missing, unexpected)
    return hf

# -----------------------------------------------------------------------------
# a model to run and its dataset: what sample.py and lab/evaluate.py share

def check_run_settings(device, dtype, ckpt, prefill, attn_window):
    """The settings of running a model that every script running one takes: one line each, at start."""
    if device.startswith('cuda') and not torch.cuda.is_available():
        fail(f"device={device} but torch.cuda.is_available() is False")
    if dtype not in ('float32', 'bfloat16'):
        fail(f"dtype={dtype}: expected float32 or bfloat16")
    if ckpt not in ('latest', 'best'):
        fail(f"ckpt={ckpt!r}: expected 'latest' (out_dir/ckpt.pt) or 'best' (out_dir/best.pt)")
    if prefill not in ('', 'exact', 'jacobi', 'plain'):
        fail(f"prefill={prefill}: expected exact, jacobi or plain")
    if attn_window < -1:
        fail(f"attn_window={attn_window}: must be >= 0 (0 = full attention), or -1 for the model's own")


def load_model(init_from, out_dir, device, which='latest'):
    """-> (model, the run's config dict); (None, {}) for init_from='scratch' (finish_model builds it
    once the dataset is known). which: 'latest' (ckpt.pt) or 'best' (best.pt) for init_from='resume'.
    A checkpoint problem ends the program with one line (exit 1)."""
    if init_from == 'scratch':
        return None, {}
    if init_from != 'resume' and not init_from.endswith('.pt'):
        if dataset.missing_folder(init_from):  # not a Hub download that fails
            fail(f"init_from={init_from}: no such folder (a local path; a Hugging Face name is owner/name)")
        if not os.path.isdir(os.path.expanduser(init_from)):
            dataset.check_hub(f"the model {init_from}")  # a network that never answers: one line, not a hang
        try:  # a pretrained Hugging Face model, recurrence off: the baseline a retrofit starts from
            return from_pretrained(init_from).to(device), {}
        except (CheckpointError, ImportError) as e:
            fail(str(e))
    path = os.path.join(out_dir, {'latest': 'ckpt.pt', 'best': 'best.pt'}[which]) if init_from == 'resume' else init_from
    try:
        model, ckpt = load_checkpoint(path, device)
    except CheckpointError as e:
        fail(str(e), code=1)
    kind = f"the {which} checkpoint" if init_from == 'resume' else "checkpoint"
    best = ckpt.get('best_val_loss', 1e9)
    print(f"note: loaded {kind} {path} (step {ckpt.get('iter_num', '?')}"
          + (f", best exact val loss {best:.4f})" if best < 1e9 else ")"), file=sys.stderr)
    return model, dict(ckpt.get('config') or {}, data=ckpt.get('data'))


def refuse_for_lstm(model, given):
    """given: {setting: value} the user set that an LSTM has no use for (no attention, no latent
    state, its prompt always runs exactly): one line, where it would be ignored or a traceback."""
    if model is not None and getattr(model.config, 'arch', 'gpt') == 'lstm':
        for k, v in given.items():
            fail(f"{k}={v!r} does not apply to an LSTM (its prompt always runs exactly; it has no "
                 f"attention and no latent state to trace)")


def find_data(train_config, model, name, data_root, root_given):
    """The dataset to read: data_root/name, else the one the run was trained on (its data_root,
    unless root_given: the flag wins), else GPT-2 tokens for a model of GPT-2's vocabulary.
    -> (data_dir or None, meta). A vocabulary other than the one the model learned is one line."""
    if name:
        data_dir = os.path.join(data_root, name)
    elif train_config.get('dataset'):
        root = data_root if root_given else train_config.get('data_root', data_root)
        data_dir = os.path.join(root, train_config['dataset'])
    else:
        data_dir = None
    if data_dir is not None:
        meta = dataset.load_meta(data_dir)
    elif model is None or model.config.vocab_size >= 50257:
        meta = dict(name='gpt2', tokenizer='gpt2', reset_token=50256, vocab_size=50257, format='tokens')
        print("note: no dataset given or recorded in the checkpoint: using the GPT-2 tokenizer", file=sys.stderr)
    else:
        fail("the checkpoint records no dataset: give --dataset=NAME (a folder of data_root made by prepare.py)")
    trained_on = train_config.get('data')  # the vocabulary the checkpoint was trained with (train.py records it)
    if trained_on and data_dir is not None and dataset.data_fingerprint(meta)['vocab_crc'] != trained_on['vocab_crc']:
        fail(f"dataset {meta['name']} has another vocabulary than {trained_on['name']}, which the model was trained "
             f"on ({trained_on['tokenizer']}, {trained_on['vocab_size']} tokens): its tokens would mean other things")
    return data_dir, meta


def scratch_model(meta, device):
    """A fresh tiny T2MLR model (untrained) of the dataset's vocabulary: checks the plumbing without a checkpoint."""
    vocab = meta['vocab_size'] if meta else 50304  # GPT-2's vocab padded to a multiple of 64
    config = GPTConfig(block_size=1024, vocab_size=vocab, n_layer=2, n_head=2, n_kv_head=1, n_embd=32,
                       recurrence='t2mlr', rec_start=0, rec_end=1, reset_token=(meta or {}).get('reset_token'))
    return GPT(config).to(device)


def finish_model(model, meta, device, attn_window=-1):
    """The model ready to run on meta's data (a scratch model for None), in eval mode, with
    attention window attn_window if >= 0 (0 = full attention; a diagnostic); one note says what it is."""
    model = scratch_model(meta, device) if model is None else model
    if meta['vocab_size'] > model.config.vocab_size:
        fail(f"dataset {meta['name']} has {meta['vocab_size']} tokens but the model only {model.config.vocab_size}")
    if attn_window >= 0:
        model.config.attn_window = attn_window
    model.eval()
    print(f"model: {getattr(model.config, 'arch', model.config.recurrence)}, {model.config.n_layer} layers, "
          f"d={model.config.n_embd}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters; "
          f"data: {meta['name']}", file=sys.stderr)
    return model

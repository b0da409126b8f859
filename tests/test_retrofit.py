"""GPT.from_pretrained: a Hugging Face Llama checkpoint (SmolLM2 architecture) loaded
into our GPT gives the same logits as transformers' own model, with or without a
recurrence added at identity. Offline: tiny random checkpoints written to tmp_path.

Tolerance. transformers' Llama runs two pieces in float32 even when the model is
float64: LlamaRMSNorm upcasts its input to float32, and LlamaRotaryEmbedding builds
cos/sin from a float32 inv_freq and float32 positions. Against the unmodified model
that limits agreement to ~4e-6 on logits of size ~6 (float32 rounding).
The `f64_reference` fixture lifts exactly those two upcasts (same formulas, float64),
leaving everything else to transformers' code: weight names, q/k rotate_half RoPE,
GQA repeat_kv, SDPA attention, SwiGLU, tying. Then the logits agree to ~1e-14 and the
tests use atol=1e-12 (rtol 0). test_tolerance_catches_mistakes shows that a
transposed/swapped weight, the other RoPE convention, a wrong eps or theta each
move the logits by far more than both tolerances (> 1e-3).
"""
import builtins

import pytest
import torch

pytest.importorskip('transformers')
from transformers import GPT2Config, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

from lab.model_full import GPT, rope_tables  # noqa: E402
from support.checkpoint import CheckpointError, from_pretrained  # noqa: E402

V, T, L = 61, 24, 3
TIGHT = 1e-12      # vs transformers with its float32 norm/RoPE upcasts lifted
LOOSE = 1e-4       # vs unmodified transformers (float32 internals)


def make_hf(path, n_kv_head=2, tied=False, seed=0, **kw):
    """A tiny random float64 LlamaForCausalLM saved to path. Weights are O(0.3) and the
    norm weights random (not ones), so a swapped norm or weight shows in the logits;
    eps and theta are non-default, so a dropped eps/theta shows too."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, num_attention_heads=4, num_key_value_heads=n_kv_head,
                      intermediate_size=48, num_hidden_layers=L, max_position_embeddings=64,
                      rms_norm_eps=1e-2, rope_theta=100.0, tie_word_embeddings=tied, **kw)
    cfg._attn_implementation = 'sdpa'  # float64 softmax (eager softmaxes in float32)
    hf = LlamaForCausalLM(cfg).to(torch.float64)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.normal_(1.0 if 'norm' in n else 0.0, 0.3)
    hf.save_pretrained(path)
    return hf.eval()


@pytest.fixture
def f64_reference(monkeypatch):
    """transformers' Llama with its two float32 upcasts (RMSNorm input, RoPE tables)
    computed in float64 instead; formulas unchanged (modeling_llama.py)."""
    def rms_forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))

    def rope_forward(self, x, position_ids):
        dim = 2 * self.inv_freq.numel()
        inv_freq = 1.0 / (self.config.rope_parameters['rope_theta'] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].double() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, 'forward', rms_forward)
    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, 'forward', rope_forward)


@pytest.fixture(scope='module')
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp('llama')
    return make_hf(path), path


def tokens(seed=1):
    return torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(seed))


def max_diff(hf, model, idx, **kw):
    with torch.no_grad():
        ref = hf(idx).logits
        ours, _ = model(idx, **kw)
    assert ours.dtype == ref.dtype == torch.float64
    return (ours - ref).abs().max().item()

# -----------------------------------------------------------------------------
# logits equal transformers'


@pytest.mark.parametrize('n_kv_head', [2, 4], ids=['gqa', 'mha'])
@pytest.mark.parametrize('tied', [False, True], ids=['untied', 'tied'])
def test_logits_match_hf(tmp_path, f64_reference, n_kv_head, tied):
    hf = make_hf(tmp_path, n_kv_head=n_kv_head, tied=tied)
    model = from_pretrained(tmp_path, dtype=torch.float64)
    c = model.config
    assert (c.n_layer, c.n_head, c.n_kv_head, c.n_embd, c.mlp_hidden, c.vocab_size) == (L, 4, n_kv_head, 32, 48, V)
    assert (c.block_size, c.norm_eps, c.rope_theta, c.tie_embeddings) == (64, 1e-2, 100.0, tied)
    assert (model.lm_head.weight is model.wte.weight) == tied
    assert model.rope_cos.dtype == torch.float64
    assert max_diff(hf, model, tokens()) < TIGHT


def test_logits_match_unmodified_hf(ckpt):
    """Against transformers as shipped (float32 norm/RoPE inside), and our default
    float32 model: agreement to float32 rounding."""
    hf, path = ckpt
    idx = tokens()
    model = from_pretrained(path)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with torch.no_grad():
        ref = hf(idx).logits
        ours64, _ = from_pretrained(path, dtype=torch.float64)(idx)
        ours32, _ = model(idx)
    assert (ours64 - ref).abs().max().item() < LOOSE
    assert (ours32.double() - ref).abs().max().item() < LOOSE


def test_bf16_checkpoint_upcast_exactly(tmp_path):
    """Weights are read in the checkpoint's dtype and upcast exactly; float32 by default."""
    hf = make_hf(tmp_path / 'f64').to(torch.bfloat16)
    hf.save_pretrained(tmp_path / 'bf16')
    model = from_pretrained(tmp_path / 'bf16')
    assert model.wte.weight.dtype == torch.float32
    assert torch.equal(model.wte.weight, hf.model.embed_tokens.weight.float())
    assert torch.equal(model.h[1].mlp.w_down.weight, hf.model.layers[1].mlp.down_proj.weight.float())
    assert torch.equal(model.lm_head.weight, hf.lm_head.weight.float())


def test_tolerance_catches_mistakes(ckpt, f64_reference):
    """Each plausible loading mistake moves the logits far beyond both tolerances."""
    hf, path = ckpt
    idx = tokens()

    def rope_permute(w, n_head):  # the Meta/interleaved RoPE layout instead of rotate_half
        d1, d2 = w.shape
        return w.view(n_head, d1 // n_head // 2, 2, d2).transpose(1, 2).reshape(d1, d2)

    d, dkv = 32, 16  # the fixture's n_embd and n_kv_head * head_dim

    def transpose_wq(m):
        wq = m.h[0].attn.wqkv.weight[:d]  # rows of W_q in the stacked [W_q; W_k; W_v]
        wq.copy_(wq.T.clone())

    def swap_gate_up(m):
        w = m.h[1].mlp.w_gu.weight  # [W_gate; W_up]
        w.copy_(torch.cat(w.chunk(2, 0)[::-1], 0))

    def swap_norms(m):
        b = m.h[2]
        w = b.ln_1.weight.clone()
        b.ln_1.weight.copy_(b.ln_2.weight)
        b.ln_2.weight.copy_(w)

    def interleaved_rope(m):
        for b in m.h:
            w = b.attn.wqkv.weight
            w[:d].copy_(rope_permute(w[:d], 4))
            w[d:d + dkv].copy_(rope_permute(w[d:d + dkv], 2))

    def default_eps(m):
        for mod in m.modules():
            if hasattr(mod, 'eps'):
                mod.eps = 1e-5

    def default_theta(m):
        cos, sin = rope_tables(8, 64, 10000.0)
        m.rope_cos, m.rope_sin = cos.double(), sin.double()

    for mistake in (transpose_wq, swap_gate_up, swap_norms, interleaved_rope, default_eps, default_theta):
        model = from_pretrained(path, dtype=torch.float64)
        assert max_diff(hf, model, idx) < TIGHT
        with torch.no_grad():
            mistake(model)
        assert max_diff(hf, model, idx) > 1e-3, mistake.__name__

# -----------------------------------------------------------------------------
# recurrence added at identity


RECS = {
    't2mlr-mid': dict(recurrence='t2mlr', rec_start=1, rec_end=1),
    't2mlr-full': dict(recurrence='t2mlr', rec_start=0, rec_end=L - 1),
    'lrt-shared': dict(recurrence='lrt', rec_start=0, rec_end=1),
    'lrt-layerwise': dict(recurrence='lrt', rec_start=1, rec_end=2, lrt_shared=False),
}
MODES = {
    'exact': dict(mode='exact'),
    'jacobi': dict(mode='jacobi', n_iter=4, n_grad=2),
    'interleaved': dict(mode='interleaved', n_subsets=3),
}


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('rec', RECS)
def test_recurrence_at_identity_matches_hf(ckpt, f64_reference, rec, mode):
    hf, path = ckpt
    model = from_pretrained(path, dtype=torch.float64, **RECS[rec])
    assert model.rec == RECS[rec]['recurrence']
    if model.rec == 't2mlr':
        assert model.fusion is not None and model.config.rec_gate_gain == 1e-2  # retrofit default
    else:
        assert model.config.lrt_identity_init and model.lrt.w_fb is not None
    assert max_diff(hf, model, tokens(), **MODES[mode]) < TIGHT


def test_lrt_identity_init_can_be_declined(ckpt, f64_reference):
    hf, path = ckpt
    model = from_pretrained(path, dtype=torch.float64, recurrence='lrt', lrt_identity_init=False)
    assert not model.config.lrt_identity_init
    assert max_diff(hf, model, tokens()) > 1e-3  # gamma = 0.1, W_fb random: not the pretrained model


def test_overrides(ckpt):
    _, path = ckpt
    assert from_pretrained(path, block_size=32).config.block_size == 32
    assert from_pretrained(path, recurrence='t2mlr', rec_gate_gain=1.0).config.rec_gate_gain == 1.0
    assert from_pretrained(path, dtype='float64').wte.weight.dtype == torch.float64
    with pytest.raises(CheckpointError, match=r"\['n_layer'\] are set by the checkpoint"):
        from_pretrained(path, n_layer=2)
    with pytest.raises(CheckpointError, match="unknown GPTConfig fields"):
        from_pretrained(path, n_layers=2)
    with pytest.raises(ValueError, match="rec_end=5 is out of range"):
        from_pretrained(path, recurrence='t2mlr', rec_end=5)

# -----------------------------------------------------------------------------
# errors: one clear line each


def one_line(excinfo):
    msg = str(excinfo.value)
    assert '\n' not in msg, msg
    return msg


def test_missing_transformers(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == 'transformers' or name.startswith('transformers.'):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, '__import__', fake_import)
    with pytest.raises(ImportError) as e:
        from_pretrained(tmp_path)
    assert 'pip install transformers' in one_line(e)
    assert e.value.__suppress_context__


def test_missing_local_path(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint folder at") as e:
        from_pretrained(tmp_path / 'nope')
    one_line(e)
    with pytest.raises(CheckpointError, match="no readable config.json") as e:
        from_pretrained(tmp_path)  # exists, but empty
    one_line(e)


def test_hub_name_offline(monkeypatch):
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
    with pytest.raises(CheckpointError, match="could not be fetched from the Hugging Face Hub") as e:
        from_pretrained('no-such-user-7f3a/no-such-model')
    one_line(e)


def test_non_llama(tmp_path):
    GPT2Config(n_layer=2, n_embd=32, n_head=4).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="model_type 'gpt2' is not a Llama-architecture checkpoint") as e:
        from_pretrained(tmp_path)
    one_line(e)


@pytest.mark.parametrize('kw, msg', [
    (dict(attention_bias=True), "attention_bias=True is not supported"),
    (dict(mlp_bias=True), "mlp_bias=True is not supported"),
    (dict(hidden_act='gelu'), "hidden_act 'gelu' is not supported"),
    (dict(rope_scaling={'rope_type': 'linear', 'factor': 2.0}), "rope scaling 'linear' is not supported"),
    (dict(head_dim=16), "head_dim=16 .* not supported"),
], ids=['attention_bias', 'mlp_bias', 'gelu', 'rope_scaling', 'head_dim'])
def test_unsupported_llama_config(tmp_path, kw, msg):
    LlamaConfig(vocab_size=V, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=48, num_hidden_layers=2, **kw).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=msg) as e:
        from_pretrained(tmp_path)
    one_line(e)


def test_config_without_weights(tmp_path):
    LlamaConfig(vocab_size=V, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=48, num_hidden_layers=2).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="could not load the weights") as e:
        from_pretrained(tmp_path)
    one_line(e)

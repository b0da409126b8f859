"""
The LSTM baseline: the recurrent network the T2MLR paper sets against T2MLR on S5-Retrieval
(DESIGN.md 10: "Transformer and LSTM fail"), built as the official code builds it, and trained,
evaluated and sampled through the same train.py, lab/compare.py, lab/evaluate.py and sample.py as the GPT
(lab/train.py --arch=lstm: n_layer and n_embd are its layers and its hidden size).

The official model: princeton-pli/T2MLR at 4510e81, src/modeling/rnnlm.py (RNNLMForCausalLM):
  l.74       an embedding as wide as the hidden size (no separate embedding width)
  l.84-91    nn.LSTM(hidden, hidden, num_layers, batch_first=True), PyTorch's two bias vectors
  l.75, 102  dropout between the layers and on the LSTM's outputs (0 in its recipes)
  l.103-106  the LM head, Linear(hidden, vocab, bias=False), tied to the embedding
             (src/train.py l.436-447 always builds it with tie_word_embeddings=True)
  l.220-232  no final norm, no positional information, the state starting at zero
  init: transformers' PreTrainedModel.post_init (unpinned in its requirements.txt); in
             transformers 5.24, modeling_utils.py l.2304-2330: LSTM weights xavier_uniform,
             biases 0, embedding N(0, 0.02). We do the same.
Its size: the S5-Retrieval recipes give the LSTM the transformer's number of layers and the
hidden size that matches the transformer's parameter count (train_s5_retrieval_rnn_baseline.sh
l.34-39: 4 layers, hidden 360, 4.23M against 4.29M). Here: 4 layers, hidden 81 (config/s3_lstm.py):
222,912 parameters against the 4-layer d=64 GPT's 221,760 (+0.5%; hidden 80 would be -1.9%), both
at a task vocabulary of at most 128 tokens (one table of 128 rows: the configs' vocab_pad).

Its one forward is exact, and there is no latent state beside the network to approximate or to
zero: like the plain GPT (recurrence='none'), every mode runs that forward, so train.py reports
approximate = exact = zero-state for it and no reliance.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

import model as textbook
from lab.model_full import GPT, ce_loss
from support.checks import check_fits, check_scheme


@dataclass
class LSTMConfig:
    block_size: int = 1024      # the longest sequence the scripts give it (an LSTM has no limit of its own)
    vocab_size: int = 50304
    vocab_pad: int = 1          # embedding rows rounded up to a multiple of this; never sampled or in the loss
    n_layer: int = 4            # LSTM layers
    n_embd: int = 81            # hidden size = embedding width
    dropout: float = 0.0        # between the layers and on the outputs
    tie_embeddings: bool = True
    arch: str = 'lstm'          # checkpoint.build_model builds an LSTM from model args that say so
    recurrence = 'none'         # (not a field) no latent recurrence: code written for GPTConfig treats it as the plain GPT

    def __post_init__(self):
        for k in ('block_size', 'vocab_size', 'vocab_pad', 'n_layer', 'n_embd'):
            if getattr(self, k) < 1:
                raise ValueError(f"LSTMConfig: {k}={getattr(self, k)} must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LSTMConfig: dropout={self.dropout} must be in [0, 1)")
        d = self.n_embd  # the embedding (and head), and per layer 4 gates of (d + d) x d
        check_fits(f"LSTMConfig: n_layer={self.n_layer}, n_embd={d}", self.padded_vocab * d * (1 if self.tie_embeddings else 2)
                   + self.n_layer * 8 * d * d)

    @property
    def padded_vocab(self):
        return self.vocab_pad * math.ceil(self.vocab_size / self.vocab_pad)


class LSTM(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = c = config
        self.wte = nn.Embedding(c.padded_vocab, c.n_embd)
        self.lstm = nn.LSTM(c.n_embd, c.n_embd, c.n_layer, batch_first=True, dropout=c.dropout if c.n_layer > 1 else 0.0)
        self.drop = nn.Dropout(c.dropout)
        self.lm_head = nn.Linear(c.n_embd, c.padded_vocab, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        for name, p in self.lstm.named_parameters():  # weight_ih_l<k>, weight_hh_l<k>, bias_ih_l<k>, bias_hh_l<k>
            if name.startswith('weight'):
                nn.init.xavier_uniform_(p)
            else:
                nn.init.zeros_(p)
        for w in [self.wte.weight] + ([] if c.tie_embeddings else [self.lm_head.weight]):
            nn.init.normal_(w, std=0.02)

    def forward(self, idx, targets=None, mode='exact', n_iter=8, n_grad=4, n_subsets=2, rec_mask=None, n_rounds=1,
                recompute=False, compile=False, block_len=1):
        """GPT.forward's interface: idx, targets (B, T) -> (logits (B, T, V), loss). Every mode is the
        one forward (the scheme arguments are only checked); rec_mask is ignored: the LSTM runs its
        recurrence everywhere, prompts included, as the official baseline does."""
        check_scheme(mode, n_iter, n_grad, n_subsets, n_rounds, idx.size(1), block_len)
        y, _ = self.lstm(self.wte(idx))  # (B, T, H)
        return self._logits_loss(y, targets)

    def _logits_loss(self, y, targets):
        logits = self.lm_head(self.drop(y))[..., :self.config.vocab_size]
        return logits, (None if targets is None else ce_loss(logits, targets))

    # generation: GPT.generate's loop over this model's prefill and decode_step; the state is the
    # LSTM's (h, c) stacked, (2, n_layer, B, H); the KV cache generate makes is unused

    def prefill(self, idx, cache=None, *unused, **unused_kw):
        """The prompt (B, T) in one call -> (logits (B, T, V), the state after it, 0). The prefill
        modes of a GPT (jacobi, plain) do not apply: an LSTM's prompt is always run exactly."""
        y, (h, c) = self.lstm(self.wte(idx))
        return self._logits_loss(y, None)[0], torch.stack([h, c]), 0

    def decode_step(self, tok, pos, state, cache=None):
        """One token per sequence, tok (B, 1), after state -> (logits (B, 1, V), the new state)."""
        y, (h, c) = self.lstm(self.wte(tok), (state[0], state[1]))
        return self._logits_loss(y, None)[0], torch.stack([h, c])

    generate = textbook.GPT.generate

    def new_cache(self, B, max_len):  # an LSTM keeps no keys and values
        return None

    def param_groups(self, weight_decay, gate_lr_mult=1.0, rec_lr_mult=None):
        """AdamW groups as GPT.param_groups makes them: decay on matrices (dim >= 2) only. There
        are no recurrence parameters of the method's to give rec_lr_mult or gate_lr_mult."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [dict(params=[p for p in params if p.dim() >= 2], weight_decay=weight_decay, lr_mult=1.0),
                dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0, lr_mult=1.0)]

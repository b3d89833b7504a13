"""LamixerModel and LamixerForCausalLM: transformers models of pre-norm blocks around lamixer layers.

    block(h) = h + mixer(rmsnorm(h)), then h + mlp(rmsnorm(h))

The mixer is a lamixer.Layer built from the config's spec, or softmax attention (SDPA with a key-value
cache) in the layers of `config.attn_layers`; the MLP is SwiGLU. Masked tokens (attention_mask == 0)
do not exist for any layer: the hidden states are zeroed there before every block, lamixer layers
see only the real tokens (lamixer.hf.packing), and attention neither attends to them nor counts them
in its rotary positions. So a left-padded row gives what the row gives alone.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from ..api import loads
from ..errors import ArgumentError
from ..layer import Layer
from .cache import Entry, LamixerCache
from .configuration import LamixerConfig
from .packing import Packing, run_layer

try:  # transformers 5's init functions skip tensors already loaded from a checkpoint
    from transformers import initialization as init
except ImportError:
    from torch.nn import init

# transformers 5 renamed `past_key_values` to `cache`, in the outputs and in forward's arguments
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5


# ---- modules ----
class LamixerRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # in float32 at least: bf16 squares lose too much
        h = x if x.dtype == torch.float64 else x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.to(h.dtype)).to(x.dtype)


class Projection(nn.Linear):
    """A bias-free Linear of the model around the mixers, drawn from normal(0, initializer_range). Its own type
    tells _init_weights apart from a lamixer.Layer's projections, which keep the spec's initialisation."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__(n_in, n_out, bias=False)


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = Projection(hidden_size, intermediate_size)
        self.up_proj = Projection(hidden_size, intermediate_size)
        self.down_proj = Projection(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [B, heads, T, D] at positions [B, T]: pairs (i, i + D/2) turned by pos * theta^(-2i/D)."""
    half = x.shape[-1] // 2
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv_freq = theta ** (-torch.arange(half, device=x.device, dtype=dtype) * 2 / x.shape[-1])
    angle = (positions.to(dtype)[..., None] * inv_freq)[:, None]  # [B, 1, T, D/2]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class SoftmaxAttention(nn.Module):
    """Causal softmax attention through SDPA, grouped key-value heads, rotary positions counted over real tokens only."""

    def __init__(self, config: LamixerConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads = config.attn_num_heads, config.attn_num_kv_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.rope_theta = config.attn_rope_theta
        self.q_proj = Projection(config.hidden_size, self.num_heads * self.head_dim)
        self.k_proj = Projection(config.hidden_size, self.num_kv_heads * self.head_dim)
        self.v_proj = Projection(config.hidden_size, self.num_kv_heads * self.head_dim)
        self.o_proj = Projection(self.num_heads * self.head_dim, config.hidden_size)

    def _heads(self, proj: nn.Linear, x: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, _ = x.shape
        return proj(x).view(B, T, heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, ctx: Context, past: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x [B, T, hidden] -> (y [B, T, hidden], the keys and values of every position so far)."""
        B, T, _ = x.shape
        q, k, v = self._heads(self.q_proj, x, self.num_heads), self._heads(self.k_proj, x, self.num_kv_heads), self._heads(self.v_proj, x, self.num_kv_heads)
        if self.rope_theta is not None:
            q, k = rotate(q, ctx.positions, self.rope_theta), rotate(k, ctx.positions, self.rope_theta)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        groups = self.num_heads // self.num_kv_heads  # each key-value head serves this many query heads
        mask = ctx.attention_mask(k.shape[2])
        causal = mask is None and past is None and T > 1
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask, is_causal=causal)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)), (k, v)


def build_layer(config: LamixerConfig) -> Layer:
    """The config's lamixer.Layer. transformers builds a model to be loaded on the meta device, but a layer works out
    its sizes from real numbers (its spec's size expressions), so it is built on the CPU then."""
    mixer = loads(config.spec, f"{config.spec_name}.lam")
    device = "cpu" if torch.get_default_device().type == "meta" else None
    with torch.device(device) if device else contextlib.nullcontext():
        return Layer(mixer, config.hidden_size, config.num_heads, backend=config.backend, **config.layer_options)


class LamixerBlock(nn.Module):
    def __init__(self, config: LamixerConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.is_attention = layer_idx in config.attn_layers
        self.mixer_norm = LamixerRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mixer = SoftmaxAttention(config) if self.is_attention else build_layer(config)
        self.mlp_norm = LamixerRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, h: torch.Tensor, ctx: Context, entry: Entry, keep_state: bool) -> tuple[torch.Tensor, Entry]:
        x = self.mixer_norm(h)
        if self.is_attention:
            y, entry = self.mixer(x, ctx, entry)
        else:
            y, entry = run_layer(self.mixer, x, ctx.packing, entry, keep_state)
        h = h + ctx.clean(y)
        return h + self.mlp(self.mlp_norm(h)), entry


# ---- one forward's view of the mask ----
@dataclass
class Context:
    """The mask of one forward's T new tokens, in the forms the layers need."""

    mask: torch.Tensor | None  # [B, T] bool, True at real tokens; None when every token is real
    past_mask: torch.Tensor | None  # [B, L] bool for the positions the cache has seen; None when nothing has been seen
    positions: torch.Tensor  # [B, T] each new token's index among its row's real tokens
    packing: Packing | None  # where the real tokens go in the packed row the lamixer layers see

    @classmethod
    def of(cls, attention_mask: torch.Tensor | None, cache: LamixerCache | None, B: int, T: int, device) -> Context:
        past = 0 if cache is None else cache.get_seq_length()
        mask = None if attention_mask is None else _new_tokens_mask(attention_mask, past, B, T).to(device)
        if mask is not None and bool(mask.all()):
            mask = None
        seen = cache.seen if cache is not None and cache.seen is not None else torch.zeros(B, dtype=torch.int64, device=device)
        if seen.shape[0] != B:
            raise ArgumentError("cache", f"holds {seen.shape[0]} sequences, but the input has {B}")
        step = torch.arange(T, device=device)[None] if mask is None else mask.long().cumsum(1) - 1
        past_mask = None if cache is None else cache.mask
        return cls(mask, past_mask, seen.to(device)[:, None] + step, None if mask is None else Packing.of(mask))

    def new_mask(self, B: int, T: int, device) -> torch.Tensor:
        return torch.ones(B, T, dtype=torch.bool, device=device) if self.mask is None else self.mask

    def clean(self, h: torch.Tensor) -> torch.Tensor:
        """h with zeros at masked positions: whatever is there (NaN included) reaches no real token."""
        return h if self.mask is None else torch.where(self.mask[..., None], h, h.new_zeros(()))

    def attention_mask(self, L: int) -> torch.Tensor | None:
        """[B, 1, T, L] bool: which keys each new token sees (None: plain causal). A real token sees the real tokens up
        to itself; a masked one sees itself only, so its row has a finite softmax and its output is ignored."""
        if self.mask is None and self.past_mask is None:
            return None
        T = self.positions.shape[1]
        B, device = self.positions.shape[0], self.positions.device
        keys = torch.cat([self.past_mask if self.past_mask is not None else torch.ones(B, L - T, dtype=torch.bool, device=device),
                          self.new_mask(B, T, device)], dim=1)  # fmt: skip
        query_at = torch.arange(L - T, L, device=device)[:, None]  # each new token's position among the keys
        key_at = torch.arange(L, device=device)[None, :]
        allowed = (keys[:, None, :] & (key_at <= query_at)) | (key_at == query_at)
        return allowed[:, None]


def _new_tokens_mask(attention_mask: torch.Tensor, past: int, B: int, T: int) -> torch.Tensor:
    """The mask of the T new tokens: attention_mask covers them alone [B, T] or every position so far [B, past + T]."""
    if attention_mask.dim() != 2 or attention_mask.shape[0] != B or attention_mask.shape[1] not in (T, past + T):
        raise ArgumentError("attention_mask", f"must be [B, T] or [B, past + T] = [{B}, {T}] or [{B}, {past + T}] of 0s and 1s, "
                                    f"got {list(attention_mask.shape)}")  # fmt: skip
    return attention_mask[:, attention_mask.shape[1] - T :].bool()


# ---- models ----
class LamixerPreTrainedModel(PreTrainedModel):
    config_class = LamixerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["LamixerBlock"]
    _supports_cache_class = True
    _is_stateful = True  # a recurrent state cannot go back to an earlier token: generate() refuses assisted decoding
    supports_gradient_checkpointing = False

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate() must not hand the model a DynamicCache: the model makes its own LamixerCache at the first forward
        return False

    def _init_weights(self, module: nn.Module) -> None:
        # only the modules around the mixers: a Layer keeps the initialisation its spec declares
        std = self.config.initializer_range
        if isinstance(module, (Projection, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, LamixerRMSNorm):
            init.ones_(module.weight)


class LamixerModel(LamixerPreTrainedModel):
    def __init__(self, config: LamixerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LamixerBlock(config, i) for i in range(config.num_layers))
        self.norm = LamixerRMSNorm(config.hidden_size, config.rms_norm_eps)
        # specs with whole-input statistics (LLN) have no state to carry between calls
        self.cacheable = all(block.is_attention or getattr(block.mixer, "stateful", True) for block in self.layers)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def _use_cache(self, use_cache: bool | None, cache) -> bool:
        if use_cache is None:
            return cache is not None or (bool(self.config.use_cache) and self.cacheable and not self.training)
        if use_cache and not self.cacheable:
            raise ArgumentError("use_cache", f"{self.config.spec_name} runs on whole sequences only: it has no state to cache "
                                        "(generate with use_cache=False)")  # fmt: skip
        return use_cache

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: LamixerCache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: LamixerCache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        """input_ids [B, T] (or inputs_embeds [B, T, hidden]); attention_mask [B, T] or [B, past + T], 0 at padding;
        cache: a LamixerCache to continue (generate() passes it), or one is made when use_cache."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ArgumentError("input_ids", "pass exactly one of input_ids and inputs_embeds")
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, LamixerCache):
            raise ArgumentError("cache", f"must be a LamixerCache (the model's own), got {type(cache).__name__}")
        use_cache = self._use_cache(use_cache, cache)
        if use_cache and cache is None:
            cache = LamixerCache(self.config)
        h = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = h.shape[:2]
        ctx = Context.of(attention_mask, cache, B, T, h.device)
        hidden = self._run_blocks(h, ctx, cache, output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states)
        if cache is not None:
            cache.advance(ctx.new_mask(B, T, h.device))
        h = hidden[-1]
        out = BaseModelOutputWithPast(last_hidden_state=h, hidden_states=hidden if len(hidden) > 1 else None, **{CACHE_FIELD: cache if use_cache else None})
        return out if (return_dict if return_dict is not None else self.config.return_dict) else out.to_tuple()

    def _run_blocks(self, h: torch.Tensor, ctx: Context, cache: LamixerCache | None, keep_all: bool) -> tuple[torch.Tensor, ...]:
        """The blocks, then the final norm: (the last hidden state,), or every block's input and the last when keep_all."""
        hidden: tuple[torch.Tensor, ...] = ()
        for i, block in enumerate(self.layers):
            h = ctx.clean(h)
            if keep_all:
                hidden += (h,)
            h, entry = block(h, ctx, None if cache is None else cache.entry(i), cache is not None)
            if cache is not None:
                cache.set_entry(i, entry)
        return (*hidden, self.norm(ctx.clean(h)))


class LamixerForCausalLM(LamixerPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"} if TRANSFORMERS_5 else ["lm_head.weight"]

    def __init__(self, config: LamixerConfig):
        super().__init__(config)
        self.model = LamixerModel(config)
        self.lm_head = Projection(config.hidden_size, config.vocab_size)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        cache: LamixerCache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        past_key_values: LamixerCache | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """As LamixerModel, plus labels [B, T] (the loss: next-token cross-entropy, -100 ignored) and logits_to_keep
        (the logits of the last N positions only; 0: all)."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, cache=cache, use_cache=use_cache,
                         output_hidden_states=output_hidden_states, return_dict=True, past_key_values=past_key_values)  # fmt: skip
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(out.last_hidden_state[:, keep])
        loss = None if labels is None else causal_lm_loss(logits, labels, kwargs.get("num_items_in_batch"))
        result = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=out.hidden_states, **{CACHE_FIELD: out[CACHE_FIELD] if CACHE_FIELD in out else None})
        return result if (return_dict if return_dict is not None else self.config.return_dict) else result.to_tuple()


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy of each position's logits against the next token's label, labels of -100 ignored: the mean over
    the counted tokens, or their sum over num_items_in_batch (the Trainer's count under gradient accumulation)."""
    if logits.shape[:2] != labels.shape:
        raise ArgumentError("labels", f"must be [B, T] = {list(logits.shape[:2])} (with logits_to_keep=0), got {list(labels.shape)}")
    pred = logits[:, :-1].reshape(-1, logits.shape[-1])
    pred = pred if pred.dtype == torch.float64 else pred.float()  # the softmax over a large vocabulary in float32 at least
    target = labels[:, 1:].reshape(-1).to(logits.device)
    total = F.cross_entropy(pred, target, ignore_index=-100, reduction="sum")
    count = num_items_in_batch if num_items_in_batch is not None else (target != -100).sum().clamp_min(1)
    return total / count

"""LamixerConfig: a transformers config whose saved form carries the mixer's spec text.

A checkpoint then holds everything that defines its layers: a custom variant loads wherever lamixer
is installed, without its .lam file, and a shipped spec changed in a later lamixer release does not
change a saved model.
"""
from __future__ import annotations

import math
from pathlib import Path

from transformers import PretrainedConfig

from ..api import SPEC_SUFFIX, loads, shipped_source, shipped_specs
from ..errors import ArgumentError


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ArgumentError("spec", f"cannot read {str(path)!r}: {e}") from None


def resolve_spec(spec: str | Path) -> tuple[str, str]:
    """(text, name) of a spec given as a shipped name, a path to a spec file, or the spec's text itself.

    Text is told apart by its line breaks (no spec fits on one line); a shipped name wins over a file of
    the same name, as in lamixer.load. The text is compiled here, so a mistake in it is a located
    lamixer.SpecError when the config is made, not when the model is."""
    if isinstance(spec, Path):
        text, origin = _read(spec), str(spec)
    elif not isinstance(spec, str):
        raise ArgumentError("spec", f"must be a shipped spec name, a path or spec text, got {type(spec).__name__}")
    elif "\n" in spec:
        text, origin = spec, "<spec>"
    elif spec in shipped_specs():
        text, origin = shipped_source(spec), spec + SPEC_SUFFIX
    elif Path(spec).is_file():
        text, origin = _read(Path(spec)), spec
    else:
        raise ArgumentError("spec", f"{spec!r} is neither a shipped spec ({', '.join(shipped_specs())}), a file, nor spec text")
    return text, loads(text, origin).name


def _default_intermediate(hidden_size: int, mlp_ratio: float) -> int:
    """SwiGLU's width: 2/3 of mlp_ratio * hidden (its three matrices then hold as many weights as a plain MLP's two),
    rounded up to a multiple of 256 as LLaMA's is."""
    return 256 * math.ceil(hidden_size * mlp_ratio * 2 / 3 / 256)


def _attention_layers(attn_layers, num_layers: int) -> list[int]:
    layers = sorted({int(i) for i in (attn_layers or ())})
    if any(not 0 <= i < num_layers for i in layers):
        raise ArgumentError("attn_layers", f"holds layer indices in [0, {num_layers}), got {list(attn_layers)}")
    return layers


class LamixerConfig(PretrainedConfig):
    """A language model of pre-norm blocks, each a lamixer.Layer of `spec` (or softmax attention, for the layers in
    `attn_layers`) and a SwiGLU MLP.

        config = LamixerConfig(spec="gated_deltanet", vocab_size=32000, hidden_size=1024, num_heads=4, num_layers=24,
                               layer_options={"head_dim": 128}, attn_layers=[5, 11, 17, 23])

    spec: a shipped spec name, a path to a spec file, or spec text. The config keeps the text (`spec`) and the
    mixer's name (`spec_name`, for display); layer_options go to lamixer.Layer (the spec's layer options, or the
    size of a dim with a default). backend is lamixer's ("auto", "torch", "triton", "interpret").
    """

    model_type = "lamixer"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads"}

    def __init__(
        self,
        spec: str | Path = "gla",
        vocab_size: int = 32000,
        hidden_size: int = 1024,
        num_heads: int = 4,
        num_layers: int = 24,
        layer_options: dict | None = None,
        intermediate_size: int | None = None,
        mlp_ratio: float = 4.0,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = False,
        attn_layers: list[int] | None = None,
        attn_num_heads: int | None = None,
        attn_num_kv_heads: int | None = None,
        attn_rope_theta: float | None = 10000.0,
        backend: str = "auto",
        use_cache: bool = True,
        spec_name: str | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        **kwargs,
    ):
        text, name = resolve_spec(spec)
        self.spec = text
        self.spec_name = spec_name or name  # a saved config names its spec as it was first given
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.layer_options = dict(layer_options or {})
        self.mlp_ratio = mlp_ratio
        self.intermediate_size = intermediate_size or _default_intermediate(hidden_size, mlp_ratio)
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.attn_layers = _attention_layers(attn_layers, num_layers)
        self.attn_num_heads = attn_num_heads or num_heads
        self.attn_num_kv_heads = attn_num_kv_heads or self.attn_num_heads
        self.attn_rope_theta = attn_rope_theta
        self.backend = backend
        self.use_cache = use_cache
        self._check_attention()
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)  # fmt: skip

    def _check_attention(self) -> None:
        if not self.attn_layers:
            return
        heads, kv_heads = self.attn_num_heads, self.attn_num_kv_heads
        if self.hidden_size % heads:
            raise ArgumentError("attn_num_heads", f"must divide hidden_size = {self.hidden_size}, got {heads}")
        if heads % kv_heads:
            raise ArgumentError("attn_num_kv_heads", f"must divide attn_num_heads = {heads}, got {kv_heads}")
        if self.attn_rope_theta is not None and (self.hidden_size // heads) % 2:
            raise ArgumentError("attn_num_heads", f"rotary turns pairs of features, but the head dim {self.hidden_size // heads} is odd")

    @property
    def layer_kinds(self) -> list[str]:
        """Each layer's token mixer: the spec's name, or "attention"."""
        return ["attention" if i in self.attn_layers else self.spec_name for i in range(self.num_layers)]

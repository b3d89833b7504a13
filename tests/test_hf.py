"""lamixer.hf: transformers models of lamixer layers.

The config carries the spec's text; the loss is next-token cross-entropy with -100 ignored; a
left-padded row gives what it gives alone, whatever the padded positions hold (NaN, inf); greedy
generate() (token by token through Layer.step) gives the logits of a full forward at every step;
beam search with the cache equals beam search without; save_pretrained / from_pretrained and the
Auto classes round-trip exactly; softmax-attention layers mix in (hybrid models).
"""
import json

import pytest
import torch

import lamixer

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("lamixer.hf")

VOCAB, HIDDEN, HEADS = 50, 32, 2
SMALL = {"gla": {"gate_rank": 4}, "gated_deltanet": {"head_dim": 8}, "gsa": {"M": 4}, "mamba2": {"d_state": 4}}
# a variant in no paper, given as text: a scalar gate behind short convolutions (whose windows padding must not shift)
SPEC_TEXT = """\
mixer conv_gla "scalar-gated linear attention behind short convolutions"
dims K, V
input q[K], k[K], v[V], g[] in (-inf, 0)
state S[K, V]

S = exp(g) * S + outer(k, v)
out o = scale * q @ S

layer
  option conv_size = 3
  size K = hidden / H, V = hidden / H
  proj q, k, v, g
  conv q, k, v conv_size silu
  map g = logsigmoid(g) / 8
  norm rmsnorm per_head
"""
# name -> (spec, extra config): shipped specs, the text spec, and a hybrid with a grouped-query attention layer
CASES = {
    "gla": ("gla", {}),
    "gated_deltanet": ("gated_deltanet", {}),
    "retnet": ("retnet", {}),
    "gsa": ("gsa", {}),
    "mamba2": ("mamba2", {}),
    "text": (SPEC_TEXT, {}),
    "hybrid": ("gated_deltanet", {"attn_layers": [1], "attn_num_heads": 4, "attn_num_kv_heads": 2}),
    "lln": ("lln", {}),  # running statistics (eval mode: the estimates) and block attention's window in the cache
    "lln_whole": ("lln", {"layer_options": {"running_stats": 0}}),  # whole-input statistics: no state, so no cache
}
STATEFUL = [c for c in CASES if c != "lln_whole"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # these models are tiny: one thread runs their ops faster than several, most of all on a busy machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_config(case: str, **overrides) -> "hf.LamixerConfig":
    spec, extra = CASES[case]
    # large weights around the mixers: every output then depends strongly on its context, and greedy choices are clear
    kwargs = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_heads=HEADS, num_layers=2, intermediate_size=64, layer_options=SMALL.get(spec, {}),
                  backend="torch", pad_token_id=0, initializer_range=0.5)  # fmt: skip
    kwargs.update(extra)
    return hf.LamixerConfig(spec=spec, **{**kwargs, **overrides})


def make_model(case: str, dtype=torch.float64, seed: int = 0, **overrides) -> "hf.LamixerForCausalLM":
    torch.manual_seed(seed)
    return hf.LamixerForCausalLM(make_config(case, **overrides)).to(dtype).eval()


def left_padded(pads: list[int], T: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [B, T] (real tokens never the pad id 0) and attention_mask with pads[b] padded positions on the left."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(pads), T), generator=g)
    mask = torch.ones_like(ids)
    for b, p in enumerate(pads):
        mask[b, :p] = 0
    return ids.masked_fill(mask == 0, 0), mask


def cache_of(out):
    """The cache an output carries (transformers 5 names it `cache`, 4 `past_key_values`)."""
    return out["cache"] if "cache" in out else out.get("past_key_values")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# ---- config ----
def test_config_carries_the_spec_text(tmp_path):
    shipped = hf.LamixerConfig(spec="retnet")
    assert shipped.spec_name == "retnet" and shipped.spec.startswith("mixer retnet") and "\n" in shipped.spec
    path = tmp_path / "variant.lam"
    path.write_text(SPEC_TEXT)
    for given in (path, str(path), SPEC_TEXT):
        config = hf.LamixerConfig(spec=given)
        assert config.spec == SPEC_TEXT and config.spec_name == "conv_gla"
    again = hf.LamixerConfig.from_dict(json.loads(shipped.to_json_string()))
    assert again.spec == shipped.spec and again.spec_name == "retnet"
    config = hf.LamixerConfig(hidden_size=1024, mlp_ratio=4)
    assert config.intermediate_size == 2816 and config.num_hidden_layers == config.num_layers and config.num_attention_heads == config.num_heads


def test_config_mistakes_are_lamixer_errors():
    with pytest.raises(lamixer.ArgumentError, match="spec"):
        hf.LamixerConfig(spec="no_such_spec")
    with pytest.raises(lamixer.SpecError):
        hf.LamixerConfig(spec=SPEC_TEXT.replace("outer(k, v)", "outer(k, w)"))
    with pytest.raises(lamixer.ArgumentError, match="attn_layers"):
        hf.LamixerConfig(num_layers=2, attn_layers=[2])
    with pytest.raises(lamixer.ArgumentError, match="attn_num_kv_heads"):
        hf.LamixerConfig(num_layers=2, attn_layers=[0], attn_num_heads=4, attn_num_kv_heads=3)


# ---- loss ----
def test_loss_is_shifted_cross_entropy_with_ignored_labels():
    model = make_model("gla")
    ids, _ = left_padded([0, 0], 9)
    labels = ids.clone()
    labels[0, 4:6] = -100
    labels[1, 0] = -100  # never a target: the first label is shifted out
    out = model(ids, labels=labels)
    logits, targets = out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1)
    kept = targets != -100
    expected = torch.nn.functional.cross_entropy(logits[kept], targets[kept])
    assert out.logits.shape == (2, 9, VOCAB) and rel(out.loss, expected) < 1e-12
    out.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# ---- padding ----
def with_garbage(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The embeddings of ids, with NaN and infinities where the mask is 0."""
    embeds = model.get_input_embeddings()(ids).detach()
    garbage = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=embeds.dtype)
    return torch.where(mask[..., None].bool(), embeds, garbage[torch.arange(embeds.shape[1]) % 3][None, :, None])


@pytest.mark.parametrize("case", STATEFUL)
def test_padding_changes_no_real_token(case):
    # two chunks through the cache, each left-padded by its own amount per row (so padding also falls in the middle
    # of a row's history, where a zero input would still decay a gated state or shift a convolution's window; row 2
    # has no real token in the second), then a decoding step: every row's logits are those of its real tokens alone
    model = make_model(case)
    (ids1, mask1), (ids2, mask2) = left_padded([3, 0, 5], 9), left_padded([0, 2, 5], 5, seed=2)
    ids3 = torch.randint(1, VOCAB, (3, 1), generator=torch.Generator().manual_seed(3))
    out1 = model(inputs_embeds=with_garbage(model, ids1, mask1), attention_mask=mask1, use_cache=True)
    mask12 = torch.cat([mask1, mask2], 1)
    out2 = model(inputs_embeds=with_garbage(model, ids2, mask2), attention_mask=mask12, cache=cache_of(out1))
    out3 = model(ids3, attention_mask=torch.cat([mask12, torch.ones_like(ids3)], 1), cache=cache_of(out2))
    for b in range(3):
        real1, real2 = ids1[b, mask1[b].bool()], ids2[b, mask2[b].bool()]
        alone = model(torch.cat([real1, real2, ids3[b]])[None], use_cache=False).logits[0]
        n1, n2 = len(real1), len(real2)
        assert rel(out1.logits[b, 9 - n1 :], alone[:n1]) < 1e-9, b
        assert n2 == 0 or rel(out2.logits[b, 5 - n2 :], alone[n1 : n1 + n2]) < 1e-9, b
        assert rel(out3.logits[b, 0], alone[-1]) < 1e-9, b


def test_garbage_in_padded_hidden_states_reaches_no_real_token():
    model = make_model("hybrid")
    ids, mask = left_padded([4, 0], 8)
    clean = model(ids, attention_mask=mask, output_hidden_states=True)

    def poison(module, args, output):  # what a block leaves at padded positions must not matter
        output[0][0, :4] = float("nan")
        return output

    for block in model.model.layers:
        handle = block.register_forward_hook(poison)
        out = model(ids, attention_mask=mask)
        handle.remove()
        assert torch.equal(out.logits[mask.bool()], clean.logits[mask.bool()])
    assert len(clean.hidden_states) == 3


def test_padded_gradients_stay_finite():
    model = make_model("hybrid")
    ids, mask = left_padded([3, 0], 8)
    embeds = model.get_input_embeddings()(ids).detach()
    embeds[0, :3] = float("nan")
    labels = ids.masked_fill(mask == 0, -100)
    model(inputs_embeds=embeds, attention_mask=mask, labels=labels).loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_whole_sequence_spec_pads_and_generates_without_a_cache():
    model = make_model("lln_whole")
    ids, mask = left_padded([2, 0], 7)
    out = model(ids, attention_mask=mask)
    assert cache_of(out) is None and rel(out.logits[0, 2:], model(ids[:1, 2:]).logits[0]) < 1e-9
    with pytest.raises(lamixer.ArgumentError, match="use_cache"):
        model(ids, use_cache=True)
    assert model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, use_cache=False).shape == (2, 9)


# ---- decoding ----
@pytest.mark.parametrize("case", ["gated_deltanet", "retnet", "mamba2", "text", "hybrid", "lln"])
def test_greedy_generate_equals_full_forward(case):
    model = make_model(case)
    ids, mask = left_padded([2, 0, 4], 7)
    steps = 5
    gen = model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert isinstance(cache_of(gen), hf.LamixerCache) and gen.sequences.shape == (3, 7 + steps)
    full = model(gen.sequences, attention_mask=torch.cat([mask, torch.ones(3, steps, dtype=mask.dtype)], 1), use_cache=False).logits
    for s in range(steps):
        assert rel(gen.logits[s].double(), full[:, 6 + s]) < 1e-6, s  # generate() hands back float32 logits
        assert torch.equal(full[:, 6 + s].argmax(-1), gen.sequences[:, 7 + s]), s


def test_beam_search_with_the_cache_equals_without():
    model = make_model("hybrid")
    ids, mask = left_padded([2, 0], 6)
    kwargs = dict(attention_mask=mask, max_new_tokens=4, num_beams=3, num_return_sequences=2, do_sample=False, output_scores=True, return_dict_in_generate=True)
    cached, uncached = model.generate(ids, **kwargs), model.generate(ids, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences) and rel(cached.sequences_scores, uncached.sequences_scores) < 1e-6


# ---- saving and loading ----
@pytest.mark.parametrize("case", ["text", "hybrid"])
def test_save_and_load_round_trip(case, tmp_path):
    model = make_model(case, torch.float32, tie_word_embeddings=case == "text")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["spec"] == model.config.spec
    loaded = hf.LamixerForCausalLM.from_pretrained(tmp_path).eval()
    mine, theirs = model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == (case == "text")
    ids, mask = left_padded([2, 0], 6)
    assert torch.equal(model(ids, attention_mask=mask).logits, loaded(ids, attention_mask=mask).logits)


def test_auto_classes_after_register(tmp_path):
    hf.register()
    hf.register()  # a second call changes nothing
    config = transformers.AutoConfig.for_model("lamixer", spec="mamba2", vocab_size=VOCAB, hidden_size=HIDDEN, num_heads=HEADS, num_layers=1,
                                               intermediate_size=64, layer_options=SMALL["mamba2"], backend="torch")  # fmt: skip
    assert isinstance(config, hf.LamixerConfig)
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert isinstance(model, hf.LamixerForCausalLM) and isinstance(transformers.AutoModel.from_config(config), hf.LamixerModel)
    model.save_pretrained(tmp_path)
    assert isinstance(transformers.AutoConfig.from_pretrained(tmp_path), hf.LamixerConfig)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    ids, _ = left_padded([0], 5)
    assert isinstance(loaded, hf.LamixerForCausalLM) and torch.equal(loaded(ids).logits, model(ids).logits)
    base = transformers.AutoModel.from_pretrained(tmp_path)
    assert isinstance(base, hf.LamixerModel) and torch.equal(base(ids).last_hidden_state, model.model(ids).last_hidden_state)


def test_importing_lamixer_registers_with_transformers_when_that_is_imported():
    """`import lamixer` imports nothing of transformers (about 3 s), yet its Auto classes know model_type "lamixer"
    as soon as the program imports transformers, whichever comes first."""
    import subprocess
    import sys

    code = ("import sys, lamixer\n"
            "assert 'transformers' not in sys.modules\n"
            "from transformers import AutoConfig\n"
            "print(type(AutoConfig.for_model('lamixer', spec='gla', vocab_size=8, hidden_size=16, num_heads=2, num_layers=1)).__name__)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "LamixerConfig", out.stderr[-2000:]
    # transformers first imported by lamixer.hf's own classes: registered once they are loaded, without a warning
    code = code.replace("from transformers import AutoConfig", "from lamixer.hf import LamixerConfig\nfrom transformers import AutoConfig")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "LamixerConfig", out.stderr[-2000:]

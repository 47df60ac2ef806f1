"""Byte tokenizer and the CLIP text tower: layout, padding invariance, causality, EOT pooling, input errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from solo.text import EOT, PAD, SOT, VOCAB_SIZE, ByteTokenizer, TextTransformer

CAPTIONS = ["a dog", "two cats", "café"]  # each fits in 10 bytes, so a context of 12 does not truncate


def _model(causal=True, context_length=20, seed=0, width=16, depth=2, heads=2):
    torch.manual_seed(seed)
    return TextTransformer(
        vocab_size=VOCAB_SIZE, context_length=context_length, width=width, depth=depth, heads=heads, causal=causal
    ).double()


def _last_block_output(model, tokens):
    """Hidden states (batch, length, width) after the last block, before the final LayerNorm."""
    seen = []
    handle = model.transformer.layers[-1].register_forward_hook(lambda mod, inp, out: seen.append(out))
    try:
        model(tokens)
    finally:
        handle.remove()
    return seen[0]


# --- tokenizer ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["hello, world!", "café naïve — 日本語 🙂", ""])
def test_tokenizer_round_trip(text):
    tokens, truncated = ByteTokenizer(64).encode(text)
    assert not truncated
    assert ByteTokenizer.decode(tokens) == text


def test_tokenizer_layout_pad_after_eot():
    tokens, _ = ByteTokenizer(12).encode("abc")
    assert tokens.tolist() == [SOT, ord("a") + 3, ord("b") + 3, ord("c") + 3, EOT] + [PAD] * 7
    batch = ByteTokenizer(12)(CAPTIONS[:2])
    assert batch.shape == (2, 12) and batch.dtype == torch.long
    for row in batch:
        (eot,) = (row == EOT).nonzero()[:, 0].tolist()  # exactly one EOT
        assert (row[eot + 1 :] == PAD).all() and (row[1:eot] >= 3).all()


def test_tokenizer_truncation_keeps_prefix():
    text = "the quick brown fox jumps over the lazy dog"
    tokens, truncated = ByteTokenizer(12).encode(text)
    assert truncated
    assert tokens[-1] == EOT and tokens[0] == SOT
    assert ByteTokenizer.decode(tokens) == text[:10]
    _, truncated = ByteTokenizer(12).encode(text[:10])  # exactly fills the context: not truncated
    assert not truncated
    with pytest.raises(ValueError, match="context_length"):
        ByteTokenizer(2)


# --- encoder -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_shape_dtype_and_determinism(causal):
    tokens = ByteTokenizer(20)(CAPTIONS)
    out = _model(causal)(tokens)
    assert out.shape == (3, 16) and out.dtype == torch.float64 and torch.isfinite(out).all()
    assert _model(causal).width == 16
    assert torch.equal(out, _model(causal)(tokens))
    assert not torch.allclose(out, _model(causal, seed=1)(tokens))


@pytest.mark.parametrize("causal", [True, False])
def test_eval_no_grad_fast_path_matches_training_path(causal):
    # With dropout 0, eval + no_grad (torch's fused encoder path) must give the same numbers as the plain path.
    model, tokens = _model(causal), ByteTokenizer(20)(CAPTIONS)
    train_out = model(tokens)
    model.eval()
    with torch.no_grad():
        eval_out = model(tokens)
    torch.testing.assert_close(eval_out, train_out.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_output_independent_of_padding(causal):
    model = _model(causal, context_length=20)
    assert not any(ByteTokenizer(12).encode(c)[1] for c in CAPTIONS)
    short, long = ByteTokenizer(12)(CAPTIONS), ByteTokenizer(20)(CAPTIONS)
    assert short.shape[1] == 12 and long.shape[1] == 20
    out = model(long)
    torch.testing.assert_close(model(short), out, rtol=1e-12, atol=1e-12)

    # Whatever follows the EOT is ignored: replace every PAD with arbitrary ids (bytes, SOT, even EOT).
    changed = long.clone()
    after = long == PAD
    changed[after] = torch.randint(1, VOCAB_SIZE, (int(after.sum()),), generator=torch.Generator().manual_seed(0))
    assert not torch.equal(changed, long)
    torch.testing.assert_close(model(changed), out, rtol=1e-12, atol=1e-12)


def test_causal_position_sees_only_itself_and_earlier():
    tokens = ByteTokenizer(20)(["abcdefgh"])  # SOT a b c d e f g h EOT
    k = 4
    changed = tokens.clone()
    changed[0, k + 1 :] = torch.where(changed[0, k + 1 :] >= 3, changed[0, k + 1 :] + 1, changed[0, k + 1 :])
    assert not torch.equal(changed[0, k + 1 : 10], tokens[0, k + 1 : 10])

    hidden, hidden_changed = (_last_block_output(_model(causal=True), t) for t in (tokens, changed))
    torch.testing.assert_close(hidden_changed[:, : k + 1], hidden[:, : k + 1], rtol=0, atol=0)
    assert not torch.allclose(hidden_changed[:, k + 1 : 10], hidden[:, k + 1 : 10])

    # The check has teeth: without the causal mask, position k does see the change.
    hidden, hidden_changed = (_last_block_output(_model(causal=False), t) for t in (tokens, changed))
    assert not torch.allclose(hidden_changed[:, : k + 1], hidden[:, : k + 1])


def _reference_forward(model, tokens, causal):
    """CLIP's text tower written out by hand from the module's weights, one row at a time, no padding at all."""
    heads = model.transformer.layers[0].self_attn.num_heads
    outputs = []
    for row in tokens:
        eot = row.tolist().index(EOT)
        ids = row[: eot + 1]  # drop everything after EOT instead of masking it
        n = len(ids)
        x = model.token_embedding.weight[ids] + model.positional_embedding[:n]
        for layer in model.transformer.layers:
            attn = layer.self_attn
            h = F.layer_norm(x, (x.shape[-1],), layer.norm1.weight, layer.norm1.bias, layer.norm1.eps)
            q, k, v = (h @ attn.in_proj_weight.T + attn.in_proj_bias).chunk(3, dim=-1)
            q, k, v = (t.reshape(n, heads, -1).transpose(0, 1) for t in (q, k, v))  # (heads, n, d)
            scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
            if causal:
                scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            a = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1)
            x = x + a @ attn.out_proj.weight.T + attn.out_proj.bias
            h = F.layer_norm(x, (x.shape[-1],), layer.norm2.weight, layer.norm2.bias, layer.norm2.eps)
            x = x + layer.linear2(F.gelu(layer.linear1(h)))
        outputs.append(model.ln_final(x)[eot])  # final LayerNorm, pooled at EOT
    return torch.stack(outputs)


@pytest.mark.parametrize("causal", [True, False])
def test_pooled_at_eot_matches_independent_computation(causal):
    model, tokens = _model(causal), ByteTokenizer(20)(CAPTIONS)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), _reference_forward(model, tokens, causal), rtol=1e-10, atol=1e-12)


def test_gradients_reach_all_parameters():
    model = _model(causal=False)
    model(ByteTokenizer(20)(CAPTIONS)).pow(2).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_input_errors():
    model = _model(context_length=12)
    tokens = ByteTokenizer(12)(CAPTIONS)
    no_eot = tokens.clone()
    no_eot[1][no_eot[1] == EOT] = PAD
    with pytest.raises(ValueError, match="row 1 has no end-of-text"):
        model(no_eot)
    with pytest.raises(ValueError, match="20.*12"):
        model(ByteTokenizer(20)(CAPTIONS))
    for bad in (-1, VOCAB_SIZE):
        wrong = tokens.clone()
        wrong[0, 3] = bad
        with pytest.raises(ValueError, match="token ids"):
            model(wrong)
    with pytest.raises(ValueError, match="batch, length"):
        model(tokens[0])
    with pytest.raises(ValueError, match="integer"):
        model(tokens.double())
    with pytest.raises(ValueError, match=r"width \(10\).*heads \(4\)"):
        TextTransformer(vocab_size=VOCAB_SIZE, context_length=12, width=10, depth=1, heads=4)
    with pytest.raises(ValueError, match="depth"):
        TextTransformer(vocab_size=VOCAB_SIZE, context_length=12, width=16, depth=0, heads=2)

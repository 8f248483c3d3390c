import math

import pytest
import torch
from torch import nn

from graphormer.models import BiasedMultiheadAttention
from graphormer.models.attention_kernel import biased_attention

E, H, B, L = 16, 4, 3, 7


def pair(batch_first=True, bias=True, seed=0):
    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(E, H, bias=bias, batch_first=batch_first).eval()
    with torch.no_grad():  # non-zero biases so that they are really compared
        if bias:
            mha.in_proj_bias.normal_()
            mha.out_proj.bias.normal_()
    return mha, BiasedMultiheadAttention.from_torch(mha).eval()


def padding_mask():
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[1, 5:] = True
    mask[2, 2:] = True
    return mask


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_parity_with_torch_mha(batch_first, masked):
    mha, ours = pair(batch_first)
    x = torch.randn(B, L, E) if batch_first else torch.randn(L, B, E)
    mask = padding_mask() if masked else None
    ref_out, ref_avg = mha(x, x, x, key_padding_mask=mask, need_weights=True)
    _, ref_heads = mha(x, x, x, key_padding_mask=mask, average_attn_weights=False)
    out_fast, none = ours(x, key_padding_mask=mask)
    out, avg = ours(x, key_padding_mask=mask, need_weights=True)
    _, heads = ours(x, key_padding_mask=mask, need_weights=True, average_attn_weights=False)
    assert none is None
    torch.testing.assert_close(out_fast, ref_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(avg, ref_avg, atol=1e-5, rtol=0)
    torch.testing.assert_close(heads, ref_heads, atol=1e-5, rtol=0)
    assert avg.shape == (B, L, L) and heads.shape == (B, H, L, L)


@pytest.mark.parametrize("average", [True, False])
def test_packed_tokens_honour_the_padding_mask_and_weight_averaging(average):
    """A packed batch (only the real tokens, no bias) masked by key_padding_mask alone equals
    torch's MHA on the padded batch at the real rows, weights averaged or per head as asked."""
    mha, ours = pair()
    x = torch.randn(B, L, E)
    mask = padding_mask()
    tokens = (~mask).view(-1).nonzero().view(-1)  # rows of the real tokens in [B * L]
    ref_out, ref_weights = mha(
        x, x, x, key_padding_mask=mask, need_weights=True, average_attn_weights=average
    )
    out, weights = ours(
        x.reshape(B * L, E)[tokens],
        key_padding_mask=mask,
        need_weights=True,
        average_attn_weights=average,
        packed=(tokens, B, L),
    )
    torch.testing.assert_close(out, ref_out.reshape(B * L, E)[tokens], atol=1e-5, rtol=0)
    assert weights.shape == ((B, L, L) if average else (B, H, L, L))
    real = ~mask  # compare the real query rows
    torch.testing.assert_close(
        weights[real] if average else weights.transpose(1, 2)[real],
        ref_weights[real] if average else ref_weights.transpose(1, 2)[real],
        atol=1e-5,
        rtol=0,
    )


def test_packed_tokens_refuse_a_separate_key_and_value():
    _, ours = pair()
    x = torch.randn(5, E)
    tokens = torch.arange(5)
    with pytest.raises(ValueError, match="packed=.*self-attention"):
        ours(x, x, x, packed=(tokens, 1, 5))


def test_cross_attention_parity():
    mha, ours = pair()
    q, kv = torch.randn(B, 3, E), torch.randn(B, L, E)
    ref, _ = mha(q, kv, kv)
    out, _ = ours(q, kv, kv)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_hand_computation_from_packed_in_proj():
    mha, ours = pair()
    x = torch.randn(B, L, E)
    w_q, w_k, w_v = torch.split(mha.in_proj_weight, E, dim=0)
    b_q, b_k, b_v = torch.split(mha.in_proj_bias, E, dim=0)

    def heads(t):  # [B, L, E] -> [B, H, L, D]
        return t.reshape(B, L, H, E // H).transpose(1, 2)

    q, k, v = heads(x @ w_q.T + b_q), heads(x @ w_k.T + b_k), heads(x @ w_v.T + b_v)
    pq, pk, pv = ours.project(x)
    torch.testing.assert_close(pv, v, atol=1e-6, rtol=0)
    torch.testing.assert_close(pq, q, atol=1e-6, rtol=0)
    torch.testing.assert_close(pk, k, atol=1e-6, rtol=0)
    weights = (q @ k.transpose(-1, -2) / math.sqrt(E // H)).softmax(-1)
    expected = mha.out_proj((weights @ v).transpose(1, 2).reshape(B, L, E))
    out, _ = ours(x)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("per_head", [True, False])
def test_bias_is_added_before_softmax(per_head):
    _, ours = pair()
    x = torch.randn(B, L, E)
    bias = torch.randn(B, H, L, L) if per_head else torch.randn(B, L, L)
    q, k, v = ours.project(x)
    full = bias if per_head else bias.unsqueeze(1)
    weights = (q @ k.transpose(-1, -2) / math.sqrt(E // H) + full).softmax(-1)
    expected = ours.out_proj((weights @ v).transpose(1, 2).reshape(B, L, E))
    out_fast, _ = ours(x, attn_bias=bias)
    out, got = ours(x, attn_bias=bias, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out_fast, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(got, weights, atol=1e-6, rtol=0)
    torch.testing.assert_close(got.sum(-1), torch.ones(B, H, L))


def test_gradients_reach_the_bias_on_both_paths():
    _, ours = pair()
    x = torch.randn(B, L, E)
    for need_weights in (False, True):
        bias = torch.zeros(B, H, L, L, requires_grad=True)
        out, _ = ours(x, attn_bias=bias, key_padding_mask=padding_mask(), need_weights=need_weights)
        out.square().sum().backward()
        assert bias.grad is not None and bias.grad.abs().sum() > 0
        # Masked keys get no attention, hence no gradient.
        assert bias.grad[2, :, :, 2:].abs().max() == 0


def test_padded_rows_are_finite_and_get_no_mass():
    _, ours = pair()
    x = torch.randn(B, L, E)
    mask = padding_mask()
    out, weights = ours(
        x, attn_bias=torch.randn(B, H, L, L), key_padding_mask=mask, need_weights=True
    )
    assert torch.isfinite(out).all()  # padded query rows included
    assert weights[2, :, 2:].abs().max() == 0
    everything = torch.ones(B, L, dtype=torch.bool)
    out, _ = ours(x, key_padding_mask=everything)
    assert torch.isfinite(out).all()


def test_round_trip_and_state_dict_interop():
    mha, ours = pair(bias=True)
    back = ours.to_torch()
    for name, tensor in mha.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, atol=0, rtol=0)
    fresh = BiasedMultiheadAttention(E, H)
    fresh.load_state_dict(mha.state_dict())
    torch.testing.assert_close(fresh.v_proj.weight, mha.in_proj_weight[2 * E :], atol=0, rtol=0)
    torch.testing.assert_close(fresh.k_proj.bias, mha.in_proj_bias[E : 2 * E], atol=0, rtol=0)
    # Our own state dict round-trips too.
    again = BiasedMultiheadAttention(E, H)
    again.load_state_dict(ours.state_dict())
    x = torch.randn(B, L, E)
    torch.testing.assert_close(again(x)[0], ours(x)[0], atol=0, rtol=0)


def test_without_bias_parity():
    mha, ours = pair(bias=False)
    assert ours.q_proj.bias is None
    x = torch.randn(B, L, E)
    torch.testing.assert_close(ours(x)[0], mha(x, x, x)[0], atol=1e-5, rtol=0)
    assert ours.to_torch().in_proj_bias is None


def test_unrepresentable_settings_and_bad_shapes_raise():
    with pytest.raises(ValueError, match="divisible"):
        BiasedMultiheadAttention(10, 3)
    for kwargs in ({"add_bias_kv": True}, {"add_zero_attn": True}, {"kdim": 8, "vdim": 8}):
        with pytest.raises(ValueError, match="cannot represent"):
            BiasedMultiheadAttention.from_torch(nn.MultiheadAttention(E, H, **kwargs))
    with pytest.raises(ValueError, match="cannot represent"):
        BiasedMultiheadAttention(E, H).load_state_dict(
            nn.MultiheadAttention(E, H, add_bias_kv=True).state_dict()
        )
    ours = BiasedMultiheadAttention(E, H)
    with pytest.raises(ValueError, match="attn_bias"):
        ours(torch.randn(B, L, E), attn_bias=torch.randn(B, H, L, L + 1))
    with pytest.raises(ValueError, match="key_padding_mask"):
        ours(torch.randn(B, L, E), key_padding_mask=torch.zeros(B, L + 1, dtype=torch.bool))


# -- the CPU training kernel (biased_attention) ------------------------------------------------


def sdpa_reference(q, k, v, bias):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + bias
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("k_len", [6, 20], ids=["keys padded to 16", "keys as they are"])
@pytest.mark.parametrize("bias_shape", [(2, 3, 5), (2, 1, 5), (2, 1, 1), (1, 3, 5)], ids=str)
def test_biased_attention_matches_the_definition_with_gradients(bias_shape, k_len):
    torch.manual_seed(0)
    dt = torch.float64
    q = torch.randn(2, 3, 5, 4, dtype=dt, requires_grad=True)
    k, v = (torch.randn(2, 3, k_len, 4, dtype=dt, requires_grad=True) for _ in range(2))
    bias = torch.randn(*bias_shape, k_len, dtype=dt, requires_grad=True)
    out = biased_attention(q, k, v, bias)
    ref = sdpa_reference(q, k, v, bias)
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, bias), grad)
    want = torch.autograd.grad(ref, (q, k, v, bias), grad)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_biased_attention_dropout_gradients_follow_the_forward_mask():
    dt = torch.float64
    q, k, v = (torch.randn(2, 2, 5, 3, dtype=dt, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, 2, 5, 5, dtype=dt, requires_grad=True)

    def seeded(*args):
        torch.manual_seed(7)  # the same mask on every call gradcheck makes
        return biased_attention(*args, dropout_p=0.3)

    assert torch.autograd.gradcheck(seeded, (q, k, v, bias))
    torch.manual_seed(7)
    first = biased_attention(q, k, v, bias, 0.3)
    second = biased_attention(q, k, v, bias, 0.3)  # the RNG has moved on: another mask
    torch.manual_seed(7)
    torch.testing.assert_close(biased_attention(q, k, v, bias, 0.3), first, rtol=0, atol=0)
    assert not torch.equal(first, second)


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_biased_attention_dropout_rate_and_expectation(p):
    # Uniform weights (q = 0, no bias) and v = identity: each output row is the row of dropped
    # and rescaled weights, so every dropped weight shows as an exact zero.
    torch.manual_seed(0)
    batch, heads, length = 16, 8, 64
    q = torch.zeros(batch, heads, length, length)
    v = torch.eye(length).expand(batch, heads, length, length)
    out = biased_attention(q, q, v, torch.zeros(1, 1, 1, length), dropout_p=p)
    dropped = out == 0
    n = dropped.numel()
    assert abs(dropped.float().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / n)
    kept = out[~dropped]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / length / (1 - p)), rtol=1e-4, atol=0)
    # Unbiased: the rows still sum to 1 on average.
    assert abs(out.sum(-1).mean().item() - 1) < 5 * math.sqrt(p / (1 - p) / n * length)
    # Independent across heads and query rows: no two heads share a mask.
    per_head = dropped.float().mean((0, 2, 3))
    assert not any(torch.equal(dropped[:, 0], dropped[:, h]) for h in range(1, heads))
    assert per_head.std() < 0.01
    assert torch.equal(
        biased_attention(q, q, v, torch.zeros(1), dropout_p=1.0), torch.zeros_like(out)
    )


def test_the_model_trains_the_same_through_either_attention_kernel(monkeypatch):
    from graphormer import models
    from graphormer.data import GraphormerCollator, StructuralFeatures
    from graphormer.models import attention
    from graphormer.testing import nci_graphs, to_data

    batch = GraphormerCollator()([StructuralFeatures()(to_data(g)) for g in nci_graphs(6)])
    torch.manual_seed(0)
    no_dropout = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
    config = models.GraphormerConfig(
        num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=4, **no_dropout
    )
    model = models.Graphormer(config).train()
    results = []
    for own in (True, False):
        monkeypatch.setattr(attention, "use_own_kernel", lambda q, p, own=own: own)
        model.zero_grad()
        out = model(batch)
        out.square().sum().backward()
        results.append((out, [p.grad.clone() for p in model.parameters()]))
    (out_a, grads_a), (out_b, grads_b) = results
    torch.testing.assert_close(out_a, out_b, atol=1e-6, rtol=1e-5)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_cheap_dropout_is_dropout():
    from graphormer.models.dropout import Dropout, dropout

    torch.manual_seed(0)
    x = torch.rand(64, 50, 80) + 0.5  # no exact zeros of its own
    layer = Dropout(0.1).train()
    out = layer(x)
    dropped = out == 0
    n = x.numel()
    assert abs(dropped.float().mean().item() - 0.1) < 5 * math.sqrt(0.09 / n)
    torch.testing.assert_close(out[~dropped], x[~dropped] / 0.9, rtol=1e-4, atol=0)
    # The gradient is the forward's mask and scale.
    x.requires_grad_(True)
    torch.manual_seed(3)
    y = layer(x)
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.testing.assert_close(grad, (y != 0).float() / 0.9, rtol=1e-4, atol=0)
    # Seeded: the same mask; eval and p=0: the input itself; p=1: zeros.
    torch.manual_seed(3)
    assert torch.equal(layer(x), y)
    assert layer.eval()(x) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    assert isinstance(layer, nn.Dropout) and layer.p == 0.1


def test_keep_mask_is_the_drop_masks_complement_and_the_kernel_applies_it_exactly():
    from graphormer.models.dropout import drop_mask, keep_mask

    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(5)
        drop, scale = drop_mask((7, 33, 21), 0.1)
        torch.manual_seed(5)
        keep, keep_scale = keep_mask((7, 33, 21), 0.1, dtype)
        assert keep.dtype == dtype and keep_scale == scale
        assert torch.equal(keep, (~drop).to(dtype))
    keep, keep_scale = keep_mask((4, 5), 1 - 1e-7)
    assert not keep.any() and keep_scale == 0.0
    # The kernel's dropout gives, to the bit, the weights masked with the same draw.
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 19, 10, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, 3, 19, 19, requires_grad=True)
    torch.manual_seed(1)
    out = biased_attention(q, k, v, bias, 0.1)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, bias))
    torch.manual_seed(1)
    drop, scale = drop_mask((6, 19, 19), 0.1)
    scores = torch.baddbmm(
        bias.reshape(6, 19, 19),
        q.reshape(6, 19, 10),
        k.reshape(6, 19, 10).transpose(1, 2),
        alpha=10**-0.5,
    )
    weights = scores.softmax(-1).masked_fill(drop, 0.0)
    ref = torch.bmm(weights, v.reshape(6, 19, 10)).mul(scale).view(2, 3, 19, 10)
    assert torch.equal(out, ref)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v, bias))
    for ours, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_kernel_edge_cases_behave_as_sdpa():
    from graphormer.models.dropout import drop_mask

    torch.manual_seed(0)
    _, ours = pair()
    ours.train()
    x = torch.randn(B, L, E, requires_grad=True)
    bias = torch.zeros(B, H, L, L)
    bias[:, :, 1, :] = -math.inf  # a query row with nothing to attend to
    out, _ = ours(x, attn_bias=bias)
    out.sum().backward()
    with torch.no_grad():  # inference takes SDPA
        ref, _ = ours.eval()(x, attn_bias=bias)
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(out[:, 1], ref[:, 1])  # the empty row: the output bias alone
    # Invalid rates fail as torch's dropout does; a near-1 rate drops everything.
    for p in (-0.2, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            BiasedMultiheadAttention(E, H, dropout=p)
    drop, scale = drop_mask((4, 5), 1 - 1e-7)
    assert drop.all() and scale == 0.0
    q = torch.randn(2, 2, 5, 4, requires_grad=True)
    with pytest.raises(ValueError, match="bool mask"):
        biased_attention(q, q, q, torch.ones(5, 5, dtype=torch.bool))
    # Under CPU autocast a direct call computes in its inputs' dtype, backward included.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = biased_attention(q, q, q, torch.zeros(5, 5), 0.1)
    assert out.dtype == torch.float32
    out.sum().backward()
    # Other dtypes (and devices) get torch's kernel: the same function.
    qb, bias_b = q.detach().bfloat16(), torch.randn(5, 5).bfloat16()
    torch.testing.assert_close(
        biased_attention(qb, qb, qb, bias_b),
        torch.nn.functional.scaled_dot_product_attention(qb, qb, qb, attn_mask=bias_b),
    )


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # torch's vmap of SDPA
def test_torch_func_transforms_fall_back_to_torch_kernels():
    _, ours = pair()
    ours.train()
    ours.dropout = 0.0
    x = torch.randn(B, L, E)
    params = dict(ours.named_parameters())

    def loss(p, xi):
        out, _ = torch.func.functional_call(ours, p, (xi.unsqueeze(0),))
        return out.square().sum()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    assert per_sample["q_proj.weight"].shape == (B, E, E)


def test_compiled_training_falls_back_to_torch_kernels():
    # torch.compile cannot replay the cheap dropout's 64-to-16-bit view of its random words
    # (AOTAutograd failed with "setStorage ... out of bounds"): compiled, both the attention and
    # the dropout take torch's own ops, over varying sizes, and without dropout they compute
    # what the eager CPU kernel does.
    from graphormer.models.dropout import Dropout

    class Block(nn.Module):
        def __init__(self, p: float) -> None:
            super().__init__()
            self.attention = BiasedMultiheadAttention(E, H, dropout=p)
            self.drop = Dropout(p)

        def forward(self, x, bias):
            return self.drop(self.attention(x, attn_bias=bias)[0])

    torch.manual_seed(0)
    for p in (0.1, 0.0):
        eager = Block(p).train()
        compiled = Block(p).train()
        compiled.load_state_dict(eager.state_dict())
        compiled.compile(dynamic=True, backend="aot_eager")
        for length in (5, 9):
            x = torch.randn(B, length, E)
            bias = torch.randn(B, H, length, length)
            grads = []
            for block in (eager, compiled):
                xi, bi = x.clone().requires_grad_(), bias.clone().requires_grad_()
                out = block(xi, bi)
                out.square().sum().backward()
                assert torch.isfinite(xi.grad).all() and bi.grad.abs().sum() > 0
                grads.append((out.detach(), xi.grad, bi.grad))
            if p == 0.0:
                for a, b in zip(*grads, strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

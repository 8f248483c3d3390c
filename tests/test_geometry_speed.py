"""The 3D encoding's fast form (kernels of real pairs only) computes exactly the dense math of
Graphormer-3D's Gaussian distance encoding: values and gradients, with padding and a cutoff."""

import math

import pytest
import torch

from graphormer.models import GaussianDistanceEncoding


def _reference(encoding: GaussianDistanceEncoding, pos, atom_type, node_mask):
    """The encoding written out densely over every pair ``[B, N, N, K]``, padding included."""
    delta = pos.unsqueeze(1) - pos.unsqueeze(2)
    dist = delta.pow(2).sum(-1).add(1e-12).sqrt()  # [B, N, N]
    pair_mask = node_mask.unsqueeze(2) & node_mask.unsqueeze(1)
    far = torch.zeros_like(pair_mask)
    if encoding.cutoff is not None:
        far = (dist > encoding.cutoff) & pair_mask
        pair_mask = pair_mask & ~far
    types = encoding.num_atom_types
    pair_type = atom_type.unsqueeze(2) * types + atom_type.unsqueeze(1)
    x = encoding.gamma(pair_type).squeeze(-1) * dist + encoding.beta(pair_type).squeeze(-1)
    std = encoding.stds.abs() + 1e-5
    z = (x.unsqueeze(-1) - encoding.means) / std
    psi = torch.exp(-0.5 * z * z) / (math.sqrt(2 * math.pi) * std)
    psi = psi * pair_mask.unsqueeze(-1).to(psi.dtype)  # [B, N, N, K]
    bias = encoding.bias_mlp(psi).permute(0, 3, 1, 2)
    atoms = encoding.centrality(psi.sum(2)) * node_mask.unsqueeze(-1).to(psi.dtype)
    return bias, atoms, far


def _inputs():
    generator = torch.Generator().manual_seed(3)
    sizes = [7, 3, 5, 1]
    n = max(sizes)
    node_mask = torch.arange(n).unsqueeze(0) < torch.tensor(sizes).unsqueeze(1)  # [B, N]
    atom_type = torch.randint(1, 6, (len(sizes), n), generator=generator) * node_mask
    pos = 3.0 * torch.randn(len(sizes), n, 3, generator=generator, dtype=torch.float64)
    return pos * node_mask.unsqueeze(-1), atom_type, node_mask


def _encoding(cutoff):
    torch.manual_seed(0)
    encoding = GaussianDistanceEncoding(3, 8, num_atom_types=6, num_kernels=16, cutoff=cutoff)
    encoding = encoding.double()
    with torch.no_grad():  # pair affines and MLP weights away from their initial values
        for p in encoding.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return encoding


@pytest.mark.parametrize("cutoff", [None, 4.0])
def test_the_encoding_equals_the_dense_math_in_values_and_gradients(cutoff):
    encoding = _encoding(cutoff)
    pos, atom_type, node_mask = _inputs()
    outputs = []
    for compute in (encoding, lambda *a: _reference(encoding, *a)):
        encoding.zero_grad()
        where = pos.clone().requires_grad_(True)
        bias, atoms, far = compute(where, atom_type, node_mask)
        weights = torch.linspace(-1, 1, bias.numel(), dtype=bias.dtype).view_as(bias)
        (bias * weights).sum().add(atoms.pow(2).sum()).backward()
        grads = [p.grad.clone() for p in encoding.parameters()] + [where.grad]
        outputs.append((bias, atoms, far, grads))
    (bias, atoms, far, grads), (bias0, atoms0, far0, grads0) = outputs
    if cutoff is not None:
        assert far0.any()  # the cutoff masks some pairs of this batch
    assert torch.equal(far, far0)
    torch.testing.assert_close(bias, bias0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(atoms, atoms0, rtol=1e-12, atol=1e-12)
    for grad, grad0 in zip(grads, grads0, strict=True):
        torch.testing.assert_close(grad, grad0, rtol=1e-10, atol=1e-12)


def test_the_kernels_first_and_second_derivatives_are_exact():
    from graphormer.models.geometry import _Gaussians

    generator = torch.Generator().manual_seed(0)
    x = (3 * torch.rand(2, 3, generator=generator, dtype=torch.float64)).requires_grad_(True)
    mu = (3 * torch.rand(4, generator=generator, dtype=torch.float64)).requires_grad_(True)
    sigma = (0.5 + torch.rand(4, generator=generator, dtype=torch.float64)).requires_grad_(True)
    assert torch.autograd.gradcheck(_Gaussians.apply, (x, mu, sigma))
    assert torch.autograd.gradgradcheck(_Gaussians.apply, (x, mu, sigma))

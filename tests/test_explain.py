"""Attention maps, rollout, featurisation and pictures of graphormer.inference (issue 9)."""

import io

import numpy as np
import pytest
import torch
from ogb.utils import smiles2graph
from PIL import Image

from graphormer.inference import Predictor, attention_rollout, featurize_smiles
from graphormer.inference.pictures import draw_heads, draw_molecule
from graphormer.training import GraphormerModule

from helpers import model_preset, nci_smiles

TASK = {"name": "toy", "task_type": "binary classification", "num_tasks": 2, "metric": "rocauc"}


@pytest.fixture(scope="module")
def sharp_module():
    """A tiny model with large random weights: its attention is far from uniform, so that any
    weight on padding, or a map of the wrong molecule, shows."""
    torch.manual_seed(0)
    module = GraphormerModule(model=model_preset("graphormer_tiny"), task=TASK)
    with torch.no_grad():
        for parameter in module.model.parameters():
            parameter.normal_(0.0, 0.5)
    return module.eval()


def test_attention_rollout_known_answer():
    # Two heads per layer whose average is A1 (layer 0) and A2 (layer 1).
    a1 = np.array([[1.0, 0.0], [0.5, 0.5]])
    a2 = np.array([[0.2, 0.8], [0.0, 1.0]])
    delta = np.array([[0.0, 0.0], [0.1, -0.1]])
    weights = np.stack([np.stack([a1 + delta, a1 - delta]), np.stack([a2 - delta, a2 + delta])])
    # (0.5 I + 0.5 A2) @ (0.5 I + 0.5 A1) = [[0.6, 0.4], [0, 1]] @ [[1, 0], [0.25, 0.75]]
    expected = np.array([[0.7, 0.3], [0.25, 0.75]])
    np.testing.assert_allclose(attention_rollout(weights), expected, atol=1e-12)
    np.testing.assert_allclose(attention_rollout(weights, residual=0.0), a2 @ a1, atol=1e-12)


def test_attention_maps_hold_no_padding(sharp_module):
    """A molecule's maps are the same alone, beside a larger molecule (more padding) and with no
    padding at all; each is cut to the graph token and its atoms, rows summing to 1."""
    ethanol, big = "CCO", next(s for s in nci_smiles() if 25 <= len(s) <= 40)
    padded = Predictor(sharp_module, pad_to_multiple=8)
    alone = padded.attention(ethanol)
    assert alone.weights.shape == (3, 4, 4, 4) and alone.labels == ["graph", "C0", "C1", "O2"]
    np.testing.assert_allclose(alone.weights.sum(-1), 1.0, atol=1e-5)
    assert alone.weights.max() > 0.5  # sharp: padding weight could not hide in the noise
    together = padded.attention_maps([big, ethanol])
    unpadded = Predictor(sharp_module, pad_to_multiple=1).attention_maps([ethanol, big])
    np.testing.assert_allclose(together[1].weights, alone.weights, atol=1e-5)
    np.testing.assert_allclose(unpadded[0].weights, alone.weights, atol=1e-5)
    np.testing.assert_allclose(together[0].weights, unpadded[1].weights, atol=1e-5)
    n = together[0].num_atoms
    assert together[0].weights.shape == (3, 4, n + 1, n + 1)
    np.testing.assert_allclose(together[0].weights.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(together[0].rollout().sum(-1), 1.0, atol=1e-5)
    # The graph token's row, averaged over heads, without its share to itself.
    np.testing.assert_allclose(
        alone.graph_token_attention(1), alone.weights[1, :, 0, 1:].mean(0), atol=1e-6
    )
    # The maps come with the molecule's predictions.
    table = padded.predict([ethanol])
    assert alone.predictions == pytest.approx(
        {"task_0": table.task_0[0], "task_1": table.task_1[0]}, abs=1e-6
    )


def test_featurisation_is_ogbs_and_says_why_a_molecule_fails():
    smiles = list(nci_smiles()[:50])
    graphs = featurize_smiles(smiles).graphs
    for text, graph in zip(smiles, graphs, strict=True):
        reference = smiles2graph(text)
        assert torch.equal(graph.x, torch.from_numpy(reference["node_feat"]))
        assert torch.equal(graph.edge_index, torch.from_numpy(reference["edge_index"]))
        assert torch.equal(graph.edge_attr, torch.from_numpy(reference["edge_feat"]))
    result = featurize_smiles(
        ["CCO", "C1CC", None, "  ", "C(C)(C)(C)(C)C", "[Na+].[Cl-]", "CCCCCC"], max_atoms=5
    )
    assert result.errors[0] == "" and result.errors[5] == ""
    assert result.errors[1] == "invalid SMILES: unclosed ring for input: 'C1CC'"
    assert result.errors[2] == result.errors[3] == "empty SMILES"
    assert "valence" in result.errors[4]
    assert result.errors[6] == "6 atoms, more than max_atoms=5"
    assert result.valid.tolist() == [0, 5] and result.num_atoms.tolist() == [3, 0, 0, 0, 0, 2, 0]


def test_pictures_have_their_size_and_labels():
    png = draw_molecule("CC(=O)Oc1ccccc1C(=O)O", np.linspace(0, 1, 13), size=320, legend="x")
    with Image.open(io.BytesIO(png)) as image:
        assert image.size == (320, 320)
    rng = np.random.default_rng(0)
    for n in (5, 40, 151):
        weights = rng.random((4, n, n))
        weights /= weights.sum(-1, keepdims=True)
        labels = ["graph", *(f"C{i}" for i in range(n - 1))]
        image = draw_heads(weights, labels, title="t")
        pixels = np.asarray(image, dtype=float)
        assert pixels.std() > 10
        # Four panels in a row: cells of 4 to 28 px filling about 360 px, labels, a colour bar.
        cells = max(360, 4 * n)
        assert 4 * (n * 4) < image.width <= 4 * (cells + 72) + 70
        assert n * 4 < image.height <= cells + 72 + 40 + 40
    with pytest.raises(ValueError, match="labels"):
        draw_heads(weights, labels[:-1])


def test_a_nearly_flat_map_is_drawn_flat_and_said_to_be():
    """Issue 20: a logP model's rolled-out attention lay within 0.0710-0.0726 of a uniform
    0.0714 (14 atoms), yet one hydroxyl looked strongly highlighted. Shading follows the share
    relative to uniform, so such a map stays unshaded and its legend says it is flat."""
    from graphormer.inference.pictures import attention_legend, relative_to_uniform, shade

    flat = np.full(14, 1.0)
    flat[[3, 9]] = [0.0710 / 0.0714, 0.0726 / 0.0714]
    flat = flat / flat.sum()
    assert shade(relative_to_uniform(flat)).max() < 0.02
    assert attention_legend(flat).endswith("x uniform, nearly flat")
    peaked = np.full(14, 1.0)
    peaked[5] = 3.0  # one atom gets ~2.8x its fair share
    shades = shade(relative_to_uniform(peaked))
    assert shades[5] > 0.65 and shades[np.arange(14) != 5].max() == 0.0
    assert "nearly flat" not in attention_legend(peaked)
    assert attention_legend(peaked).startswith("0.88-2.62x uniform")


def test_head_heatmaps_show_each_row_relative_to_uniform():
    """A uniform row is white whatever the head; a key with four times a uniform share is the
    darkest shade, also in a head whose largest weight is small."""
    n = 6
    weights = np.full((2, n, n), 1.0 / n)
    weights[1, 2] = [0.5 / 5] * 5 + [0.5]  # query 2 of head 1 puts half on the last key (3x)
    image = draw_heads(weights, ["graph", *(f"C{i}" for i in range(n - 1))], title="t")
    pixels = np.asarray(image)
    # Head 0 is uniform: no cell of its panel is shaded (only white, ink and label pixels).
    from graphormer.inference.pictures import colormap, relative_to_uniform, shade

    assert shade(relative_to_uniform(weights[0], axis=-1)).max() == 0.0
    darkest = (colormap(shade(relative_to_uniform(weights[1], axis=-1)))[2, -1] * 255).round()
    assert (np.abs(pixels.reshape(-1, 3) - darkest).sum(1) < 3).any()

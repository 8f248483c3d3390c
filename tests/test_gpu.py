"""GPU checks (python -m pytest -m gpu); skipped without CUDA."""

import json

import pytest
import torch
from torch import nn

from graphormer.data import GraphormerCollator, StructuralFeatures
from graphormer.models import BiasedMultiheadAttention, Graphormer, GraphormerConfig

from helpers import TINY, evaluate_run, nci_graphs, run_script, to_data

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_attention_matches_torch_on_cuda():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(64, 8, batch_first=True).cuda().eval()
    ours = BiasedMultiheadAttention.from_torch(mha).eval()
    x = torch.randn(4, 33, 64, device="cuda")
    mask = torch.zeros(4, 33, dtype=torch.bool, device="cuda")
    mask[1, 20:] = True
    ref, _ = mha(x, x, x, key_padding_mask=mask)
    out, _ = ours(x, key_padding_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    bias = torch.randn(4, 8, 33, 33, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fast, _ = ours(x, attn_bias=bias, key_padding_mask=mask)
        slow, _ = ours(x, attn_bias=bias, key_padding_mask=mask, need_weights=True)
    torch.testing.assert_close(fast.float(), slow.float(), atol=3e-2, rtol=3e-2)
    fast.float().sum().backward()
    assert bias.grad is not None and torch.isfinite(bias.grad).all()


def test_model_padding_invariance_on_cuda():
    model = Graphormer(GraphormerConfig(num_layers=2, hidden_dim=32, ffn_dim=32, num_heads=4))
    model = model.cuda().eval()
    graphs = [StructuralFeatures(5)(to_data(g, 0.0)) for g in nci_graphs(50)[:6]]
    collate = GraphormerCollator(max_hops=5, pad_to_multiple=8)
    together = model(collate(graphs).to("cuda"))
    for i, g in enumerate(graphs):
        alone = model(collate([g]).to("cuda"))
        torch.testing.assert_close(alone[0], together[i], atol=1e-4, rtol=1e-4)


def test_train_and_eval_on_one_gpu(tmp_path, ogb_root):
    out = tmp_path / "gpu"
    run_script(
        "train.py",
        [
            "dataset=ogbg-molhiv",
            f"dataset.root={ogb_root}",
            "trainer=gpu",
            "trainer.max_epochs=2",
            f"hydra.run.dir={out}",
            *TINY,
        ],
        cwd=tmp_path,
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["precision"] == "bf16-mixed"
    result, _ = evaluate_run(metrics, tmp_path)
    for split in ("valid", "test"):
        assert result[split]["rocauc"] == pytest.approx(metrics[split]["rocauc"], abs=5e-3)

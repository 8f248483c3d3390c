"""Published Graphormer weights: conversion from Microsoft's and Hugging Face's layouts, the round
trip through Microsoft's, the path choice they share, and fine-tuning that never loads wrongly."""

import argparse
import datetime
import logging
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from graphormer import checkpoint
from graphormer.data import GraphormerCollator, StructuralFeatures, shortest_paths
from graphormer.errors import UserFacingError
from graphormer.interop import (
    ConversionError,
    convert_checkpoint,
    fine_tune_overrides,
    from_huggingface,
    from_microsoft,
    to_microsoft,
)
from graphormer.models import Graphormer, GraphormerConfig
from graphormer.training import CheckpointError, GraphormerModule
from graphormer.training.pretrained import load_pretrained

from helpers import (
    CONFIGS,
    call,
    microsoft_config,
    model_preset,
    nci_graphs,
    nci_smiles,
    random_model,
    to_data,
    write_fairseq,
)

REPO = Path(__file__).resolve().parents[1]
ENC = "encoder.graph_encoder."


def batch_of(graphs, hops=5):
    return GraphormerCollator(max_hops=hops)([StructuralFeatures(hops)(g.clone()) for g in graphs])


def molecules(indices):
    graphs = nci_graphs(400)
    return [to_data(graphs[i]) for i in indices]


def same_state(a: dict, b: dict) -> list[str]:
    assert sorted(a) == sorted(b)
    return [k for k in a if a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]


# -- Microsoft's layout ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # post-LN + embedding LayerNorm, multi-hop, 3 tasks: Microsoft's base
        {"pre_layernorm": True, "embedding_layernorm": False, "edge_encoding": "single_hop"},
        {"pre_layernorm": True, "attention_max_distance": 20, "multi_hop_max_dist": 3},
    ],
)
def test_microsoft_round_trip_is_identical(overrides):
    config = microsoft_config(**overrides)
    model = random_model(config)
    settings, theirs = to_microsoft(config, model.state_dict())
    # Microsoft's own shapes: padding row 0, one [H, H] matrix per hop flattened to [K*H*H, 1].
    assert theirs[ENC + "graph_attn_bias.spatial_pos_encoder.weight"].shape == (512, 4)
    assert theirs[ENC + "graph_node_feature.in_degree_encoder.weight"].shape == (512, 32)
    assert theirs[ENC + "graph_node_feature.atom_encoder.weight"][0].abs().max() == 0
    if config.edge_encoding == "multi_hop":
        hops = theirs[ENC + "graph_attn_bias.edge_dis_encoder.weight"]
        assert hops.shape == (config.multi_hop_max_dist * 16, 1)
    assert (ENC + "final_layer_norm.weight" in theirs) == config.pre_layernorm
    back_config, back = from_microsoft(theirs, settings)
    assert back_config == config
    assert same_state(back, model.state_dict()) == []


def test_float16_checkpoints_convert_to_float32():
    config = microsoft_config()
    model = random_model(config)
    settings, theirs = to_microsoft(config, model.state_dict())
    _, back = from_microsoft({k: v.half() for k, v in theirs.items()}, settings)
    assert {v.dtype for v in back.values()} == {torch.float32}
    expected = model.state_dict()["layers.0.fc1.weight"].half().float()
    assert torch.equal(back["layers.0.fc1.weight"], expected)


def test_microsoft_index_conventions_known_answer():
    """Rows of a Microsoft-layout table that hold their own row number land where Microsoft's
    pipeline reads them: atoms value + 512 * column + 2, path edges + 3, degrees and distances + 1,
    unreachable pairs row 511."""
    config = microsoft_config()
    settings, theirs = to_microsoft(config, random_model(config).state_dict())
    for key in list(theirs):
        if key.endswith(("atom_encoder.weight", "edge_encoder.weight", "degree_encoder.weight")):
            rows = theirs[key].size(0)
            theirs[key] = torch.arange(rows, dtype=torch.float).unsqueeze(1).expand_as(theirs[key])
        if key.endswith("spatial_pos_encoder.weight"):
            theirs[key] = torch.arange(512, dtype=torch.float).unsqueeze(1).expand(512, 4)
    _, ours = from_microsoft(theirs, settings)
    atoms = ours["node_encoder.atom.embedding.weight"][:, 0]
    assert atoms[512 * 3 + 7] == 512 * 3 + 7 + 2  # column 3, value 7
    edges = ours["attn_bias.edge.embedding.weight"][:, 0]
    assert edges[512 * 2 + 1] == 512 * 2 + 1 + 3
    assert ours["node_encoder.in_degree.weight"][4, 0] == 5
    spatial = ours["attn_bias.spatial.weight"][:, 0]
    assert spatial[0] == 1 and spatial[509] == 510 and spatial[510] == 511
    model = Graphormer(config)
    index = model.attn_bias.spatial_index(torch.tensor([0, 3, 509, 510, 600, -1]))
    assert spatial[index].tolist() == [1, 4, 510, 511, 511, 511]  # -1: unreachable


def test_single_hop_edges_use_their_own_shift():
    config = microsoft_config(edge_encoding="single_hop")
    settings, theirs = to_microsoft(config, random_model(config).state_dict())
    key = ENC + "graph_attn_bias.edge_encoder.weight"
    theirs[key] = torch.arange(theirs[key].size(0), dtype=torch.float).unsqueeze(1).expand(-1, 4)
    _, ours = from_microsoft(theirs, settings)
    assert ours["attn_bias.edge.embedding.weight"][512 + 2, 0] == 512 + 2 + 2


def test_compact_tables_export_to_an_equivalent_model():
    """A model with the slim preset's tables (compact, max_degree 64, max_distance 20, per-task bias
    all equal) becomes a Microsoft model that computes the same function."""
    config = GraphormerConfig(
        num_layers=2, hidden_dim=32, ffn_dim=48, num_heads=4, num_tasks=2, dropout=0.0
    )
    model = random_model(config)
    with torch.no_grad():
        model.head.bias.fill_(0.3)
    settings, theirs = to_microsoft(config, model.state_dict())
    back_config, back = from_microsoft(theirs, settings)
    converted = Graphormer(back_config).eval()
    converted.load_state_dict(back)
    batch = batch_of(molecules([0, 5, 17, 33, 120, 250]))
    with torch.no_grad():
        torch.testing.assert_close(converted(batch), model(batch), atol=1e-5, rtol=0)


def test_to_microsoft_refuses_what_microsoft_cannot_express():
    for overrides, phrase in [
        ({"final_layernorm": True}, "final_layernorm"),
        ({"head_bias": "per_task"}, "per_task"),
        ({"max_distance": 509, "unreachable_as_far": False}, "max_distance"),
        ({"readout": "token_sum"}, "readout=token_sum"),
        ({"molecule_features_dim": 3}, "molecule features"),
        ({"atom_tasks": 2}, "atom or bond targets"),
        ({"atom_tasks": 2, "num_tasks": 0}, "atom or bond targets"),  # no molecule head
        ({"channels": "both"}, "model.channels=both"),  # its distance encoding has no place
        ({"channels": "3d", "atom_vector_tasks": 1}, "atom or bond targets"),
    ]:
        config = microsoft_config(**overrides)
        with pytest.raises(ConversionError, match=phrase):
            to_microsoft(config, random_model(config).state_dict())


def test_settings_that_contradict_the_tensors_are_an_error():
    config = microsoft_config()
    settings, theirs = to_microsoft(config, random_model(config).state_dict())
    with pytest.raises(ConversionError, match=r"encoder_layers=12 \(the tensors say 2\)"):
        from_microsoft(theirs, {**settings, "encoder_layers": 12})
    with pytest.raises(ConversionError, match="multi_hop_max_dist=9"):
        from_microsoft(theirs, {**settings, "multi_hop_max_dist": 9})  # only 5 hop matrices
    theirs[ENC + "layers.0.layer_scale1"] = torch.ones(32)
    with pytest.raises(ConversionError, match="no place for: .*layer_scale1"):
        from_microsoft(theirs, settings)


def test_a_nonzero_edge_padding_row_is_reported(caplog):
    """Microsoft's model adds edge_encoder row 0 to every pair without an edge; ours adds zero."""
    config = microsoft_config()
    settings, theirs = to_microsoft(config, random_model(config).state_dict())
    theirs[ENC + "graph_attn_bias.edge_encoder.weight"][0] = 1.0
    with caplog.at_level(logging.WARNING, logger="graphormer.interop.microsoft"):
        from_microsoft(theirs, settings)
    assert "row 0 (padding) of edge_encoder is not zero" in caplog.text


def test_unused_microsoft_tensors_are_dropped_and_the_bare_encoder_gets_a_new_head():
    config = microsoft_config(pre_layernorm=True)
    model = random_model(config)
    settings, theirs = to_microsoft(config, model.state_dict())
    # A Hugging Face bare GraphormerModel: no encoder. prefix, no head.
    bare = {
        k.removeprefix("encoder."): v
        for k, v in theirs.items()
        if not k.startswith(("encoder.embed_out", "encoder.lm_output", "encoder.masked_lm"))
    }
    hf_config = {
        "num_hidden_layers": 2,
        "embedding_dim": 32,
        "num_classes": 1,
        "spatial_pos_max": 1024,
    }
    back_config, back = from_huggingface(bare, hf_config, convention="microsoft", num_tasks=5)
    assert back_config.num_tasks == 5 and back["head.weight"].shape == (5, 32)
    assert float(back["head_bias"]) == 0.0
    fresh = ("head.weight", "head_bias")
    assert [k for k in same_state(back, model.state_dict()) if k not in fresh] == []


# -- files and the script ---------------------------------------------------------------------


def test_convert_script_writes_a_checkpoint_that_loads_exactly(tmp_path):
    config = microsoft_config(num_tasks=1)
    model = random_model(config)
    source = write_fairseq(tmp_path / "checkpoint_best_pcqm4mv2.pt", config, model)
    output = tmp_path / "converted" / "pcqm4mv2.ckpt"
    # In-process (convert.py's main()); its error line from a process of its own is tested below.
    result = call(
        "convert.py",
        [f"source={source}", f"output={output}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert f"wrote {output.resolve()}" in result.stdout
    assert (result.stdout + result.stderr).count("wrote ") == 1
    # The fine-tuning command it prints works as printed (the dataset is the user's to choose)
    # and rebuilds the converted network.
    words = shlex.split(result.stdout.split("fine-tune with: ")[1].splitlines()[0])
    # The training command in the form convert.py was run: the script beside it.
    assert words[:2] == ["python", str(REPO / "scripts" / "train.py")]
    words = words[2:]
    assert words[-1] == "dataset=..."
    assert words[0] == f"pretrained={output.resolve()}" and words[-2] == "optim.lr=2e-4"
    assert trained_model(words[1:-1]) == config
    record = checkpoint.load(output)
    module = GraphormerModule.from_checkpoint(record)
    assert record.task == {
        "name": "pcqm4mv2",
        "task_type": "regression",
        "num_tasks": 1,
        "metric": "mae",  # Microsoft's PCQM4M runs train with l1_loss
    }
    assert same_state(module.model.state_dict(), model.state_dict()) == []
    # Lightning's own loader rebuilds it too, and the outputs are the original model's.
    again = GraphormerModule.load_from_checkpoint(output, map_location="cpu").eval()
    batch = batch_of(molecules([1, 2, 3]))
    with torch.no_grad():
        expected = model(batch)
        torch.testing.assert_close(again(batch), expected, atol=0, rtol=0)
    # The prediction tools read it as well (from SMILES, with no dataset of ours).
    from graphormer import Predictor

    table = Predictor.from_checkpoint(output, device="cpu").predict(list(nci_smiles()[1:4]))
    got = torch.tensor(table["task_0"].to_numpy(), dtype=torch.float32)
    torch.testing.assert_close(got, expected[:, 0], atol=1e-5, rtol=0)


def trained_model(overrides: list[str], num_tasks: int = 1) -> GraphormerConfig:
    """The network train.py builds with ``overrides``, for a dataset of ``num_tasks`` targets."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        model = compose(config_name="train", overrides=overrides).model
    return GraphormerConfig.from_dict({**OmegaConf.to_container(model), "num_tasks": num_tasks})


def converted_config(kind: str) -> GraphormerConfig:
    if kind == "microsoft-base-like":
        return microsoft_config()
    if kind == "pre-LN single-hop":
        return microsoft_config(
            pre_layernorm=True, embedding_layernorm=False, edge_encoding="single_hop"
        )
    if kind == "own vocabulary":
        return GraphormerConfig(num_layers=2, hidden_dim=16, atom_feature_dims=[7, 3], num_tasks=2)
    return GraphormerConfig(**{**model_preset("graphormer_large"), "num_tasks": 128})


@pytest.mark.parametrize(
    "kind", ["microsoft-base-like", "pre-LN single-hop", "own vocabulary", "large preset"]
)
def test_fine_tune_overrides_rebuild_the_converted_network(kind):
    config = converted_config(kind)
    presets = {p.stem: model_preset(p.stem) for p in (CONFIGS / "model").glob("*.yaml")}
    overrides = fine_tune_overrides(config, presets)
    assert overrides[0].startswith("model=")
    assert all(o.startswith("model.") for o in overrides[1:])
    assert trained_model(overrides, num_tasks=config.num_tasks) == config
    if kind == "large preset":
        assert overrides == ["model=graphormer_large"]  # a preset needs nothing more
    if kind == "microsoft-base-like":
        assert overrides[0] == "model=graphormer_base_microsoft"


def test_untrusted_pickles_are_refused_in_one_clear_line(tmp_path):
    config = microsoft_config()
    source = write_fairseq(
        tmp_path / "odd.pt", config, random_model(config), saved=datetime.date(2021, 12, 1)
    )
    with pytest.raises(ConversionError) as caught:
        convert_checkpoint(source, tmp_path / "out.ckpt")
    message = str(caught.value)
    assert "datetime.date" in message and "trust_source=true" in message
    assert "weights_only" not in message and "\n" not in message
    assert not (tmp_path / "out.ckpt").exists()
    path, _ = convert_checkpoint(source, tmp_path / "out.ckpt", trust_source=True)
    assert GraphormerModule.from_checkpoint(path).config == config

    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "convert.py"),
            f"source={source}",
            f"output={tmp_path / 'cli.ckpt'}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error: source=") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_reading_a_source_leaves_the_process_allow_list_as_it_was(tmp_path):
    """Sources are read by graphormer.safe_io's policy: a process-wide allow-list that only grows.
    torch's safe_globals context would un-allow its classes on leaving, even those another reader
    had allowed (here fairseq's argparse.Namespace)."""
    from graphormer import safe_io
    from graphormer.interop import read_source

    safe_io.allow(safe_io.ARGPARSE_NAMESPACE)
    config = microsoft_config()
    source = read_source(write_fairseq(tmp_path / "ms.pt", config, random_model(config)))
    assert source.layout == "microsoft" and source.settings["criterion"] == "l1_loss"
    assert argparse.Namespace in torch.serialization.get_safe_globals()
    torch.save({"args": argparse.Namespace(a=1)}, tmp_path / "args.pt")
    assert safe_io.load_data(tmp_path / "args.pt")["args"].a == 1


def test_interop_sits_beside_the_models_not_on_training():
    code = (
        "import sys, graphormer.interop; "
        "print(sorted(m for m in sys.modules if m.startswith("
        "('graphormer.training', 'graphormer.inference'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
    models = (REPO / "graphormer" / "models").rglob("*.py")
    assert not [p.name for p in models if "graphormer.interop" in p.read_text()]


def test_bad_sources_are_user_facing_errors(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    other = tmp_path / "other.pt"
    torch.save({"x": torch.ones(2)}, other)
    folder = tmp_path / "folder"
    folder.mkdir()
    for source, phrase in [
        (tmp_path / "missing.pt", "does not exist"),
        (junk, "cannot be read as a PyTorch checkpoint"),
        (other, "not a Graphormer state dict"),
        (folder, "without config.json"),
    ]:
        with pytest.raises(UserFacingError, match=phrase):
            convert_checkpoint(source, tmp_path / "out.ckpt")


# -- shortest paths: Floyd-Warshall's choice ------------------------------------------------


def floyd_warshall_paths(edge_index: np.ndarray, n: int) -> dict[tuple[int, int], list[int]]:
    """Node sequences as Microsoft's algos.floyd_warshall + gen_edge_input build them: path[i][j]
    is the last k that strictly shortened i -> j, the path rebuilt recursively through it."""
    dist = np.full((n, n), 510)
    dist[edge_index[0], edge_index[1]] = 1
    np.fill_diagonal(dist, 0)
    via = -np.ones((n, n), dtype=int)
    for k in range(n):
        through = dist[:, k, None] + dist[None, k, :]
        better = through < dist
        via[better] = k
        dist = np.minimum(dist, through)

    def inner(i, j):
        k = via[i, j]
        return [] if k < 0 else inner(i, k) + [k] + inner(k, j)

    return {
        (i, j): [i, *inner(i, j), j]
        for i in range(n)
        for j in range(n)
        if i != j and dist[i, j] < 510
    }


def test_path_choice_is_floyd_warshalls():
    # A 4-ring 0-1-2-3-0 plus a tail 2-4: 0 -> 2 has two shortest paths; Floyd-Warshall goes
    # through the smaller intermediate node, 1, and 3 -> 1 through 0.
    ring = [(0, 1), (1, 2), (2, 3), (3, 0), (2, 4)]
    both = ring + [(b, a) for a, b in ring]
    edge_index = torch.tensor(both).t()
    _, edge_path = shortest_paths(edge_index, 5, max_hops=3)
    ends = edge_index.t().tolist()
    assert [ends[e] for e in edge_path[0, 2, :2].tolist()] == [[0, 1], [1, 2]]
    assert [ends[e] for e in edge_path[3, 1, :2].tolist()] == [[3, 0], [0, 1]]
    # Real molecules with many rings, including one of more than 64 atoms (two mask words).
    graphs = nci_graphs(None)
    chosen = [i for i, s in enumerate(nci_smiles()[:600]) if s.count("1") + s.count("2") >= 6][:25]
    chosen.append(max(range(len(graphs)), key=lambda i: graphs[i]["num_nodes"]))
    for i in chosen:
        g = graphs[i]
        n, ei = g["num_nodes"], g["edge_index"]
        _, path = shortest_paths(torch.from_numpy(ei), n, max_hops=8)
        reference = floyd_warshall_paths(ei, n)
        for (a, b), nodes in reference.items():
            ours = [e for e in path[a, b].tolist() if e >= 0]
            expected = [(nodes[k], nodes[k + 1]) for k in range(min(len(nodes) - 1, 8))]
            assert [tuple(ei[:, e]) for e in ours] == expected, (i, a, b)
    assert graphs[chosen[-1]]["num_nodes"] > 64


# -- fine-tuning from a checkpoint ------------------------------------------------------------


@pytest.fixture
def converted(tmp_path):
    config = microsoft_config(num_tasks=1)
    model = random_model(config)
    path, _ = convert_checkpoint(
        write_fairseq(tmp_path / "ms.pt", config, model), tmp_path / "c.ckpt"
    )
    return path, config, model


def new_module(config: GraphormerConfig, **overrides) -> GraphormerModule:
    model = {**config.to_dict(), **overrides}
    task = {"name": "toy", "task_type": "binary classification", "num_tasks": 4, "metric": "rocauc"}
    return GraphormerModule(model=model, task=task)


def test_fine_tuning_reports_what_it_copied(converted, caplog):
    path, config, model = converted
    module = new_module(config)
    with caplog.at_level(logging.DEBUG, logger="graphormer.training.pretrained"):
        report = load_pretrained(module, str(path))
    # Everything but the output layer; the head's transform and LayerNorm are copied too.
    output_layer = ("head.weight", "head_bias")
    network = {k: v for k, v in model.state_dict().items() if k not in output_layer}
    assert report.fits and report.copied == sorted(f"model.{k}" for k in network)
    assert report.num_parameters == sum(v.numel() for v in network.values())
    assert report.output_layer == ["model.head.weight", "model.head_bias"]
    assert f"copied {len(network)} tensors ({report.num_parameters:,} parameters)" in caplog.text
    for name, tensor in module.model.state_dict().items():
        if name not in output_layer:
            assert torch.equal(tensor, model.state_dict()[name]), name
    assert (
        module.model.head.weight.shape == (4, 32) and float(module.model.head_bias.detach()) == 0.0
    )


def test_the_microsoft_preset_fits_a_converted_base_checkpoint():
    preset = GraphormerConfig(**model_preset("graphormer_base_microsoft"))
    args = {  # graphormer_base_architecture for the published pcqm4m checkpoints
        "encoder_layers": 12,
        "encoder_embed_dim": 768,
        "encoder_ffn_embed_dim": 768,
        "encoder_attention_heads": 32,
        "pre_layernorm": False,
        "encoder_normalize_before": True,
        "num_classes": 1,
    }
    settings, theirs = to_microsoft(preset, Graphormer(preset).state_dict())
    assert all(settings[k] == v for k, v in args.items())
    assert (settings["num_atoms"], settings["num_spatial"], settings["num_in_degree"]) == (
        4609,
        512,
        512,
    )
    back, _ = from_microsoft(theirs, settings)
    assert back == preset


def test_the_pre_ln_molhiv_checkpoint_converts_into_its_preset(tmp_path):
    """The layout of Microsoft's pcqm4mv1_graphormer_base_for_molhiv, which the fixed molhiv
    recipe fine-tunes (PR #96, --pre-layernorm): pre-LN layers, the embedding LayerNorm, and an
    encoder-level final_layer_norm its forward never applies; shrunk to 2 x 32 here."""
    sizes = {"num_layers": 2, "hidden_dim": 32, "ffn_dim": 48, "num_heads": 4}
    preset = model_preset("graphormer_base_microsoft_preln")
    config = GraphormerConfig(**{**preset, **sizes, "num_tasks": 1})
    model = random_model(config)
    source = write_fairseq(tmp_path / "preln.pt", config, model)
    held = torch.load(source, weights_only=False)
    assert ENC + "final_layer_norm.weight" in held["model"]
    assert ENC + "emb_layer_norm.weight" in held["model"]
    assert (held["args"].pre_layernorm, held["args"].encoder_normalize_before) == (True, True)
    path, converted = convert_checkpoint(source, tmp_path / "preln.ckpt")
    assert converted == config
    presets = {p.stem: model_preset(p.stem) for p in (CONFIGS / "model").glob("*.yaml")}
    assert fine_tune_overrides(converted, presets) == [
        "model=graphormer_base_microsoft_preln",
        *(f"model.{k}={v}" for k, v in sizes.items()),
    ]
    # The molhiv recipe builds exactly this network around the converted weights.
    assert (
        trained_model(["experiment=molhiv_finetune", *(f"model.{k}={v}" for k, v in sizes.items())])
        == config
    )
    module = GraphormerModule.from_checkpoint(path)
    batch = batch_of(molecules([0, 5, 17, 33, 120, 250]))
    with torch.no_grad():
        torch.testing.assert_close(module.model(batch), model(batch), atol=1e-5, rtol=0)


def test_a_checkpoint_that_does_not_fit_is_an_error_unless_not_strict(converted, caplog):
    path, config, _ = converted
    # Same names and shapes, different function: pre-LN layers.
    with pytest.raises(
        CheckpointError,
        match=r"settings differ \(checkpoint vs this model\): model.pre_layernorm False vs True",
    ):
        load_pretrained(new_module(config, pre_layernorm=True), str(path))
    module = new_module(config, max_distance=20, unreachable_as_far=False, num_layers=3)
    with pytest.raises(CheckpointError) as caught:
        load_pretrained(module, str(path))
    message = str(caught.value)
    assert "model.attn_bias.spatial.weight [511, 4] vs [23, 4]" in message
    assert "not in the checkpoint: model.layers.2." in message and "\n" not in message
    assert "pretrained_strict=false" in message
    with caplog.at_level(logging.INFO, logger="graphormer.training.pretrained"):
        report = load_pretrained(module, str(path), strict=False)
    assert "WARNING" in caplog.text and "model.attn_bias.spatial.weight" in caplog.text
    assert "model.attn_bias.spatial.weight" not in report.copied
    assert "model.layers.1.fc1.weight" in report.copied
    assert "model.layers.2.fc1.weight" in report.not_in_checkpoint
    with pytest.raises(CheckpointError, match="shares no tensor"):
        load_pretrained(
            new_module(config, hidden_dim=16, ffn_dim=16, num_heads=2), str(path), strict=False
        )
    with pytest.raises(CheckpointError, match="does not exist"):
        load_pretrained(new_module(config), str(path) + ".missing")


# -- Hugging Face: the reference implementation itself ----------------------------------------

REFERENCE = "pip install -e '.[reference]'"


def huggingface():
    """transformers' Graphormer (removed in transformers 5) with its Cython preprocessing."""
    pytest.importorskip(
        "transformers.models.deprecated.graphormer",
        reason=f"needs transformers<5 (Graphormer was removed in 5): {REFERENCE}",
    )
    pytest.importorskip("Cython", reason=f"Hugging Face's collator needs Cython<3: {REFERENCE}")
    import transformers.models.deprecated.graphormer as module

    return module


def hf_random_model(module, **overrides):
    config = module.GraphormerConfig(
        num_hidden_layers=2,
        embedding_dim=32,
        ffn_embedding_dim=48,
        num_attention_heads=4,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        **overrides,
    )
    torch.manual_seed(0)
    model = module.GraphormerForGraphClassification(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # every weight random and O(1), padding rows zero as HF keeps them
        for part in model.modules():
            if isinstance(part, torch.nn.Linear):
                part.weight.copy_(
                    torch.randn(part.weight.shape, generator=g) / part.in_features**0.5
                )
                if part.bias is not None:
                    part.bias.copy_(0.1 * torch.randn(part.bias.shape, generator=g))
            elif isinstance(part, torch.nn.Embedding):
                part.weight.copy_(0.5 * torch.randn(part.weight.shape, generator=g))
                if part.padding_idx is not None:
                    part.weight[part.padding_idx].zero_()
            elif isinstance(part, torch.nn.LayerNorm):
                part.weight.copy_(1 + 0.2 * torch.randn(part.weight.shape, generator=g))
                part.bias.copy_(0.1 * torch.randn(part.bias.shape, generator=g))
        model.classifier.lm_output_learned_bias.fill_(0.3)
    return model


def hf_batches():
    """Real NCI molecules in small batches: connected ones, then disconnected ones (salts), which
    Hugging Face's collator pads to 510 hops."""
    smiles, graphs = nci_smiles()[:700], nci_graphs(700)
    connected = [i for i, s in enumerate(smiles) if "." not in s][:150]
    salts = [i for i, s in enumerate(smiles) if "." in s and graphs[i]["num_nodes"] < 30][:6]
    batches = [connected[i : i + 15] for i in range(0, len(connected), 15)]
    batches += [salts[i : i + 2] for i in range(0, len(salts), 2)]
    assert len(salts) == 6
    return graphs, batches


def hf_inputs(graphs, indices, spatial_pos_max):
    """Hugging Face's own preprocessing (preprocess_item, Floyd-Warshall in Cython) and collator."""
    from transformers.models.deprecated.graphormer import collating_graphormer as collating

    items = []
    for i in indices:
        g = graphs[i]
        # Hugging Face reads `edge_attr` (OGB calls it edge_feat) and silently uses ones otherwise.
        item = {
            "edge_index": g["edge_index"],
            "edge_attr": g["edge_feat"],
            "node_feat": g["node_feat"],
            "num_nodes": g["num_nodes"],
            "y": [0.0],
        }
        items.append(collating.preprocess_item(item))
    batch = collating.GraphormerDataCollator(spatial_pos_max=spatial_pos_max)(items)
    batch.pop("labels")
    return batch


@pytest.mark.parametrize(
    "overrides",
    [
        {"pre_layernorm": False, "encoder_normalize_before": True, "num_classes": 3},
        {"pre_layernorm": True, "num_classes": 2},
        {"edge_type": "single_hop", "encoder_normalize_before": True, "num_classes": 1},
        {"encoder_normalize_before": True, "spatial_pos_max": 8, "num_classes": 4},
    ],
    ids=["post-LN+embedding-LN", "pre-LN", "single-hop", "spatial_pos_max"],
)
def test_huggingface_parity(tmp_path, overrides):
    module = huggingface()
    reference = hf_random_model(module, **overrides)
    reference.save_pretrained(tmp_path / "hf")
    path, config = convert_checkpoint(tmp_path / "hf", tmp_path / "ours.ckpt")
    ours = GraphormerModule.from_checkpoint(path).model
    wrong_path, _ = convert_checkpoint(tmp_path / "hf", tmp_path / "w.ckpt", convention="microsoft")
    shifted = GraphormerModule.from_checkpoint(
        wrong_path
    ).model  # atom ids one row off: must not pass
    graphs, batches = hf_batches()
    worst, worst_shifted = 0.0, 0.0
    for indices in batches:
        inputs = hf_inputs(graphs, indices, reference.config.spatial_pos_max)
        with torch.no_grad():
            expected = reference(**inputs).logits
        batch = batch_of([to_data(graphs[i]) for i in indices])
        with torch.no_grad():
            worst = max(worst, float((ours(batch) - expected).abs().max()))
            worst_shifted = max(worst_shifted, float((shifted(batch) - expected).abs().max()))
    assert worst < 1e-5, worst
    assert worst_shifted > 1e-2
    if "spatial_pos_max" in overrides:
        assert config.attention_max_distance == 6  # Hugging Face masks distance + 1 >= 8


def test_huggingface_bare_model_parity(tmp_path):
    module = huggingface()
    classifier = hf_random_model(module, encoder_normalize_before=True)
    bare = classifier.encoder  # a GraphormerModel: ends at the head's LayerNorm, no output layer
    bare.save_pretrained(tmp_path / "bare")
    path, config = convert_checkpoint(tmp_path / "bare", tmp_path / "ours.ckpt", num_tasks=2)
    ours = GraphormerModule.from_checkpoint(path).model
    assert config.num_tasks == 2
    graphs, batches = hf_batches()
    for indices in batches[:3] + batches[-1:]:
        inputs = hf_inputs(graphs, indices, 1024)
        with torch.no_grad():
            expected = bare(**inputs).last_hidden_state[:, 0]
            h, _ = ours.encode(batch_of([to_data(graphs[i]) for i in indices]))
            got = ours.head_norm(torch.nn.functional.gelu(ours.head_transform(h[:, 0])))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)

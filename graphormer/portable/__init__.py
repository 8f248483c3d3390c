"""The torch-free half of prediction: SMILES to OGB graphs (RDKit), Graphormer's structural
encodings and the dense batch in numpy, molecule features computed from SMILES (RDKit
descriptors, Morgan counts), and a model exported to ONNX run by ONNX Runtime
(:class:`~graphormer.portable.onnx_predictor.OnnxPredictor`). Nothing here imports torch, so
that a deployment needs ``onnxruntime`` and ``rdkit`` alone (``pip install graphormer[onnx]``
still installs the package's dependencies; the point is what a server process loads)."""

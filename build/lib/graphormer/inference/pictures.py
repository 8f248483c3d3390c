"""Pictures of attention a chemist can read: molecules drawn by RDKit with atoms shaded by
attention, and per-head heatmaps with atom labels (PNG, drawn with RDKit's Cairo canvas and
Pillow; no plotting library needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from rdkit import Chem
from rdkit.Chem.Draw import rdMolDraw2D

__all__ = ["colormap", "draw_heads", "draw_molecule", "draw_molecules", "value_range"]

# A white-to-dark-red scale: zero attention leaves an atom (or a heatmap cell) unshaded.
_STOPS = np.array(
    [
        [1.00, 1.00, 1.00],
        [1.00, 0.92, 0.62],
        [0.99, 0.62, 0.24],
        [0.86, 0.20, 0.12],
        [0.45, 0.00, 0.06],
    ]
)
_BACKGROUND = (255, 255, 255)
_INK = (40, 40, 40)


def colormap(values: np.ndarray) -> np.ndarray:
    """``[..., 3]`` RGB in [0, 1] for values in [0, 1] (clipped)."""
    v = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0) * (len(_STOPS) - 1)
    low = np.minimum(np.floor(v).astype(int), len(_STOPS) - 2)
    frac = (v - low)[..., None]
    return _STOPS[low] * (1.0 - frac) + _STOPS[low + 1] * frac


def _highlights(values: np.ndarray) -> tuple[dict, dict]:
    # Stretched from the least- to the most-attended atom, whose difference is what a reader
    # looks for (the range goes in the legend); kept off the darkest colours so that the element
    # symbols and atom numbers drawn over the shading stay legible.
    low, high = float(values.min()), float(values.max())
    scaled = (values - low) / (high - low) if high > low else np.zeros_like(values)
    rgb = colormap(0.06 + 0.7 * scaled)
    colors = {i: tuple(float(c) for c in rgb[i]) for i in range(len(values))}
    radii = {i: 0.42 for i in range(len(values))}
    return colors, radii


def value_range(values: np.ndarray) -> str:
    """``"0.031-0.118"``: the span a shaded drawing stretches over, for its legend."""
    return f"{float(np.min(values)):.3f}-{float(np.max(values)):.3f}"


def draw_molecule(smiles: str, values: np.ndarray, size: int = 600, legend: str = "") -> bytes:
    """PNG of the molecule with atom ``i`` shaded by ``values[i]`` (lightest = the smallest
    value, darkest = the largest) and numbered with its rdkit index."""
    mol = _molecule(smiles, values)
    colors, radii = _highlights(np.asarray(values, dtype=np.float64))
    canvas = rdMolDraw2D.MolDraw2DCairo(size, size)
    options = canvas.drawOptions()
    options.addAtomIndices = True
    options.legendFontSize = max(14, size // 36)
    rdMolDraw2D.PrepareAndDrawMolecule(
        canvas,
        mol,
        legend=legend,
        highlightAtoms=list(colors),
        highlightAtomColors=colors,
        highlightAtomRadii=radii,
        highlightBonds=[],
    )
    canvas.FinishDrawing()
    return canvas.GetDrawingText()


def draw_molecules(
    smiles: str,
    values: Sequence[np.ndarray],
    legends: Sequence[str],
    panel: int = 300,
    columns: int = 4,
) -> bytes:
    """PNG grid: the molecule once per entry of ``values``, each shaded on its own range."""
    count = len(values)
    columns = max(1, min(columns, count))
    rows = math.ceil(count / columns)
    mols = [_molecule(smiles, v) for v in values]
    canvas = rdMolDraw2D.MolDraw2DCairo(columns * panel, rows * panel, panel, panel)
    options = canvas.drawOptions()
    options.addAtomIndices = True
    options.legendFontSize = max(12, panel // 22)
    colors, radii = zip(
        *(_highlights(np.asarray(v, dtype=np.float64)) for v in values),
        strict=True,
    )
    canvas.DrawMolecules(
        mols,
        highlightAtoms=[list(c) for c in colors],
        highlightBonds=[[] for _ in mols],
        highlightAtomColors=list(colors),
        highlightAtomRadii=list(radii),
        legends=list(legends),
    )
    canvas.FinishDrawing()
    return canvas.GetDrawingText()


def draw_heads(
    weights: np.ndarray, labels: Sequence[str], title: str = "", columns: int = 4
) -> Image.Image:
    """Heatmaps of ``weights`` ``[H, n, n]`` (one panel per head; row = query, column = key),
    on one colour scale from 0 to the largest weight, with labelled rows and columns."""
    heads, n, _ = weights.shape
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} rows")
    columns = max(1, min(columns, heads))
    rows = math.ceil(heads / columns)
    cell = int(np.clip(360 // n, 4, 28))
    font_size = int(np.clip(cell - 2, 8, 13))
    font = _font(font_size)
    # Label every k-th row/column when cells are too small for every label.
    step = max(1, math.ceil((font_size + 2) / cell))
    margin = int(max(font.getlength(label) for label in labels)) + 6
    heading = font_size + 8
    panel_w, panel_h = margin + n * cell + 12, heading + margin + n * cell + 12
    bar_w, title_h = 70, (2 * font_size + 12) if title else 0
    image = Image.new("RGB", (columns * panel_w + bar_w, rows * panel_h + title_h), _BACKGROUND)
    draw = ImageDraw.Draw(image)
    if title:
        draw.text((8, 6), title, fill=_INK, font=_font(font_size + 2))
    vmax = float(weights.max()) or 1.0
    for h in range(heads):
        x0 = (h % columns) * panel_w
        y0 = title_h + (h // columns) * panel_h
        draw.text((x0 + margin, y0 + 2), f"head {h}", fill=_INK, font=font)
        grid_x, grid_y = x0 + margin, y0 + heading + margin
        rgb = (colormap(weights[h] / vmax) * 255).round().astype(np.uint8)  # [n, n, 3]
        cells = Image.fromarray(rgb).resize((n * cell, n * cell), Image.NEAREST)
        image.paste(cells, (grid_x, grid_y))
        draw.rectangle((grid_x - 1, grid_y - 1, grid_x + n * cell, grid_y + n * cell), outline=_INK)
        for i in range(0, n, step):
            label = labels[i]
            width = font.getlength(label)
            centre = i * cell + cell / 2
            # Row labels on the left, right-aligned; column labels above, rotated.
            draw.text(
                (grid_x - 4 - width, grid_y + centre - font_size / 2), label, fill=_INK, font=font
            )
            image.paste(
                _rotated_text(label, font, font_size),
                (int(grid_x + centre - font_size / 2), int(grid_y - 4 - width)),
            )
    _colour_bar(draw, image.width - bar_w + 10, title_h + heading + margin, vmax, font)
    return image


def _colour_bar(draw: ImageDraw.ImageDraw, x: int, y: int, vmax: float, font) -> None:
    height, width = 160, 14
    for k in range(height):
        rgb = tuple(int(round(c * 255)) for c in colormap(1.0 - k / (height - 1)))
        draw.line((x, y + k, x + width, y + k), fill=rgb)
    draw.rectangle((x, y, x + width, y + height), outline=_INK)
    draw.text((x + width + 4, y - 6), f"{vmax:.2f}", fill=_INK, font=font)
    draw.text((x + width + 4, y + height - 8), "0", fill=_INK, font=font)


def _rotated_text(text: str, font, size: int) -> Image.Image:
    width = int(font.getlength(text)) + 2
    strip = Image.new("RGB", (width, size + 4), _BACKGROUND)
    ImageDraw.Draw(strip).text((0, 0), text, fill=_INK, font=font)
    return strip.rotate(90, expand=True)


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has one bitmap size only
        return ImageFont.load_default()


def _molecule(smiles: str, values: np.ndarray) -> Chem.Mol:
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"rdkit cannot parse SMILES {smiles!r}")
    if mol.GetNumAtoms() != len(values):
        raise ValueError(f"{len(values)} values for the {mol.GetNumAtoms()} atoms of {smiles}")
    return mol

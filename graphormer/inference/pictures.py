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

from graphormer.errors import ConfigError

__all__ = [
    "PICTURE_SIZES",
    "atom_value_colours",
    "attention_legend",
    "check_picture_size",
    "colormap",
    "draw_atom_values",
    "draw_bond_values",
    "draw_heads",
    "draw_molecule",
    "draw_molecules",
    "relative_to_uniform",
    "shade",
    "value_range",
]

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
# The side of a molecule picture in pixels: RDKit's canvas fails at 0 and near 40,000, and a
# layers.png of 12 panels at 4,000 px is already 8,000 x 6,000.
PICTURE_SIZES = range(100, 4001)
# Attention is shaded by how far it exceeds a uniform split (issue 20: a map whose atoms all lie
# within 0.0710-0.0726 of a uniform 0.0714 was stretched from white to dark red, so one hydroxyl
# looked strongly highlighted). Uniform or less is unshaded; SATURATE x uniform or more is the
# darkest shade; in between the scale is logarithmic (2x uniform sits well inside it).
SATURATE = 4.0
# A map whose every value lies within this fraction of uniform is "nearly flat": nothing stands
# out, and its legend says so.
FLAT_WITHIN = 0.10


def colormap(values: np.ndarray) -> np.ndarray:
    """``[..., 3]`` RGB in [0, 1] for values in [0, 1] (clipped)."""
    v = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0) * (len(_STOPS) - 1)
    low = np.minimum(np.floor(v).astype(int), len(_STOPS) - 2)
    frac = (v - low)[..., None]
    return _STOPS[low] * (1.0 - frac) + _STOPS[low + 1] * frac


def relative_to_uniform(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """``values`` divided by their mean along ``axis``: 1 is a uniform split of what they share
    (an atom's fair share of the graph token's attention to atoms, a key's of a query row)."""
    values = np.asarray(values, dtype=np.float64)
    mean = values.mean(axis=axis, keepdims=True)
    return np.divide(values, mean, out=np.ones_like(values), where=mean > 0)


def shade(relative: np.ndarray) -> np.ndarray:
    """Shade in [0, 1] of values relative to uniform: 0 at uniform or below, 1 at
    :data:`SATURATE` x uniform or above, logarithmic in between."""
    relative = np.maximum(np.asarray(relative, dtype=np.float64), 1e-12)
    return np.clip(np.log(relative) / np.log(SATURATE), 0.0, 1.0)


def attention_legend(values: np.ndarray) -> str:
    """``"0.62-2.41x uniform"``, and ``"nearly flat"`` when every value lies within
    :data:`FLAT_WITHIN` of uniform (the drawing is then unshaded: nothing stands out)."""
    relative = relative_to_uniform(values)
    low, high = float(relative.min()), float(relative.max())
    text = f"{low:.2f}-{high:.2f}x uniform"
    if low >= 1 - FLAT_WITHIN and high <= 1 + FLAT_WITHIN:
        text += ", nearly flat"
    return text


def _highlights(values: np.ndarray) -> tuple[dict, dict]:
    # Shaded by the share relative to uniform (see SATURATE), never stretched over the range;
    # kept off the darkest colours so that the element symbols and atom numbers drawn over the
    # shading stay legible.
    rgb = colormap(0.04 + 0.72 * shade(relative_to_uniform(values)))
    colors = {i: tuple(float(c) for c in rgb[i]) for i in range(len(values))}
    radii = {i: 0.42 for i in range(len(values))}
    return colors, radii


def value_range(values: np.ndarray) -> str:
    """``"0.031-0.118"``: the span a shaded drawing stretches over, for its legend."""
    return f"{float(np.min(values)):.3f}-{float(np.max(values)):.3f}"


def check_picture_size(size: object, key: str = "size") -> int:
    """``size`` as a picture side in :data:`PICTURE_SIZES`, or an error naming ``key``."""
    low, high = PICTURE_SIZES[0], PICTURE_SIZES[-1]
    if isinstance(size, bool) or not isinstance(size, int) or size not in PICTURE_SIZES:
        raise ConfigError(
            f"{key}={size!r} is not a picture size: give the side in pixels, an integer from "
            f"{low} to {high} (default 600)"
        )
    return size


def draw_molecule(
    smiles: str | Chem.Mol, values: np.ndarray, size: int = 600, legend: str = ""
) -> bytes:
    """PNG of the molecule with atom ``i`` shaded by ``values[i]`` relative to a uniform split
    (unshaded at uniform or below, darkest at :data:`SATURATE` x uniform) and numbered with its
    rdkit index."""
    mol = _molecule(smiles, values)
    colors, radii = _highlights(np.asarray(values, dtype=np.float64))
    return _draw(mol, legend, colors, radii, size)


def draw_molecules(
    smiles: str | Chem.Mol,
    values: Sequence[np.ndarray],
    legends: Sequence[str],
    panel: int = 300,
    columns: int = 4,
) -> bytes:
    """PNG grid: the molecule once per entry of ``values``, each shaded relative to uniform."""
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
    each cell shaded by its weight relative to a uniform row (``1 / n``; white at or below it,
    darkest at :data:`SATURATE` x), one scale for every head, with labelled rows and columns."""
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
    relative = relative_to_uniform(weights, axis=-1)  # [H, n, n]
    for h in range(heads):
        x0 = (h % columns) * panel_w
        y0 = title_h + (h // columns) * panel_h
        draw.text((x0 + margin, y0 + 2), f"head {h}", fill=_INK, font=font)
        grid_x, grid_y = x0 + margin, y0 + heading + margin
        rgb = (colormap(shade(relative[h])) * 255).round().astype(np.uint8)  # [n, n, 3]
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
    _colour_bar(draw, image.width - bar_w + 10, title_h + heading + margin, font)
    return image


def _colour_bar(draw: ImageDraw.ImageDraw, x: int, y: int, font) -> None:
    """The scale, in multiples of a uniform row: 1x (white) to SATURATE x (darkest)."""
    height, width = 160, 14
    for k in range(height):
        rgb = tuple(int(round(c * 255)) for c in colormap(1.0 - k / (height - 1)))
        draw.line((x, y + k, x + width, y + k), fill=rgb)
    draw.rectangle((x, y, x + width, y + height), outline=_INK)
    draw.text((x + width + 4, y - 6), f"{SATURATE:g}x", fill=_INK, font=font)
    draw.text((x + width + 4, y + height / 2 - 6), f"{SATURATE**0.5:g}x", fill=_INK, font=font)
    draw.text((x + width + 4, y + height - 8), "1x", fill=_INK, font=font)
    draw.text((x - 6, y + height + 6), "of uniform", fill=_INK, font=font)


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


# Diverging blue-white-red for signed atom values (issue #18): white is zero.
_NEGATIVE = np.array([0.13, 0.40, 0.80])
_POSITIVE = np.array([0.80, 0.15, 0.15])


def atom_value_colours(values: np.ndarray) -> tuple[np.ndarray, float, bool]:
    """``[n, 3]`` RGB of predicted atom values, the half-range of the scale and whether it is
    signed: a diverging blue-white-red map centred on zero (symmetric, so that zero is white)
    when the values have both signs, white to red otherwise."""
    values = np.asarray(values, dtype=np.float64)
    signed = bool((values < 0).any() and (values > 0).any())
    if signed:
        scale = float(np.abs(values).max()) or 1.0
        t = np.clip(values / scale, -1.0, 1.0)[:, None]
        white = np.ones(3)
        rgb = np.where(t < 0, white + (-t) * (_NEGATIVE - white), white + t * (_POSITIVE - white))
        return rgb, scale, True
    low, high = float(values.min()), float(values.max())
    span = (high - low) or 1.0
    return colormap(0.72 * (values - low) / span), span, False


def draw_atom_values(
    smiles: str | Chem.Mol, values: np.ndarray, name: str, size: int = 600
) -> bytes:
    """PNG of the molecule with atom ``i`` coloured by its predicted value ``values[i]`` of the
    atom target ``name`` (:func:`atom_value_colours`), each atom numbered with its rdkit index,
    and a legend naming the target and what the colours mean, in the target's units."""
    mol = _molecule(smiles, values)
    rgb, scale, signed = atom_value_colours(values)
    colors = {i: tuple(float(c) for c in rgb[i]) for i in range(len(values))}
    if signed:
        legend = f"{name}: blue {-scale:+.3g} - white 0 - red {scale:+.3g}"
    else:
        legend = f"{name}: white {float(np.min(values)):.3g} - red {float(np.max(values)):.3g}"
    return _draw(mol, legend, colors, {i: 0.42 for i in colors}, size)


def draw_bond_values(
    smiles: str | Chem.Mol, values: np.ndarray, name: str, size: int = 600
) -> bytes:
    """PNG of the molecule with bond ``k`` (RDKit's bond order) drawn in the colour of its
    predicted value ``values[k]`` of the bond target ``name``, on the atoms' scale
    (:func:`atom_value_colours`), atoms numbered, and a legend naming the target and the
    colours' values."""
    mol = Chem.Mol(smiles) if isinstance(smiles, Chem.Mol) else Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"rdkit cannot parse SMILES {smiles!r}")
    if mol.GetNumBonds() != len(values):
        raise ValueError(f"{len(values)} values for the {mol.GetNumBonds()} bonds of {smiles}")
    values = np.asarray(values, dtype=np.float64)
    colors = {}
    legend = f"{name}: no bonds"
    if len(values):
        rgb, scale, signed = atom_value_colours(values)
        colors = {k: tuple(float(c) for c in rgb[k]) for k in range(len(values))}
        if signed:
            legend = f"{name} per bond: blue {-scale:+.3g} - white 0 - red {scale:+.3g}"
        else:
            low, high = float(values.min()), float(values.max())
            legend = f"{name} per bond: white {low:.3g} - red {high:.3g}"
    return _draw(mol, legend, {}, {}, size, bond_colors=colors)


def _molecule(smiles: str | Chem.Mol, values: np.ndarray) -> Chem.Mol:
    """The molecule a SMILES (or an RDKit molecule, a structure's depiction) draws, checked
    against one value per atom."""
    mol = Chem.Mol(smiles) if isinstance(smiles, Chem.Mol) else Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"rdkit cannot parse SMILES {smiles!r}")
    if mol.GetNumAtoms() != len(values):
        raise ValueError(f"{len(values)} values for the {mol.GetNumAtoms()} atoms of {smiles}")
    return mol


def _draw(
    mol: Chem.Mol,
    legend: str,
    colors: dict,
    radii: dict,
    size: int,
    bond_colors: dict | None = None,
) -> bytes:
    """PNG of ``mol``, its atoms numbered with their rdkit index and highlighted in ``colors``
    (atom -> RGB) with ``radii``, its bonds in ``bond_colors`` (bond index -> RGB), and
    ``legend`` below."""
    bond_colors = bond_colors or {}
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
        highlightBonds=list(bond_colors),
        highlightBondColors=bond_colors,
    )
    canvas.FinishDrawing()
    return canvas.GetDrawingText()

"""Synthetic product pictures for the multimodal demo (``make demo-multimodal``), drawn with Pillow.

Each picture is one product: a filled shape (circle, square or triangle) in one of four colours, at a
random size and place on a light background with a little pixel noise. Its attributes are the
shape and the colour, so its true description is ``"a blue circle"``. Everything is drawn from one
seed, so the same seed gives the same pixels byte for byte.

The demo's data, all from :func:`make_splits` (each split its own pictures, never shared):

* ``reward_clip``: pictures the CLIP that gives GRPO its reward is trained on;
* ``scorer_clip``: pictures the second, held-out CLIP (the judge of the metric) is trained on;
* ``policy``: pictures behind the SFT rows and the GRPO prompts;
* ``heldout``: pictures the metric is computed on; nothing is ever trained on them.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

SHAPES = ("circle", "square", "triangle")
#: colour name -> RGB; the pictures jitter each channel a little around it.
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 30)}
SIDE = 32
#: pictures per split (the demo's default sizes).
SPLITS = {"reward_clip": 360, "scorer_clip": 360, "policy": 480, "heldout": 240}


@dataclass(frozen=True)
class Product:
    """One picture's attributes and where it is drawn."""

    shape: str
    colour: str
    centre: tuple[int, int]
    radius: int
    tint: tuple[int, int, int]  # the RGB actually painted (COLOURS[colour] plus jitter)
    noise_seed: int

    @property
    def description(self) -> str:
        return f"a {self.colour} {self.shape}"


def random_product(rng: random.Random, shape: str | None = None, colour: str | None = None) -> Product:
    """A product of the given (or a random) shape and colour, at a random place, size and tint."""
    shape = shape or rng.choice(SHAPES)
    colour = colour or rng.choice(sorted(COLOURS))
    radius = rng.randint(7, 12)
    centre = (rng.randint(radius, SIDE - 1 - radius), rng.randint(radius, SIDE - 1 - radius))
    tint = tuple(max(0, min(255, c + rng.randint(-20, 20))) for c in COLOURS[colour])
    return Product(shape, colour, centre, radius, tint, rng.randrange(2**31))


def draw(product: Product):
    """The product as a ``SIDE`` x ``SIDE`` RGB ``PIL.Image``."""
    from PIL import Image, ImageDraw

    noise = random.Random(product.noise_seed)
    image = Image.new("RGB", (SIDE, SIDE), (235, 235, 230))
    pen = ImageDraw.Draw(image)
    (x, y), r = product.centre, product.radius
    if product.shape == "circle":
        pen.ellipse((x - r, y - r, x + r, y + r), fill=product.tint)
    elif product.shape == "square":
        side = round(r * 0.85)  # about the circle's area
        pen.rectangle((x - side, y - side, x + side, y + side), fill=product.tint)
    else:
        pen.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=product.tint)
    pixels = image.load()
    for _ in range(SIDE * SIDE // 8):  # light speckle, so no two pictures are alike
        px, py, d = noise.randrange(SIDE), noise.randrange(SIDE), noise.randint(-25, 25)
        pixels[px, py] = tuple(max(0, min(255, c + d)) for c in pixels[px, py])
    return image


def make_products(count: int, seed: int, salt: str) -> list[Product]:
    """``count`` products spread evenly over the shape x colour grid (then shuffled), from ``seed``."""
    rng = random.Random(f"{seed}:{salt}")
    grid = [(s, c) for s in SHAPES for c in sorted(COLOURS)]
    products = [random_product(rng, *grid[i % len(grid)]) for i in range(count)]
    rng.shuffle(products)
    return products


def write_split(folder: str, products: list[Product]) -> list[dict]:
    """Draw ``products`` into ``folder`` as PNG files; returns one record per picture (path and
    attributes), also written to ``folder/products.jsonl``."""
    os.makedirs(folder, exist_ok=True)
    records = []
    for i, product in enumerate(products):
        path = os.path.join(os.path.abspath(folder), f"{i:04d}.png")
        draw(product).save(path)
        records.append({"image": path, "shape": product.shape, "colour": product.colour, "text": product.description})
    with open(os.path.join(folder, "products.jsonl"), "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    return records


def make_splits(root: str, seed: int, sizes: dict[str, int] | None = None) -> dict[str, list[dict]]:
    """Every split of :data:`SPLITS` (or ``sizes``) drawn under ``root/<split>/``, each from its own stream."""
    sizes = sizes or SPLITS
    return {name: write_split(os.path.join(root, name), make_products(n, seed, name)) for name, n in sizes.items()}

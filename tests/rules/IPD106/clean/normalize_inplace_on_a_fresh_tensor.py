"""`Normalize(..., inplace=True)` on the tensor `ToTensor()` has just made: no one else holds it."""
import numpy as np
import torch
from PIL import Image
from torchvision import transforms

rng = np.random.default_rng(0)
image = Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8))
to_tensor = transforms.ToTensor()
normalize = transforms.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25], inplace=True)
x = normalize(to_tensor(image))
assert float(x.min()) >= -2.0

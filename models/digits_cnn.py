"""Small CNN trained on scikit-learn's handwritten digits (8x8, 10 classes): conv 1->8 3x3 ->
ReLU -> conv 8->16 3x3 stride 2 -> ReLU -> flatten -> Linear 256->10.

A trained model on a real data set, with no download: the digits ship inside scikit-learn's
wheel. It trains on the `train` split of deploykit's built-in `digits` data set
(program/datasets.py: stratified, 25% test, seed 0, pixels scaled to [0, 1]), on the CPU in a
few seconds, deterministically: a fixed seed, one thread and torch's deterministic algorithms,
so the same code and torch version give the same weights, byte for byte. The weights are
cached after the first training in the user cache ($XDG_CACHE_HOME, else ~/.cache:
deploykit/models/digits_cnn-<key>.pt), keyed by this file, the training data and the torch
version; a trained checkpoint (a state_dict of this module) is taken instead from `CHECKPOINT`
below or the environment variable DEPLOYKIT_DIGITS_CNN_CHECKPOINT.

The example input is one real image of the test split; calibration uses 96 images of the
training split (`deploykit validate` scores the test split: docs/validation.md).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import torch
from torch import nn

from deploykit.program.datasets import digits_arrays
from deploykit.util.fsutil import write_atomic

CLASSES = 10
CHECKPOINT = os.environ.get("DEPLOYKIT_DIGITS_CNN_CHECKPOINT", "")

# Training: Adam on mini-batches, the batches' order from a seeded generator. Measured on the
# test split: 97.1% top-1 after about 3 s on one core.
SEED = 0
EPOCHS = 30
BATCH = 32
LEARNING_RATE = 3e-3
CALIBRATION_SAMPLES = 96
EXAMPLE_TEST_INDEX = 0  # the example input: the first image of the test split

# Device vs host reference. fp32: the same portable kernels as the host pybindings, margin for
# float reassociation over logits of up to about 50. int8: the cortex_m ops' integer reference
# is what CMSIS-NN computes; the output step is about 0.27, so 0.6 is about 2 steps.
TOLERANCE = {
    "portable_fp32": {"atol": 1e-4},
    "cortex_m_int8": {"atol": 0.6},
}


class DigitsCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, stride=2, padding=1)
        self.relu2 = nn.ReLU()
        # The linear layer over the whole 16x4x4 map, as a 4x4 convolution: a Linear after a
        # flatten would need the map in NCHW order, an NHWC->NCHW copy on the device (a
        # portable kernel in the int8 program); the 1x1 result flattens with nothing to reorder.
        self.fc = nn.Conv2d(16, CLASSES, kernel_size=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu2(self.conv2(self.relu1(self.conv1(x))))
        return torch.flatten(self.fc(x), 1)


def train(seed: int = SEED) -> DigitsCnn:
    """Train on the train split: the same seed, code and torch version give the same weights.
    torch's global settings (threads, deterministic algorithms) are restored afterwards."""
    images, labels, _ = digits_arrays("train")
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    # One thread: a parallel reduction may add in another order from run to run.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        net = DigitsCnn()
        optimizer = torch.optim.Adam(net.parameters(), lr=LEARNING_RATE)
        order = torch.Generator().manual_seed(seed)
        net.train()
        for _epoch in range(EPOCHS):
            permutation = torch.randperm(len(x), generator=order)
            for start in range(0, len(x), BATCH):
                batch = permutation[start:start + BATCH]
                optimizer.zero_grad()
                nn.functional.cross_entropy(net(x[batch]), y[batch]).backward()
                optimizer.step()
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)
    return net.eval()


def weights_key() -> str:
    """What the trained weights depend on: this file (the network, the training and its
    hyper-parameters), the training data (split and scaling included) and torch's version."""
    images, labels, _ = digits_arrays("train")
    h = hashlib.sha256()
    for part in (Path(__file__).read_bytes(), images.tobytes(), labels.tobytes(),
                 torch.__version__.encode()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "deploykit" / "models" / f"digits_cnn-{weights_key()}.pt"


def model() -> torch.nn.Module:
    net = DigitsCnn()
    if CHECKPOINT:
        net.load_state_dict(torch.load(CHECKPOINT, map_location="cpu", weights_only=True))
        return net.eval()
    cached = cache_path()
    if cached.is_file():
        net.load_state_dict(torch.load(cached, map_location="cpu", weights_only=True))
        return net.eval()
    trained = train()
    buffer = io.BytesIO()
    torch.save(trained.state_dict(), buffer)
    write_atomic(cached, buffer.getvalue())  # two processes training at once: both whole
    return trained


def example_inputs() -> tuple[torch.Tensor, ...]:
    images, _, _ = digits_arrays("test")
    return (torch.from_numpy(images[EXAMPLE_TEST_INDEX:EXAMPLE_TEST_INDEX + 1].copy()),)


def calibration_inputs() -> list[tuple[torch.Tensor, ...]]:
    """The first images of the training split (stratified, so every digit is among them)."""
    images, _, _ = digits_arrays("train")
    return [(torch.from_numpy(images[i:i + 1].copy()),) for i in range(CALIBRATION_SAMPLES)]

"""inplace-doctor in your own test suite: the `inplace_audit` fixture and marker on a torchvision model.

    pytest examples/pytest

Both fail the test with inplace-doctor's text report (both culprits, file:line,
the fix) when an in-place hazard of severity warning or above is found.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

torchvision = pytest.importorskip("torchvision")


@pytest.fixture
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None, num_classes=10)  # ReLU(inplace=True) throughout


def test_forward_and_backward_are_inplace_safe(inplace_audit, model: torch.nn.Module) -> None:
    """The fixture: one audited forward + backward (`ipd.audit`); returns the Report when it passes."""
    report = inplace_audit(model, torch.randn(2, 3, 32, 32))
    assert report.backward


@pytest.mark.inplace_audit(fail_on="warning")
def test_training_steps_are_inplace_safe(model: torch.nn.Module) -> None:
    """The marker: everything the test body runs is watched (`ipd.watch`), optimizer steps included."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    for _ in range(2):
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

"""Reliability of the layer's numbers and state: finite inputs whose logits overflow, trees and
learner states read back from disk, and optimiser fusion that would silently ignore a user's
gradient edits. Layer checks run on the compiled CPU path (``use_kernels=True``) and the PyTorch
path (``use_kernels=False``, what runs on a GPU)."""
import numpy as np
import pytest
import torch

from hsm.layers import FlatSoftmax, HierarchicalSoftmax, NonFiniteInputError
from hsm.training import train_epoch
from hsm.tree import Tree

PATHS = pytest.mark.parametrize("kernels", [True, False], ids=["compiled", "torch"])


def _calls():
    return {
        "forward": lambda layer, h: layer(h, torch.zeros(h.shape[0], dtype=torch.long)),
        "log_prob": lambda layer, h: layer.log_prob(h),
        "predict": lambda layer, h: layer.predict(h),
        "topk": lambda layer, h: layer.topk(h, 2),
        "topk_beam": lambda layer, h: layer.topk(h, 2, method="beam"),
    }


# ---------------------------------------------------------------------------------------------
# finite inputs whose logits overflow: the named non-finite error, never NaN or a disagreement

def _huge_rows(layer: torch.nn.Module, rows=(1, 3), batch: int = 4) -> torch.Tensor:
    """Finite inputs; the rows ``rows`` are large enough that W h + b overflows float32."""
    torch.manual_seed(1)
    h = torch.randn(batch, 5)
    for row in rows:
        h[row] = torch.sign(torch.randn(5)) * 1e37
    with torch.no_grad():
        for p in layer.parameters():
            p.mul_(1000)
    return h


@PATHS
@pytest.mark.parametrize("call", list(_calls()))
def test_overflowing_logits_raise_the_non_finite_error_naming_the_rows(kernels, call):
    layer = HierarchicalSoftmax(5, Tree.random(20, 3, 3, seed=0))
    layer.use_kernels = kernels
    h = _huge_rows(layer)
    assert torch.isfinite(h).all()
    with pytest.raises(NonFiniteInputError, match=r"logits overflow float32 in 2 of 4 rows \(rows \[1, 3\]\).*scale"):
        _calls()[call](layer, h)


@pytest.mark.parametrize("call", ["forward", "log_prob", "predict", "topk"])
def test_overflowing_logits_flat_softmax(call):
    layer = FlatSoftmax(5, 20)
    h = _huge_rows(layer, rows=(2,))
    with pytest.raises(NonFiniteInputError, match=r"rows \[2\]"):
        _calls()[call](layer, h)


@PATHS
def test_predict_agrees_with_topk_on_large_finite_inputs(kernels):
    """Inputs as large as float32 allows without overflowing the logits: both searches agree with
    the arg max of log_prob, and float64 computes rows that overflow float32."""
    torch.manual_seed(0)
    layer = HierarchicalSoftmax(5, Tree.random(20, 3, 3, seed=0))
    layer.use_kernels = kernels
    h = torch.randn(16, 5) * 1e30
    log_prob = layer.log_prob(h)
    assert torch.isfinite(log_prob).all()
    assert torch.equal(layer.predict(h), layer.topk(h, 3).indices[:, 0])
    assert torch.equal(layer.predict(h), log_prob.argmax(dim=1))
    flat = FlatSoftmax(5, 20)
    assert torch.equal(flat.predict(h), flat.topk(h, 2).indices[:, 0])
    big = _huge_rows(layer)
    layer64 = layer.double()
    assert torch.isfinite(layer64.log_prob(big.double())).all()


@PATHS
def test_training_on_overflowing_logits_reports_the_step(kernels):
    layer = HierarchicalSoftmax(5, Tree.random(9, 3, 2, seed=0))
    layer.use_kernels = kernels
    y = torch.tensor([0, 1, 2, 3])
    big = _huge_rows(layer)
    batches = [(torch.randn(4, 5), y), (big, y)]
    with pytest.raises(FloatingPointError, match="at step 1"):
        train_epoch(torch.nn.Identity(), layer, batches, torch.optim.SGD(layer.parameters(), lr=0.0))

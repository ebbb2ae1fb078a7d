"""Fixtures shared by the tests of the compiled kernels and the searches built on them."""
import pytest
import torch

import hsm.kernels as kernels


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request, monkeypatch):
    """Run with one thread, then with the rows shared by two (even tiny batches are split)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    monkeypatch.setattr(kernels, "MIN_WORK_PER_THREAD", 1)
    yield request.param
    torch.set_num_threads(before)

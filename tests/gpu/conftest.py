"""tests/gpu: real runs on a CUDA GPU (the reference on its GPU code path, capture speed and bit-identity).

Every test here is skipped where torch sees no CUDA device, as on CI: the CPU suite holds the same verdicts with the
emulated CUDA. Run it on a GPU machine with `python -m pytest -q tests/gpu`.
"""

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: tests/gpu runs where torch.cuda.is_available()")

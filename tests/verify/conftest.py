import pytest


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    # The test machines are shared: intra-op threads fighting over busy cores make tiny models 20x slower.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

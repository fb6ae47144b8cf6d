import pytest

from tests.pool import WorkerPool

POOL_SIZE = 4


@pytest.fixture(scope="session")
def pool():
    workers = WorkerPool(POOL_SIZE)
    yield workers
    workers.close()

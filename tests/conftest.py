import pytest

from tests.pool import WorkerPool

POOL_SIZE = 8  # the default 3-D layout (dp2·tp2·pp2) needs eight ranks


@pytest.fixture(scope="session")
def pool():
    workers = WorkerPool(POOL_SIZE)
    yield workers
    workers.close()

import pytest

from mmdata_plugin.handover import receive_packed


@pytest.fixture(autouse=True)
def blocks_stay_packed():
    """Blocks arrive packed, as while DeviceFeedHook feeds; a test that
    wants the default sets it back."""
    previous = receive_packed(True)
    yield
    receive_packed(previous)

"""``TransferSettings``: part size and streams of the object store's transfers, checked when
built (docs/object-store.md, Configuration)."""

from __future__ import annotations

import pytest

from trainer_runtime import ConfigError
from trainer_runtime.objectstore import TransferSettings
from trainer_runtime.objectstore.store import MiB


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"concurrency": 0}, r"TransferSettings.concurrency=0: expected a count >= 1"),
        ({"concurrency": 2.5}, r"TransferSettings.concurrency=2.5: expected an int"),
        ({"part_size": 1 * MiB}, r"TransferSettings.part_size=1048576: expected bytes >= 5242880"),
        ({"multipart_threshold": -1}, r"TransferSettings.multipart_threshold=-1: expected bytes"),
    ],
)
def test_a_setting_no_transfer_could_use_is_refused_naming_it(given, message) -> None:
    """concurrency=0 built a pool of no threads at the first multipart transfer (an upload
    retried forever); a part under 5 MiB was raised to 5 MiB without a word."""
    with pytest.raises(ConfigError, match=message):
        TransferSettings(**given)


def test_the_documented_defaults_and_the_growth_past_ten_thousand_parts() -> None:
    settings = TransferSettings()
    assert (settings.part_size, settings.concurrency) == (16 * MiB, 8)
    assert settings.multipart_threshold == 32 * MiB
    assert settings.part_size_for(100 * MiB) == 16 * MiB
    assert settings.part_size_for(10_000 * 16 * MiB + 1) == 32 * MiB
    assert TransferSettings(part_size=5 * MiB).part_size_for(1 * MiB) == 5 * MiB

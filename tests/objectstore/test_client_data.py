"""Every S3 client of a process shares one botocore data loader (store._core_session)."""

from __future__ import annotations

import botocore.loaders
import pytest

from trainer_runtime.objectstore import store


def test_the_service_model_is_loaded_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    store.warm_up()
    loads: list[str] = []
    original = botocore.loaders.JSONFileLoader.load_file

    def counting(self: object, file_path: str, *args: object, **kwargs: object) -> object:
        loads.append(file_path)
        return original(self, file_path, *args, **kwargs)

    monkeypatch.setattr(botocore.loaders.JSONFileLoader, "load_file", counting)
    one = store.S3Store(endpoint_url="http://127.0.0.1:1", region="us-east-1")
    two = store.S3Store(endpoint_url="http://127.0.0.1:1", region="us-east-1")
    assert one.client is not two.client  # clients stay separate: only the data is shared
    assert loads == [], loads


def test_each_client_reads_the_credentials_of_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s1")
    first = store.S3Store(endpoint_url="http://127.0.0.1:1", region="us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s2")
    second = store.S3Store(endpoint_url="http://127.0.0.1:1", region="us-east-1")
    keys = [s.client._request_signer._credentials.access_key for s in (first, second)]
    assert keys == ["first", "second"]

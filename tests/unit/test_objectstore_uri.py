"""s3:// URI parsing: the errors a user sees for a mistyped checkpoint location."""

from __future__ import annotations

import pytest

from trainer_runtime.objectstore.uri import S3Uri, is_s3_uri, parse_s3_uri


@pytest.mark.parametrize(
    ("text", "bucket", "key"),
    [
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://my-bucket.v2/a/b/", "my-bucket.v2", "a/b"),
        ("S3://bucket//a///b", "bucket", "a/b"),
        ("  s3://gcs_style_bucket/x  ", "gcs_style_bucket", "x"),
    ],
)
def test_valid(text: str, bucket: str, key: str) -> None:
    assert parse_s3_uri(text) == S3Uri(bucket, key)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("bucket/prefix", "is not a URI"),
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("s3://Bucket/x", "invalid bucket name"),
        ("s3://ab/x", "invalid bucket name"),
        ("s3://-bucket/x", "invalid bucket name"),
        ("s3://bu..cket/x", "invalid bucket name"),
        ("s3://192.168.1.1/x", "invalid bucket name"),
        ("s3://bucket/a/../b", "'..'"),
        ("s3://bucket/a?versionId=1", "query strings"),
        ("gs://bucket/x", "storage.googleapis.com"),
        ("oci://bucket/x", "oraclecloud.com"),
        ("s3a://bucket/x", "use the s3:// scheme"),
        ("https://s3.amazonaws.com/bucket", "AWS_ENDPOINT_URL_S3"),
        ("ftp://bucket/x", "only the s3:// scheme"),
    ],
)
def test_invalid_names_argument_and_form(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match="save_folder") as info:
        parse_s3_uri(text, arg="save_folder")
    assert needle in str(info.value)
    assert "s3://BUCKET/PREFIX" in str(info.value)


def test_join_name_parent_prefix() -> None:
    root = parse_s3_uri("s3://bkt/root")
    ckpt = root.join("run", "ep0-ba10/")
    assert str(ckpt) == "s3://bkt/root/run/ep0-ba10"
    assert ckpt.name == "ep0-ba10"
    assert ckpt.parent() == root.join("run")
    assert ckpt.prefix == "root/run/ep0-ba10/"
    assert S3Uri("b").prefix == ""
    assert str(S3Uri("b").join("", "x")) == "s3://b/x"


def test_is_s3_uri() -> None:
    assert is_s3_uri("s3://b/x") and is_s3_uri("S3://b")
    assert not is_s3_uri("/data/ckpt") and not is_s3_uri(None) and not is_s3_uri("gs://b")

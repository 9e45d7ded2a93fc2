"""Parse and validate ``s3://bucket/prefix`` locations.

Every place that accepts a checkpoint folder or a load path also accepts an S3 URI; this module is
the one place that decides what a valid one is, so a typo fails at construction with a message
that names the argument and the expected form, rather than as an opaque botocore error an hour
into training. Other clouds' schemes (``gs://``, ``oci://``, ...) are rejected with a hint: they
are reached through their S3-compatible endpoints with ``s3://`` URIs (docs/object-store.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEME = "s3://"

# S3's DNS-compatible bucket rule (3-63 of lowercase letters, digits, dots and hyphens, starting
# and ending with a letter or digit). Underscores are accepted too, because GCS bucket names may
# contain them and GCS is reached through its S3-compatible endpoint with path-style requests.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_IPV4_RE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")

_OTHER_SCHEMES = {
    "gs": "Google Cloud Storage: use s3://BUCKET/PREFIX with AWS_ENDPOINT_URL_S3="
    "https://storage.googleapis.com and HMAC keys as AWS credentials",
    "gcs": "Google Cloud Storage: use s3://BUCKET/PREFIX with AWS_ENDPOINT_URL_S3="
    "https://storage.googleapis.com and HMAC keys as AWS credentials",
    "oci": "OCI Object Storage: use s3://BUCKET/PREFIX with AWS_ENDPOINT_URL_S3="
    "https://NAMESPACE.compat.objectstorage.REGION.oraclecloud.com and a Customer Secret Key",
    "s3a": "use the s3:// scheme (s3a:// is Hadoop's spelling of the same thing)",
    "s3n": "use the s3:// scheme (s3n:// is Hadoop's spelling of the same thing)",
    "http": "give the endpoint in AWS_ENDPOINT_URL_S3 and the location as s3://BUCKET/PREFIX",
    "https": "give the endpoint in AWS_ENDPOINT_URL_S3 and the location as s3://BUCKET/PREFIX",
}


def is_s3_uri(value: object) -> bool:
    """True when ``value`` is a string that asks for the object store (starts with ``s3://``)."""
    return isinstance(value, str) and value.lower().startswith(SCHEME)


@dataclass(frozen=True)
class S3Uri:
    """A bucket and a key prefix without leading or trailing slashes ("" is the bucket root)."""

    bucket: str
    key: str = ""

    def join(self, *parts: str) -> S3Uri:
        """A child location; empty parts are skipped so ``join("")`` is the same location."""
        segments = [self.key] if self.key else []
        segments.extend(p.strip("/") for p in parts if p.strip("/"))
        return S3Uri(self.bucket, "/".join(segments))

    @property
    def prefix(self) -> str:
        """The key as a folder prefix for listing (``"a/b/"``, or ``""`` at the bucket root)."""
        return f"{self.key}/" if self.key else ""

    @property
    def name(self) -> str:
        """The last path segment (a checkpoint or file name)."""
        return self.key.rsplit("/", 1)[-1]

    def parent(self) -> S3Uri:
        """The enclosing folder (the bucket root is its own parent)."""
        return S3Uri(self.bucket, self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"


def parse_s3_uri(value: str, *, arg: str = "uri") -> S3Uri:
    """Parse ``s3://bucket[/prefix]``; raise ValueError naming ``arg`` and the expected form."""
    expected = "expected s3://BUCKET/PREFIX"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{arg}: empty object-store location; {expected}")
    text = value.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise ValueError(f"{arg}={value!r} is not a URI; {expected}")
    if scheme.lower() != "s3":
        hint = _OTHER_SCHEMES.get(scheme.lower(), "only the s3:// scheme is supported")
        raise ValueError(f"{arg}={value!r}: unsupported scheme {scheme}://; {expected} ({hint})")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"{arg}={value!r} names no bucket; {expected}")
    if not _BUCKET_RE.match(bucket) or ".." in bucket or _IPV4_RE.match(bucket):
        raise ValueError(
            f"{arg}={value!r}: invalid bucket name {bucket!r} (3-63 lowercase letters, digits, "
            f"'.', '-' or '_', starting and ending with a letter or digit); {expected}"
        )
    if "?" in key or "#" in key:
        raise ValueError(
            f"{arg}={value!r}: query strings and fragments are not allowed; {expected}"
        )
    segments = [s for s in key.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise ValueError(f"{arg}={value!r}: '.' and '..' are not allowed in the prefix; {expected}")
    return S3Uri(bucket, "/".join(segments))

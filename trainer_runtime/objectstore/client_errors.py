"""What a boto3 client refuses to be built with, as an ``ObjectStoreConfigError`` that names the
setting the user gave and what it expects.

boto3 checks the endpoint, the region, the profile and the checksum modes when the client is
built, and says so in its own words ("Invalid endpoint: ...", "region_name ...", "The config
profile (x) could not be found"), naming neither the environment variable that carried the
value nor the form it needs. Those come out here as configuration errors (``ConfigError``s),
like a missing bucket or refused credentials.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .. import envvars
from .errors import ObjectStoreConfigError

CHECKSUM_SETTINGS = {
    "request_checksum_calculation": envvars.AWS_REQUEST_CHECKSUM_CALCULATION,
    "response_checksum_validation": envvars.AWS_RESPONSE_CHECKSUM_VALIDATION,
}


def client_setting_error(
    exc: BaseException,
    *,
    endpoint_url: str | None,
    region: str | None,
    environ: Mapping[str, str] | None = None,
) -> ObjectStoreConfigError | None:
    """The configuration error ``exc`` (raised while building the client) stands for; None
    when it is none of boto3's refusals of a setting."""
    from botocore import exceptions as bexc  # noqa: PLC0415 - boto3 is optional

    env = os.environ if environ is None else environ
    if isinstance(exc, bexc.ProfileNotFound):
        name = envvars.AWS_PROFILE if env.get(envvars.AWS_PROFILE) else envvars.AWS_DEFAULT_PROFILE
        return ObjectStoreConfigError(
            f"{name}={env.get(name, '')!r}: no such profile in the AWS config or credentials "
            "file; expected the name of a [profile NAME] section (or unset it to use the "
            "environment's credentials)"
        )
    if isinstance(exc, bexc.InvalidChecksumConfigError):
        return _checksum_error(str(exc), env)
    if isinstance(exc, bexc.InvalidRegionError):
        return ObjectStoreConfigError(
            f"{_region_source(region, env)}: invalid region ({exc}); expected a region name "
            "such as us-east-1 (or auto where the store takes any)"
        )
    if isinstance(exc, ValueError) and str(exc).startswith("Invalid endpoint"):
        return ObjectStoreConfigError(
            f"{_endpoint_source(endpoint_url, env)}: invalid endpoint; expected a URL "
            "http://HOST[:PORT] or https://HOST[:PORT] (e.g. http://minio.example:9000)"
        )
    return None


def _checksum_error(message: str, env: Mapping[str, str]) -> ObjectStoreConfigError:
    for key, name in CHECKSUM_SETTINGS.items():
        if key in message:
            where = f"{name}={env[name]!r}" if env.get(name) else f"{key} in the AWS profile"
            return ObjectStoreConfigError(
                f"{where}: expected when_required (the runtime's default) or when_supported"
            )
    return ObjectStoreConfigError(f"boto3's checksum setting: {message}")


def _region_source(region: str | None, env: Mapping[str, str]) -> str:
    if region is not None and env.get(envvars.AWS_REGION) == region:
        return f"{envvars.AWS_REGION}={region!r}"
    if region is not None:
        return f"region={region!r}"
    if env.get(envvars.AWS_DEFAULT_REGION):
        return f"{envvars.AWS_DEFAULT_REGION}={env[envvars.AWS_DEFAULT_REGION]!r}"
    return "region in the AWS profile"


def _endpoint_source(endpoint_url: str | None, env: Mapping[str, str]) -> str:
    if endpoint_url is not None and env.get(envvars.S3_ENDPOINT_URL) == endpoint_url:
        return f"{envvars.S3_ENDPOINT_URL}={endpoint_url!r}"
    if endpoint_url is not None:
        return f"endpoint_url={endpoint_url!r}"
    for name in (envvars.AWS_ENDPOINT_URL_S3, envvars.AWS_ENDPOINT_URL):
        if env.get(name):
            return f"{name}={env[name]!r}"
    return "endpoint_url in the AWS profile"

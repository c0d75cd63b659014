"""One bucket and key prefix (``s3://BUCKET/PREFIX``), reached with boto3 configured as every AWS SDK is: the endpoint
from ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, credentials from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` (``~/.aws/config``) or a web identity (``AWS_WEB_IDENTITY_TOKEN_FILE`` +
``AWS_ROLE_ARN``, what an EKS service account gets), the region from ``AWS_REGION`` (botocore's credential chain:
https://docs.aws.amazon.com/sdkref/latest/guide/standardized-credentials.html). hfcache never reads, prints or stores a
credential itself; botocore signs each request (or a presigned URL, :meth:`Bucket.presigned_get`).

Errors become hfcache's: no credentials exit 2, anything the store answers or a network failure exit 3, one line that
names ``s3://BUCKET/PREFIX`` and the store's error code, never a signed URL.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

from .._version import __version__
from ..errors import EndpointUnreachable, GatedRepo, HubError, RepoNotFound, UsageError

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")  # S3 bucket naming rules (general purpose buckets)
_SEGMENT = re.compile(r"[A-Za-z0-9!_.*'()\-]{1,255}")  # S3's "safe characters" for object key names
MAX_PREFIX_CHARS = 512
PRESIGN_SECONDS = 900  #: how long a presigned GET URL stays valid (a pull re-signs per request)
_EXTRA = "pip install 'hfcache[s3]'"
_CREDENTIALS_HINT = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or a web identity "
                     "(AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN)")


@dataclass(frozen=True)
class BucketUrl:
    """``s3://BUCKET[/PREFIX]``: ``bucket`` (S3's naming rules) and ``prefix`` (``/``-separated key segments of S3's
    safe characters, no ``.``/``..``; empty for the bucket's root)."""

    bucket: str
    prefix: str = ""

    def key(self, *parts: str) -> str:
        """The object key of ``parts`` below the prefix."""
        return "/".join(p for p in (self.prefix, *parts) if p)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def is_bucket_url(text: str) -> bool:
    """Whether ``text`` names a bucket (``s3://``), not an OCI reference."""
    return text.startswith("s3://")


def parse_bucket_url(text: str) -> BucketUrl:
    """``s3://BUCKET[/PREFIX]`` parsed. Raises UsageError (exit 2): another scheme, a bad bucket name, an empty, ``.``
    or ``..`` segment, a character outside S3's safe set, a prefix over :data:`MAX_PREFIX_CHARS` characters."""
    usage = "give s3://BUCKET or s3://BUCKET/PREFIX (e.g. s3://models/hf-cache)"
    if not is_bucket_url(text):
        raise UsageError(f"{text[:80]!r} is not an s3:// URL", hint=usage)
    bucket, _, prefix = text[len("s3://"):].partition("/")
    prefix = prefix.rstrip("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise UsageError(f"{text[:80]!r}: {bucket[:70]!r} is not a valid bucket name", hint=usage)
    bad_segment = any(not _SEGMENT.fullmatch(s) or s in (".", "..") for s in prefix.split("/"))
    if prefix and (len(prefix) > MAX_PREFIX_CHARS or bad_segment):
        raise UsageError(f"{text[:80]!r}: the prefix must be /-separated names of letters, digits and !_.*'()- "
                         f"(no empty, '.' or '..' part; at most {MAX_PREFIX_CHARS} characters)", hint=usage)
    return BucketUrl(bucket, prefix)


class Bucket:
    """A connection to one :class:`BucketUrl` (one boto3 client, thread-safe, pooled).

    Args:
        url: the bucket and prefix. timeout: seconds to connect or wait for any byte, > 0. retries: retries of a
            transient failure per request (botocore's ``standard`` mode: throttling, 5xx, resets), >= 0.
        max_workers: connections at once (the pool holds twice as many).

    Raises:
        UsageError: boto3 is not installed (the ``s3`` extra).
    """

    def __init__(self, url: BucketUrl, *, timeout: float = 60.0, retries: int = 5, max_workers: int = 8) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise UsageError("object storage needs boto3, which is not installed", hint=_EXTRA) from None
        self.url = url
        config = Config(signature_version="s3v4", connect_timeout=timeout, read_timeout=timeout,
                        retries={"mode": "standard", "total_max_attempts": retries + 1},
                        max_pool_connections=2 * max_workers, user_agent_extra=f"hfcache/{__version__}")
        with self.errors("connect"):
            try:
                self.client = boto3.session.Session().client("s3", config=config)
            except ValueError as exc:  # botocore's check of AWS_ENDPOINT_URL ("Invalid endpoint", a bad IPv6 host)
                raise UsageError(f"{url}: the S3 endpoint (AWS_ENDPOINT_URL) is not a URL: {str(exc)[:100]}",
                                 hint="set AWS_ENDPOINT_URL to http(s)://HOST[:PORT], or unset it for AWS") from None

    def __repr__(self) -> str:  # never the client (its credentials)
        return f"Bucket({str(self.url)!r})"

    @contextlib.contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """botocore's exceptions inside the block as hfcache errors naming ``what`` (an object or an action)."""
        from botocore import exceptions as bx

        where = f"{self.url}: {what}"
        try:
            yield
        except (bx.NoCredentialsError, bx.PartialCredentialsError, bx.CredentialRetrievalError,
                bx.ProfileNotFound) as exc:
            raise UsageError(f"{where}: no usable S3 credentials ({type(exc).__name__})",
                             hint=_CREDENTIALS_HINT) from None
        except bx.ClientError as exc:
            raise client_error(where, exc) from None
        except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError,
                bx.ConnectionClosedError) as exc:
            raise EndpointUnreachable(f"{where}: the store did not answer ({type(exc).__name__})",
                                      hint="check AWS_ENDPOINT_URL and the network, or raise --timeout") from None
        except bx.BotoCoreError as exc:
            raise HubError(f"{where}: {type(exc).__name__}", hint="check the S3 settings (AWS_* variables)") from None

    def head(self, key: str) -> int | None:
        """The size in bytes of object ``key`` (a full key), or None when there is none."""
        with self.errors(key):
            try:
                return int(self.client.head_object(Bucket=self.url.bucket, Key=key)["ContentLength"])
            except self.client.exceptions.ClientError as exc:
                if _status(exc) == 404:
                    return None
                raise

    def get_bytes(self, key: str, limit: int) -> bytes:
        """Object ``key`` whole, at most ``limit`` bytes. Raises RepoNotFound: no such object; HubError: larger."""
        with self.errors(key):
            try:
                answer = self.client.get_object(Bucket=self.url.bucket, Key=key, Range=f"bytes=0-{limit}")
            except self.client.exceptions.ClientError as exc:
                if _status(exc) == 404:
                    raise RepoNotFound(f"{self.url}: no object {key}", hint="check the bucket URL; push first") from None
                raise
            with answer["Body"] as body:
                data = body.read(limit + 1)
        if len(data) > limit:
            raise HubError(f"{self.url}: {key} is larger than {limit} bytes", hint="the bucket is corrupt or hostile")
        return data

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> bool:
        """Write object ``key``. ``create_only``: a conditional write (``If-None-Match: *``) that leaves an existing
        object alone. Returns False when it did so (HTTP 412), True when written."""
        extra = {"IfNoneMatch": "*"} if create_only else {}
        with self.errors(key):
            try:
                self.client.put_object(Bucket=self.url.bucket, Key=key, Body=data, **extra)
            except self.client.exceptions.ClientError as exc:
                if create_only and _status(exc) == 412:
                    return False
                raise
        return True

    def list_keys(self, *parts: str) -> Iterator[tuple[str, int]]:
        """(key relative to the prefix, size) of every object below ``parts``, in key order."""
        base = self.url.key(*parts) + "/"
        strip = len(self.url.key()) + 1 if self.url.prefix else 0
        with self.errors(f"list {base}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.url.bucket, Prefix=base)
            for page in pages:
                for item in page.get("Contents", ()):
                    yield item["Key"][strip:], int(item["Size"])

    def presigned_get(self, key: str) -> str:
        """A GET URL of object ``key`` signed for :data:`PRESIGN_SECONDS` (computed locally, no request). It grants
        reading that object to whoever holds it: never printed or logged."""
        with self.errors(key):
            return self.client.generate_presigned_url("get_object", Params={"Bucket": self.url.bucket, "Key": key},
                                                      ExpiresIn=PRESIGN_SECONDS)


def _status(exc) -> int | None:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def client_error(where: str, exc) -> HubError:
    """A store's error answer (botocore ``ClientError``) as a HubError (exit 3) naming its code and status."""
    code = str(exc.response.get("Error", {}).get("Code", "?"))[:64]
    status = _status(exc)
    if code == "NoSuchBucket":
        return RepoNotFound(f"{where}: no such bucket", hint="check the bucket name and AWS_ENDPOINT_URL")
    if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return GatedRepo(f"{where}: access denied ({code})", hint="check the S3 credentials and the bucket's policy")
    return HubError(f"{where}: {code} (HTTP {status})", hint="retry later or check the store")

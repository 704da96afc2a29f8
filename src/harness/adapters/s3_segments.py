"""The SegmentStore port on an S3-compatible bucket (boto3). boto3's errors become SegmentStoreError."""

from __future__ import annotations

from typing import Any

from harness.ports.segments import SegmentStoreError


class S3SegmentStore:
    """Segments as objects `prefix/name` in `bucket`; an object is written once (a name that exists is
    refused, and the write itself is conditional where the server supports it)."""

    def __init__(self, bucket: str, prefix: str = "", endpoint: str | None = None) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise SegmentStoreError("an s3:// archive needs boto3: pip install 'harness-kernel[archive]'") from None
        self.bucket, self.prefix = bucket, prefix.strip("/")
        config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=30)
        self._client: Any = boto3.client("s3", endpoint_url=endpoint, config=config)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def put(self, name: str, data: bytes) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self._key(name)
        try:
            if self._exists(key):
                raise SegmentStoreError(f"segment s3://{self.bucket}/{key} exists already: segments are never "
                                        "replaced")
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*",
                                    ContentType="application/gzip")
        except ClientError as exc:
            raise SegmentStoreError(f"cannot store s3://{self.bucket}/{key}: {_message(exc)}") from None
        except BotoCoreError as exc:
            raise SegmentStoreError(f"cannot reach the archive bucket {self.bucket}: {exc}") from None
        return f"s3://{self.bucket}/{key}"

    def _exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def get(self, location: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        key = location.removeprefix(f"s3://{self.bucket}/") if location.startswith("s3://") else self._key(location)
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
            return bytes(body.read())
        except ClientError as exc:
            raise SegmentStoreError(f"cannot read s3://{self.bucket}/{key}: {_message(exc)}") from None
        except BotoCoreError as exc:
            raise SegmentStoreError(f"cannot reach the archive bucket {self.bucket}: {exc}") from None


    def delete(self, location: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        key = location.removeprefix(f"s3://{self.bucket}/") if location.startswith("s3://") else self._key(location)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            raise SegmentStoreError(f"cannot remove s3://{self.bucket}/{key}: {_message(exc)}") from None
        except BotoCoreError as exc:
            raise SegmentStoreError(f"cannot reach the archive bucket {self.bucket}: {exc}") from None


def _message(exc: Any) -> str:
    error = exc.response.get("Error", {})
    return f"{error.get('Code', '?')} {error.get('Message', '')}".strip()

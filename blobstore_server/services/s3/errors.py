"""S3's errors: a code, its HTTP status and a message, rendered as S3's XML.

The gateway speaks S3, not the project's JSON RPC: its clients (boto3, the aws CLI, rclone) read the `Code`
element, so these are kept apart from libs/rpc's errors and mapped to XML in one place (`to_xml`).
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

# code -> HTTP status, for every code the gateway answers with
STATUS: dict[str, int] = {
    "AccessDenied": 403,
    "AuthorizationHeaderMalformed": 400,
    "AuthorizationQueryParametersError": 400,
    "BadDigest": 400,
    "BucketAlreadyExists": 409,
    "BucketAlreadyOwnedByYou": 409,
    "BucketNotEmpty": 409,
    "ConditionalRequestConflict": 409,
    "EntityTooLarge": 400,
    "EntityTooSmall": 400,
    "ExpiredToken": 400,
    "IncompleteBody": 400,
    "InternalError": 500,
    "InvalidAccessKeyId": 403,
    "InvalidArgument": 400,
    "InvalidBucketName": 400,
    "InvalidDigest": 400,
    "InvalidPart": 400,
    "InvalidPartNumber": 416,
    "InvalidPartOrder": 400,
    "InvalidRange": 416,
    "InvalidRequest": 400,
    "KeyTooLongError": 400,
    "MalformedXML": 400,
    "MetadataTooLarge": 400,
    "MethodNotAllowed": 405,
    "MissingContentLength": 411,
    "MissingSecurityHeader": 400,
    "NoSuchBucket": 404,
    "NoSuchBucketPolicy": 404,
    "NoSuchCORSConfiguration": 404,
    "NoSuchKey": 404,
    "NoSuchLifecycleConfiguration": 404,
    "NoSuchPublicAccessBlockConfiguration": 404,
    "NoSuchTagSet": 404,
    "NoSuchUpload": 404,
    "NoSuchWebsiteConfiguration": 404,
    "ObjectLockConfigurationNotFoundError": 404,
    "OwnershipControlsNotFoundError": 404,
    "ReplicationConfigurationNotFoundError": 404,
    "ServerSideEncryptionConfigurationNotFoundError": 404,
    "NotImplemented": 501,
    "NotModified": 304,
    "PreconditionFailed": 412,
    "RequestTimeTooSkewed": 403,
    "ServiceUnavailable": 503,
    "SignatureDoesNotMatch": 403,
    "SlowDown": 503,
    "XAmzContentSHA256Mismatch": 400,
}

# A bucket's configurations the gateway never holds (none can be set: their PUTs answer NotImplemented), by the
# subresource that names each: a GET of one answers what S3 answers for a bucket without it.
NOT_CONFIGURED: dict[str, str] = {
    "cors": "NoSuchCORSConfiguration",
    "encryption": "ServerSideEncryptionConfigurationNotFoundError",
    "lifecycle": "NoSuchLifecycleConfiguration",
    "object-lock": "ObjectLockConfigurationNotFoundError",
    "ownershipControls": "OwnershipControlsNotFoundError",
    "policy": "NoSuchBucketPolicy",
    "publicAccessBlock": "NoSuchPublicAccessBlockConfiguration",
    "replication": "ReplicationConfigurationNotFoundError",
    "tagging": "NoSuchTagSet",
    "website": "NoSuchWebsiteConfiguration",
}


class S3Error(Exception):
    """An S3 error answer. `code` must be a key of STATUS; `resource` is the bucket or key path it is about;
    `headers` go out with it (a 304 names the object's ETag)."""

    def __init__(self, code: str, message: str, resource: str = "",
                 headers: Sequence[tuple[str, str]] = ()) -> None:
        if code not in STATUS:
            raise ValueError(f"unknown S3 error code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.resource, self.headers = code, message, resource, list(headers)

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def to_xml(self, request_id: str) -> bytes:
        """S3's error body (no namespace; RequestId equals the x-amz-request-id header)."""
        return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{self.code}</Code>'
                f"<Message>{escape(self.message)}</Message><Resource>{escape(self.resource)}</Resource>"
                f"<RequestId>{request_id}</RequestId></Error>").encode()

//! [`StoreError`]: why no object store can be made for a URL (an unsupported scheme, missing
//! credentials, a configuration its client refuses), as the end of a sentence about the URL.
//! A leaf: the resolution of locations uses it.

/// Why no store can be made for a cloud or HTTP URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A scheme that names no store ringflow reads.
    #[error(
        "has the unsupported scheme `{0}://` (use a local path, file://, s3://, gs://, az://, \
         http:// or https://)"
    )]
    UnsupportedScheme(String),
    /// An `s3://` URL with an access key id but no secret key.
    #[error("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not")]
    AwsSecretMissing,
    /// An `s3://` URL without any AWS credentials.
    #[error(
        "no AWS credentials are configured: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
         (and AWS_ENDPOINT_URL for an S3-compatible server), AWS_SKIP_SIGNATURE=true for a \
         public bucket, or AWS_METADATA_ENDPOINT to use an instance profile"
    )]
    NoAwsCredentials,
    /// A `gs://` URL without any Google Cloud credentials.
    #[error(
        "no Google Cloud credentials are configured: set GOOGLE_APPLICATION_CREDENTIALS (or \
         GOOGLE_SERVICE_ACCOUNT_KEY)"
    )]
    NoGoogleCredentials,
    /// An Azure URL without any Azure credentials.
    #[error(
        "no Azure credentials are configured: set AZURE_STORAGE_ACCOUNT_NAME with \
         AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY, or a service principal's \
         AZURE_CLIENT_ID/AZURE_CLIENT_SECRET/AZURE_TENANT_ID)"
    )]
    NoAzureCredentials,
    /// The store's client refused its configuration (the first line of what it said).
    #[error("cannot configure its store: {}", first_line(&.0.to_string()))]
    Configure(#[source] object_store::Error),
}

/// The first line of `s`, trimmed: the part of a store's error that names the problem.
pub(super) fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).trim().to_string()
}

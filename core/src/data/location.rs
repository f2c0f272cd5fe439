//! Where data lives: local paths and object-store URLs, resolved to an [`ObjectStore`].
//!
//! A data path in a job spec, a `--table`, a checkpoint directory or a model output is one of:
//!
//! | form | store |
//! | --- | --- |
//! | `data/train.parquet`, `/abs/path`, `file:///abs/path` | the local file system |
//! | `s3://bucket/key` | Amazon S3 or an S3-compatible server (`AWS_ENDPOINT_URL`) |
//! | `gs://bucket/key` | Google Cloud Storage |
//! | `az://container/key`, `abfs://…`, `abfss://…` | Azure Blob Storage |
//! | `http://…`, `https://…` | a plain HTTP server (single files; no listing) |
//!
//! A relative local path is resolved in the working directory of the process that opens it:
//! each executor opens it on its own machine, as Spark does with `file:` paths. Credentials
//! come from the usual environment variables of each cloud (`AWS_ACCESS_KEY_ID`,
//! `GOOGLE_APPLICATION_CREDENTIALS`, `AZURE_STORAGE_ACCOUNT_KEY`, ...); a cloud URL without
//! any is refused at once with a message naming the variables, rather than left to time out.
//! One client is built per bucket and process, and reused.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use url::Url;

use super::error::{DataError, Result};
use super::runtime::block_on;
use super::store_error::{StoreError, first_line};

/// A resolved data location: the store that holds it and the path within that store.
#[derive(Clone)]
pub struct Location {
    text: String,
    url: Url,
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Location")
            .field("text", &self.text)
            .field("url", &self.url.as_str())
            .finish()
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// True when `text` names something on the local file system (no URL scheme, or `file://`).
pub fn is_local(text: &str) -> bool {
    match text.split_once("://") {
        None => true,
        Some((scheme, _)) => scheme.eq_ignore_ascii_case("file"),
    }
}

impl Location {
    /// Resolves `text`, a local path or a URL, checking that credentials are configured for a
    /// cloud store (without contacting it).
    pub fn parse(text: &str) -> Result<Location> {
        let fail = |m: String| DataError::new(text, m);
        if text.trim().is_empty() {
            return Err(fail("is an empty path".into()));
        }
        if !text.contains("://") {
            let absolute = absolute(Path::new(text))
                .map_err(|e| fail(format!("cannot be resolved to an absolute path: {e}")))?;
            return Location::local(text, &absolute);
        }
        let url = Url::parse(text).map_err(|e| fail(format!("is not a valid URL: {e}")))?;
        if url.scheme() == "file" {
            let path = url
                .to_file_path()
                .map_err(|_| fail("is not a valid file:// URL".into()))?;
            return Location::local(text, &path);
        }
        let store = store_for(&url).map_err(|e| fail(e.to_string()))?;
        let path = ObjectPath::from_url_path(url.path())
            .map_err(|e| fail(format!("has an invalid object path: {e}")))?;
        Ok(Location {
            text: text.to_string(),
            url,
            store,
            path,
        })
    }

    fn local(text: &str, absolute: &Path) -> Result<Location> {
        let fail = |m: String| DataError::new(text, m);
        let path = ObjectPath::from_absolute_path(absolute).map_err(|e| match e {
            // Its message would repeat the path, which `text` names already.
            object_store::path::Error::NonUnicode { .. } => fail(
                "is not a usable local path: its %-escapes decode to a name that is not UTF-8 \
                 text, and ringflow names files by UTF-8 paths; rename the file"
                    .into(),
            ),
            e => fail(format!("is not a usable local path: {e}")),
        })?;
        let url =
            Url::from_file_path(absolute).map_err(|_| fail("is not a usable local path".into()))?;
        Ok(Location {
            text: text.to_string(),
            url,
            store: local_store(),
            path,
        })
    }

    /// The path or URL as it was written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The full URL (`file:///abs/path` for local paths).
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The URL of the store's root (`s3://bucket/`, `file:///`), as DataFusion keys stores.
    pub fn store_url(&self) -> Url {
        let mut root = self.url.clone();
        root.set_path("/");
        root.set_query(None);
        root.set_fragment(None);
        root
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The path within the store.
    pub fn path(&self) -> &ObjectPath {
        &self.path
    }

    /// True for the local file system.
    pub fn is_local(&self) -> bool {
        self.url.scheme() == "file"
    }

    /// The local file-system path, for local locations.
    pub fn local_path(&self) -> Option<PathBuf> {
        self.is_local()
            .then(|| self.url.to_file_path().ok())
            .flatten()
    }

    /// The location of `name` (one name, or names separated by `/`) below this one (a
    /// directory), written the same way ([`super::paths::join`]).
    pub fn join(&self, name: &str) -> Location {
        let text = super::paths::join(&self.text, name);
        let mut path = self.path.clone();
        let mut url = self.url.clone();
        let parts: Vec<&str> = name
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        for part in &parts {
            path = path.clone().join(*part);
        }
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(&parts);
        }
        Location {
            text,
            url,
            store: self.store.clone(),
            path,
        }
    }

    /// The location of `path`, an object in the same store, written as this location's text
    /// followed by the part of `path` below this location.
    pub fn child(&self, path: &ObjectPath) -> Location {
        let base: Vec<_> = self.path.parts().collect();
        let parts: Vec<_> = path.parts().collect();
        if parts.len() >= base.len() && parts[..base.len()] == base[..] {
            let rest: Vec<&str> = parts[base.len()..].iter().map(|p| p.as_ref()).collect();
            return self.join(&rest.join("/"));
        }
        let root = Location {
            text: self.store_url().to_string(),
            url: self.store_url(),
            store: self.store.clone(),
            path: ObjectPath::default(),
        };
        Location {
            path: path.clone(),
            ..root.join(path.as_ref())
        }
    }

    /// The object's size in bytes; an error naming the location when it does not exist or
    /// cannot be reached.
    pub async fn size(&self) -> Result<u64> {
        let meta = self
            .store
            .head(&self.path)
            .await
            .map_err(|e| self.error("cannot be read", e))?;
        Ok(meta.size)
    }

    /// Reads the whole object.
    pub async fn read(&self) -> Result<Vec<u8>> {
        let got = self
            .store
            .get(&self.path)
            .await
            .map_err(|e| self.error("cannot be read", e))?;
        let bytes = got
            .bytes()
            .await
            .map_err(|e| self.error("cannot be read", e))?;
        Ok(bytes.to_vec())
    }

    /// Writes `bytes` as the whole object (atomically on every store: a reader sees the old
    /// object or the new one).
    pub async fn write(&self, bytes: Vec<u8>) -> Result<()> {
        if let Some(path) = self.local_path()
            && let Some(dir) = path.parent()
        {
            std::fs::create_dir_all(dir).map_err(|e| {
                DataError::new(&self.text, format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        self.store
            .put(&self.path, PutPayload::from(bytes))
            .await
            .map_err(|e| self.error("cannot be written", e))?;
        Ok(())
    }

    /// Every object below this location (a directory or prefix), sorted by path.
    pub async fn list(&self) -> Result<Vec<ObjectPath>> {
        let mut out: Vec<ObjectPath> = self
            .store
            .list(Some(&self.path))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| self.error("cannot be listed", e))?;
        out.sort();
        Ok(out)
    }

    fn error(&self, what: &str, e: object_store::Error) -> DataError {
        let text = e.to_string();
        let message = match &e {
            object_store::Error::NotFound { .. } => {
                return DataError::not_found(&self.text, "does not exist");
            }
            _ if text.contains("NoSuchBucket") => format!(
                "does not exist: there is no bucket `{}`",
                self.url.host_str().unwrap_or_default()
            ),
            _ => format!("{what}: {}", first_line(&text)),
        };
        DataError::new(&self.text, message)
    }
}

/// Copies every file of the local directory `from` to `to` (a directory location), keeping
/// relative paths; `checkpoint.json` files go last.
pub fn upload_dir(from: &Path, to: &Location) -> Result<()> {
    let mut files = Vec::new();
    walk_files(from, from, &mut files).map_err(|e| {
        DataError::new(from.display().to_string(), format!("cannot be listed: {e}"))
    })?;
    // The metadata last: a reader that finds it finds the files it names.
    files.sort_by_key(|f| f.ends_with("checkpoint.json"));
    for rel in files {
        let bytes = std::fs::read(from.join(&rel)).map_err(|e| {
            DataError::new(
                from.join(&rel).display().to_string(),
                format!("cannot be read: {e}"),
            )
        })?;
        let dest = to.join(&rel);
        block_on(async move { dest.write(bytes).await })?;
    }
    Ok(())
}

/// Copies every object below `from` (a directory location) into the local directory `to`.
pub fn download_dir(from: &Location, to: &Path) -> Result<()> {
    let source = from.clone();
    let objects = block_on(async move { source.list().await })?;
    if objects.is_empty() {
        return Err(DataError::not_found(
            from.as_str(),
            "does not exist or is empty",
        ));
    }
    let base: Vec<String> = from
        .path()
        .parts()
        .map(|p| p.as_ref().to_string())
        .collect();
    for object in objects {
        let parts: Vec<String> = object.parts().map(|p| p.as_ref().to_string()).collect();
        let rel = parts[base.len().min(parts.len())..].join("/");
        let source = from.child(&object);
        let bytes = block_on(async move { source.read().await })?;
        let dest = to.join(&rel);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                DataError::new(dir.display().to_string(), format!("cannot be created: {e}"))
            })?;
        }
        std::fs::write(&dest, bytes).map_err(|e| {
            DataError::new(
                dest.display().to_string(),
                format!("cannot be written: {e}"),
            )
        })?;
    }
    Ok(())
}

fn walk_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk_files(root, &path, out)?;
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    out.sort();
    Ok(())
}

/// `path` made absolute against the working directory, with `.` and `..` resolved lexically
/// (the path need not exist).
fn absolute(path: &Path) -> std::io::Result<PathBuf> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

fn local_store() -> Arc<dyn ObjectStore> {
    static LOCAL: OnceLock<Arc<dyn ObjectStore>> = OnceLock::new();
    LOCAL
        .get_or_init(|| Arc::new(object_store::local::LocalFileSystem::new()))
        .clone()
}

/// The store for a cloud or HTTP URL, built once per scheme and bucket.
pub(crate) fn store_for(url: &Url) -> std::result::Result<Arc<dyn ObjectStore>, StoreError> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> = OnceLock::new();
    if url.scheme() == "file" {
        return Ok(local_store());
    }
    let key = format!("{}://{}", url.scheme(), url.authority());
    let stores = STORES.get_or_init(Default::default);
    if let Some(s) = stores.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(s.clone());
    }
    let store = build_store(url)?;
    stores
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, store.clone());
    Ok(store)
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

fn env_true(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true"))
}

/// Request deadlines for every cloud client: a store that does not answer fails the read
/// within about a minute instead of hanging.
fn client_options() -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(10))
        .with_timeout(Duration::from_secs(60))
}

fn retry() -> RetryConfig {
    RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

fn build_store(url: &Url) -> std::result::Result<Arc<dyn ObjectStore>, StoreError> {
    let built = |r: object_store::Result<Arc<dyn ObjectStore>>| r.map_err(StoreError::Configure);
    match url.scheme() {
        "s3" | "s3a" => s3_store(url),
        "gs" => {
            let has_credentials = [
                "GOOGLE_SERVICE_ACCOUNT",
                "GOOGLE_SERVICE_ACCOUNT_PATH",
                "GOOGLE_SERVICE_ACCOUNT_KEY",
                "GOOGLE_APPLICATION_CREDENTIALS",
            ]
            .iter()
            .any(|v| env_set(v))
                || env_true("GOOGLE_SKIP_SIGNATURE");
            if !has_credentials {
                return Err(StoreError::NoGoogleCredentials);
            }
            built(
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(url.as_str())
                    .with_client_options(client_options())
                    .with_retry(retry())
                    .build()
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
            )
        }
        "az" | "adl" | "azure" | "abfs" | "abfss" => {
            let has_credentials = [
                "AZURE_STORAGE_ACCOUNT_KEY",
                "AZURE_STORAGE_ACCESS_KEY",
                "AZURE_STORAGE_SAS_KEY",
                "AZURE_STORAGE_TOKEN",
                "AZURE_CLIENT_SECRET",
                "AZURE_FEDERATED_TOKEN_FILE",
            ]
            .iter()
            .any(|v| env_set(v))
                || env_true("AZURE_STORAGE_USE_EMULATOR")
                || env_true("AZURE_SKIP_SIGNATURE");
            if !has_credentials {
                return Err(StoreError::NoAzureCredentials);
            }
            built(
                object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(url.as_str())
                    .with_client_options(client_options())
                    .with_retry(retry())
                    .build()
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
            )
        }
        "http" | "https" => {
            let origin = format!("{}://{}", url.scheme(), url.authority());
            built(
                object_store::http::HttpBuilder::new()
                    .with_url(origin)
                    .with_client_options(client_options().with_allow_http(true))
                    .with_retry(retry())
                    .build()
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
            )
        }
        other => Err(StoreError::UnsupportedScheme(other.to_string())),
    }
}

/// An S3 (or S3-compatible) store for `url`, with the credentials and endpoint of the
/// environment; an error says which setting is missing.
fn s3_store(url: &Url) -> std::result::Result<Arc<dyn ObjectStore>, StoreError> {
    if env_set("AWS_ACCESS_KEY_ID") && !env_set("AWS_SECRET_ACCESS_KEY") {
        return Err(StoreError::AwsSecretMissing);
    }
    let has_credentials = [
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_METADATA_ENDPOINT",
    ]
    .iter()
    .any(|v| env_set(v))
        || env_true("AWS_SKIP_SIGNATURE");
    if !has_credentials {
        return Err(StoreError::NoAwsCredentials);
    }
    let endpoint_http = ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .any(|e| e.starts_with("http://"));
    let mut builder = object_store::aws::AmazonS3Builder::from_env()
        .with_url(url.as_str())
        .with_client_options(client_options().with_allow_http(endpoint_http))
        .with_retry(retry());
    if env_set("AWS_ENDPOINT_URL") || env_set("AWS_ENDPOINT") {
        // S3-compatible servers (MinIO, moto, Ceph) address buckets by path.
        builder = builder.with_virtual_hosted_style_request(false);
    }
    builder
        .build()
        .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
        .map_err(StoreError::Configure)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 39): a `file://` URL whose escapes are not UTF-8 printed its path
    /// twice (the URL, then object_store's "Path … contained non-unicode characters"); the
    /// sentence names it once and says what to do.
    #[test]
    fn a_url_of_a_name_that_is_not_utf8_is_named_once() {
        let e = Location::parse("file:///tmp/x%FF.parquet").unwrap_err();
        assert_eq!(
            e.to_string(),
            "file:///tmp/x%FF.parquet: is not a usable local path: its %-escapes decode to a \
             name that is not UTF-8 text, and ringflow names files by UTF-8 paths; rename the \
             file"
        );
    }

    #[test]
    fn local_paths_resolve_against_the_working_directory() {
        let here = std::env::current_dir().unwrap();
        let l = Location::parse("a/./b/../c.parquet").unwrap();
        assert!(l.is_local());
        assert_eq!(l.local_path().unwrap(), here.join("a/c.parquet"));
        assert_eq!(l.as_str(), "a/./b/../c.parquet");
        let f = Location::parse("file:///tmp/x.parquet").unwrap();
        assert_eq!(f.local_path().unwrap(), PathBuf::from("/tmp/x.parquet"));
        assert_eq!(f.store_url().as_str(), "file:///");
        assert!(is_local("data/x") && is_local("file:///x") && !is_local("s3://b/k"));
    }

    #[test]
    fn children_keep_the_written_form() {
        let dir = Location::parse("data/mnist").unwrap();
        let child = dir.join("part-0.parquet");
        assert_eq!(child.as_str(), "data/mnist/part-0.parquet");
        let again = dir.child(child.path());
        assert_eq!(again.as_str(), "data/mnist/part-0.parquet");
        assert_eq!(again.path(), child.path());
    }

    #[test]
    fn unsupported_schemes_and_empty_paths_are_named() {
        let e = Location::parse("hdfs://nn/x").unwrap_err();
        assert!(
            e.to_string().contains("unsupported scheme `hdfs://`"),
            "{e}"
        );
        assert!(Location::parse(" ").is_err());
    }

    #[test]
    fn files_round_trip_through_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let loc = Location::parse(dir.path().join("sub/x.bin").to_str().unwrap()).unwrap();
        let l = loc.clone();
        block_on(async move { l.write(vec![1, 2, 3]).await }).unwrap();
        let l = loc.clone();
        assert_eq!(block_on(async move { l.read().await }).unwrap(), [1, 2, 3]);
        let missing = Location::parse(dir.path().join("nope").to_str().unwrap()).unwrap();
        let e = block_on(async move { missing.size().await }).unwrap_err();
        assert!(e.to_string().ends_with("does not exist"), "{e}");
        assert!(e.is_not_found(), "{e:?}");
        let out = tempfile::tempdir().unwrap();
        let src = Location::parse(dir.path().to_str().unwrap()).unwrap();
        download_dir(&src, out.path()).unwrap();
        assert_eq!(
            std::fs::read(out.path().join("sub/x.bin")).unwrap(),
            [1, 2, 3]
        );
        let back = Location::parse(dir.path().join("copy").to_str().unwrap()).unwrap();
        upload_dir(out.path(), &back).unwrap();
        assert!(dir.path().join("copy/sub/x.bin").is_file());
    }
}

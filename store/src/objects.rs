//! The object store behind `--store URL`, and the four operations flowrepl needs of it: read
//! an object with its version, write a new object once, swap the task's head only if it is
//! still the version read (the fence), and remove.
//!
//! `s3://bucket/prefix` goes through `object_store`'s S3 client, configured by the standard
//! AWS variables (`AmazonS3Builder::from_env`: `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` or `AWS_DEFAULT_REGION`, `AWS_SESSION_TOKEN`,
//! `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint); a swap is `If-Match: <etag>` (a first
//! write `If-None-Match: *`), and the store refuses a stale one with 412. `file:///path` is
//! the same layout in a folder, for one machine: `object_store`'s local file system creates
//! objects atomically but has no conditional update, so a swap there holds an exclusive
//! `flock` on `<path>/.flowrepl-swap.lock` while it compares and writes (every flowrepl
//! process on the machine takes the same lock).

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use std::sync::Arc;

/// Why an operation on the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The URL is not one flowrepl stores in.
    #[error("--store {url:?}: {why}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The store answered with an error, or did not answer (its message holds its causes,
    /// on one line).
    #[error("{}", one_line(&.0.to_string()))]
    Store(object_store::Error),
    /// An object written once under a name only this writer uses is already there with
    /// other content: another writer used the name (a hand-edited store). Never retried.
    #[error("the store already holds {key} with other content: another writer used this kernel's object names; nothing more is written")]
    Clash {
        /// The key.
        key: String,
    },
    /// A local file (the swap lock of a `file://` store) failed.
    #[error("{what}: {source}")]
    Local {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<object_store::Error> for StoreError {
    fn from(e: object_store::Error) -> StoreError {
        StoreError::Store(e)
    }
}

impl StoreError {
    /// Whether the store itself failed (unreachable, slow, a server error): worth retrying.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Store(_) | StoreError::Local { .. })
    }
}

/// `text` with its runs of white space (a server's XML body's line breaks) as one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The outcome of a swap.
#[derive(Debug)]
pub enum Swapped {
    /// Written; the object's new version.
    Done(UpdateVersion),
    /// The object was not the version given (or exists when none was given): someone else
    /// wrote it.
    Moved,
}

/// An opened store: the client and the prefix every key is under.
#[derive(Clone)]
pub struct Store {
    objects: Arc<dyn ObjectStore>,
    root: Path,
    url: String,
    /// `file://` only: the lock file swaps hold.
    swap_lock: Option<std::path::PathBuf>,
    /// [`UNFENCED_VARIABLE`] was set: swaps are plain overwrites.
    unfenced: bool,
}

/// Set to `1`, swaps become plain overwrites: the fence left out, for the test that shows a
/// stale holder writing over the new holder's head without it. Never for use.
pub const UNFENCED_VARIABLE: &str = "FLOWREPL_TEST_UNFENCED_STORE";

fn unfenced() -> bool {
    let on = std::env::var(UNFENCED_VARIABLE).is_ok_and(|v| v == "1");
    if on {
        tracing::warn!("{UNFENCED_VARIABLE}=1: the store's conditional writes are left out; two holders can overwrite each other");
    }
    on
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("url", &self.url).finish()
    }
}

impl Store {
    /// Opens `s3://bucket[/prefix]` or `file:///path` (no request is sent yet).
    pub fn open(url: &str) -> Result<Store, StoreError> {
        let bad = |why: &str| StoreError::BadUrl {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket: use s3://bucket/prefix"));
            }
            let mut builder =
                object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
            // Spellings other S3 tools read that `from_env` may not (older releases).
            if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
                builder = builder.with_endpoint(endpoint);
            }
            if let Ok(region) = std::env::var("AWS_REGION") {
                builder = builder.with_region(region);
            }
            // Short attempts: the uploader retries with its own backoff and says the store is
            // failing; a start fails in seconds rather than minutes.
            let builder = builder
                .with_retry(object_store::RetryConfig {
                    max_retries: 2,
                    retry_timeout: std::time::Duration::from_secs(5),
                    ..Default::default()
                })
                .with_client_options(
                    object_store::ClientOptions::new()
                        .with_allow_http(
                            std::env::var("AWS_ALLOW_HTTP")
                                .is_ok_and(|v| matches!(v.trim(), "true" | "1")),
                        )
                        .with_timeout(std::time::Duration::from_secs(30))
                        .with_connect_timeout(std::time::Duration::from_secs(3)),
                );
            let objects = builder.build()?;
            Ok(Store {
                objects: Arc::new(objects),
                root: Path::from(prefix.trim_matches('/')),
                url: url.to_owned(),
                swap_lock: None,
                unfenced: unfenced(),
            })
        } else if let Some(path) = url.strip_prefix("file://") {
            let dir = std::path::Path::new(path);
            if !dir.is_absolute() {
                return Err(bad("use an absolute path: file:///path"));
            }
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Local {
                what: format!("cannot create {}", dir.display()),
                source,
            })?;
            let objects = object_store::local::LocalFileSystem::new_with_prefix(dir)?;
            Ok(Store {
                objects: Arc::new(objects),
                root: Path::default(),
                url: url.to_owned(),
                swap_lock: Some(dir.join(".flowrepl-swap.lock")),
                unfenced: unfenced(),
            })
        } else {
            Err(bad("use s3://bucket/prefix or file:///path"))
        }
    }

    /// The URL it was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The full key of `key` (a path under the store's prefix).
    pub fn key(&self, key: &str) -> Path {
        if self.root.as_ref().is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.root))
        }
    }

    /// The object at `key` and its version, or `None` when there is none.
    pub async fn get(&self, key: &Path) -> Result<Option<(Bytes, UpdateVersion)>, StoreError> {
        match self.objects.get(key).await {
            Ok(got) => {
                let version = UpdateVersion {
                    e_tag: got.meta.e_tag.clone(),
                    version: got.meta.version.clone(),
                };
                Ok(Some((got.bytes().await?, version)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a new object at `key`. An object already there with the same content is this
    /// write's own earlier attempt (its answer lost): every key flowrepl writes this way names
    /// its content (a hash) or its writer (an epoch, the holder's writer id and a sequence
    /// number). One with other content is [`StoreError::Clash`]: never taken as one's own.
    pub async fn put_new(&self, key: &Path, bytes: Bytes) -> Result<(), StoreError> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .objects
            .put_opts(key, PutPayload::from(bytes.clone()), opts)
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => match self.get(key).await? {
                Some((there, _)) if there == bytes => Ok(()),
                // Gone again (removed in between): write it.
                None => {
                    self.objects.put(key, PutPayload::from(bytes)).await?;
                    Ok(())
                }
                Some(_) => Err(StoreError::Clash {
                    key: key.to_string(),
                }),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// The names of the objects directly in the folder `prefix` (relative to the store's
    /// prefix).
    pub async fn files(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let prefix = self.key(prefix);
        let listed = self.objects.list_with_delimiter(Some(&prefix)).await?;
        Ok(listed
            .objects
            .iter()
            .filter_map(|m| m.location.filename().map(str::to_owned))
            .collect())
    }

    /// Writes `bytes` at `key` only if the object there is still `expected` (`None`: only if
    /// there is none).
    pub async fn swap(
        &self,
        key: &Path,
        bytes: Bytes,
        expected: Option<&UpdateVersion>,
    ) -> Result<Swapped, StoreError> {
        if self.unfenced {
            let put = self.objects.put(key, PutPayload::from(bytes)).await?;
            return Ok(Swapped::Done(put.into()));
        }
        match &self.swap_lock {
            None => self.swap_conditional(key, bytes, expected).await,
            Some(lock) => {
                let lock = lock.clone();
                let _held = tokio::task::spawn_blocking(move || SwapLock::take(&lock))
                    .await
                    .map_err(|e| StoreError::Local {
                        what: "swap lock".into(),
                        source: std::io::Error::other(e.to_string()),
                    })??;
                let current = match self.objects.head(key).await {
                    Ok(meta) => Some(meta.e_tag),
                    Err(object_store::Error::NotFound { .. }) => None,
                    Err(e) => return Err(e.into()),
                };
                if current.as_ref() != expected.map(|v| &v.e_tag) {
                    return Ok(Swapped::Moved);
                }
                let put = self.objects.put(key, PutPayload::from(bytes)).await?;
                Ok(Swapped::Done(put.into()))
            }
        }
    }

    async fn swap_conditional(
        &self,
        key: &Path,
        bytes: Bytes,
        expected: Option<&UpdateVersion>,
    ) -> Result<Swapped, StoreError> {
        let mode = match expected {
            Some(v) => PutMode::Update(v.clone()),
            None => PutMode::Create,
        };
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        match self
            .objects
            .put_opts(key, PutPayload::from(bytes), opts)
            .await
        {
            Ok(put) => Ok(Swapped::Done(put.into())),
            // 412, or (two creates at once) 409.
            Err(object_store::Error::Precondition { .. })
            | Err(object_store::Error::AlreadyExists { .. }) => Ok(Swapped::Moved),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the object at `key` (none there is fine).
    pub async fn remove(&self, key: &Path) -> Result<(), StoreError> {
        match self.objects.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The names one level under `prefix` (a folder's sub-folders, as the store lists them).
    pub async fn children(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let prefix = self.key(prefix);
        let listed = self.objects.list_with_delimiter(Some(&prefix)).await?;
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned))
            .collect())
    }

    /// When the store last wrote the object at `key` (its clock), `None` when there is none.
    pub async fn modified(
        &self,
        key: &Path,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
        match self.objects.head(key).await {
            Ok(meta) => Ok(Some(meta.last_modified)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Every object under the folder `prefix` (relative to the store's prefix), at any depth:
    /// its key relative to the store's prefix, size and the store's modification time (for
    /// collection, `crate::gc`, and the operator's commands, `crate::admin`).
    pub async fn list(&self, prefix: &str) -> Result<Vec<Listed>, StoreError> {
        use futures::TryStreamExt;
        let full = self.key(prefix);
        let root = self.root.as_ref().to_owned();
        let metas: Vec<object_store::ObjectMeta> =
            self.objects.list(Some(&full)).try_collect().await?;
        Ok(metas
            .into_iter()
            .map(|m| {
                let key = m.location.as_ref();
                let key = if root.is_empty() {
                    key.to_owned()
                } else {
                    key.strip_prefix(&format!("{root}/"))
                        .unwrap_or(key)
                        .to_owned()
                };
                Listed {
                    key,
                    bytes: m.size,
                    modified: m.last_modified,
                }
            })
            .collect())
    }

    /// Whether the store answers and lets this process read and write under its prefix: a
    /// probe object written and removed (a missing bucket or bad credentials fail here, at
    /// start, rather than on the first upload).
    pub async fn probe(&self) -> Result<(), StoreError> {
        let key = self.key(&format!(".probe/{}", uuid::Uuid::new_v4()));
        self.objects
            .put(&key, PutPayload::from(Bytes::from_static(b"flowrepl")))
            .await?;
        self.remove(&key).await
    }
}

/// An object as [`Store::list`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its key, relative to the store's prefix.
    pub key: String,
    /// Its size.
    pub bytes: u64,
    /// When the store last wrote it (the store's clock).
    pub modified: chrono::DateTime<chrono::Utc>,
}

/// An exclusive `flock` on a `file://` store's swap lock, released when dropped.
struct SwapLock(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

impl SwapLock {
    fn take(path: &std::path::Path) -> Result<SwapLock, StoreError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| StoreError::Local {
                what: format!("cannot open {}", path.display()),
                source,
            })?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map(SwapLock)
            .map_err(|(_, errno)| StoreError::Local {
                what: format!("cannot lock {}", path.display()),
                source: errno.into(),
            })
    }
}

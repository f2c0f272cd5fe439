//! The lock object on an object store: created with a conditional put (`PutMode::Create`),
//! refreshed and taken over with `PutMode::Update` on the e-tag last seen.

use object_store::{ObjectStoreExt, PutMode, PutPayload, UpdateVersion};
use ringflow_core::data::Location;
use ringflow_core::data::runtime::block_on;

use super::{LockOwner, LockTiming, RefreshError, Refusal, ReleaseError, first_line};

/// Rounds of create / inspect / take over before giving up on a lock that keeps changing.
const ATTEMPTS: usize = 5;

/// How taking a lock on a store went.
pub(super) enum Acquired {
    /// Held, at this version; with whose stale lock was taken over, if one was.
    Held(UpdateVersion, Option<String>),
    /// The store cannot put conditionally; why.
    Unsupported(String),
}

/// Takes the lock object `lock` for `owner` (a conditional put is also the store's write
/// probe).
pub(super) fn acquire(
    lock: &Location,
    owner: &LockOwner,
    timing: LockTiming,
) -> Result<Acquired, Refusal> {
    let (lock, owner) = (lock.clone(), owner.clone());
    block_on(async move { acquire_async(&lock, &owner, timing).await })
}

async fn acquire_async(
    lock: &Location,
    owner: &LockOwner,
    timing: LockTiming,
) -> Result<Acquired, Refusal> {
    let (store, path) = (lock.store(), lock.path());
    let unusable = |e: &object_store::Error| {
        Refusal::Unusable(format!(
            "cannot be written: creating its lock {lock} failed ({})",
            first_line(e)
        ))
    };
    for _ in 0..ATTEMPTS {
        let payload = PutPayload::from(owner.to_bytes());
        match store.put_opts(path, payload, PutMode::Create.into()).await {
            Ok(put) => return Ok(Acquired::Held(put.into(), None)),
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e @ object_store::Error::NotImplemented { .. }) => {
                return Ok(Acquired::Unsupported(first_line(&e)));
            }
            Err(e) => return Err(unusable(&e)),
        }
        let got = match store.get(path).await {
            Ok(got) => got,
            // Released in the meantime: try again.
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(unusable(&e)),
        };
        let seen = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let bytes = got.bytes().await.map_err(|e| unusable(&e))?;
        let holder: LockOwner = serde_json::from_slice(&bytes).map_err(|e| {
            Refusal::Unusable(format!(
                "holds a lock {lock} that is not a ringflow lock ({e}); if no job uses the \
                 directory, delete it"
            ))
        })?;
        let Some(why) = holder.gone(timing) else {
            return Err(Refusal::Held(Box::new(holder)));
        };
        let payload = PutPayload::from(owner.to_bytes());
        match store
            .put_opts(path, payload, PutMode::Update(seen).into())
            .await
        {
            Ok(put) => return Ok(Acquired::Held(put.into(), Some(holder.gone_because(&why)))),
            // Someone else replaced it first: look again.
            Err(object_store::Error::Precondition { .. }) => continue,
            Err(e @ object_store::Error::NotImplemented { .. }) => {
                return Err(Refusal::Unusable(format!(
                    "has a stale lock {lock} of job {} that its store cannot replace \
                     conditionally ({}); if no job uses the directory, delete it",
                    holder.job_id,
                    first_line(&e)
                )));
            }
            Err(e) => return Err(unusable(&e)),
        }
    }
    Err(Refusal::Unusable(format!(
        "has a lock {lock} that kept changing hands while this job tried to take it"
    )))
}

/// Rewrites the lock with `next` on condition that it is still the version this holder wrote
/// last; returns the new version.
pub(super) fn refresh(
    lock: &Location,
    version: &UpdateVersion,
    next: &LockOwner,
) -> Result<UpdateVersion, RefreshError> {
    let (lock, version, payload) = (
        lock.clone(),
        version.clone(),
        PutPayload::from(next.to_bytes()),
    );
    block_on(async move {
        let put = lock
            .store()
            .put_opts(lock.path(), payload, PutMode::Update(version).into())
            .await;
        match put {
            Ok(put) => Ok(put.into()),
            Err(
                object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. },
            ) => Err(RefreshError::Lost(format!(
                "its lock {lock} was replaced or deleted by another job"
            ))),
            Err(e) => Err(RefreshError::Failed(first_line(&e))),
        }
    })
}

/// Deletes the lock if it is still `owner`'s.
pub(super) fn release(lock: &Location, owner: &LockOwner) -> Result<(), ReleaseError> {
    let (lock, token) = (lock.clone(), owner.token.clone());
    block_on(async move {
        let bytes = match lock.read().await {
            Ok(bytes) => bytes,
            Err(_) => return Ok(()),
        };
        match serde_json::from_slice::<LockOwner>(&bytes) {
            Ok(current) if current.token == token => lock
                .store()
                .delete(lock.path())
                .await
                .map_err(|source| ReleaseError::Store {
                    lock: lock.to_string(),
                    source,
                }),
            _ => Ok(()),
        }
    })
}

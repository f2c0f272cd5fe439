//! [`Shared`]: the driver's state as its servers see it (the scheduler behind a lock, the
//! cluster's secret, the listeners' gates), shared by the gRPC services, the web UI and the
//! ticker that runs the scheduler's timed rules.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ringflow_core::listener::ConnectionGate;
use ringflow_core::security::Secret;
use ringflow_ml::nn::ModelRegistry;
use tokio::sync::Notify;

use crate::scheduler::{Scheduler, SchedulerConfig};

/// State shared by the services and the ticker.
pub(crate) struct Shared {
    scheduler: Mutex<Scheduler>,
    /// Woken when tasks may have become available.
    pub(crate) task_ready: Notify,
    /// The model kinds the driver knows.
    pub(crate) registry: ModelRegistry,
    /// The cluster's shared secret, which the web UI's write actions require too.
    pub(crate) secret: Option<Secret>,
    /// Whether the control plane is serving (false once it stops): the `/readyz` answer.
    pub(crate) serving: AtomicBool,
    /// The gates of the driver's listeners, whose figures `/metrics` shows.
    pub(crate) listeners: Vec<Arc<ConnectionGate>>,
}

impl Shared {
    /// The state of a driver that serves (or, in tests, would serve) with `secret`.
    pub(crate) fn new(
        scheduler: SchedulerConfig,
        registry: ModelRegistry,
        secret: Option<Secret>,
    ) -> Shared {
        Shared {
            scheduler: Mutex::new(Scheduler::new(scheduler, registry.clone())),
            task_ready: Notify::new(),
            registry,
            secret,
            serving: AtomicBool::new(true),
            listeners: Vec::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Scheduler> {
        self.scheduler.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the scheduler's rules now and wakes pollers.
    pub(crate) fn tick(&self) {
        self.lock().tick(Instant::now());
        self.task_ready.notify_waiters();
    }
}

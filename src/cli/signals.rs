//! Ctrl-C and SIGTERM, as a future (async commands) or a flag (the executor).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Which signal arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Ctrl-C.
    Interrupt,
    /// SIGTERM.
    Terminate,
}

impl Signal {
    /// The conventional exit status after this signal (128 + its number).
    pub fn exit_code(self) -> u8 {
        match self {
            Signal::Interrupt => 130,
            Signal::Terminate => 143,
        }
    }
}

/// Resolves at the first Ctrl-C or SIGTERM.
pub async fn shutdown_signal() -> Signal {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return Signal::Interrupt;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Signal::Interrupt,
        _ = term.recv() => Signal::Terminate,
    }
}

/// Sets `stop` at the first signal, and exits the process at the second.
pub fn stop_flag_on_signal(stop: Arc<AtomicBool>, quiet: bool) {
    std::thread::Builder::new()
        .name("ringflow-signals".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let first = shutdown_signal().await;
                if !quiet {
                    eprintln!("stopping (signal received; a second one exits at once)");
                }
                stop.store(true, Ordering::Relaxed);
                let _ = shutdown_signal().await;
                std::process::exit(first.exit_code() as i32);
            });
        })
        .expect("the OS can start a signal thread");
}

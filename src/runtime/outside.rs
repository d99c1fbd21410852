//! What wakes the loop from outside oomguard: a signal it passes on or acts
//! on (INT, TERM, HUP, …) and the exit of one of its children (SIGCHLD).
//! The loop reads both from channels: in a run, tasks fill them from the
//! kernel's signals; in the loop's tests, the test does, by hand and on a
//! paused clock.

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::FORWARDED;

pub(super) struct Outside {
    pub signals: Signals,
    pub children: Children,
}

/// The signals oomguard passes on or acts on, as they come.
pub(super) struct Signals(UnboundedReceiver<i32>);

/// A child of oomguard's exited (a reap is due).
pub(super) struct Children(UnboundedReceiver<()>);

/// The other ends, for a test that plays the kernel.
#[cfg(test)]
pub(super) struct Kernel {
    pub signals: UnboundedSender<i32>,
    pub children: UnboundedSender<()>,
}

impl Outside {
    /// Registers every handler (call before the job exists, so no signal
    /// and no SIGCHLD arrives unhandled). `Err`: SIGCHLD cannot be handled.
    pub(super) fn from_kernel() -> std::io::Result<Self> {
        let (sig_tx, signals) = unbounded_channel();
        let (child_tx, children) = unbounded_channel();
        let sigchld = signal(SignalKind::child())?;
        tokio::spawn(pass_on(sigchld, child_tx, ()));
        for (sig, _) in FORWARDED {
            match signal(SignalKind::from_raw(sig)) {
                Ok(s) => {
                    tokio::spawn(pass_on(s, sig_tx.clone(), sig));
                }
                Err(e) => eprintln!("oomguard: cannot handle signal {sig}: {e}"),
            }
        }
        Ok(Self {
            signals: Signals(signals),
            children: Children(children),
        })
    }

    #[cfg(test)]
    pub(super) fn by_hand() -> (Self, Kernel) {
        let (signals_tx, signals) = unbounded_channel();
        let (children_tx, children) = unbounded_channel();
        let kernel = Kernel {
            signals: signals_tx,
            children: children_tx,
        };
        let outside = Self {
            signals: Signals(signals),
            children: Children(children),
        };
        (outside, kernel)
    }
}

impl Signals {
    /// The next signal (never, once nothing can send one).
    pub(super) async fn next(&mut self) -> i32 {
        match self.0.recv().await {
            Some(sig) => sig,
            None => std::future::pending().await,
        }
    }
}

impl Children {
    /// The next child exit (never, once nothing can report one).
    pub(super) async fn exited(&mut self) {
        if self.0.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
    }
}

async fn pass_on<T: Copy>(mut stream: Signal, to: UnboundedSender<T>, what: T) {
    while stream.recv().await.is_some() {
        if to.send(what).is_err() {
            break;
        }
    }
}

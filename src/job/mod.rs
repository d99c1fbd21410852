//! Job control: launching and signalling the tree, the output keeper and
//! relay, the pseudo-terminal, the user's systemd scope, attaching to a
//! running job, restarts, and the start-up hook put into the job.

pub mod attach;
pub mod inject;
pub mod keeper;
pub mod pty;
pub mod relay;
pub mod restart;
pub mod supervise;
pub mod systemd;

//! The commands built on the loop and the log: report, replay, demo, doctor,
//! ask, ended and the man page.

pub mod ask;
pub mod demo;
pub mod doctor;
pub mod ended;
pub mod manpage;
pub mod replay;
pub mod report;

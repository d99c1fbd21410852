//! Vocabulary and parsers with no I/O of their own: units, the clock, exit
//! codes, the model of a sample, growth and verdicts, the companion's
//! protocol, the record of how a run ended, and the forensics that read
//! kernel and PyTorch text.

pub mod clock;
pub mod companion;
pub mod demo_job;
pub mod ended;
pub mod exit;
pub mod forensics;
pub mod growth;
pub mod help;
pub mod model;
pub mod units;
pub mod verdict;

//! Reading the live kernel log: /dev/kmsg, then dmesg, then journalctl -k.

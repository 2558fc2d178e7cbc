//! Faults on Citus.

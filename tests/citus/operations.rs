//! Operator commands on Citus.

//! Read-only queries for the CLI.

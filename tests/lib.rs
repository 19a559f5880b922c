//! Integration tests live in this package's `tests/` folder; each file is one test binary that serves as its own worker.

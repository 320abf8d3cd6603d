//! Integration tests live in `it/`; this library is empty so the package has one test binary.

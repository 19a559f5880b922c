//! The jobs' part of the table of tunables (`docs/config.md`), read by the
//! head's control store when it starts.

prism_config::table! {
    /// The head's job manager settings; `PRISM_JOB_<NAME>` overrides each.
    #[derive(Debug, Clone)]
    pub struct JobConfig("PRISM_JOB_") {
    /// Ended jobs kept, with their logs; the oldest beyond this are
    /// removed as new ones are submitted. 1,000: a long history at a few
    /// KB per job, not a disk filled by a loop of submissions.
    max_kept: usize = 1000;
    /// The largest `working_dir` package accepted, in bytes. 100 MiB: a
    /// project with its built binary fits; datasets belong in shared
    /// storage, not in every node's copy.
    package_limit_bytes: u64 = 100 << 20;
    }
}

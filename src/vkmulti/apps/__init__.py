"""Programs, not library: the CLI, the demos, the drills and the benchmarks. Exports nothing."""

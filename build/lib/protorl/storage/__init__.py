"""Files on disk: a run directory's layout, atomic writes and safe reads, checkpoints, snapshots and run directories."""

"""Files on disk: atomic writes and safe reads, checkpoints, snapshots and run directories."""

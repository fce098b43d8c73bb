"""Where a checkpoint is read from: a local path (any mount) or s3://bucket/prefix."""

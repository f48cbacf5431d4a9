"""What every analysis concern shares: a job's arrays (`jobdata`), plot downsampling and buckets, the GPU catalogue."""

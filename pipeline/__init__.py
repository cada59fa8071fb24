"""reckon's domain: settings, Redis keys and scripts, jobs, workers, providers, sweeper."""

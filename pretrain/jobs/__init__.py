"""Operating runs: TPU VMs (gcloud) and sweeps of whole commands. Runs the entry points as processes and reads the files they write."""

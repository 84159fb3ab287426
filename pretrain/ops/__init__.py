"""Operating runs: TPU VMs (gcloud) and sweeps. Imports pretrain.core only; runs the entry points as processes."""
